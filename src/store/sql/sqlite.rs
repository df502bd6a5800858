//! SQLite's statements ([`Sqlite`]). Every write runs inside `BEGIN IMMEDIATE`
//! (the write queue), which already excludes every other writer, in this
//! process or another: no row lock is needed and claims never race.
//!
//! Its own way of a job's create is here (`create_job`: three statements in
//! the write queue's transaction).

use super::attempts::{insert_started_attempt_row, started_event};
use super::console::{key_prefix_few_sql, list_jobs_by_key_sql};
use super::db::Db;
use super::db::{Arg, Row, SqliteRow};
use super::insert_job;
use super::jobs::claim_jobs_sql;
use super::jobs::{create_outcome, created_event, job_args};
use super::webhooks::claim_deliveries_sql;
use super::{usage_insert, usage_on_conflict, Dialect};
use crate::domain::job::NewJob;
use crate::store::{CreateOutcome, StoreError};

pub(crate) use super::{
    attempts::*, console::*, contract_runs::*, events::*, hedging::*, jobs::*, keys::*,
    switches::*, webhooks::*,
};

/// SQLite's statements.
pub(crate) struct Sqlite;

impl Dialect for Sqlite {
    // No row lock: `BEGIN IMMEDIATE` already excludes every other writer.
    const GUARDED_JOB: &'static str =
        "SELECT state, version, attempt_count FROM jobs WHERE id = $1";
    const FINISHING_ATTEMPT: &'static str =
        "SELECT job_id, state, read_version, provider, kind FROM attempts WHERE id = $1";
    const LOCKED_JOB: &'static str = concat!(
        "SELECT ",
        crate::store::rows::job_columns!(),
        " FROM jobs WHERE id = $1"
    );
    const LOCKED_ATTEMPT: &'static str = "SELECT job_id, state FROM attempts WHERE id = $1";
    // Claims never race: writes are serialised.
    const CLAIM_JOBS: &'static str = claim_jobs_sql!("");
    const CLAIM_DELIVERIES: &'static str = claim_deliveries_sql!("");
    // One shard: writes are serialised by the write lock anyway.
    const ADD_USAGE: &'static str = concat!(usage_insert!("0"), usage_on_conflict!());
    // SQLite reads `IN (SELECT …)` a value at a time, each a seek on the
    // `(owner_id, idempotency_key)` index.
    const KEY_PREFIX_FEW: &'static str = key_prefix_few_sql!("owner_id IN (SELECT id FROM owners)");
    const LIST_JOBS_BY_KEY: &'static str =
        list_jobs_by_key_sql!("owner_id IN (SELECT id FROM owners)");
    // Migration 0016 dropped these; the texts are those of migrations 0013
    // (`webhook_on_job_end`) and 0010 (`webhook_on_attempt_unknown`).
    const WEBHOOK_TRIGGERS_CREATE: &'static [&'static str] = &[
        "CREATE TRIGGER IF NOT EXISTS webhook_on_job_end AFTER UPDATE OF state ON jobs \
         WHEN NEW.state NOT IN ('pending', 'running') AND OLD.state <> NEW.state \
         BEGIN \
         INSERT INTO webhook_deliveries (id, endpoint_id, owner_id, event_type, job_id, attempt_id, \
         event_at, job_state, job_version, job_route, job_key, job_result, job_completed_by, \
         job_last_error, job_attempt_count, job_next_run_at, job_created_at, job_updated_at, \
         state, next_attempt_at, created_at) \
         SELECT 'msg_' || lower(hex(randomblob(16))), e.id, NEW.owner_id, 'job.' || NEW.state, \
         NEW.id, NULL, NEW.updated_at, NEW.state, NEW.version, NEW.route, NEW.idempotency_key, \
         NEW.result, NEW.completed_by, NEW.last_error, NEW.attempt_count, NEW.next_run_at, \
         NEW.created_at, NEW.updated_at, 'pending', NEW.updated_at, NEW.updated_at \
         FROM webhook_endpoints e \
         WHERE e.owner_id = NEW.owner_id AND e.enabled = 1 \
         AND e.events LIKE '% job.' || NEW.state || ' %'; \
         END",
        "CREATE TRIGGER IF NOT EXISTS webhook_on_attempt_unknown AFTER UPDATE OF state ON attempts \
         WHEN NEW.state = 'unknown' AND OLD.state <> 'unknown' \
         BEGIN \
         INSERT INTO webhook_deliveries (id, endpoint_id, owner_id, event_type, job_id, attempt_id, \
         event_at, job_state, job_version, job_route, job_key, job_result, job_completed_by, \
         job_last_error, job_attempt_count, job_next_run_at, job_created_at, job_updated_at, \
         state, next_attempt_at, created_at) \
         SELECT 'msg_' || lower(hex(randomblob(16))), e.id, j.owner_id, 'attempt.unknown', j.id, \
         NEW.id, COALESCE(NEW.finished_at, NEW.started_at), j.state, j.version, j.route, \
         j.idempotency_key, j.result, j.completed_by, j.last_error, j.attempt_count, \
         j.next_run_at, j.created_at, j.updated_at, 'pending', \
         COALESCE(NEW.finished_at, NEW.started_at), COALESCE(NEW.finished_at, NEW.started_at) \
         FROM jobs j JOIN webhook_endpoints e ON e.owner_id = j.owner_id \
         WHERE j.id = NEW.job_id AND e.enabled = 1 AND e.events LIKE '% attempt.unknown %'; \
         END",
    ];
    const WEBHOOK_TRIGGERS_DROP: &'static [&'static str] = &[
        "DROP TRIGGER IF EXISTS webhook_on_job_end",
        "DROP TRIGGER IF EXISTS webhook_on_attempt_unknown",
    ];
}

/// rusqlite: a direct call into SQLite on the calling thread. The statement
/// is prepared once and kept in the connection's cache. Its futures are
/// ready at their first poll.
impl Db for rusqlite::Connection {
    type Sql = Sqlite;

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.prepare_cached(sql)?;
        bind(&mut statement, args)?;
        Ok(statement.raw_execute()? as u64)
    }

    async fn execute_once(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.prepare(sql)?;
        bind(&mut statement, args)?;
        Ok(statement.raw_execute()? as u64)
    }

    async fn fetch_optional<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<R>, StoreError> {
        let mut statement = self.prepare_cached(sql)?;
        bind(&mut statement, args)?;
        let mut rows = statement.raw_query();
        let first = match rows.next()? {
            Some(row) => Some(R::decode(&SqliteRow::new(row))?),
            None => None,
        };
        // Step a RETURNING statement to its end: SQLite applies the
        // change of every row before it answers the first, but the
        // statement is only done (and its changes counted) once stepped
        // out.
        while rows.next()?.is_some() {}
        Ok(first)
    }

    async fn fetch_all<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Vec<R>, StoreError> {
        let mut statement = self.prepare_cached(sql)?;
        bind(&mut statement, args)?;
        let mut rows = statement.raw_query();
        let mut all = Vec::new();
        while let Some(row) = rows.next()? {
            all.push(R::decode(&SqliteRow::new(row))?);
        }
        Ok(all)
    }
}
/// Bind `$N` to `args[N - 1]`, as sqlx does. SQLite numbers a statement's
/// parameters in the order they first appear (`$11` before `$7` is
/// parameter 7), and tells each one's name by its number, so each is bound
/// where its name says. (Scanning the text for `$N` in order, to bind by
/// number unread, cost more than reading the names: about 16,000
/// instructions per job, callgrind.)
fn bind(statement: &mut rusqlite::Statement<'_>, args: &[Arg<'_>]) -> rusqlite::Result<()> {
    let count = statement.parameter_count();
    if count > args.len() {
        return Err(rusqlite::Error::InvalidParameterCount(count, args.len()));
    }
    for index in 1..=count {
        let position = statement
            .parameter_name(index)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(index);
        match position.checked_sub(1).and_then(|i| args.get(i)) {
            Some(arg) => statement.raw_bind_parameter(index, arg)?,
            None => return Err(rusqlite::Error::InvalidParameterCount(position, args.len())),
        }
    }
    Ok(())
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Arg::Int(value) => value.to_sql(),
            Arg::Bool(value) => value.to_sql(),
            Arg::Text(value) => value.to_sql(),
        }
    }
}

/// Insert the job unless (owner, key) exists (the UNIQUE constraint
/// decides), with its primary attempt and both their events, as three
/// statements in the caller's transaction (the write queue's).
pub(crate) async fn create_job(
    conn: &mut impl Db,
    job: NewJob,
) -> Result<CreateOutcome, StoreError> {
    let inserted = insert_job_statement_by_statement(conn, &job).await?;
    create_outcome(conn, job, inserted).await
}

/// The job (unless its key exists), its event and its primary attempt with
/// that attempt's event; whether the job was inserted. Inside the caller's
/// transaction (SQLite's write queue).
async fn insert_job_statement_by_statement(
    conn: &mut impl Db,
    job: &NewJob,
) -> Result<bool, StoreError> {
    let inserted = conn.execute(insert_job!(), &job_args(job)).await? == 1;
    if inserted {
        match &job.primary {
            Some(primary) => {
                // The job was created by this very statement: it takes
                // attempts and has none, so the guard of `start_attempt`
                // (invariant 4) admits a primary without reading anything.
                insert_started_attempt_row(conn, primary, 1, 0).await?;
                // Both events in one statement, `created` first.
                super::events::insert_event_pair(
                    conn,
                    &created_event(job),
                    &started_event(primary, 1, 0),
                )
                .await?;
            }
            None => super::events::insert_event(conn, &created_event(job)).await?,
        }
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        use crate::store::sql::db::Columns;
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut statement = conn.prepare("SELECT 1 AS a, 2 AS b, 3 AS c").unwrap();
        let mut rows = statement.raw_query();
        let row = rows.next().unwrap().unwrap();
        let row = SqliteRow::new(row);
        let read: Vec<i64> = ["a", "b", "c", "b", "a", "c", "c"]
            .iter()
            .map(|name| row.get::<i64>(name).unwrap())
            .collect();
        assert_eq!(read, [1, 2, 3, 2, 1, 3, 3]);
        assert!(row.get::<i64>("d").is_err());
    }

    #[test]
    fn parameters_bind_by_number_in_either_order() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for sql in ["SELECT $1 || $2 || $1", "SELECT $2 || $1 || $2"] {
            let mut statement = conn.prepare(sql).unwrap();
            bind(
                &mut statement,
                &[Arg::Text(Some("a")), Arg::Text(Some("b"))],
            )
            .unwrap();
            let mut rows = statement.raw_query();
            let got: String = rows.next().unwrap().unwrap().get(0).unwrap();
            let want = if sql.starts_with("SELECT $1") {
                "aba"
            } else {
                "bab"
            };
            assert_eq!(got, want, "{sql}");
        }
        let sql = "SELECT $1, $2";
        let mut statement = conn.prepare(sql).unwrap();
        let err = bind(&mut statement, &[Arg::Int(Some(1))]).unwrap_err();
        assert!(
            matches!(err, rusqlite::Error::InvalidParameterCount(2, 1)),
            "{err}"
        );
    }
}
