//! One round of attempts, streamed or not: the first attempt (a primary,
//! retry or rescue hedge), a hedge after the silence threshold, the rescue
//! of an attempt that ended `unknown` (within `max_hedges`, invariant 4),
//! until one wins the CAS (invariant 5) or all have ended.
//!
//! Every attempt runs in a task of its own and tells the round what it
//! hears ([`Event`]). A round whose client streams consults its [`Relay`]:
//! the first attempt to deliver a piece owns the client's stream (the
//! others are cancelled), a stream broken mid-answer goes on as a
//! continuation or restart (a hedge like any other), the round renews the
//! job's lease while it streams, and the client is told how the answer
//! ended. The silence is the time to the first sign of an answer: the
//! whole answer, or a stream's first piece.

use super::attempt::{
    counted, launch, observe_answer, open, settle, start_hedge, tokens_of, Arrival, Event, Limits,
    RoundEnd, RoundFailure, Settled, Source,
};
use super::durable::{retrying, Fence};
use super::hedging::Measure;
use super::plan::JobPlan;
use super::relay::Relay;
use super::routing::choose_hedge;
use super::stream::StreamHub;
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::attempt::NewAttempt;
use crate::domain::ErrorKind;
use crate::domain::{Attempt, AttemptKind, AttemptState, Job, JobId, Millis};
use crate::providers::catalog::ProviderEntry;
use crate::providers::stream::{Delta, StreamFinish};
use crate::providers::{AttemptOutcome, ChatRequest};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

type Events = mpsc::UnboundedReceiver<(usize, Event)>;

/// What a round runs for.
pub(super) struct Scope<'a> {
    pub inner: &'a Arc<Inner>,
    pub job: &'a Job,
    pub route: &'a RouteConfig,
    pub plan: &'a JobPlan,
}

/// A round's first attempt: its provider and kind, and the attempt itself
/// when the job's create started it.
pub(super) struct First<'a> {
    pub entry: &'a ProviderEntry,
    pub kind: AttemptKind,
    pub started: Option<NewAttempt>,
}

/// Run one round. `tried`: providers the job has attempted; `hub`: the
/// client's stream, when the answer is streamed to one.
pub(super) async fn run(
    scope: Scope<'_>,
    first: First<'_>,
    tried: Vec<String>,
    hub: Option<Arc<StreamHub>>,
) -> RoundEnd {
    let Scope {
        inner,
        job,
        route,
        plan,
    } = scope;
    let (attempt, request) = match open(
        inner,
        job,
        route,
        plan,
        first.entry,
        first.kind,
        first.started,
    )
    .await
    {
        Ok(opened) => opened,
        Err(end) => return end,
    };
    let arrival = match hub {
        Some(_) => Arrival::Streamed,
        None => Arrival::Whole,
    };
    let (events, mut heard) = mpsc::unbounded_channel();
    let mut round = Round {
        inner,
        job,
        route,
        plan,
        limits: Limits::of(route, arrival),
        live: Vec::new(),
        events,
        tried,
        hedges_left: route.max_hedges,
        unknown: None,
        failure: None,
        relay: hub.map(Relay::new),
        stall_reset: false,
        won_at: None,
    };
    round.fly(first.entry, attempt, request);
    let end = round.until_over(&mut heard, &first.entry.name).await;
    round.hand_over_losers(heard);
    end
}

/// An attempt of the round.
struct Live<'a> {
    attempt: Attempt,
    entry: &'a ProviderEntry,
    task: JoinHandle<()>,
    done: bool,
    /// Whether its first sign of an answer arrived (observed then).
    answered: bool,
    /// A stream whose provider said why it stopped: its answer is whole,
    /// and a silence after it is no stall (the provider ends it soon).
    finished: bool,
}

struct Round<'a> {
    inner: &'a Arc<Inner>,
    job: &'a Job,
    route: &'a RouteConfig,
    plan: &'a JobPlan,
    limits: Limits,
    live: Vec<Live<'a>>,
    events: mpsc::UnboundedSender<(usize, Event)>,
    /// Providers the job has attempted, this round's included.
    tried: Vec<String>,
    hedges_left: u32,
    /// The provider of an attempt that ended unknown.
    unknown: Option<String>,
    /// The failure that counts (a non-retryable one dominates).
    failure: Option<RoundFailure>,
    /// The client's stream, when the answer is streamed to one.
    relay: Option<Relay>,
    /// The stream's owner changed or delivered: its stall timer restarts.
    stall_reset: bool,
    /// When a hedge won the round.
    won_at: Option<Millis>,
}

impl<'a> Round<'a> {
    /// The attempts in flight until one wins or all have ended, the timers
    /// (silence, a stream's stall, the lease) beside them.
    async fn until_over(&mut self, heard: &mut Events, first: &str) -> RoundEnd {
        let (inner, route) = (self.inner, self.route);
        let silent_for = super::hedging::silence(inner, self.job, route, first, self.measure());
        let silence = tokio::time::sleep(silent_for);
        tokio::pin!(silence);
        // A hedge denied (or with no target) leaves the job to its attempt
        // in flight and its time limits; one started re-arms it.
        let mut silence_armed = true;
        let stall_for = Duration::from_millis(route.stall_ms.max(1));
        let stall = tokio::time::sleep(Duration::from_secs(86_400));
        tokio::pin!(stall);
        // A stream may run past the job's lease (stream_timeout_ms is
        // longer than attempt_timeout_ms): the round renews it while it
        // streams, so no other process takes over a job still streaming.
        let lease_ms = inner.lease_ms(route);
        let renew_every = Duration::from_millis((lease_ms / 3).max(1) as u64);
        let renew = tokio::time::sleep(renew_every);
        tokio::pin!(renew);
        loop {
            let running = self.running();
            if running == 0 {
                break;
            }
            if std::mem::take(&mut self.stall_reset) {
                stall
                    .as_mut()
                    .reset(tokio::time::Instant::now() + stall_for);
            }
            let owner = self.relay.as_ref().and_then(Relay::owner);
            let stalls = owner.is_some_and(|o| !self.live[o].finished);
            let streaming = self.relay.is_some();
            let (index, event) = tokio::select! {
                biased;
                Some(next) = heard.recv() => next,
                _ = &mut silence, if silence_armed && owner.is_none() && self.hedges_left > 0 && running == 1 => {
                    silence_armed = false;
                    if self.hedge_after_silence().await && self.hedges_left > 0 {
                        silence.as_mut().reset(tokio::time::Instant::now() + silent_for);
                        silence_armed = true;
                    }
                    continue;
                }
                _ = &mut renew, if streaming => {
                    renew.as_mut().reset(tokio::time::Instant::now() + renew_every);
                    if !self.renew_lease(lease_ms).await {
                        return RoundEnd::Done;
                    }
                    continue;
                }
                _ = &mut stall, if stalls => {
                    let Some(o) = owner else { continue };
                    self.live[o].task.abort();
                    let chars = self.relay.as_ref().map_or(0, Relay::own_chars);
                    let stalled = AttemptOutcome::unknown(
                        ErrorKind::StreamStall,
                        format!("no chunk for stall_ms ({} ms) after {chars} characters", route.stall_ms),
                    );
                    (o, Event::End((stalled, None)))
                }
            };
            if self.live[index].done {
                continue;
            }
            let end = match event {
                Event::Piece(delta) => {
                    self.on_piece(index, delta).await;
                    None
                }
                Event::Alive { finished } => {
                    // Every event of the owner's stream is a sign of life
                    // (a finish, its usage, a keep-alive), not only a piece.
                    self.live[index].finished |= finished;
                    self.stall_reset |= owner == Some(index);
                    None
                }
                Event::End((outcome, finish)) => self.on_end(index, outcome, finish).await,
            };
            if let Some(end) = end {
                return end;
            }
        }
        if let Some(relay) = &self.relay {
            relay.round_over();
        }
        RoundEnd::ended(self.unknown.take(), self.failure.take())
    }

    /// What the round's silence measures.
    fn measure(&self) -> Measure {
        match self.relay {
            Some(_) => Measure::TimeToFirstToken,
            None => Measure::TimeToAnswer,
        }
    }

    fn running(&self) -> usize {
        self.live.iter().filter(|l| !l.done).count()
    }

    /// Launch a started attempt; its index in the round.
    fn fly(
        &mut self,
        entry: &'a ProviderEntry,
        attempt: Attempt,
        request: Arc<ChatRequest>,
    ) -> usize {
        let index = self.live.len();
        let task = launch(
            self.inner,
            entry,
            &attempt,
            request,
            self.limits,
            index,
            self.events.clone(),
        );
        self.tried.push(entry.name.clone());
        self.live.push(Live {
            attempt,
            entry,
            task,
            done: false,
            answered: false,
            finished: false,
        });
        index
    }

    /// Start a hedge (a continuation too) to `entry` with `request` and
    /// launch it; its index, or `None` when it may not start.
    async fn hedge(
        &mut self,
        entry: &'a ProviderEntry,
        request: Arc<ChatRequest>,
        budgeted: bool,
        why: &str,
    ) -> Option<usize> {
        let attempt = start_hedge(self.inner, self.job, self.route, entry, budgeted, why).await?;
        self.hedges_left = self.hedges_left.saturating_sub(1);
        Some(self.fly(entry, attempt, request))
    }

    /// The attempt in flight was silent past the threshold: hedge to a
    /// provider the job has not tried, within the route's hedge budget.
    async fn hedge_after_silence(&mut self) -> bool {
        let Some(entry) = choose_hedge(self.inner, self.route, self.plan, &self.tried) else {
            return false;
        };
        let Ok(request) = self.plan.request_for(entry) else {
            return false;
        };
        let why = match self.measure() {
            Measure::TimeToFirstToken => "no first token within the silence threshold",
            Measure::TimeToAnswer => "no answer within the silence threshold",
        };
        self.hedge(entry, request, true, why).await.is_some()
    }

    /// Rescue: an unknown outcome blocks re-sending to its provider, not the
    /// planned fan-out to another, which starts at once.
    async fn rescue(&mut self, index: usize) {
        if self.hedges_left == 0 {
            return;
        }
        let Some(entry) = choose_hedge(self.inner, self.route, self.plan, &self.tried) else {
            return;
        };
        let Ok(request) = self.plan.request_for(entry) else {
            return;
        };
        let why = format!("attempt on {} ended unknown", self.live[index].entry.name);
        self.hedge(entry, request, false, &why).await;
    }

    async fn settle(&self, index: usize, outcome: AttemptOutcome) -> Settled {
        settle(
            self.inner,
            self.plan,
            &self.live[index].attempt,
            outcome,
            Source::Live,
        )
        .await
    }

    /// The attempt at `index` showed its first sign of an answer: its time
    /// to it is a sample of the route's learned silence.
    fn answered(&mut self, index: usize) {
        let measure = self.measure();
        let live = &mut self.live[index];
        if !live.answered {
            live.answered = true;
            observe_answer(self.inner, &self.job.route, &live.attempt, measure);
        }
    }

    async fn on_piece(&mut self, index: usize, delta: Delta) {
        self.answered(index);
        // (An answer not streamed arrives whole, without pieces.)
        if self.relay.as_ref().is_some_and(|r| r.owner().is_none()) {
            self.claim(index).await;
        }
        let entry = self.live[index].entry;
        let Some(relay) = self.relay.as_mut().filter(|r| r.owner() == Some(index)) else {
            return;
        };
        self.stall_reset = true;
        relay.piece(self.inner, index, entry, delta);
    }

    /// The attempt at `index` owns the client's stream: say so, and cancel
    /// the others. An attempt cut off before its first token would have
    /// taken at least this long (a censored sample of the learned silence).
    async fn claim(&mut self, index: usize) {
        let owner = &self.live[index];
        if let Some(relay) = self.relay.as_mut() {
            relay.claim(index, owner.entry, &owner.attempt);
        }
        let now = self.inner.clock.now_ms();
        for i in 0..self.live.len() {
            let other = &self.live[i];
            if i == index || other.done {
                continue;
            }
            if !other.answered && other.attempt.kind != AttemptKind::Hedge {
                self.inner.hedging.censored(
                    &self.job.route,
                    &other.attempt.provider,
                    self.measure(),
                    now - other.attempt.started_at,
                    now,
                );
            }
            self.abandon(i, "another attempt owns the stream").await;
        }
    }

    /// Cancel an attempt and record it as abandoned; its usage is not known
    /// once it is cut off.
    async fn abandon(&mut self, index: usize, reason: &str) {
        let live = &mut self.live[index];
        if live.done {
            return;
        }
        live.done = true;
        live.task.abort();
        let outcome = AttemptOutcome::Abandoned {
            reason: reason.to_string(),
        };
        self.settle(index, outcome).await;
    }

    /// The attempt at `index` ended: settled through the CAS or recorded,
    /// the round ends with a winner or goes on without it.
    async fn on_end(
        &mut self,
        index: usize,
        outcome: AttemptOutcome,
        finish: Option<StreamFinish>,
    ) -> Option<RoundEnd> {
        self.live[index].done = true;
        if let AttemptOutcome::Succeeded(_) = outcome {
            match &self.relay {
                // A whole answer with no piece (empty text): it owns the
                // stream now.
                Some(relay) if relay.owner().is_none() => self.claim(index).await,
                Some(_) => {}
                None => self.answered(index),
            }
        }
        if self.relay.as_ref().and_then(Relay::owner) == Some(index) {
            return self.on_owner_end(index, outcome, finish).await;
        }
        // Ended before any piece reached a client (or not streamed). The
        // rescue starts while exactly one attempt is `started` (the guard,
        // invariant 4): before this one is settled when it is the only one
        // (so it never looks abandoned to the reconciler), after when
        // another still runs.
        let alone = self.running() == 0;
        let rescued = alone && matches!(outcome, AttemptOutcome::Unknown(_));
        if rescued {
            self.rescue(index).await;
        }
        let settled = self.settle(index, outcome).await;
        let rescue = !rescued && matches!(settled, Settled::Unknown) && self.running() <= 1;
        let end = self.conclude(index, settled);
        if rescue {
            self.rescue(index).await;
        }
        end
    }

    /// The owner of the client's stream ended: the client is told how, and
    /// a stream broken mid-answer goes on where it can.
    async fn on_owner_end(
        &mut self,
        index: usize,
        outcome: AttemptOutcome,
        finish: Option<StreamFinish>,
    ) -> Option<RoundEnd> {
        let (inner, entry) = (self.inner, self.live[index].entry);
        match outcome {
            AttemptOutcome::Succeeded(success) => {
                // Counted here when its provider did not: the stream's
                // finish tells the client the whole answer's usage.
                let success = counted(self.plan, entry, success);
                let whole = self
                    .relay
                    .as_mut()?
                    .whole_answer(inner, index, entry, success);
                let settled = self.settle(index, AttemptOutcome::Succeeded(whole)).await;
                let won = matches!(settled, Settled::Won);
                let relay = self.relay.as_ref()?;
                match &settled {
                    Settled::Won => {}
                    Settled::Lost => relay.lost(inner, self.job, index, entry).await,
                    Settled::Failed(f) => relay.fail(f.failure.kind.as_str(), &f.reason),
                    Settled::Unknown => relay.fail(
                        "attempt_outcome_unknown",
                        "the answer could not be recorded; replay for the job's final state",
                    ),
                }
                let end = self.conclude(index, settled);
                if let Some(relay) = self.relay.as_ref().filter(|_| won) {
                    relay.finished(entry, finish);
                }
                end
            }
            AttemptOutcome::Failed(f) => {
                let settled = self.settle(index, AttemptOutcome::Failed(f.clone())).await;
                if !self.relay.as_mut()?.refused(index, entry, &f) {
                    return None;
                }
                self.conclude(index, settled)
            }
            // Only the engine abandons a call; an adapter that said so is
            // taken at its word (the attempt is discarded).
            AttemptOutcome::Abandoned { reason } => {
                let outcome = AttemptOutcome::Abandoned {
                    reason: reason.clone(),
                };
                self.settle(index, outcome).await;
                self.relay.as_ref()?.fail("attempt_abandoned", &reason);
                None
            }
            AttemptOutcome::Unknown(a) => {
                // Continued (or restarted) while the broken attempt still
                // counts as started.
                let next = self.continue_broken(index).await;
                let settled = self.settle(index, AttemptOutcome::Unknown(a.clone())).await;
                self.relay
                    .as_mut()?
                    .broke(inner, self.plan, index, entry, &a, next);
                self.stall_reset |= next.is_some();
                self.conclude(index, settled)
            }
        }
    }

    /// The stream's owner at `index` broke mid-answer: a continuation (or
    /// restart) started on a provider not tried; its index, and whether it
    /// restarts the answer.
    async fn continue_broken(&mut self, index: usize) -> Option<(usize, bool)> {
        if self.hedges_left == 0 {
            return None;
        }
        let relay = self.relay.as_ref()?;
        let next = relay.continuation(self.inner, self.route, self.plan, &self.tried, index)?;
        let why = if next.restart {
            "stream broke mid-answer and no provider left continues a prefill; restarting it"
        } else {
            "stream broke mid-answer; continuing it"
        };
        let started = self.hedge(next.entry, next.request, false, why).await?;
        Some((started, next.restart))
    }

    /// What a settled attempt means for the round: a win or a loss ends
    /// it; an unknown outcome or a failure is remembered.
    fn conclude(&mut self, index: usize, settled: Settled) -> Option<RoundEnd> {
        let attempt = &self.live[index].attempt;
        match settled {
            Settled::Won => {
                let now = self.inner.clock.now_ms();
                self.inner
                    .metrics
                    .observe_job_latency(now - self.job.created_at);
                if attempt.kind == AttemptKind::Hedge {
                    self.inner.hedging.hedge_won(&self.job.route, now);
                    self.won_at = Some(now);
                }
                Some(RoundEnd::Done)
            }
            Settled::Lost => Some(RoundEnd::Done),
            Settled::Unknown => {
                self.unknown = Some(attempt.provider.clone());
                None
            }
            Settled::Failed(f) => {
                // A non-retryable failure dominates a retryable one.
                if self.failure.as_ref().is_none_or(RoundFailure::retryable) {
                    self.failure = Some(f);
                }
                None
            }
        }
    }

    /// Renew the job's lease mid-stream; false when another process holds
    /// the job now (it settles these attempts: they may have reached the
    /// provider).
    async fn renew_lease(&mut self, lease_ms: Millis) -> bool {
        let inner = self.inner;
        let until = inner.clock.now_ms() + lease_ms;
        match inner
            .store
            .renew_lease(&self.job.id, &inner.instance, until)
            .await
        {
            Ok(true) => true,
            Ok(false) => {
                // A cancel clears the lease too. Then nobody else drives
                // the job: its attempts are ended here (abandoned), and
                // the client hears what a replay would say.
                let now = inner.store.get_job(&self.job.id).await.ok().flatten();
                let cancelled = now.is_some_and(|j| j.state == crate::domain::JobState::Cancelled);
                if cancelled {
                    for index in 0..self.live.len() {
                        self.abandon(index, "the job was cancelled").await;
                    }
                } else {
                    tracing::warn!(
                        "the job's lease was lost mid-stream; another process drives it"
                    );
                    for l in self.live.iter_mut().filter(|l| !l.done) {
                        l.task.abort();
                        l.done = true;
                    }
                }
                if let Some(relay) = &self.relay {
                    match cancelled {
                        true => relay.fail(
                            "job_cancelled",
                            &format!("job {} was cancelled; it has no answer", self.job.id),
                        ),
                        false => relay.fail(
                            "lease_lost",
                            "another server took the job over; replay for its final state",
                        ),
                    }
                }
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the lease mid-stream; trying again");
                true
            }
        }
    }

    /// Attempts still in flight when the round ended (another won) get
    /// their grace in a task of their own.
    fn hand_over_losers(self, heard: Events) {
        let losers: Vec<Loser> = self
            .live
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.done)
            .map(|(index, l)| Loser {
                index,
                attempt: l.attempt,
                task: l.task,
                done: false,
            })
            .collect();
        if losers.is_empty() {
            return;
        }
        let lost = LostRound {
            job_id: self.job.id.clone(),
            route: self.job.route.clone(),
            won_at: self.won_at,
            arrival: match self.relay {
                Some(_) => Arrival::Streamed,
                None => Arrival::Whole,
            },
        };
        let plan = Arc::new(self.plan.clone());
        self.inner
            .spawn(finish_losers(self.inner.clone(), heard, losers, plan, lost));
    }
}

/// An attempt still in flight after its round ended.
struct Loser {
    index: usize,
    attempt: Attempt,
    task: JoinHandle<()>,
    done: bool,
}

/// A round that ended with attempts still in flight, as its losers'
/// cost is counted.
struct LostRound {
    job_id: JobId,
    route: String,
    /// When a hedge won the round (`None`: another attempt won).
    won_at: Option<Millis>,
    arrival: Arrival,
}

/// After a winner committed: attempts still in flight get `loser_grace_ms`
/// to answer (their result then loses the CAS and their usage is counted);
/// after that their requests are dropped and they are recorded as abandoned.
/// A primary that answers after its hedge won tells how much the hedge
/// saved; one dropped unanswered is a lower bound of its latency.
async fn finish_losers(
    inner: Arc<Inner>,
    mut heard: Events,
    mut losers: Vec<Loser>,
    plan: Arc<JobPlan>,
    round: LostRound,
) {
    let grace = tokio::time::sleep(Duration::from_millis(inner.config.engine.loser_grace_ms));
    tokio::pin!(grace);
    let mut left = losers.len();
    while left > 0 {
        tokio::select! {
            biased;
            next = heard.recv() => match next {
                Some((index, Event::End((outcome, _)))) => {
                    let Some(loser) = losers.iter_mut().find(|l| l.index == index && !l.done) else {
                        continue;
                    };
                    loser.done = true;
                    left -= 1;
                    if round.arrival == Arrival::Whole {
                        if let AttemptOutcome::Succeeded(_) = outcome {
                            observe_answer(&inner, &round.route, &loser.attempt, Measure::TimeToAnswer);
                        }
                    }
                    let tokens = tokens_of(&outcome);
                    let answered = matches!(outcome, AttemptOutcome::Succeeded(_));
                    let settled = settle(&inner, &plan, &loser.attempt, outcome, Source::Live).await;
                    let now = inner.clock.now_ms();
                    if matches!(settled, Settled::Lost) && answered {
                        inner.hedging.discarded(&round.route, tokens, now);
                        if let (Some(won_at), true) = (round.won_at, loser.attempt.kind != AttemptKind::Hedge) {
                            inner.hedging.latency_saved(&round.route, now - won_at, now);
                        }
                    }
                }
                Some(_) => {}
                None => return,
            },
            _ = &mut grace => break,
        }
    }
    if left == 0 {
        return;
    }
    // Aborting the tasks drops their HTTP requests. Ask the store for the
    // job's live attempts: the truth of which are still started.
    for loser in &losers {
        loser.task.abort();
    }
    let job_id = round.job_id.clone();
    let listed = retrying(&inner, &job_id, Fence::Store, "listing attempts", |_| {
        inner.store.list_attempts(&job_id)
    })
    .await;
    let Ok(attempts) = listed else {
        return;
    };
    let now = inner.clock.now_ms();
    for attempt in attempts
        .into_iter()
        .filter(|a| a.state == AttemptState::Started)
    {
        if attempt.kind != AttemptKind::Hedge {
            let measure = match round.arrival {
                Arrival::Whole => Measure::TimeToAnswer,
                Arrival::Streamed => Measure::TimeToFirstToken,
            };
            inner.hedging.censored(
                &round.route,
                &attempt.provider,
                measure,
                now - attempt.started_at,
                now,
            );
        }
        let outcome = AttemptOutcome::Abandoned {
            reason: "another attempt won; request dropped".to_string(),
        };
        settle(&inner, &plan, &attempt, outcome, Source::Live).await;
    }
}
