//! One query API over three connections: sqlx's PostgreSQL and SQLite
//! connections, and a rusqlite connection to the SQLite writer's own handle.
//!
//! A query written against [`Db`] is written once and runs on any of them.
//! SQLite's write queue runs such queries through rusqlite on its own thread
//! (`sqlite.rs`): every statement is a direct call into SQLite there, where
//! through sqlx each is a message to the connection's worker thread and a
//! wake-up back, which was most of a job's CPU. The queries on the job's path
//! (create, finish, events) are written this way; the rest still take sqlx's
//! query API directly and, on SQLite, run on the same handle through sqlx.
//!
//! Arguments are bound by position (`$1`, `$2`, … in the SQL, as everywhere
//! in the store), each an [`Arg`]: an integer or a text, either possibly
//! NULL, which is every type the store binds.

use crate::store::StoreError;
use std::future::Future;

/// One bound argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Int(Option<i64>),
    Text(Option<&'a str>),
}

/// What can be bound as an [`Arg`].
pub(crate) trait IntoArg<'a> {
    fn arg(self) -> Arg<'a>;
}

impl<'a> IntoArg<'a> for i64 {
    fn arg(self) -> Arg<'a> {
        Arg::Int(Some(self))
    }
}

impl<'a> IntoArg<'a> for Option<i64> {
    fn arg(self) -> Arg<'a> {
        Arg::Int(self)
    }
}

impl<'a> IntoArg<'a> for &'a str {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self))
    }
}

impl<'a> IntoArg<'a> for &'a String {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self))
    }
}

impl<'a> IntoArg<'a> for Option<&'a str> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self)
    }
}

impl<'a> IntoArg<'a> for &'a Option<String> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref())
    }
}

/// `args![a, b, c]`: the arguments of a [`Db`] query, `$1`, `$2`, `$3`.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::db::IntoArg::arg($value)),*]
    };
}
pub(crate) use args;

/// A row type a [`Db`] query can return: decodable from each connection's
/// rows, by column name.
pub(crate) trait Row:
    Sized
    + Send
    + Unpin
    + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
    + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
{
    fn from_rusqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self>;
}

/// Tuples are decoded by position, as sqlx decodes them.
macro_rules! tuple_rows {
    ($(($($t:ident $i:tt),+))*) => {
        $(
            impl<$($t),+> Row for ($($t,)+)
            where
                $(
                    $t: Send
                        + Unpin
                        + rusqlite::types::FromSql
                        + for<'r> sqlx::Decode<'r, sqlx::Postgres>
                        + sqlx::Type<sqlx::Postgres>
                        + for<'r> sqlx::Decode<'r, sqlx::Sqlite>
                        + sqlx::Type<sqlx::Sqlite>,
                )+
            {
                fn from_rusqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
                    Ok(($(row.get::<_, $t>($i)?,)+))
                }
            }
        )*
    };
}

tuple_rows! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
}

/// A connection that runs [`Db`] queries.
pub(crate) trait Db: Send {
    /// Run one statement; how many rows it changed.
    fn execute(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Run one statement that answers at most one row.
    fn fetch_optional<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Option<R>, StoreError>> + Send;
}

/// sqlx's connections: the statement is prepared (and kept) by sqlx, the
/// arguments bound with their types.
macro_rules! sqlx_db {
    ($conn:ty, $database:ty) => {
        impl Db for $conn {
            async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
                let mut query = sqlx::query::<$database>(sql);
                for arg in args {
                    query = match *arg {
                        Arg::Int(value) => query.bind(value),
                        Arg::Text(value) => query.bind(value),
                    };
                }
                Ok(query.execute(&mut *self).await?.rows_affected())
            }

            async fn fetch_optional<R: Row>(
                &mut self,
                sql: &str,
                args: &[Arg<'_>],
            ) -> Result<Option<R>, StoreError> {
                let mut query = sqlx::query_as::<$database, R>(sql);
                for arg in args {
                    query = match *arg {
                        Arg::Int(value) => query.bind(value),
                        Arg::Text(value) => query.bind(value),
                    };
                }
                Ok(query.fetch_optional(&mut *self).await?)
            }
        }
    };
}

sqlx_db!(sqlx::PgConnection, sqlx::Postgres);
sqlx_db!(sqlx::SqliteConnection, sqlx::Sqlite);

/// rusqlite: a direct call into SQLite on the calling thread. The statement
/// is prepared once and kept in the connection's cache. Its futures are
/// ready at their first poll.
impl Db for rusqlite::Connection {
    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.prepare_cached(sql)?;
        bind(&mut statement, args)?;
        Ok(statement.raw_execute()? as u64)
    }

    async fn fetch_optional<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<R>, StoreError> {
        let mut statement = self.prepare_cached(sql)?;
        bind(&mut statement, args)?;
        let mut rows = statement.raw_query();
        let first = match rows.next()? {
            Some(row) => Some(R::from_rusqlite(row)?),
            None => None,
        };
        // Step a RETURNING statement to its end: SQLite applies the
        // change of every row before it answers the first, but the
        // statement is only done (and its changes counted) once stepped
        // out.
        while rows.next()?.is_some() {}
        Ok(first)
    }
}

/// Bind `$N` to `args[N - 1]`, as sqlx does. SQLite numbers a statement's
/// parameters in the order they first appear (`$11` before `$7` is
/// parameter 7), so each is bound by its name, not its index.
fn bind(statement: &mut rusqlite::Statement<'_>, args: &[Arg<'_>]) -> rusqlite::Result<()> {
    for index in 1..=statement.parameter_count() {
        let position = statement
            .parameter_name(index)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(index);
        match position.checked_sub(1).and_then(|i| args.get(i)) {
            Some(arg) => statement.raw_bind_parameter(index, arg)?,
            None => return Err(rusqlite::Error::InvalidParameterCount(position, args.len())),
        }
    }
    Ok(())
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Arg::Int(value) => value.to_sql(),
            Arg::Text(value) => value.to_sql(),
        }
    }
}

/// Drive a [`Db`] query on a rusqlite connection: its future never waits.
pub(crate) fn now<T>(query: impl Future<Output = T>) -> T {
    match futures::FutureExt::now_or_never(query) {
        Some(answer) => answer,
        None => unreachable!("a rusqlite query never waits"),
    }
}
