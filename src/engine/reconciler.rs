//! Settles `unknown` attempts by asking their provider, by the job's stable
//! key, whether it executed the work. Found: the attempt succeeds through the
//! same compare-and-swap as a live answer. Not found: it failed, and the job
//! may retry. Cannot tell: it stays unknown; past the route's
//! `unknown_deadline_ms` the job goes to review.

use super::attempt::{record, settle, Settled, Source};
use super::plan::JobPlan;
use super::Inner;
use crate::domain::text::OneLine;
use crate::domain::Attempt;
use crate::domain::ErrorKind;
use crate::metrics::Metrics;
use crate::providers::{stable_key, AttemptOutcome, Lookup};
use crate::store::{FinishAttempt, JobTransition};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const BATCH: i64 = 200;

pub(crate) async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let interval = Duration::from_millis(inner.config.engine.reconcile_interval_ms.max(1));
    let mut cursor = Cursor::default();
    loop {
        if *stop.borrow() {
            return;
        }
        if let Err(e) = reconcile_once(&inner, &mut cursor).await {
            tracing::warn!(error = %e, "reconciliation pass failed");
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(interval) => {}
            // A dropped stop sender means stop too (and must not spin).
            changed = stop.changed() => if changed.is_err() { return; },
        }
    }
}

/// Where the walk through unknown attempts stands between passes: after
/// the `(started_at, id)` of the last attempt asked about, or at the start.
/// Each pass asks about the next page, so attempts no provider can settle
/// (parked in review for a human, say) cannot starve the ones behind them.
#[derive(Debug, Default)]
pub(crate) struct Cursor(Option<(crate::domain::Millis, crate::domain::AttemptId)>);

/// One pass: first attempts left `started` by a driver that stopped, then
/// the next page of unknown attempts old enough to ask about.
pub(crate) async fn reconcile_once(
    inner: &Arc<Inner>,
    cursor: &mut Cursor,
) -> Result<(), crate::store::StoreError> {
    sweep_stale_started(inner).await?;
    let now = inner.clock.now_ms();
    let min_age = inner.config.engine.reconcile_min_age_ms as i64;
    let after = cursor.0.as_ref().map(|(at, id)| (*at, id));
    let page = inner.store.list_unknown_attempts(after, BATCH).await?;
    // A short page is the end of the walk; the next pass starts over.
    let mut next = (page.len() as i64 == BATCH)
        .then(|| page.last().map(|a| (a.started_at, a.id.clone())))
        .flatten();
    for attempt in &page {
        if now - attempt.started_at < min_age {
            // The rest are younger still: start over next pass.
            next = None;
            break;
        }
        reconcile(inner, attempt).await?;
    }
    cursor.0 = next;
    Ok(())
}

/// An attempt still `started` after every lease would have run out has no
/// driver: the process that made it stopped (or lost a database write). On a
/// finished job it is abandoned; otherwise it becomes `unknown` (it may have
/// reached the provider) and is reconciled like any other.
async fn sweep_stale_started(inner: &Arc<Inner>) -> Result<(), crate::store::StoreError> {
    let now = inner.clock.now_ms();
    let longest_lease = inner.longest_lease_ms();
    for attempt in inner
        .store
        .list_stale_started(now - longest_lease, BATCH)
        .await?
    {
        let Some(job) = inner.store.get_job(&attempt.job_id).await? else {
            continue;
        };
        if job.lease_until.is_some_and(|until| until >= now) {
            continue; // someone holds the job and will deal with it
        }
        let outcome = if job.state.is_final() {
            AttemptOutcome::Abandoned {
                reason: "its driver stopped after the job had finished".to_string(),
            }
        } else {
            AttemptOutcome::unknown(
                ErrorKind::DriverLost,
                "no process drives this attempt any more; it may have reached the provider",
            )
        };
        let finish = FinishAttempt {
            attempt_id: attempt.id.clone(),
            outcome,
            at: now,
            actor: "reconciler".to_string(),
        };
        match inner.store.finish_attempt(finish).await {
            Ok(_) => {
                tracing::warn!(attempt_id = %attempt.id, job_id = %job.id, "recovered an attempt with no driver")
            }
            Err(e) => tracing::debug!(error = %e, "stale attempt already settled"),
        }
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(job_id = %attempt.job_id, attempt_id = %attempt.id))]
async fn reconcile(inner: &Arc<Inner>, attempt: &Attempt) -> Result<(), crate::store::StoreError> {
    let Some(job) = inner.store.get_job(&attempt.job_id).await? else {
        return Ok(());
    };
    let lookup = match inner.catalog.get(&attempt.provider) {
        Some(entry) => {
            entry
                .client
                .lookup(&stable_key(&job.id, &attempt.provider))
                .await
        }
        None => Lookup::CannotTell(format!(
            "provider {} is no longer configured",
            attempt.provider
        )),
    };
    let now = inner.clock.now_ms();
    // Found or not, the attempt is settled like a live one, through the
    // same step; a failure makes a parked job runnable in the same commit,
    // and the dispatcher looks now.
    let settled = match lookup {
        Lookup::Found(_) if driven_live(inner, &job, attempt, now).await? => {
            // Another attempt of this job is running under a live lease: it
            // may be streaming to the client, and a found answer committed
            // now would end that stream in an error however good it is. The
            // live attempt finishes its race first; the next pass settles
            // this one (as discarded if the live one won).
            tracing::debug!("found executed, but the job's driver has a live attempt; deferred");
            Settled::Unknown
        }
        Lookup::Found(success) => {
            Metrics::inc(&inner.metrics.reconciled_found);
            // The provider's recorded answer: the contract check, then the CAS.
            match JobPlan::new(&job.id, &job.request, &inner.contracts) {
                Ok(plan) => {
                    let outcome = AttemptOutcome::Succeeded(success);
                    settle(inner, &plan, attempt, outcome, Source::Reconciled).await
                }
                Err(e) => {
                    let outcome = AttemptOutcome::failed(e.kind, e.message);
                    record(inner, attempt, outcome, false, Source::Reconciled).await
                }
            }
        }
        Lookup::NotFound => {
            Metrics::inc(&inner.metrics.reconciled_not_found);
            let outcome = AttemptOutcome::failed(
                ErrorKind::NotExecuted,
                "reconciled: the provider has no record of the key",
            );
            record(inner, attempt, outcome, false, Source::Reconciled).await
        }
        Lookup::CannotTell(why) => {
            Metrics::inc(&inner.metrics.reconciled_cannot_tell);
            let deadline = inner
                .config
                .routes
                .get(&job.route)
                .map(|r| r.unknown_deadline_ms)
                .unwrap_or(0) as i64;
            if now - attempt.started_at >= deadline && job.state.is_final() {
                // Nothing waits on it any more (the job finished without
                // it) and nobody can say whether it ran: it is let go, as a
                // loser is, instead of being asked about on every pass.
                let finish = FinishAttempt {
                    attempt_id: attempt.id.clone(),
                    outcome: AttemptOutcome::Abandoned {
                        reason: format!(
                            "the job finished without it, and past unknown_deadline_ms ({deadline} ms) {} still cannot say whether it ran: {why}",
                            attempt.provider
                        ),
                    },
                    at: now,
                    actor: "reconciler".to_string(),
                };
                match inner.store.finish_attempt(finish).await {
                    Ok(_) => {
                        Metrics::inc(&inner.metrics.reconciled_abandoned);
                        tracing::info!("an unknown attempt of a finished job was let go");
                    }
                    Err(e) => tracing::debug!(error = %e, "unknown attempt already settled"),
                }
            } else if now - attempt.started_at >= deadline {
                let reason = format!(
                    "attempt {} on {} started over {deadline} ms ago (unknown_deadline_ms) and its outcome is still unknown; the provider cannot say: {why}",
                    attempt.id, attempt.provider
                );
                if inner
                    .store
                    .transition_job(&job.id, None, JobTransition::Review { reason }, now)
                    .await?
                {
                    Metrics::inc(&inner.metrics.jobs_to_review);
                }
            }
            Settled::Unknown
        }
    };
    match settled {
        Settled::Won => tracing::info!("unknown attempt found executed; job succeeded"),
        Settled::Failed(f) => {
            tracing::info!(reason = %OneLine(&f.reason), "unknown attempt settled as failed; the job may retry");
            inner.wake.notify_one();
        }
        Settled::Lost | Settled::Unknown => {}
    }
    inner.notify(&job.id);
    Ok(())
}

/// Whether a driver holds `job` and runs one of its attempts other than
/// `attempt` right now.
async fn driven_live(
    inner: &Arc<Inner>,
    job: &crate::domain::Job,
    attempt: &Attempt,
    now: crate::domain::Millis,
) -> Result<bool, crate::store::StoreError> {
    if job.state.is_final() || job.lease_until.is_none_or(|until| until < now) {
        return Ok(false);
    }
    let attempts = inner.store.list_attempts(&job.id).await?;
    Ok(attempts
        .iter()
        .any(|a| a.id != attempt.id && a.state == crate::domain::AttemptState::Started))
}
