//! Signed webhooks on both backends, with a real receiver on a real socket:
//! a finished job is delivered once and its signature verifies with the
//! `standardwebhooks` Python library; retries keep one `webhook-id` with
//! growing gaps (on an injected clock, no waiting); every way a job ends
//! is delivered with its type; another owner's jobs never reach an
//! endpoint; private addresses are refused, at registration and at connect
//! time; a job's end and its outbox row commit together; a slow endpoint
//! does not hold up another's; 410 disables; rotation signs with both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::receiver::{verify_with_python, Behaviour, Receiver};
use common::world::{route, start_world, ProviderSpec};
use common::{Backend, TestDb};
use onejob::app::Application;
use onejob::clock::{Clock, SystemClock};
use onejob::config::{Config, DatabaseUrl};
use onejob::domain::attempt::NewAttempt;
use onejob::domain::{AttemptId, JobId};
use onejob::domain::{AttemptKind, Millis};
use onejob::metrics::Metrics;
use onejob::store::{AttemptOutcome, FinishAttempt, JobTransition, Store};
use onejob::webhooks::delivery::Deliverer;
use onejob::webhooks::secrets::SecretKey;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The key secrets are sealed with in these tests.
fn test_key() -> SecretKey {
    SecretKey::from_bytes([42; 32])
}

/// Time the test moves by hand.
struct ManualClock(AtomicI64);

impl ManualClock {
    fn set(&self, at: Millis) {
        self.0.store(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// A server (engine off, its own webhook sender off) on `backend` whose
/// deliveries the test sends itself, step by step, with `deliverer`.
struct Hooks {
    address: String,
    client: reqwest::Client,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    deliverer: Arc<Deliverer>,
    alice: String,
    bob: String,
    admin: String,
    db: TestDb,
    _stop: oneshot::Sender<()>,
}

async fn hooks(backend: Backend, tune: impl FnOnce(&mut Config)) -> Hooks {
    let db = TestDb::new(backend).await;
    let mut config = common::test_config(&db);
    config.webhooks.enabled = false;
    config.webhooks.allow_private_networks = true;
    config.webhooks.retry_base_ms = 1_000;
    config.webhooks.retry_cap_ms = 60_000;
    config.webhooks.max_attempts = 5;
    config.webhook_key = Some(test_key());
    tune(&mut config);
    let store = db.store().await;
    let clock = Arc::new(ManualClock(AtomicI64::new(SystemClock.now_ms())));
    let deliverer = Deliverer::new(
        config.webhooks.clone(),
        config.webhook_key.clone(),
        store.clone(),
        clock.clone(),
        Arc::new(Metrics::default()),
    )
    .unwrap();
    let app = Application::with_store(config, store.clone(), clock.clone())
        .await
        .unwrap();
    let address = format!("http://{}", app.local_addr());
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        app.run_until_stopped(async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    let key = |owner: &'static str, admin: bool| {
        let store = store.clone();
        async move {
            onejob::keys::create_key(store.as_ref(), &SystemClock, owner, admin)
                .await
                .unwrap()
        }
    };
    Hooks {
        alice: key("alice", false).await,
        bob: key("bob", false).await,
        admin: key("ops", true).await,
        address,
        client: reqwest::Client::new(),
        store,
        clock,
        deliverer,
        db,
        _stop: tx,
    }
}

impl Hooks {
    async fn call(&self, method: &str, key: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.address);
        let request = match method {
            "POST" => self.client.post(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.get(url),
        }
        .bearer_auth(key);
        let request = match body {
            Some(b) => request.json(&b),
            None => request,
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A new endpoint of the key's owner; (id, secret).
    async fn endpoint(&self, key: &str, url: &str, events: Option<&[&str]>) -> (String, String) {
        let mut body = json!({ "url": url, "description": "test receiver" });
        if let Some(events) = events {
            body["events"] = json!(events);
        }
        let (status, created) = self.call("POST", key, "/v1/webhooks", Some(body)).await;
        assert_eq!(status, 201, "{created}");
        (
            created["id"].as_str().unwrap().to_string(),
            created["secret"].as_str().unwrap().to_string(),
        )
    }

    /// A pending job of the key's owner; its id.
    async fn job(&self, key: &str, idempotency_key: &str) -> String {
        let response = self
            .client
            .post(format!("{}/v1/jobs", self.address))
            .bearer_auth(key)
            .header("Idempotency-Key", idempotency_key)
            .json(&common::chat_body(idempotency_key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["id"].as_str().unwrap().to_string()
    }

    async fn cancel(&self, key: &str, job_id: &str) {
        let (status, body) = self
            .call("POST", key, &format!("/v1/jobs/{job_id}/cancel"), None)
            .await;
        assert_eq!(status, 200, "{body}");
    }

    async fn deliveries(&self, endpoint: &str) -> Vec<Value> {
        let (status, body) = self
            .call(
                "GET",
                &self.admin,
                &format!("/v1/webhooks/{endpoint}/deliveries"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["data"].as_array().unwrap().clone()
    }
}

/// Epoch milliseconds of an RFC 3339 text.
fn ms(text: &Value) -> Millis {
    humantime::parse_rfc3339(text.as_str().unwrap())
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as Millis
}

async fn a_finished_job_is_delivered_once_and_its_signature_verifies(backend: Backend) {
    let Some(python) = common::python::python() else {
        return;
    };
    let mut receiver = Receiver::start(Behaviour::default()).await;
    let world = start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        |config| {
            config.webhooks.allow_private_networks = true;
            config.webhooks.poll_interval_ms = 20;
            config.webhook_key = Some(test_key());
        },
    )
    .await;
    let (status, created) = world
        .post(
            &world.key,
            "/v1/webhooks",
            &json!({ "url": receiver.url, "description": "orders backend" }),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{created}");
    let endpoint = created["id"].as_str().unwrap().to_string();
    // The listing never shows the secret.
    let (_, listed) = world.get(&world.key, "/v1/webhooks").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert!(!listed.to_string().contains(&secret[6..]), "{listed}");

    let (status, job) = world
        .submit("wh-order-1", &common::chat_body("hello"), Some(10))
        .await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    let got = receiver.next().await;
    assert_eq!(got.event_type, "job.succeeded");
    assert_eq!(got.job_id, job["id"].as_str().unwrap());
    assert!(got.id.starts_with("msg_"), "{}", got.id);
    let body: Value = serde_json::from_str(&got.body).unwrap();
    let (_, shown) = world
        .get(
            &world.key,
            &format!("/v1/jobs/{}", job["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(
        body["data"], shown,
        "data is the job as GET /v1/jobs/{{id}} shows it"
    );
    assert!(body["timestamp"].is_string());

    let verdicts = verify_with_python(&python, &secret, std::slice::from_ref(&got)).await;
    assert_eq!(
        verdicts,
        vec![json!({ "verified": true, "type": "job.succeeded" })]
    );
    // The library is not fooled by another body or another secret.
    let mut tampered = got.clone();
    tampered.body = tampered.body.replace("succeeded", "failed");
    let other = onejob::webhooks::signing::new_secret().unwrap();
    assert_eq!(
        verify_with_python(&python, &secret, std::slice::from_ref(&tampered)).await[0]["verified"],
        false
    );
    assert_eq!(
        verify_with_python(&python, &other, std::slice::from_ref(&got)).await[0]["verified"],
        false
    );

    // Delivered once: recorded as such, and nothing more arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let delivery = loop {
        let (_, d) = world
            .get(&world.key, &format!("/v1/webhooks/{endpoint}/deliveries"))
            .await;
        let first = d["data"][0].clone();
        if first["state"] == "delivered" {
            break first;
        }
        assert!(tokio::time::Instant::now() < deadline, "{d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(delivery["id"], got.id.as_str());
    assert_eq!(delivery["tries"], 1);
    assert_eq!(delivery["attempts"][0]["status"], 200);
    assert!(delivery["attempts"][0]["latency_ms"].as_i64().unwrap() >= 0);
    assert_eq!(receiver.all().len(), 1);
    let metrics = world.metrics().await;
    assert!(
        metrics.contains("onejob_webhook_deliveries{state=\"delivered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("onejob_webhook_tries_total{outcome=\"delivered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("onejob_webhook_latency_seconds_count 1"),
        "{metrics}"
    );
    world.stop().await;
}

async fn a_receiver_failing_three_times_gets_one_id_four_times_with_growing_gaps(backend: Backend) {
    let h = hooks(backend, |_| {}).await;
    let mut receiver = Receiver::start(Behaviour {
        statuses: vec![500, 500, 500],
        ..Behaviour::default()
    })
    .await;
    let (endpoint, _) = h.endpoint(&h.alice, &receiver.url, None).await;
    let job = h.job(&h.alice, "wh-retry").await;
    h.cancel(&h.alice, &job).await;

    let mut tries = Vec::new();
    for n in 1..=4 {
        assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1, "try {n}");
        tries.push(receiver.next().await);
        let d = h.deliveries(&endpoint).await[0].clone();
        if n < 4 {
            assert_eq!(d["state"], "pending", "{d}");
            // Not a moment early: one millisecond before it is due, nothing goes.
            let due = ms(&d["next_attempt_at"]);
            h.clock.set(due - 1);
            assert_eq!(
                h.deliverer.deliver_due().await.unwrap(),
                0,
                "try {n}: early"
            );
            h.clock.set(due);
        } else {
            assert_eq!(d["state"], "delivered", "{d}");
        }
    }
    // Nothing after the 200, however long we wait.
    h.clock.set(h.clock.now_ms() + 86_400_000);
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 0);
    assert!(receiver.try_next().is_none());
    assert_eq!(receiver.all().len(), 4);

    let ids: Vec<&str> = tries.iter().map(|t| t.id.as_str()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert!(
        tries.iter().all(|t| t.body == tries[0].body),
        "the same body bytes"
    );
    assert_eq!(tries[0].event_type, "job.cancelled");
    let d = h.deliveries(&endpoint).await[0].clone();
    let at: Vec<Millis> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| ms(&a["at"]))
        .collect();
    let statuses: Vec<i64> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_i64().unwrap())
        .collect();
    assert_eq!(statuses, vec![500, 500, 500, 200]);
    let gaps: Vec<Millis> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // Base 1 s with equal jitter: [0.5, 1] s, [1, 2] s, [2, 4] s.
    assert!((500..=1_000).contains(&gaps[0]), "{gaps:?}");
    assert!(
        gaps[0] <= gaps[1] && gaps[1] <= gaps[2] && gaps[0] < gaps[2],
        "{gaps:?}"
    );
    // Each try's timestamp header is its own time (whole seconds, as the
    // spec has it, so two tries under a second apart may share one); the
    // signature follows it.
    let stamps: Vec<i64> = tries.iter().map(|t| t.timestamp.parse().unwrap()).collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    assert!(stamps[0] < stamps[3], "{stamps:?}");
}

async fn jobs_ending_in_failure_review_cancel_or_unknown_are_delivered_with_their_type(
    backend: Backend,
) {
    let h = hooks(backend, |_| {}).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    let (endpoint, _) = h
        .endpoint(
            &h.alice,
            &receiver.url,
            Some(&[
                "job.failed",
                "job.needs_review",
                "job.cancelled",
                "attempt.unknown",
            ]),
        )
        .await;
    let at = h.clock.now_ms();
    let failed = h.job(&h.alice, "wh-failed").await;
    assert!(h
        .store
        .transition_job(
            &JobId::from(&failed),
            None,
            JobTransition::Fail {
                reason: "the provider refused".into()
            },
            at
        )
        .await
        .unwrap());
    let reviewed = h.job(&h.alice, "wh-review").await;
    // An attempt whose outcome is unknown, then the job to review.
    let attempt = h
        .store
        .start_attempt(NewAttempt {
            id: AttemptId::new(),
            job_id: JobId::from(&reviewed),
            provider: "sim".into(),
            kind: AttemptKind::Primary,
            max_hedges: 1,
            reuses_key: false,
            started_at: at,
        })
        .await
        .unwrap()
        .unwrap();
    h.store
        .finish_attempt(FinishAttempt {
            attempt_id: attempt.id.clone(),
            outcome: AttemptOutcome::unknown("timeout".into(), "no answer in time"),
            at: at + 1,
            actor: "engine".into(),
        })
        .await
        .unwrap();
    assert!(h
        .store
        .transition_job(
            &JobId::from(&reviewed),
            None,
            JobTransition::Review {
                reason: "nobody can settle it".into()
            },
            at + 2
        )
        .await
        .unwrap());
    let cancelled = h.job(&h.alice, "wh-cancel").await;
    h.cancel(&h.alice, &cancelled).await;
    // A job that succeeds is not sent: the endpoint did not subscribe to it.
    let resolved = h.job(&h.alice, "wh-resolved").await;
    h.store
        .resolve_job(
            &JobId::from(&resolved),
            onejob::store::JobResolution::Complete {
                result: "{\"ok\":true}".into(),
            },
            "ops",
            "done by hand",
            at,
        )
        .await
        .unwrap()
        .unwrap();

    // The review was written 2 ms on: its event is due from then.
    h.clock.set(at + 2);
    let sent = h.deliverer.deliver_due().await.unwrap();
    let types: Vec<String> = receiver.all().into_iter().map(|r| r.event_type).collect();
    assert_eq!(sent, 4, "{types:?}");
    let mut got: Vec<(String, String)> = (0..4)
        .map(|_| receiver.try_next().unwrap())
        .map(|r| (r.event_type, r.job_id))
        .collect();
    got.sort();
    let mut want = vec![
        ("attempt.unknown".to_string(), reviewed.clone()),
        ("job.cancelled".to_string(), cancelled.clone()),
        ("job.failed".to_string(), failed.clone()),
        ("job.needs_review".to_string(), reviewed.clone()),
    ];
    want.sort();
    assert_eq!(got, want);
    let unknown = receiver
        .all()
        .into_iter()
        .find(|r| r.event_type == "attempt.unknown")
        .unwrap();
    let body: Value = serde_json::from_str(&unknown.body).unwrap();
    assert_eq!(body["data"]["attempt_id"], attempt.id.as_str());
    assert_eq!(
        body["data"]["state"], "running",
        "the job as it was then: {body}"
    );
    let review: Value = serde_json::from_str(
        &receiver
            .all()
            .into_iter()
            .find(|r| r.event_type == "job.needs_review")
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(review["data"]["state"], "needs_review");
    assert_eq!(review["data"]["last_error"], "nobody can settle it");
    assert_eq!(h.deliveries(&endpoint).await.len(), 4);
}

async fn another_owners_job_is_never_delivered_to_this_endpoint(backend: Backend) {
    let h = hooks(backend, |_| {}).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    let (endpoint, _) = h.endpoint(&h.alice, &receiver.url, None).await;
    let bobs = h.job(&h.bob, "wh-same-key").await;
    h.cancel(&h.bob, &bobs).await;
    let alices = h.job(&h.alice, "wh-same-key").await;
    h.cancel(&h.alice, &alices).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    assert_eq!(receiver.next().await.job_id, alices);
    assert!(receiver.try_next().is_none());

    // Bob sees none of Alice's endpoints, deliveries or actions.
    let (status, listed) = h.call("GET", &h.bob, "/v1/webhooks", None).await;
    assert_eq!((status, listed["data"].as_array().unwrap().len()), (200, 0));
    for (method, path) in [
        ("GET", format!("/v1/webhooks/{endpoint}")),
        ("GET", format!("/v1/webhooks/{endpoint}/deliveries")),
        ("POST", format!("/v1/webhooks/{endpoint}/rotate")),
        ("DELETE", format!("/v1/webhooks/{endpoint}")),
    ] {
        let (status, body) = h.call(method, &h.bob, &path, None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
    // Bob may not create an endpoint for Alice.
    let (status, body) = h
        .call(
            "POST",
            &h.bob,
            "/v1/webhooks",
            Some(json!({ "url": receiver.url, "owner": "alice" })),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_request"))
    );
    // The admin sees every owner's.
    h.endpoint(&h.bob, &receiver.url, None).await;
    let (_, all) = h.call("GET", &h.admin, "/v1/webhooks", None).await;
    let owners: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners, vec!["alice", "bob"]);
    let (_, one) = h
        .call("GET", &h.admin, "/v1/webhooks?owner=bob", None)
        .await;
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(h.deliveries(&endpoint).await.len(), 1);
}

async fn a_private_address_is_refused_by_default(backend: Backend) {
    let h = hooks(backend, |c| c.webhooks.allow_private_networks = false).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    for url in [
        receiver.url.clone(),
        format!("https://127.0.0.1:{}/hook", receiver.port),
        "https://10.1.2.3/hook".to_string(),
        "https://169.254.169.254/latest/meta-data".to_string(),
        "https://[::1]/hook".to_string(),
        "https://[::ffff:127.0.0.1]/hook".to_string(),
        "https://2130706433/hook".to_string(),
        "ftp://hooks.example.com/".to_string(),
    ] {
        let (status, body) = h
            .call(
                "POST",
                &h.alice,
                "/v1/webhooks",
                Some(json!({ "url": url })),
            )
            .await;
        assert_eq!(status, 422, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{url}: {body}");
    }
    let (status, body) = h
        .call(
            "POST",
            &h.alice,
            "/v1/webhooks",
            Some(json!({ "url": "https://hooks.example.com/x", "events": ["job.exploded"] })),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_request"))
    );
    // A name is checked where it becomes an address: "localhost" passes
    // registration and is refused at connect time (as a rebound name would be).
    let (endpoint, _) = h
        .endpoint(
            &h.alice,
            &format!("https://localhost:{}/hook", receiver.port),
            None,
        )
        .await;
    let job = h.job(&h.alice, "wh-private").await;
    h.cancel(&h.alice, &job).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    assert!(receiver.try_next().is_none());
    let d = h.deliveries(&endpoint).await[0].clone();
    assert_eq!(d["state"], "pending", "{d}");
    let error = d["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("private"), "{error}");
    assert!(d["attempts"][0]["status"].is_null());
    assert!(receiver.all().is_empty());
}

async fn a_jobs_end_and_its_outbox_row_commit_together(backend: Backend) {
    use sqlx::Connection;
    let h = hooks(backend, |_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    h.endpoint(&h.alice, &receiver.url, None).await;
    let job = h.job(&h.alice, "wh-atomic").await;
    let end =
        "UPDATE jobs SET state = 'succeeded', version = version + 1, result = '{}' WHERE id = $1";
    let count = "SELECT COUNT(*) FROM webhook_deliveries WHERE job_id = $1";
    macro_rules! check {
        ($conn:expr, $other:expr) => {{
            let mut tx = $conn.begin().await.unwrap();
            sqlx::query(end).bind(&job).execute(&mut *tx).await.unwrap();
            let (inside,): (i64,) = sqlx::query_as(count)
                .bind(&job)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(inside, 1, "the end's own transaction holds its outbox row");
            let (outside,): (i64,) = sqlx::query_as(count)
                .bind(&job)
                .fetch_one(&mut $other)
                .await
                .unwrap();
            assert_eq!(outside, 0, "nobody sees the row before the end commits");
            tx.rollback().await.unwrap();
            let (after,): (i64,) = sqlx::query_as(count)
                .bind(&job)
                .fetch_one(&mut $other)
                .await
                .unwrap();
            assert_eq!(after, 0, "rolled back with the end");
            let (state,): (String,) = sqlx::query_as("SELECT state FROM jobs WHERE id = $1")
                .bind(&job)
                .fetch_one(&mut $other)
                .await
                .unwrap();
            assert_eq!(state, "pending");
            let mut tx = $conn.begin().await.unwrap();
            sqlx::query(end).bind(&job).execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
            let (committed,): (i64,) = sqlx::query_as(count)
                .bind(&job)
                .fetch_one(&mut $other)
                .await
                .unwrap();
            assert_eq!(committed, 1, "committed with the end");
        }};
    }
    match &h.db.url {
        DatabaseUrl::Sqlite(path) => {
            let url = format!("sqlite://{}", path.display());
            let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
            let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
            check!(conn, other);
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            let mut other = sqlx::PgConnection::connect(url).await.unwrap();
            check!(conn, other);
        }
    }
}

async fn a_slow_endpoint_does_not_delay_another_owners_delivery(backend: Backend) {
    let h = hooks(backend, |c| {
        c.webhooks.concurrency_per_endpoint = 2;
        c.webhooks.timeout_ms = 60_000;
    })
    .await;
    let mut slow = Receiver::start(Behaviour {
        gated: true,
        ..Behaviour::default()
    })
    .await;
    let mut fast = Receiver::start(Behaviour::default()).await;
    h.endpoint(&h.alice, &slow.url, None).await;
    h.endpoint(&h.bob, &fast.url, None).await;
    // Alice's backlog is older than Bob's event.
    for i in 0..6 {
        let job = h.job(&h.alice, &format!("wh-slow-{i}")).await;
        h.cancel(&h.alice, &job).await;
    }
    h.clock.set(h.clock.now_ms() + 1);
    let bobs = h.job(&h.bob, "wh-fast").await;
    h.cancel(&h.bob, &bobs).await;
    h.clock.set(h.clock.now_ms() + 1);

    let sending = h.deliverer.clone().claim_and_send().await.unwrap();
    assert_eq!(
        sending.len(),
        3,
        "two of the slow endpoint's backlog, and Bob's"
    );
    assert_eq!(fast.next().await.job_id, bobs);
    // Meanwhile the slow endpoint holds its two, and no claim takes more of it.
    slow.next().await;
    slow.next().await;
    assert!(h
        .deliverer
        .clone()
        .claim_and_send()
        .await
        .unwrap()
        .is_empty());
    slow.release(2);
    for task in sending {
        task.await.unwrap();
    }
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 2);
    assert_eq!(slow.max_concurrent(), 2);
    slow.release(100);
}

async fn a_410_disables_the_endpoint_and_a_redelivery_keeps_its_id(backend: Backend) {
    let h = hooks(backend, |_| {}).await;
    let mut receiver = Receiver::start(Behaviour {
        statuses: vec![410],
        ..Behaviour::default()
    })
    .await;
    let (endpoint, _) = h.endpoint(&h.alice, &receiver.url, None).await;
    let job = h.job(&h.alice, "wh-gone").await;
    h.cancel(&h.alice, &job).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let first = receiver.next().await;
    let (_, shown) = h
        .call("GET", &h.alice, &format!("/v1/webhooks/{endpoint}"), None)
        .await;
    assert_eq!(shown["enabled"], false, "{shown}");
    assert!(shown["disabled_reason"].as_str().unwrap().contains("410"));
    let d = h.deliveries(&endpoint).await[0].clone();
    assert_eq!(d["state"], "failed");
    // A disabled endpoint gets no new events.
    let later = h.job(&h.alice, "wh-after-gone").await;
    h.cancel(&h.alice, &later).await;
    assert_eq!(h.deliveries(&endpoint).await.len(), 1);

    // A redelivery: 409 while pending, else the same id and body again.
    let path = format!("/v1/webhooks/{endpoint}/deliveries/{}/redeliver", first.id);
    let (status, body) = h.call("POST", &h.alice, &path, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "pending");
    // Answered as the list shows it: the try made so far, which `tries` counts.
    assert_eq!(body["tries"], 1, "{body}");
    assert_eq!(body["attempts"], d["attempts"], "{body}");
    assert_eq!(body["attempts"][0]["status"], 410, "{body}");
    let (status, body) = h.call("POST", &h.alice, &path, None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("delivery_pending"))
    );
    let (status, _) = h.call("POST", &h.bob, &path, None).await;
    assert_eq!(status, 404);
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let again = receiver.next().await;
    assert_eq!(
        (again.id.as_str(), again.body.as_str()),
        (first.id.as_str(), first.body.as_str())
    );
    let d = h.deliveries(&endpoint).await[0].clone();
    assert_eq!(
        (d["state"].as_str(), d["tries"].as_i64()),
        (Some("delivered"), Some(2))
    );

    // Delete takes the endpoint and its deliveries.
    let (status, _) = h
        .call(
            "DELETE",
            &h.alice,
            &format!("/v1/webhooks/{endpoint}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = h
        .call("GET", &h.alice, &format!("/v1/webhooks/{endpoint}"), None)
        .await;
    assert_eq!(status, 404);
}

/// A server without the webhook key (one of several on the database, its
/// environment incomplete) claims nothing: its sender stops by itself, and
/// the delivery is still pending, untried, for a server that can sign.
async fn a_server_without_the_key_leaves_deliveries_to_one_with_it(backend: Backend) {
    let h = hooks(backend, |_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let (endpoint, _) = h.endpoint(&h.alice, &receiver.url, None).await;
    let job = h.job(&h.alice, "wh-keyless").await;
    h.cancel(&h.alice, &job).await;
    let mut config = common::test_config(&h.db);
    config.webhooks.enabled = true;
    let keyless = Deliverer::new(
        config.webhooks.clone(),
        None,
        h.store.clone(),
        h.clock.clone(),
        Arc::new(Metrics::default()),
    )
    .unwrap();
    let (_never, stopped) = tokio::sync::watch::channel(false);
    tokio::time::timeout(Duration::from_secs(10), keyless.run(stopped))
        .await
        .expect("a sender without a key returns at once, unstopped");
    let d = h.deliveries(&endpoint).await[0].clone();
    assert_eq!(
        (d["state"].as_str(), d["tries"].as_i64()),
        (Some("pending"), Some(0)),
        "{d}"
    );
    // The server with the key sends it.
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let d = h.deliveries(&endpoint).await[0].clone();
    assert_eq!(d["state"], "delivered", "{d}");
}

/// One URL is one endpoint per owner: a second registration would deliver
/// every event twice under two ids. Another owner may use the same URL.
async fn a_url_is_registered_once_per_owner(backend: Backend) {
    let h = hooks(backend, |_| {}).await;
    let url = "http://127.0.0.1:9/hook";
    let (first, _) = h.endpoint(&h.alice, url, None).await;
    for (key, body) in [
        (&h.alice, json!({ "url": url })),
        (
            &h.admin,
            json!({ "url": url, "owner": "alice", "events": ["job.failed"] }),
        ),
    ] {
        let (status, answer) = h.call("POST", key, "/v1/webhooks", Some(body)).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("endpoint_exists")),
            "{answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&first),
            "{answer}"
        );
    }
    let alices = h
        .store
        .list_webhook_endpoints(Some(&"alice".into()))
        .await
        .unwrap();
    assert_eq!(alices.len(), 1);
    h.endpoint(&h.bob, url, None).await;
    assert_eq!(h.store.list_webhook_endpoints(None).await.unwrap().len(), 2);
}

async fn during_a_rotation_both_secrets_sign(backend: Backend) {
    let Some(python) = common::python::python() else {
        return;
    };
    let h = hooks(backend, |c| c.webhooks.rotation_grace_ms = 3_600_000).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    let (endpoint, old) = h.endpoint(&h.alice, &receiver.url, None).await;
    let (status, rotated) = h
        .call(
            "POST",
            &h.alice,
            &format!("/v1/webhooks/{endpoint}/rotate"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert!(rotated["previous_secret_until"].is_string());
    let job = h.job(&h.alice, "wh-rotate").await;
    h.cancel(&h.alice, &job).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let during = receiver.next().await;
    assert_eq!(
        during.signature.split(' ').count(),
        2,
        "{}",
        during.signature
    );
    for secret in [&old, &new] {
        let v = verify_with_python(&python, secret, std::slice::from_ref(&during)).await;
        assert_eq!(v[0]["verified"], true, "{v:?}");
    }
    // After the grace period only the new one signs.
    h.clock.set(h.clock.now_ms() + 3_600_001);
    let job = h.job(&h.alice, "wh-rotate-after").await;
    h.cancel(&h.alice, &job).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let after = receiver.next().await;
    assert_eq!(after.signature.split(' ').count(), 1);
    assert!(after.signature.starts_with("v1,"));
    // Python checks the timestamp against the real clock; ours moved an hour.
    let now = onejob::webhooks::signing::sign(
        &new,
        &after.id,
        after.timestamp.parse().unwrap(),
        &after.body,
    )
    .unwrap();
    assert_eq!(after.signature, now);
}

async fn bad_input_gets_a_stable_code_and_writes_nothing(backend: Backend) {
    let h = hooks(backend, |c| c.webhook_key = None).await;
    let (status, body) = h
        .call(
            "POST",
            &h.alice,
            "/v1/webhooks",
            Some(json!({ "url": "http://127.0.0.1:9/hook" })),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("webhooks_not_configured"))
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("ONEJOB_WEBHOOK_KEY"));
    let h = hooks(backend, |_| {}).await;
    for (body, code, status) in [
        (json!({ "url": 5 }), "invalid_request", 422),
        (json!({ "events": ["job.failed"] }), "invalid_request", 422),
        (
            json!({ "url": "http://127.0.0.1:9/", "colour": "red" }),
            "invalid_request",
            422,
        ),
        (
            json!({ "url": "http://127.0.0.1:9/", "events": [] }),
            "invalid_request",
            422,
        ),
        // Control characters: a NUL PostgreSQL cannot store, escapes that
        // would reach an operator's terminal through `webhooks list`, a tab
        // the URL parser would drop (stored would not be called).
        (
            json!({ "url": "http://127.0.0.1:9/ho\0ok" }),
            "invalid_request",
            422,
        ),
        (
            json!({ "url": "http://127.0.0.1:9/\u{1b}]0;pwned\u{7}" }),
            "invalid_request",
            422,
        ),
        (
            json!({ "url": "http://127.0.0.1:9/ta\tb" }),
            "invalid_request",
            422,
        ),
        (
            json!({ "url": "http://127.0.0.1:9/", "description": "d\0" }),
            "invalid_request",
            422,
        ),
    ] {
        let (s, answer) = h
            .call("POST", &h.alice, "/v1/webhooks", Some(body.clone()))
            .await;
        assert_eq!(
            (s, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    let response = h
        .client
        .post(format!("{}/v1/webhooks", h.address))
        .bearer_auth(&h.alice)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(common::error_code(response).await, "malformed_json");
    let (status, _) = h.call("GET", "oj_nobody", "/v1/webhooks", None).await;
    assert_eq!(status, 401);
    // A rotation takes no field: a grace a client believes it set (as a
    // key's rotation takes one) is refused, not ignored; an empty body or
    // `{}` is a rotation.
    let (endpoint, secret) = h.endpoint(&h.alice, "https://example.com/hook", None).await;
    let rotate = format!("/v1/webhooks/{endpoint}/rotate");
    let (s, answer) = h
        .call("POST", &h.alice, &rotate, Some(json!({ "grace": "1h" })))
        .await;
    assert_eq!(
        (s, answer["error"]["code"].as_str()),
        (422, Some("invalid_request")),
        "{answer}"
    );
    let (s, answer) = h.call("POST", &h.alice, &rotate, Some(json!({}))).await;
    assert_eq!(s, 200, "{answer}");
    assert_ne!(answer["secret"].as_str(), Some(secret.as_str()));
    h.call(
        "DELETE",
        &h.alice,
        &format!("/v1/webhooks/{endpoint}"),
        None,
    )
    .await;
    // A query string of the wrong shape is the same 422, in JSON; so is a
    // NUL in the path or the query (a 500 on PostgreSQL before).
    for path in [
        "/v1/webhooks?colour=red",
        "/v1/webhooks/wh_x/deliveries?limit=abc",
        "/v1/webhooks/wh_x/deliveries?limit=0",
        "/v1/webhooks/wh_x/deliveries?limit=501",
        "/v1/webhooks?owner=%00",
        "/v1/webhooks?owner=al%20ice",
        "/v1/admin/keys?owner=al%20ice",
        "/v1/admin/usage?owner=al%20ice",
        "/v1/webhooks/%00",
        "/v1/webhooks/wh_x%00/deliveries",
    ] {
        let response = h
            .client
            .get(format!("{}{path}", h.address))
            .bearer_auth(&h.admin)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{path}");
        assert_eq!(
            common::error_code(response).await,
            "invalid_request",
            "{path}"
        );
    }
    assert!(h
        .store
        .list_webhook_endpoints(None)
        .await
        .unwrap()
        .is_empty());
}

on_both_backends!(
    a_finished_job_is_delivered_once_and_its_signature_verifies,
    a_receiver_failing_three_times_gets_one_id_four_times_with_growing_gaps,
    jobs_ending_in_failure_review_cancel_or_unknown_are_delivered_with_their_type,
    another_owners_job_is_never_delivered_to_this_endpoint,
    a_private_address_is_refused_by_default,
    a_jobs_end_and_its_outbox_row_commit_together,
    a_slow_endpoint_does_not_delay_another_owners_delivery,
    a_410_disables_the_endpoint_and_a_redelivery_keeps_its_id,
    during_a_rotation_both_secrets_sign,
    a_server_without_the_key_leaves_deliveries_to_one_with_it,
    a_url_is_registered_once_per_owner,
    a_rotation_after_the_key_changed_signs_with_the_new_secret_alone,
    bad_input_gets_a_stable_code_and_writes_nothing,
);

/// The server's key was changed after an endpoint was registered: its
/// stored secret no longer opens, and webhooks.md says to rotate it. The
/// rotation's grace keeps the old secret beside the new one, but sealed
/// under the old key it cannot sign: the new secret signs alone, at once,
/// instead of every try failing until the grace ends.
async fn a_rotation_after_the_key_changed_signs_with_the_new_secret_alone(backend: Backend) {
    use onejob::webhooks::endpoints::{Actor, NewEndpoint, Webhooks};
    let h = hooks(backend, |c| c.webhooks.rotation_grace_ms = 3_600_000).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    let old_key = SecretKey::from_bytes([7; 32]);
    let config = onejob::webhooks::WebhooksConfig {
        allow_private_networks: true,
        ..Default::default()
    };
    let then = Webhooks {
        store: h.store.as_ref(),
        clock: &SystemClock,
        config: &config,
        key: Some(&old_key),
    };
    let alice = onejob::domain::OwnerId::from("alice");
    let actor = Actor {
        owner_id: &alice,
        is_admin: false,
    };
    let new_endpoint = NewEndpoint {
        url: receiver.url.clone(),
        events: None,
        description: None,
        owner: None,
    };
    let (endpoint, _) = then.create(actor, new_endpoint).await.unwrap();

    let (status, rotated) = h
        .call(
            "POST",
            &h.alice,
            &format!("/v1/webhooks/{}/rotate", endpoint.id),
            None,
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_string();
    let job = h.job(&h.alice, "wh-key-changed").await;
    h.cancel(&h.alice, &job).await;
    assert_eq!(h.deliverer.deliver_due().await.unwrap(), 1);
    let got = receiver.next().await;
    let signed =
        onejob::webhooks::signing::sign(&new, &got.id, got.timestamp.parse().unwrap(), &got.body)
            .unwrap();
    assert_eq!(got.signature, signed, "the new secret alone signs");
}
