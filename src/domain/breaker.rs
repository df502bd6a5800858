//! A per-provider circuit breaker. Closed: every job may start on the
//! provider. After `threshold` consecutive retryable failures it opens: new
//! jobs start elsewhere. After `open_for` it lets one job in `probe_every`
//! through as a probe (half-open); a success closes it, a failure opens it
//! again. Time is passed in, so the breaker is pure.

use super::Millis;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    pub threshold: u32,
    pub open_for_ms: Millis,
    pub probe_every: u32,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            threshold: 5,
            open_for_ms: 5_000,
            probe_every: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum BreakerState {
    Closed { consecutive_failures: u32 },
    Open { until: Millis },
    HalfOpen { skipped: u32 },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    policy: BreakerPolicy,
    state: BreakerState,
    /// How many times it opened, for metrics.
    pub trips: u64,
}

impl Breaker {
    pub fn new(policy: BreakerPolicy) -> Self {
        Breaker {
            policy,
            state: BreakerState::Closed {
                consecutive_failures: 0,
            },
            trips: 0,
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// May a new job's first attempt go to this provider now? While half-open,
    /// one call in `probe_every` is let through as a probe.
    pub fn admits_first_attempt(&mut self, now: Millis) -> bool {
        match self.state {
            BreakerState::Closed { .. } => true,
            BreakerState::Open { until } if now < until => false,
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen { skipped: 0 };
                true
            }
            BreakerState::HalfOpen { skipped } => {
                if skipped + 1 >= self.policy.probe_every {
                    self.state = BreakerState::HalfOpen { skipped: 0 };
                    true
                } else {
                    self.state = BreakerState::HalfOpen {
                        skipped: skipped + 1,
                    };
                    false
                }
            }
        }
    }

    pub fn on_success(&mut self) {
        self.state = BreakerState::Closed {
            consecutive_failures: 0,
        };
    }

    /// A retryable failure (429, 5xx, connect): the provider is struggling.
    pub fn on_retryable_failure(&mut self, now: Millis) {
        self.state = match self.state {
            BreakerState::Closed {
                consecutive_failures,
            } if consecutive_failures + 1 < self.policy.threshold => BreakerState::Closed {
                consecutive_failures: consecutive_failures + 1,
            },
            BreakerState::Open { until } => BreakerState::Open { until },
            _ => {
                self.trips += 1;
                BreakerState::Open {
                    until: now + self.policy.open_for_ms,
                }
            }
        };
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, BreakerState::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            threshold: 3,
            open_for_ms: 1_000,
            probe_every: 4,
        }
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let mut b = Breaker::new(policy());
        b.on_retryable_failure(0);
        b.on_retryable_failure(0);
        assert!(b.admits_first_attempt(0));
        b.on_retryable_failure(0);
        assert!(!b.admits_first_attempt(10));
        assert_eq!(b.trips, 1);
    }

    #[test]
    fn a_success_resets_the_count() {
        let mut b = Breaker::new(policy());
        b.on_retryable_failure(0);
        b.on_retryable_failure(0);
        b.on_success();
        b.on_retryable_failure(0);
        assert!(b.is_closed());
    }

    #[test]
    fn half_open_probes_a_share_then_closes_on_success() {
        let mut b = Breaker::new(policy());
        for _ in 0..3 {
            b.on_retryable_failure(0);
        }
        assert!(!b.admits_first_attempt(999));
        assert!(
            b.admits_first_attempt(1_000),
            "the first call after the pause probes"
        );
        let admitted = (0..8).filter(|_| b.admits_first_attempt(1_001)).count();
        assert_eq!(admitted, 2, "one in probe_every");
        b.on_success();
        assert!(b.admits_first_attempt(1_002));
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let mut b = Breaker::new(policy());
        for _ in 0..3 {
            b.on_retryable_failure(0);
        }
        assert!(b.admits_first_attempt(1_000));
        b.on_retryable_failure(1_000);
        assert!(!b.admits_first_attempt(1_500));
        assert_eq!(b.trips, 2);
    }
}
