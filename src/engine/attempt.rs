//! One attempt, from its guarded start to its recorded end: the steps every
//! round (streamed or not) and the reconciler share. An attempt starts
//! through the store's guard (invariant 4): a round's first by [`open`], a
//! hedge by [`start_hedge`]; it runs in a task of its own ([`launch`]) that
//! tells its round what it hears ([`Event`]: the pieces of a streamed
//! answer, then its end, within its [`Limits`]); it ends through
//! [`settle`]: the contract check, then the CAS for an answer (invariant 5)
//! or the attempt's recorded state.

use super::durable;
use super::hedging::Measure;
use super::plan::JobPlan;
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::attempt::NewAttempt;
use crate::domain::ErrorKind;
use crate::domain::{Attempt, AttemptId, AttemptKind, GuardRefusal, Job};
use crate::metrics::Metrics;
use crate::providers::catalog::ProviderEntry;
use crate::providers::stream::{Chunk, Delta};
use crate::providers::{AttemptOutcome, ChatRequest, Failure, Provider, Streamed, Success};
use crate::store::{FinishAttempt, FinishOutcome};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A failure that ended a round, as the retry policy needs it.
pub(super) struct RoundFailure {
    /// Kind, retryable and retry-after, as classified where the failure
    /// arose: the adapter, the contract check, or the round itself.
    pub failure: Failure,
    /// The job's `last_error` should the failure end it.
    pub reason: String,
    /// Empty when no provider was tried (none admitted).
    pub provider: String,
    /// The provider itself refused retryably (429, 5xx, …): worth asking it
    /// again before moving along the route.
    pub refusal: bool,
}

impl RoundFailure {
    /// A round that ended without a provider's answer: none admitted, the
    /// request could not be rendered, the attempt to back up was settled.
    pub(super) fn of_round(
        retryable: bool,
        kind: ErrorKind,
        reason: String,
        provider: &str,
    ) -> Self {
        let failure = Failure {
            retryable,
            retry_after: None,
            kind,
            message: reason.clone(),
            status: None,
        };
        RoundFailure {
            failure,
            reason,
            provider: provider.to_string(),
            refusal: false,
        }
    }

    /// An attempt's recorded failure on `provider`.
    fn of_attempt(provider: &str, failure: Failure, refusal: bool) -> Self {
        RoundFailure {
            reason: format!("{provider}: {}: {}", failure.kind, failure.message),
            failure,
            provider: provider.to_string(),
            refusal,
        }
    }

    pub(super) fn retryable(&self) -> bool {
        self.failure.retryable
    }
}

/// How a round of attempts ended.
pub(super) enum RoundEnd {
    /// An attempt won, or the job was finished or cancelled by someone else.
    Done,
    /// The guard refused the round's first attempt: an attempt is live.
    Refused,
    /// Nothing won. `unknown`: the provider of an attempt that ended unknown;
    /// `failure`: the failure that counts (a non-retryable one dominates).
    Ended {
        unknown: Option<String>,
        failure: Option<RoundFailure>,
    },
}

impl RoundEnd {
    pub(super) fn ended(unknown: Option<String>, failure: Option<RoundFailure>) -> Self {
        RoundEnd::Ended { unknown, failure }
    }
}

/// The guarded insert of an attempt of `kind` on `entry` (invariant 4).
pub(super) async fn start(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    entry: &ProviderEntry,
    kind: AttemptKind,
) -> Result<Attempt, GuardRefusal> {
    let new = NewAttempt {
        id: AttemptId::new(),
        job_id: job.id.clone(),
        provider: entry.name.clone(),
        kind,
        max_hedges: i64::from(route.max_hedges),
        reuses_key: entry.config.honours_idempotency_key,
        started_at: inner.clock.now_ms(),
    };
    match durable::start_attempt(inner, new).await {
        Ok(result) => result,
        // Not transient, the lease lost meanwhile, or the store down for a
        // whole lease: this process lets go of the job; the lease's next
        // holder drives it.
        Err(e) => {
            tracing::error!(error = %e, "cannot start an attempt");
            Err(GuardRefusal::NoSuchJob)
        }
    }
}

/// A round's first attempt, started (or, `started`, already started by the
/// job's create) with the request it sends; else how the round ends.
pub(super) async fn open(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    plan: &JobPlan,
    first: &ProviderEntry,
    kind: AttemptKind,
    started: Option<NewAttempt>,
) -> Result<(Attempt, Arc<ChatRequest>), RoundEnd> {
    let request = plan.request_for(first).map_err(|e| {
        RoundEnd::ended(
            None,
            Some(RoundFailure::of_round(
                false,
                e.kind,
                e.message,
                &first.name,
            )),
        )
    })?;
    let attempt = match started {
        // Committed with the job: the first attempt of a job, seq 1, read
        // at version 0.
        Some(new) => Ok(new.started(1, 0)),
        None => start(inner, job, route, first, kind).await,
    };
    match attempt {
        Ok(attempt) => Ok((attempt, request)),
        Err(GuardRefusal::OutcomeUnknown) => Err(RoundEnd::Refused),
        // The unknown attempt a rescue was to back up was settled meanwhile:
        // go on as a retry.
        Err(GuardRefusal::HedgeNotAllowed) => Err(RoundEnd::ended(
            None,
            Some(RoundFailure::of_round(
                true,
                ErrorKind::HedgeNotNeeded,
                "the attempt to back up was settled meanwhile".to_string(),
                "",
            )),
        )),
        Err(_) => Err(RoundEnd::Done),
    }
}

/// Start a hedge on `entry`, if the route's hedging admits one now and the
/// guard lets it start. `budgeted`: a hedge after a silence, which the
/// route's hedge budget may refuse (the rescue of an attempt that ended
/// unknown, and the continuation of a broken stream, are not refused).
/// `why` is logged.
pub(super) async fn start_hedge(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    entry: &ProviderEntry,
    budgeted: bool,
    why: &str,
) -> Option<Attempt> {
    let admitted = if budgeted {
        super::hedging::admit(inner, job)
    } else {
        inner.hedging.admit(&job.route, inner.clock.now_ms(), false)
    };
    if !admitted {
        return None;
    }
    let Ok(attempt) = start(inner, job, route, entry, AttemptKind::Hedge).await else {
        inner.hedging.not_started(&job.route, inner.clock.now_ms());
        return None;
    };
    Metrics::inc(&inner.metrics.hedges_started);
    tracing::info!(provider = %entry.name, "{why}; hedging");
    Some(attempt)
}

/// What finishing one attempt meant for the round.
pub(super) enum Settled {
    Won,
    /// Someone else won, or the job was cancelled.
    Lost,
    Failed(RoundFailure),
    Unknown,
}

/// The attempt's first sign of an answer (a streamed attempt's first
/// piece, or a whole answer: its first token is its end) arrived now: the
/// time to it is a sample of the route's learned silence.
pub(super) fn observe_answer(inner: &Inner, route: &str, attempt: &Attempt, measure: Measure) {
    let now = inner.clock.now_ms();
    let elapsed = now - attempt.started_at;
    inner
        .metrics
        .observe_time_to_first_token(&attempt.provider, elapsed);
    inner
        .hedging
        .observe(route, &attempt.provider, measure, elapsed, now);
}

/// Who reports an attempt's end to [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The driver, with the provider's own answer.
    Live,
    /// The reconciler, with what the provider recorded under the job's key:
    /// it says nothing about the provider's latency or health now.
    Reconciled,
}

/// `success` with onejob's own count of its tokens when its provider
/// reported none (a stream without a usage chunk, an OpenAI-compatible
/// server that sends no `usage`): the prompt as the plan renders it for
/// `entry` and the delivered text and tool calls, counted with the
/// provider's tokenizer and marked `estimated`. Never zeros, so a budget
/// counts the answer.
pub(super) fn counted(plan: &JobPlan, entry: &ProviderEntry, success: Success) -> Success {
    if success.usage.is_some() {
        return success;
    }
    let mut delivered = std::borrow::Cow::Borrowed(success.output.as_str());
    for call in &success.tool_calls {
        let function = &call["function"];
        for part in ["name", "arguments"] {
            delivered
                .to_mut()
                .push_str(function[part].as_str().unwrap_or_default());
        }
    }
    let usage = plan.estimated_usage(entry, &delivered);
    Success { usage, ..success }
}

/// An attempt's end, settled: an answer is checked against the job's
/// contract and then, like every other ending, [`record`]ed. Used by the
/// round (for answers and for the attempts it abandons) and the reconciler.
pub(super) async fn settle(
    inner: &Inner,
    plan: &JobPlan,
    attempt: &Attempt,
    outcome: AttemptOutcome,
    source: Source,
) -> Settled {
    // The provider itself refused, retryably, as its adapter classified it
    // (a contract violation, found below, is not the provider's refusal).
    let refusal = matches!(&outcome, AttemptOutcome::Failed(f) if f.retryable);
    // An answer is recorded as the job's result it makes. Output that
    // breaks the contract is never a result; another provider may keep
    // it, so the job may fail over.
    let outcome = match outcome {
        AttemptOutcome::Succeeded(success) => {
            let success = match inner.catalog.get(&attempt.provider) {
                Some(entry) => counted(plan, entry, success),
                None => success,
            };
            match plan.result_from(&success) {
                Ok(result) => AttemptOutcome::Succeeded(Success {
                    output: result,
                    tool_calls: Vec::new(),
                    ..success
                }),
                Err((kind, message)) => AttemptOutcome::Failed(Failure {
                    retryable: true,
                    retry_after: None,
                    kind,
                    message,
                    status: None,
                }),
            }
        }
        other => other,
    };
    record(inner, attempt, outcome, refusal, source).await
}

/// The one place where how an attempt ended becomes the attempt's state
/// (through the CAS for an answer), its metrics and the provider's
/// breaker. `refusal`: the provider refused retryably, so it may be asked
/// again first. Only an answer already checked against the job's contract
/// (by [`settle`]) comes here directly, or no answer at all.
pub(super) async fn record(
    inner: &Inner,
    attempt: &Attempt,
    outcome: AttemptOutcome,
    refusal: bool,
    source: Source,
) -> Settled {
    let outcome = outcome.storable();
    let provider = attempt.provider.as_str();
    let abandoned = matches!(outcome, AttemptOutcome::Abandoned { .. });
    // A dropped request said nothing about the provider.
    let live = source == Source::Live && !abandoned;
    if live {
        let elapsed_ms = inner.clock.now_ms() - attempt.started_at;
        inner.metrics.observe_provider_latency(provider, elapsed_ms);
    }
    if refusal && live {
        let now = inner.clock.now_ms();
        inner.with_breaker(provider, |b| b.on_retryable_failure(now));
    }
    let tokens = tokens_of(&outcome);
    let failure = match &outcome {
        AttemptOutcome::Failed(f) => Some(f.clone()),
        _ => None,
    };
    let actor = match source {
        Source::Live => format!("engine:{}", inner.instance),
        Source::Reconciled => "reconciler".to_string(),
    };
    let at = inner.clock.now_ms();
    let answer = match &outcome {
        AttemptOutcome::Succeeded(s) => {
            Some((s.usage, s.provider_request_id.clone(), s.finish.clone()))
        }
        _ => None,
    };
    let finish = FinishAttempt {
        attempt_id: attempt.id.clone(),
        outcome,
        at,
        actor,
    };
    match durable::finish_attempt(inner, &attempt.job_id, finish).await {
        Ok(FinishOutcome::Won { job, .. }) => {
            // Whoever waits for the job (`Prefer: wait`) gets it as the
            // commit left it, and the winner as its row now is, instead of
            // reading either back.
            if let Some(job) = job {
                inner.hand_over(*job, || {
                    answer.map(|(usage, request_id, finish)| {
                        attempt.won(usage, request_id, finish, at)
                    })
                });
            }
            if live {
                inner.with_breaker(provider, |b| b.on_success());
            }
            inner.metrics.attempt_finished(provider, "succeeded");
            Metrics::inc(&inner.metrics.jobs_succeeded);
            if attempt.kind == AttemptKind::Hedge {
                Metrics::inc(&inner.metrics.hedges_won);
            }
            Settled::Won
        }
        Ok(FinishOutcome::Lost) if abandoned => {
            Metrics::inc(&inner.metrics.attempts_abandoned);
            inner.metrics.attempt_finished(provider, "abandoned");
            Settled::Lost
        }
        Ok(FinishOutcome::Lost) => {
            inner.metrics.attempt_finished(provider, "discarded");
            Metrics::inc(&inner.metrics.cas_lost);
            inner.metrics.discarded(provider, tokens);
            tracing::info!(attempt_id = %attempt.id, "late result lost the compare-and-swap; discarded");
            Settled::Lost
        }
        Ok(FinishOutcome::Recorded) => match failure {
            Some(failure) => {
                inner.metrics.attempt_finished(provider, "failed");
                Settled::Failed(RoundFailure::of_attempt(provider, failure, refusal))
            }
            None => {
                inner.metrics.attempt_finished(provider, "unknown");
                Settled::Unknown
            }
        },
        // The attempt's row did not move as asked: settled meanwhile (by an
        // admin, another reconciler, or the new holder of a lost lease), or
        // the store stayed down: do not guess; nothing may retry on this basis.
        Err(e @ crate::store::StoreError::InvalidTransition { .. }) => {
            tracing::info!(error = %e, attempt_id = %attempt.id, "the attempt was settled meanwhile");
            Settled::Unknown
        }
        Err(e) => {
            tracing::error!(error = %e, attempt_id = %attempt.id, "cannot record an attempt's end");
            Settled::Unknown
        }
    }
}

/// The tokens an answer used (0 for no answer, or no usage reported).
pub(super) fn tokens_of(outcome: &AttemptOutcome) -> u64 {
    match outcome {
        AttemptOutcome::Succeeded(Success { usage: Some(u), .. }) => u.total(),
        _ => 0,
    }
}

/// How an attempt's answer arrives: whole (one call) or streamed (pieces to
/// the client as they come). The round is the same; these are its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    Whole,
    Streamed,
}

/// An attempt's time limits: its first sign of an answer within
/// `attempt_timeout_ms` (the hedge waits inside it) — the whole answer, or
/// a stream's first piece — and a stream as a whole within
/// `stream_timeout_ms`; between pieces the round's `stall_ms`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    arrival: Arrival,
    first_token: Duration,
    whole: Duration,
}

impl Limits {
    pub(super) fn of(route: &RouteConfig, arrival: Arrival) -> Self {
        let first_token = Duration::from_millis(route.attempt_timeout_ms);
        let whole = match arrival {
            Arrival::Whole => first_token,
            Arrival::Streamed => {
                Duration::from_millis(route.stream_timeout_ms.max(route.attempt_timeout_ms))
            }
        };
        Limits {
            arrival,
            first_token,
            whole,
        }
    }
}

/// What an attempt in flight tells its round.
pub(super) enum Event {
    /// A piece of a streamed answer.
    Piece(Delta),
    /// A streamed answer's event that is no piece: the stream is alive;
    /// `finished` once the provider said why it stopped.
    Alive { finished: bool },
    /// How it ended (for a stream, with why the provider stopped).
    End(Streamed),
}

/// Run `attempt` in a task of its own inside the attempt's span (a child
/// of the job's), so its log lines carry the job's and the attempt's ids;
/// what it hears goes to `events` under `index`.
pub(super) fn launch(
    inner: &Inner,
    entry: &ProviderEntry,
    attempt: &Attempt,
    request: Arc<ChatRequest>,
    limits: Limits,
    index: usize,
    events: mpsc::UnboundedSender<(usize, Event)>,
) -> JoinHandle<()> {
    let client = entry.client.clone();
    let span = tracing::info_span!(
        "attempt",
        job_id = %attempt.job_id,
        attempt_id = %attempt.id,
        provider = %attempt.provider,
        kind = attempt.kind.as_str(),
    );
    let run = async move {
        let ended = match limits.arrival {
            Arrival::Whole => {
                match tokio::time::timeout(limits.first_token, client.call(&request)).await {
                    Ok(outcome) => Ok((outcome, None)),
                    Err(_) => Err(no_answer(limits)),
                }
            }
            Arrival::Streamed => stream(&*client, &request, limits, index, &events).await,
        };
        let ended = ended.unwrap_or_else(|message| {
            (
                AttemptOutcome::unknown(ErrorKind::AttemptTimeout, message),
                None,
            )
        });
        let _ = events.send((index, Event::End(ended)));
    };
    inner.spawn(tracing::Instrument::instrument(run, span))
}

fn no_answer(limits: Limits) -> String {
    format!(
        "no answer within attempt_timeout_ms ({} ms)",
        limits.first_token.as_millis()
    )
}

/// A streamed call, its pieces passed on as they come; `Err` when a time
/// limit ended it.
async fn stream(
    client: &dyn Provider,
    request: &ChatRequest,
    limits: Limits,
    index: usize,
    events: &mpsc::UnboundedSender<(usize, Event)>,
) -> Result<Streamed, String> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let call = tokio::time::timeout(limits.whole, client.stream(request, &tx));
    tokio::pin!(call);
    let first_token = tokio::time::sleep(limits.first_token);
    tokio::pin!(first_token);
    let mut answering = false;
    let ended = loop {
        tokio::select! {
            biased;
            Some(heard) = rx.recv() => {
                let event = match heard {
                    Chunk::Piece(delta) => {
                        answering = true;
                        Event::Piece(delta)
                    }
                    Chunk::Alive { finished } => Event::Alive { finished },
                };
                let _ = events.send((index, event));
            }
            ended = &mut call => break ended.map_err(|_| format!(
                "the stream did not end within stream_timeout_ms ({} ms)",
                limits.whole.as_millis()
            )),
            _ = &mut first_token, if !answering => break Err(no_answer(limits)),
        }
    };
    while let Ok(heard) = rx.try_recv() {
        if let Chunk::Piece(delta) = heard {
            let _ = events.send((index, Event::Piece(delta)));
        }
    }
    ended
}
