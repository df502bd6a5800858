//! The job: the durable record of one intent.

use super::attempt::NewAttempt;
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

    // The lifecycle predicates (`is_final`, `takes_attempts`, …) are in
    // `domain::lifecycle`.
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
    /// When the job next wants a driver; `None` while nothing is to be done.
    pub next_run_at: Option<Millis>,
    /// The engine instance driving the job, and until when.
    pub lease_owner: Option<String>,
    pub lease_until: Option<Millis>,
    /// `attempt_count` when the current retry budget began.
    pub budget_start: i64,
}

impl Job {
    /// Attempts made under the current retry budget.
    pub fn attempts_in_budget(&self) -> i64 {
        self.attempt_count - self.budget_start
    }
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
    /// An engine instance that takes the job at once (create and claim in one
    /// commit), with its lease end; `None` leaves it to any dispatcher.
    pub lease: Option<(String, Millis)>,
    /// The key (family, see `ApiKey::family`) that created it; `None` for
    /// jobs made without a key.
    pub key_id: Option<String>,
    /// Its primary attempt, started in the same commit (create, claim and
    /// start in one write): the job is created `running` with this attempt
    /// `started` (seq 1, read version 0). `None`: created `pending`.
    pub primary: Option<NewAttempt>,
}

impl NewJob {
    /// The job row this creates, before anything else happened to it.
    pub fn into_job(self) -> Job {
        let started = self.primary.is_some();
        Job {
            id: self.id,
            owner_id: self.owner_id,
            idempotency_key: self.idempotency_key,
            fingerprint: self.fingerprint,
            request: self.request,
            route: self.route,
            state: if started {
                JobState::Running
            } else {
                JobState::Pending
            },
            version: 0,
            result: None,
            completed_by: None,
            last_error: None,
            attempt_count: i64::from(started),
            created_at: self.created_at,
            updated_at: self.created_at,
            next_run_at: Some(self.created_at),
            lease_until: self.lease.as_ref().map(|(_, until)| *until),
            lease_owner: self.lease.map(|(owner, _)| owner),
            budget_start: 0,
        }
    }
}
