//! Durable storage behind one trait, with a SQLite and a PostgreSQL backend.
//!
//! Every operation that an invariant depends on is one atomic step here:
//! idempotent create (the UNIQUE constraint decides), the guarded attempt
//! insert (invariant 4) and the compare-and-swap finish (invariant 5). Values
//! are always bound, never written into SQL text: the only text built at
//! run time is the multi-row event insert's list of placeholders
//! (`sql/events.rs`).
//!
//! # One trait per resource
//!
//! Each resource's queries are a trait in its own file, beside its row
//! types: [`JobStore`] (`jobs.rs`), [`AttemptStore`] (`attempts.rs`),
//! [`EventStore`] (`events.rs`), [`KeyStore`] (keys and tenants,
//! `tenants.rs`), [`SwitchStore`] (`switches.rs`), [`ContractRunStore`]
//! (`contract_runs.rs`), [`ConsoleStore`] (`console.rs`), [`HedgingStore`]
//! (`hedging.rs`) and [`WebhookStore`] (`webhooks.rs`). [`Store`] is their
//! supertrait, with what each backend writes besides its queries
//! (`backend`, `migrate`, `ping`, `record_event_detached`,
//! `commit_counts`, `close`);
//! callers hold an `Arc<dyn Store>` and `use crate::store::prelude::*`.
//!
//! Each backend implements every trait as ordinary code: `sqlite.rs`
//! (reads on a reader connection on the caller's thread, writes through
//! the group-commit write queue on the writer's thread; rusqlite alone,
//! every connection through `wal_writes.rs`, a VFS that writes a commit's
//! WAL frames in one system call) and `postgres.rs` (sqlx: reads and one-statement writes on a pooled
//! connection, the others in a transaction of their own). Each method
//! calls the query of the same name in `sql/` (`ops::NAME(connection,
//! arguments…)`).
//!
//! The two test wrappers, the fault-injecting [`faulty::FaultyStore`] and
//! the simulation's `SyncStore` (`tests/simulation/store.rs`), forward
//! every query to a real store through one hook each: the
//! [`forward_store!`](crate::forward_store) macro writes those forwarding
//! impls, and the list of query names [`faulty::METHODS`] (so
//! `fail_next("claim_jobs", 1)` knows each method by name and refuses a
//! name that is none of them).
//!
//! ## Adding a query
//!
//! 1. Declare it in its resource's trait, with a doc comment:
//!    `async fn my_query(&self, job_id: &JobId, limit: i64) -> Result<Vec<Job>, StoreError>;`
//!    (a job's, an attempt's or an owner's id by its type, `JobId`,
//!    `AttemptId` or `OwnerId`: [`crate::domain::ids`]).
//! 2. Write `pub(crate) async fn my_query(conn: &mut impl Db, job_id: &str,
//!    limit: i64) -> Result<Vec<Job>, StoreError>` in that resource's file
//!    under `sql/` (`jobs.rs`, `attempts.rs`, `events.rs`, `keys.rs`,
//!    `switches.rs`, `contract_runs.rs`, `console.rs`, `hedging.rs`,
//!    `webhooks.rs`): `conn.fetch_all(SQL, args![job_id, limit])`. Its
//!    row type implements `sql::db::Row` (a `decode` by column name). If
//!    the databases need different SQL, add the statement to `Dialect`
//!    (`sql/mod.rs`), write it in both `sql/sqlite.rs` and
//!    `sql/postgres.rs`, and take it as `C::Sql::NAME` with
//!    `conn: &mut C` where `C: Db`.
//! 3. Implement it in both backends' impl of that trait, passing an id as
//!    the text it is (`&JobId` derefs to `&str`; an `Option<&OwnerId>` as
//!    `owner.map(OwnerId::as_str)`): `sqlite.rs` (a
//!    read: `self.read.raw(|c| db::now(ops::my_query(c, …)))`, or
//!    `self.read.scan(move |c| …).await` for one that may scan many rows; a write:
//!    `self.write(move |c| db::now(ops::my_query(c, …)))`, its borrowed
//!    arguments made owned first, since the write waits in the queue) and
//!    `postgres.rs` (a pooled connection, or `self.pool.begin()` …
//!    `tx.commit()` for several statements).
//! 4. Add its signature to the trait's section of
//!    [`forward_store!`](crate::forward_store) (`store/forward.rs`), so the
//!    test wrappers forward it (the compiler says so).
//!
//! ## One query API over both databases
//!
//! Every query is written once, against `sql::db::Db` (`conn.execute(SQL,
//! args![…])`, `conn.fetch_optional::<Row>(…)`, `fetch_all`, `fetch_one`).
//! `Db` is implemented for sqlx's PostgreSQL connection and for rusqlite's
//! connection. On SQLite every statement is a direct call into SQLite on
//! the thread that runs it (`db::now` drives its future, which never
//! waits); sqlx's SQLite driver would send each to its connection's worker
//! thread and wait for the wake-up back, which was most of a job's CPU.
//! The migrations are applied through rusqlite too, into sqlx's own
//! `_sqlx_migrations` table with sqlx's checksums (`sqlite::migrate`).
//!
//! ## Where the dialects differ
//!
//! The SQL text is shared: both accept `$N` placeholders, `ON CONFLICT … DO
//! NOTHING / DO UPDATE SET … = excluded.…` upserts and `COUNT(*) FILTER
//! (WHERE …)`. What differs:
//!
//! | | SQLite | PostgreSQL |
//! |---|---|---|
//! | atomic write | write queue: `BEGIN IMMEDIATE` per batch, a savepoint per write | a READ COMMITTED transaction per write of several statements |
//! | row lock in a guarded step | none (`BEGIN IMMEDIATE` excludes every writer) | `FOR UPDATE` |
//! | concurrent claims | none (writes are serialised) | `FOR UPDATE SKIP LOCKED` |
//! | byte order of keys | `idempotency_key` (BINARY collation) | `idempotency_key COLLATE "C"` |
//! | a job's create (create, claim, primary start) | three statements in the write queue (`create_job` in `sql/sqlite.rs`) | one statement of writable CTEs shared by concurrent creates, committing on its own (`insert_jobs_batched` in `sql/postgres.rs`, queued by `batches.rs`) |
//! | a succeeded attempt's finish | its statements in the write queue (`finish_attempt`, whose `Won::bid` is the CAS) | first the win, in one statement shared by concurrent finishes (`finish_won_batched` in `sql/postgres.rs`, queued by `batches.rs`); else the whole step (`finish_attempt`) in a transaction |
//! | rollup rows (`usage_daily`, `attempt_hours`) | shard 0 | 16 shards by the attempt's id (`rollup_shard!`), so finishes do not queue on one row's lock |
//!
//! Each statement that differs is a constant of the `sql::Dialect` trait,
//! written out once by each dialect (`impl Dialect for Sqlite` in
//! `sql/sqlite.rs`, `impl Dialect for Postgres` in `sql/postgres.rs`); a
//! query takes its connection's (`Db::Sql`). Where such a statement is
//! long and differs in one clause (the two claims' lock clause, the
//! console's key search's "owner is one of these"), the shared text is a
//! macro beside its query (`claim_jobs_sql!`, `claim_deliveries_sql!`,
//! `key_prefix_few_sql!`, `list_jobs_by_key_sql!`) that each dialect calls
//! with its clause. What only one dialect runs is written in its own file,
//! once: the create (both) and the batched win (PostgreSQL).

pub use crate::domain::attempt::AttemptOutcome;
use async_trait::async_trait;
use std::sync::Arc;

mod attempts;
mod batches;
pub mod console;
mod contract_runs;
mod database_url;
mod events;
pub mod faulty;
mod forward;
pub mod hedging;
mod ids;
mod jobs;
pub mod postgres;
mod rows;
mod sql;
pub mod sqlite;
mod switches;
pub mod tenants;
mod wal_writes;
pub mod webhooks;

pub use attempts::{AttemptResolution, AttemptStore, FinishAttempt, FinishOutcome};
pub use console::ConsoleStore;
pub use contract_runs::{ContractRun, ContractRunStore, ContractRunSummary, NewContractRun};
pub use database_url::{DatabaseUrl, InvalidDatabaseUrl};
pub use events::{event, EventStore, JobEvent, NewEvent};
pub use hedging::HedgingStore;
pub use jobs::{CreateOutcome, JobResolution, JobStore, JobTransition, Refusal, ReviewItem};
pub use switches::{ProviderAuditEntry, ProviderSwitch, SwitchStore};
pub use tenants::{ApiKey, KeyStore};
pub use webhooks::WebhookStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// From the SQLite writer's rusqlite connection (`sql/db.rs`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Not marked as its source: the words below replace sqlx's, which
    /// would otherwise be printed after them.
    #[error("{}", migrate_words(.0))]
    Migrate(sqlx::migrate::MigrateError),
    /// A migration the database refused (its SQL failed): the migration
    /// and the database's words, without the migration's text.
    #[error("migration {version} ({description}) failed: {message}")]
    MigrationFailed {
        version: i64,
        description: String,
        message: String,
    },
    /// Tables, but none of onejob's migrations: another program's database.
    #[error(
        "the database holds tables but no onejob migrations: it is not a onejob database \
         (give another --database-url, or an empty database)"
    )]
    NotOnejob,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("attempt {attempt_id} is {state}; it cannot become {wanted}")]
    InvalidTransition {
        attempt_id: crate::domain::AttemptId,
        state: String,
        wanted: &'static str,
    },
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("the write batch was rolled back: {0}")]
    Batch(String),
    #[error("the store is shutting down")]
    Closed,
}

impl StoreError {
    /// Whether the same call may succeed if tried again soon: the database
    /// was unreachable, busy, or gave up the transaction (a dropped
    /// connection, a server restart, a lock timeout, a rolled-back batch).
    /// A store error is transient until proven otherwise, so only errors
    /// that say something is wrong with the data or the code — a corrupt
    /// row, a refused transition, a constraint, a failed migration — and a
    /// store closed on purpose are not.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => sqlx_error_is_transient(e),
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                sqlite_code_is_transient(i64::from(e.extended_code))
            }
            StoreError::Sqlite(_) => false,
            StoreError::Batch(_) => true,
            StoreError::Migrate(_)
            | StoreError::MigrationFailed { .. }
            | StoreError::NotOnejob
            | StoreError::NotFound(_)
            | StoreError::InvalidTransition { .. }
            | StoreError::Corrupt(_)
            | StoreError::Closed => false,
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(e)
    }
}

/// A migration error as an operator reads it: a database migrated by a
/// newer build says so, where sqlx says a migration "is missing".
fn migrate_words(e: &sqlx::migrate::MigrateError) -> String {
    use sqlx::migrate::MigrateError;
    match e {
        MigrateError::VersionMissing(version) => format!(
            "the database was migrated by a newer onejob: its migration {version} is not one this \
             build has; run that build (or a newer one) against it, or give another --database-url"
        ),
        MigrateError::VersionMismatch(version) => format!(
            "migration {version} was applied to the database with other contents than this \
             build's; the database and this build disagree on its schema"
        ),
        MigrateError::Dirty(version) => format!(
            "migration {version} was left half-applied by an earlier start; restore the \
             database from a backup"
        ),
        other => format!("migration failed: {other}"),
    }
}

fn sqlx_error_is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => match db.code() {
            // PostgreSQL SQLSTATE classes: 08 connection exception, 40
            // transaction rollback (serialization, deadlock), 53
            // insufficient resources, 57 operator intervention (admin
            // shutdown, `pg_terminate_backend`), 58 system error.
            Some(code) if code.len() == 5 => {
                matches!(&code[..2], "08" | "40" | "53" | "57" | "58")
            }
            Some(code) => code.parse::<i64>().is_ok_and(sqlite_code_is_transient),
            None => false,
        },
        _ => false,
    }
}

/// SQLite result codes (the primary code is the low byte): BUSY, LOCKED,
/// IOERR, FULL, CANTOPEN, PROTOCOL.
fn sqlite_code_is_transient(code: i64) -> bool {
    matches!(code & 0xff, 5 | 6 | 10 | 13 | 14 | 15)
}

/// Group commits: transactions that each committed the writes of one or
/// more callers at once. On SQLite every write goes through one (the
/// writer's batch, or a lone write committed on its caller's thread), and
/// each ends in one `fdatasync` of the WAL; on PostgreSQL they are the
/// shared statements that create jobs and win them (`batches.rs`), a
/// durable job's two writes. `writes / commits` is a group commit's size,
/// and `commits` per durable job how many syncs of the disk a job costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Transactions committed.
    pub commits: u64,
    /// Callers' writes they carried (a write that failed in a batch that
    /// committed counts: the commit carried it).
    pub writes: u64,
}

/// Where a backend counts its [`CommitCounts`], from any thread.
#[derive(Debug, Default)]
pub(crate) struct CommitCounter {
    commits: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
}

impl CommitCounter {
    /// One commit that carried `writes` writes.
    pub(crate) fn add(&self, writes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commits.fetch_add(1, Relaxed);
        self.writes.fetch_add(writes as u64, Relaxed);
    }

    pub(crate) fn counts(&self) -> CommitCounts {
        use std::sync::atomic::Ordering::Relaxed;
        CommitCounts {
            commits: self.commits.load(Relaxed),
            writes: self.writes.load(Relaxed),
        }
    }
}

/// The whole store: every resource's trait, and what each backend writes
/// besides its queries. `Arc<dyn Store>` is what the rest of the service
/// holds; bring the resource traits into scope with
/// `use crate::store::prelude::*` to call their queries on it.
#[async_trait]
pub trait Store:
    JobStore
    + AttemptStore
    + EventStore
    + KeyStore
    + SwitchStore
    + ContractRunStore
    + ConsoleStore
    + HedgingStore
    + WebhookStore
    + Send
    + Sync
    + 'static
{
    /// Which backend, for logs and readiness.
    fn backend(&self) -> &'static str;

    /// Apply pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// A cheap round trip, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Append to the event log without waiting: for events that change no
    /// state (replays), so they never slow the request that caused them.
    fn record_event_detached(&self, event: NewEvent);

    /// The group commits this store has made since it opened, for
    /// `/metrics`: see [`CommitCounts`].
    fn commit_counts(&self) -> CommitCounts;

    /// Commit every queued write and close connections; later calls fail.
    async fn close(&self);
}

/// [`Store`] and every resource trait, for callers of an `Arc<dyn Store>`.
pub mod prelude {
    pub use super::{
        AttemptStore, ConsoleStore, ContractRunStore, EventStore, HedgingStore, JobStore, KeyStore,
        Store, SwitchStore, WebhookStore,
    };
}

/// Open the store a URL names, without migrating.
pub async fn connect(url: &DatabaseUrl) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => Arc::new(sqlite::SqliteStore::open(path).await?),
        DatabaseUrl::Postgres(url) => Arc::new(postgres::PgStore::connect(url).await?),
    })
}

pub(crate) fn parse_job_state(s: &str) -> Result<crate::domain::JobState, StoreError> {
    crate::domain::JobState::parse(s).ok_or_else(|| StoreError::Corrupt(format!("job state {s:?}")))
}

pub(crate) fn parse_attempt_state(s: &str) -> Result<crate::domain::AttemptState, StoreError> {
    crate::domain::AttemptState::parse(s)
        .ok_or_else(|| StoreError::Corrupt(format!("attempt state {s:?}")))
}

pub(crate) fn parse_attempt_kind(s: &str) -> Result<crate::domain::AttemptKind, StoreError> {
    crate::domain::AttemptKind::parse(s)
        .ok_or_else(|| StoreError::Corrupt(format!("attempt kind {s:?}")))
}
