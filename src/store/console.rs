//! Read-only queries behind the ops console and `/metrics`: the filtered job
//! list (keyset-paged, newest first) and the overview's aggregates over a
//! time window. Written once for both backends like `ops.rs`; every query is
//! served by an index of migration 0006 so the pages stay fast at 100k+ jobs.

use crate::domain::Millis;

/// Which jobs the console lists. `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<String>,
    pub route: Option<String>,
    /// Jobs with at least one attempt on this provider.
    pub provider: Option<String>,
    pub owner: Option<String>,
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

macro_rules! console_ops {
    // `$key_indexed`: the key column as its index (jobs_by_key) compares it,
    // in byte order; `$key_unindexed`: the same comparison kept off that index.
    ($conn:ty, $key_indexed:literal, $key_unindexed:literal) => {
        use crate::store::console::{
            key_prefix_bounds, tally_rows, whole_hours, AttemptTally, JobFilter, WindowStats,
        };

        pub(crate) async fn review_queue_depth(conn: &mut $conn) -> Result<i64, StoreError> {
            let (n,): (i64,) = sqlx::query_as(concat!(
                "SELECT COUNT(*) FROM jobs WHERE state = ",
                crate::job_state_awaiting_decision!()
            ))
                .fetch_one(&mut *conn)
                .await?;
            Ok(n)
        }

        pub(crate) async fn list_jobs(
            conn: &mut $conn,
            filter: &JobFilter,
            limit: i64,
        ) -> Result<Vec<Job>, StoreError> {
            // No cursor is the cursor past the newest job, so the row-value
            // comparison always applies and the (created_at, id) index serves it.
            let (before_at, before_id) = filter
                .before
                .clone()
                .unwrap_or((i64::MAX, String::new()));
            macro_rules! list_jobs_sql {
                ($key_clause:expr) => {
                    concat!(
                        "SELECT ",
                        job_columns!(),
                        " FROM jobs WHERE (created_at, id) < ($1, $2) ",
                        "AND ($3 IS NULL OR state = $3) ",
                        "AND ($4 IS NULL OR route = $4) ",
                        "AND ($5 IS NULL OR owner_id = $5) ",
                        "AND ($6 IS NULL OR created_at >= $6) ",
                        "AND ($7 IS NULL OR created_at < $7) ",
                        "AND ($8 IS NULL OR EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.provider = $8)) ",
                        $key_clause,
                        " ORDER BY created_at DESC, id DESC LIMIT $9"
                    )
                };
            }
            let bounds = filter.key_prefix.as_deref().map(key_prefix_bounds);
            let sql = match &bounds {
                None => list_jobs_sql!(""),
                Some((low, high)) => {
                    // A prefix few keys have is read by key, then sorted; one
                    // that most keys have ("order-") is read newest first and
                    // filtered, so neither reads the whole table to sort it.
                    let (few,): (i64,) = sqlx::query_as(concat!(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE ",
                        $key_indexed,
                        " >= $1 AND ",
                        $key_indexed,
                        " < $2 LIMIT 2000) matching"
                    ))
                    .bind(low)
                    .bind(high)
                    .fetch_one(&mut *conn)
                    .await?;
                    if few < 2000 {
                        list_jobs_sql!(concat!("AND ", $key_indexed, " >= $10 AND ", $key_indexed, " < $11"))
                    } else {
                        list_jobs_sql!(concat!("AND ", $key_unindexed, " >= $10 AND ", $key_unindexed, " < $11"))
                    }
                }
            };
            let mut query = sqlx::query_as::<_, JobRow>(sql)
                .bind(before_at)
                .bind(before_id)
                .bind(filter.state.as_deref())
                .bind(filter.route.as_deref())
                .bind(filter.owner.as_deref())
                .bind(filter.created_from)
                .bind(filter.created_to)
                .bind(filter.provider.as_deref())
                .bind(limit);
            if let Some((low, high)) = &bounds {
                query = query.bind(low.as_str()).bind(high.as_str());
            }
            let rows = query.fetch_all(&mut *conn).await?;
            rows.into_iter().map(Job::try_from).collect()
        }

        /// Jobs are counted per (column, state) as index ranges over
        /// `jobs (state, created_at)`: no sort, so a week of jobs costs a few
        /// milliseconds. Attempts come from `attempt_hours` (migration 0007)
        /// for the window's whole hours and from `attempts` for the rest.
        pub(crate) async fn window_stats(
            conn: &mut $conn,
            from: Millis,
            to: Millis,
            column_ms: i64,
        ) -> Result<WindowStats, StoreError> {
            let column_ms = column_ms.max(1);
            let columns = ((to - from) + column_ms - 1) / column_ms;
            let mut jobs_by_column = Vec::new();
            for state in crate::domain::JobState::ALL {
                let cells: Vec<(i64, i64)> = sqlx::query_as(
                    "WITH RECURSIVE c(i) AS (SELECT CAST(0 AS BIGINT) UNION ALL SELECT i + 1 FROM c WHERE i + 1 < $3) \
                     SELECT c.i, (SELECT COUNT(*) FROM jobs WHERE state = $4 \
                       AND created_at >= $1 + c.i * $2 AND created_at < $1 + (c.i + 1) * $2) FROM c",
                )
                .bind(from)
                .bind(column_ms)
                .bind(columns)
                .bind(state.as_str())
                .fetch_all(&mut *conn)
                .await?;
                jobs_by_column.extend(
                    cells
                        .into_iter()
                        .filter(|(_, n)| *n > 0)
                        .map(|(i, n)| (i, state.as_str().to_string(), n)),
                );
            }
            jobs_by_column.sort();

            let mut tallies = std::collections::BTreeMap::new();
            let raw_sql = "SELECT provider, kind, state, \
                 CASE WHEN state = 'succeeded' THEN COALESCE((SELECT MIN(le) FROM latency_buckets \
                   WHERE le >= finished_at - started_at), 0) ELSE 0 END, \
                 CASE WHEN state = 'discarded' THEN usage END \
                 FROM attempts WHERE started_at >= $1 AND started_at < $2";
            let raw = |lo: Millis, hi: Millis| {
                sqlx::query_as::<_, (String, String, String, i64, Option<String>)>(raw_sql)
                    .bind(lo)
                    .bind(hi)
            };
            match whole_hours(from, to) {
                None => {
                    tally_rows(&mut tallies, raw(from, to).fetch_all(&mut *conn).await?);
                }
                Some((first, last)) => {
                    let (mid_from, mid_to) = (first * 3_600_000, last * 3_600_000);
                    tally_rows(&mut tallies, raw(from, mid_from).fetch_all(&mut *conn).await?);
                    tally_rows(&mut tallies, raw(mid_to, to).fetch_all(&mut *conn).await?);
                    let ended: Vec<(String, String, String, i64, i64, i64)> = sqlx::query_as(
                        "SELECT provider, kind, state, latency_le, CAST(SUM(attempts) AS BIGINT), \
                         CAST(SUM(discarded_tokens) AS BIGINT) FROM attempt_hours \
                         WHERE hour >= $1 AND hour < $2 GROUP BY provider, kind, state, latency_le",
                    )
                    .bind(first)
                    .bind(last)
                    .fetch_all(&mut *conn)
                    .await?;
                    // Not ended yet, so not in attempt_hours: counted from the
                    // partial indexes on started and unknown attempts.
                    let live: Vec<(String, String, String, i64)> = sqlx::query_as(
                        "SELECT provider, kind, state, COUNT(*) FROM attempts \
                         WHERE state = 'started' AND started_at >= $1 AND started_at < $2 \
                         GROUP BY provider, kind, state \
                         UNION ALL \
                         SELECT provider, kind, state, COUNT(*) FROM attempts \
                         WHERE state = 'unknown' AND started_at >= $1 AND started_at < $2 \
                         GROUP BY provider, kind, state",
                    )
                    .bind(mid_from)
                    .bind(mid_to)
                    .fetch_all(&mut *conn)
                    .await?;
                    for (provider, kind, state, le, n, tokens) in ended {
                        let entry = tallies.entry((provider, kind, state, le)).or_insert((0, 0));
                        entry.0 += n;
                        entry.1 += tokens;
                    }
                    for (provider, kind, state, n) in live {
                        tallies.entry((provider, kind, state, 0)).or_insert((0, 0)).0 += n;
                    }
                }
            }
            let attempts = tallies
                .into_iter()
                .map(|((provider, kind, state, latency_le), (attempts, discarded_tokens))| AttemptTally {
                    provider,
                    kind,
                    state,
                    latency_le,
                    attempts,
                    discarded_tokens,
                })
                .collect();
            let jobs = jobs_by_column.iter().map(|(_, _, n)| n).sum();
            Ok(WindowStats {
                jobs_by_column,
                attempts,
                jobs,
                review_depth: review_queue_depth(conn).await?,
            })
        }
    };
}

pub(crate) use console_ops;

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
