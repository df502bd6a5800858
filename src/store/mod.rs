//! Durable storage behind one trait, with a SQLite and a PostgreSQL backend.
//!
//! Every operation that an invariant depends on is one atomic step here:
//! idempotent create (the UNIQUE constraint decides), the guarded attempt
//! insert (invariant 4) and the compare-and-swap finish (invariant 5). SQL is
//! kept per dialect in the backend files and never built with `format!`.

use crate::config::DatabaseUrl;
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job, Millis};
use async_trait::async_trait;
use std::sync::Arc;

mod ops;
pub mod postgres;
mod rows;
pub mod sqlite;

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

/// The answer to an idempotent create.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// This call inserted the job.
    Created(Job),
    /// A job with this owner and key already existed; it is returned as stored.
    Existing(Job),
}

/// How an attempt ended, as reported to the store.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEnd {
    /// The provider answered with output; the attempt tries to win the CAS.
    Succeeded {
        output: String,
        usage: Option<String>,
        provider_request_id: Option<String>,
    },
    /// The provider said no, or the request provably never left.
    Failed { error_kind: String, message: String },
    /// The provider may have executed it; nothing may retry until it is settled.
    Unknown { error_kind: String, message: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct FinishAttempt {
    pub attempt_id: String,
    pub end: AttemptEnd,
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
    pub is_admin: bool,
    pub created_at: Millis,
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

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError>;

    async fn count_jobs(&self) -> Result<i64, StoreError>;

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError>;

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError>;

    /// Commit every queued write and close connections; later calls fail.
    async fn close(&self);
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
