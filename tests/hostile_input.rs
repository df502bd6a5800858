//! Hostile input: oversized, deeply nested and invalid-UTF-8 bodies, slow
//! clients (headers and bodies), and a flood of distinct idempotency keys
//! from one owner. Each gets a clear error with a stable code, nothing is
//! written half-way, and other owners stay served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::serve;
use common::{chat_body, error_code, spawn_app, test_config, Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::tenants::limits::Limits;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn bad_bodies_get_a_code_and_write_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let too_big = vec![b' '; 1024 * 1024 + 1];
    let r = app.post_job_raw(&app.key, Some("big"), too_big).await;
    assert_eq!(r.status(), 413);
    assert_eq!(error_code(r).await, "payload_too_large");

    let depth = 200_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
    let r = app.post_job_raw(&app.key, Some("nested"), nested).await;
    assert_eq!(r.status(), 400);
    assert_eq!(error_code(r).await, "malformed_json");

    let mut invalid = chat_body("héllo").to_string().into_bytes();
    let at = invalid.iter().position(|b| *b == 0xc3).unwrap();
    invalid[at] = 0xff;
    let r = app.post_job_raw(&app.key, Some("utf8"), invalid).await;
    assert_eq!(r.status(), 400);
    assert_eq!(error_code(r).await, "malformed_json");

    let r = app
        .client
        .post(format!("{}/v1/jobs", app.address))
        .bearer_auth(&app.key)
        .header(
            "Idempotency-Key",
            reqwest::header::HeaderValue::from_bytes(b"k\xff\xfe").unwrap(),
        )
        .json(&chat_body("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(error_code(r).await, "invalid_idempotency_key");
    assert_eq!(app.store.count_jobs().await.unwrap(), 0, "nothing written");
    assert_eq!(
        app.post_job(&app.other_key, "fine", &chat_body("ok"))
            .await
            .status(),
        201
    );
    app.stop().await;
}

/// A raw connection that sends `head` and then stalls.
async fn stall(address: &str, head: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(address.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(head).await.unwrap();
    stream
}

/// Read until the server closes; what it sent.
async fn until_closed(stream: &mut TcpStream, limit: Duration) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server kept a stalled connection open past {limit:?}"),
        }
    }
}

async fn slow_clients_are_cut_off_and_other_owners_stay_served(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut config = test_config(&db);
    config.header_read_timeout = Duration::from_millis(300);
    config.body_read_timeout = Duration::from_millis(300);
    let store = db.store().await;
    let (address, stop, task) = serve(config, store.clone()).await;
    let alice = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let bob = onejob::keys::create_key(store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();

    // Fifty clients that never finish their headers, and one whose body never ends.
    let mut slow_heads = Vec::new();
    for _ in 0..50 {
        slow_heads.push(stall(&address, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ").await);
    }
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {alice}\r\n\
         Idempotency-Key: slow-body\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"mess"
    );
    let mut slow_body = stall(&address, head.as_bytes()).await;

    // Meanwhile another owner is served.
    let client = reqwest::Client::new();
    for i in 0..5 {
        let r = client
            .post(format!("{address}/v1/jobs"))
            .bearer_auth(&bob)
            .header("Idempotency-Key", format!("bob-{i}"))
            .json(&chat_body("served"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    // The console's forms too (read by axum's Form, which would wait).
    let mut slow_form = stall(
        &address,
        b"POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
          Content-Length: 100\r\n\r\nkey=",
    )
    .await;
    let answer = until_closed(&mut slow_body, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let answer = until_closed(&mut slow_form, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    for mut s in slow_heads {
        until_closed(&mut s, Duration::from_secs(10)).await;
    }
    assert_eq!(
        store.count_jobs().await.unwrap(),
        5,
        "only bob's jobs were written"
    );
    let _ = stop.send(());
    task.await.unwrap();
}

async fn a_flood_of_distinct_keys_from_one_owner_is_rate_limited(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut config = test_config(&db);
    config.limits.owners.insert(
        "alice".into(),
        Limits {
            requests_per_second: Some(5.0),
            burst: Some(10),
            ..Limits::default()
        },
    );
    let store = db.store().await;
    let (address, stop, task) = serve(config, store.clone()).await;
    let alice = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let bob = onejob::keys::create_key(store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let started = Instant::now();
    let flood: Vec<_> = (0..300)
        .map(|i| {
            let (client, address, alice) = (client.clone(), address.clone(), alice.clone());
            tokio::spawn(async move {
                client
                    .post(format!("{address}/v1/jobs"))
                    .bearer_auth(&alice)
                    .header("Idempotency-Key", format!("flood-{i}"))
                    .json(&chat_body("flood"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    // Bob, during the flood.
    for i in 0..10 {
        let r = client
            .post(format!("{address}/v1/jobs"))
            .bearer_auth(&bob)
            .header("Idempotency-Key", format!("bob-{i}"))
            .json(&chat_body("bob"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut admitted = 0;
    for f in flood {
        match f.await.unwrap() {
            201 => admitted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    let most = 10 + (5.0 * started.elapsed().as_secs_f64()).ceil() as i64;
    eprintln!("flood: {admitted} of 300 admitted (at most {most})");
    assert!(admitted >= 10 && admitted <= most, "{admitted} > {most}");
    assert_eq!(store.count_jobs().await.unwrap(), admitted + 10);
    let _ = stop.send(());
    task.await.unwrap();
}

/// A URL that can name nothing (a NUL, a path that is not UTF-8) is a
/// JSON 422 on every route, where PostgreSQL answered a NUL with a 500 and
/// the path extractor a path that is not UTF-8 with a line of plain text;
/// a cancel's reason, when given, is held to the reason rule.
async fn a_url_that_names_nothing_is_a_json_422(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = app.post_job(&app.key, "k1", &chat_body("hi")).await;
    assert_eq!(created.status(), 201);
    let id = created.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for path in [
        "/v1/jobs/%00".to_string(),
        format!("/v1/jobs/{id}%00"),
        format!("/v1/jobs/{id}%00/attempts"),
        "/v1/jobs/%FF".to_string(),
        "/v1/responses/%FF".to_string(),
        "/ui/jobs?owner=%00".to_string(),
    ] {
        let r = app.get(&app.key, &path).await;
        assert_eq!(r.status(), 422, "{path}");
        assert_eq!(error_code(r).await, "invalid_request", "{path}");
    }
    let cancel = |reason: String| {
        app.client
            .post(format!("{}/v1/jobs/{id}/cancel", app.address))
            .bearer_auth(&app.key)
            .json(&serde_json::json!({ "reason": reason }))
            .send()
    };
    for reason in ["x".repeat(501), "a\0b".to_string(), " ".to_string()] {
        let r = cancel(reason).await.unwrap();
        assert_eq!(r.status(), 422);
        assert_eq!(error_code(r).await, "invalid_request");
    }
    let job = app
        .store
        .get_job(&id.clone().into())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(job.state, onejob::domain::JobState::Cancelled);
    app.stop().await;
}

/// Two different `Idempotency-Key`s on one request name two jobs: the
/// request is refused at every door and writes nothing, where before the
/// first was taken and a client whose proxy added its own key got a job
/// its retries would not find. The same key twice is one key.
async fn two_different_idempotency_keys_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let chat = serde_json::json!({ "model": "gpt-4o-mini", "messages": [{ "role": "user", "content": "hi" }] });
    for (path, body) in [
        ("/v1/jobs", chat_body("hi")),
        ("/v1/chat/completions", chat),
    ] {
        let r = app
            .client
            .post(format!("{}{path}", app.address))
            .bearer_auth(&app.key)
            .header("Idempotency-Key", "order-1")
            .header("Idempotency-Key", "order-2")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(error_code(r).await, "invalid_idempotency_key", "{path}");
    }
    assert_eq!(app.store.count_jobs().await.unwrap(), 0, "nothing written");
    let r = app
        .client
        .post(format!("{}/v1/jobs", app.address))
        .bearer_auth(&app.key)
        .header("Idempotency-Key", "order-1")
        .header("Idempotency-Key", "order-1")
        .json(&chat_body("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(app.store.count_jobs().await.unwrap(), 1);
    app.stop().await;
}

on_both_backends!(
    two_different_idempotency_keys_are_refused,
    a_url_that_names_nothing_is_a_json_422,
    bad_bodies_get_a_code_and_write_nothing,
    slow_clients_are_cut_off_and_other_owners_stay_served,
    a_flood_of_distinct_keys_from_one_owner_is_rate_limited,
);
