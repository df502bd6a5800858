//! Durable storage behind one trait, with a SQLite and a PostgreSQL backend.
//!
//! Every operation that an invariant depends on is one atomic step here:
//! idempotent create (the UNIQUE constraint decides), the guarded attempt
//! insert (invariant 4) and the compare-and-swap finish (invariant 5). SQL is
//! never built with `format!`.
//!
//! # The queries are declared once
//!
//! [`store_methods!`](crate::store_methods) lists every query of the [`Store`] trait once, grouped
//! by resource, with the connection it needs (`reader`, `writer`,
//! `transaction`). From that list are generated: the trait itself, the
//! SQLite impl (`sqlite.rs`: reader connection or group-commit write queue),
//! the PostgreSQL impl (`postgres.rs`: pool or `in_tx!`), the
//! fault-injecting [`faulty::FaultyStore`] (which knows each method by its
//! name, as `fail_next("claim_jobs", 1)` does, and refuses a name that is
//! none of them: see [`METHODS`]) and the simulation's
//! `SyncStore` (`tests/simulation/store.rs`). Only `backend`, `migrate`,
//! `ping`, `record_event_detached` and `close` are written by hand in each.
//!
//! ## Adding a query
//!
//! 1. Declare it in [`store_methods!`](crate::store_methods), in its resource's section:
//!    `reader fn my_query(job_id: &str, limit: i64) -> Vec<Job>;`
//!    (a new type in the signature is also re-exported from [`signature`]).
//! 2. Write `pub(crate) async fn my_query(conn: &mut Conn, job_id: &str,
//!    limit: i64) -> Result<Vec<Job>, StoreError>` in that resource's file
//!    under `sql/` (`jobs.rs`, `attempts.rs`, `events.rs`, `keys.rs`,
//!    `switches.rs`, `contract_runs.rs`, `console.rs`, `webhooks.rs`): the same name, the
//!    same parameters, the connection first. It is compiled once per dialect
//!    and re-exported from the dialect's module, so both backends find it.
//!    A new resource file is declared in both `sql/sqlite.rs` and
//!    `sql/postgres.rs`, with the others.
//! 3. A write whose parameters include a type not yet carried through
//!    SQLite's write queue adds it to `carry_owned!` in `sqlite.rs` (the
//!    compiler says so).
//!
//! Nothing else changes: both backends, `FaultyStore` and `SyncStore` pick
//! it up.
//!
//! ## Queries on a job's path: one API over three connections
//!
//! The queries every job runs (create, finish, events, a job by key or id)
//! are written against `sql::db::Db` (`conn.execute(SQL, args![…])`,
//! `conn.fetch_optional::<Row>(SQL, args![…])`) instead of sqlx's query
//! API. `Db` is implemented for sqlx's PostgreSQL and SQLite connections
//! and for a rusqlite connection, so each such query is still written once.
//! On SQLite they run through rusqlite: the writer thread holds a rusqlite
//! connection besides its sqlx one and runs them as direct calls, and a job
//! read by key or id runs on a rusqlite reader on the caller's thread; sqlx
//! would send each statement to its connection's worker thread and wait for
//! the wake-up back. `sqlite.rs` names which methods take that path
//! (`sqlite_call!`). A query moves to it by being written against `Db`
//! (its row type implements `sql::db::Row`) and named there.
//!
//! ## Where the dialects differ
//!
//! The SQL text is shared: both accept `$N` placeholders, `ON CONFLICT … DO
//! NOTHING / DO UPDATE SET … = excluded.…` upserts and `COUNT(*) FILTER
//! (WHERE …)`. What differs:
//!
//! | | SQLite | PostgreSQL |
//! |---|---|---|
//! | atomic write | write queue: `BEGIN IMMEDIATE` per batch (per run of writes on one of the writer's two connections), a savepoint per write | `in_tx!`: a READ COMMITTED transaction per `transaction` query |
//! | row lock in a guarded step | none (`BEGIN IMMEDIATE` excludes every writer) | `FOR UPDATE` |
//! | concurrent claims | none (writes are serialised) | `FOR UPDATE SKIP LOCKED` |
//! | byte order of keys | `idempotency_key` (BINARY collation) | `idempotency_key COLLATE "C"` |
//! | a job's create (create, claim, primary start) | four statements in the write queue | one statement of writable CTEs (`WRITABLE_CTE`), committing on its own |
//! | a succeeded attempt's finish | its statements in the write queue | first the win alone, one statement (`finish_won_alone`); else the whole step in `in_tx!` |
//! | rollup rows (`usage_daily`, `attempt_hours`) | shard 0 | 16 shards by the attempt's id (`rollup_shard!`), so finishes do not queue on one row's lock |
//!
//! The row-lock, skip-locked and key-order fragments and `WRITABLE_CTE` are
//! stated once per dialect, in `sql/sqlite.rs` and `sql/postgres.rs`: each names its
//! connection type (`Conn`) and defines the fragments as macros
//! (`for_update!()`, `skip_locked!()`, `key_indexed!()`,
//! `key_unindexed!()`, each a literal for `concat!`) before it declares the
//! resource files, which use them and compile once under each. The SQL
//! files name no dialect.

pub use crate::domain::attempt::AttemptOutcome;
use crate::domain::{Job, Millis};
use async_trait::async_trait;
use std::sync::Arc;

pub mod console;
mod contract_runs;
mod database_url;
pub mod faulty;
pub mod hedging;
pub mod postgres;
mod rows;
mod sql;
pub mod sqlite;
pub mod tenants;
pub mod webhooks;

pub use contract_runs::{ContractRun, ContractRunSummary, NewContractRun};
pub use database_url::{DatabaseUrl, InvalidDatabaseUrl};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// From the SQLite writer's rusqlite connection (`sql/db.rs`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("attempt {attempt_id} is {state}; it cannot become {wanted}")]
    InvalidTransition {
        attempt_id: String,
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
            | StoreError::NotFound(_)
            | StoreError::InvalidTransition { .. }
            | StoreError::Corrupt(_)
            | StoreError::Closed => false,
        }
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

/// The answer to an idempotent create.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// This call inserted the job.
    Created(Job),
    /// A job with this owner and key already existed; it is returned as stored.
    Existing(Job),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FinishAttempt {
    pub attempt_id: String,
    /// As the adapter classified it; for a success, `output` is the job's
    /// result. A failure's `retryable`, `retry_after` and `status` steer the
    /// engine and are not stored.
    pub outcome: AttemptOutcome,
    pub at: Millis,
    /// Who reports it: `engine`, `reconciler`, or an admin.
    pub actor: String,
}

/// A job-level step of the engine. Each applies only while the job is not
/// final and, when a lease holder is given, only while it still holds the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum JobTransition {
    /// Wait for a retry at `next_run_at` (state `pending`), keeping the lease until `lease_until`.
    Backoff {
        next_run_at: Millis,
        lease_until: Millis,
        reason: String,
    },
    /// Nothing to drive until an unknown attempt is settled; the lease is
    /// released. Should none be live any more (settled meanwhile), the job is
    /// runnable at once instead.
    BlockOnUnknown,
    /// The provider said no: the job is `failed` (version bumped).
    Fail { reason: String },
    /// A human decides: `needs_review`.
    Review { reason: String },
    /// Give the job back; any dispatcher may take it at `next_run_at`.
    Release { next_run_at: Millis },
}

/// An admin's decision on a job.
#[derive(Debug, Clone, PartialEq)]
pub enum JobResolution {
    /// Finish the job with this result (JSON text), as if an attempt had won.
    Complete { result: String },
    /// Start a fresh retry budget now.
    Retry,
    /// Stop: no result, no more attempts (`cancelled`).
    Close,
}

/// An admin's settlement of an `unknown` attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResolution {
    /// The provider did execute it; this is what it answered.
    Executed { result: String },
    /// It never executed; the job may retry.
    NotExecuted,
}

/// Why a user or admin request on a job was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not found")]
    NotFound,
    #[error("the job is already {0}")]
    Finished(&'static str),
    #[error("an attempt of this job is started or its outcome is unknown")]
    OutcomeUnknown,
    #[error("the attempt is {0}, not unknown")]
    NotUnknown(&'static str),
}

/// A job waiting for a human, as the review queue shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewItem {
    pub job: Job,
    pub last_attempt_at: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSwitch {
    pub name: String,
    pub enabled: bool,
    pub changed_by: String,
    pub reason: String,
    pub changed_at: Millis,
}

/// One operator change of a provider switch, as the audit trail keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderAuditEntry {
    pub id: i64,
    pub name: String,
    pub enabled: bool,
    pub actor: String,
    pub reason: String,
    pub at: Millis,
}

/// What finishing an attempt did.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishOutcome {
    /// The CAS succeeded: the job is succeeded with this attempt's output.
    /// `job`: the job as that commit left it (`None` when the win was read
    /// back after a lost acknowledgement), handed to whoever waits for it.
    Won { version: i64, job: Option<Box<Job>> },
    /// The CAS touched no row: another attempt won or the job was cancelled.
    /// The attempt is `discarded` and the race is in the event log.
    Lost,
    /// A failure or unknown outcome was recorded; the job version is unchanged.
    Recorded,
}

/// One entry of the append-only job event log.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    pub id: i64,
    pub job_id: String,
    pub attempt_id: Option<String>,
    pub kind: crate::domain::EventKind,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub job_id: String,
    pub attempt_id: Option<String>,
    pub kind: crate::domain::EventKind,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub owner_id: String,
    pub key_hash: String,
    /// The first characters of the key, shown by `keys list`.
    pub prefix: String,
    pub is_admin: bool,
    pub created_at: Millis,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// The key's own limits (JSON of the fields set), over the owner's.
    pub limits: Option<String>,
    /// The key its chain of rotations began with; `None`: this key.
    pub family_id: Option<String>,
}

impl ApiKey {
    /// The key whose limits, live jobs and tokens this key shares: the
    /// first of its rotations.
    pub fn family(&self) -> &str {
        self.family_id.as_deref().unwrap_or(&self.id)
    }

    /// Neither revoked nor expired at `now`.
    pub fn is_live_at(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| e > now)
    }
}

/// Every type a [`store_methods!`](crate::store_methods) signature names: the files that expand
/// the list (the trait, each backend, the wrappers) glob-import this, so a
/// method with a new type in its signature adds that type here.
#[doc(hidden)]
pub mod signature {
    pub use super::console::{JobFilter, WindowStats};
    pub use super::hedging::HedgingShare;
    pub use super::tenants::{
        KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow,
    };
    pub use super::webhooks::{
        ClaimedDelivery, WebhookCounts, WebhookDelivery, WebhookEndpoint, WebhookTry,
        WebhookTryRecord,
    };
    pub use super::{
        ApiKey, AttemptResolution, ContractRun, ContractRunSummary, CreateOutcome, FinishAttempt,
        FinishOutcome, JobEvent, JobResolution, JobTransition, NewContractRun, NewEvent,
        ProviderAuditEntry, ProviderSwitch, Refusal, ReviewItem, StoreError,
    };
    pub use crate::domain::attempt::NewAttempt;
    pub use crate::domain::job::NewJob;
    pub use crate::domain::{Attempt, GuardRefusal, Job, Millis};
}

/// The store's queries, each declared once: which connection it needs, its
/// name and parameters, and what it answers (inside `Result<_, StoreError>`).
///
/// `store_methods!(then { extra })` expands to `then! { { extra } list }`:
/// the [`Store`] trait, both backends and every wrapper are generated from
/// this one list by their own `then` macro. The connection kinds:
///
/// - `reader`: a read (SQLite: one of the reader connections, never waiting
///   for the writer; PostgreSQL: a pooled connection).
/// - `writer`: a write of one statement (SQLite: the group-commit write
///   queue; PostgreSQL: a pooled connection, autocommit).
/// - `transaction`: a write of several statements that commit together
///   (SQLite: the write queue, whose batch is one transaction and each write
///   its own savepoint; PostgreSQL: its own READ COMMITTED transaction).
///
/// Each backend calls `ops::NAME(connection, arguments…)`: the operation of
/// the same name, taking exactly these parameters, written once for both
/// dialects in `sql/` (see the module docs). [`METHODS`] lists their names.
#[doc(hidden)]
#[macro_export]
macro_rules! store_methods {
    ($then:ident { $($extra:tt)* }) => {
        $then! {
            { $($extra)* }

            // Jobs.

            /// Insert the job unless (owner, key) exists; the database decides.
            /// Writes the `created` event in the same commit.
            transaction fn create_job(job: NewJob) -> CreateOutcome;

            /// The replay path: one indexed read.
            reader fn find_job_by_key(owner_id: &str, key: &str) -> Option<Job>;

            reader fn get_job(id: &str) -> Option<Job>;

            reader fn count_jobs() -> i64;

            /// Take up to `limit` jobs that want a driver now and whose lease is free
            /// or expired (`FOR UPDATE SKIP LOCKED` on PostgreSQL). With
            /// `reclaim_own`, jobs already leased to `owner` are taken too (their
            /// lease is never shortened): after a claim whose acknowledgement was
            /// lost, the jobs it leased to `owner` are found again at once instead
            /// of waiting out a lease nobody drives under.
            transaction fn claim_jobs(
                owner: &str,
                now: Millis,
                lease_until: Millis,
                limit: i64,
                reclaim_own: bool,
            ) -> Vec<Job>;

            /// Extend a held lease; false when it was lost.
            writer fn renew_lease(job_id: &str, owner: &str, lease_until: Millis) -> bool;

            /// Apply an engine step; false when the job is final or the lease was lost.
            transaction fn transition_job(
                job_id: &str,
                lease_owner: Option<&str>,
                transition: JobTransition,
                at: Millis,
            ) -> bool;

            /// Make a job without a driver runnable at `at` (after an unknown attempt is settled).
            writer fn wake_job(job_id: &str, at: Millis) -> ();

            // User and admin decisions; each bumps the version where it ends the job.

            transaction fn cancel_job(
                job_id: &str,
                actor: &str,
                reason: &str,
                at: Millis,
            ) -> Result<Job, Refusal>;

            /// `POST /v1/jobs/{id}/retry`: refused while an attempt is started or unknown.
            transaction fn request_retry(job_id: &str, actor: &str, at: Millis) -> Result<Job, Refusal>;

            transaction fn resolve_job(
                job_id: &str,
                resolution: JobResolution,
                actor: &str,
                reason: &str,
                at: Millis,
            ) -> Result<Job, Refusal>;

            reader fn list_review(limit: i64) -> Vec<ReviewItem>;

            // Attempts.

            /// The job's attempts, oldest first.
            reader fn list_attempts(job_id: &str) -> Vec<Attempt>;

            /// The guarded insert (invariant 4): check and insert in one atomic step.
            transaction fn start_attempt(attempt: NewAttempt) -> Result<Attempt, GuardRefusal>;

            /// Record how an attempt ended; a success goes through the CAS (invariant 5).
            transaction fn finish_attempt(finish: FinishAttempt) -> FinishOutcome;

            /// Attempts awaiting settlement, oldest first, in pages: `after` is the
            /// `(started_at, id)` of the last one of the previous page. A caller
            /// that walks every page in turn reaches each one, however many old
            /// attempts no provider can settle sit at the front.
            reader fn list_unknown_attempts(
                after: Option<(Millis, &str)>,
                limit: i64,
            ) -> Vec<Attempt>;

            /// Attempts still `started` that began before `started_before`: older
            /// than any lease, so no live driver can be waiting on them.
            reader fn list_stale_started(started_before: Millis, limit: i64) -> Vec<Attempt>;

            transaction fn resolve_attempt(
                attempt_id: &str,
                resolution: AttemptResolution,
                actor: &str,
                reason: &str,
                at: Millis,
            ) -> Result<Job, Refusal>;

            // Events.

            /// Append to the event log and wait for the commit.
            writer fn record_event(event: NewEvent) -> ();

            /// Append many events in one commit (the replay audit's flush).
            transaction fn record_events(events: Vec<NewEvent>) -> ();

            reader fn list_events(job_id: &str) -> Vec<JobEvent>;

            /// Whether the job's log has an event of `kind`: answered in the
            /// database (the job's range of its events index), nothing else
            /// fetched, however long the log.
            reader fn has_event(job_id: &str, kind: &str) -> bool;

            // Keys and tenants: the key lifecycle, run-time limits, usage.

            writer fn insert_api_key(key: ApiKey) -> ();

            reader fn find_api_key(key_hash: &str) -> Option<ApiKey>;

            reader fn list_api_keys(owner: Option<&str>) -> Vec<KeyRecord>;

            reader fn get_api_key(id: &str) -> Option<KeyRecord>;

            /// Revoke now (audited, change counter bumped); false when not found or revoked already.
            transaction fn revoke_api_key(id: &str, actor: &str, at: Millis) -> bool;

            /// Insert the successor and cut the old key's life, in one commit;
            /// false when the old key is not live or was rotated already.
            transaction fn rotate_api_key(rotation: Rotation, actor: &str) -> bool;

            /// Write `last used` for a batch of keys.
            transaction fn touch_api_keys(used: Vec<(String, Millis)>) -> ();

            /// The counter bumped by every change running servers cache.
            reader fn tenant_changes() -> i64;

            reader fn owner_limits() -> Vec<OwnerLimitsRow>;

            /// Set an owner's run-time limits (audited, change counter bumped).
            transaction fn set_owner_limits(row: OwnerLimitsRow) -> ();

            reader fn tenant_audit(limit: i64) -> Vec<TenantAuditEntry>;

            /// Heartbeat `instance` at `at`; the number of instances seen since `since`.
            transaction fn heartbeat(instance: &str, at: Millis, since: Millis) -> i64;

            writer fn leave_instances(instance: &str) -> ();

            /// An owner's (and, given its family id, a key's) live jobs and tokens on `day`,
            /// in one read.
            reader fn owner_load(owner: &str, key: Option<&str>, day: i64) -> OwnerLoad;

            /// Set (or with `None` clear) the limits of key `id` and of every key
            /// of its family, audited; false when no live key has that id.
            transaction fn set_key_limits(
                id: &str,
                limits: Option<String>,
                actor: &str,
                reason: &str,
                at: Millis,
            ) -> bool;

            /// Usage rows from `from_day` on, of `owner` or of everyone.
            reader fn usage(owner: Option<&str>, from_day: i64) -> Vec<UsageRow>;

            // Provider switches: ops control of providers.

            transaction fn set_provider_enabled(
                name: &str,
                enabled: bool,
                actor: &str,
                reason: &str,
                at: Millis,
            ) -> ();

            reader fn provider_switches() -> Vec<ProviderSwitch>;

            /// The audit trail of provider switches (of `name`, or of all), newest first.
            reader fn provider_audit(name: Option<&str>, limit: i64) -> Vec<ProviderAuditEntry>;

            // Contract runs (provider eligibility).

            writer fn insert_contract_run(run: NewContractRun) -> ();

            /// The latest run of each (contract, provider) pair, by contract then provider.
            reader fn latest_contract_runs() -> Vec<ContractRunSummary>;

            reader fn contract_run(id: &str) -> Option<ContractRun>;

            // The ops console and /metrics (read only; see `console.rs`).

            /// Jobs waiting for a human.
            reader fn review_queue_depth() -> i64;

            /// Jobs matching `filter`, newest first, at most `limit`.
            reader fn list_jobs(filter: &JobFilter, limit: i64) -> Vec<Job>;

            /// Aggregates of jobs created and attempts started in `[from, to)`,
            /// jobs counted in columns `column_ms` wide from `from`.
            reader fn window_stats(from: Millis, to: Millis, column_ms: i64) -> WindowStats;

            // Hedging shares: what each instance learned (`engine::hedging`).

            /// Upsert this instance's shares; delete those written before `forget_before`.
            transaction fn put_hedging_shares(shares: Vec<HedgingShare>, forget_before: Millis) -> ();

            /// Every share written at or after `since`.
            reader fn hedging_shares(since: Millis) -> Vec<HedgingShare>;

            // Signed webhooks (`sql/webhooks.rs`): endpoints, the outbox the
            // triggers of migration 0010 fill in the commit that ends a job,
            // claims and tries.

            writer fn insert_webhook_endpoint(endpoint: WebhookEndpoint) -> ();

            /// Endpoints of `owner`, or of everyone, oldest first.
            reader fn list_webhook_endpoints(owner: Option<&str>) -> Vec<WebhookEndpoint>;

            reader fn get_webhook_endpoint(id: &str) -> Option<WebhookEndpoint>;

            /// The endpoint with its deliveries and their tries; false when not found.
            transaction fn delete_webhook_endpoint(id: &str) -> bool;

            /// The current secret signs on until `previous_until`, beside the new one.
            writer fn rotate_webhook_secret(
                id: &str,
                secret: &str,
                previous_until: Millis,
                at: Millis,
            ) -> bool;

            /// Lease due deliveries to `instance` (`FOR UPDATE SKIP LOCKED` on
            /// PostgreSQL), at most `per_endpoint` in flight per endpoint.
            transaction fn claim_webhook_deliveries(
                instance: &str,
                now: Millis,
                lease_until: Millis,
                limit: i64,
                per_endpoint: i64,
            ) -> Vec<ClaimedDelivery>;

            /// Record a try while its sender holds the lease; false when it does not.
            transaction fn record_webhook_try(record: WebhookTryRecord) -> bool;

            /// An endpoint's deliveries, newest first.
            reader fn list_webhook_deliveries(endpoint_id: &str, limit: i64) -> Vec<WebhookDelivery>;

            reader fn get_webhook_delivery(id: &str) -> Option<WebhookDelivery>;

            /// A delivery's tries, in order.
            reader fn list_webhook_tries(delivery_id: &str) -> Vec<WebhookTry>;

            /// Send a finished delivery again (same id and body, fresh budget).
            writer fn redeliver_webhook(id: &str, at: Millis) -> bool;

            /// The outbox by state, for `/metrics`.
            reader fn webhook_counts() -> WebhookCounts;
        }
    };
}

/// The [`Store`] trait from the list: the methods every backend writes by
/// hand (`extra`), then one `async fn` per listed query.
macro_rules! define_store {
    (
        { $($extra:tt)* }
        $(
            $(#[$meta:meta])*
            $conn:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        )*
    ) => {
        #[async_trait]
        pub trait Store: Send + Sync + 'static {
            $($extra)*

            $(
                $(#[$meta])*
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret, StoreError>;
            )*
        }
    };
}

/// [`METHODS`] from the list.
macro_rules! method_names {
    (
        { $($extra:tt)* }
        $(
            $(#[$meta:meta])*
            $conn:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        )*
    ) => {
        /// The name of every query [`store_methods!`](crate::store_methods)
        /// lists, in its order (the [`Store`] methods besides `backend`,
        /// `migrate`, `ping`, `record_event_detached` and `close`).
        pub const METHODS: &[&str] = &[$(stringify!($name)),*];
    };
}

crate::store_methods!(method_names {});

use signature::*;

crate::store_methods!(define_store {
    /// Which backend, for logs and readiness.
    fn backend(&self) -> &'static str;

    /// Apply pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// A cheap round trip, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Append to the event log without waiting: for events that change no
    /// state (replays), so they never slow the request that caused them.
    fn record_event_detached(&self, event: NewEvent);

    /// Commit every queued write and close connections; later calls fail.
    async fn close(&self);
});

/// Open the store a URL names, without migrating.
pub async fn connect(url: &DatabaseUrl) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => Arc::new(sqlite::SqliteStore::open(path).await?),
        DatabaseUrl::Postgres(url) => Arc::new(postgres::PgStore::connect(url).await?),
    })
}

/// Event kinds of the job event log, by the names the store's callers
/// use: each is a [`crate::domain::EventKind`].
pub mod event {
    use crate::domain::EventKind;

    pub const CREATED: EventKind = EventKind::Created;
    pub const REPLAYED: EventKind = EventKind::Replayed;
    pub const CONFLICT: EventKind = EventKind::Conflict;
    pub const ATTEMPT_STARTED: EventKind = EventKind::AttemptStarted;
    pub const ATTEMPT_SUCCEEDED: EventKind = EventKind::AttemptSucceeded;
    pub const ATTEMPT_FAILED: EventKind = EventKind::AttemptFailed;
    pub const ATTEMPT_UNKNOWN: EventKind = EventKind::AttemptUnknown;
    pub const CAS_LOST: EventKind = EventKind::CasLost;
    pub const CANCELLED: EventKind = EventKind::Cancelled;
    pub const ATTEMPT_ABANDONED: EventKind = EventKind::AttemptAbandoned;
    pub const RETRY_SCHEDULED: EventKind = EventKind::RetryScheduled;
    pub const BLOCKED_ON_UNKNOWN: EventKind = EventKind::BlockedOnUnknown;
    pub const JOB_FAILED: EventKind = EventKind::JobFailed;
    pub const NEEDS_REVIEW: EventKind = EventKind::NeedsReview;
    pub const RETRY_REQUESTED: EventKind = EventKind::RetryRequested;
    pub const RESOLVED: EventKind = EventKind::Resolved;
    pub const ATTEMPT_RESOLVED: EventKind = EventKind::AttemptResolved;
    pub const RESPONSE_DELETED: EventKind = EventKind::ResponseDeleted;
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
