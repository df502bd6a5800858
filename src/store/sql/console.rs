//! Read-only queries behind the ops console and `/metrics`; the types and
//! helpers are in `store::console`.

use crate::domain::{Job, Millis};
use crate::store::console::{
    key_prefix_bounds, tally_rows, whole_hours, AttemptTally, JobFilter, WindowStats,
};
use crate::store::rows::JobRow;
use crate::store::sql::db::{args, Db, IntoArg};
use crate::store::sql::Dialect;
use crate::store::StoreError;

pub(crate) async fn review_queue_depth(conn: &mut impl Db) -> Result<i64, StoreError> {
    let (n,): (i64,) = conn
        .fetch_one(
            concat!(
                "SELECT COUNT(*) FROM jobs WHERE state = ",
                crate::job_state_awaiting_decision!()
            ),
            args![],
        )
        .await?;
    Ok(n)
}

/// The console's job list: its head, the key clause (empty, or one of the
/// dialect's), its tail; `$1`..`$9` the filter, `$10`/`$11` a key prefix's
/// bounds.
macro_rules! list_jobs_sql {
    ($key_clause:expr) => {
        concat!(
            "SELECT ",
            $crate::store::rows::job_columns!(),
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
pub(crate) use list_jobs_sql;

/// The list without a key prefix, the same in both dialects.
const LIST_JOBS: &str = list_jobs_sql!("");

pub(crate) async fn list_jobs<C: Db>(
    conn: &mut C,
    filter: &JobFilter,
    limit: i64,
) -> Result<Vec<Job>, StoreError> {
    // No cursor is the cursor past the newest job, so the row-value
    // comparison always applies and the (created_at, id) index serves it.
    let (before_at, before_id) = filter.before.clone().unwrap_or((i64::MAX, String::new()));
    let bounds = filter.key_prefix.as_deref().map(key_prefix_bounds);
    let sql = match &bounds {
        None => LIST_JOBS,
        Some((low, high)) => {
            // A prefix few keys have is read by key, then sorted; one
            // that most keys have ("order-") is read newest first and
            // filtered, so neither reads the whole table to sort it.
            let (few,): (i64,) = conn
                .fetch_one(C::Sql::KEY_PREFIX_FEW, args![low, high])
                .await?;
            if few < 2000 {
                C::Sql::LIST_JOBS_BY_KEY
            } else {
                C::Sql::LIST_JOBS_SCANNING_KEYS
            }
        }
    };
    let mut args = vec![
        before_at.arg(),
        before_id.as_str().arg(),
        filter.state.as_deref().arg(),
        filter.route.as_deref().arg(),
        filter.owner.as_deref().arg(),
        filter.created_from.arg(),
        filter.created_to.arg(),
        filter.provider.as_deref().arg(),
        limit.arg(),
    ];
    if let Some((low, high)) = &bounds {
        args.extend([low.as_str().arg(), high.as_str().arg()]);
    }
    let rows: Vec<JobRow> = conn.fetch_all(sql, &args).await?;
    rows.into_iter().map(Job::try_from).collect()
}

/// Jobs are counted per (column, state) as index ranges over
/// `jobs (state, created_at)`: no sort, so a week of jobs costs a few
/// milliseconds. Attempts come from `attempt_hours` (migration 0007)
/// for the window's whole hours and from `attempts` for the rest.
pub(crate) async fn window_stats(
    conn: &mut impl Db,
    from: Millis,
    to: Millis,
    column_ms: i64,
) -> Result<WindowStats, StoreError> {
    let column_ms = column_ms.max(1);
    let columns = ((to - from) + column_ms - 1) / column_ms;
    let mut jobs_by_column = Vec::new();
    for state in crate::domain::JobState::ALL {
        let cells: Vec<(i64, i64)> = conn
            .fetch_all(
                "WITH RECURSIVE c(i) AS (SELECT CAST(0 AS BIGINT) \
             UNION ALL SELECT i + 1 FROM c WHERE i + 1 < $3) \
             SELECT c.i, (SELECT COUNT(*) FROM jobs WHERE state = $4 \
               AND created_at >= $1 + c.i * $2 AND created_at < $1 + (c.i + 1) * $2) FROM c",
                args![from, column_ms, columns, state.as_str()],
            )
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
    type Raw = (String, String, String, i64, Option<String>);
    match whole_hours(from, to) {
        None => {
            tally_rows(
                &mut tallies,
                conn.fetch_all::<Raw>(raw_sql, args![from, to]).await?,
            );
        }
        Some((first, last)) => {
            let (mid_from, mid_to) = (first * 3_600_000, last * 3_600_000);
            tally_rows(
                &mut tallies,
                conn.fetch_all::<Raw>(raw_sql, args![from, mid_from])
                    .await?,
            );
            tally_rows(
                &mut tallies,
                conn.fetch_all::<Raw>(raw_sql, args![mid_to, to]).await?,
            );
            let ended: Vec<(String, String, String, i64, i64, i64)> = conn
                .fetch_all(
                    "SELECT provider, kind, state, latency_le, CAST(SUM(attempts) AS BIGINT), \
                 CAST(SUM(discarded_tokens) AS BIGINT) FROM attempt_hours \
                 WHERE hour >= $1 AND hour < $2 GROUP BY provider, kind, state, latency_le",
                    args![first, last],
                )
                .await?;
            // Not ended yet, so not in attempt_hours: counted from the
            // partial indexes on started and unknown attempts.
            let live: Vec<(String, String, String, i64)> = conn
                .fetch_all(
                    "SELECT provider, kind, state, COUNT(*) FROM attempts \
                 WHERE state = 'started' AND started_at >= $1 AND started_at < $2 \
                 GROUP BY provider, kind, state \
                 UNION ALL \
                 SELECT provider, kind, state, COUNT(*) FROM attempts \
                 WHERE state = 'unknown' AND started_at >= $1 AND started_at < $2 \
                 GROUP BY provider, kind, state",
                    args![mid_from, mid_to],
                )
                .await?;
            for (provider, kind, state, le, n, tokens) in ended {
                let entry = tallies.entry((provider, kind, state, le)).or_insert((0, 0));
                entry.0 += n;
                entry.1 += tokens;
            }
            for (provider, kind, state, n) in live {
                tallies
                    .entry((provider, kind, state, 0))
                    .or_insert((0, 0))
                    .0 += n;
            }
        }
    }
    let attempts = tallies
        .into_iter()
        .map(
            |((provider, kind, state, latency_le), (attempts, discarded_tokens))| AttemptTally {
                provider,
                kind,
                state,
                latency_le,
                attempts,
                discarded_tokens,
            },
        )
        .collect();
    let jobs = jobs_by_column.iter().map(|(_, _, n)| n).sum();
    Ok(WindowStats {
        jobs_by_column,
        attempts,
        jobs,
        review_depth: review_queue_depth(conn).await?,
    })
}
