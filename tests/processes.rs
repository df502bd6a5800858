//! Real `onejob serve` processes sharing one database: the database decides
//! who creates a job, whichever process the retry lands on; SIGTERM stops a
//! server cleanly. `[server] workers` sizes a server's runtime, and a bad
//! count stops it before it touches the database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::{Process, ServeConfig};
use common::world::{provider_dir, ProviderSpec};
use common::{chat_body, Backend, TestDb};
use onejob::clock::SystemClock;
use std::collections::HashSet;

on_both_backends!(double_click_across_two_server_processes_creates_one_job);

async fn double_click_across_two_server_processes_creates_one_job(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let servers = [Process::serve(&db, None), Process::serve(&db, None)];
    let client = reqwest::Client::new();
    let body = chat_body("one click").to_string();
    let mut calls = Vec::new();
    for i in 0..50 {
        let request = client
            .post(format!("{}/v1/jobs", servers[i % 2].address))
            .bearer_auth(&key)
            .header("Idempotency-Key", "click-across-processes")
            .body(body.clone());
        calls.push(tokio::spawn(async move { request.send().await.unwrap() }));
    }
    let mut statuses = Vec::new();
    let mut ids = HashSet::new();
    for call in calls {
        let response = call.await.unwrap();
        statuses.push(response.status().as_u16());
        let job: serde_json::Value = response.json().await.unwrap();
        ids.insert(job["id"].as_str().unwrap().to_string());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        49,
        "{statuses:?}"
    );
    assert_eq!(ids.len(), 1);
    assert_eq!(store.count_jobs().await.unwrap(), 1);
    for server in servers {
        assert!(server.terminate().success(), "SIGTERM is a clean stop");
    }
}

/// The server runs as many async workers as `[server] workers` says (the
/// threads an operator sees in `top -H`), and answers jobs on them.
#[tokio::test]
async fn the_server_runs_the_workers_its_config_asks_for() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        &sim.base_url(),
    );
    let dir = tempfile::tempdir().unwrap();
    let written = ServeConfig {
        providers_dir: providers.path(),
        primary: "primary",
        fallbacks: &[],
        silence_ms: 1_000,
        attempt_timeout_ms: 5_000,
        max_attempts: 1,
        max_concurrent_jobs: None,
        lease_margin_ms: None,
    }
    .write(dir.path());
    let text = std::fs::read_to_string(&written).unwrap();
    for workers in [1, 3] {
        let config = dir.path().join(format!("workers-{workers}.toml"));
        let text = text.replacen("[server]\n", &format!("[server]\nworkers = {workers}\n"), 1);
        std::fs::write(&config, text).unwrap();
        let server = Process::serve(&db, Some(&config));
        let response = reqwest::Client::new()
            .post(format!("{}/v1/jobs", server.address))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("on-{workers}-workers"))
            .header("Prefer", "wait=30")
            .body(chat_body("count my threads").to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let job: serde_json::Value = response.json().await.unwrap();
        assert_eq!(job["state"], "succeeded", "{job}");
        let threads = std::fs::read_dir(format!("/proc/{}/task", server.pid()))
            .unwrap()
            .filter(|task| {
                let comm = task.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).unwrap().trim() == "tokio-rt-worker"
            })
            .count();
        assert_eq!(threads, workers, "async workers with workers = {workers}");
        assert!(server.terminate().success());
    }
    assert_eq!(store.count_jobs().await.unwrap(), 2);
}

/// `workers = 0` is refused by name, with exit status 1, before the
/// database file is created.
#[test]
fn a_bad_worker_count_stops_serve_before_it_touches_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(&config, "[server]\nworkers = 0\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("server.workers: 0 is not between 1 and 1024"),
        "{stderr}"
    );
    assert!(!dir.path().join("onejob.db").exists());
}
