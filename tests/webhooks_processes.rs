//! Webhooks across real `onejob serve` processes: events of jobs that
//! finish while the receiver is down survive a kill -9, each with one
//! `webhook-id`; three instances on one PostgreSQL deliver 1,000 events
//! with no delivery in flight twice and none lost; and no secret (the
//! endpoint's, the encryption key) appears in any log line or output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::{count_rows, Process};
use common::receiver::{Behaviour, Receiver};
use common::world::{provider_dir, ProviderSpec};
use common::{postgres_admin_url, Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::config::DatabaseUrl;
use onejob::domain::OwnerId;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const KEY_ENV: &str = "ONEJOB_WEBHOOK_KEY";
/// base64 of 32 bytes of 0x2a.
const KEY: &str = "KioqKioqKioqKioqKioqKioqKioqKioqKioqKioqKio=";

/// A config with the engine on or off and quick webhook retries.
fn write_config(dir: &Path, providers: &Path, engine: bool, extra: &str) -> PathBuf {
    let text = format!(
        "[server]\nproviders_dir = {providers:?}\ncontracts_dir = {contracts:?}\n\n\
         [engine]\nenabled = {engine}\npoll_interval_ms = 50\n\n\
         [webhooks]\nallow_private_networks = true\npoll_interval_ms = 20\nretry_base_ms = 100\n\
         retry_cap_ms = 400\nmax_attempts = 1000\ntimeout_ms = 2000\n{extra}\n\
         [routes.default]\nprimary = \"primary\"\nfallbacks = []\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n",
        providers = providers.display().to_string(),
        contracts = dir.join("contracts").display().to_string(),
    );
    let path = dir.join("onejob.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Wait (polling the database, which is what is observed) until `sql`'s
/// single count reaches `want`.
async fn until_count(db: &TestDb, sql: &str, want: i64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let rows = count_rows(db, sql).await;
        let n = rows.values().sum::<i64>();
        if n >= want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{sql}: {n} of {want} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free port now (nobody listening on it afterwards).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn events_of_jobs_finished_while_the_receiver_is_down_survive_a_kill(backend: Backend) {
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        &sim.base_url(),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), providers.path(), true, "");
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let api_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let server = Process::serve_with_env(&db, Some(&config), &[(KEY_ENV, KEY)]);
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{}/v1/webhooks", server.address))
        .bearer_auth(&api_key)
        .json(&json!({ "url": url }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(created["secret"].is_string(), "{created}");

    let mut jobs = BTreeSet::new();
    for i in 0..20 {
        let job: Value = client
            .post(format!("{}/v1/jobs", server.address))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", format!("down-{i}"))
            .header("Prefer", "wait=10")
            .json(&common::chat_body("hello"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(job["state"], "succeeded", "{job}");
        jobs.insert(job["id"].as_str().unwrap().to_string());
    }
    // Every event was tried at least once against the receiver that is down.
    until_count(
        &db,
        "SELECT 'tried', COUNT(*) FROM webhook_deliveries WHERE tries > 0 AND state = 'pending'",
        20,
        Duration::from_secs(20),
    )
    .await;
    server.kill();
    let ids_before = count_rows(
        &db,
        "SELECT id, COUNT(*) FROM webhook_deliveries GROUP BY id",
    )
    .await;
    assert_eq!(ids_before.len(), 20);

    let restarted = Process::serve_with_env(&db, Some(&config), &[(KEY_ENV, KEY)]);
    let mut receiver = Receiver::start_on(port, Behaviour::default()).await;
    let mut by_job: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while by_job.len() < 20 {
        let got = receiver.next().await;
        by_job.entry(got.job_id).or_default().insert(got.id);
    }
    until_count(
        &db,
        "SELECT state, COUNT(*) FROM webhook_deliveries WHERE state = 'delivered' GROUP BY state",
        20,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(by_job.keys().cloned().collect::<BTreeSet<_>>(), jobs);
    for (job, ids) in &by_job {
        assert_eq!(ids.len(), 1, "job {job} came with ids {ids:?}");
        assert!(ids_before.contains_key(ids.iter().next().unwrap()));
    }
    assert_eq!(receiver.overlaps(), 0);
    drop(restarted);
}

/// Insert `n` jobs of `owner` and end them all in one statement: the
/// triggers write one outbox row each.
async fn end_many_jobs(db: &TestDb, owner: &str, n: usize) {
    use sqlx::Connection;
    let DatabaseUrl::Postgres(url) = &db.url else {
        unreachable!("a PostgreSQL test")
    };
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(
        "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
         created_at, updated_at) SELECT 'bulk-' || i, $1, 'bulk-' || i, 'f', '{}', 'default', \
         'pending', 1, 1 FROM generate_series(1, $2) AS i",
    )
    .bind(owner)
    .bind(n as i64)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', version = version + 1, \
         updated_at = (extract(epoch from now()) * 1000)::bigint WHERE owner_id = $1",
    )
    .bind(owner)
    .execute(&mut conn)
    .await
    .unwrap();
}

async fn three_instances_on_one_postgres_deliver_a_thousand_events_once_each() {
    if postgres_admin_url().is_none() {
        return;
    }
    const EVENTS: usize = 1_000;
    let providers = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        providers.path(),
        false,
        "concurrency_per_endpoint = 16\n",
    );
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let receiver = Receiver::start(Behaviour {
        delay: Duration::from_millis(2),
        ..Behaviour::default()
    })
    .await;
    let hooks = onejob::webhooks::endpoints::Webhooks {
        store: store.as_ref(),
        clock: &SystemClock,
        config: &onejob::webhooks::WebhooksConfig {
            allow_private_networks: true,
            ..Default::default()
        },
        key: Some(&onejob::webhooks::secrets::SecretKey::parse(KEY).unwrap()),
    };
    hooks
        .create(
            onejob::webhooks::endpoints::Actor {
                owner_id: &OwnerId::from("alice"),
                is_admin: false,
            },
            onejob::webhooks::endpoints::NewEndpoint {
                url: receiver.url.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    end_many_jobs(&db, "alice", EVENTS).await;
    let began = std::time::Instant::now();
    let servers: Vec<Process> = (0..3)
        .map(|_| Process::serve_with_env(&db, Some(&config), &[(KEY_ENV, KEY)]))
        .collect();
    until_count(
        &db,
        "SELECT state, COUNT(*) FROM webhook_deliveries WHERE state = 'delivered' GROUP BY state",
        EVENTS as i64,
        Duration::from_secs(120),
    )
    .await;
    let took = began.elapsed();
    let all = receiver.all();
    let ids: BTreeSet<&str> = all.iter().map(|r| r.id.as_str()).collect();
    let jobs: BTreeSet<&str> = all.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(ids.len(), EVENTS, "every event arrived");
    assert_eq!(jobs.len(), EVENTS);
    assert_eq!(receiver.overlaps(), 0, "no delivery in flight twice");
    assert_eq!(all.len(), EVENTS, "and none sent twice at all");
    let senders = count_rows(
        &db,
        "SELECT sender, COUNT(*) FROM webhook_attempts GROUP BY sender",
    )
    .await;
    let tries: i64 = senders.values().sum();
    assert_eq!(tries, EVENTS as i64);
    assert!(senders.len() >= 2, "the work is shared: {senders:?}");
    eprintln!(
        "three instances: {EVENTS} events in {took:?}; tries by sender {:?}; at most {} in flight at once",
        senders.values().collect::<Vec<_>>(),
        receiver.max_concurrent()
    );
    drop(servers);
}

/// `onejob ARGS` with the key set and TRACE logs; (stdout, stderr).
fn cli(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "trace")
        .env(KEY_ENV, KEY)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    (text(&out.stdout), text(&out.stderr))
}

async fn the_secret_never_appears_in_the_logs(backend: Backend) {
    let providers = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), providers.path(), false, "");
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let api_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let mut receiver = Receiver::start(Behaviour {
        statuses: vec![500],
        ..Behaviour::default()
    })
    .await;
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let url = db.url_string();
    let config_arg = config.display().to_string();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &url,
            "--config",
            &config_arg,
        ])
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "trace")
        .env(KEY_ENV, KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let address = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim()
            .strip_prefix("onejob listening on ")
            .unwrap()
            .to_string()
    };
    let client = reqwest::Client::new();
    let mut texts: Vec<(String, String)> = Vec::new();
    let mut secrets: Vec<String> = vec![KEY.to_string()];

    // Created over HTTP: the secret is in that one answer only.
    let created: Value = client
        .post(format!("{address}/v1/webhooks"))
        .bearer_auth(&api_key)
        .json(&json!({ "url": receiver.url, "events": ["job.cancelled"] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let endpoint = created["id"].as_str().unwrap().to_string();
    secrets.push(created["secret"].as_str().unwrap().to_string());
    // Rotated over HTTP.
    let rotated: Value = client
        .post(format!("{address}/v1/webhooks/{endpoint}/rotate"))
        .bearer_auth(&api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    secrets.push(rotated["secret"].as_str().unwrap().to_string());
    // Created and rotated by the CLI: the secret alone on the last line.
    let (out, err) = cli(&[
        "webhooks",
        "create",
        "--database-url",
        &url,
        "--config",
        &config_arg,
        "--owner",
        "bob",
        "--url",
        &receiver.url,
    ]);
    let cli_secret = out.lines().last().unwrap().to_string();
    assert!(cli_secret.starts_with("whsec_"), "{out}");
    secrets.push(cli_secret);
    texts.push((
        "webhooks create (all but its last line)".into(),
        out.lines().rev().skip(1).collect(),
    ));
    texts.push(("webhooks create stderr".into(), err));
    for args in [
        vec![
            "webhooks",
            "list",
            "--database-url",
            &url,
            "--config",
            &config_arg,
        ],
        vec![
            "webhooks",
            "deliveries",
            &endpoint,
            "--database-url",
            &url,
            "--config",
            &config_arg,
        ],
    ] {
        let (out, err) = cli(&args);
        texts.push((format!("{args:?} stdout"), out));
        texts.push((format!("{args:?} stderr"), err));
    }

    // A delivery that fails once, then succeeds, then is redelivered.
    let job: Value = client
        .post(format!("{address}/v1/jobs"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", "hygiene-1")
        .json(&common::chat_body("hello"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = job["id"].as_str().unwrap();
    client
        .post(format!("{address}/v1/jobs/{job_id}/cancel"))
        .bearer_auth(&api_key)
        .send()
        .await
        .unwrap();
    let first = receiver.next().await;
    let second = receiver.next().await;
    assert_eq!(first.id, second.id);
    until_count(
        &db,
        "SELECT state, COUNT(*) FROM webhook_deliveries WHERE state = 'delivered' GROUP BY state",
        1,
        Duration::from_secs(10),
    )
    .await;
    let redelivered = client
        .post(format!(
            "{address}/v1/webhooks/{endpoint}/deliveries/{}/redeliver",
            first.id
        ))
        .bearer_auth(&api_key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    texts.push(("redeliver answer".into(), redelivered));
    receiver.next().await;
    for path in [
        "/v1/webhooks".to_string(),
        format!("/v1/webhooks/{endpoint}"),
        format!("/v1/webhooks/{endpoint}/deliveries"),
        "/metrics".to_string(),
    ] {
        let text = client
            .get(format!("{address}{path}"))
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        texts.push((format!("GET {path}"), text));
    }
    // What the receiver got: signatures, never the secret.
    for r in receiver.all() {
        texts.push((
            "a delivery's headers and body".into(),
            format!("{} {} {} {}", r.id, r.timestamp, r.signature, r.body),
        ));
    }
    // The database holds secrets sealed only.
    let stored = count_rows(
        &db,
        "SELECT secret || ' ' || COALESCE(previous_secret, ''), CAST(1 AS BIGINT) FROM webhook_endpoints",
    )
    .await;
    texts.push((
        "webhook_endpoints rows".into(),
        stored.keys().cloned().collect::<Vec<_>>().join("\n"),
    ));

    let _ = child.kill();
    let _ = child.wait();
    let server_log = std::fs::read_to_string(&log_path).unwrap();
    // TRACE was on: the HTTP client's own trace lines are there (the
    // store's SQLite calls log nothing since it left sqlx).
    assert!(
        server_log.lines().filter(|l| l.contains("TRACE")).count() >= 10,
        "TRACE logs were written: {server_log}"
    );
    texts.push(("server log (TRACE)".into(), server_log));

    let mut leaks = Vec::new();
    for secret in &secrets {
        let bare = secret.strip_prefix("whsec_").unwrap_or(secret);
        for (what, text) in &texts {
            if text.contains(bare) {
                let line = text.lines().find(|l| l.contains(bare)).unwrap_or("");
                leaks.push(format!("{what} shows a secret: {line}"));
            }
        }
    }
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    eprintln!(
        "webhook secret hygiene: {} texts, {} lines, {} secrets checked",
        texts.len(),
        texts.iter().map(|(_, t)| t.lines().count()).sum::<usize>(),
        secrets.len()
    );
}

on_both_backends!(
    events_of_jobs_finished_while_the_receiver_is_down_survive_a_kill,
    the_secret_never_appears_in_the_logs,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_postgres() {
    three_instances_on_one_postgres_deliver_a_thousand_events_once_each().await;
}
