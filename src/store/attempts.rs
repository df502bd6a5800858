//! Attempts in the store: the guarded start (invariant 4), the finish and
//! its compare-and-swap (invariant 5), the attempts awaiting settlement:
//! the [`AttemptStore`] trait and its types. The SQL is in `sql/attempts.rs`.

use crate::domain::attempt::{AttemptOutcome, NewAttempt};
use crate::domain::{Attempt, AttemptId, GuardRefusal, Job, JobId, Millis};
use crate::store::{Refusal, StoreError};
use async_trait::async_trait;

#[derive(Debug, Clone, PartialEq)]
pub struct FinishAttempt {
    pub attempt_id: AttemptId,
    /// As the adapter classified it; for a success, `output` is the job's
    /// result. A failure's `retryable`, `retry_after` and `status` steer the
    /// engine and are not stored.
    pub outcome: AttemptOutcome,
    pub at: Millis,
    /// Who reports it: `engine`, `reconciler`, or an admin.
    pub actor: String,
}

impl FinishAttempt {
    /// This finish with the provider's text made storable on both
    /// databases ([`AttemptOutcome::storable`]): each backend's
    /// `finish_attempt` starts with it, whoever the caller.
    pub fn storable(self) -> Self {
        FinishAttempt {
            outcome: self.outcome.storable(),
            ..self
        }
    }
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

/// An admin's settlement of an `unknown` attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResolution {
    /// The provider did execute it; this is what it answered.
    Executed { result: String },
    /// It never executed; the job may retry.
    NotExecuted,
}

#[async_trait]
pub trait AttemptStore: Send + Sync {
    /// The job's attempts, oldest first.
    async fn list_attempts(&self, job_id: &JobId) -> Result<Vec<Attempt>, StoreError>;

    /// One attempt by its id.
    async fn get_attempt(&self, attempt_id: &AttemptId) -> Result<Option<Attempt>, StoreError>;

    /// The guarded insert (invariant 4): check and insert in one atomic step.
    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError>;

    /// Record how an attempt ended; a success goes through the CAS (invariant 5).
    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError>;

    /// Attempts awaiting settlement, oldest first, in pages: `after` is the
    /// `(started_at, id)` of the last one of the previous page. A caller
    /// that walks every page in turn reaches each one, however many old
    /// attempts no provider can settle sit at the front.
    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &AttemptId)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError>;

    /// Attempts still `started` that began before `started_before`: older
    /// than any lease, so no live driver can be waiting on them.
    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError>;

    async fn resolve_attempt(
        &self,
        attempt_id: &AttemptId,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;
}
