//! The job: the durable record of one intent, and why one without an
//! answer has none ([`Unanswered`]).

use super::attempt::NewAttempt;
use super::{Attempt, AttemptState, ErrorKind, JobId, Millis, OwnerId};
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
    pub id: JobId,
    pub owner_id: OwnerId,
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
    pub id: JobId,
    pub owner_id: OwnerId,
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

/// Why a job has no answer for its client, as every door, every stream and
/// every replay names it (docs/api.md): read from its state and the kind of
/// its last failed attempt. The one map from a job's state to an error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswered {
    /// Pending or running: the same request picks it up later.
    Pending,
    Cancelled,
    /// Waiting for a human; with its last failed attempt's kind when that
    /// was a provider's refusal ([`ErrorKind::is_refusal`]: e.g. rate-limited
    /// until its retries ran out), which the client is told.
    NeedsReview(Option<ErrorKind>),
    /// Failed, with its last failed attempt's kind when it has one (a
    /// provider's refusal keeps its code).
    Failed(Option<ErrorKind>),
}

impl Unanswered {
    /// A job in `state` with these `attempts` (only a failed job's and one
    /// in review are read, so a caller may pass none for another state);
    /// `None` when it succeeded.
    /// A failed job with no failed attempt (no provider could take its
    /// request) keeps the kind its `last_error` leads with, when it names
    /// one (`context_length_exceeded: …`).
    pub fn of(
        state: JobState,
        attempts: &[Attempt],
        last_error: Option<&str>,
    ) -> Option<Unanswered> {
        let last_failed = || last_failure(attempts).cloned();
        let led_with = || {
            let (kind, _) = last_error?.split_once(": ")?;
            Some(ErrorKind::parse(kind)).filter(|k| !matches!(k, ErrorKind::Other(_)))
        };
        Some(match state {
            JobState::Succeeded => return None,
            JobState::Pending | JobState::Running => Unanswered::Pending,
            JobState::Cancelled => Unanswered::Cancelled,
            JobState::NeedsReview => {
                Unanswered::NeedsReview(last_failed().filter(ErrorKind::is_refusal))
            }
            JobState::Failed => Unanswered::Failed(last_failed().or_else(led_with)),
        })
    }

    /// Whether the attempts say anything [`Unanswered::of`] a job in
    /// `state` needs: a caller may skip reading them otherwise.
    pub fn reads_attempts(state: JobState) -> bool {
        matches!(state, JobState::Failed | JobState::NeedsReview)
    }

    /// The error code: `job_pending`, `job_cancelled`; the kind kept (a
    /// failed job's last failure, a provider's refusal that sent it to
    /// review); else `job_needs_review` or `job_failed`.
    pub fn code(&self) -> &str {
        match self {
            Unanswered::Pending => "job_pending",
            Unanswered::Cancelled => "job_cancelled",
            Unanswered::NeedsReview(Some(kind)) | Unanswered::Failed(Some(kind)) => kind.as_str(),
            Unanswered::NeedsReview(None) => "job_needs_review",
            Unanswered::Failed(None) => "job_failed",
        }
    }
}

/// The kind of the last failed attempt among a job's `attempts`: what a
/// job in review or failed is told by where its state alone says too
/// little (e.g. an overload that ran its retries out into review).
pub fn last_failure(attempts: &[Attempt]) -> Option<&ErrorKind> {
    attempts
        .iter()
        .rev()
        .filter(|a| a.state == AttemptState::Failed)
        .find_map(|a| a.error_kind.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttemptKind;

    fn attempt(state: AttemptState, kind: Option<ErrorKind>) -> Attempt {
        Attempt {
            id: "a".into(),
            job_id: "j".into(),
            seq: 1,
            provider: "p".into(),
            kind: AttemptKind::Primary,
            state,
            read_version: 0,
            started_at: 0,
            finished_at: None,
            error_kind: kind,
            error_message: None,
            output: None,
            usage: None,
            provider_request_id: None,
            finish_reason: None,
        }
    }

    #[test]
    fn each_state_without_an_answer_has_one_code() {
        let refused = [
            attempt(AttemptState::Failed, Some(ErrorKind::ContentPolicy)),
            attempt(AttemptState::Unknown, Some(ErrorKind::Timeout)),
        ];
        let code = |state| Unanswered::of(state, &refused, None).map(|u| u.code().to_string());
        assert_eq!(code(JobState::Succeeded), None);
        assert_eq!(code(JobState::Pending).as_deref(), Some("job_pending"));
        assert_eq!(code(JobState::Running).as_deref(), Some("job_pending"));
        assert_eq!(code(JobState::Cancelled).as_deref(), Some("job_cancelled"));
        // In review after a provider's refusal: the refusal is told.
        assert_eq!(
            code(JobState::NeedsReview).as_deref(),
            Some("content_policy")
        );
        // In review otherwise (a failure that is no refusal).
        let failed = [attempt(AttemptState::Failed, Some(ErrorKind::ServerError))];
        assert_eq!(
            Unanswered::of(JobState::NeedsReview, &failed, None).map(|u| u.code().to_string()),
            Some("job_needs_review".to_string())
        );
        // Failed: the last failed attempt's kind, not a later unknown one's.
        assert_eq!(code(JobState::Failed).as_deref(), Some("content_policy"));
        assert_eq!(
            Unanswered::of(JobState::Failed, &[], None).map(|u| u.code().to_string()),
            Some("job_failed".to_string())
        );
        // Failed before any attempt: the kind the last error leads with,
        // when it is one.
        let failed_with = |last_error| {
            Unanswered::of(JobState::Failed, &[], Some(last_error)).map(|u| u.code().to_string())
        };
        assert_eq!(
            failed_with(
                "context_length_exceeded: no provider on the route can take the request: …"
            )
            .as_deref(),
            Some("context_length_exceeded")
        );
        assert_eq!(
            failed_with("context_window: sim needs 8 prompt tokens").as_deref(),
            Some("job_failed")
        );
    }
}
