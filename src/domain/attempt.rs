//! Attempts: one try of a job on one provider, and the guard that decides
//! whether another may start (invariant 4).

use super::{AttemptId, ErrorKind, FinishReason, JobId, Millis};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Started,
    Succeeded,
    /// The provider explicitly rejected the request, or it provably never left.
    Failed,
    /// The provider may still be working; no retry may start while this holds.
    Unknown,
    /// Finished after another attempt had won (or the job was cancelled).
    Discarded,
    /// An unknown attempt resolved out of band as not to be counted.
    Cancelled,
}

impl AttemptState {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptState::Started => "started",
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::Unknown => "unknown",
            AttemptState::Discarded => "discarded",
            AttemptState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "started" => AttemptState::Started,
            "succeeded" => AttemptState::Succeeded,
            "failed" => AttemptState::Failed,
            "unknown" => AttemptState::Unknown,
            "discarded" => AttemptState::Discarded,
            "cancelled" => AttemptState::Cancelled,
            _ => return None,
        })
    }

    /// An attempt that may still produce a side effect at the provider.
    pub fn is_live(self) -> bool {
        matches!(self, AttemptState::Started | AttemptState::Unknown)
    }

    /// Whether an attempt in this state may move to `next`.
    pub fn may_become(self, next: AttemptState) -> bool {
        use AttemptState::*;
        matches!(
            (self, next),
            (Started, Succeeded | Failed | Unknown | Discarded)
                | (Unknown, Succeeded | Failed | Cancelled | Discarded)
        )
    }
}

/// Why an attempt was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptKind {
    /// The first attempt of a job.
    Primary,
    /// The planned backup while exactly one attempt is started and silent.
    Hedge,
    /// Another try after every earlier attempt has finished.
    Retry,
}

impl AttemptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::Primary => "primary",
            AttemptKind::Hedge => "hedge",
            AttemptKind::Retry => "retry",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "primary" => AttemptKind::Primary,
            "hedge" => AttemptKind::Hedge,
            "retry" => AttemptKind::Retry,
            _ => return None,
        })
    }
}

/// How an attempt ended: one type from the provider adapter, which
/// classifies the ending where it is born (invariant 3), through the engine
/// to the store, whose finish step records it. An adapter answers
/// `Succeeded`, `Failed` or `Unknown`; the engine adds `Abandoned` for a
/// request it dropped, and times out a silent call as `Unknown`.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    /// The provider answered. When recorded, `output` is the job's result
    /// (the engine's contract check made it so; an admin's word is one).
    Succeeded(Success),
    /// The provider said no, or the request provably never left.
    Failed(Failure),
    /// The provider may have executed it; nothing may retry until it is
    /// settled.
    Unknown(Ambiguous),
    /// Dropped while in flight because another attempt had already won;
    /// becomes `discarded` like a late result that lost the CAS.
    Abandoned { reason: String },
}

impl AttemptOutcome {
    /// The state recording this outcome asks for (a success that loses the
    /// CAS ends `discarded` instead).
    pub fn wanted_state(&self) -> AttemptState {
        match self {
            AttemptOutcome::Succeeded(_) => AttemptState::Succeeded,
            AttemptOutcome::Failed(_) => AttemptState::Failed,
            AttemptOutcome::Unknown(_) => AttemptState::Unknown,
            AttemptOutcome::Abandoned { .. } => AttemptState::Discarded,
        }
    }

    /// A definitive failure: never retryable, no `Retry-After`, no status.
    pub fn failed(kind: ErrorKind, message: impl Into<String>) -> Self {
        AttemptOutcome::Failed(Failure {
            retryable: false,
            retry_after: None,
            kind,
            message: message.into(),
            status: None,
        })
    }

    pub fn unknown(kind: ErrorKind, message: impl Into<String>) -> Self {
        AttemptOutcome::Unknown(Ambiguous {
            kind,
            message: message.into(),
        })
    }

    /// An answer with nothing but its text (usage and request id unknown).
    pub fn succeeded(output: impl Into<String>) -> Self {
        AttemptOutcome::Succeeded(Success::text(output))
    }

    /// This outcome with the provider's own text that goes to text
    /// columns (its request id, its error's message and code) made
    /// [`storable`](super::text::storable): a provider that put a NUL in its
    /// id would otherwise leave the attempt unrecordable on PostgreSQL.
    /// The answer is JSON text by then, where a NUL is `\u0000`.
    pub fn storable(mut self) -> Self {
        use super::text::storable;
        let kind_text = |kind: &mut ErrorKind| {
            if let ErrorKind::Other(code) = kind {
                storable(code);
            }
        };
        match &mut self {
            AttemptOutcome::Succeeded(success) => {
                // JSON text as recorded (a NUL in it is `\u0000`), so
                // this changes nothing but a raw NUL a caller let through.
                storable(&mut success.output);
                if let Some(id) = &mut success.provider_request_id {
                    storable(id);
                }
                if let Some(FinishReason::StopSequence(Some(sequence))) = &mut success.finish {
                    storable(sequence);
                }
            }
            AttemptOutcome::Failed(failure) => {
                kind_text(&mut failure.kind);
                storable(&mut failure.message);
            }
            AttemptOutcome::Unknown(ambiguous) => {
                kind_text(&mut ambiguous.kind);
                storable(&mut ambiguous.message);
            }
            AttemptOutcome::Abandoned { reason } => storable(reason),
        }
        self
    }
}

/// The tokens an answer used. `prompt_tokens` counts every prompt token,
/// as OpenAI's `usage` does: those read from or written to a provider's
/// prompt cache included (Anthropic reports them beside `input_tokens`).
/// Budgets (`tokens_per_day`) count `prompt_tokens + completion_tokens`.
/// u64, as the store (BIGINT) and every door's answer carry them, so a
/// count past 4,294,967,295 (or a sum of several) is kept, never capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of `prompt_tokens`, those read from the provider's prompt cache
    /// (OpenAI's `prompt_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// Of `prompt_tokens`, those written to the provider's prompt cache
    /// (Anthropic's `cache_creation_input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_creation_tokens: u64,
    /// onejob counted these with the provider's tokenizer: the provider
    /// reported no usage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// `prompt_tokens` and `completion_tokens` as reported, nothing cached.
    pub const fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            cache_creation_tokens: 0,
            estimated: false,
        }
    }

    /// The prompt tokens neither read from nor written to a cache:
    /// Anthropic's `input_tokens`.
    pub fn uncached_prompt_tokens(&self) -> u64 {
        self.prompt_tokens
            .saturating_sub(self.cached_tokens)
            .saturating_sub(self.cache_creation_tokens)
    }

    /// Anthropic's `usage` (`input_tokens`, `output_tokens`,
    /// `cache_read_input_tokens`, `cache_creation_input_tokens`) in these
    /// terms: every prompt token counted in `prompt_tokens`. `None` when
    /// the two counts are absent.
    pub fn from_anthropic(usage: &serde_json::Value) -> Option<Usage> {
        let mut read = Usage::from_wire(usage, "input_tokens", "output_tokens")?;
        let count = |field: &str| usage[field].as_u64().unwrap_or(0);
        read.cached_tokens = count("cache_read_input_tokens");
        read.cache_creation_tokens = count("cache_creation_input_tokens");
        read.prompt_tokens = read
            .prompt_tokens
            .saturating_add(read.cached_tokens)
            .saturating_add(read.cache_creation_tokens);
        Some(read)
    }

    /// This usage as Anthropic's `usage` object (what its Messages API
    /// answers): `input_tokens` the uncached prompt tokens, the cache's
    /// counts beside them.
    pub fn to_anthropic(&self) -> serde_json::Value {
        let mut usage = serde_json::json!({
            "input_tokens": self.uncached_prompt_tokens(),
            "output_tokens": self.completion_tokens,
        });
        if self.cached_tokens > 0 || self.cache_creation_tokens > 0 {
            usage["cache_read_input_tokens"] = self.cached_tokens.into();
            usage["cache_creation_input_tokens"] = self.cache_creation_tokens.into();
        }
        usage
    }

    /// The usage as an attempt's row stores it (JSON text).
    pub fn stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Token counts from a provider's usage object, given the names its wire
    /// format uses (`prompt_tokens`/`completion_tokens` for OpenAI,
    /// `input_tokens`/`output_tokens` for Anthropic); `None` when absent.
    pub fn from_wire(usage: &serde_json::Value, prompt: &str, completion: &str) -> Option<Usage> {
        let count = |field: &str| usage[field].as_u64();
        Some(Usage {
            prompt_tokens: count(prompt)?,
            completion_tokens: count(completion)?,
            // OpenAI's wire says which prompt tokens its cache served.
            cached_tokens: usage
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            ..Usage::default()
        })
    }

    /// Prompt and completion tokens together (`total_tokens`).
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// A provider's successful answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Success {
    /// The assistant message text (for contract jobs, JSON text).
    pub output: String,
    /// Tool calls the model made, OpenAI-shaped
    /// `{"id","type":"function","function":{"name","arguments"}}`.
    pub tool_calls: Vec<serde_json::Value>,
    pub usage: Option<Usage>,
    pub provider_request_id: Option<String>,
    pub latency: Duration,
    /// Why the provider stopped, as it said (`None` when it did not).
    pub finish: Option<FinishReason>,
}

impl Success {
    /// An answer of `output` alone: no tool calls, usage, request id or
    /// finish reason.
    pub fn text(output: impl Into<String>) -> Self {
        Success {
            output: output.into(),
            tool_calls: Vec::new(),
            usage: None,
            provider_request_id: None,
            latency: Duration::ZERO,
            finish: None,
        }
    }
}

/// The provider said no, or the request provably never left.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub retryable: bool,
    /// Honoured by the retry scheduler (`Retry-After`, `retry-after-ms`).
    pub retry_after: Option<Duration>,
    /// Stable machine-readable kind, e.g. `context_length_exceeded`,
    /// `content_policy`, `rate_limited`, `server_error`, `overloaded`,
    /// `connect_failed`, `bad_request`, `unauthorized`.
    pub kind: ErrorKind,
    pub message: String,
    pub status: Option<u16>,
}

/// The request may have been executed: timeout after sending, reset after
/// sending, 502/504 from a gateway, a truncated or unparsable success body.
#[derive(Debug, Clone, PartialEq)]
pub struct Ambiguous {
    /// e.g. `timeout`, `connection_reset`, `gateway_error`, `truncated_body`, `invalid_body`.
    pub kind: ErrorKind,
    pub message: String,
}

/// What the guard needs to know about a job's attempts, read inside the same
/// atomic step that inserts the new one. `*_here` count only the attempts on
/// the provider the new attempt would go to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveAttempts {
    pub started: i64,
    pub unknown: i64,
    pub hedges: i64,
    pub started_here: i64,
    pub unknown_here: i64,
}

/// Why the guard refused to start an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GuardRefusal {
    #[error("an attempt of this job is started or its outcome is unknown")]
    OutcomeUnknown,
    #[error(
        "a hedge goes to a provider with no live attempt of the job, while one attempt is \
         silent or one ended unknown, within max_hedges"
    )]
    HedgeNotAllowed,
    #[error("the job is already finished")]
    JobFinished,
    #[error("the job does not exist")]
    NoSuchJob,
}

/// Invariants 3 and 4. A primary or retry attempt starts only when no
/// attempt of the job is started, and never on a provider with an unknown
/// attempt — unless that provider honours idempotency keys (`reuses_key`):
/// the retry then carries the same downstream key and the provider dedups it.
/// A hedge (the planned fan-out) goes to a provider with no live attempt of
/// the job, while exactly one attempt is started and silent or none is
/// started and one ended unknown, and fewer than `max_hedges` hedges were
/// made.
pub fn may_start(
    kind: AttemptKind,
    job_final: bool,
    live: LiveAttempts,
    max_hedges: i64,
    reuses_key: bool,
) -> Result<(), GuardRefusal> {
    if job_final {
        return Err(GuardRefusal::JobFinished);
    }
    match kind {
        AttemptKind::Primary | AttemptKind::Retry => {
            if live.started > 0 || (live.unknown_here > 0 && !reuses_key) {
                return Err(GuardRefusal::OutcomeUnknown);
            }
        }
        AttemptKind::Hedge => {
            let something_to_hedge = live.started == 1 || (live.started == 0 && live.unknown > 0);
            if !something_to_hedge
                || live.started_here + live.unknown_here > 0
                || live.hedges >= max_hedges
            {
                return Err(GuardRefusal::HedgeNotAllowed);
            }
        }
    }
    Ok(())
}

/// An attempt row as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub id: AttemptId,
    pub job_id: JobId,
    pub seq: i64,
    pub provider: String,
    pub kind: AttemptKind,
    pub state: AttemptState,
    /// The job version read when the attempt started; its CAS compares it.
    pub read_version: i64,
    pub started_at: Millis,
    pub finished_at: Option<Millis>,
    pub error_kind: Option<ErrorKind>,
    pub error_message: Option<String>,
    pub output: Option<String>,
    pub usage: Option<String>,
    pub provider_request_id: Option<String>,
    /// Why the provider stopped, for the attempt that won (`None` for
    /// every other, and for one recorded before it was kept).
    pub finish_reason: Option<FinishReason>,
}

/// A request to start an attempt; the store assigns `seq` and `read_version`.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub id: AttemptId,
    pub job_id: JobId,
    pub provider: String,
    pub kind: AttemptKind,
    pub max_hedges: i64,
    /// The provider honours `Idempotency-Key` (its file says
    /// `honours_idempotency_key = true`): a retry there may start while an
    /// earlier attempt there is unknown, since it carries the same key.
    pub reuses_key: bool,
    pub started_at: Millis,
}

impl Attempt {
    /// This attempt as its winning finish at `at` leaves its row: `succeeded`,
    /// with the answer's usage, request id and finish reason, and without
    /// its output (the output is the job's result). The engine hands it to
    /// whoever waits for the job, so the first answer needs no read of the
    /// job's attempts.
    pub fn won(
        &self,
        usage: Option<Usage>,
        provider_request_id: Option<String>,
        finish_reason: Option<FinishReason>,
        at: Millis,
    ) -> Attempt {
        Attempt {
            state: AttemptState::Succeeded,
            finished_at: Some(at),
            output: None,
            usage: usage.map(|u| u.stored()),
            provider_request_id,
            finish_reason,
            ..self.clone()
        }
    }
}

impl NewAttempt {
    /// The attempt as its start is recorded once the guard admits it:
    /// `started`, numbered `seq` in its job, having read job version
    /// `read_version` (which its CAS will compare).
    pub fn started(self, seq: i64, read_version: i64) -> Attempt {
        Attempt {
            id: self.id,
            job_id: self.job_id,
            seq,
            provider: self.provider,
            kind: self.kind,
            state: AttemptState::Started,
            read_version,
            started_at: self.started_at,
            finished_at: None,
            error_kind: None,
            error_message: None,
            output: None,
            usage: None,
            provider_request_id: None,
            finish_reason: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(started: i64, unknown: i64, hedges: i64) -> LiveAttempts {
        LiveAttempts {
            started,
            unknown,
            hedges,
            started_here: 0,
            unknown_here: 0,
        }
    }

    #[test]
    fn retry_waits_for_started_attempts() {
        assert_eq!(
            may_start(AttemptKind::Retry, false, live(0, 0, 0), 1, false),
            Ok(())
        );
        assert_eq!(
            may_start(AttemptKind::Retry, false, live(1, 0, 0), 1, true),
            Err(GuardRefusal::OutcomeUnknown)
        );
    }

    #[test]
    fn an_unknown_attempt_blocks_its_own_provider_unless_it_honours_keys() {
        let unknown_here = LiveAttempts {
            unknown_here: 1,
            ..live(0, 1, 0)
        };
        assert_eq!(
            may_start(AttemptKind::Retry, false, unknown_here, 1, false),
            Err(GuardRefusal::OutcomeUnknown)
        );
        assert_eq!(
            may_start(AttemptKind::Retry, false, unknown_here, 1, true),
            Ok(())
        );
        // Unknown elsewhere: a retry here is another provider's business.
        assert_eq!(
            may_start(AttemptKind::Retry, false, live(0, 1, 0), 1, false),
            Ok(())
        );
    }

    #[test]
    fn hedge_needs_something_to_hedge_another_provider_and_budget() {
        assert_eq!(
            may_start(AttemptKind::Hedge, false, live(1, 0, 0), 1, false),
            Ok(())
        );
        // Rescue: the only attempt ended unknown.
        assert_eq!(
            may_start(AttemptKind::Hedge, false, live(0, 1, 0), 1, false),
            Ok(())
        );
        assert!(may_start(AttemptKind::Hedge, false, live(0, 0, 0), 1, false).is_err());
        assert!(may_start(AttemptKind::Hedge, false, live(2, 0, 0), 1, false).is_err());
        assert!(may_start(AttemptKind::Hedge, false, live(1, 0, 1), 1, false).is_err());
        let same_provider = LiveAttempts {
            unknown_here: 1,
            ..live(0, 1, 0)
        };
        assert!(may_start(AttemptKind::Hedge, false, same_provider, 1, true).is_err());
    }

    #[test]
    fn finished_jobs_take_no_attempt() {
        assert_eq!(
            may_start(AttemptKind::Primary, true, live(0, 0, 0), 1, false),
            Err(GuardRefusal::JobFinished)
        );
    }

    #[test]
    fn unknown_ends_only_by_settlement() {
        assert!(AttemptState::Unknown.may_become(AttemptState::Succeeded));
        assert!(AttemptState::Unknown.may_become(AttemptState::Cancelled));
        assert!(!AttemptState::Unknown.may_become(AttemptState::Started));
        assert!(!AttemptState::Succeeded.may_become(AttemptState::Discarded));
    }
}
