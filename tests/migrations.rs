//! A database made by an earlier build migrates without losing anything:
//! migration 0012 rebuilds `job_events` without `AUTOINCREMENT` and merges
//! two indexes of live jobs into one. A file migrated to 0011 (by sqlx's
//! migrator, as earlier builds did) with events in its log is opened by
//! this build: every event keeps its id and row, the log still refuses
//! updates and deletes, and new events take ids after the old ones.
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

#[tokio::test]
async fn an_event_log_from_before_migration_0012_keeps_its_ids_and_stays_append_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("onejob.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let old = migrations_before(12);
        sqlx::migrate::Migrator::new(old.path())
            .await
            .unwrap()
            .run(&mut conn)
            .await
            .unwrap();
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
