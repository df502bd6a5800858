//! The jobs API over real HTTP: idempotent creation, conflicts, owners, bad
//! input. Every test runs on SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::type_complexity)]

mod common;

use common::{chat_body, error_code, spawn_app, test_config, Backend};
use onejob::domain::JobId;
use serde_json::{json, Value};
use std::collections::HashSet;

on_both_backends!(
    double_click_creates_exactly_one_job,
    same_key_with_other_payload_is_a_conflict,
    reordered_keys_and_whitespace_are_a_replay,
    same_key_under_two_owners_is_two_jobs,
    another_owners_job_is_not_found,
    bad_input_gets_its_code_and_writes_nothing,
    a_new_job_has_no_attempts_yet,
    a_contract_job_that_could_never_run_is_refused_but_replayed,
    the_bearer_scheme_is_read_in_any_case,
);

async fn double_click_creates_exactly_one_job(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = chat_body("book the flight");
    let mut calls = Vec::new();
    for _ in 0..50 {
        let client = app.client.clone();
        let url = format!("{}/v1/jobs", app.address);
        let key = app.key.clone();
        let body = body.to_string();
        calls.push(tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", "click-1")
                .body(body)
                .send()
                .await
                .unwrap()
        }));
    }
    let (mut created, mut replayed, mut ids) = (0, 0, HashSet::new());
    for call in calls {
        let response = call.await.unwrap();
        match response.status().as_u16() {
            201 => created += 1,
            200 => {
                assert_eq!(response.headers()["idempotent-replayed"], "true");
                replayed += 1;
            }
            other => panic!("unexpected status {other}"),
        }
        let job: Value = response.json().await.unwrap();
        ids.insert(job["id"].as_str().unwrap().to_string());
    }
    assert_eq!((created, replayed), (1, 49));
    assert_eq!(ids.len(), 1, "every answer names the same job");
    assert_eq!(app.store.count_jobs().await.unwrap(), 1);
    let id = ids.into_iter().next().unwrap();
    let events = app.store.list_events(&JobId::from(&id)).await.unwrap();
    assert_eq!(events.iter().filter(|e| e.kind == "created").count(), 1);
    app.stop().await;
}

async fn same_key_with_other_payload_is_a_conflict(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = app
        .post_job(&app.key, "order-7", &chat_body("refund order 7"))
        .await;
    assert_eq!(first.status(), 201);
    let job: Value = first.json().await.unwrap();
    let id = job["id"].as_str().unwrap();
    let before = app.store.get_job(&JobId::from(id)).await.unwrap().unwrap();

    let conflict = app
        .post_job(&app.key, "order-7", &chat_body("refund order 8"))
        .await;
    assert_eq!(conflict.status(), 409);
    assert_eq!(conflict.headers()["x-should-retry"], "false");
    assert_eq!(error_code(conflict).await, "idempotency_key_reused");

    assert_eq!(
        app.store.get_job(&JobId::from(id)).await.unwrap().unwrap(),
        before,
        "the stored job is unchanged"
    );
    assert_eq!(app.store.count_jobs().await.unwrap(), 1, "no job was added");
    let kinds: Vec<String> = app
        .store
        .list_events(&JobId::from(id))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind.to_string())
        .collect();
    assert!(
        kinds.contains(&"conflict".to_string()),
        "the conflict is in the event log: {kinds:?}"
    );
    app.stop().await;
}

async fn reordered_keys_and_whitespace_are_a_replay(backend: Backend) {
    let app = spawn_app(backend).await;
    let original = br#"{"messages":[{"role":"user","content":"hi"}],"params":{"temperature":0,"max_tokens":64}}"#;
    let reordered = br#"{
        "params" : { "max_tokens" : 64, "temperature" : 0.0 },
        "route": "default",
        "messages" : [ { "content" : "hi", "role" : "user" } ]
    }"#;
    let first = app
        .post_job_raw(&app.key, Some("k"), original.to_vec())
        .await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = app
        .post_job_raw(&app.key, Some("k"), reordered.to_vec())
        .await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["id"], again["id"]);
    assert_eq!(app.store.count_jobs().await.unwrap(), 1);
    app.stop().await;
}

async fn same_key_under_two_owners_is_two_jobs(backend: Backend) {
    let app = spawn_app(backend).await;
    let a = app.post_job(&app.key, "shared-key", &chat_body("x")).await;
    let b = app
        .post_job(&app.other_key, "shared-key", &chat_body("x"))
        .await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (201, 201));
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_ne!(a["id"], b["id"]);
    assert_eq!(app.store.count_jobs().await.unwrap(), 2);
    app.stop().await;
}

async fn another_owners_job_is_not_found(backend: Backend) {
    let app = spawn_app(backend).await;
    let job: Value = app
        .post_job(&app.key, "mine", &chat_body("x"))
        .await
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap();
    let mine = app.get(&app.key, &format!("/v1/jobs/{id}")).await;
    assert_eq!(mine.status(), 200);
    let mine: Value = mine.json().await.unwrap();
    assert_eq!(
        (mine["state"].as_str(), mine["version"].as_i64()),
        (Some("pending"), Some(0))
    );
    for path in [format!("/v1/jobs/{id}"), format!("/v1/jobs/{id}/attempts")] {
        let theirs = app.get(&app.other_key, &path).await;
        assert_eq!(theirs.status(), 404, "{path}");
        assert_eq!(error_code(theirs).await, "not_found");
    }
    let missing = app.get(&app.key, "/v1/jobs/no-such-job").await;
    assert_eq!(missing.status(), 404);
    app.stop().await;
}

async fn a_new_job_has_no_attempts_yet(backend: Backend) {
    let app = spawn_app(backend).await;
    let job: Value = app
        .post_job(&app.key, "fresh", &chat_body("x"))
        .await
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap();
    let attempts: Value = app
        .get(&app.key, &format!("/v1/jobs/{id}/attempts"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(attempts["job_id"], job["id"]);
    assert_eq!(attempts["attempts"], json!([]));
    app.stop().await;
}

async fn bad_input_gets_its_code_and_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let good = chat_body("x").to_string().into_bytes();
    let long_key = "k".repeat(256);
    let oversized = {
        let text = "a".repeat(1024 * 1024 + 1);
        json!({ "messages": [{ "role": "user", "content": text }] })
            .to_string()
            .into_bytes()
    };
    let cases: Vec<(&str, Option<&str>, Option<&str>, Vec<u8>, u16, &str)> = vec![
        (
            "no idempotency key",
            Some(&app.key),
            None,
            good.clone(),
            400,
            "missing_idempotency_key",
        ),
        (
            "empty idempotency key",
            Some(&app.key),
            Some(""),
            good.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "overlong key",
            Some(&app.key),
            Some(&long_key),
            good.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "malformed json",
            Some(&app.key),
            Some("k1"),
            b"{\"messages\": [".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "wrong type",
            Some(&app.key),
            Some("k2"),
            br#"{"messages":[{"role":"user","content":"x"}],"params":{"max_tokens":"many"}}"#
                .to_vec(),
            422,
            "invalid_request",
        ),
        (
            "not an object",
            Some(&app.key),
            Some("k3"),
            b"[1,2]".to_vec(),
            422,
            "invalid_request",
        ),
        (
            "neither contract nor messages",
            Some(&app.key),
            Some("k4"),
            b"{}".to_vec(),
            422,
            "invalid_request",
        ),
        (
            "unknown route",
            Some(&app.key),
            Some("k5"),
            br#"{"messages":[{"role":"user","content":"x"}],"route":"nowhere"}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "a field only onejob's other doors write",
            Some(&app.key),
            Some("k9"),
            br#"{"messages":[{"role":"user","content":"x"}],"door":{"responses":{}}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "oversized body",
            Some(&app.key),
            Some("k6"),
            oversized,
            413,
            "payload_too_large",
        ),
        (
            "no api key",
            None,
            Some("k7"),
            good.clone(),
            401,
            "unauthorized",
        ),
        (
            "wrong api key",
            Some("oj_not-a-real-key"),
            Some("k8"),
            good.clone(),
            401,
            "unauthorized",
        ),
    ];
    for (name, api_key, idem, body, status, code) in cases {
        let mut request = app
            .client
            .post(format!("{}/v1/jobs", app.address))
            .body(body);
        if let Some(k) = api_key {
            request = request.bearer_auth(k);
        }
        if let Some(k) = idem {
            request = request.header("Idempotency-Key", k);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{name}");
        assert_eq!(error_code(response).await, code, "{name}");
    }

    // A non-ASCII key cannot be typed as a &str header; send the raw bytes.
    let non_ascii = reqwest::header::HeaderValue::from_bytes("clé".as_bytes()).unwrap();
    let response = app
        .client
        .post(format!("{}/v1/jobs", app.address))
        .bearer_auth(&app.key)
        .header("Idempotency-Key", non_ascii)
        .body(good.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(error_code(response).await, "invalid_idempotency_key");

    // The field at fault is named.
    let response = app
        .post_job_raw(
            &app.key,
            Some("k9"),
            br#"{"messages":[{"role":"robot","content":"x"}]}"#.to_vec(),
        )
        .await;
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[0].role"),
        "{body}"
    );

    assert_eq!(
        app.store.count_jobs().await.unwrap(),
        0,
        "nothing was written for a rejected request"
    );
    app.stop().await;
}

fn ticket(subject: &str) -> Value {
    json!({
        "contract": "ticket-triage",
        "input": {
            "channel": "email",
            "customer_name": "Dana Whitfield",
            "subject": subject,
            "body": "I was charged twice for March."
        }
    })
}

/// A job naming a contract this server has not loaded, or leaving out a
/// variable of its template, is refused at the door (nothing written)
/// instead of being created to fail. A replay is not a new job: a server
/// without the contract still answers the key of a job made where it was
/// loaded.
async fn a_contract_job_that_could_never_run_is_refused_but_replayed(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut unknown = ticket("refund");
    unknown["contract"] = json!("ticket-triag");
    let response = app.post_job(&app.key, "typo", &unknown).await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ticket-triag") && message.contains("ticket-triage"),
        "names the contract and those loaded: {message}"
    );

    let mut missing = ticket("refund");
    missing["input"]
        .as_object_mut()
        .unwrap()
        .remove("customer_name");
    let response = app.post_job(&app.key, "missing", &missing).await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("customer_name"), "{message}");
    assert_eq!(app.store.count_jobs().await.unwrap(), 0, "nothing written");

    let made = app.post_job(&app.key, "made-here", &ticket("refund")).await;
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.unwrap();

    // Another server on the same database, with no contracts loaded.
    let none = tempfile::tempdir().unwrap();
    let mut config = test_config(&app.db);
    config.contracts_dir = none.path().to_path_buf();
    let (other, stop, task) = common::world::serve(config, app.store.clone()).await;
    let post = |idempotency_key: &'static str, body: Value| {
        app.client
            .post(format!("{other}/v1/jobs"))
            .bearer_auth(&app.key)
            .header("Idempotency-Key", idempotency_key)
            .json(&body)
            .send()
    };
    let replayed = post("made-here", ticket("refund")).await.unwrap();
    assert_eq!(replayed.status(), 200);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    let replayed: Value = replayed.json().await.unwrap();
    assert_eq!(replayed["id"], made["id"]);
    let refused = post("new-there", ticket("refund")).await.unwrap();
    assert_eq!(refused.status(), 422);
    assert_eq!(error_code(refused).await, "invalid_request");
    assert_eq!(app.store.count_jobs().await.unwrap(), 1);
    let _ = stop.send(());
    task.await.unwrap();
    app.stop().await;
}

/// `Authorization`'s scheme is case-insensitive (RFC 9110): a client that
/// writes `bearer` is the key's owner, one that writes `Basic` is not.
async fn the_bearer_scheme_is_read_in_any_case(backend: Backend) {
    let app = spawn_app(backend).await;
    for (i, scheme) in ["bearer", "BEARER", "Basic"].into_iter().enumerate() {
        let response = app
            .client
            .post(format!("{}/v1/jobs", app.address))
            .header("Authorization", format!("{scheme} {}", app.key))
            .header("Idempotency-Key", format!("scheme-{i}"))
            .json(&chat_body("x"))
            .send()
            .await
            .unwrap();
        let want = if scheme == "Basic" { 401 } else { 201 };
        assert_eq!(response.status(), want, "{scheme}");
    }
    assert_eq!(app.store.count_jobs().await.unwrap(), 2);
    app.stop().await;
}
