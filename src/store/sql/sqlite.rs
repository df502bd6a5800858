//! The SQL compiled for SQLite. Every write runs inside `BEGIN IMMEDIATE`
//! (the write queue), which already excludes every other writer, in this
//! process or another: no row lock is needed and claims never race.
//!
//! Its own way of a job's create is here (`create_job`: four statements in
//! the write queue's transaction), after the resource files it builds on.

pub(crate) type Conn = sqlx::SqliteConnection;

// The dialect's fragments, literals for `concat!`. They are defined before
// the resource modules below, so that those see them.

/// The row lock of a guarded step: none (`BEGIN IMMEDIATE` excludes every writer).
macro_rules! for_update {
    () => {
        ""
    };
}

/// Concurrent claims passing over each other: none (writes are serialised).
macro_rules! skip_locked {
    () => {
        ""
    };
}

/// The idempotency key as its index (`jobs_by_key`) compares it, in byte
/// order: SQLite's BINARY collation already is.
macro_rules! key_indexed {
    () => {
        "idempotency_key"
    };
}

/// The same comparison, kept off that index (unary `+`).
macro_rules! key_unindexed {
    () => {
        "+idempotency_key"
    };
}

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that the attempt with id `$id` adds to: always 0: writes are serialised by the write lock anyway.
macro_rules! rollup_shard {
    ($id:literal) => {
        "0"
    };
}

// The resource files, compiled here for this dialect (and in the other
// dialect's file for that one), their queries re-exported.
#[path = "attempts.rs"]
pub(crate) mod attempts;
#[path = "console.rs"]
pub(crate) mod console;
#[path = "contract_runs.rs"]
pub(crate) mod contract_runs;
#[path = "events.rs"]
pub(crate) mod events;
#[path = "hedging.rs"]
pub(crate) mod hedging;
#[path = "jobs.rs"]
pub(crate) mod jobs;
#[path = "keys.rs"]
pub(crate) mod keys;
#[path = "switches.rs"]
pub(crate) mod switches;
#[path = "webhooks.rs"]
pub(crate) mod webhooks;

pub(crate) use self::{
    attempts::*, console::*, contract_runs::*, events::*, hedging::*, jobs::*, keys::*,
    switches::*, webhooks::*,
};

use self::attempts::insert_started_attempt;
use self::jobs::{create_outcome, created_event, job_args};
use super::db::Db;
use crate::domain::job::NewJob;
use crate::store::{CreateOutcome, StoreError};

/// Insert the job unless (owner, key) exists (the UNIQUE constraint
/// decides), with its `created` event and its primary attempt, as four
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
        events::insert_event(conn, &created_event(job)).await?;
        if let Some(primary) = &job.primary {
            // The job was created by this very statement: it takes
            // attempts and has none, so the guard of `start_attempt`
            // (invariant 4) admits a primary without reading anything.
            insert_started_attempt(conn, primary, 1, 0).await?;
        }
    }
    Ok(inserted)
}
