//! Real `onejob serve` processes sharing one database: the database decides
//! who creates a job, whichever process the retry lands on; SIGTERM stops a
//! server cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::Process;
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
