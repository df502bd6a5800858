//! Durable storage behind one trait, with a SQLite and a PostgreSQL backend.
//!
//! Every operation that an invariant depends on is one atomic step here:
//! idempotent create (the UNIQUE constraint decides), the guarded attempt
//! insert (invariant 4) and the compare-and-swap finish (invariant 5). SQL is
//! kept per dialect in the backend files and never built with `format!`.

use crate::config::DatabaseUrl;
pub use crate::domain::attempt::AttemptOutcome;
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job, Millis};
use async_trait::async_trait;
use std::sync::Arc;

pub mod console;
mod contract_runs;
pub mod faulty;
mod lifecycle;
mod ops;
pub mod postgres;
mod rows;
pub mod sqlite;
pub mod tenants;

pub use contract_runs::{ContractRun, ContractRunSummary, NewContractRun};
use tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
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
            // SQLite result codes (the primary code is the low byte):
            // BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL.
            Some(code) => code
                .parse::<i64>()
                .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14 | 15)),
            None => false,
        },
        _ => false,
    }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    /// The CAS succeeded: the job is succeeded with this attempt's output.
    Won { version: i64 },
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
    pub kind: String,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub job_id: String,
    pub attempt_id: Option<String>,
    pub kind: &'static str,
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

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Which backend, for logs and readiness.
    fn backend(&self) -> &'static str;

    /// Apply pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// A cheap round trip, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Insert the job unless (owner, key) exists; the database decides.
    /// Writes the `created` event in the same commit.
    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError>;

    /// The replay path: one indexed read.
    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError>;

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError>;

    /// The job's attempts, oldest first.
    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError>;

    /// The guarded insert (invariant 4): check and insert in one atomic step.
    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError>;

    /// Record how an attempt ended; a success goes through the CAS (invariant 5).
    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError>;

    /// Append to the event log and wait for the commit.
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError>;

    /// Append to the event log without waiting: for events that change no
    /// state (replays), so they never slow the request that caused them.
    fn record_event_detached(&self, event: NewEvent);

    /// Append many events in one commit (the replay audit's flush).
    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError>;

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError>;

    async fn count_jobs(&self) -> Result<i64, StoreError>;

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError>;

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError>;

    /// Commit every queued write and close connections; later calls fail.
    async fn close(&self);

    // The engine's job lifecycle.

    /// Take up to `limit` jobs that want a driver now and whose lease is free
    /// or expired (`FOR UPDATE SKIP LOCKED` on PostgreSQL). With
    /// `reclaim_own`, jobs already leased to `owner` are taken too (their
    /// lease is never shortened): after a claim whose acknowledgement was
    /// lost, the jobs it leased to `owner` are found again at once instead
    /// of waiting out a lease nobody drives under.
    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError>;

    /// Extend a held lease; false when it was lost.
    async fn renew_lease(
        &self,
        job_id: &str,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError>;

    /// Apply an engine step; false when the job is final or the lease was lost.
    async fn transition_job(
        &self,
        job_id: &str,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Make a job without a driver runnable at `at` (after an unknown attempt is settled).
    async fn wake_job(&self, job_id: &str, at: Millis) -> Result<(), StoreError>;

    /// Attempts awaiting settlement, oldest first, in pages: `after` is the
    /// `(started_at, id)` of the last one of the previous page. A caller
    /// that walks every page in turn reaches each one, however many old
    /// attempts no provider can settle sit at the front.
    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError>;

    /// Attempts still `started` that began before `started_before`: older
    /// than any lease, so no live driver can be waiting on them.
    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError>;

    // User and admin decisions; each bumps the version where it ends the job.

    async fn cancel_job(
        &self,
        job_id: &str,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    /// `POST /v1/jobs/{id}/retry`: refused while an attempt is started or unknown.
    async fn request_retry(
        &self,
        job_id: &str,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    async fn resolve_job(
        &self,
        job_id: &str,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    async fn resolve_attempt(
        &self,
        attempt_id: &str,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError>;

    // Ops control of providers.

    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError>;

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError>;

    /// The audit trail of provider switches (of `name`, or of all), newest first.
    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError>;

    // Contract runs (provider eligibility).

    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError>;

    /// The latest run of each (contract, provider) pair, by contract then provider.
    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError>;

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError>;

    // The ops console and /metrics (read only; see `console.rs`).

    /// Jobs waiting for a human.
    async fn review_queue_depth(&self) -> Result<i64, StoreError>;

    /// Jobs matching `filter`, newest first, at most `limit`.
    async fn list_jobs(
        &self,
        filter: &console::JobFilter,
        limit: i64,
    ) -> Result<Vec<Job>, StoreError>;

    /// Aggregates of jobs created and attempts started in `[from, to)`,
    /// jobs counted in columns `column_ms` wide from `from`.
    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<console::WindowStats, StoreError>;

    // Tenants: the key lifecycle, run-time limits, usage (`store/tenants.rs`).

    async fn list_api_keys(&self, owner: Option<&str>) -> Result<Vec<KeyRecord>, StoreError>;

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError>;

    /// Revoke now (audited, change counter bumped); false when not found or revoked already.
    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError>;

    /// Insert the successor and cut the old key's life, in one commit;
    /// false when the old key is not live or was rotated already.
    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError>;

    /// Write `last used` for a batch of keys.
    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError>;

    /// The counter bumped by every change running servers cache.
    async fn tenant_changes(&self) -> Result<i64, StoreError>;

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError>;

    /// Set an owner's run-time limits (audited, change counter bumped).
    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError>;

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError>;

    /// Heartbeat `instance` at `at`; the number of instances seen since `since`.
    async fn heartbeat(&self, instance: &str, at: Millis, since: Millis)
        -> Result<i64, StoreError>;

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError>;

    /// The owner's live jobs and today's tokens, in one read.
    /// An owner's (and, given its family id, a key's) live jobs and tokens on `day`.
    async fn owner_load(
        &self,
        owner: &str,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError>;

    /// Set (or with `None` clear) the limits of key `id` and of every key
    /// of its family, audited; false when no live key has that id.
    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Usage rows from `from_day` on, of `owner` or of everyone.
    async fn usage(&self, owner: Option<&str>, from_day: i64) -> Result<Vec<UsageRow>, StoreError>;
}

/// Open the store a URL names, without migrating.
pub async fn connect(url: &DatabaseUrl) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => Arc::new(sqlite::SqliteStore::open(path).await?),
        DatabaseUrl::Postgres(url) => Arc::new(postgres::PgStore::connect(url).await?),
    })
}

/// Event kinds of the job event log.
pub mod event {
    pub const CREATED: &str = "created";
    pub const REPLAYED: &str = "replayed";
    pub const CONFLICT: &str = "conflict";
    pub const ATTEMPT_STARTED: &str = "attempt_started";
    pub const ATTEMPT_SUCCEEDED: &str = "attempt_succeeded";
    pub const ATTEMPT_FAILED: &str = "attempt_failed";
    pub const ATTEMPT_UNKNOWN: &str = "attempt_unknown";
    pub const CAS_LOST: &str = "cas_lost";
    pub const CANCELLED: &str = "cancelled";
    pub const ATTEMPT_ABANDONED: &str = "attempt_abandoned";
    pub const RETRY_SCHEDULED: &str = "retry_scheduled";
    pub const BLOCKED_ON_UNKNOWN: &str = "blocked_on_unknown";
    pub const JOB_FAILED: &str = "job_failed";
    pub const NEEDS_REVIEW: &str = "needs_review";
    pub const RETRY_REQUESTED: &str = "retry_requested";
    pub const RESOLVED: &str = "resolved";
    pub const ATTEMPT_RESOLVED: &str = "attempt_resolved";
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
