//! Driving one job: rounds of attempts (a primary or retry, plus hedges after
//! the silence threshold) until one wins, the job must wait on an unknown
//! outcome, fails for good, or goes to review.

use super::plan::JobPlan;
use super::routing::{choose_hedge, choose_provider, Choice};
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::attempt::NewAttempt;
use crate::domain::retry::backoff;
use crate::domain::{new_id, Attempt, AttemptKind, AttemptState, GuardRefusal, Job, Millis};
use crate::metrics::Metrics;
use crate::providers::catalog::ProviderEntry;
use crate::providers::{CallOutcome, Provider};
use crate::store::{AttemptEnd, FinishAttempt, FinishOutcome, JobTransition};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn spawn(inner: Arc<Inner>, job: Job) {
    if !inner.begin_driving(&job.id) {
        return;
    }
    tokio::spawn(async move {
        let _driving = Driving {
            inner: inner.clone(),
            job_id: job.id.clone(),
        };
        if let Ok(_permit) = inner.slots.acquire().await {
            if still_ours(&inner, &job).await {
                drive(&inner, job).await;
            }
        }
    });
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
    match inner
        .store
        .renew_lease(&job.id, &inner.instance, now + lease)
        .await
    {
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

/// How a round of attempts ended.
enum RoundEnd {
    /// An attempt won, or the job was finished or cancelled by someone else.
    Done,
    /// An attempt's outcome is unknown and nothing won: the reconciler decides.
    Unknown,
    Failed {
        retryable: bool,
        retry_after: Option<Duration>,
        reason: String,
        provider: String,
    },
}

#[tracing::instrument(skip_all, fields(job_id = %job.id))]
async fn drive(inner: &Arc<Inner>, mut job: Job) {
    let owner = inner.instance.clone();
    let transition = |job_id: String, t: JobTransition| {
        let inner = inner.clone();
        let owner = owner.clone();
        async move {
            let now = inner.clock.now_ms();
            match inner
                .store
                .transition_job(&job_id, Some(&owner), t, now)
                .await
            {
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
    let plan = match JobPlan::new(&job.id, &job.request, &inner.contracts) {
        Ok(plan) => plan,
        Err(e) => {
            transition(job.id.clone(), JobTransition::Fail { reason: e.0 }).await;
            Metrics::inc(&inner.metrics.jobs_failed);
            return;
        }
    };
    let mut last_failed: Option<String> = None;
    if job.attempt_count > 0 {
        match recover_orphans(inner, &job).await {
            // A retry continues along the route after the provider tried last.
            Some(last) => last_failed = last,
            None => {
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
        }
    }
    let mut idle_rounds = 0u32;
    loop {
        if job.attempts_in_budget() >= i64::from(route.max_attempts) {
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
        let kind = if job.attempt_count == 0 {
            AttemptKind::Primary
        } else {
            AttemptKind::Retry
        };
        let end = match choose_provider(inner, &route, &plan, kind, last_failed.as_deref()) {
            Choice::Provider(entry) => run_round(inner, &job, &route, &plan, entry, kind).await,
            Choice::NoneFits(reason) => {
                transition(job.id.clone(), JobTransition::Fail { reason }).await;
                Metrics::inc(&inner.metrics.jobs_failed);
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
                RoundEnd::Failed {
                    retryable: true,
                    retry_after: None,
                    reason,
                    provider: String::new(),
                }
            }
        };
        match end {
            RoundEnd::Done => return,
            RoundEnd::Unknown => {
                transition(job.id.clone(), JobTransition::BlockOnUnknown).await;
                return;
            }
            RoundEnd::Failed {
                retryable: false,
                reason,
                ..
            } => {
                if transition(job.id.clone(), JobTransition::Fail { reason }).await {
                    Metrics::inc(&inner.metrics.jobs_failed);
                }
                return;
            }
            RoundEnd::Failed {
                retryable: true,
                retry_after,
                reason,
                provider,
            } => {
                let retry_number = (job.attempts_in_budget().max(1)) as u32;
                let wait = {
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
                job = match inner.store.get_job(&job.id).await {
                    Ok(Some(j))
                        if !j.state.is_final()
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
                if !provider.is_empty() {
                    last_failed = Some(provider);
                }
            }
        }
    }
}

/// A job taken over from a process that stopped: its `started` attempts may
/// have reached the provider, so they become `unknown` (never failed).
/// `Some(provider of the last attempt)` when no attempt is live and the job
/// may go on; `None` when it must wait for reconciliation.
async fn recover_orphans(inner: &Arc<Inner>, job: &Job) -> Option<Option<String>> {
    let attempts = match inner.store.list_attempts(&job.id).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot list attempts of a recovered job");
            return None;
        }
    };
    let mut live = false;
    for attempt in attempts.iter().filter(|a| a.state.is_live()) {
        live = true;
        if attempt.state == AttemptState::Started {
            let finish = FinishAttempt {
                attempt_id: attempt.id.clone(),
                end: AttemptEnd::Unknown {
                    error_kind: "driver_lost".to_string(),
                    message:
                        "the process driving this attempt stopped; it may have reached the provider"
                            .to_string(),
                },
                at: inner.clock.now_ms(),
                actor: format!("engine:{}", inner.instance),
            };
            if let Err(e) = inner.store.finish_attempt(finish).await {
                tracing::warn!(error = %e, attempt_id = %attempt.id, "cannot mark an orphaned attempt unknown");
            }
        }
    }
    (!live).then(|| attempts.last().map(|a| a.provider.clone()))
}

type Flight = futures::future::BoxFuture<'static, (Attempt, CallOutcome)>;

fn launch(
    entry: &ProviderEntry,
    attempt: Attempt,
    request: crate::providers::ChatRequest,
    timeout: Duration,
) -> Flight {
    let client: Arc<dyn Provider> = entry.client.clone();
    Box::pin(async move {
        let outcome = match tokio::time::timeout(timeout, client.call(&request)).await {
            Ok(outcome) => outcome,
            Err(_) => CallOutcome::Unknown(crate::providers::Ambiguous {
                kind: "attempt_timeout".to_string(),
                message: format!(
                    "no answer within attempt_timeout_ms ({} ms)",
                    timeout.as_millis()
                ),
            }),
        };
        (attempt, outcome)
    })
}

async fn start(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    entry: &ProviderEntry,
    kind: AttemptKind,
) -> Result<Attempt, GuardRefusal> {
    let new = NewAttempt {
        id: new_id(),
        job_id: job.id.clone(),
        provider: entry.name.clone(),
        kind,
        max_hedges: i64::from(route.max_hedges),
        started_at: inner.clock.now_ms(),
    };
    match inner.store.start_attempt(new).await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!(error = %e, "cannot start an attempt");
            Err(GuardRefusal::NoSuchJob)
        }
    }
}

/// What finishing one attempt meant for the round.
enum Settled {
    Won,
    /// Someone else won, or the job was cancelled.
    Lost,
    Failed {
        retryable: bool,
        retry_after: Option<Duration>,
        reason: String,
    },
    Unknown,
}

async fn settle(inner: &Inner, plan: &JobPlan, attempt: &Attempt, outcome: CallOutcome) -> Settled {
    let provider = attempt.provider.as_str();
    let mut tokens = 0u64;
    let elapsed_ms = inner.clock.now_ms() - attempt.started_at;
    inner.metrics.observe_provider_latency(provider, elapsed_ms);
    let (end, settled) = match outcome {
        CallOutcome::Succeeded(success) => {
            // Not streamed: the whole answer is the first token.
            inner
                .metrics
                .observe_time_to_first_token(provider, elapsed_ms);
            if let Some(u) = success.usage {
                tokens = u64::from(u.prompt_tokens) + u64::from(u.completion_tokens);
            }
            match plan.result_from(&success.output) {
                Ok(result) => {
                    let usage = success.usage.and_then(|u| serde_json::to_string(&u).ok());
                    let provider_request_id = success.provider_request_id;
                    (
                        AttemptEnd::Succeeded {
                            output: result,
                            usage,
                            provider_request_id,
                        },
                        Settled::Won,
                    )
                }
                // Output that breaks the contract is never a result; another
                // provider may keep it, so the job may fail over.
                Err((kind, message)) => {
                    let reason = format!("{provider}: {kind}: {message}");
                    (
                        AttemptEnd::Failed {
                            error_kind: kind,
                            message,
                        },
                        Settled::Failed {
                            retryable: true,
                            retry_after: None,
                            reason,
                        },
                    )
                }
            }
        }
        CallOutcome::Failed(f) => {
            if f.retryable {
                let now = inner.clock.now_ms();
                inner.with_breaker(provider, |b| b.on_retryable_failure(now));
            }
            let reason = format!("{provider}: {}: {}", f.kind, f.message);
            let settled = Settled::Failed {
                retryable: f.retryable,
                retry_after: f.retry_after,
                reason,
            };
            (
                AttemptEnd::Failed {
                    error_kind: f.kind,
                    message: f.message,
                },
                settled,
            )
        }
        CallOutcome::Unknown(a) => (
            AttemptEnd::Unknown {
                error_kind: a.kind,
                message: a.message,
            },
            Settled::Unknown,
        ),
    };
    let actor = format!("engine:{}", inner.instance);
    let finish = FinishAttempt {
        attempt_id: attempt.id.clone(),
        end,
        at: inner.clock.now_ms(),
        actor,
    };
    match inner.store.finish_attempt(finish).await {
        Ok(FinishOutcome::Won { .. }) => {
            inner.with_breaker(provider, |b| b.on_success());
            inner.metrics.attempt_finished(provider, "succeeded");
            Metrics::inc(&inner.metrics.jobs_succeeded);
            if attempt.kind == AttemptKind::Hedge {
                Metrics::inc(&inner.metrics.hedges_won);
            }
            Settled::Won
        }
        Ok(FinishOutcome::Lost) => {
            inner.metrics.attempt_finished(provider, "discarded");
            Metrics::inc(&inner.metrics.cas_lost);
            inner.metrics.discarded(provider, tokens);
            tracing::info!(attempt_id = %attempt.id, "late result lost the compare-and-swap; discarded");
            Settled::Lost
        }
        Ok(FinishOutcome::Recorded) => {
            let outcome = if matches!(settled, Settled::Unknown) {
                "unknown"
            } else {
                "failed"
            };
            inner.metrics.attempt_finished(provider, outcome);
            settled
        }
        Err(e) => {
            // The attempt's row did not move as asked (e.g. settled meanwhile
            // by an admin): do not guess; nothing may retry on this basis.
            tracing::error!(error = %e, attempt_id = %attempt.id, "cannot record an attempt's end");
            Settled::Unknown
        }
    }
}

async fn run_round(
    inner: &Arc<Inner>,
    job: &Job,
    route: &RouteConfig,
    plan: &JobPlan,
    first: &ProviderEntry,
    kind: AttemptKind,
) -> RoundEnd {
    let timeout = Duration::from_millis(route.attempt_timeout_ms);
    let mut flights: FuturesUnordered<Flight> = FuturesUnordered::new();
    let mut busy: Vec<String> = Vec::new();
    let request = match plan.request_for(first) {
        Ok(r) => r,
        Err(e) => {
            return RoundEnd::Failed {
                retryable: false,
                retry_after: None,
                reason: e.0,
                provider: first.name.clone(),
            }
        }
    };
    match start(inner, job, route, first, kind).await {
        Ok(attempt) => {
            busy.push(first.name.clone());
            flights.push(launch(first, attempt, request, timeout));
        }
        Err(GuardRefusal::OutcomeUnknown) => return RoundEnd::Unknown,
        Err(_) => return RoundEnd::Done,
    }
    let mut hedges_left = route.max_hedges;
    let silence = tokio::time::sleep(Duration::from_millis(route.silence_ms));
    tokio::pin!(silence);
    let mut silence_armed = hedges_left > 0;
    let (mut unknown, mut failure) = (false, None::<(bool, Option<Duration>, String, String)>);
    while !flights.is_empty() {
        tokio::select! {
            Some((attempt, outcome)) = flights.next() => {
                busy.retain(|p| *p != attempt.provider);
                let settled = settle(inner, plan, &attempt, outcome).await;
                if matches!(settled, Settled::Won) {
                    inner.metrics.observe_job_latency(inner.clock.now_ms() - job.created_at);
                }
                match settled {
                    Settled::Won | Settled::Lost => {
                        let losers = std::mem::take(&mut flights);
                        if !losers.is_empty() {
                            let plan = Arc::new(plan.clone());
                            tokio::spawn(finish_losers(inner.clone(), losers, plan, job.id.clone()));
                        }
                        return RoundEnd::Done;
                    }
                    Settled::Unknown => unknown = true,
                    Settled::Failed { retryable, retry_after, reason } => {
                        // A non-retryable failure dominates a retryable one.
                        let keep = failure.as_ref().is_none_or(|(r, ..)| *r);
                        if keep {
                            failure = Some((retryable, retry_after, reason, attempt.provider.clone()));
                        }
                    }
                }
            }
            _ = &mut silence, if silence_armed && flights.len() == 1 => {
                silence_armed = false;
                if let Some(entry) = choose_hedge(inner, route, plan, &busy) {
                    if let Ok(request) = plan.request_for(entry) {
                        if let Ok(attempt) = start(inner, job, route, entry, AttemptKind::Hedge).await {
                            Metrics::inc(&inner.metrics.hedges_started);
                            tracing::info!(provider = %entry.name, "primary silent; hedging");
                            busy.push(entry.name.clone());
                            flights.push(launch(entry, attempt, request, timeout));
                            hedges_left -= 1;
                            if hedges_left > 0 {
                                silence.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(route.silence_ms));
                                silence_armed = true;
                            }
                        }
                    }
                }
            }
        }
    }
    if unknown {
        return RoundEnd::Unknown;
    }
    match failure {
        Some((retryable, retry_after, reason, provider)) => RoundEnd::Failed {
            retryable,
            retry_after,
            reason,
            provider,
        },
        None => RoundEnd::Unknown,
    }
}

/// After a winner committed: attempts still in flight get `loser_grace_ms`
/// to answer (their result then loses the CAS and their usage is counted);
/// after that their requests are dropped and they are recorded as abandoned.
async fn finish_losers(
    inner: Arc<Inner>,
    mut losers: FuturesUnordered<Flight>,
    plan: Arc<JobPlan>,
    job_id: String,
) {
    let grace = tokio::time::sleep(Duration::from_millis(inner.config.engine.loser_grace_ms));
    tokio::pin!(grace);
    loop {
        tokio::select! {
            next = losers.next() => match next {
                Some((attempt, outcome)) => { settle(&inner, &plan, &attempt, outcome).await; }
                None => return,
            },
            _ = &mut grace => break,
        }
    }
    // Dropping the futures drops their HTTP requests. Which attempts they were
    // is only known inside them, so ask the store for the job's live ones.
    drop(losers);
    let Ok(attempts) = inner.store.list_attempts(&job_id).await else {
        return;
    };
    for attempt in attempts
        .into_iter()
        .filter(|a| a.state == AttemptState::Started)
    {
        let finish = FinishAttempt {
            attempt_id: attempt.id.clone(),
            end: AttemptEnd::Abandoned {
                reason: "another attempt won; request dropped".to_string(),
            },
            at: inner.clock.now_ms(),
            actor: format!("engine:{}", inner.instance),
        };
        if inner.store.finish_attempt(finish).await.is_ok() {
            Metrics::inc(&inner.metrics.attempts_abandoned);
            inner
                .metrics
                .attempt_finished(&attempt.provider, "abandoned");
        }
    }
}
