//! The append-only job event log.

use crate::domain::{EventKind, Millis};
use crate::store::rows::EventRow;
use crate::store::sql::db::{args, Arg, Db, IntoArg};
use crate::store::{JobEvent, NewEvent, StoreError};
use std::fmt::Write;
use std::sync::LazyLock;

pub(crate) async fn insert_event(conn: &mut impl Db, ev: &NewEvent) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &event_args(ev),
    )
    .await?;
    Ok(())
}

/// Two events in one statement, `first` first (a new job's `created` and
/// its primary attempt's start): one statement fewer on a job's path.
pub(crate) async fn insert_event_pair(
    conn: &mut impl Db,
    first: &NewEvent,
    second: &NewEvent,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) \
         VALUES ($1, $2, $3, $4, $5, $6), ($7, $8, $9, $10, $11, $12)",
        &[event_args(first), event_args(second)].concat(),
    )
    .await?;
    Ok(())
}

/// An event's six columns, in the order every insert here names them.
fn event_args(ev: &NewEvent) -> [Arg<'_>; 6] {
    [
        (&ev.job_id).arg(),
        (&ev.attempt_id).arg(),
        ev.kind.as_str().arg(),
        (&ev.actor).arg(),
        (&ev.detail).arg(),
        ev.at.arg(),
    ]
}

/// Rows in one statement of [`insert_events`].
const ROWS_PER_INSERT: usize = 16;

/// The insert of [`ROWS_PER_INSERT`] events, `$1` to `$96` in order.
static MANY_EVENTS: LazyLock<String> = LazyLock::new(|| {
    let mut sql = String::from(
        "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) VALUES ",
    );
    for row in 0..ROWS_PER_INSERT {
        let n = row * 6;
        let comma = if row > 0 { ", " } else { "" };
        // Writing to a String cannot fail.
        let _ = write!(
            sql,
            "{comma}(${}, ${}, ${}, ${}, ${}, ${})",
            n + 1,
            n + 2,
            n + 3,
            n + 4,
            n + 5,
            n + 6
        );
    }
    sql
});

/// Many events (the replay audit's flush, one per replayed job): 16 in
/// each statement, the rest one by one, every statement one the
/// connection keeps prepared. A statement sized to its chunk (up to 256
/// rows before) was prepared afresh each time, and SQLite finds a `$N`
/// parameter by a walk over those before it, when it parses the text and
/// again as each is bound: quadratic in the rows. Under a flood of
/// replays of 4,000 distinct jobs that was 3–5 µs of server CPU per
/// replay (the bench, 21 → 16 µs through `/v1/jobs`).
pub(crate) async fn insert_events(
    conn: &mut impl Db,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    let mut chunks = events.chunks_exact(ROWS_PER_INSERT);
    let mut args = Vec::with_capacity(ROWS_PER_INSERT * 6);
    for chunk in &mut chunks {
        args.clear();
        for ev in chunk {
            args.extend(event_args(ev));
        }
        conn.execute(&MANY_EVENTS, &args).await?;
    }
    for ev in chunks.remainder() {
        insert_event(conn, ev).await?;
    }
    Ok(())
}

pub(crate) async fn record_event(conn: &mut impl Db, event: NewEvent) -> Result<(), StoreError> {
    insert_event(conn, &event).await
}

pub(crate) async fn record_events(
    conn: &mut impl Db,
    events: Vec<NewEvent>,
) -> Result<(), StoreError> {
    insert_events(conn, &events).await
}

pub(crate) async fn list_events(
    conn: &mut impl Db,
    job_id: &str,
) -> Result<Vec<JobEvent>, StoreError> {
    let rows: Vec<EventRow> = conn
        .fetch_all(
            "SELECT id, job_id, attempt_id, kind, actor, detail, at FROM job_events \
         WHERE job_id = $1 ORDER BY id",
            args![job_id],
        )
        .await?;
    Ok(rows.into_iter().map(JobEvent::from).collect())
}

pub(crate) async fn has_event(
    conn: &mut impl Db,
    job_id: &str,
    kind: &str,
) -> Result<bool, StoreError> {
    let found: Option<(i64,)> = conn
        .fetch_optional(
            "SELECT id FROM job_events WHERE job_id = $1 AND kind = $2 LIMIT 1",
            args![job_id, kind],
        )
        .await?;
    Ok(found.is_some())
}

pub(super) async fn decision_event(
    conn: &mut impl Db,
    job_id: &str,
    attempt_id: Option<&str>,
    kind: EventKind,
    actor: &str,
    detail: serde_json::Value,
    at: Millis,
) -> Result<(), StoreError> {
    insert_event(
        conn,
        &NewEvent {
            job_id: job_id.into(),
            attempt_id: attempt_id.map(Into::into),
            kind,
            actor: actor.to_string(),
            detail: Some(crate::domain::json_text(&detail)),
            at,
        },
    )
    .await
}
