//! What a round does differently when its answer is streamed to a client:
//! the [`Relay`] between the round's attempts and the job's
//! [`StreamHub`](super::stream::StreamHub). The round (`round.rs`) runs the
//! attempts, hedges and the CAS as for any job; it consults the relay for
//! what the client is told.
//!
//! - One owner: the first attempt to deliver a piece owns the client's
//!   stream ([`Relay::claim`]); the round cancels the others.
//! - The answer is committed by the CAS (invariant 5) before the relay says
//!   the stream finished ([`Relay::finished`]).
//! - A stream broken mid-answer is finished by a provider that continues a
//!   prefill, or restarted on one that does not ([`Relay::continuation`]);
//!   a restart's repetition of what the client has is held back
//!   ([`Restart`]); else the stream ends with an error naming the original
//!   failure. A truncated or spliced answer is never reported as finished.

use super::plan::JobPlan;
use super::routing::choose_continuation;
use super::stream::{StreamEvent, StreamHub};
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::request::{Message, Role};
use crate::domain::text::OneLine;
use crate::domain::FinishReason;
use crate::domain::{Attempt, ErrorKind, Job, JobState};
use crate::metrics::Metrics;
use crate::providers::catalog::ProviderEntry;
use crate::providers::stream::{Delta, StreamFinish};
use crate::providers::{Ambiguous, ChatRequest, Failure, Success, Usage};
use std::sync::Arc;

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
            cached_tokens: a.cached_tokens.saturating_add(b.cached_tokens),
            cache_creation_tokens: a
                .cache_creation_tokens
                .saturating_add(b.cache_creation_tokens),
            estimated: a.estimated || b.estimated,
        }),
        (a, b) => a.or(b),
    }
}

/// Where a broken stream may go on: the provider, the request it is sent,
/// and whether it restarts the answer (no prefill) or continues it.
pub(super) struct Continuation<'a> {
    pub entry: &'a ProviderEntry,
    pub request: Arc<ChatRequest>,
    pub restart: bool,
}

/// A streamed round's side of the client's stream.
pub(super) struct Relay {
    hub: Arc<StreamHub>,
    /// The attempt (by its index in the round) that owns the stream.
    owner: Option<usize>,
    /// Text the client has from earlier owners (a continuation's prefill).
    earlier: String,
    /// Text the client has from the current owner.
    own: String,
    /// The original failure of a stream broken mid-answer: code, message.
    broken: Option<(String, String)>,
    /// A restart without the prefill, while it repeats what the client has.
    restart: Option<Restart>,
    /// The model that began the answer: every event names it, continued or not.
    first_model: Option<String>,
    /// The tokens of earlier owners (cut ones counted by their tokenizer).
    earlier_usage: Option<Usage>,
    /// The usage the finish reports: the whole answer's.
    usage: Option<Usage>,
    /// Whether the client was sent a tool call (a restart cannot repeat one).
    tools_sent: bool,
}

impl Relay {
    pub(super) fn new(hub: Arc<StreamHub>) -> Self {
        Relay {
            hub,
            owner: None,
            earlier: String::new(),
            own: String::new(),
            broken: None,
            restart: None,
            first_model: None,
            earlier_usage: None,
            usage: None,
            tools_sent: false,
        }
    }

    /// The attempt that owns the client's stream, if one does.
    pub(super) fn owner(&self) -> Option<usize> {
        self.owner
    }

    /// Characters the current owner has delivered.
    pub(super) fn own_chars(&self) -> usize {
        self.own.chars().count()
    }

    /// The attempt at `index` owns the client's stream: say so.
    pub(super) fn claim(&mut self, index: usize, entry: &ProviderEntry, attempt: &Attempt) {
        self.owner = Some(index);
        self.hub.push(StreamEvent::Start {
            model: entry.config.model.clone(),
            provider: entry.name.clone(),
            attempt_id: attempt.id.clone(),
        });
    }

    /// A piece of the owner's answer: to the client, unless a restart is
    /// still repeating what the client has.
    pub(super) fn piece(
        &mut self,
        inner: &Inner,
        index: usize,
        entry: &ProviderEntry,
        delta: Delta,
    ) {
        self.own.push_str(&delta.content);
        let delta = match self.restart.as_mut().filter(|r| r.index == index) {
            Some(r) if r.echo == Echo::Holding => match r.hear(delta) {
                Heard::Held => return,
                Heard::Rest(rest) => {
                    tracing::info!(
                        provider = %entry.name,
                        chars = r.chars(),
                        "restart repeated the prefix; streaming the rest"
                    );
                    rest
                }
                Heard::Diverged(at) => {
                    diverged(inner, &self.hub, self.broken.as_ref(), &entry.name, r, at);
                    return;
                }
            },
            Some(r) if r.echo == Echo::Diverged => return,
            _ => delta,
        };
        if delta.is_empty() {
            return;
        }
        self.tools_sent |= !delta.tool_calls.is_empty();
        let model = self
            .first_model
            .get_or_insert_with(|| entry.config.model.clone())
            .clone();
        self.hub.push(StreamEvent::Piece { model, delta });
    }

    /// A restart at `index` still repeating what the client has.
    fn holding(&self, index: usize) -> bool {
        self.restart
            .as_ref()
            .is_some_and(|r| r.index == index && r.echo == Echo::Holding)
    }

    /// What the client has been sent.
    fn client_has(&self, index: usize) -> String {
        match self.restart.as_ref().filter(|r| r.index == index) {
            Some(r) if r.echo == Echo::Holding => r.prefix.clone(),
            _ => format!("{}{}", self.earlier, self.own),
        }
    }

    /// The owner's answer as the job's result: what earlier owners streamed
    /// and its own (a restart's own is whole). A restart whose whole answer
    /// is shorter than what the client has diverged.
    pub(super) fn whole_answer(
        &mut self,
        inner: &Inner,
        index: usize,
        entry: &ProviderEntry,
        success: Success,
    ) -> Success {
        if let Some(r) = self
            .restart
            .as_mut()
            .filter(|r| r.index == index && r.echo == Echo::Holding)
        {
            let at = success.output.chars().count();
            diverged(inner, &self.hub, self.broken.as_ref(), &entry.name, r, at);
        }
        let output = format!("{}{}", self.earlier, success.output);
        // A continuation's answer came from its owners: their tokens are
        // the answer's.
        self.usage = add_usage(self.earlier_usage, success.usage);
        Success { output, ..success }
    }

    /// The owner's answer is committed: the stream finishes.
    pub(super) fn finished(&self, entry: &ProviderEntry, finish: Option<StreamFinish>) {
        self.hub.push(StreamEvent::Finish {
            model: self
                .first_model
                .clone()
                .unwrap_or_else(|| entry.config.model.clone()),
            finish_reason: finish.map_or(FinishReason::Stop, |f| f.finish_reason),
            usage: self.usage,
        });
    }

    /// The owner's answer lost the CAS: another attempt's result was
    /// committed first (e.g. the reconciler found the broken attempt's whole
    /// answer at the provider). When that answer begins with what the
    /// client has, the client gets the rest of it and a finish; otherwise
    /// an error.
    pub(super) async fn lost(&self, inner: &Inner, job: &Job, index: usize, entry: &ProviderEntry) {
        let streamed = self.client_has(index);
        let now = inner.store.get_job(&job.id).await.ok().flatten();
        let cancelled = now.as_ref().is_some_and(|j| j.state == JobState::Cancelled);
        let committed = now
            .filter(|j| j.state == JobState::Succeeded)
            .and_then(|j| j.result);
        let text = committed.map(|r| match serde_json::from_str::<serde_json::Value>(&r) {
            Ok(serde_json::Value::String(s)) => s,
            _ => r,
        });
        match text
            .as_deref()
            .and_then(|t| t.strip_prefix(streamed.as_str()))
        {
            Some(rest) => {
                if !rest.is_empty() {
                    self.hub.push(StreamEvent::Piece {
                        model: entry.config.model.clone(),
                        delta: Delta::text(rest),
                    });
                }
                self.hub.push(StreamEvent::Finish {
                    model: entry.config.model.clone(),
                    finish_reason: FinishReason::Stop,
                    usage: None,
                });
            }
            // The code a replay of the job gives: a cancel mid-stream
            // ends it as `job_cancelled`, not as another party's finish.
            None if cancelled => self.hub.fail(
                "job_cancelled",
                &format!("job {} was cancelled; it has no answer", job.id),
            ),
            None => self.hub.fail(
                "job_finished",
                "the job was finished or cancelled by another party; replay for its final state",
            ),
        }
    }

    /// The stream ends with an error the client is told.
    pub(super) fn fail(&self, code: &str, message: &str) {
        self.hub.fail(code, message);
    }

    /// The owner at `index` refused: whether its failure counts for the
    /// round. A continuation refused before adding anything does not: the
    /// client hears of the original failure, not this, and the job stays
    /// with the attempt that broke (unknown).
    pub(super) fn refused(&mut self, index: usize, entry: &ProviderEntry, f: &Failure) -> bool {
        if self.broken.is_some() && (self.own.is_empty() || self.holding(index)) {
            let (code, message) = self.broken.take().unwrap_or_default();
            self.hub.fail(&code, &message);
            tracing::info!(
                reason = %format!("{}: {}: {}", entry.name, f.kind, OneLine(&f.message)),
                "continuation refused; the stream ends with the original failure"
            );
            return false;
        }
        let message = format!(
            "{} stopped the answer after {} characters: {}: {}",
            entry.name,
            self.earlier.chars().count() + self.own.chars().count(),
            f.kind,
            f.message
        );
        self.hub.fail(f.kind.as_str(), &message);
        true
    }

    /// The owner's stream broke mid-answer (`a`): where it may go on — on a
    /// provider not `tried` that continues a prefill, else on one that
    /// restarts the answer; `None` after a restart diverged, and once the
    /// client was sent a piece of a tool call: a prefill carries text, so a
    /// continuation would start the call again beside the half the client
    /// has (a second call, or one spliced), and a restart cannot repeat it.
    pub(super) fn continuation<'a>(
        &self,
        inner: &'a Inner,
        route: &RouteConfig,
        plan: &JobPlan,
        tried: &[String],
        index: usize,
    ) -> Option<Continuation<'a>> {
        let gave_up = self
            .restart
            .as_ref()
            .is_some_and(|r| r.index == index && r.echo == Echo::Diverged);
        if gave_up || self.tools_sent {
            return None;
        }
        if let Some(entry) = choose_continuation(inner, route, plan, tried, true) {
            let mut request = plan.request_for(entry).ok()?;
            Arc::make_mut(&mut request)
                .messages
                .push(Message::new(Role::Assistant, self.client_has(index)));
            return Some(Continuation {
                entry,
                request,
                restart: false,
            });
        }
        let entry = choose_continuation(inner, route, plan, tried, false)?;
        let request = plan.request_for(entry).ok()?;
        Some(Continuation {
            entry,
            request,
            restart: true,
        })
    }

    /// The owner at `index` broke (`a`): go on with the attempt at `next`
    /// (a continuation or restart), or, without one, end the client's
    /// stream with the original failure.
    pub(super) fn broke(
        &mut self,
        inner: &Inner,
        plan: &JobPlan,
        index: usize,
        entry: &ProviderEntry,
        a: &Ambiguous,
        next: Option<(usize, bool)>,
    ) {
        let original = self.broken.clone().unwrap_or_else(|| {
            (
                a.kind.to_string(),
                format!(
                    "the stream from {} broke after {} characters: {}: {}",
                    entry.name,
                    self.own.chars().count(),
                    a.kind,
                    a.message
                ),
            )
        });
        let Some((next, restarted)) = next else {
            self.hub.fail(&original.0, &original.1);
            return;
        };
        let client_has = self.client_has(index);
        if restarted {
            Metrics::inc(&inner.metrics.stream_restarts);
            tracing::info!(
                chars = client_has.chars().count(),
                "stream broke mid-answer and no provider left continues a prefill; restarting without it"
            );
            // The restart's own usage is the whole answer's.
            self.earlier.clear();
            self.earlier_usage = None;
            self.restart = Some(Restart {
                index: next,
                prefix: client_has,
                matched: 0,
                echo: Echo::Holding,
            });
        } else {
            let cut_usage = plan.estimated_usage(entry, &self.own);
            self.earlier = client_has;
            self.earlier_usage = add_usage(self.earlier_usage, cut_usage);
            self.restart = None;
        }
        self.own.clear();
        self.owner = Some(next);
        self.broken = Some(original);
    }

    /// The round is over: a stream still broken ends with its original
    /// failure.
    pub(super) fn round_over(&self) {
        if let Some((code, message)) = &self.broken {
            self.hub.fail(code, message);
        }
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
            ErrorKind::StreamCut.to_string(),
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
        let u = Usage::new;
        assert_eq!(add_usage(Some(u(10, 3)), Some(u(14, 5))), Some(u(24, 8)));
        assert_eq!(add_usage(None, Some(u(1, 2))), Some(u(1, 2)));
    }
}
