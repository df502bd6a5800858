//! The engine's store steps, carried through database blips.
//!
//! A store error is transient until proven otherwise
//! ([`StoreError::is_transient`]): the step is tried again with backoff,
//! capped at the poll interval, so a job goes on within about one interval
//! of the database coming back instead of waiting out its lease. Whatever
//! the step carries (a provider's answer) stays in memory meanwhile.
//!
//! Retries are bounded: by the lease (a step that would act for the lease
//! holder first renews the lease, and gives up when another holder has it —
//! that holder, or the reconciler, takes over), and in any case by the
//! longest lease. A step whose commit may have happened with its answer
//! lost is read back on the next try rather than done twice: an attempt is
//! found by its id, an attempt's end by its state.

use super::Inner;
use crate::domain::attempt::AttemptOutcome;
use crate::domain::attempt::NewAttempt;
use crate::domain::{Attempt, AttemptState, GuardRefusal, JobId};
use crate::store::{FinishAttempt, FinishOutcome, StoreError};
use std::future::Future;
use std::time::Duration;

const FIRST_DELAY: Duration = Duration::from_millis(10);

/// Whether a retry must still hold the job's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// The step acts for the lease holder (it starts work): renew the lease
    /// before each retry, and stop once another holder has it.
    Lease,
    /// The store fences the step itself (a transition names its holder; an
    /// attempt's end goes through its own state machine and the CAS).
    Store,
}

/// Run `step` until it succeeds, fails for good, or retries run out. `step`
/// is told whether it is a retry (so it can read back a lost commit).
pub(super) async fn retrying<T, F, Fut>(
    inner: &Inner,
    job_id: &JobId,
    fence: Fence,
    what: &str,
    mut step: F,
) -> Result<T, StoreError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let lease_ms = inner.longest_lease_ms();
    let cap = Duration::from_millis(inner.config.engine.poll_interval_ms.clamp(10, 1_000));
    let give_up = tokio::time::Instant::now() + Duration::from_millis(lease_ms.max(0) as u64);
    let mut delay = FIRST_DELAY.min(cap);
    let mut retry = false;
    loop {
        let error = match step(retry).await {
            Ok(value) => return Ok(value),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= give_up {
            tracing::error!(error = %error, job_id = job_id.as_str(), "{what}: the store stayed unavailable for a whole lease; giving up");
            return Err(error);
        }
        tracing::warn!(error = %error, job_id = job_id.as_str(), "{what} failed; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(cap);
        retry = true;
        if fence == Fence::Lease {
            let until = inner.clock.now_ms() + lease_ms;
            if let Ok(false) = inner
                .store
                .renew_lease(job_id, &inner.instance, until)
                .await
            {
                tracing::info!(
                    job_id = job_id.as_str(),
                    "{what}: the lease was lost meanwhile; the new holder takes over"
                );
                return Err(error);
            }
        }
    }
}

/// The guarded insert of an attempt, retried: an insert whose commit
/// happened with its answer lost is found by the attempt's id.
pub(super) async fn start_attempt(
    inner: &Inner,
    new: NewAttempt,
) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
    let job_id = new.job_id.clone();
    retrying(
        inner,
        &job_id,
        Fence::Lease,
        "starting an attempt",
        |retry| {
            let new = new.clone();
            async move {
                if retry {
                    let attempts = inner.store.list_attempts(&new.job_id).await?;
                    if let Some(attempt) = attempts.into_iter().find(|a| a.id == new.id) {
                        return Ok(Ok(attempt));
                    }
                }
                inner.store.start_attempt(new).await
            }
        },
    )
    .await
}

/// Record an attempt's end, retried: an end whose commit happened with its
/// answer lost is read back from the attempt's state.
pub(super) async fn finish_attempt(
    inner: &Inner,
    job_id: &JobId,
    finish: FinishAttempt,
) -> Result<FinishOutcome, StoreError> {
    retrying(
        inner,
        job_id,
        Fence::Store,
        "recording an attempt's end",
        |retry| {
            let finish = finish.clone();
            async move {
                if retry {
                    let attempts = inner.store.list_attempts(job_id).await?;
                    let stored = attempts.iter().find(|a| a.id == finish.attempt_id);
                    if let Some(outcome) = stored.and_then(|a| recorded(a, &finish.outcome)) {
                        return Ok(outcome);
                    }
                }
                inner.store.finish_attempt(finish).await
            }
        },
    )
    .await
}

/// What recording `end` did, if `attempt` shows it was recorded.
fn recorded(attempt: &Attempt, end: &AttemptOutcome) -> Option<FinishOutcome> {
    match (end, attempt.state) {
        (AttemptOutcome::Succeeded(_), AttemptState::Succeeded) => Some(FinishOutcome::Won {
            version: attempt.read_version + 1,
            job: None,
        }),
        (
            AttemptOutcome::Succeeded(_) | AttemptOutcome::Abandoned { .. },
            AttemptState::Discarded,
        ) => Some(FinishOutcome::Lost),
        (AttemptOutcome::Failed(_), AttemptState::Failed)
        | (AttemptOutcome::Unknown(_), AttemptState::Unknown) => Some(FinishOutcome::Recorded),
        _ => None,
    }
}
