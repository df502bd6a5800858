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
    /// A substring of the idempotency key.
    pub key_contains: Option<String>,
    /// Keyset cursor: only jobs strictly older than `(created_at, id)`.
    pub before: Option<(Millis, String)>,
}

/// Raw aggregates of one time window; the console turns them into charts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowStats {
    /// (minute since the epoch, job state, jobs created in that minute).
    pub jobs_by_minute: Vec<(i64, String, i64)>,
    /// (provider, attempt state, count).
    pub attempts_by_provider: Vec<(String, String, i64)>,
    /// (provider, milliseconds) of each succeeded attempt.
    pub latencies: Vec<(String, i64)>,
    pub jobs: i64,
    pub hedges: i64,
    /// Hedge attempts whose result won the job.
    pub hedge_wins: i64,
    /// (provider, usage JSON) of each discarded attempt with known usage.
    pub discarded_usage: Vec<(String, String)>,
    pub review_depth: i64,
}

/// `%text%` for LIKE, with LIKE's own wildcards in `text` escaped by `\`.
pub(crate) fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

macro_rules! console_ops {
    ($conn:ty) => {
        use crate::store::console::{like_pattern, JobFilter, WindowStats};

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
            let rows: Vec<JobRow> = sqlx::query_as(concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobs WHERE (created_at, id) < ($1, $2) ",
                "AND ($3 IS NULL OR state = $3) ",
                "AND ($4 IS NULL OR route = $4) ",
                "AND ($5 IS NULL OR owner_id = $5) ",
                "AND ($6 IS NULL OR created_at >= $6) ",
                "AND ($7 IS NULL OR created_at < $7) ",
                "AND ($8 IS NULL OR idempotency_key LIKE $8 ESCAPE '\\') ",
                "AND ($9 IS NULL OR EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.provider = $9)) ",
                "ORDER BY created_at DESC, id DESC LIMIT $10"
            ))
            .bind(before_at)
            .bind(before_id)
            .bind(filter.state.as_deref())
            .bind(filter.route.as_deref())
            .bind(filter.owner.as_deref())
            .bind(filter.created_from)
            .bind(filter.created_to)
            .bind(filter.key_contains.as_deref().map(like_pattern))
            .bind(filter.provider.as_deref())
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(Job::try_from).collect()
        }

        pub(crate) async fn window_stats(
            conn: &mut $conn,
            from: Millis,
            to: Millis,
        ) -> Result<WindowStats, StoreError> {
            let jobs_by_minute: Vec<(i64, String, i64)> = sqlx::query_as(
                "SELECT created_at / 60000, state, COUNT(*) FROM jobs \
                 WHERE created_at >= $1 AND created_at < $2 GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .bind(from)
            .bind(to)
            .fetch_all(&mut *conn)
            .await?;
            let attempts_by_provider: Vec<(String, String, i64)> = sqlx::query_as(
                "SELECT provider, state, COUNT(*) FROM attempts \
                 WHERE started_at >= $1 AND started_at < $2 GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .bind(from)
            .bind(to)
            .fetch_all(&mut *conn)
            .await?;
            let latencies: Vec<(String, i64)> = sqlx::query_as(
                "SELECT provider, finished_at - started_at FROM attempts \
                 WHERE started_at >= $1 AND started_at < $2 AND state = 'succeeded' \
                 AND finished_at IS NOT NULL",
            )
            .bind(from)
            .bind(to)
            .fetch_all(&mut *conn)
            .await?;
            let (hedges, hedge_wins): (i64, i64) = sqlx::query_as(
                "SELECT COUNT(*), COUNT(j.id) FROM attempts a \
                 LEFT JOIN jobs j ON j.id = a.job_id AND j.completed_by = a.id \
                 WHERE a.kind = 'hedge' AND a.started_at >= $1 AND a.started_at < $2",
            )
            .bind(from)
            .bind(to)
            .fetch_one(&mut *conn)
            .await?;
            let discarded_usage: Vec<(String, String)> = sqlx::query_as(
                "SELECT provider, usage FROM attempts \
                 WHERE started_at >= $1 AND started_at < $2 AND state = 'discarded' \
                 AND usage IS NOT NULL",
            )
            .bind(from)
            .bind(to)
            .fetch_all(&mut *conn)
            .await?;
            let jobs = jobs_by_minute.iter().map(|(_, _, n)| n).sum();
            Ok(WindowStats {
                jobs_by_minute,
                attempts_by_provider,
                latencies,
                jobs,
                hedges,
                hedge_wins,
                discarded_usage,
                review_depth: review_queue_depth(conn).await?,
            })
        }
    };
}

pub(crate) use console_ops;

#[cfg(test)]
mod tests {
    use super::like_pattern;

    #[test]
    fn like_wildcards_in_the_search_are_literal() {
        assert_eq!(like_pattern("a%b_c\\"), "%a\\%b\\_c\\\\%");
    }
}
