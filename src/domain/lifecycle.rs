//! The job and attempt lifecycle, written once.
//!
//! Every rule about which state may do what is a predicate here. The SQL
//! that filters on states uses the lists below (macros, so `concat!` can
//! put them in the literal SQL text), and a test over every state checks
//! each list against its predicate; `tests/lifecycle.rs` walks every state
//! through the store operations on real databases.
//!
//! Jobs: `pending` → `running` → `succeeded` | `failed` | `needs_review` |
//! `cancelled` (`docs/design.md`, "States"). Attempts: `started` → `succeeded` |
//! `failed` | `unknown` | `discarded`; `unknown` → `succeeded` | `failed` |
//! `cancelled` | `discarded`.

use super::attempt::AttemptState;
use super::job::{Job, JobState};

impl JobState {
    /// Every job state.
    pub const ALL: [JobState; 6] = [
        JobState::Pending,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::NeedsReview,
        JobState::Cancelled,
    ];

    /// The engine drives the job: it may be claimed, start attempts, back
    /// off, park on an unknown attempt, fail, or go to review. Only
    /// `pending` and `running`: a job in review waits for a human, and no
    /// engine step takes it out of the queue.
    pub fn takes_attempts(self) -> bool {
        matches!(self, JobState::Pending | JobState::Running)
    }

    /// Succeeded, failed and cancelled jobs take no more attempts and change
    /// only by an admin's resolution.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// A user's retry or an admin's resolution may still change the job:
    /// every state but a success (its result never changes) and a
    /// cancellation. (A retry also needs no attempt to be live.)
    pub fn accepts_retry(self) -> bool {
        !matches!(self, JobState::Succeeded | JobState::Cancelled)
    }

    /// Nothing changes the job's row any more: no attempt starts, every
    /// later finish loses the compare-and-swap, retry and resolution refuse
    /// it, and a late loser's error stays on its attempt. So a replay of it
    /// may be answered from memory, on any instance (`crate::replays`).
    pub fn is_settled_for_good(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Cancelled)
    }

    /// Waits for a human decision (the review queue).
    pub fn awaits_decision(self) -> bool {
        self == JobState::NeedsReview
    }

    /// The owner may cancel it: anything not final.
    pub fn accepts_cancel(self) -> bool {
        !self.is_final()
    }
}

impl AttemptState {
    /// Every attempt state.
    pub const ALL: [AttemptState; 6] = [
        AttemptState::Started,
        AttemptState::Succeeded,
        AttemptState::Failed,
        AttemptState::Unknown,
        AttemptState::Discarded,
        AttemptState::Cancelled,
    ];

    /// Its outcome is unknown until the reconciler, a late answer or an
    /// admin settles it.
    pub fn awaits_settlement(self) -> bool {
        self == AttemptState::Unknown
    }
}

impl Job {
    /// The job is parked until an attempt whose outcome is not known is
    /// settled (`blocked_on: "unknown_attempt"`). The engine parks a job by
    /// clearing `next_run_at` — only while one of its attempts is live, and
    /// only when no provider is left that it may try (invariant 4) — and a
    /// settlement that leaves nothing live makes it runnable again in the
    /// same commit. So a job that takes attempts and has no `next_run_at`
    /// is blocked, and this is the one definition of it.
    pub fn is_blocked_on_unknown(&self) -> bool {
        self.state.takes_attempts() && self.next_run_at.is_none()
    }
}

/// The SQL list of the job states that take attempts (`takes_attempts`).
#[macro_export]
macro_rules! job_states_taking_attempts {
    () => {
        "'pending', 'running'"
    };
}

/// The SQL list of the attempt states that are live (`is_live`): started,
/// or unknown and awaiting settlement.
#[macro_export]
macro_rules! attempt_states_live {
    () => {
        "'started', 'unknown'"
    };
}

/// The SQL list of the attempt states that may still become `succeeded`
/// (`may_become(Succeeded)`): a late answer of an unknown attempt wins too.
#[macro_export]
macro_rules! attempt_states_that_may_succeed {
    () => {
        "'started', 'unknown'"
    };
}

/// The SQL list of the job states settled for good (`is_settled_for_good`).
#[macro_export]
macro_rules! job_states_settled_for_good {
    () => {
        "'succeeded', 'cancelled'"
    };
}

/// The SQL value of the job state that awaits a decision (`awaits_decision`).
#[macro_export]
macro_rules! job_state_awaiting_decision {
    () => {
        "'needs_review'"
    };
}

/// The SQL value of the attempt state that awaits settlement.
#[macro_export]
macro_rules! attempt_state_awaiting_settlement {
    () => {
        "'unknown'"
    };
}

/// The SQL list of the states for which `holds` is true, as the macros above
/// spell them.
pub fn sql_list<S: Copy>(
    all: &[S],
    holds: impl Fn(S) -> bool,
    name: impl Fn(S) -> &'static str,
) -> String {
    all.iter()
        .copied()
        .filter(|s| holds(*s))
        .map(|s| format!("'{}'", name(s)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(holds: impl Fn(JobState) -> bool) -> String {
        sql_list(&JobState::ALL, holds, JobState::as_str)
    }

    fn attempts(holds: impl Fn(AttemptState) -> bool) -> String {
        sql_list(&AttemptState::ALL, holds, AttemptState::as_str)
    }

    #[test]
    fn every_sql_state_list_is_its_predicate() {
        assert_eq!(
            job_states_taking_attempts!(),
            jobs(JobState::takes_attempts)
        );
        assert_eq!(
            job_state_awaiting_decision!(),
            jobs(JobState::awaits_decision)
        );
        assert_eq!(
            job_states_settled_for_good!(),
            jobs(JobState::is_settled_for_good)
        );
        assert_eq!(attempt_states_live!(), attempts(AttemptState::is_live));
        assert_eq!(
            attempt_states_that_may_succeed!(),
            attempts(|s| s.may_become(AttemptState::Succeeded))
        );
        assert_eq!(
            attempt_state_awaiting_settlement!(),
            attempts(AttemptState::awaits_settlement)
        );
    }

    #[test]
    fn every_state_is_listed_once_and_parses_back() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
            assert_eq!(JobState::ALL.iter().filter(|t| **t == s).count(), 1);
        }
        for s in AttemptState::ALL {
            assert_eq!(AttemptState::parse(s.as_str()), Some(s));
            assert_eq!(AttemptState::ALL.iter().filter(|t| **t == s).count(), 1);
        }
    }

    #[test]
    fn the_predicates_partition_the_job_states_as_the_design_says() {
        for s in JobState::ALL {
            // A job is driven, waits for a human, or is final: exactly one.
            let roles = [s.takes_attempts(), s.awaits_decision(), s.is_final()];
            assert_eq!(roles.iter().filter(|r| **r).count(), 1, "{s:?}");
            // What takes attempts or waits for a human may still be retried.
            if !s.is_final() {
                assert!(s.accepts_retry(), "{s:?}");
                assert!(s.accepts_cancel(), "{s:?}");
            }
        }
        for s in JobState::ALL {
            // What nothing changes any more is final and takes no retry.
            if s.is_settled_for_good() {
                assert!(s.is_final() && !s.accepts_retry(), "{s:?}");
            }
        }
        assert!(JobState::Failed.accepts_retry());
        assert!(!JobState::Succeeded.accepts_retry());
        assert!(!JobState::Cancelled.accepts_retry());
    }

    #[test]
    fn only_live_attempts_move_and_only_unknown_ones_await_settlement() {
        for s in AttemptState::ALL {
            let moves = AttemptState::ALL.iter().any(|t| s.may_become(*t));
            assert_eq!(moves, s.is_live(), "{s:?}");
            assert!(!s.awaits_settlement() || s.is_live(), "{s:?}");
        }
    }
}
