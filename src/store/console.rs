//! The types of the read-only queries behind the ops console and
//! `/metrics`: the filtered job list (keyset-paged, newest first) and the
//! overview's aggregates over a time window. Their SQL is in `sql/console.rs`;
//! every query reads index ranges, not the table, so the pages stay fast at
//! 100k+ jobs (`examples/console_bench.rs`): the indexes a job writes anyway
//! and `jobs_by_state_created` (SQLite's migration 0015, PostgreSQL's 0014),
//! with none kept for the console alone on the job's path but that one and
//! `attempts_by_started`.

use crate::domain::Job;
use crate::domain::{Millis, OwnerId};
use crate::store::StoreError;
use async_trait::async_trait;

/// Which jobs the console lists. `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<String>,
    pub route: Option<String>,
    /// Jobs with at least one attempt on this provider.
    pub provider: Option<String>,
    pub owner: Option<OwnerId>,
    /// `created_at >= from`.
    pub created_from: Option<Millis>,
    /// `created_at < to`.
    pub created_to: Option<Millis>,
    /// The start of the idempotency key (a whole key is its own prefix).
    pub key_prefix: Option<String>,
    /// Keyset cursor: only jobs strictly older than `(created_at, id)`.
    pub before: Option<(Millis, String)>,
}

/// Attempts of one (provider, kind, state, latency bucket) in a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptTally {
    pub provider: String,
    pub kind: String,
    pub state: String,
    /// The latency bucket's upper bound in ms (see [`latency_bounds`]) of a
    /// succeeded attempt; 0 for every other state.
    pub latency_le: i64,
    pub attempts: i64,
    /// Prompt + completion tokens of discarded attempts.
    pub discarded_tokens: i64,
}

/// Aggregates of one time window; the console turns them into charts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowStats {
    /// (column, job state, jobs created in that column); column `i` is
    /// `[from + i * column_ms, from + (i + 1) * column_ms)`.
    pub jobs_by_column: Vec<(i64, String, i64)>,
    /// Attempts started in the window, summed by provider, kind, state and
    /// latency bucket.
    pub attempts: Vec<AttemptTally>,
    pub jobs: i64,
    pub review_depth: i64,
}

impl WindowStats {
    pub fn hedges(&self) -> i64 {
        self.tally(|t| t.kind == "hedge")
    }

    /// Hedge attempts whose result won the job: an attempt is `succeeded`
    /// only when its result won the CAS (invariant 5); a late one is
    /// `discarded`.
    pub fn hedge_wins(&self) -> i64 {
        self.tally(|t| t.kind == "hedge" && t.state == "succeeded")
    }

    fn tally(&self, pick: impl Fn(&AttemptTally) -> bool) -> i64 {
        self.attempts
            .iter()
            .filter(|t| pick(t))
            .map(|t| t.attempts)
            .sum()
    }
}

/// The latency buckets' upper bounds in ms, as migration 0007 writes them
/// into `latency_buckets`: 1..=10, then each 10% above the last (rounded
/// up) up to an hour, then one bucket for the rest.
pub fn latency_bounds() -> &'static [i64] {
    static BOUNDS: std::sync::OnceLock<Vec<i64>> = std::sync::OnceLock::new();
    BOUNDS.get_or_init(|| {
        let mut out = vec![1];
        let mut le = 1i64;
        while le < 3_600_000 {
            le = if le < 10 { le + 1 } else { (le * 11 + 9) / 10 };
            out.push(le);
        }
        out.push(i64::MAX);
        out
    })
}

/// The `p`th percentile (nearest rank, 0 < p <= 100) of a latency histogram
/// of `(bucket upper bound, count)`, interpolated linearly inside its
/// bucket; within one bucket's width (10%) of the exact value. 0 when empty.
pub fn histogram_percentile(histogram: &[(i64, i64)], p: f64) -> i64 {
    let mut sorted: Vec<(i64, i64)> = histogram.iter().copied().filter(|(_, n)| *n > 0).collect();
    sorted.sort_unstable();
    let total: i64 = sorted.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return 0;
    }
    let rank = (((p / 100.0) * total as f64).ceil() as i64).clamp(1, total);
    let bounds = latency_bounds();
    let mut below = 0;
    for (le, n) in sorted {
        if below + n >= rank {
            let lower = match bounds.binary_search(&le) {
                Ok(i) if i > 0 => bounds[i - 1],
                _ => (le - 1).max(0),
            };
            if le == i64::MAX {
                return lower;
            }
            // The bucket is (lower, le]: its n values spread evenly over it.
            let inside = (rank - below) as f64 / n as f64;
            return lower + ((le - lower) as f64 * inside).ceil() as i64;
        }
        below += n;
    }
    0
}

/// How a window `[from, to)` splits for the attempt aggregates: the whole
/// hours inside it come from `attempt_hours`; the parts before the first
/// and after the last whole hour are read from `attempts` themselves.
/// `None` when no whole hour fits.
pub(crate) fn whole_hours(from: Millis, to: Millis) -> Option<(i64, i64)> {
    const HOUR: i64 = 3_600_000;
    let first = from.div_euclid(HOUR) + i64::from(from.rem_euclid(HOUR) != 0);
    let last = to.div_euclid(HOUR);
    (first < last).then_some((first, last))
}

/// Adds the attempts read from `attempts` rows to the tallies.
pub(crate) fn tally_rows(
    into: &mut std::collections::BTreeMap<(String, String, String, i64), (i64, i64)>,
    rows: Vec<(String, String, String, i64, Option<String>)>,
) {
    for (provider, kind, state, latency_le, usage) in rows {
        let tokens = usage
            .and_then(|u| serde_json::from_str::<serde_json::Value>(&u).ok())
            .map(|u| {
                u["prompt_tokens"].as_i64().unwrap_or(0)
                    + u["completion_tokens"].as_i64().unwrap_or(0)
            })
            .unwrap_or(0);
        let entry = into.entry((provider, kind, state, latency_le)).or_default();
        entry.0 += 1;
        entry.1 += tokens;
    }
}

/// The range `[low, high)` of keys that start with `prefix`, in byte order
/// (UTF-8): no key that starts with it sorts at or past `prefix` + U+10FFFF.
pub(crate) fn key_prefix_bounds(prefix: &str) -> (String, String) {
    (prefix.to_string(), format!("{prefix}{}", char::MAX))
}

#[async_trait]
pub trait ConsoleStore: Send + Sync {
    /// Jobs waiting for a human.
    async fn review_queue_depth(&self) -> Result<i64, StoreError>;

    /// Jobs matching `filter`, newest first, at most `limit`.
    async fn list_jobs(&self, filter: &JobFilter, limit: i64) -> Result<Vec<Job>, StoreError>;

    /// Aggregates of jobs created and attempts started in `[from, to)`,
    /// jobs counted in columns `column_ms` wide from `from`.
    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<WindowStats, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_holds_its_keys_and_no_other() {
        let (low, high) = key_prefix_bounds("order-42");
        for inside in ["order-42", "order-420", "order-42\u{10fffe}", "order-42~é"] {
            assert!(low.as_str() <= inside && inside < high.as_str(), "{inside}");
        }
        for outside in ["order-4", "order-41z", "order-43", "order-5"] {
            assert!(
                !(low.as_str() <= outside && outside < high.as_str()),
                "{outside}"
            );
        }
    }

    #[test]
    fn latency_buckets_are_about_ten_percent_wide() {
        let b = latency_bounds();
        assert_eq!(&b[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13]);
        assert_eq!(b.len(), 142, "as many as migration 0007 writes");
        for w in b[10..b.len() - 1].windows(2) {
            assert!(
                w[1] > w[0] && (w[1] - w[0]) as f64 <= w[0] as f64 * 0.1 + 1.0,
                "{w:?}"
            );
        }
    }

    #[test]
    fn histogram_percentiles_are_within_a_bucket_of_the_exact_ones() {
        // Latencies 100..=999 ms, each once; exact nearest-rank p50 = 549, p99 = 990.
        let mut histogram = std::collections::BTreeMap::new();
        for ms in 100..=999i64 {
            let le = *latency_bounds().iter().find(|le| **le >= ms).unwrap();
            *histogram.entry(le).or_insert(0) += 1;
        }
        let histogram: Vec<(i64, i64)> = histogram.into_iter().collect();
        for (p, exact) in [(50.0, 549.0), (99.0, 990.0)] {
            let got = histogram_percentile(&histogram, p) as f64;
            assert!((got - exact).abs() <= exact * 0.1, "p{p}: {got} vs {exact}");
        }
        assert_eq!(histogram_percentile(&[(7, 1)], 99.0), 7);
        assert_eq!(histogram_percentile(&[], 50.0), 0);
    }

    #[test]
    fn the_rollup_counts_an_attempt_when_it_reaches_a_state_it_never_leaves() {
        use crate::domain::AttemptState;
        let last: Vec<String> = AttemptState::ALL
            .iter()
            .filter(|s| !AttemptState::ALL.iter().any(|t| s.may_become(*t)))
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        let list = format!("({})", last.join(", "));
        for migration in [
            include_str!("../../migrations/sqlite/0007_console_rollup.sql"),
            include_str!("../../migrations/postgres/0007_console_rollup.sql"),
        ] {
            assert!(migration.matches(&list).count() >= 3, "{list}");
        }
    }

    #[test]
    fn only_whole_hours_inside_the_window_come_from_the_rollup() {
        const H: i64 = 3_600_000;
        assert_eq!(whole_hours(H + 60_000, 2 * H + 60_000), None);
        assert_eq!(whole_hours(H, 2 * H), Some((1, 2)));
        assert_eq!(whole_hours(H - 1, 3 * H + 1), Some((1, 3)));
    }
}
