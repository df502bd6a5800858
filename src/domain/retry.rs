//! Retry timing: exponential backoff with full jitter, never sooner than the
//! provider's `Retry-After`.

use rand::Rng;
use std::time::Duration;

/// The wait before retry number `retry` (1 for the first retry): a uniform
/// draw from `[0, min(cap, base * 2^(retry-1))]` ("full jitter"), raised to
/// `retry_after` when the provider asked for more.
pub fn backoff(
    base: Duration,
    cap: Duration,
    retry: u32,
    retry_after: Option<Duration>,
    rng: &mut impl Rng,
) -> Duration {
    let exp = retry.saturating_sub(1).min(30);
    let ceiling = base.saturating_mul(1u32 << exp).min(cap);
    let ceiling_ms = ceiling.as_millis() as u64;
    let jittered = Duration::from_millis(if ceiling_ms == 0 {
        0
    } else {
        rng.gen_range(0..=ceiling_ms)
    });
    match retry_after {
        Some(wanted) if wanted > jittered => wanted,
        _ => jittered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_stays_under_the_exponential_ceiling_and_the_cap() {
        let mut rng = StdRng::seed_from_u64(7);
        let (base, cap) = (Duration::from_millis(100), Duration::from_millis(1_000));
        for retry in 1..=10 {
            for _ in 0..200 {
                let wait = backoff(base, cap, retry, None, &mut rng);
                let ceiling = (100u64 << (retry - 1)).min(1_000);
                assert!(
                    wait <= Duration::from_millis(ceiling),
                    "retry {retry}: {wait:?}"
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let mut rng = StdRng::seed_from_u64(1);
        let waits: std::collections::HashSet<_> = (0..50)
            .map(|_| {
                backoff(
                    Duration::from_millis(1000),
                    Duration::from_secs(10),
                    3,
                    None,
                    &mut rng,
                )
            })
            .collect();
        assert!(waits.len() > 40, "full jitter, not a fixed delay");
    }

    #[test]
    fn retry_after_is_a_floor() {
        let mut rng = StdRng::seed_from_u64(3);
        let wait = backoff(
            Duration::from_millis(10),
            Duration::from_millis(20),
            1,
            Some(Duration::from_secs(2)),
            &mut rng,
        );
        assert_eq!(wait, Duration::from_secs(2));
    }
}
