//! Replays of finished jobs answered from memory: the same answer as the
//! database gives, conflicts still refused and recorded, the audit trail
//! kept (batched), and a succeeded job that nothing changes afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, serve, start_faulty_world, start_world, ProviderSpec, World};
use common::{chat_body, Backend};
use onejob::domain::JobId;
use serde_json::{json, Value};
use std::time::Duration;

on_both_backends!(
    a_job_whose_route_was_removed_is_still_replayed,
    replays_of_a_finished_job_come_from_memory_and_are_audited,
    a_late_losers_error_leaves_a_succeeded_job_unchanged,
    a_chat_replay_names_its_winner_without_reading_the_attempts_again,
    a_flush_of_many_jobs_writes_each_ones_count,
);

const WAIT: Duration = Duration::from_secs(10);

async fn post_raw(world: &World, key: &str, body: &[u8]) -> (u16, Option<String>, Value) {
    let response = world
        .client
        .post(format!("{}/v1/jobs", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_string());
    (status, replayed, response.json().await.unwrap())
}

/// The `replayed` events of a job, once their counts add up to `expected`
/// (they are written by a flush every second).
async fn replay_events(world: &World, job_id: &str, expected: u64) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let events: Vec<Value> = world
            .store
            .list_events(&JobId::from(job_id))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "replayed")
            .map(|e| serde_json::from_str(e.detail.as_deref().unwrap_or("null")).unwrap())
            .collect();
        let counted: u64 = events.iter().map(|d| d["count"].as_u64().unwrap()).sum();
        if counted >= expected {
            assert_eq!(counted, expected, "replays counted once each: {events:?}");
            return events;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{counted} of {expected} replays in the event log: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn replays_of_a_finished_job_come_from_memory_and_are_audited(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let body = serde_json::to_vec(&chat_body("summarise order 42")).unwrap();
    let created = world
        .client
        .post(format!("{}/v1/jobs", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "order-42")
        .header("Prefer", "wait=10")
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["state"], "succeeded");
    let id = created["id"].as_str().unwrap().to_string();
    let stored = world.job(&id).await;
    assert_eq!(world.counter("onejob_replays_from_memory_total").await, 0.0);

    for _ in 0..10 {
        let (status, replayed, job) = post_raw(&world, "order-42", &body).await;
        assert_eq!((status, replayed.as_deref()), (200, Some("true")));
        assert_eq!(job, stored, "memory answers what the database holds");
    }
    assert_eq!(
        world.counter("onejob_replays_from_memory_total").await,
        10.0,
        "the job was remembered when it finished: no replay read the database"
    );

    // The same request in other bytes: parsed, fingerprinted, still from memory.
    let reordered = json!({
        "route": "default",
        "params": { "temperature": 0.0 },
        "messages": [{ "content": "summarise order 42", "role": "user" }],
    });
    let reordered = serde_json::to_vec_pretty(&reordered).unwrap();
    let (status, replayed, job) = post_raw(&world, "order-42", &reordered).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("true")));
    assert_eq!(job, stored);
    assert_eq!(
        world.counter("onejob_replays_from_memory_total").await,
        11.0
    );

    // Another payload under the key is a conflict, recorded, changing nothing.
    let other = serde_json::to_vec(&chat_body("summarise order 43")).unwrap();
    let (status, _, error) = post_raw(&world, "order-42", &other).await;
    assert_eq!(status, 409);
    assert_eq!(error["error"]["code"], "idempotency_key_reused");
    let events = world.store.list_events(&JobId::from(&id)).await.unwrap();
    assert!(
        events.iter().any(|e| e.kind == "conflict"),
        "the conflict is in the event log: {events:?}"
    );
    assert_eq!(world.job(&id).await, stored);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    assert_eq!(world.executions(&id, "primary"), 1);

    // Every replay is in the audit trail: one event per job per flush, with
    // its count.
    let audited = replay_events(&world, &id, 11).await;
    assert!(
        audited.len() <= 11 && !audited.is_empty(),
        "batched: {audited:?}"
    );
    world.stop().await;
}

async fn a_late_losers_error_leaves_a_succeeded_job_unchanged(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "malformed_body:latency=900",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy:latency=50",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 200;
    let world = start_world(backend, &providers, r, |c| c.engine.loser_grace_ms = 5_000).await;
    let (status, job) = world
        .submit("late-loser", &chat_body("who wins"), Some(10))
        .await;
    assert_eq!(status, 201);
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let won = world.stored_job(&id).await;

    // The primary's answer arrives broken after the hedge won: the outcome
    // is unknown, then reconciled (it executed) and discarded. Its error is
    // the attempt's, not the job's.
    let (_, attempts) = world
        .until(&id, WAIT, |_, a| {
            a.iter()
                .any(|a| a["kind"] == "primary" && a["state"] == "discarded")
        })
        .await;
    let primary = attempts.iter().find(|a| a["kind"] == "primary").unwrap();
    assert!(!primary["error_kind"].is_null(), "{primary}");
    let after = world.stored_job(&id).await;
    assert_eq!(after, won, "the succeeded job's row did not change");
    assert_eq!(after.last_error, None);
    world.stop().await;
}

/// A Chat Completions replay answers with the winning attempt's provider,
/// id and usage. The first answer reads none of the job's attempts either:
/// the commit that settled the job handed its winner to the waiting door
/// (registered before the job reached the engine), and the replay memory
/// keeps it, so replays of the same bytes read none.
async fn a_chat_replay_names_its_winner_without_reading_the_attempts_again(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let (world, faulty) =
        start_faulty_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let body = serde_json::to_vec(&json!({
        "model": "default",
        "messages": [{ "role": "user", "content": "summarise order 7" }],
    }))
    .unwrap();
    let send = || async {
        let response = world
            .client
            .post(format!("{}/v1/chat/completions", world.address))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", "order-7")
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        let heads = (
            header("x-onejob-provider"),
            header("x-onejob-attempt"),
            header("idempotent-replayed"),
            header("x-onejob-job-id"),
        );
        let status = response.status().as_u16();
        (status, heads, response.json::<Value>().await.unwrap())
    };
    let (status, (provider, attempt, replayed, job_id), first) = send().await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(provider.as_deref(), Some("primary"));
    assert_eq!(replayed, None);
    let attempt = attempt.expect("the answering attempt is named");
    assert_eq!(
        faulty.calls("list_attempts"),
        0,
        "the first answer had its winner handed over, not read"
    );

    for _ in 0..5 {
        let (status, (p, a, replayed, _), again) = send().await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(replayed.as_deref(), Some("true"));
        assert_eq!(
            (p.as_deref(), a.as_deref()),
            (Some("primary"), Some(attempt.as_str()))
        );
        assert_eq!(again["choices"], first["choices"]);
        assert_eq!(again["usage"], first["usage"], "the winner's usage, kept");
        assert_eq!(again["model"], first["model"]);
    }
    assert_eq!(
        faulty.calls("list_attempts"),
        0,
        "no replay read the job's attempts"
    );
    // The attempt the answers named is the row the store holds.
    let job_id = job_id.expect("the job is named");
    let stored = world
        .store
        .list_attempts(&JobId::from(&job_id))
        .await
        .unwrap();
    let won = stored
        .iter()
        .find(|a| a.id == attempt)
        .expect("the named attempt is stored");
    assert_eq!(won.state, onejob::domain::AttemptState::Succeeded);
    let usage: Value = serde_json::from_str(won.usage.as_deref().unwrap()).unwrap();
    assert_eq!(first["usage"]["prompt_tokens"], usage["prompt_tokens"]);
    assert_eq!(
        first["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );
    assert_eq!(world.counter("onejob_replays_from_memory_total").await, 5.0);
    world.stop().await;
}

/// A flush of replays of 37 jobs (two statements of 16 rows and five of
/// one) writes each job's own count, actor and time, and nothing else.
async fn a_flush_of_many_jobs_writes_each_ones_count(backend: Backend) {
    let db = common::TestDb::new(backend).await;
    let store = db.store().await;
    let audit = onejob::replays::ReplayAudit::default();
    let mut jobs = Vec::new();
    for i in 0..37_i64 {
        let job = common::create_job(store.as_ref(), "alice", &format!("k{i}"), 1_000).await;
        for n in 0..=i % 3 {
            audit.record(&job, &format!("key-{i}"), 2_000 + i * 10 + n);
        }
        jobs.push(job);
    }
    audit.flush(store.as_ref()).await;
    for (i, job) in jobs.iter().enumerate() {
        let i = i as i64;
        let replayed: Vec<_> = store
            .list_events(job)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "replayed")
            .collect();
        assert_eq!(replayed.len(), 1, "job {i}: {replayed:?}");
        let event = &replayed[0];
        assert_eq!(event.actor, format!("key-{i}"));
        assert_eq!(event.at, 2_000 + i * 10);
        let detail: Value = serde_json::from_str(event.detail.as_deref().unwrap()).unwrap();
        assert_eq!(detail["count"], i % 3 + 1, "job {i}");
        assert_eq!(detail["last_at"], 2_000 + i * 10 + i % 3, "job {i}");
    }
}

/// A route removed from the config (a restart, or another server of a
/// rolling deploy): a job made on it is still answered as its replay at
/// every door; only a new job on it is refused.
async fn a_job_whose_route_was_removed_is_still_replayed(backend: Backend) {
    let world = start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        |c| {
            c.routes.insert("vanishing".into(), route("primary", &[]));
        },
    )
    .await;
    let mut job_body = chat_body("made on a route that goes");
    job_body["route"] = json!("vanishing");
    let (status, job) = world.submit("job-key", &job_body, Some(10)).await;
    assert_eq!(
        (status, job["state"].as_str()),
        (201, Some("succeeded")),
        "{job}"
    );
    let chat = json!({"model": "vanishing", "messages": [{"role": "user", "content": "chat too"}]});
    let made = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "chat-key")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 200);
    let chat_job = made.headers()["x-onejob-job-id"].clone();

    let mut config = world.config().clone();
    config.routes.remove("vanishing");
    let (other, stop, task) = serve(config, world.db.store().await).await;
    let post = |path: &str, key: &str, body: &Value| {
        world
            .client
            .post(format!("{other}{path}"))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
    };
    let replayed = post("/v1/jobs", "job-key", &job_body).await.unwrap();
    assert_eq!(replayed.status(), 200);
    let replayed: Value = replayed.json().await.unwrap();
    assert_eq!(replayed["id"], job["id"]);
    assert_eq!(replayed["state"], "succeeded");
    let replayed = post("/v1/chat/completions", "chat-key", &chat)
        .await
        .unwrap();
    assert_eq!(replayed.status(), 200);
    assert_eq!(replayed.headers()["x-onejob-job-id"], chat_job);
    // A new job on the removed route is refused, and nothing is written.
    let jobs = world.store.count_jobs().await.unwrap();
    let refused = post("/v1/jobs", "new-key", &job_body).await.unwrap();
    assert_eq!(refused.status(), 422);
    let refused = post("/v1/chat/completions", "new-chat", &chat)
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    assert_eq!(world.store.count_jobs().await.unwrap(), jobs);
    assert_eq!(world.sim.ledger().total_executions(), 2);
    stop.send(()).unwrap();
    task.await.unwrap();
    world.stop().await;
}
