//! The append-only job event log: the [`EventStore`] trait, its rows and
//! the event kinds. The SQL is in `sql/events.rs`.

use crate::domain::{AttemptId, JobId, Millis};
use crate::store::StoreError;
use async_trait::async_trait;

/// One entry of the append-only job event log.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    pub id: i64,
    pub job_id: JobId,
    pub attempt_id: Option<AttemptId>,
    pub kind: crate::domain::EventKind,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub job_id: JobId,
    pub attempt_id: Option<AttemptId>,
    pub kind: crate::domain::EventKind,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
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

#[async_trait]
pub trait EventStore: Send + Sync {
    /// Append to the event log and wait for the commit.
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError>;

    /// Append many events in one commit (the replay audit's flush).
    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError>;

    async fn list_events(&self, job_id: &JobId) -> Result<Vec<JobEvent>, StoreError>;

    /// Whether the job's log has an event of `kind`: answered in the
    /// database (the job's range of its events index), nothing else
    /// fetched, however long the log.
    async fn has_event(&self, job_id: &JobId, kind: &str) -> Result<bool, StoreError>;
}
