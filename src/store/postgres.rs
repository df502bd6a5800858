//! The PostgreSQL backend: a connection pool, one READ COMMITTED transaction
//! per write, and `FOR UPDATE` on the row a guarded step decides about, so
//! concurrent connections (and processes) queue on that row instead of
//! racing past the check. Dispatchers claim with `SKIP LOCKED`.

use super::signature::*;
use super::Store;
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;

use super::sql::postgres as ops;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A pooled connection idle this long is pinged before it is used.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            // sqlx pings a connection when it is given back (always) and,
            // by default, again when it is taken: a round trip on every
            // store call's path. Taken soon after its last use, a
            // connection was just proven live by that ping; one idle for
            // longer may have been dropped by the server meanwhile (a
            // restart, an idle timeout), so only that one is pinged.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        Ok(PgStore { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Run one store operation in its own transaction and commit it.
macro_rules! in_tx {
    ($store:expr, |$c:ident| $op:expr) => {{
        let mut tx = $store.pool.begin().await?;
        let $c: &mut PgConnection = &mut tx;
        let value = $op.await?;
        tx.commit().await?;
        Ok(value)
    }};
}

/// The body of one listed query on PostgreSQL: reads and one-statement
/// writes on a pooled connection; transactions in their own. The create is
/// listed as a transaction (SQLite runs it as several statements) and is one
/// statement here.
macro_rules! pg_call {
    // One statement (`sql/jobs.rs`, writable CTEs): it commits on its own.
    (transaction $self:ident create_job($($arg:ident),*)) => {
        pg_call!(writer $self create_job($($arg),*))
    };
    // A win is one statement on its own; anything else (a lost CAS, an
    // attempt gone or ended) is told by the whole step in a transaction.
    (transaction $self:ident finish_attempt($finish:ident)) => {{
        let alone = ops::finish_won_alone(&mut *$self.pool.acquire().await?, &$finish).await?;
        match alone {
            Some(won) => Ok(won),
            None => in_tx!($self, |c| ops::finish_attempt(c, $finish)),
        }
    }};
    (transaction $self:ident $name:ident($($arg:ident),*)) => {
        in_tx!($self, |c| ops::$name(c, $($arg),*))
    };
    ($reader_or_writer:ident $self:ident $name:ident($($arg:ident),*)) => {
        ops::$name(&mut *$self.pool.acquire().await?, $($arg),*).await
    };
}

macro_rules! pg_store {
    (
        { $($extra:tt)* }
        $(
            $(#[$meta:meta])*
            $conn:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        )*
    ) => {
        #[async_trait]
        impl Store for PgStore {
            $($extra)*
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret, StoreError> {
                    pg_call!($conn self $name($($arg),*))
                }
            )*
        }
    };
}

crate::store_methods!(pg_store {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // The migrator takes an advisory lock, so concurrent starts are safe.
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn record_event_detached(&self, event: NewEvent) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let result = match pool.acquire().await {
                Ok(mut conn) => ops::insert_event(&mut *conn, &event).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "detached event write failed");
            }
        });
    }

    async fn close(&self) {
        self.pool.close().await;
    }
});
