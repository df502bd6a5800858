//! Tenants that can be trusted: keys are listed, revoked, rotated and expire
//! on every instance; limits per owner (rate, concurrent jobs, tokens per
//! day) hold across instances; usage is counted, hedges and lost races too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, serve, start_world, ProviderSpec};
use common::{chat_body, error_code, test_config, Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::config::Config;
use onejob::domain::JobId;
use onejob::tenants::limits::Limits;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(20);

/// One `onejob serve` instance (API only, engine off) on a shared database.
struct Instance {
    address: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Instance {
    async fn start(db: &TestDb, tune: impl FnOnce(&mut Config)) -> Instance {
        let mut config = test_config(db);
        tune(&mut config);
        let (address, stop, task) = serve(config, db.store().await).await;
        Instance {
            address,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post_job(address: &str, key: &str, idem: &str) -> reqwest::Response {
    client()
        .post(format!("{address}/v1/jobs"))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(&chat_body(idem))
        .send()
        .await
        .unwrap()
}

async fn get(address: &str, key: &str, path: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{address}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn post(address: &str, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(format!("{address}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The status `key` gets from `GET /v1/usage` (any key may call it).
async fn status_of(address: &str, key: &str) -> u16 {
    get(address, key, "/v1/usage").await.0
}

/// Poll until `key` is refused at `address`; how long it took. Panics past `limit`.
async fn until_refused(address: &str, key: &str, since: Instant, limit: Duration) -> Duration {
    loop {
        if status_of(address, key).await == 401 {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "key still accepted at {address} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn admin_key(db: &TestDb) -> String {
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "ops", true)
        .await
        .unwrap();
    store.close().await;
    key
}

async fn key_of(db: &TestDb, owner: &str) -> String {
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, owner, false)
        .await
        .unwrap();
    store.close().await;
    key
}

/// The id of the key whose prefix starts `secret`.
async fn key_id(address: &str, admin: &str, secret: &str) -> String {
    let (_, body) = get(address, admin, "/v1/admin/keys").await;
    body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| secret.starts_with(k["prefix"].as_str().unwrap()))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn job_row(db: &TestDb, id: &str) -> (String, i64, i64) {
    let store = db.store().await;
    let job = store.get_job(&JobId::from(id)).await.unwrap().unwrap();
    store.close().await;
    (job.state.as_str().to_string(), job.version, job.updated_at)
}

async fn a_revoked_key_is_refused_on_every_instance_within_a_second(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let alice = key_of(&db, "alice").await;
    let bob = key_of(&db, "bob").await;
    let a = Instance::start(&db, |_| {}).await;
    let b = Instance::start(&db, |_| {}).await;
    let created = post_job(&a.address, &alice, "before-revoke").await;
    assert_eq!(created.status(), 201);
    let job: Value = created.json().await.unwrap();
    let job_id = job["id"].as_str().unwrap().to_string();
    let before = job_row(&db, &job_id).await;
    // Both instances have the key cached.
    for _ in 0..3 {
        assert_eq!(status_of(&a.address, &alice).await, 200);
        assert_eq!(status_of(&b.address, &alice).await, 200);
    }

    let id = key_id(&a.address, &admin, &alice).await;
    let (status, revoked) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/revoke"),
        &json!({}),
    )
    .await;
    let at = Instant::now();
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["state"], "revoked");
    assert_eq!(
        status_of(&a.address, &alice).await,
        401,
        "refused at once where it was revoked"
    );
    let took = until_refused(&b.address, &alice, at, Duration::from_secs(1)).await;
    eprintln!("revocation seen by the other instance after {took:?}");
    let r = post_job(&b.address, &alice, "after-revoke").await;
    assert_eq!(r.status(), 401);
    assert_eq!(error_code(r).await, "unauthorized");
    // A second revocation is a conflict; an unknown key is 404.
    let (status, body) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/revoke"),
        &json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("key_not_live"))
    );
    let (status, _) = post(&a.address, &admin, "/v1/admin/keys/nope/revoke", &json!({})).await;
    assert_eq!(status, 404);
    // Another owner is served throughout; the job is as it was.
    assert_eq!(status_of(&b.address, &bob).await, 200);
    assert_eq!(job_row(&db, &job_id).await, before);
    let (_, audit) = get(&a.address, &admin, "/v1/admin/tenants/audit").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], "revoke");
    assert_eq!(entry["subject"], format!("key:{id}"));
    assert_eq!(entry["actor"], "admin:ops");
    a.stop().await;
    b.stop().await;
}

async fn a_rotated_keys_old_secret_works_during_the_grace_period_and_not_after(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let old = key_of(&db, "alice").await;
    let a = Instance::start(&db, |_| {}).await;
    let b = Instance::start(&db, |_| {}).await;
    let created = post_job(&a.address, &old, "rotating").await;
    let job_id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let before = job_row(&db, &job_id).await;
    assert_eq!(status_of(&b.address, &old).await, 200);

    let id = key_id(&a.address, &admin, &old).await;
    let (status, rotated) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/rotate"),
        &json!({ "grace": "2s" }),
    )
    .await;
    let at = Instant::now();
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(rotated["old"]["state"], "rotating");
    assert_eq!(rotated["old"]["replaced_by"], rotated["key"]["id"]);
    // During the grace period both secrets work, on both instances, as the same owner.
    for address in [&a.address, &b.address] {
        assert_eq!(status_of(address, &old).await, 200);
        let (status, usage) = get(address, &new, "/v1/usage").await;
        assert_eq!((status, usage["owner"].as_str()), (200, Some("alice")));
    }
    // The new secret replays the old one's job: same owner.
    let replay = post_job(&b.address, &new, "rotating").await;
    assert_eq!(replay.status(), 200);
    assert!(
        at.elapsed() < Duration::from_secs(2),
        "the checks above ran inside the grace period"
    );
    // Then the old one is refused everywhere; the new one keeps working.
    until_refused(&a.address, &old, at, Duration::from_secs(4)).await;
    until_refused(&b.address, &old, at, Duration::from_secs(4)).await;
    assert_eq!(status_of(&a.address, &new).await, 200);
    assert_eq!(status_of(&b.address, &new).await, 200);
    let (_, listed) = get(&a.address, &admin, "/v1/admin/keys?owner=alice").await;
    let states: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), 2);
    assert!(
        states.contains(&"expired") && states.contains(&"active"),
        "{states:?}"
    );
    // A rotated key cannot be rotated again.
    let (status, _) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/rotate"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(job_row(&db, &job_id).await, before, "no job changed");
    a.stop().await;
    b.stop().await;
}

async fn an_expired_key_is_refused_and_last_use_is_recorded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let a = Instance::start(&db, |_| {}).await;
    let (status, created) = post(
        &a.address,
        &admin,
        "/v1/admin/keys",
        &json!({ "owner": "carol", "expires_in": "1s" }),
    )
    .await;
    let at = Instant::now();
    assert_eq!(status, 201, "{created}");
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(created["key"]["expires_at"].is_string());
    assert_eq!(status_of(&a.address, &secret).await, 200);
    until_refused(&a.address, &secret, at, Duration::from_secs(3)).await;
    assert!(
        at.elapsed() >= Duration::from_millis(900),
        "refused only once expired"
    );
    // Bad durations are refused by name; nothing is created.
    let (status, body) = post(
        &a.address,
        &admin,
        "/v1/admin/keys",
        &json!({ "owner": "x", "expires_in": "soon" }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_request"))
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("expires_in"));
    // `last used` is written by the batch, within about a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, listed) = get(&a.address, &admin, "/v1/admin/keys?owner=carol").await;
        let key = &listed["keys"][0];
        assert_eq!(key["state"], "expired");
        if key["last_used_at"].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "last_used_at never written: {key}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An expired key is not live: revoking it is refused and not audited.
    let id = created["key"]["id"].as_str().unwrap();
    let (status, body) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/revoke"),
        &json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("key_not_live")),
        "{body}"
    );
    let (_, audit) = get(&a.address, &admin, "/v1/admin/tenants/audit").await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["action"] != "revoke"),
        "{audit}"
    );
    // A non-admin key cannot manage keys.
    let carol2 = key_of(&db, "carol").await;
    assert_eq!(get(&a.address, &carol2, "/v1/admin/keys").await.0, 403);
    a.stop().await;
}

fn limits(config: &mut Config, owner: &str, l: Limits) {
    config.limits.owners.insert(owner.into(), l);
}

async fn the_rate_limit_answers_429_with_retry_after_and_lets_the_next_window_through(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let alice = key_of(&db, "alice").await;
    let bob = key_of(&db, "bob").await;
    let a = Instance::start(&db, |c| {
        limits(
            c,
            "alice",
            Limits {
                requests_per_second: Some(1.0),
                burst: Some(2),
                ..Limits::default()
            },
        )
    })
    .await;
    assert_eq!(post_job(&a.address, &alice, "r-1").await.status(), 201);
    assert_eq!(post_job(&a.address, &alice, "r-2").await.status(), 201);
    let refused = post_job(&a.address, &alice, "r-3").await;
    assert_eq!(refused.status(), 429);
    let headers = refused.headers().clone();
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["x-should-retry"], "true");
    let wait_ms: u64 = headers["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!((1..=1000).contains(&wait_ms), "{wait_ms}");
    assert_eq!(error_code(refused).await, "rate_limited");
    // Other owners are unaffected.
    for i in 0..5 {
        assert_eq!(
            post_job(&a.address, &bob, &format!("b-{i}")).await.status(),
            201
        );
    }
    // Nothing was written for the refused request.
    let store = db.store().await;
    assert_eq!(store.count_jobs().await.unwrap(), 7);
    // After the advertised wait, the next window lets one through.
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    assert_eq!(post_job(&a.address, &alice, "r-3").await.status(), 201);
    assert_eq!(post_job(&a.address, &alice, "r-4").await.status(), 429);
    assert_eq!(store.count_jobs().await.unwrap(), 8);
    store.close().await;
    a.stop().await;
}

async fn concurrent_jobs_are_limited_replays_are_not_and_an_admin_can_change_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let alice = key_of(&db, "alice").await;
    let bob = key_of(&db, "bob").await;
    let one = Limits {
        concurrent_jobs: Some(1),
        ..Limits::default()
    };
    let a = Instance::start(&db, |c| limits(c, "alice", one)).await;
    let b = Instance::start(&db, |c| limits(c, "alice", one)).await;
    assert_eq!(post_job(&a.address, &alice, "c-1").await.status(), 201);
    // The engine is off here: c-1 stays pending, so a second live job is refused on either instance.
    for address in [&a.address, &b.address] {
        let r = post_job(address, &alice, "c-2").await;
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["x-should-retry"], "true");
        assert_eq!(error_code(r).await, "concurrency_limited");
    }
    assert_eq!(
        post_job(&b.address, &alice, "c-1").await.status(),
        200,
        "a replay is answered"
    );
    assert_eq!(post_job(&b.address, &bob, "c-1").await.status(), 201);
    // An admin raises the limit at run time; every instance applies it within a second.
    let (status, body) = post(
        &a.address,
        &admin,
        "/v1/admin/limits/alice",
        &json!({ "limits": { "concurrent_jobs": 2 }, "reason": "launch day" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limits"]["concurrent_jobs"], 2);
    let at = Instant::now();
    loop {
        let r = post_job(&b.address, &alice, "c-2").await;
        if r.status() == 201 {
            break;
        }
        assert_eq!(r.status(), 429);
        assert!(
            at.elapsed() < Duration::from_secs(1),
            "instance b still applies the old limit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(post_job(&a.address, &alice, "c-3").await.status(), 429);
    let (_, audit) = get(&a.address, &admin, "/v1/admin/tenants/audit").await;
    assert_eq!(audit["entries"][0]["action"], "set_limits");
    assert_eq!(audit["entries"][0]["subject"], "owner:alice");
    assert_eq!(audit["entries"][0]["detail"]["reason"], "launch day");
    // Bad limits are refused by name.
    let (status, body) = post(
        &a.address,
        &admin,
        "/v1/admin/limits/alice",
        &json!({ "limits": { "concurrent_jobs": 0 }, "reason": "oops" }),
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("concurrent_jobs"),
        "{body}"
    );
    a.stop().await;
    b.stop().await;
}

async fn two_servers_share_an_owners_rate_limit(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let alice = key_of(&db, "alice").await;
    let bob = key_of(&db, "bob").await;
    let rate = Limits {
        requests_per_second: Some(2.0),
        burst: Some(4),
        ..Limits::default()
    };
    let a = Instance::start(&db, |c| limits(c, "alice", rate)).await;
    let b = Instance::start(&db, |c| limits(c, "alice", rate)).await;
    // Each instance learns from the heartbeat that there are two.
    let deadline = Instant::now() + Duration::from_secs(5);
    for address in [&a.address, &b.address] {
        while get(address, &admin, "/v1/admin/limits").await.1["live_instances"] != 2 {
            assert!(Instant::now() < deadline, "instances never saw each other");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let started = Instant::now();
    let mut admitted = 0;
    for i in 0..20 {
        let address = if i % 2 == 0 { &a.address } else { &b.address };
        match post_job(address, &alice, &format!("shared-{i}"))
            .await
            .status()
            .as_u16()
        {
            201 => admitted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
        assert_eq!(
            post_job(address, &bob, &format!("bob-{i}")).await.status(),
            201
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Tolerance: the burst (4, split 2 + 2) plus the rate over the elapsed time, split evenly.
    let most = 4 + (2.0 * elapsed).ceil() as i32;
    eprintln!("admitted {admitted} of 20 over {elapsed:.2}s across two instances (most {most})");
    assert!(
        admitted >= 4 && admitted <= most,
        "admitted {admitted}, most {most}"
    );
    a.stop().await;
    b.stop().await;
}

async fn a_budget_exhausted_owner_gets_its_code_on_every_server_with_no_attempt_made(
    backend: Backend,
) {
    let providers = [ProviderSpec {
        name: "sim",
        model: "healthy",
    }];
    let budget = Limits {
        tokens_per_day: Some(5),
        ..Limits::default()
    };
    let world = start_world(backend, &providers, route("sim", &[]), |c| {
        limits(c, "alice", budget)
    })
    .await;
    let bob = key_of(&world.db, "bob").await;
    let (status, job) = world
        .submit("spend-1", &chat_body("spend the budget"), Some(10))
        .await;
    assert_eq!(
        (status, job["state"].as_str()),
        (201, Some("succeeded")),
        "{job}"
    );
    let mut config = world.config().clone();
    config.engine.enabled = false;
    let (other, stop, task) = serve(config, world.db.store().await).await;

    let jobs_before = world.store.count_jobs().await.unwrap();
    let executions_before = world.sim.ledger().total_executions();
    for address in [&world.address, &other] {
        let r = client()
            .post(format!("{address}/v1/jobs"))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", "spend-2")
            .json(&chat_body("one more"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["x-should-retry"], "false");
        let retry_after: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=86_400).contains(&retry_after));
        assert_eq!(error_code(r).await, "budget_exhausted");
        // The OpenAI-compatible endpoint says the same.
        let r = client()
            .post(format!("{address}/v1/chat/completions"))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", "spend-3")
            .json(
                &json!({ "model": "default", "messages": [{ "role": "user", "content": "more" }] }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(error_code(r).await, "budget_exhausted");
    }
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
    // The spent job's replay is still answered; another owner is served.
    let (status, _) = world
        .submit("spend-1", &chat_body("spend the budget"), None)
        .await;
    assert_eq!(status, 200);
    let r = client()
        .post(format!("{other}/v1/jobs"))
        .bearer_auth(&bob)
        .header("Idempotency-Key", "bob-1")
        .json(&chat_body("bob"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // The owner sees what it used and what is left.
    let (status, usage) = get(&other, &world.key, "/v1/usage").await;
    assert_eq!(status, 200);
    let used = usage["budget"]["used_today"].as_i64().unwrap();
    assert!(used > 5, "{usage}");
    assert_eq!(usage["budget"]["remaining_today"], 0);
    assert_eq!(usage["lines"][0]["provider"], "sim");
    assert_eq!(usage["lines"][0]["jobs"], 1);
    assert!(usage["lines"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["owner"] == "alice"));
    let _ = stop.send(());
    task.await.unwrap();
    world.stop().await;
}

async fn usage_counts_hedges_and_discarded_answers(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=900",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy:latency=100",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 200;
    let world = start_world(backend, &providers, r, |c| c.engine.loser_grace_ms = 5_000).await;
    let (_, job) = world
        .submit("hedged-usage", &chat_body("reverse order"), None)
        .await;
    let id = job["id"].as_str().unwrap().to_string();
    world
        .until(&id, WAIT, |_, a| {
            a.iter()
                .any(|a| a["kind"] == "primary" && a["state"] == "discarded")
        })
        .await;
    let (status, usage) = get(&world.address, &world.admin_key, "/v1/admin/usage").await;
    assert_eq!(status, 200);
    let lines = usage["lines"].as_array().unwrap();
    let hedge = lines
        .iter()
        .find(|l| l["kind"] == "hedge")
        .expect("hedge line");
    let primary = lines
        .iter()
        .find(|l| l["kind"] == "primary")
        .expect("primary line");
    assert_eq!(
        (hedge["provider"].as_str(), hedge["jobs"].as_i64()),
        (Some("fallback"), Some(1))
    );
    assert_eq!(
        (primary["provider"].as_str(), primary["jobs"].as_i64()),
        (Some("primary"), Some(0))
    );
    assert!(primary["discarded_tokens"].as_i64().unwrap() > 0, "{usage}");
    assert_eq!(primary["discarded_tokens"], primary["tokens"]);
    let totals = &usage["totals"];
    assert_eq!(totals["hedge_tokens"], hedge["tokens"]);
    assert_eq!(totals["discarded_tokens"], primary["tokens"]);
    assert_eq!(
        totals["tokens"].as_i64().unwrap(),
        hedge["tokens"].as_i64().unwrap() + primary["tokens"].as_i64().unwrap(),
        "the budget counts both"
    );
    assert_eq!(world.get(&world.key, "/v1/admin/usage").await.0, 403);
    world.stop().await;
}

/// `?owner=` on the lists any key may call: its own owner is answered,
/// another owner refused (`403 forbidden`), never answered with the
/// caller's own data under the name asked for; the admin may name anyone.
async fn another_owners_list_is_refused_to_a_key_that_is_not_the_admins(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let alice = key_of(&db, "alice").await;
    let a = Instance::start(&db, |_| {}).await;
    let (status, usage) = get(&a.address, &alice, "/v1/usage?owner=alice").await;
    assert_eq!((status, &usage["owner"]), (200, &json!("alice")), "{usage}");
    let (status, listed) = get(&a.address, &alice, "/v1/webhooks?owner=alice").await;
    assert_eq!((status, &listed["data"]), (200, &json!([])), "{listed}");
    for path in ["/v1/usage?owner=bob", "/v1/webhooks?owner=bob"] {
        let (status, body) = get(&a.address, &alice, path).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{path}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("belongs to owner alice") && message.contains("admin"),
            "{message}"
        );
    }
    let (status, usage) = get(&a.address, &admin, "/v1/usage?owner=bob").await;
    assert_eq!((status, &usage["owner"]), (200, &json!("bob")), "{usage}");
    assert_eq!(
        get(&a.address, &admin, "/v1/webhooks?owner=bob").await.0,
        200
    );
    a.stop().await;
}

/// The newest entry of the tenant audit.
async fn last_audit(address: &str, admin: &str) -> (usize, Value) {
    let (status, body) = get(address, admin, "/v1/admin/tenants/audit").await;
    assert_eq!(status, 200, "{body}");
    let entries = body["entries"].as_array().unwrap();
    (entries.len(), entries[0].clone())
}

/// A key's creation is in the tenant audit like its revocation and
/// rotation; those two take an optional reason, held to the one rule
/// (a bad one refuses the change, which is then not made).
async fn every_key_change_is_audited_with_its_reason(backend: Backend) {
    let db = TestDb::new(backend).await;
    let admin = admin_key(&db).await;
    let a = Instance::start(&db, |_| {}).await;
    let (_, made_by_hand) = last_audit(&a.address, &admin).await;
    assert_eq!(
        (&made_by_hand["action"], &made_by_hand["actor"]),
        (&json!("create"), &json!("onejob")),
        "{made_by_hand}"
    );

    let (status, created) = post(
        &a.address,
        &admin,
        "/v1/admin/keys",
        &json!({ "owner": "carol", "limits": { "concurrent_jobs": 2 } }),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["key"]["id"].as_str().unwrap().to_string();
    let carol = created["secret"].as_str().unwrap().to_string();
    let (entries, entry) = last_audit(&a.address, &admin).await;
    assert_eq!(entry["action"], "create", "{entry}");
    assert_eq!(entry["subject"], format!("key:{id}"));
    assert_eq!(entry["actor"], "admin:ops");
    assert_eq!(entry["detail"]["owner"], "carol", "{entry}");
    assert_eq!(entry["detail"]["admin"], false, "{entry}");

    // A reason the rule refuses: nothing revoked, nothing audited.
    for reason in [json!("x".repeat(501)), json!(" "), json!(7)] {
        let (status, body) = post(
            &a.address,
            &admin,
            &format!("/v1/admin/keys/{id}/revoke"),
            &json!({ "reason": reason }),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reason"),
            "{body}"
        );
    }
    assert_eq!(status_of(&a.address, &carol).await, 200, "still live");
    assert_eq!(last_audit(&a.address, &admin).await.0, entries);

    let (status, rotated) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/rotate"),
        &json!({ "grace": "1h", "reason": "pasted in a ticket" }),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new_id = rotated["key"]["id"].as_str().unwrap().to_string();
    let (_, entry) = last_audit(&a.address, &admin).await;
    assert_eq!(entry["action"], "rotate");
    assert_eq!(entry["detail"]["reason"], "pasted in a ticket", "{entry}");
    assert_eq!(entry["detail"]["new_key"], new_id.as_str());

    let (status, _) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{new_id}/revoke"),
        &json!({ "reason": "  carol left  " }),
    )
    .await;
    assert_eq!(status, 200);
    let (_, entry) = last_audit(&a.address, &admin).await;
    assert_eq!(
        (&entry["action"], &entry["subject"]),
        (&json!("revoke"), &json!(format!("key:{new_id}")))
    );
    assert_eq!(entry["detail"]["reason"], "carol left", "trimmed: {entry}");
    // Without a body, as before: audited with no reason.
    let (status, _) = post(
        &a.address,
        &admin,
        &format!("/v1/admin/keys/{id}/revoke"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, entry) = last_audit(&a.address, &admin).await;
    assert_eq!(
        (&entry["action"], &entry["detail"]),
        (&json!("revoke"), &Value::Null)
    );
    a.stop().await;
}

on_both_backends!(
    a_revoked_key_is_refused_on_every_instance_within_a_second,
    a_rotated_keys_old_secret_works_during_the_grace_period_and_not_after,
    an_expired_key_is_refused_and_last_use_is_recorded,
    the_rate_limit_answers_429_with_retry_after_and_lets_the_next_window_through,
    concurrent_jobs_are_limited_replays_are_not_and_an_admin_can_change_it,
    two_servers_share_an_owners_rate_limit,
    a_budget_exhausted_owner_gets_its_code_on_every_server_with_no_attempt_made,
    usage_counts_hedges_and_discarded_answers,
    another_owners_list_is_refused_to_a_key_that_is_not_the_admins,
    every_key_change_is_audited_with_its_reason,
);
