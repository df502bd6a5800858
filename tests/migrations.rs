//! A database made by an earlier build migrates without losing anything:
//! migration 0012 rebuilds `job_events` without `AUTOINCREMENT` and merges
//! two indexes of live jobs into one. A file migrated to 0011 (by sqlx's
//! migrator, as earlier builds did) with events in its log is opened by
//! this build: every event keeps its id and row, the log still refuses
//! updates and deletes, and new events take ids after the old ones.
//! Migration 0013 rewrites the lists of the job path's CHECKs and triggers:
//! on a new file and on one migrated to 0012, a job's writes build no
//! temporary b-tree, and the constraints refuse what they refused.
//! PostgreSQL's migration 0013 calls plpgsql once per statement, not once
//! per row, for an ended attempt's rollup and an ended job's webhook
//! deliveries, and never for a row its trigger has nothing to write for:
//! on a new database and on one migrated to 0012, the same rows are written.
//! SQLite's migration 0014 drops the rollup's trigger on an attempt's
//! insert, which could never write: an attempt's insert enters no trigger
//! program, its end still does, and the store inserts every attempt
//! `started`. SQLite's migration 0016 keeps the webhook triggers only while
//! an endpoint exists: a file with one keeps them, one without loses them,
//! and the store's insert of an endpoint and delete of the last make and
//! drop them, an ended job writing its delivery exactly while they exist,
//! also from another process whose statements were prepared before.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use onejob::domain::JobId;
use onejob::store::prelude::*;
use onejob::store::sqlite::SqliteStore;
use onejob::store::{event, NewEvent};
use sqlx::Connection;
use std::path::Path;

/// The SQLite migrations numbered below `before`, in a directory of their own.
fn migrations_before(before: u32) -> tempfile::TempDir {
    backend_migrations_before("sqlite", before)
}

/// One backend's migrations numbered below `before`, in a directory of their own.
fn backend_migrations_before(backend: &str, before: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
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

/// How many times SQLite's plan for `sql` (with the trigger programs it
/// calls) has the opcode `opcode`.
fn opcodes(conn: &rusqlite::Connection, sql: &str, opcode: &str) -> usize {
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    let opcodes: Vec<String> = explain
        .query_map([], |row| row.get::<_, String>(1))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    opcodes.iter().filter(|op| *op == opcode).count()
}

/// What SQLite's plan for `sql` opens as temporary b-trees (`OpenEphemeral`),
/// with the trigger programs it calls.
fn temporary_btrees(conn: &rusqlite::Connection, sql: &str) -> usize {
    opcodes(conn, sql, "OpenEphemeral")
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

/// The trigger programs SQLite's plan for `sql` enters (`Program`).
fn trigger_programs(conn: &rusqlite::Connection, sql: &str) -> usize {
    opcodes(conn, sql, "Program")
}

#[tokio::test]
async fn an_attempts_insert_enters_no_trigger_and_its_end_is_still_counted() {
    for earlier_build in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("onejob.db");
        if earlier_build {
            migrated_by_an_earlier_build(&file, 14)
                .await
                .close()
                .await
                .unwrap();
        }
        let store = SqliteStore::open(&file).await.unwrap();
        store.migrate().await.unwrap();
        store.close().await;

        let conn = rusqlite::Connection::open(&file).unwrap();
        let insert = "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                      started_at) VALUES ('a', 'j', 1, 'p', 'primary', 'started', 0, 1)";
        let end = "UPDATE attempts SET state = 'succeeded', finished_at = 2 WHERE id = 'a'";
        assert_eq!(
            trigger_programs(&conn, insert),
            0,
            "earlier build {earlier_build}"
        );
        assert!(
            trigger_programs(&conn, end) > 0,
            "earlier build {earlier_build}"
        );

        conn.execute(
            "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
             created_at, updated_at) VALUES ('j', 'o', 'k', 'f', '{}', 'default', 'running', 1, 1)",
            [],
        )
        .unwrap();
        conn.execute(insert, []).unwrap();
        conn.execute(end, []).unwrap();
        let counted: (String, i64) = conn
            .query_row(
                "SELECT state, attempts FROM attempt_hours WHERE provider = 'p'",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            counted,
            ("succeeded".to_string(), 1),
            "earlier build {earlier_build}"
        );
    }
}

/// An endpoint of `owner` subscribed to every event, as the webhook API
/// would store it.
fn endpoint(id: &str, owner: &str) -> onejob::store::webhooks::WebhookEndpoint {
    onejob::store::webhooks::WebhookEndpoint {
        id: id.into(),
        owner_id: owner.into(),
        url: "http://127.0.0.1:9/hook".into(),
        description: String::new(),
        events: " job.succeeded job.failed job.cancelled job.needs_review attempt.unknown ".into(),
        secret: "sealed".into(),
        previous_secret: None,
        previous_secret_until: None,
        enabled: true,
        disabled_reason: None,
        created_at: 1,
        updated_at: 1,
    }
}

/// The trigger programs a job's end and its attempt's end enter, and the
/// deliveries the two write for `owner` (rolled back, so a file can be
/// asked again).
fn webhook_triggers(file: &Path, owner: &str) -> (usize, usize, i64) {
    let mut conn = rusqlite::Connection::open(file).unwrap();
    let job_end = "UPDATE jobs SET state = 'succeeded', version = version + 1 WHERE id = 'w'";
    let attempt_unknown = "UPDATE attempts SET state = 'unknown' WHERE id = 'wa'";
    let programs = (
        trigger_programs(&conn, job_end),
        trigger_programs(&conn, attempt_unknown),
    );
    let tx = conn.transaction().unwrap();
    tx.execute(
        "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
         created_at, updated_at) VALUES ('w', ?1, 'wk', 'f', '{}', 'default', 'running', 1, 1)",
        [owner],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
         VALUES ('wa', 'w', 1, 'p', 'primary', 'started', 0, 1)",
        [],
    )
    .unwrap();
    tx.execute(attempt_unknown, []).unwrap();
    tx.execute(job_end, []).unwrap();
    let deliveries: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM webhook_deliveries WHERE job_id = 'w'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    tx.rollback().unwrap();
    (programs.0, programs.1, deliveries)
}

#[tokio::test]
async fn webhook_triggers_exist_while_an_endpoint_does() {
    // Without an endpoint a job's end enters no trigger program and an
    // attempt's change of state only the rollup's; with one, each enters
    // its webhook trigger too, and writes one delivery per event.
    let without = (0, 1, 0);
    let with = (1, 2, 2);
    for earlier_endpoint in [None, Some(false), Some(true)] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("onejob.db");
        if let Some(has_endpoint) = earlier_endpoint {
            let mut conn = migrated_by_an_earlier_build(&file, 16).await;
            if has_endpoint {
                sqlx::query(
                    "INSERT INTO webhook_endpoints (id, owner_id, url, description, events, \
                     secret, enabled, created_at, updated_at) VALUES ('we_old', 'o', \
                     'http://127.0.0.1:9/hook', '', ' job.succeeded attempt.unknown ', 's', 1, 1, 1)",
                )
                .execute(&mut conn)
                .await
                .unwrap();
            }
            conn.close().await.unwrap();
        }
        let store = SqliteStore::open(&file).await.unwrap();
        store.migrate().await.unwrap();
        let kept = if earlier_endpoint == Some(true) {
            with
        } else {
            without
        };
        assert_eq!(
            webhook_triggers(&file, "o"),
            kept,
            "earlier build's endpoint: {earlier_endpoint:?}"
        );

        for id in ["we_1", "we_2"] {
            store
                .insert_webhook_endpoint(endpoint(id, "o"))
                .await
                .unwrap();
            assert_eq!(webhook_triggers(&file, "o").0, 1, "{id} inserted");
        }
        // Another owner's job: the triggers run and find no endpoint of its.
        assert_eq!(webhook_triggers(&file, "other"), (1, 2, 0));
        let old = i64::from(earlier_endpoint == Some(true));
        assert!(store.delete_webhook_endpoint("we_1").await.unwrap());
        assert_eq!(
            webhook_triggers(&file, "o"),
            (1, 2, 2 * (1 + old)),
            "we_2 left, and the old endpoint: {earlier_endpoint:?}"
        );
        assert!(store.delete_webhook_endpoint("we_2").await.unwrap());
        if old == 1 {
            assert_eq!(webhook_triggers(&file, "o"), with, "the old endpoint left");
            assert!(store.delete_webhook_endpoint("we_old").await.unwrap());
        }
        assert_eq!(webhook_triggers(&file, "o"), without, "no endpoint left");
        // Deleting what is not there changes nothing.
        assert!(!store.delete_webhook_endpoint("we_1").await.unwrap());
        assert_eq!(webhook_triggers(&file, "o"), without);
        store.close().await;
    }
}

/// A job created, its primary started and won through `store`, at `at`.
async fn a_won_job(store: &SqliteStore, key: &str, at: i64) -> JobId {
    use onejob::domain::attempt::Success;
    use onejob::domain::AttemptKind;
    use onejob::store::{AttemptOutcome, FinishAttempt, FinishOutcome};
    let job = common::create_job(store, "o", key, at).await;
    let attempt = common::start_attempt(store, &job, "p", AttemptKind::Primary, at).await;
    let won = store
        .finish_attempt(FinishAttempt {
            attempt_id: attempt,
            outcome: AttemptOutcome::Succeeded(Success::text("\"ok\"")),
            at: at + 10,
            actor: "engine".into(),
        })
        .await
        .unwrap();
    assert!(matches!(won, FinishOutcome::Won { .. }), "{won:?}");
    job
}

#[tokio::test]
async fn an_endpoint_made_by_another_process_reaches_statements_prepared_before_it() {
    // Two stores on one file, as two processes would have: the first has
    // prepared a job's statements (with no webhook trigger to enter) when
    // the second creates an endpoint, and so the triggers.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("onejob.db");
    let first = SqliteStore::open(&file).await.unwrap();
    first.migrate().await.unwrap();
    let second = SqliteStore::open(&file).await.unwrap();
    let deliveries = |job: &JobId| -> i64 {
        rusqlite::Connection::open(&file)
            .unwrap()
            .query_row(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE job_id = ?1",
                [job.as_str()],
                |row| row.get(0),
            )
            .unwrap()
    };

    let before = a_won_job(&first, "before", 1_000).await;
    assert_eq!(deliveries(&before), 0);
    second
        .insert_webhook_endpoint(endpoint("we_1", "o"))
        .await
        .unwrap();
    let during = a_won_job(&first, "during", 2_000).await;
    assert_eq!(deliveries(&during), 1, "the first store's job.succeeded");
    assert!(second.delete_webhook_endpoint("we_1").await.unwrap());
    let after = a_won_job(&first, "after", 3_000).await;
    assert_eq!(deliveries(&after), 0);
    first.close().await;
    second.close().await;
}

/// The rule migration 0014 rests on: every insert of an attempt in the
/// store's SQL writes it `started` (the hourly rollup counts an attempt
/// when it leaves `started` or `unknown`).
#[test]
fn every_attempt_the_store_inserts_is_inserted_started() {
    let mut inserts = 0;
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("INSERT INTO attempts ") {
                // Its columns and the row it inserts: up to the literal's
                // closing quote, or the `FROM` of an `INSERT … SELECT`.
                let statement = &text[at..];
                let end = [statement.find("\","), statement.find(" FROM ")]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(statement.len());
                let statement = &statement[..end];
                inserts += 1;
                assert!(
                    statement.contains("'started'"),
                    "{}: an attempt inserted in another state than 'started': {statement}",
                    path.display()
                );
            }
        }
    }
    assert!(
        inserts >= 2,
        "the store's attempt inserts were found ({inserts})"
    );
}

/// How often each of PostgreSQL's trigger functions ran in the current
/// transaction (`track_functions` must be on for it).
async fn trigger_calls(conn: &mut sqlx::PgConnection) -> std::collections::BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT funcname::text, calls FROM pg_stat_xact_user_functions",
    )
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// `sql` on `conn`.
async fn run(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::query(sql).execute(conn).await.unwrap();
}

/// Three attempt ids whose rollup rows share a shard (`hashtext(id) & 15`),
/// so one statement that ends them upserts one `attempt_hours` row three times.
async fn attempts_of_one_shard(conn: &mut sqlx::PgConnection) -> Vec<String> {
    sqlx::query_as::<_, (String,)>(
        "SELECT 'att-' || g FROM generate_series(1, 1000) g \
         WHERE hashtext('att-' || g) & 15 = 3 ORDER BY g LIMIT 3",
    )
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .map(|(id,)| id)
    .collect()
}

#[tokio::test]
async fn postgres_triggers_run_once_per_statement_and_write_what_they_wrote() {
    let Some(admin) = common::postgres_admin_url() else {
        return;
    };
    for earlier_build in [false, true] {
        let name = format!("onejob_t_{}", uuid::Uuid::new_v4().simple());
        let mut server = sqlx::PgConnection::connect(&admin).await.unwrap();
        run(&mut server, &format!("CREATE DATABASE {name}")).await;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        let url = format!("{base}/{name}");
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        if earlier_build {
            let old = backend_migrations_before("postgres", 13);
            let migrator = sqlx::migrate::Migrator::new(old.path()).await.unwrap();
            migrator.run(&mut conn).await.unwrap();
            // An attempt that ended before this migration, counted by the row trigger.
            run(
                &mut conn,
                "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, \
                 state, created_at, updated_at) VALUES ('job-0', 'o', 'k0', 'f', '{}', 'default', \
                 'running', 1000, 1000)",
            )
            .await;
            run(
                &mut conn,
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                 started_at) VALUES ('att-0', 'job-0', 1, 'p', 'primary', 'started', 0, 1000)",
            )
            .await;
            run(
                &mut conn,
                "UPDATE attempts SET state = 'failed', finished_at = 1005 WHERE id = 'att-0'",
            )
            .await;
        }
        let store = onejob::store::postgres::PgStore::connect(&url)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store.close().await;

        let ids = attempts_of_one_shard(&mut conn).await;
        run(&mut conn, "SET track_functions = 'pl'").await;
        run(&mut conn, "BEGIN").await;
        run(
            &mut conn,
            "INSERT INTO webhook_endpoints (id, owner_id, url, description, events, secret, \
             enabled, created_at, updated_at) VALUES \
             ('ep-1', 'o', 'https://example.com/', '', ' job.succeeded ', 's', true, 1, 1), \
             ('ep-2', 'other', 'https://example.com/', '', ' job.failed ', 's', true, 1, 1)",
        )
        .await;
        run(
            &mut conn,
            "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
             created_at, updated_at) SELECT 'job-' || g, 'o', 'k' || g, 'f', '{}', 'default', \
             'running', 1000, 1000 FROM generate_series(1, 3) g",
        )
        .await;
        for (n, id) in ids.iter().enumerate() {
            sqlx::query(
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                 started_at) VALUES ($1, $2, 1, 'p', 'primary', 'started', 0, 1000)",
            )
            .bind(id)
            .bind(format!("job-{}", n + 1))
            .execute(&mut conn)
            .await
            .unwrap();
        }
        assert_eq!(
            trigger_calls(&mut conn).await,
            Default::default(),
            "earlier build {earlier_build}: a started attempt's insert calls no trigger function"
        );

        // One statement ends all three attempts (as a batch of wins does),
        // and one ends their jobs; a lease change ends nothing.
        sqlx::query(
            "UPDATE attempts SET state = 'succeeded', finished_at = 1007 WHERE id = ANY($1)",
        )
        .bind(&ids)
        .execute(&mut conn)
        .await
        .unwrap();
        run(
            &mut conn,
            "UPDATE jobs SET state = 'succeeded', version = version + 1, updated_at = 1008 \
             WHERE id IN ('job-1', 'job-2', 'job-3')",
        )
        .await;
        run(
            &mut conn,
            "UPDATE jobs SET lease_owner = 'x', lease_until = 9 WHERE id IN ('job-1', 'job-2')",
        )
        .await;
        let calls = trigger_calls(&mut conn).await;
        let expected: std::collections::BTreeMap<String, i64> = [
            ("attempt_hours_count_ended".to_string(), 1),
            ("webhook_on_jobs_end".to_string(), 2),
        ]
        .into();
        assert_eq!(calls, expected, "earlier build {earlier_build}");
        run(&mut conn, "COMMIT").await;

        let hours: Vec<(i64, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT hour, state, latency_le, shard::int8, attempts FROM attempt_hours \
             ORDER BY state, shard",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut want = vec![(0, "succeeded".to_string(), 7, 3, 3)];
        if earlier_build {
            let shard: (i32,) = sqlx::query_as("SELECT hashtext('att-0') & 15")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            want.insert(0, (0, "failed".to_string(), 0, i64::from(shard.0), 1));
        }
        assert_eq!(
            hours, want,
            "earlier build {earlier_build}: the rollup rows"
        );

        let deliveries: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT endpoint_id, job_id, event_type, job_version FROM webhook_deliveries \
             ORDER BY job_id",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let want: Vec<(String, String, String, i64)> = (1..=3)
            .map(|n| {
                let job = format!("job-{n}");
                ("ep-1".to_string(), job, "job.succeeded".to_string(), 1)
            })
            .collect();
        assert_eq!(
            deliveries, want,
            "earlier build {earlier_build}: one delivery per ended job, to its owner's endpoint"
        );

        conn.close().await.unwrap();
        run(&mut server, &format!("DROP DATABASE {name}")).await;
        server.close().await.unwrap();
    }
}
