//! The token bucket that enforces a request rate in this process. The
//! limits themselves (per owner, per key, merged level over level) are
//! [`crate::domain::limits`], re-exported here.

pub use crate::domain::limits::{Limits, LimitsConfig};
use std::collections::HashMap;
use std::time::Instant;

/// A token bucket: `capacity` tokens, refilled at `rate` per second.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The request-rate buckets of this process, one per owner.
#[derive(Debug, Default)]
pub struct RateBuckets {
    buckets: std::sync::Mutex<HashMap<String, Bucket>>,
}

impl RateBuckets {
    /// Take one token of `owner`'s bucket; `Err(wait)` with how long until
    /// one is available when it is empty.
    pub fn take(
        &self,
        owner: &str,
        rate: f64,
        capacity: f64,
        now: Instant,
    ) -> Result<(), std::time::Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > 100_000 {
            // Full buckets carry no information; forget them all rather
            // than grow without bound.
            buckets.clear();
        }
        let bucket = match buckets.get_mut(owner) {
            Some(b) => b,
            None => buckets.entry(owner.to_string()).or_insert(Bucket {
                tokens: capacity,
                at: now,
            }),
        };
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        // A rate stored before `Limits::check` bounded it could put the
        // next token further off than a `Duration` reaches: say a day.
        let day = std::time::Duration::from_secs(86_400);
        Err(
            std::time::Duration::try_from_secs_f64((1.0 - bucket.tokens) / rate)
                .map_or(day, |wait| wait.min(day)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_rate_too_small_to_wait_for_asks_for_a_day_not_a_panic() {
        let buckets = RateBuckets::default();
        let t0 = Instant::now();
        assert!(buckets.take("a", 1e-300, 1.0, t0).is_ok());
        assert_eq!(
            buckets.take("a", 1e-300, 1.0, t0).unwrap_err(),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            buckets.take("a", 1e-19, 1.0, t0).unwrap_err(),
            Duration::from_secs(86_400)
        );
    }

    #[test]
    fn a_bucket_lets_the_burst_through_then_refills_at_the_rate() {
        let buckets = RateBuckets::default();
        let t0 = Instant::now();
        assert!(buckets.take("a", 2.0, 3.0, t0).is_ok());
        assert!(buckets.take("a", 2.0, 3.0, t0).is_ok());
        assert!(buckets.take("a", 2.0, 3.0, t0).is_ok());
        let wait = buckets.take("a", 2.0, 3.0, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another owner has a bucket of its own.
        assert!(buckets.take("b", 2.0, 3.0, t0).is_ok());
        assert!(buckets
            .take("a", 2.0, 3.0, t0 + Duration::from_millis(499))
            .is_err());
        assert!(buckets
            .take("a", 2.0, 3.0, t0 + Duration::from_millis(1000))
            .is_ok());
    }
}
