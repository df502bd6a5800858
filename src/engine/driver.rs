//! Driving one job: rounds of attempts (a primary or retry, plus hedges after
//! the silence threshold) until one wins, the job must wait on an unknown
//! outcome, fails for good, or goes to review.

use super::attempt::{RoundEnd, RoundFailure};
use super::durable::{self, retrying, Fence};
use super::plan::JobPlan;
use super::round;
use super::routing::{choose_hedge, choose_provider, Choice, Steer};
use super::stream::StreamHub;
use super::Inner;
use crate::domain::retry::backoff;
use crate::domain::{Attempt, AttemptKind, AttemptState, Job, Millis};
use crate::metrics::Metrics;
use crate::providers::AttemptOutcome;
use crate::store::{FinishAttempt, JobTransition};
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn spawn(inner: Arc<Inner>, job: Job, prestart: Option<super::Prestart>) {
    if !inner.begin_driving(&job.id) {
        return;
    }
    // The job's span continues the trace of whoever handed the job over
    // (the request that created it) without keeping that span open.
    let span = tracing::info_span!(parent: None, "job", job_id = %job.id);
    crate::telemetry::continue_trace(&span);
    // Taken now, before the submitter answers: a streaming client then
    // knows this driver streams to it. A job whose create started its
    // attempt was created for no streaming client (`Engine::prestart`).
    let hub = match prestart {
        Some(_) => None,
        None => inner.claim_hub(&job),
    };
    let inner_for_spawn = inner.clone();
    let task = async move {
        let _driving = Driving {
            inner: inner.clone(),
            job_id: job.id.clone(),
        };
        let (id, owner, key) = (
            job.id.clone(),
            job.owner_id.clone(),
            job.idempotency_key.clone(),
        );
        if let Ok(_permit) = inner.slots.acquire().await {
            if still_ours(&inner, &job).await {
                drive(&inner, job, hub.clone(), prestart).await;
            }
        }
        if let Some(hub) = hub {
            super::stream::close_after_drive(&inner, &id, &owner, &key, hub).await;
        }
    };
    inner_for_spawn.spawn(tracing::Instrument::instrument(task, span));
}

/// Marks the end of driving a job however the task ends (even by a panic),
/// so the dispatcher may take the job again and waiters hear of it.
struct Driving {
    inner: Arc<Inner>,
    job_id: String,
}

impl Drop for Driving {
    fn drop(&mut self) {
        self.inner.end_driving(&self.job_id);
        self.inner.notify(&self.job_id);
    }
}

/// A job that waited for a free slot may have outlived its lease; renew it
/// (or learn that another process took it over) before driving. Without a
/// wait this costs nothing.
async fn still_ours(inner: &Inner, job: &Job) -> bool {
    let Some(route) = inner.config.routes.get(&job.route) else {
        return true;
    };
    let now = inner.clock.now_ms();
    let lease = inner.lease_ms(route);
    if job.lease_until.is_some_and(|until| until - now > lease / 2) {
        return true;
    }
    let renewed = retrying(inner, &job.id, Fence::Store, "renewing a lease", |_| {
        inner
            .store
            .renew_lease(&job.id, &inner.instance, now + lease)
    })
    .await;
    match renewed {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(job_id = %job.id, "lease lost while waiting for a slot; another process drives the job");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, job_id = %job.id, "cannot renew a lease");
            false
        }
    }
}

/// The error kind with which a provider says the prompt does not fit.
const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

async fn drive(
    inner: &Arc<Inner>,
    mut job: Job,
    hub: Option<Arc<StreamHub>>,
    prestart: Option<super::Prestart>,
) {
    let owner = inner.instance.clone();
    let transition = |job_id: String, t: JobTransition| {
        let inner = inner.clone();
        let owner = owner.clone();
        async move {
            let now = inner.clock.now_ms();
            // Applied twice (its first commit's answer lost) is harmless:
            // the second finds the lease released or the same step taken.
            let applied = retrying(&inner, &job_id, Fence::Store, "a job transition", |_| {
                inner
                    .store
                    .transition_job(&job_id, Some(&owner), t.clone(), now)
            })
            .await;
            match applied {
                Ok(applied) => applied,
                Err(e) => {
                    tracing::error!(error = %e, "job transition failed");
                    false
                }
            }
        }
    };
    let Some(route) = inner.config.routes.get(&job.route).cloned() else {
        let reason = format!("route {:?} is not configured on this server", job.route);
        transition(job.id.clone(), JobTransition::Review { reason }).await;
        Metrics::inc(&inner.metrics.jobs_to_review);
        return;
    };
    // The primary attempt the job's create started: the first round sends
    // it as chosen, without starting another.
    let (plan, mut prestarted) = match prestart {
        Some(p) => (p.plan, Some(p.attempt)),
        None => match JobPlan::new(&job.id, &job.request, &inner.contracts) {
            Ok(plan) => (plan, None),
            Err(e) => {
                transition(job.id.clone(), JobTransition::Fail { reason: e.0 }).await;
                Metrics::inc(&inner.metrics.jobs_failed);
                return;
            }
        },
    };
    // The job's attempts so far: who was tried, who is unknown. Read again
    // after every round that did not finish the job (retries are rare).
    let mut history: Vec<Attempt> = Vec::new();
    if job.attempt_count > 0 && prestarted.is_none() {
        match recover_orphans(inner, &job).await {
            Some(attempts) => history = attempts,
            None => {
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
        }
    }
    // A retry continues along the route after the provider tried last.
    let mut steer = Steer {
        after: history.last().map(|a| a.provider.clone()),
        blocked: Steer::blocked_by(inner, &history),
        ..Steer::default()
    };
    // A job's first round (not a job taken over) counts once in its
    // route's hedge window: the budget is a share of these.
    if prestarted.is_some() || job.attempt_count == 0 {
        inner.hedging.job_started(&job.route, inner.clock.now_ms());
    }
    let mut same_provider_streak = 0u32;
    let mut idle_rounds = 0u32;
    loop {
        if prestarted.is_none() && job.attempts_in_budget() >= i64::from(route.max_attempts) {
            let reason = format!(
                "retries exhausted after {} attempts; last error: {}",
                job.attempts_in_budget(),
                job.last_error.as_deref().unwrap_or("none")
            );
            if transition(job.id.clone(), JobTransition::Review { reason }).await {
                Metrics::inc(&inner.metrics.jobs_to_review);
            }
            return;
        }
        let kind = if job.attempt_count == 0 || prestarted.is_some() {
            AttemptKind::Primary
        } else {
            AttemptKind::Retry
        };
        let tried: Vec<String> = history.iter().map(|a| a.provider.clone()).collect();
        // An attempt is unknown (e.g. an orphan of a process that stopped):
        // the fan-out to a provider the job has not tried is a hedge, within
        // max_hedges, and may start now (invariant 4).
        let unknown_left = history.iter().any(|a| a.state == AttemptState::Unknown);
        let hedges_made = history
            .iter()
            .filter(|a| a.kind == AttemptKind::Hedge)
            .count();
        let rescue = (unknown_left && hedges_made < route.max_hedges as usize)
            .then(|| choose_hedge(inner, &route, &plan, &tried))
            .flatten();
        let choice = match (&prestarted, rescue) {
            // The catalog is the engine's for its life: the provider the
            // attempt was started for is in it.
            (Some(started), _) => inner.catalog.get(&started.provider).map_or_else(
                || Choice::NoneAdmitted(format!("{}: not configured", started.provider)),
                Choice::Provider,
            ),
            (None, Some(entry)) => Choice::Provider(entry),
            (None, None) => choose_provider(inner, &route, &plan, kind, &steer),
        };
        let kind = if rescue.is_some() {
            AttemptKind::Hedge
        } else {
            kind
        };
        let end = match choice {
            Choice::Provider(entry) => {
                let scope = round::Scope {
                    inner,
                    job: &job,
                    route: &route,
                    plan: &plan,
                };
                let first = round::First {
                    entry,
                    kind,
                    started: prestarted.take(),
                };
                let hub = hub.clone().filter(|hub| hub.is_open());
                round::run(scope, first, tried, hub).await
            }
            Choice::NoneFits(reason) => {
                let reason = match steer.window_above {
                    Some(_) => format!("{CONTEXT_LENGTH_EXCEEDED}: no provider on the route has a larger context window: {reason}"),
                    None => reason,
                };
                transition(job.id.clone(), JobTransition::Fail { reason }).await;
                Metrics::inc(&inner.metrics.jobs_failed);
                return;
            }
            Choice::Blocked(why) => {
                tracing::info!(%why, "every provider left has an unknown attempt; waiting for reconciliation");
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
            Choice::NoneAdmitted(reason) => {
                idle_rounds += 1;
                if idle_rounds >= route.max_attempts {
                    let reason = format!("no provider could take the job: {reason}");
                    if transition(job.id.clone(), JobTransition::Review { reason }).await {
                        Metrics::inc(&inner.metrics.jobs_to_review);
                    }
                    return;
                }
                RoundEnd::Ended {
                    unknown: None,
                    failure: Some(RoundFailure::of_round(true, "no_provider", reason, "")),
                }
            }
        };
        // The client's stream ended with an error: unless the route says
        // otherwise, the job is not run again behind its back.
        if let (Some(hub), RoundEnd::Ended { unknown, .. }) = (&hub, &end) {
            if let Some((code, told)) = hub.error().filter(|_| !route.complete_after_stream_error) {
                stop_after_stream_error(inner, unknown.as_deref(), &code, &told, |t| {
                    transition(job.id.clone(), t)
                })
                .await;
                return;
            }
        }
        let (unknown, failure) = match end {
            RoundEnd::Done => return,
            RoundEnd::Refused
            | RoundEnd::Ended {
                unknown: None,
                failure: None,
            } => {
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
            RoundEnd::Ended { unknown, failure } => (unknown, failure),
        };
        // How the next round is steered, and how long it waits.
        let mut next = Steer {
            after: steer.after.clone(),
            ..Steer::default()
        };
        let mut retry_after = None;
        let mut wait_at_all = true;
        let reason = match failure {
            // The provider said the prompt does not fit: only a larger window
            // may take it, never the one that refused.
            Some(f) if !f.retryable() && f.failure.kind == CONTEXT_LENGTH_EXCEEDED => {
                next.window_above = inner
                    .catalog
                    .get(&f.provider)
                    .map(|e| e.config.context_window);
                next.after = Some(f.provider);
                same_provider_streak = 0;
                wait_at_all = false;
                f.reason
            }
            Some(f) if !f.retryable() => {
                // Failing now would discard what the unknown attempt may yet
                // deliver: the reconciler decides first.
                if unknown.is_some() {
                    transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                } else if transition(job.id.clone(), JobTransition::Fail { reason: f.reason }).await
                {
                    Metrics::inc(&inner.metrics.jobs_failed);
                }
                return;
            }
            Some(f) => {
                if f.refusal
                    && !f.provider.is_empty()
                    && same_provider_streak < route.same_provider_retries
                {
                    // Ask the same provider again first, never sooner than
                    // it asked (Retry-After).
                    same_provider_streak += 1;
                    next.prefer = Some(f.provider.clone());
                    retry_after = f.failure.retry_after;
                } else {
                    same_provider_streak = 0;
                }
                if !f.provider.is_empty() {
                    next.after = Some(f.provider);
                }
                f.reason
            }
            None => {
                same_provider_streak = 0;
                next.after = unknown.clone();
                format!(
                    "an attempt on {} ended unknown",
                    unknown.as_deref().unwrap_or("?")
                )
            }
        };
        let listed = retrying(inner, &job.id, Fence::Store, "listing attempts", |_| {
            inner.store.list_attempts(&job.id)
        })
        .await;
        history = match listed {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "cannot list a job's attempts; its lease will expire");
                return;
            }
        };
        next.blocked = Steer::blocked_by(inner, &history);
        if unknown.is_some() {
            // Blocked only when no provider is left that the job may try.
            if let Choice::Blocked(why) =
                choose_provider(inner, &route, &plan, AttemptKind::Retry, &next)
            {
                tracing::info!(%why, "an attempt ended unknown and no provider is left; waiting for reconciliation");
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
        }
        let wait = if wait_at_all {
            let retry_number = (job.attempts_in_budget().max(1)) as u32;
            let mut rng = match inner.rng.lock() {
                Ok(r) => r,
                Err(p) => p.into_inner(),
            };
            backoff(
                Duration::from_millis(route.backoff_base_ms),
                Duration::from_millis(route.backoff_cap_ms),
                retry_number,
                retry_after,
                &mut *rng,
            )
        } else {
            Duration::ZERO
        };
        let next_run_at = inner.clock.now_ms() + wait.as_millis() as Millis;
        let scheduled = JobTransition::Backoff {
            next_run_at,
            lease_until: next_run_at + inner.lease_ms(&route),
            reason,
        };
        if !transition(job.id.clone(), scheduled).await {
            return;
        }
        tokio::time::sleep(wait).await;
        let reloaded = retrying(inner, &job.id, Fence::Store, "reloading a job", |_| {
            inner.store.get_job(&job.id)
        })
        .await;
        job = match reloaded {
            Ok(Some(j))
                if j.state.takes_attempts()
                    && j.lease_owner.as_deref() == Some(&inner.instance) =>
            {
                j
            }
            Ok(_) => return,
            Err(e) => {
                tracing::error!(error = %e, "cannot reload job after backoff; its lease will expire");
                return;
            }
        };
        steer = next;
    }
}

/// `complete_after_stream_error = false`: the client was told `code`:
/// `told`, so no other attempt is made. Without an unknown attempt the job
/// fails with that error. An unknown one may have executed (invariant 3):
/// the job waits in review, where reconciliation may still find its answer
/// and complete the job, and nothing runs it again.
async fn stop_after_stream_error<F, Fut>(
    inner: &Inner,
    unknown: Option<&str>,
    code: &str,
    told: &str,
    transition: F,
) where
    F: Fn(JobTransition) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let reason = format!(
        "{code}: {told} (the client's stream ended with this error; complete_after_stream_error is off, so the job is not run again)"
    );
    match unknown {
        Some(provider) => {
            tracing::info!(%provider, %code, "the client was told of an error; the job waits for its unknown attempt in review, not run again");
            if transition(JobTransition::Review { reason }).await {
                Metrics::inc(&inner.metrics.jobs_to_review);
            }
        }
        None => {
            tracing::info!(%code, "the client was told of an error; the job fails with it, not run again");
            if transition(JobTransition::Fail { reason }).await {
                Metrics::inc(&inner.metrics.jobs_failed);
            }
        }
    }
}

/// A job taken over from a process that stopped: its `started` attempts may
/// have reached the provider, so they become `unknown` (never failed). The
/// job's attempts as they now stand, or `None` when they cannot be read.
async fn recover_orphans(inner: &Arc<Inner>, job: &Job) -> Option<Vec<Attempt>> {
    let listed = retrying(inner, &job.id, Fence::Store, "listing attempts", |_| {
        inner.store.list_attempts(&job.id)
    })
    .await;
    let mut attempts = match listed {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot list attempts of a recovered job");
            return None;
        }
    };
    for attempt in attempts
        .iter_mut()
        .filter(|a| a.state == AttemptState::Started)
    {
        let finish = FinishAttempt {
            attempt_id: attempt.id.clone(),
            outcome: AttemptOutcome::unknown(
                "driver_lost",
                "the process driving this attempt stopped; it may have reached the provider",
            ),
            at: inner.clock.now_ms(),
            actor: format!("engine:{}", inner.instance),
        };
        if let Err(e) = durable::finish_attempt(inner, &job.id, finish).await {
            tracing::warn!(error = %e, attempt_id = %attempt.id, "cannot mark an orphaned attempt unknown");
            return None;
        }
        attempt.state = AttemptState::Unknown;
    }
    Some(attempts)
}
