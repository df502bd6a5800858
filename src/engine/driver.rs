//! Driving one job, in named steps: [`Driver::plan`] (its route and request;
//! the attempts of a job taken over become unknown), [`Driver::round`] (one
//! round of attempts, `round.rs`), [`Driver::settle`] (what the round's end
//! means: done, blocked, failed, or the next round and how it is steered)
//! and [`Driver::back_off`] before the next round, until one attempt wins,
//! the job must wait on an unknown outcome, fails for good, or goes to
//! review (invariant 7).

use super::attempt::{RoundEnd, RoundFailure};
use super::durable::{self, retrying, Fence};
use super::plan::JobPlan;
use super::round;
use super::routing::{choose_hedge, choose_provider, Choice, Steer};
use super::stream::StreamHub;
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::attempt::NewAttempt;
use crate::domain::retry::backoff;
use crate::domain::ErrorKind;
use crate::domain::{Attempt, AttemptKind, AttemptState, Job, JobId, Millis};
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
    job_id: JobId,
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

/// Drive a job to its end: plan it, then rounds of attempts, each settled
/// into the job's next step, with backoff between them.
async fn drive(
    inner: &Arc<Inner>,
    job: Job,
    hub: Option<Arc<StreamHub>>,
    prestart: Option<super::Prestart>,
) {
    let Some(mut driver) = Driver::plan(inner, job, hub, prestart).await else {
        return;
    };
    loop {
        if driver.out_of_attempts().await {
            return;
        }
        let Some(end) = driver.round().await else {
            return;
        };
        let Some(next) = driver.settle(end).await else {
            return;
        };
        if !driver.back_off(next).await {
            return;
        }
    }
}

/// One job as its driver holds it between rounds.
struct Driver<'a> {
    inner: &'a Arc<Inner>,
    job: Job,
    route: RouteConfig,
    plan: JobPlan,
    /// The client's stream, when one waits for the job.
    hub: Option<Arc<StreamHub>>,
    /// The primary attempt the job's create started: the first round sends
    /// it as chosen, without starting another.
    prestarted: Option<NewAttempt>,
    /// The job's attempts so far: who was tried, who is unknown. Read again
    /// after every round that did not finish the job (retries are rare).
    history: Vec<Attempt>,
    /// How the next round is steered.
    steer: Steer,
    /// Retries of the same provider in a row (`same_provider_retries`).
    same_provider_streak: u32,
    /// Rounds in a row that no provider could take.
    idle_rounds: u32,
}

/// The round after one that did not finish the job: how it is steered,
/// how long it waits first, and why.
struct NextRound {
    steer: Steer,
    retry_after: Option<Duration>,
    /// False: the next round goes at once (a move to a larger window).
    wait: bool,
    reason: String,
}

impl<'a> Driver<'a> {
    /// The job's route and plan, and its attempts so far when it was taken
    /// over; `None` when the job ended here (no route, no plan, or its
    /// attempts cannot be read).
    async fn plan(
        inner: &'a Arc<Inner>,
        job: Job,
        hub: Option<Arc<StreamHub>>,
        prestart: Option<super::Prestart>,
    ) -> Option<Driver<'a>> {
        let Some(route) = inner.config.routes.get(&job.route).cloned() else {
            let reason = format!("route {:?} is not configured on this server", job.route);
            to_review(inner, &job.id, reason).await;
            return None;
        };
        let (plan, prestarted) = match prestart {
            Some(p) => (p.plan, Some(p.attempt)),
            None => match JobPlan::new(&job.id, &job.request, &inner.contracts) {
                Ok(plan) => (plan, None),
                Err(e) => {
                    to_failed(inner, &job.id, e.message).await;
                    return None;
                }
            },
        };
        let mut history = Vec::new();
        if job.attempt_count > 0 && prestarted.is_none() {
            history = match recover_orphans(inner, &job).await {
                Some(attempts) => attempts,
                None => {
                    transition(inner, &job.id, JobTransition::BlockOnUnknown).await;
                    return None;
                }
            };
        }
        // A retry continues along the route after the provider tried last.
        let steer = Steer {
            after: history.last().map(|a| a.provider.clone()),
            blocked: Steer::blocked_by(inner, &history),
            ..Steer::default()
        };
        // A job's first round (not a job taken over) counts once in its
        // route's hedge window: the budget is a share of these.
        if prestarted.is_some() || job.attempt_count == 0 {
            inner.hedging.job_started(&job.route, inner.clock.now_ms());
        }
        Some(Driver {
            inner,
            job,
            route,
            plan,
            hub,
            prestarted,
            history,
            steer,
            same_provider_streak: 0,
            idle_rounds: 0,
        })
    }

    async fn transition(&self, t: JobTransition) -> bool {
        transition(self.inner, &self.job.id, t).await
    }

    /// The route's `max_attempts` are spent: the job goes to review.
    async fn out_of_attempts(&self) -> bool {
        let made = self.job.attempts_in_budget();
        if self.prestarted.is_some() || made < i64::from(self.route.max_attempts) {
            return false;
        }
        let reason = format!(
            "retries exhausted after {made} attempts; last error: {}",
            self.job.last_error.as_deref().unwrap_or("none")
        );
        to_review(self.inner, &self.job.id, reason).await;
        true
    }

    /// Where the round's first attempt goes, and its kind: the attempt the
    /// create started; the rescue of an unknown attempt (e.g. an orphan of
    /// a process that stopped: the fan-out to a provider the job has not
    /// tried is a hedge, within max_hedges, and may start now, invariant
    /// 4); else the route's next provider.
    fn first_attempt(&self) -> (Choice<'a>, AttemptKind) {
        let (inner, route) = (self.inner, &self.route);
        let kind = if self.job.attempt_count == 0 || self.prestarted.is_some() {
            AttemptKind::Primary
        } else {
            AttemptKind::Retry
        };
        if let Some(started) = &self.prestarted {
            // The catalog is the engine's for its life: the provider the
            // attempt was started for is in it.
            let choice = inner.catalog.get(&started.provider).map_or_else(
                || Choice::NoneAdmitted(format!("{}: not configured", started.provider)),
                Choice::Provider,
            );
            return (choice, kind);
        }
        let history = &self.history;
        let unknown_left = history.iter().any(|a| a.state == AttemptState::Unknown);
        let hedges_made = history
            .iter()
            .filter(|a| a.kind == AttemptKind::Hedge)
            .count();
        if unknown_left && hedges_made < route.max_hedges as usize {
            if let Some(entry) = choose_hedge(inner, route, &self.plan, &self.tried()) {
                return (Choice::Provider(entry), AttemptKind::Hedge);
            }
        }
        (
            choose_provider(inner, route, &self.plan, kind, &self.steer),
            kind,
        )
    }

    fn tried(&self) -> Vec<String> {
        self.history.iter().map(|a| a.provider.clone()).collect()
    }

    /// One round of attempts (streamed when a client's stream is open);
    /// `None` when the job ended without one (no provider fits, every one
    /// is blocked, or none could take it for `max_attempts` rounds).
    async fn round(&mut self) -> Option<RoundEnd> {
        let (choice, kind) = self.first_attempt();
        let reason = match choice {
            Choice::Provider(entry) => {
                let scope = round::Scope {
                    inner: self.inner,
                    job: &self.job,
                    route: &self.route,
                    plan: &self.plan,
                };
                let first = round::First {
                    entry,
                    kind,
                    started: self.prestarted.take(),
                };
                let hub = self.hub.clone().filter(|hub| hub.is_open());
                return Some(round::run(scope, first, self.tried(), hub).await);
            }
            Choice::NoneFits(unfit, reason) => {
                // The job's last error leads with the kind, which a client
                // is told (`Unanswered::of`): its request, not a provider,
                // is at fault, so an SDK does not retry it.
                let reason = match (self.steer.window_above, unfit) {
                    (Some(_), _) => format!(
                        "{}: no provider on the route has a larger context window: {reason}",
                        ErrorKind::ContextLengthExceeded
                    ),
                    (None, Some(kind)) => {
                        format!("{kind}: no provider on the route can take the request: {reason}")
                    }
                    (None, None) => reason,
                };
                to_failed(self.inner, &self.job.id, reason).await;
                return None;
            }
            Choice::Blocked(why) => {
                tracing::info!(%why, "every provider left has an unknown attempt; waiting for reconciliation");
                self.transition(JobTransition::BlockOnUnknown).await;
                return None;
            }
            Choice::NoneAdmitted(reason) => reason,
        };
        self.idle_rounds += 1;
        if self.idle_rounds >= self.route.max_attempts {
            let reason = format!("no provider could take the job: {reason}");
            to_review(self.inner, &self.job.id, reason).await;
            return None;
        }
        let failure = RoundFailure::of_round(true, ErrorKind::NoProvider, reason, "");
        Some(RoundEnd::ended(None, Some(failure)))
    }

    /// What a round that did not finish the job means for it: it stops
    /// (blocked, failed, the client told of an error), or the next round is
    /// steered by how this one ended.
    async fn settle(&mut self, end: RoundEnd) -> Option<NextRound> {
        // The client's stream ended with an error: unless the route says
        // otherwise, the job is not run again behind its back.
        if let (Some(hub), RoundEnd::Ended { unknown, .. }) = (&self.hub, &end) {
            if let Some((code, told)) = hub
                .error()
                .filter(|_| !self.route.complete_after_stream_error)
            {
                self.stop_after_stream_error(unknown.as_deref(), &code, &told)
                    .await;
                return None;
            }
        }
        let (unknown, failure) = match end {
            RoundEnd::Done => return None,
            RoundEnd::Refused
            | RoundEnd::Ended {
                unknown: None,
                failure: None,
            } => {
                self.transition(JobTransition::BlockOnUnknown).await;
                return None;
            }
            RoundEnd::Ended { unknown, failure } => (unknown, failure),
        };
        let mut next = self.steer_next(unknown.as_deref(), failure).await?;
        let listed = retrying(
            self.inner,
            &self.job.id,
            Fence::Store,
            "listing attempts",
            |_| self.inner.store.list_attempts(&self.job.id),
        )
        .await;
        self.history = match listed {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "cannot list a job's attempts; its lease will expire");
                return None;
            }
        };
        next.steer.blocked = Steer::blocked_by(self.inner, &self.history);
        if unknown.is_some() {
            // Blocked only when no provider is left that the job may try.
            let choice = choose_provider(
                self.inner,
                &self.route,
                &self.plan,
                AttemptKind::Retry,
                &next.steer,
            );
            if let Choice::Blocked(why) = choice {
                tracing::info!(%why, "an attempt ended unknown and no provider is left; waiting for reconciliation");
                self.transition(JobTransition::BlockOnUnknown).await;
                return None;
            }
        }
        Some(next)
    }

    /// How the next round is steered by the failure that counts (or the
    /// unknown attempt): a larger window after `context_length_exceeded`,
    /// the same provider again after its retryable refusal (up to
    /// `same_provider_retries`), else along the route. `None` when the
    /// failure ends the job.
    async fn steer_next(
        &mut self,
        unknown: Option<&str>,
        failure: Option<RoundFailure>,
    ) -> Option<NextRound> {
        let mut next = NextRound {
            steer: Steer {
                after: self.steer.after.clone(),
                ..Steer::default()
            },
            retry_after: None,
            wait: true,
            reason: String::new(),
        };
        next.reason = match failure {
            // The provider said the prompt does not fit: only a larger window
            // may take it, never the one that refused.
            Some(f) if !f.retryable() && f.failure.kind == ErrorKind::ContextLengthExceeded => {
                next.steer.window_above = self
                    .inner
                    .catalog
                    .get(&f.provider)
                    .map(|e| e.config.context_window);
                next.steer.after = Some(f.provider);
                self.same_provider_streak = 0;
                next.wait = false;
                f.reason
            }
            Some(f) if !f.retryable() => {
                // Failing now would discard what the unknown attempt may yet
                // deliver: the reconciler decides first.
                if unknown.is_some() {
                    self.transition(JobTransition::BlockOnUnknown).await;
                } else {
                    to_failed(self.inner, &self.job.id, f.reason).await;
                }
                return None;
            }
            Some(f) => {
                if f.refusal
                    && !f.provider.is_empty()
                    && self.same_provider_streak < self.route.same_provider_retries
                {
                    // Ask the same provider again first, never sooner than
                    // it asked (Retry-After).
                    self.same_provider_streak += 1;
                    next.steer.prefer = Some(f.provider.clone());
                    next.retry_after = f.failure.retry_after;
                } else {
                    self.same_provider_streak = 0;
                }
                if !f.provider.is_empty() {
                    next.steer.after = Some(f.provider);
                }
                f.reason
            }
            None => {
                self.same_provider_streak = 0;
                next.steer.after = unknown.map(str::to_string);
                format!("an attempt on {} ended unknown", unknown.unwrap_or("?"))
            }
        };
        Some(next)
    }

    /// Schedule the next round (backoff with full jitter, never sooner than
    /// a `Retry-After`), wait for it, and read the job back; false when the
    /// job is no longer this driver's to run.
    async fn back_off(&mut self, next: NextRound) -> bool {
        let (inner, route) = (self.inner, &self.route);
        let wait = if next.wait {
            let retry_number = (self.job.attempts_in_budget().max(1)) as u32;
            let mut rng = match inner.rng.lock() {
                Ok(r) => r,
                Err(p) => p.into_inner(),
            };
            backoff(
                Duration::from_millis(route.backoff_base_ms),
                Duration::from_millis(route.backoff_cap_ms),
                retry_number,
                next.retry_after,
                &mut *rng,
            )
        } else {
            Duration::ZERO
        };
        let next_run_at = inner.clock.now_ms() + wait.as_millis() as Millis;
        let scheduled = JobTransition::Backoff {
            next_run_at,
            lease_until: next_run_at + inner.lease_ms(route),
            reason: next.reason,
        };
        if !self.transition(scheduled).await {
            return false;
        }
        tokio::time::sleep(wait).await;
        let job_id = &self.job.id;
        let reloaded = retrying(inner, job_id, Fence::Store, "reloading a job", |_| {
            inner.store.get_job(job_id)
        })
        .await;
        self.job = match reloaded {
            Ok(Some(j))
                if j.state.takes_attempts()
                    && j.lease_owner.as_deref() == Some(&inner.instance) =>
            {
                j
            }
            Ok(_) => return false,
            Err(e) => {
                tracing::error!(error = %e, "cannot reload job after backoff; its lease will expire");
                return false;
            }
        };
        self.steer = next.steer;
        true
    }

    /// `complete_after_stream_error = false`: the client was told `code`:
    /// `told`, so no other attempt is made. Without an unknown attempt the
    /// job fails with that error. An unknown one may have executed
    /// (invariant 3): the job waits in review, where reconciliation may
    /// still find its answer and complete the job, and nothing runs it
    /// again.
    async fn stop_after_stream_error(&self, unknown: Option<&str>, code: &str, told: &str) {
        let reason = format!(
            "{code}: {told} (the client's stream ended with this error; complete_after_stream_error is off, so the job is not run again)"
        );
        match unknown {
            Some(provider) => {
                tracing::info!(%provider, %code, "the client was told of an error; the job waits for its unknown attempt in review, not run again");
                to_review(self.inner, &self.job.id, reason).await;
            }
            None => {
                tracing::info!(%code, "the client was told of an error; the job fails with it, not run again");
                to_failed(self.inner, &self.job.id, reason).await;
            }
        }
    }
}

/// Apply a job transition as this process's lease holder. Applied twice
/// (its first commit's answer lost) is harmless: the second finds the lease
/// released or the same step taken.
async fn transition(inner: &Inner, job_id: &JobId, t: JobTransition) -> bool {
    let now = inner.clock.now_ms();
    let applied = retrying(inner, job_id, Fence::Store, "a job transition", |_| {
        inner
            .store
            .transition_job(job_id, Some(&inner.instance), t.clone(), now)
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

/// The job goes to the review queue (invariant 7).
async fn to_review(inner: &Inner, job_id: &JobId, reason: String) {
    if transition(inner, job_id, JobTransition::Review { reason }).await {
        Metrics::inc(&inner.metrics.jobs_to_review);
    }
}

/// The job fails for good.
async fn to_failed(inner: &Inner, job_id: &JobId, reason: String) {
    if transition(inner, job_id, JobTransition::Fail { reason }).await {
        Metrics::inc(&inner.metrics.jobs_failed);
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
                ErrorKind::DriverLost,
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
