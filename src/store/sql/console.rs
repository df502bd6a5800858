//! Read-only queries behind the ops console and `/metrics`; the types and
//! helpers are in `store::console`.

use std::sync::LazyLock;

use crate::domain::{Job, JobState, Millis};
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

/// The list's filters but for state, cursor and key: `[$6, $7)` the
/// creation range (always given: a bound on each state's index read),
/// `$4` route, `$5` owner, `$8` a provider one of the job's attempts ran on.
macro_rules! list_filters {
    () => {
        "AND created_at >= $6 AND created_at < $7 \
         AND ($4 IS NULL OR route = $4) \
         AND ($5 IS NULL OR owner_id = $5) \
         AND ($8 IS NULL OR EXISTS \
           (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.provider = $8)) "
    };
}
pub(crate) use list_filters;

/// The owners of jobs, found by skipping along the `(owner_id,
/// idempotency_key)` unique index: one seek per owner however many jobs it
/// has. A statement that reads a key prefix starts with this, and reads
/// the prefix owner by owner off that index (no index has the key first:
/// SQLite's migration 0015, PostgreSQL's 0014).
macro_rules! with_owners {
    () => {
        "WITH RECURSIVE owners(id) AS (SELECT MIN(owner_id) FROM jobs \
         UNION ALL SELECT (SELECT MIN(owner_id) FROM jobs WHERE owner_id > owners.id) \
         FROM owners WHERE owners.id IS NOT NULL) "
    };
}
pub(crate) use with_owners;

/// How many jobs (up to 2,000) have a key in `[$1, $2)`; `$owners` the
/// dialect's clause that the owner is one of `owners` (`Dialect::KEY_PREFIX_FEW`).
macro_rules! key_prefix_few_sql {
    ($owners:literal) => {
        concat!(
            $crate::store::sql::console::with_owners!(),
            "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE ",
            $owners,
            " AND idempotency_key >= $1 AND idempotency_key < $2 LIMIT 2000) matching"
        )
    };
}
pub(crate) use key_prefix_few_sql;

/// The list with a key prefix few keys have: read by key, owner by owner,
/// then sorted. `$1`..`$9` the filter, `[$10, $11)` the prefix's bounds,
/// `$owners` as above (`Dialect::LIST_JOBS_BY_KEY`).
macro_rules! list_jobs_by_key_sql {
    ($owners:literal) => {
        concat!(
            $crate::store::sql::console::with_owners!(),
            "SELECT ",
            $crate::store::rows::job_columns!(),
            " FROM jobs WHERE ",
            $owners,
            " AND idempotency_key >= $10 AND idempotency_key < $11 \
             AND (created_at, id) < ($1, $2) AND ($3 IS NULL OR state = $3) ",
            $crate::store::sql::console::list_filters!(),
            "ORDER BY created_at DESC, id DESC LIMIT $9"
        )
    };
}
pub(crate) use list_jobs_by_key_sql;

/// The list newest first, and with a prefix most keys have (read newest
/// first and filtered): one read per state off `jobs_by_state_created
/// (state, created_at, id)`, each in the list's order, bounded by the
/// cursor and `[$6, $7)`, and at most a page, merged. A state other than
/// `$3` is not read (`$3 = '…'` is constant, so each database tests it
/// once, before the read).
static LIST_JOBS: LazyLock<String> = LazyLock::new(|| newest_first(""));
static LIST_JOBS_SCANNING_KEYS: LazyLock<String> =
    LazyLock::new(|| newest_first("AND idempotency_key >= $10 AND idempotency_key < $11 "));

fn newest_first(key_clause: &str) -> String {
    let reads: Vec<String> = JobState::ALL
        .iter()
        .map(|state| {
            let state = state.as_str();
            format!(
                "SELECT * FROM (SELECT {columns} FROM jobs WHERE state = '{state}' \
                 AND ($3 IS NULL OR $3 = '{state}') AND (created_at, id) < ($1, $2) \
                 {filters}{key_clause}ORDER BY created_at DESC, id DESC LIMIT $9) AS {state}_jobs",
                columns = crate::store::rows::job_columns!(),
                filters = list_filters!(),
            )
        })
        .collect();
    format!(
        "SELECT * FROM ({}) AS newest ORDER BY created_at DESC, id DESC LIMIT $9",
        reads.join(" UNION ALL ")
    )
}

/// The oldest and the newest job's `created_at` (NULLs when there is no
/// job): two index seeks per state.
static CREATED_SPAN: LazyLock<String> = LazyLock::new(|| {
    let states: Vec<String> = JobState::ALL
        .iter()
        .map(|state| {
            let state = state.as_str();
            format!(
                "SELECT (SELECT MIN(created_at) FROM jobs WHERE state = '{state}') AS oldest, \
                 (SELECT MAX(created_at) FROM jobs WHERE state = '{state}') AS newest"
            )
        })
        .collect();
    format!(
        "SELECT MIN(oldest), MAX(newest) FROM ({}) AS spans",
        states.join(" UNION ALL ")
    )
});

/// How far back from its cursor a filtered list reads first. Each read
/// that finds less than a page reads four times as far back, until it
/// reaches the oldest job.
const FIRST_WINDOW_MS: Millis = 60_000;

pub(crate) async fn list_jobs<C: Db>(
    conn: &mut C,
    filter: &JobFilter,
    limit: i64,
) -> Result<Vec<Job>, StoreError> {
    // No cursor is the cursor past the newest job, so the row-value
    // comparison always applies and each state's read starts from it.
    let (before_at, before_id) = filter.before.clone().unwrap_or((i64::MAX, String::new()));
    let (from, to) = (
        filter.created_from.unwrap_or(i64::MIN),
        filter.created_to.unwrap_or(i64::MAX),
    );
    let bounds = filter.key_prefix.as_deref().map(key_prefix_bounds);
    let unindexed = filter.route.is_some() || filter.owner.is_some() || filter.provider.is_some();
    let (sql, windowed): (&str, bool) = match &bounds {
        None => (&LIST_JOBS, unindexed),
        Some((low, high)) => {
            // A prefix few keys have is read by key, then sorted; one
            // that most keys have ("order-") is read newest first and
            // filtered, so neither reads the whole table to sort it.
            let (few,): (i64,) = conn
                .fetch_one(C::Sql::KEY_PREFIX_FEW, args![low, high])
                .await?;
            if few < 2000 {
                (C::Sql::LIST_JOBS_BY_KEY, false)
            } else {
                (&LIST_JOBS_SCANNING_KEYS, true)
            }
        }
    };
    let read = |floor: Millis| {
        let mut args = vec![
            before_at.arg(),
            before_id.as_str().arg(),
            filter.state.as_deref().arg(),
            filter.route.as_deref().arg(),
            filter.owner.as_deref().arg(),
            floor.arg(),
            to.arg(),
            filter.provider.as_deref().arg(),
            limit.arg(),
        ];
        if let Some((low, high)) = &bounds {
            args.extend([low.as_str().arg(), high.as_str().arg()]);
        }
        args
    };
    if !windowed {
        let rows: Vec<JobRow> = conn.fetch_all(sql, &read(from)).await?;
        return rows.into_iter().map(Job::try_from).collect();
    }
    // A filter the index does not apply (route, owner, provider, a key
    // prefix most keys have) can leave a state with less than a page of
    // matches, and its read would run to the state's oldest job, however
    // many newer pages the other states fill. So the list is read over a
    // window of time back from its cursor, widened until it holds a page:
    // at most about five times the jobs one read in time order would see.
    let (oldest, newest): (Option<Millis>, Option<Millis>) =
        conn.fetch_one(&CREATED_SPAN, args![]).await?;
    let (Some(oldest), Some(newest)) = (oldest, newest) else {
        return Ok(Vec::new());
    };
    let top = before_at.min(to).min(newest.saturating_add(1));
    let bottom = from.max(oldest);
    let mut width = FIRST_WINDOW_MS;
    loop {
        // Compared as a width, not as `top - width`, which saturates short
        // of a span wider than `i64::MAX`.
        let floor = if width >= top.saturating_sub(bottom) {
            bottom
        } else {
            top - width
        };
        let rows: Vec<JobRow> = conn.fetch_all(sql, &read(floor)).await?;
        if rows.len() as i64 >= limit || floor == bottom {
            return rows.into_iter().map(Job::try_from).collect();
        }
        width = width.saturating_mul(4);
    }
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
