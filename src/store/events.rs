//! The append-only job event log: the [`EventStore`] trait, its rows and
//! the event kinds. The SQL is in `sql/events.rs`.

use crate::domain::Millis;
use crate::store::StoreError;
use async_trait::async_trait;

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
    /// A Response deleted through `DELETE /v1/responses/{id}`: the job stays,
    /// the response is no longer shown.
    pub const RESPONSE_DELETED: &str = "response_deleted";
}

#[async_trait]
pub trait EventStore: Send + Sync {
    /// Append to the event log and wait for the commit.
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError>;

    /// Append many events in one commit (the replay audit's flush).
    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError>;

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError>;

    /// Whether the job's log has an event of `kind`: answered in the
    /// database (the job's range of its events index), nothing else
    /// fetched, however long the log.
    async fn has_event(&self, job_id: &str, kind: &str) -> Result<bool, StoreError>;
}
