//! Streamed jobs: a job whose client asked for `stream: true` runs its
//! attempts streamed, and the first attempt to deliver a piece of the
//! answer owns the client's stream.
//!
//! The [`StreamHub`] of a job is where the owning attempt's pieces go, in
//! order; clients (the first request and any replay with the same key) read
//! it from any position, so a client that lost its connection resumes where
//! it left off. Invariants kept here:
//! - One owner: claiming the stream is one step under the hub's lock (one
//!   process drives a job, by its lease), like the CAS among attempts; the
//!   other live attempts are then cancelled and recorded as abandoned.
//! - The answer is committed by the CAS (invariant 5) before the hub says
//!   the stream finished: a stream that ends normally is a durable result.
//! - A stream broken mid-answer is finished by a provider that continues a
//!   prefill, or restarted on one that does not (its repetition of what the
//!   client has held back), or ends with an error naming the original
//!   failure; a truncated or spliced answer is never reported as finished.

use super::attempt::{open, settle, start_hedge, RoundEnd, RoundFailure, Settled, Source};
use super::hedging::Measure;
use super::plan::JobPlan;
use super::routing::{choose_continuation, choose_hedge};
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::request::{Message, Role};
use crate::domain::{Attempt, AttemptKind, Job, JobState};
use crate::metrics::Metrics;
use crate::providers::catalog::ProviderEntry;
use crate::providers::stream::Delta;
use crate::providers::{AttemptOutcome, Streamed, Success, Usage};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// How long a finished job's hub stays for resuming clients; after that a
/// replay streams the stored completion.
const HUB_LINGER: Duration = Duration::from_secs(60);

/// What a streamed job has told its clients, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// An attempt owns the stream (OpenAI's first chunk, with the role).
    Start {
        model: String,
        provider: String,
        attempt_id: String,
    },
    Piece {
        model: String,
        delta: Delta,
    },
    /// The answer is committed (the job succeeded).
    Finish {
        model: String,
        finish_reason: String,
        usage: Option<Usage>,
    },
    /// The stream ends without a whole answer; the job goes on.
    Error {
        code: String,
        message: String,
    },
}

impl StreamEvent {
    pub fn ends_stream(&self) -> bool {
        matches!(self, StreamEvent::Finish { .. } | StreamEvent::Error { .. })
    }
}

#[derive(Debug, Default)]
struct HubState {
    /// A driver in this process runs the job streamed.
    driven: bool,
    events: Vec<StreamEvent>,
}

/// One streamed job's events, shared by its driver and its clients.
#[derive(Debug)]
pub struct StreamHub {
    state: Mutex<HubState>,
    /// The number of events, for clients waiting for the next one.
    count: watch::Sender<usize>,
}

impl Default for StreamHub {
    fn default() -> Self {
        StreamHub {
            state: Mutex::new(HubState::default()),
            count: watch::channel(0).0,
        }
    }
}

impl StreamHub {
    fn state(&self) -> MutexGuard<'_, HubState> {
        // Every mutation is a push or a flag: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a driver here runs the job streamed (so clients read here).
    pub fn is_driven(&self) -> bool {
        self.state().driven
    }

    /// Still taking events (no finish, no error yet).
    pub fn is_open(&self) -> bool {
        !self.state().events.last().is_some_and(|e| e.ends_stream())
    }

    /// The stream ended with an error: the job goes on without it, and a
    /// replay waits for the job's final answer instead.
    pub fn ended_in_error(&self) -> bool {
        matches!(self.state().events.last(), Some(StreamEvent::Error { .. }))
    }

    /// The error the stream ended with, if it did: its code and message.
    pub fn error(&self) -> Option<(String, String)> {
        match self.state().events.last() {
            Some(StreamEvent::Error { code, message }) => Some((code.clone(), message.clone())),
            _ => None,
        }
    }

    /// Events from `from` on, and whether the stream has ended.
    pub fn events_from(&self, from: usize) -> (Vec<StreamEvent>, bool) {
        let state = self.state();
        let ended = state.events.last().is_some_and(|e| e.ends_stream());
        (state.events.get(from..).unwrap_or_default().to_vec(), ended)
    }

    /// Resolves when there may be events past `seen`.
    pub async fn changed_past(&self, seen: usize) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|n| *n > seen).await;
    }

    fn push(&self, event: StreamEvent) {
        let mut state = self.state();
        if state.events.last().is_some_and(|e| e.ends_stream()) {
            return;
        }
        state.events.push(event);
        let n = state.events.len();
        drop(state);
        self.count.send_replace(n);
    }

    fn fail(&self, code: &str, message: &str) {
        self.push(StreamEvent::Error {
            code: code.to_string(),
            message: message.to_string(),
        });
    }
}

type HubKey = (String, String);

impl Inner {
    fn hubs(&self) -> MutexGuard<'_, std::collections::HashMap<HubKey, Arc<StreamHub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hub of the job `(owner, key)` names, made if there is none.
    pub(crate) fn stream_hub(&self, owner: &str, key: &str) -> Arc<StreamHub> {
        self.hubs()
            .entry((owner.to_string(), key.to_string()))
            .or_default()
            .clone()
    }

    /// Whether a streaming client waits for the job `(owner, key)` names.
    pub(crate) fn has_hub(&self, owner: &str, key: &str) -> bool {
        self.hubs()
            .contains_key(&(owner.to_string(), key.to_string()))
    }

    /// Forget `hub` unless a driver took it.
    pub(crate) fn release_hub(&self, owner: &str, key: &str, hub: &Arc<StreamHub>) {
        let mut hubs = self.hubs();
        let k = (owner.to_string(), key.to_string());
        if hubs
            .get(&k)
            .is_some_and(|h| Arc::ptr_eq(h, hub) && !h.is_driven())
        {
            hubs.remove(&k);
        }
    }

    /// Called as a driver takes `job`: the job runs streamed when a client
    /// waits on an open hub for it.
    pub(super) fn claim_hub(&self, job: &Job) -> Option<Arc<StreamHub>> {
        let hubs = self.hubs();
        let hub = hubs.get(&(job.owner_id.clone(), job.idempotency_key.clone()))?;
        if !hub.is_open() {
            return None;
        }
        hub.state().driven = true;
        Some(hub.clone())
    }
}

/// After the driver stopped: a hub still open gets the job's state as its
/// error (it failed, went to review, or waits on an unknown outcome), then
/// lingers for resuming clients.
pub(super) async fn close_after_drive(
    inner: &Arc<Inner>,
    job_id: &str,
    owner: &str,
    key: &str,
    hub: Arc<StreamHub>,
) {
    if hub.is_open() {
        let (code, message) = match inner.store.get_job(job_id).await {
            Ok(Some(now)) => {
                // A job failed by a provider's refusal keeps the provider's
                // code (e.g. `content_policy`, `context_length_exceeded`).
                let refused = match now.state {
                    JobState::Failed => inner
                        .store
                        .list_attempts(job_id)
                        .await
                        .ok()
                        .and_then(|attempts| {
                            attempts
                                .into_iter()
                                .rev()
                                .find(|a| a.state == crate::domain::AttemptState::Failed)
                                .and_then(|a| a.error_kind)
                        }),
                    _ => None,
                };
                let code = match now.state {
                    JobState::Failed => refused.unwrap_or_else(|| "job_failed".to_string()),
                    JobState::NeedsReview => "job_needs_review".to_string(),
                    JobState::Cancelled => "job_cancelled".to_string(),
                    _ => "job_pending".to_string(),
                };
                // A job that is finished (failed or cancelled) has no other
                // answer to come: nothing is said about replaying it.
                let finished = matches!(now.state, JobState::Failed | JobState::Cancelled);
                let message = format!(
                    "job {} is {}: {}{}",
                    now.id,
                    now.state.as_str(),
                    now.last_error.as_deref().unwrap_or("no result yet"),
                    if finished {
                        ""
                    } else {
                        "; replay this request with the same Idempotency-Key for its final answer"
                    }
                );
                (code, message)
            }
            _ => (
                "job_pending".to_string(),
                format!("job {job_id} is not finished; replay this request with the same Idempotency-Key"),
            ),
        };
        hub.fail(&code, &message);
    }
    hub.state().driven = false;
    let linger = inner.clone();
    let key = (owner.to_string(), key.to_string());
    inner.spawn(async move {
        tokio::time::sleep(HUB_LINGER).await;
        let mut hubs = linger.hubs();
        if hubs.get(&key).is_some_and(|h| Arc::ptr_eq(h, &hub)) {
            hubs.remove(&key);
        }
    });
}

enum Event {
    Piece(Delta),
    End(Streamed),
}

struct Live<'a> {
    attempt: Attempt,
    entry: &'a ProviderEntry,
    task: JoinHandle<()>,
    done: bool,
    /// Whether its first piece arrived (time to first token is observed then).
    answered: bool,
}

/// A streamed attempt's time limits: the first piece within
/// `attempt_timeout_ms` (the hedge waits inside it), the whole stream
/// within `stream_timeout_ms`; between pieces the round's `stall_ms`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    first_token: Duration,
    whole: Duration,
}

impl Limits {
    fn of(route: &RouteConfig) -> Self {
        Limits {
            first_token: Duration::from_millis(route.attempt_timeout_ms),
            whole: Duration::from_millis(route.stream_timeout_ms.max(route.attempt_timeout_ms)),
        }
    }
}

/// Run `attempt` streamed, in a task of its own inside the attempt's span
/// (a child of the job's), so its log lines carry the job's and the
/// attempt's ids, as an unstreamed attempt's do.
fn launch(
    inner: &Inner,
    entry: &ProviderEntry,
    attempt: &Attempt,
    request: crate::providers::ChatRequest,
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
        let (tx, mut rx) = mpsc::unbounded_channel();
        let call = tokio::time::timeout(limits.whole, client.stream(&request, &tx));
        tokio::pin!(call);
        let first_token = tokio::time::sleep(limits.first_token);
        tokio::pin!(first_token);
        let mut answering = false;
        let ended = loop {
            tokio::select! {
                biased;
                Some(delta) = rx.recv() => {
                    answering = true;
                    let _ = events.send((index, Event::Piece(delta)));
                }
                ended = &mut call => break ended.map_err(|_| format!(
                    "the stream did not end within stream_timeout_ms ({} ms)",
                    limits.whole.as_millis()
                )),
                _ = &mut first_token, if !answering => break Err(format!(
                    "no answer within attempt_timeout_ms ({} ms)",
                    limits.first_token.as_millis()
                )),
            }
        };
        while let Ok(delta) = rx.try_recv() {
            let _ = events.send((index, Event::Piece(delta)));
        }
        let streamed = ended
            .unwrap_or_else(|message| (AttemptOutcome::unknown("attempt_timeout", message), None));
        let _ = events.send((index, Event::End(streamed)));
    };
    inner.spawn(tracing::Instrument::instrument(run, span))
}

/// Start a hedge (or continuation) to `entry` with `request` and launch it
/// streamed; its index in the round, or `None` when it may not start.
#[expect(
    clippy::too_many_arguments,
    reason = "the streamed round's state a new attempt joins; merged into one round next"
)]
async fn hedge_streamed<'a>(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    entry: &'a ProviderEntry,
    request: crate::providers::ChatRequest,
    budgeted: bool,
    why: &str,
    limits: Limits,
    events: &mpsc::UnboundedSender<(usize, Event)>,
    live: &mut Vec<Live<'a>>,
    tried: &mut Vec<String>,
    hedges_left: &mut u32,
) -> Option<usize> {
    let attempt = start_hedge(inner, job, route, entry, budgeted, why).await?;
    *hedges_left = hedges_left.saturating_sub(1);
    tried.push(entry.name.clone());
    let index = live.len();
    let task = launch(
        inner,
        entry,
        &attempt,
        request,
        limits,
        index,
        events.clone(),
    );
    live.push(Live {
        attempt,
        entry,
        task,
        done: false,
        answered: false,
    });
    Some(index)
}

/// Cancel an attempt that lost the stream (or whose round is over) and
/// record it as abandoned; its usage is not known once it is cut off.
async fn abandon(inner: &Inner, plan: &JobPlan, live: &mut Live<'_>, reason: &str) {
    if live.done {
        return;
    }
    live.done = true;
    live.task.abort();
    let outcome = AttemptOutcome::Abandoned {
        reason: reason.to_string(),
    };
    settle(inner, plan, &live.attempt, outcome, Source::Live).await;
}

/// Where a restart (a cut answer asked for again, without the prefill, of a
/// provider that cannot continue one) stands against what the client has.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Echo {
    /// Repeating the prefix so far: its output is held back.
    Holding,
    /// It repeated the whole prefix: the rest goes to the client.
    Released,
    /// It said something else: the client's stream ended with the cut.
    Diverged,
}

#[derive(Debug)]
struct Restart {
    /// The restarted attempt's index in the round.
    index: usize,
    /// What the client had when the stream was cut.
    prefix: String,
    /// Bytes of `prefix` the restart has repeated.
    matched: usize,
    echo: Echo,
}

/// What a piece of a restart that is still repeating the prefix means.
#[derive(Debug, PartialEq)]
enum Heard {
    /// Part of the prefix: held back.
    Held,
    /// The prefix is whole, with this piece's text past it (maybe empty).
    Rest(Delta),
    /// Not the prefix: it diverged at this character.
    Diverged(usize),
}

impl Restart {
    fn hear(&mut self, delta: Delta) -> Heard {
        let left = &self.prefix[self.matched..];
        let text = delta.content.as_str();
        if text.len() < left.len() && left.starts_with(text) && delta.tool_calls.is_empty() {
            self.matched += text.len();
            return Heard::Held;
        }
        if let Some(rest) = text.strip_prefix(left) {
            self.matched = self.prefix.len();
            self.echo = Echo::Released;
            return Heard::Rest(Delta {
                content: rest.to_string(),
                tool_calls: delta.tool_calls,
            });
        }
        let same = left
            .chars()
            .zip(text.chars())
            .take_while(|(a, b)| a == b)
            .count();
        self.echo = Echo::Diverged;
        Heard::Diverged(self.prefix[..self.matched].chars().count() + same)
    }

    /// What the client has been sent: all of the prefix.
    fn chars(&self) -> usize {
        self.prefix.chars().count()
    }
}

/// `a` + `b`: the tokens of two owners of one answer.
fn add_usage(a: Option<Usage>, b: Option<Usage>) -> Option<Usage> {
    match (a, b) {
        (Some(a), Some(b)) => Some(Usage {
            prompt_tokens: a.prompt_tokens.saturating_add(b.prompt_tokens),
            completion_tokens: a.completion_tokens.saturating_add(b.completion_tokens),
        }),
        (a, b) => a.or(b),
    }
}

/// One round of streamed attempts: the first (primary or retry), a hedge
/// when no piece arrived within `silence_ms` (time to first token) or the
/// first ended `unknown` before any piece, and continuations of a stream
/// broken mid-answer.
#[expect(
    clippy::too_many_arguments,
    reason = "run_round's arguments and the hub the round streams to"
)]
pub(super) async fn run_streamed_round(
    inner: &Arc<Inner>,
    job: &Job,
    route: &RouteConfig,
    plan: &JobPlan,
    first: &ProviderEntry,
    kind: AttemptKind,
    mut tried: Vec<String>,
    hub: &Arc<StreamHub>,
) -> RoundEnd {
    let limits = Limits::of(route);
    let stall_for = Duration::from_millis(route.stall_ms.max(1));
    let (attempt, request) = match open(inner, job, route, plan, first, kind, None).await {
        Ok(opened) => opened,
        Err(end) => return end,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = launch(inner, first, &attempt, request, limits, 0, tx.clone());
    let mut live = vec![Live {
        attempt,
        entry: first,
        task,
        done: false,
        answered: false,
    }];
    tried.push(first.name.clone());
    let mut hedges_left = route.max_hedges;
    let silence = tokio::time::sleep(super::hedging::silence(
        inner,
        job,
        route,
        &first.name,
        Measure::TimeToFirstToken,
    ));
    tokio::pin!(silence);
    // Fires once: a hedge denied (or with no target) leaves the job to its
    // attempt in flight and its time limits.
    let mut silence_armed = true;
    let stall = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(stall);
    // A stream may run past the job's lease (stream_timeout_ms is longer
    // than attempt_timeout_ms): the driver renews it while the round runs,
    // so no other process takes over a job that is still streaming.
    let lease_ms = inner.lease_ms(route);
    let renew_every = Duration::from_millis((lease_ms / 3).max(1) as u64);
    let renew = tokio::time::sleep(renew_every);
    tokio::pin!(renew);
    let mut owner: Option<usize> = None;
    // Text the client has from earlier owners (a continuation's prefill),
    // and from the current owner.
    let (mut earlier, mut own) = (String::new(), String::new());
    let mut broken: Option<(String, String)> = None;
    let (mut unknown, mut failure) = (None::<String>, None::<RoundFailure>);
    // A restart without the prefill, while it repeats what the client has.
    let mut restart: Option<Restart> = None;
    // The model that began the answer: every event names it, continued or not.
    let mut first_model: Option<String> = None;
    // The tokens of earlier owners (cut ones counted by their tokenizer).
    let mut earlier_usage: Option<Usage> = None;
    // Whether the client was sent a tool call (a restart cannot repeat one).
    let mut tools_sent = false;

    loop {
        let running = live.iter().filter(|l| !l.done).count();
        if running == 0 {
            break;
        }
        let (index, event) = tokio::select! {
            biased;
            Some(next) = rx.recv() => next,
            _ = &mut silence, if silence_armed && owner.is_none() && hedges_left > 0 && running == 1 => {
                silence_armed = false;
                if let Some(entry) = choose_hedge(inner, route, plan, &tried) {
                    if let Ok(request) = plan.request_for(entry) {
                        hedge_streamed(
                inner, job, route, entry, request, true, "no first token within the silence threshold", limits, &tx, &mut live, &mut tried,
                &mut hedges_left,
            )
            .await;
                    }
                }
                continue;
            }
            _ = &mut renew => {
                renew.as_mut().reset(tokio::time::Instant::now() + renew_every);
                let until = inner.clock.now_ms() + lease_ms;
                match inner.store.renew_lease(&job.id, &inner.instance, until).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another process holds the job now and settles these
                        // attempts (they may have reached the provider).
                        tracing::warn!("the job's lease was lost mid-stream; another process drives it");
                        for l in live.iter_mut().filter(|l| !l.done) {
                            l.task.abort();
                            l.done = true;
                        }
                        hub.fail("lease_lost", "another server took the job over; replay for its final state");
                        return RoundEnd::Done;
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot renew the lease mid-stream; trying again"),
                }
                continue;
            }
            _ = &mut stall, if owner.is_some() => {
                let Some(o) = owner else { continue };
                live[o].task.abort();
                let stalled = AttemptOutcome::unknown(
                    "stream_stall",
                    format!("no chunk for stall_ms ({} ms) after {} characters", route.stall_ms, own.chars().count()),
                );
                (o, Event::End((stalled, None)))
            }
        };
        if live[index].done {
            continue;
        }
        match event {
            Event::Piece(delta) => {
                if !live[index].answered {
                    live[index].answered = true;
                    let now = inner.clock.now_ms();
                    let elapsed = now - live[index].attempt.started_at;
                    inner
                        .metrics
                        .observe_time_to_first_token(&live[index].attempt.provider, elapsed);
                    inner.hedging.observe(
                        &job.route,
                        &live[index].attempt.provider,
                        Measure::TimeToFirstToken,
                        elapsed,
                        now,
                    );
                }
                if owner.is_none() {
                    owner = Some(index);
                    claim(inner, plan, hub, &job.route, &mut live, index).await;
                }
                if owner != Some(index) {
                    continue;
                }
                stall
                    .as_mut()
                    .reset(tokio::time::Instant::now() + stall_for);
                own.push_str(&delta.content);
                let delta = match restart.as_mut().filter(|r| r.index == index) {
                    Some(r) if r.echo == Echo::Holding => match r.hear(delta) {
                        Heard::Held => continue,
                        Heard::Rest(rest) => {
                            tracing::info!(
                                provider = %live[index].entry.name,
                                chars = r.chars(),
                                "restart repeated the prefix; streaming the rest"
                            );
                            rest
                        }
                        Heard::Diverged(at) => {
                            diverged(inner, hub, broken.as_ref(), &live[index].entry.name, r, at);
                            continue;
                        }
                    },
                    Some(r) if r.echo == Echo::Diverged => continue,
                    _ => delta,
                };
                if delta.is_empty() {
                    continue;
                }
                tools_sent |= !delta.tool_calls.is_empty();
                let model = first_model
                    .get_or_insert_with(|| live[index].entry.config.model.clone())
                    .clone();
                hub.push(StreamEvent::Piece { model, delta });
            }
            Event::End((outcome, finish)) => {
                live[index].done = true;
                let is_owner = owner == Some(index);
                if !is_owner {
                    if let AttemptOutcome::Succeeded(_) = outcome {
                        // A whole answer with no piece (empty text): it owns
                        // the stream now.
                        if owner.is_none() {
                            owner = Some(index);
                            claim(inner, plan, hub, &job.route, &mut live, index).await;
                        }
                    }
                }
                if owner != Some(index) {
                    // Ended before any piece: a failure like an unstreamed one.
                    if let AttemptOutcome::Unknown(_) = &outcome {
                        // Rescue: hedge at once to a provider not tried,
                        // while this attempt still counts as the started one.
                        if hedges_left > 0 && running == 1 {
                            if let Some(entry) = choose_hedge(inner, route, plan, &tried) {
                                if let Ok(request) = plan.request_for(entry) {
                                    hedge_streamed(
                                        inner,
                                        job,
                                        route,
                                        entry,
                                        request,
                                        false,
                                        "attempt ended unknown before any token",
                                        limits,
                                        &tx,
                                        &mut live,
                                        &mut tried,
                                        &mut hedges_left,
                                    )
                                    .await;
                                }
                            }
                        }
                    }
                    match settle(inner, plan, &live[index].attempt, outcome, Source::Live).await {
                        Settled::Won | Settled::Lost => return RoundEnd::Done,
                        Settled::Unknown => unknown = Some(live[index].attempt.provider.clone()),
                        Settled::Failed(f) => {
                            // A non-retryable failure dominates a retryable one.
                            if failure.as_ref().is_none_or(RoundFailure::retryable) {
                                failure = Some(f);
                            }
                        }
                    }
                    continue;
                }
                // The owner ended.
                let entry = live[index].entry;
                match outcome {
                    AttemptOutcome::Succeeded(success) => {
                        if let Some(r) = restart
                            .as_mut()
                            .filter(|r| r.index == index && r.echo == Echo::Holding)
                        {
                            // Its whole answer is shorter than what the client has.
                            let at = success.output.chars().count();
                            diverged(inner, hub, broken.as_ref(), &entry.name, r, at);
                        }
                        let output = format!("{earlier}{}", success.output);
                        // A continuation's answer came from its owners: their
                        // tokens are the answer's (a restart's own are whole).
                        let usage = add_usage(earlier_usage, success.usage);
                        let whole = AttemptOutcome::Succeeded(Success { output, ..success });
                        let settled =
                            settle(inner, plan, &live[index].attempt, whole, Source::Live).await;
                        return match settled {
                            Settled::Won => {
                                inner
                                    .metrics
                                    .observe_job_latency(inner.clock.now_ms() - job.created_at);
                                if live[index].attempt.kind == AttemptKind::Hedge {
                                    inner.hedging.hedge_won(&job.route, inner.clock.now_ms());
                                }
                                hub.push(StreamEvent::Finish {
                                    model: first_model
                                        .clone()
                                        .unwrap_or_else(|| entry.config.model.clone()),
                                    finish_reason: finish
                                        .map_or_else(|| "stop".to_string(), |f| f.finish_reason),
                                    usage,
                                });
                                RoundEnd::Done
                            }
                            Settled::Lost => {
                                let streamed = match restart.as_ref().filter(|r| r.index == index) {
                                    Some(r) if r.echo == Echo::Holding => r.prefix.clone(),
                                    _ => format!("{earlier}{own}"),
                                };
                                finish_from_winner(inner, job, &streamed, entry, hub).await;
                                RoundEnd::Done
                            }
                            Settled::Failed(f) => {
                                hub.fail(&f.failure.kind, &f.reason);
                                ended(None, Some(f))
                            }
                            Settled::Unknown => {
                                hub.fail("attempt_outcome_unknown", "the answer could not be recorded; replay for the job's final state");
                                ended(Some(entry.name.clone()), None)
                            }
                        };
                    }
                    AttemptOutcome::Failed(f)
                        if broken.is_some()
                            && (own.is_empty()
                                || restart.as_ref().is_some_and(|r| {
                                    r.index == index && r.echo == Echo::Holding
                                })) =>
                    {
                        // A continuation refused before adding anything: the
                        // client hears of the original failure, not this.
                        let reason = format!("{}: {}: {}", entry.name, f.kind, f.message);
                        settle(
                            inner,
                            plan,
                            &live[index].attempt,
                            AttemptOutcome::Failed(f),
                            Source::Live,
                        )
                        .await;
                        let (code, message) = broken.take().unwrap_or_default();
                        hub.fail(&code, &message);
                        tracing::info!(%reason, "continuation refused; the stream ends with the original failure");
                        return ended(unknown.or(Some(entry.name.clone())), None);
                    }
                    AttemptOutcome::Failed(f) => {
                        let message = format!(
                            "{} stopped the answer after {} characters: {}: {}",
                            entry.name,
                            earlier.chars().count() + own.chars().count(),
                            f.kind,
                            f.message
                        );
                        let code = f.kind.clone();
                        let settled = settle(
                            inner,
                            plan,
                            &live[index].attempt,
                            AttemptOutcome::Failed(f),
                            Source::Live,
                        )
                        .await;
                        hub.fail(&code, &message);
                        return match settled {
                            Settled::Failed(f) => ended(unknown, Some(f)),
                            Settled::Unknown => ended(Some(entry.name.clone()), None),
                            Settled::Won | Settled::Lost => RoundEnd::Done,
                        };
                    }
                    // Only the engine abandons a call; an adapter that said
                    // so is taken at its word (the attempt is discarded) and
                    // the round ends with nothing live of its own.
                    AttemptOutcome::Abandoned { reason } => {
                        let outcome = AttemptOutcome::Abandoned {
                            reason: reason.clone(),
                        };
                        settle(inner, plan, &live[index].attempt, outcome, Source::Live).await;
                        hub.fail("attempt_abandoned", &reason);
                        return ended(unknown, None);
                    }
                    AttemptOutcome::Unknown(a) => {
                        let original = broken.clone().unwrap_or_else(|| {
                            (
                                a.kind.clone(),
                                format!(
                                    "the stream from {} broke after {} characters: {}: {}",
                                    entry.name,
                                    own.chars().count(),
                                    a.kind,
                                    a.message
                                ),
                            )
                        });
                        // What the client has: a restart still repeating it
                        // has sent none of its own.
                        let this_restart = restart.as_ref().filter(|r| r.index == index);
                        let gave_up = this_restart.is_some_and(|r| r.echo == Echo::Diverged);
                        let client_has = match this_restart {
                            Some(r) if r.echo == Echo::Holding => r.prefix.clone(),
                            _ => format!("{earlier}{own}"),
                        };
                        let cut_usage = plan.estimated_usage(entry, &own);
                        // Continue on a provider that takes a prefill, started
                        // while the broken attempt still counts as started;
                        // else restart on one that does not, without it.
                        let mut continued = None;
                        let mut restarted = false;
                        if hedges_left > 0 && !gave_up {
                            if let Some(next) =
                                choose_continuation(inner, route, plan, &tried, true)
                            {
                                if let Ok(mut request) = plan.request_for(next) {
                                    request
                                        .messages
                                        .push(Message::new(Role::Assistant, client_has.clone()));
                                    continued = hedge_streamed(
                                        inner,
                                        job,
                                        route,
                                        next,
                                        request,
                                        false,
                                        "stream broke mid-answer; continuing it",
                                        limits,
                                        &tx,
                                        &mut live,
                                        &mut tried,
                                        &mut hedges_left,
                                    )
                                    .await;
                                }
                            } else if !tools_sent {
                                if let Some(next) =
                                    choose_continuation(inner, route, plan, &tried, false)
                                {
                                    if let Ok(request) = plan.request_for(next) {
                                        continued = hedge_streamed(
                                            inner,
                                            job,
                                            route,
                                            next,
                                            request,
                                            false,
                                            "stream broke mid-answer; restarting it",
                                            limits,
                                            &tx,
                                            &mut live,
                                            &mut tried,
                                            &mut hedges_left,
                                        )
                                        .await;
                                        if continued.is_some() {
                                            restarted = true;
                                            Metrics::inc(&inner.metrics.stream_restarts);
                                            tracing::info!(
                                                provider = %next.name,
                                                chars = client_has.chars().count(),
                                                "stream broke mid-answer and no provider left continues a prefill; restarting without it"
                                            );
                                        }
                                    }
                                }
                            }
                        }
                        settle(
                            inner,
                            plan,
                            &live[index].attempt,
                            AttemptOutcome::Unknown(a),
                            Source::Live,
                        )
                        .await;
                        unknown = Some(entry.name.clone());
                        match continued {
                            Some(next) => {
                                own.clear();
                                if restarted {
                                    // The restart's own usage is the whole answer's.
                                    earlier.clear();
                                    earlier_usage = None;
                                    restart = Some(Restart {
                                        index: next,
                                        prefix: client_has,
                                        matched: 0,
                                        echo: Echo::Holding,
                                    });
                                } else {
                                    earlier = client_has;
                                    earlier_usage = add_usage(earlier_usage, cut_usage);
                                    restart = None;
                                }
                                owner = Some(next);
                                broken = Some(original);
                                stall
                                    .as_mut()
                                    .reset(tokio::time::Instant::now() + stall_for);
                            }
                            None => {
                                hub.fail(&original.0, &original.1);
                                return ended(unknown, None);
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some((code, message)) = broken {
        hub.fail(&code, &message);
    }
    ended(unknown, failure)
}

/// The owner's answer lost the CAS: another attempt's result was committed
/// first (e.g. the reconciler found the broken attempt's whole answer at
/// the provider). When that answer begins with what the client has, the
/// client gets the rest of it and a finish; otherwise an error.
async fn finish_from_winner(
    inner: &Inner,
    job: &Job,
    streamed: &str,
    entry: &ProviderEntry,
    hub: &StreamHub,
) {
    let committed = match inner.store.get_job(&job.id).await {
        Ok(Some(now)) if now.state == JobState::Succeeded => now.result,
        _ => None,
    };
    let text = committed.map(|r| match serde_json::from_str::<serde_json::Value>(&r) {
        Ok(serde_json::Value::String(s)) => s,
        _ => r,
    });
    match text.as_deref().and_then(|t| t.strip_prefix(streamed)) {
        Some(rest) => {
            if !rest.is_empty() {
                hub.push(StreamEvent::Piece {
                    model: entry.config.model.clone(),
                    delta: Delta::text(rest),
                });
            }
            hub.push(StreamEvent::Finish {
                model: entry.config.model.clone(),
                finish_reason: "stop".to_string(),
                usage: None,
            });
        }
        None => hub.fail(
            "job_finished",
            "the job was finished or cancelled by another party; replay for its final state",
        ),
    }
}

/// A restart did not repeat what the client has: the client's stream ends
/// with the original cut; the restart goes on (it may still win the job).
fn diverged(
    inner: &Inner,
    hub: &StreamHub,
    broken: Option<&(String, String)>,
    provider: &str,
    restart: &mut Restart,
    at: usize,
) {
    restart.echo = Echo::Diverged;
    Metrics::inc(&inner.metrics.stream_restarts_diverged);
    tracing::info!(%provider, at, "restart diverged at char {at}; the stream ends with the cut");
    let (code, message) = broken.cloned().unwrap_or_else(|| {
        (
            "stream_cut".to_string(),
            "the stream was cut mid-answer".to_string(),
        )
    });
    hub.fail(
        &code,
        &format!(
            "{message}; a restart on {provider} did not repeat the {} characters already sent (it diverged at char {at})",
            restart.chars()
        ),
    );
}

fn ended(unknown: Option<String>, failure: Option<RoundFailure>) -> RoundEnd {
    RoundEnd::Ended { unknown, failure }
}

/// The attempt at `index` owns the client's stream: say so, and cancel the
/// others. An attempt of `route` cut off before its first token would
/// have taken at least this long (a censored sample of the learned silence).
async fn claim(
    inner: &Inner,
    plan: &JobPlan,
    hub: &StreamHub,
    route: &str,
    live: &mut [Live<'_>],
    index: usize,
) {
    let owner = &live[index];
    hub.push(StreamEvent::Start {
        model: owner.entry.config.model.clone(),
        provider: owner.entry.name.clone(),
        attempt_id: owner.attempt.id.clone(),
    });
    let now = inner.clock.now_ms();
    for (i, other) in live.iter_mut().enumerate() {
        if i != index {
            if !other.done && !other.answered && other.attempt.kind != AttemptKind::Hedge {
                inner.hedging.censored(
                    route,
                    &other.attempt.provider,
                    Measure::TimeToFirstToken,
                    now - other.attempt.started_at,
                    now,
                );
            }
            abandon(inner, plan, other, "another attempt owns the stream").await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(prefix: &str) -> Restart {
        Restart {
            index: 1,
            prefix: prefix.to_string(),
            matched: 0,
            echo: Echo::Holding,
        }
    }

    #[test]
    fn a_restart_is_held_while_it_repeats_the_prefix_then_released() {
        let mut r = restart("The tide rises");
        assert_eq!(r.hear(Delta::text("The ti")), Heard::Held);
        assert_eq!(r.hear(Delta::text("de ri")), Heard::Held);
        assert_eq!(
            r.hear(Delta::text("ses and falls")),
            Heard::Rest(Delta::text(" and falls"))
        );
        assert_eq!(r.echo, Echo::Released);
        let mut exact = restart("abc");
        assert_eq!(exact.hear(Delta::text("abc")), Heard::Rest(Delta::text("")));
    }

    #[test]
    fn a_restart_that_says_something_else_diverges_at_its_first_other_char() {
        let mut r = restart("The tide rises");
        assert_eq!(r.hear(Delta::text("The ti")), Heard::Held);
        assert_eq!(r.hear(Delta::text("me flies")), Heard::Diverged(6));
        assert_eq!(r.echo, Echo::Diverged);
        let mut tool = restart("ab");
        let call = Delta {
            content: "a".to_string(),
            tool_calls: vec![serde_json::json!({"index": 0})],
        };
        assert_eq!(tool.hear(call), Heard::Diverged(1));
    }

    #[test]
    fn usage_of_two_owners_is_their_sum() {
        let u = |p, c| Usage {
            prompt_tokens: p,
            completion_tokens: c,
        };
        assert_eq!(add_usage(Some(u(10, 3)), Some(u(14, 5))), Some(u(24, 8)));
        assert_eq!(add_usage(None, Some(u(1, 2))), Some(u(1, 2)));
    }
}
