//! Read-only queries behind the ops console and `/metrics`; the types and
//! helpers are in `store::console`.

use super::Conn;
use crate::domain::{Job, Millis};
use crate::store::console::{
    key_prefix_bounds, tally_rows, whole_hours, AttemptTally, JobFilter, WindowStats,
};
use crate::store::rows::{job_columns, JobRow};
use crate::store::StoreError;

pub(crate) async fn review_queue_depth(conn: &mut Conn) -> Result<i64, StoreError> {
    let (n,): (i64,) = sqlx::query_as(concat!(
        "SELECT COUNT(*) FROM jobs WHERE state = ",
        crate::job_state_awaiting_decision!()
    ))
    .fetch_one(&mut *conn)
    .await?;
    Ok(n)
}

pub(crate) async fn list_jobs(
    conn: &mut Conn,
    filter: &JobFilter,
    limit: i64,
) -> Result<Vec<Job>, StoreError> {
    // No cursor is the cursor past the newest job, so the row-value
    // comparison always applies and the (created_at, id) index serves it.
    let (before_at, before_id) = filter.before.clone().unwrap_or((i64::MAX, String::new()));
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
    // On PostgreSQL both key fragments are the same (`sql/postgres.rs`).
    #[allow(clippy::if_same_then_else)]
    let sql = match &bounds {
        None => list_jobs_sql!(""),
        Some((low, high)) => {
            // A prefix few keys have is read by key, then sorted; one
            // that most keys have ("order-") is read newest first and
            // filtered, so neither reads the whole table to sort it.
            let (few,): (i64,) = sqlx::query_as(concat!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE ",
                key_indexed!(),
                " >= $1 AND ",
                key_indexed!(),
                " < $2 LIMIT 2000) matching"
            ))
            .bind(low)
            .bind(high)
            .fetch_one(&mut *conn)
            .await?;
            if few < 2000 {
                list_jobs_sql!(concat!(
                    "AND ",
                    key_indexed!(),
                    " >= $10 AND ",
                    key_indexed!(),
                    " < $11"
                ))
            } else {
                list_jobs_sql!(concat!(
                    "AND ",
                    key_unindexed!(),
                    " >= $10 AND ",
                    key_unindexed!(),
                    " < $11"
                ))
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
    conn: &mut Conn,
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
            tally_rows(
                &mut tallies,
                raw(from, mid_from).fetch_all(&mut *conn).await?,
            );
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
