//! Attempts: one try of a job on one provider, and the guard that decides
//! whether another may start (invariant 4).

use super::Millis;
use serde::Serialize;

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
    pub id: String,
    pub job_id: String,
    pub seq: i64,
    pub provider: String,
    pub kind: AttemptKind,
    pub state: AttemptState,
    /// The job version read when the attempt started; its CAS compares it.
    pub read_version: i64,
    pub started_at: Millis,
    pub finished_at: Option<Millis>,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub output: Option<String>,
    pub usage: Option<String>,
    pub provider_request_id: Option<String>,
}

/// A request to start an attempt; the store assigns `seq` and `read_version`.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub id: String,
    pub job_id: String,
    pub provider: String,
    pub kind: AttemptKind,
    pub max_hedges: i64,
    /// The provider honours `Idempotency-Key` (its file says
    /// `honours_idempotency_key = true`): a retry there may start while an
    /// earlier attempt there is unknown, since it carries the same key.
    pub reuses_key: bool,
    pub started_at: Millis,
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
