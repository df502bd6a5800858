//! Limits per key, on both backends: a key may carry its own request rate,
//! concurrent jobs and tokens per day, in addition to its owner's. A key's
//! limit refuses with the same codes as an owner's while another key of the
//! same owner is unaffected; an admin changes it at run time (audited);
//! rotation keeps it and what the key used; revocation still works; every
//! job records the key that made it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::count_rows;
use common::world::{route, serve, start_world, ProviderSpec};
use common::{chat_body, error_code, test_config, Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::tenants::limits::Limits;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

on_both_backends!(
    a_keys_own_limits_refuse_with_the_owners_codes_and_spare_its_other_keys,
    a_keys_token_budget_stops_its_jobs_before_any_provider_call,
    a_rotated_keys_refusal_names_the_key_sent_and_the_shared_bucket,
);

async fn post_job(address: &str, key: &str, idem: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{address}/v1/jobs"))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(&chat_body(idem))
        .send()
        .await
        .unwrap()
}

async fn call(
    method: reqwest::Method,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url).bearer_auth(key);
    if let Some(b) = body {
        request = request.json(&b);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A key of `owner` with `limits` of its own: (secret, id).
async fn key_with(db: &TestDb, owner: &str, limits: Limits) -> (String, String) {
    let store = db.store().await;
    let created = onejob::keys::create(
        store.as_ref(),
        &SystemClock,
        owner,
        false,
        None,
        limits,
        "test",
    )
    .await
    .unwrap();
    store.close().await;
    (created.secret, created.record.id)
}

/// The listed key `id` as `GET /v1/admin/keys` shows it.
async fn listed(address: &str, admin: &str, id: &str) -> Value {
    let (_, body) = call(
        reqwest::Method::GET,
        format!("{address}/v1/admin/keys"),
        admin,
        None,
    )
    .await;
    body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == id)
        .cloned()
        .unwrap()
}

async fn a_keys_own_limits_refuse_with_the_owners_codes_and_spare_its_other_keys(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (admin, _) = {
        let store = db.store().await;
        let k = onejob::keys::create(
            store.as_ref(),
            &SystemClock,
            "ops",
            true,
            None,
            Limits::default(),
            "test",
        )
        .await
        .unwrap();
        store.close().await;
        (k.secret, k.record.id)
    };
    let one_at_a_time = Limits {
        concurrent_jobs: Some(1),
        ..Limits::default()
    };
    let (narrow, narrow_id) = key_with(&db, "alice", one_at_a_time).await;
    let (wide, wide_id) = key_with(&db, "alice", Limits::default()).await;
    // The engine is off: every job stays pending, so live jobs pile up.
    let (address, stop, task) = serve(test_config(&db), db.store().await).await;

    assert_eq!(post_job(&address, &narrow, "n-1").await.status(), 201);
    let refused = post_job(&address, &narrow, "n-2").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-should-retry"], "true");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "concurrency_limited");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("key {narrow_id} of owner alice")),
        "{message}"
    );
    // Another key of the same owner is unaffected; a replay is answered.
    for i in 0..3 {
        assert_eq!(
            post_job(&address, &wide, &format!("w-{i}")).await.status(),
            201
        );
    }
    assert_eq!(post_job(&address, &narrow, "n-1").await.status(), 200);
    // Each job records the key that made it; the refused one wrote nothing.
    let by_key = count_rows(
        &db,
        "SELECT COALESCE(key_id, '-'), COUNT(*) FROM jobs GROUP BY key_id",
    )
    .await;
    assert_eq!(
        by_key,
        BTreeMap::from([(narrow_id.clone(), 1), (wide_id.clone(), 3)])
    );
    assert_eq!(
        listed(&address, &admin, &narrow_id).await["limits"],
        json!({ "concurrent_jobs": 1 })
    );
    assert_eq!(
        listed(&address, &admin, &wide_id).await["limits"],
        json!({})
    );

    // An admin gives the key a request rate at run time, audited.
    let (status, view) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{narrow_id}/limits"),
        &admin,
        Some(json!({
            "limits": { "requests_per_second": 1, "burst": 1, "concurrent_jobs": 1 },
            "reason": "a noisy batch job"
        })),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["limits"]["requests_per_second"], 1.0);
    let (_, audit) = call(
        reqwest::Method::GET,
        format!("{address}/v1/admin/tenants/audit"),
        &admin,
        None,
    )
    .await;
    assert_eq!(audit["entries"][0]["action"], "set_limits");
    assert_eq!(audit["entries"][0]["subject"], format!("key:{narrow_id}"));
    assert_eq!(audit["entries"][0]["detail"]["reason"], "a noisy batch job");
    // Replays count against a rate: the second at once is refused.
    assert_eq!(post_job(&address, &narrow, "n-1").await.status(), 200);
    let refused = post_job(&address, &narrow, "n-1").await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(error_code(refused).await, "rate_limited");
    for i in 3..8 {
        assert_eq!(
            post_job(&address, &wide, &format!("w-{i}")).await.status(),
            201,
            "other key"
        );
    }
    // Bad limits are refused by name, and change nothing.
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{narrow_id}/limits"),
        &admin,
        Some(json!({ "limits": { "burst": 0 }, "reason": "oops" })),
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("burst"),
        "{body}"
    );
    // A burst is the rate's bucket: without a rate over it, it would limit
    // nothing. A key's limits are its own; an owner's may take the
    // config's rate, and this config has none.
    for url in [
        format!("{address}/v1/admin/keys/{narrow_id}/limits"),
        format!("{address}/v1/admin/limits/alice"),
    ] {
        let (status, body) = call(
            reqwest::Method::POST,
            url.clone(),
            &admin,
            Some(json!({ "limits": { "burst": 50 }, "reason": "a bigger bucket" })),
        )
        .await;
        assert_eq!(status, 422, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("burst: limits nothing without requests_per_second"),
            "{body}"
        );
    }
    assert_eq!(
        listed(&address, &admin, &narrow_id).await["limits"],
        view["limits"],
        "the refused change changed nothing"
    );
    // A non-admin key cannot change limits.
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{narrow_id}/limits"),
        &wide,
        Some(json!({ "limits": {}, "reason": "let me" })),
    )
    .await;
    assert_eq!(status, 403);

    // Rotation: the successor has the same limits and shares the live job.
    let (status, rotated) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{narrow_id}/rotate"),
        &admin,
        Some(json!({ "grace": "1h" })),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let successor = rotated["secret"].as_str().unwrap().to_string();
    assert_eq!(rotated["key"]["limits"], view["limits"]);
    tokio::time::sleep(Duration::from_millis(1_100)).await; // a fresh rate window
    let refused = post_job(&address, &successor, "n-3").await;
    assert_eq!(
        error_code(refused).await,
        "concurrency_limited",
        "n-1 is still live"
    );
    // Revocation still works: the wide key is refused, the successor is not.
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{wide_id}/revoke"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(post_job(&address, &wide, "w-9").await.status(), 401);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(post_job(&address, &successor, "n-1").await.status(), 200);
    // Cleared, the key has only its owner's limits (none): a second live job.
    let (status, view) = call(
        reqwest::Method::POST,
        format!("{address}/v1/admin/keys/{narrow_id}/limits"),
        &admin,
        Some(json!({ "limits": {}, "reason": "batch done" })),
    )
    .await;
    assert_eq!((status, &view["limits"]), (200, &json!({})));
    assert_eq!(post_job(&address, &successor, "n-3").await.status(), 201);
    let _ = stop.send(());
    task.await.unwrap();
}

async fn a_keys_token_budget_stops_its_jobs_before_any_provider_call(backend: Backend) {
    let providers = [ProviderSpec {
        name: "sim",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("sim", &[]), |_| {}).await;
    let (capped, capped_id) = key_with(
        &world.db,
        "alice",
        Limits {
            tokens_per_day: Some(5),
            ..Limits::default()
        },
    )
    .await;
    let submit = |key: String, idem: &'static str| {
        let address = world.address.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{address}/v1/jobs"))
                .bearer_auth(key)
                .header("Idempotency-Key", idem)
                .header("Prefer", "wait=10")
                .json(&chat_body(idem))
                .send()
                .await
                .unwrap()
        }
    };
    // The first job fits (nothing used yet) and spends more than 5 tokens.
    let first = submit(capped.clone(), "cap-1").await;
    assert_eq!(first.status(), 201);
    let job: Value = first.json().await.unwrap();
    assert_eq!(job["state"], "succeeded", "{job}");
    let jobs_before = world.store.count_jobs().await.unwrap();
    let executions_before = world.sim.ledger().total_executions();
    // The usage was written in the commit that ended the attempt.
    let refused = submit(capped.clone(), "cap-2").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-should-retry"], "false");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "budget_exhausted");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("key {capped_id}")),
        "{body}"
    );
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        jobs_before,
        "nothing written"
    );
    assert_eq!(
        world.sim.ledger().total_executions(),
        executions_before,
        "no provider called"
    );
    // The owner's other key is served; the tokens were counted for the key.
    let other = submit(world.key.clone(), "free-1").await;
    assert_eq!(other.status(), 201);
    let used = count_rows(
        &world.db,
        "SELECT key_id, CAST(SUM(prompt_tokens + completion_tokens) AS BIGINT) FROM usage_daily \
         WHERE key_id <> '' GROUP BY key_id",
    )
    .await;
    assert!(used[&capped_id] > 5, "{used:?}");
    world.stop().await;
}

/// A successor shares its predecessor's rate bucket; refused, it is told
/// so under its own id (the caller never sent the old one).
async fn a_rotated_keys_refusal_names_the_key_sent_and_the_shared_bucket(backend: Backend) {
    let db = TestDb::new(backend).await;
    // One request a day: the second within the test is always refused.
    let daily = Limits {
        requests_per_second: Some(1.0 / 86_400.0),
        burst: Some(1),
        ..Limits::default()
    };
    let (old, old_id) = key_with(&db, "alice", daily).await;
    let (successor, new_id) = {
        let store = db.store().await;
        let rotated = onejob::keys::rotate(
            store.as_ref(),
            &SystemClock,
            &old_id,
            Duration::from_secs(3_600),
            "test",
            None,
        )
        .await
        .unwrap();
        store.close().await;
        (rotated.created.secret, rotated.created.record.id)
    };
    let (address, stop, task) = serve(test_config(&db), db.store().await).await;

    assert_eq!(post_job(&address, &old, "r-1").await.status(), 201);
    let refused = post_job(&address, &successor, "r-2").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "key {new_id} of owner alice (rotated from key {old_id}, whose limits and counts it shares)"
        )),
        "{message}"
    );
    // The old key, refused in turn, is named alone.
    let refused = post_job(&address, &old, "r-3").await;
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("key {old_id} of owner alice is over")),
        "{message}"
    );
    let _ = stop.send(());
    task.await.unwrap();
}
