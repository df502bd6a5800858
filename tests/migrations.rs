//! A database made by an earlier build migrates without losing anything:
//! migration 0012 rebuilds `job_events` without `AUTOINCREMENT` and merges
//! two indexes of live jobs into one. A file migrated to 0011 (by sqlx's
//! migrator, as earlier builds did) with events in its log is opened by
//! this build: every event keeps its id and row, the log still refuses
//! updates and deletes, and new events take ids after the old ones.
//! Migration 0013 rewrites the lists of the job path's CHECKs and triggers:
//! on a new file and on one migrated to 0012, a job's writes build no
//! temporary b-tree, and the constraints refuse what they refused.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use onejob::domain::JobId;
use onejob::store::prelude::*;
use onejob::store::sqlite::SqliteStore;
use onejob::store::{event, NewEvent};
use sqlx::Connection;
use std::path::Path;

/// The SQLite migrations numbered below `before`, in a directory of their own.
fn migrations_before(before: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    for entry in std::fs::read_dir(source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let number: u32 = name[..4].parse().unwrap();
        if number < before {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    dir
}

/// A connection to `file`, migrated by sqlx's migrator (as earlier builds
/// did) through the migrations numbered below `before`.
async fn migrated_by_an_earlier_build(file: &Path, before: u32) -> sqlx::SqliteConnection {
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let old = migrations_before(before);
    sqlx::migrate::Migrator::new(old.path())
        .await
        .unwrap()
        .run(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test]
async fn an_event_log_from_before_migration_0012_keeps_its_ids_and_stays_append_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("onejob.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    {
        let mut conn = migrated_by_an_earlier_build(&file, 12).await;
        // Ids with a gap, as AUTOINCREMENT may leave after a rolled-back insert.
        for (id, kind) in [
            (1, "created"),
            (2, "attempt_started"),
            (7, "attempt_succeeded"),
        ] {
            sqlx::query(
                "INSERT INTO job_events (id, job_id, attempt_id, kind, actor, detail, at) \
                 VALUES ($1, 'job-1', NULL, $2, 'engine', NULL, $3)",
            )
            .bind(id)
            .bind(kind)
            .bind(1_000 + id)
            .execute(&mut conn)
            .await
            .unwrap();
        }
        conn.close().await.unwrap();
    }

    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let events = store.list_events(&JobId::from("job-1")).await.unwrap();
    let kept: Vec<(i64, &str, i64)> = events
        .iter()
        .map(|e| (e.id, e.kind.as_str(), e.at))
        .collect();
    assert_eq!(
        kept,
        [
            (1, "created", 1_001),
            (2, "attempt_started", 1_002),
            (7, "attempt_succeeded", 1_007)
        ]
    );
    store
        .record_event(NewEvent {
            job_id: "job-1".into(),
            attempt_id: None,
            kind: event::CANCELLED,
            actor: "admin".into(),
            detail: None,
            at: 2_000,
        })
        .await
        .unwrap();
    let events = store.list_events(&JobId::from("job-1")).await.unwrap();
    assert_eq!(events.len(), 4);
    assert_eq!(events[3].id, 8, "a new event's id follows the old ones");
    store.close().await;

    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for statement in [
        "UPDATE job_events SET actor = 'someone' WHERE id = 1",
        "DELETE FROM job_events WHERE id = 1",
    ] {
        let refused = sqlx::query(statement).execute(&mut conn).await.unwrap_err();
        assert!(
            refused.to_string().contains("append-only"),
            "{statement}: {refused}"
        );
    }
    let schema: Vec<(String,)> = sqlx::query_as(
        "SELECT name FROM sqlite_master WHERE name LIKE 'job_events%' OR name LIKE 'jobs_active%' \
         ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let names: Vec<&str> = schema.iter().map(|(n,)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "job_events",
            "job_events_by_job",
            "job_events_no_delete",
            "job_events_no_update",
            "jobs_active"
        ]
    );
    let sequences: (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM sqlite_sequence WHERE name LIKE 'job_events%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        sequences.0, 0,
        "no AUTOINCREMENT counter is left for the log"
    );
}

/// What SQLite's plan for `sql` opens as temporary b-trees (`OpenEphemeral`),
/// with the trigger programs it calls.
fn temporary_btrees(conn: &rusqlite::Connection, sql: &str) -> usize {
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    let opcodes: Vec<String> = explain
        .query_map([], |row| row.get::<_, String>(1))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    opcodes.iter().filter(|op| *op == "OpenEphemeral").count()
}

#[tokio::test]
async fn a_jobs_writes_build_no_temporary_btree_and_the_checks_still_refuse() {
    for earlier_build in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("onejob.db");
        if earlier_build {
            let mut conn = migrated_by_an_earlier_build(&file, 13).await;
            sqlx::query(
                "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, \
                 state, created_at, updated_at) VALUES ('job-1', 'o', 'k', 'f', '{}', 'default', \
                 'succeeded', 1, 1)",
            )
            .execute(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
        let store = SqliteStore::open(&file).await.unwrap();
        store.migrate().await.unwrap();
        store.close().await;

        let conn = rusqlite::Connection::open(&file).unwrap();
        for sql in [
            "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
             created_at, updated_at) VALUES ('j', 'o', 'k2', 'f', '{}', 'default', 'running', 1, 1)",
            "UPDATE jobs SET state = 'succeeded', version = version + 1 WHERE id = 'j'",
            "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
             VALUES ('a', 'j', 1, 'p', 'primary', 'started', 0, 1)",
            "UPDATE attempts SET state = 'succeeded', finished_at = 2 WHERE id = 'a'",
        ] {
            assert_eq!(temporary_btrees(&conn, sql), 0, "earlier build {earlier_build}: {sql}");
        }
        if earlier_build {
            let kept: String = conn
                .query_row("SELECT state FROM jobs WHERE id = 'job-1'", [], |row| {
                    row.get(0)
                })
                .unwrap();
            assert_eq!(kept, "succeeded");
        }
        for (sql, column) in [
            (
                "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, \
                 state, created_at, updated_at) VALUES ('x', 'o', 'k3', 'f', '{}', 'default', \
                 'done', 1, 1)",
                "state",
            ),
            (
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                 started_at) VALUES ('b', 'job-0', 1, 'p', 'second', 'started', 0, 1)",
                "kind",
            ),
            (
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                 started_at) VALUES ('c', 'job-0', 1, 'p', 'hedge', 'lost', 0, 1)",
                "state",
            ),
        ] {
            let refused = conn.execute(sql, []).unwrap_err().to_string();
            assert!(
                refused.contains("CHECK constraint failed") && refused.contains(column),
                "earlier build {earlier_build}: {sql}: {refused}"
            );
        }
    }
}
