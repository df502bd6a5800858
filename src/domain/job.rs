//! The job: the durable record of one intent.

use super::Millis;
use serde::Serialize;

/// Where a job is in its life. Terminal states never change again except by
/// an explicit admin resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted; waiting for its first attempt or a backoff.
    Pending,
    /// At least one attempt was started.
    Running,
    Succeeded,
    /// A non-retryable error: the provider said no.
    Failed,
    /// Retries exhausted or an unknown outcome past its deadline: a human decides.
    NeedsReview,
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::NeedsReview => "needs_review",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => JobState::Pending,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "needs_review" => JobState::NeedsReview,
            "cancelled" => JobState::Cancelled,
            _ => return None,
        })
    }

    /// Succeeded, failed and cancelled jobs take no more attempts.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// A job row as stored. `request` and `result` are JSON text, kept as text so
/// the hot path never decodes and re-encodes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: String,
    pub owner_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub request: String,
    pub route: String,
    pub state: JobState,
    pub version: i64,
    pub result: Option<String>,
    pub completed_by: Option<String>,
    pub last_error: Option<String>,
    pub attempt_count: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What the store needs to create a job; ids and timestamps are made by the
/// caller, the store writes what it is given.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: String,
    pub owner_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub request: String,
    pub route: String,
    pub created_at: Millis,
}

impl NewJob {
    /// The job row this creates, before anything else happened to it.
    pub fn into_job(self) -> Job {
        Job {
            id: self.id,
            owner_id: self.owner_id,
            idempotency_key: self.idempotency_key,
            fingerprint: self.fingerprint,
            request: self.request,
            route: self.route,
            state: JobState::Pending,
            version: 0,
            result: None,
            completed_by: None,
            last_error: None,
            attempt_count: 0,
            created_at: self.created_at,
            updated_at: self.created_at,
        }
    }
}
