//! The engine through the real server and the simulator on a real socket:
//! double clicks, bounded retries, review, cancel, switches, breakers,
//! context windows. Scenarios that are about time passing (timeouts as
//! unknown, hedging and the late loser, the lost response, orphans after a
//! lease) run on the simulated clock in `tests/engine_clock.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, start_world, write_provider, ProviderSpec};
use common::{chat_body, Backend};
use onejob::domain::JobId;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;

on_both_backends!(
    double_click_through_the_engine_executes_once,
    retryable_refusals_end_in_review_after_the_limit,
    a_non_retryable_refusal_fails_the_job_at_once,
    cancel_makes_a_late_result_lose,
    review_resolutions_are_audited,
    a_completed_job_takes_only_a_result_it_could_have_answered,
    an_attempt_resolved_executed_takes_only_a_result_it_could_have_answered,
    a_disabled_provider_is_never_chosen,
    the_breaker_sends_first_attempts_elsewhere_until_the_primary_recovers,
    a_provider_whose_window_cannot_hold_the_prompt_is_skipped,
);

const WAIT: Duration = Duration::from_secs(10);

fn state(job: &Value) -> &str {
    job["state"].as_str().unwrap_or_default()
}

async fn double_click_through_the_engine_executes_once(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy:latency=50",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let body = chat_body("charge the card once");
    let mut calls = Vec::new();
    for _ in 0..20 {
        let request = world
            .client
            .post(format!("{}/v1/jobs", world.address))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", "pay-1")
            .header("Prefer", "wait=5")
            .json(&body);
        calls.push(tokio::spawn(request.send()));
    }
    let mut ids = HashSet::new();
    for call in calls {
        let job: Value = call.await.unwrap().unwrap().json().await.unwrap();
        ids.insert(job["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1);
    let id = ids.into_iter().next().unwrap();
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts.len(), 1, "one primary attempt: {attempts:?}");
    assert_eq!(attempts[0]["kind"], "primary");
    assert_eq!(job["completed_by"], attempts[0]["id"]);
    assert_eq!(
        world.executions(&id, "primary"),
        1,
        "the provider executed the work once"
    );
    world.stop().await;
}

async fn retryable_refusals_end_in_review_after_the_limit(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "fail:503",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 3;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, job) = world.submit("busy-1", &chat_body("x"), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| state(j) == "needs_review")
        .await;
    assert_eq!(attempts.len(), 3);
    assert!(
        attempts
            .iter()
            .all(|a| a["state"] == "failed" && a["error_kind"] == "unavailable"),
        "{attempts:?}"
    );
    assert!(job["result"].is_null(), "no partial record");
    assert_eq!(world.executions(&id, "primary"), 0, "503 executed nothing");

    let (status, review) = world.get(&world.admin_key, "/v1/admin/review").await;
    assert_eq!(status, 200);
    let item = review["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (item["owner"].as_str(), item["idempotency_key"].as_str()),
        (Some("alice"), Some("busy-1"))
    );
    assert_eq!(item["attempt_count"], 3);
    assert!(
        item["last_error"].as_str().unwrap().contains("unavailable"),
        "{item}"
    );
    assert!(item["last_attempt_at"].is_string());
    let (status, _) = world.get(&world.key, "/v1/admin/review").await;
    assert_eq!(status, 403, "the review queue is for admins");
    world.stop().await;
}

async fn a_non_retryable_refusal_fails_the_job_at_once(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "reject",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let world = start_world(backend, &providers, route("primary", &["fallback"]), |_| {}).await;
    let (_, job) = world.submit("refused-1", &chat_body("x"), Some(5)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "failed").await;
    assert_eq!(
        attempts.len(),
        1,
        "one attempt, no failover for a definitive no"
    );
    assert!(
        job["last_error"]
            .as_str()
            .unwrap()
            .contains("simulated rejection"),
        "{job}"
    );
    assert_eq!(job["version"], 1);
    world.stop().await;
}

async fn cancel_makes_a_late_result_lose(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy:latency=400",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let (_, job) = world.submit("cancel-1", &chat_body("x"), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    world.until(&id, WAIT, |_, a| !a.is_empty()).await;
    let (status, cancelled) = world
        .post(
            &world.key,
            &format!("/v1/jobs/{id}/cancel"),
            &json!({"reason": "user left"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(state(&cancelled), "cancelled");
    let (job, attempts) = world
        .until(&id, WAIT, |_, a| a[0]["state"] == "discarded")
        .await;
    assert_eq!(state(&job), "cancelled");
    assert!(job["result"].is_null(), "the late result is not the job's");
    assert_eq!(attempts.len(), 1);
    let (status, body) = world
        .post(&world.key, &format!("/v1/jobs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("job_finished"))
    );
    world.stop().await;
}

async fn review_resolutions_are_audited(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "primary-model",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 1;
    let world = start_world(backend, &providers, r, |_| {}).await;
    world.sim.models().set("primary-model", "fail:500").unwrap();
    let (_, job) = world.submit("review-1", &chat_body("x"), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    world
        .until(&id, WAIT, |j, _| state(j) == "needs_review")
        .await;

    let path = format!("/v1/admin/jobs/{id}/resolve");
    let (status, body) = world
        .post(&world.admin_key, &path, &json!({"action": "retry"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("invalid_request")),
        "a reason is required"
    );
    let (status, _) = world
        .post(
            &world.key,
            &path,
            &json!({"action": "retry", "reason": "x"}),
        )
        .await;
    assert_eq!(status, 403);

    world.sim.models().set("primary-model", "healthy").unwrap();
    let (status, job) = world
        .post(
            &world.admin_key,
            &path,
            &json!({"action": "retry", "reason": "provider fixed"}),
        )
        .await;
    assert_eq!(status, 200, "{job}");
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts.len(), 2);
    let (status, body) = world
        .post(
            &world.admin_key,
            &path,
            &json!({"action": "close", "reason": "late"}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("job_finished"))
    );
    let events = world.store.list_events(&JobId::from(&id)).await.unwrap();
    let resolved = events.iter().find(|e| e.kind == "resolved").unwrap();
    assert_eq!(resolved.actor, "admin:ops");
    assert!(resolved
        .detail
        .as_deref()
        .unwrap()
        .contains("provider fixed"));
    assert_eq!(job["version"], 1);
    world.stop().await;
}

async fn a_disabled_provider_is_never_chosen(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=300",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.max_attempts = 2;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, first) = world.submit("before-disable", &chat_body("a"), None).await;
    let first_id = first["id"].as_str().unwrap().to_string();
    world.until(&first_id, WAIT, |_, a| !a.is_empty()).await;

    let disable = json!({"reason": "vendor incident"});
    let (status, _) = world
        .post(
            &world.admin_key,
            "/v1/admin/providers/primary/disable",
            &disable,
        )
        .await;
    assert_eq!(status, 200);
    // The attempt already in flight finishes and is recorded.
    let (_, attempts) = world
        .until(&first_id, WAIT, |j, _| state(j) == "succeeded")
        .await;
    assert_eq!(
        (
            attempts[0]["provider"].as_str(),
            attempts[0]["state"].as_str()
        ),
        (Some("primary"), Some("succeeded"))
    );

    let mut ids = Vec::new();
    for i in 0..5 {
        let (_, job) = world
            .submit(
                &format!("after-disable-{i}"),
                &chat_body(&format!("b{i}")),
                Some(5),
            )
            .await;
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let (_, attempts) = world.until(id, WAIT, |j, _| state(j) == "succeeded").await;
        assert!(
            attempts.iter().all(|a| a["provider"] == "fallback"),
            "{attempts:?}"
        );
        assert_eq!(world.executions(id, "primary"), 0);
    }

    // With every provider disabled the job waits, then goes to review; no attempt is made.
    let (status, _) = world
        .post(
            &world.admin_key,
            "/v1/admin/providers/fallback/disable",
            &disable,
        )
        .await;
    assert_eq!(status, 200);
    let (_, job) = world.submit("nothing-enabled", &chat_body("c"), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| state(j) == "needs_review")
        .await;
    assert!(attempts.is_empty(), "{attempts:?}");
    assert!(
        job["last_error"].as_str().unwrap().contains("disabled"),
        "{job}"
    );
    world.stop().await;
}

async fn the_breaker_sends_first_attempts_elsewhere_until_the_primary_recovers(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "primary-model",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    // Each 503 fails over at once, so three jobs make three failures.
    r.same_provider_retries = 0;
    let world = start_world(backend, &providers, r, |c| {
        c.engine.breaker_threshold = 3;
        c.engine.breaker_open_ms = 300;
        c.engine.breaker_probe_every = 2;
    })
    .await;
    world.sim.models().set("primary-model", "fail:503").unwrap();
    let run = |i: usize| {
        let world = &world;
        async move {
            let (_, job) = world
                .submit(&format!("b-{i}"), &chat_body(&format!("job {i}")), Some(5))
                .await;
            let id = job["id"].as_str().unwrap().to_string();
            world
                .until(&id, WAIT, |j, _| state(j) == "succeeded")
                .await
                .1
        }
    };
    // Three jobs fail over after a 503 each: the breaker opens.
    for i in 0..3 {
        let attempts = run(i).await;
        assert_eq!(attempts[0]["provider"], "primary");
        assert_eq!(attempts.last().unwrap()["provider"], "fallback");
    }
    // Now new jobs start on the fallback without waiting on the primary.
    let attempts = run(3).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["provider"], "fallback");
    let (_, metrics) = (
        0,
        world
            .client
            .get(format!("{}/metrics", world.address))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert!(
        metrics.contains("onejob_breaker_open{provider=\"primary\"} 1"),
        "{metrics}"
    );

    // The primary recovers; after the open period a probe reaches it and closes the breaker.
    world.sim.models().set("primary-model", "healthy").unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut i = 4;
    loop {
        let attempts = run(i).await;
        i += 1;
        if attempts[0]["provider"] == "primary" && attempts.len() == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the primary never served again"
        );
    }
    for j in i..i + 3 {
        let attempts = run(j).await;
        assert_eq!(
            (attempts.len(), attempts[0]["provider"].as_str()),
            (1, Some("primary")),
            "closed again"
        );
    }
    let metrics = world.metrics().await;
    assert!(
        metrics.contains("onejob_breaker_open{provider=\"primary\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("onejob_breaker_trips_total{provider=\"primary\"} 1"),
        "{metrics}"
    );
    world.stop().await;
}

async fn a_provider_whose_window_cannot_hold_the_prompt_is_skipped(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut world = start_world(backend, &providers, route("primary", &["fallback"]), |_| {}).await;
    // The primary turns out to have a small window (a redeploy with its real config).
    let base_url = world.sim.base_url();
    write_provider(world.providers_path(), "primary", "healthy", &base_url, 512);
    world.restart(|_| {}).await;

    let long = "The quick brown fox jumps over the lazy dog. ".repeat(200);
    let body =
        json!({ "messages": [{"role": "user", "content": long}], "params": {"max_tokens": 100} });
    let (_, job) = world.submit("long-1", &body, Some(5)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(
        attempts[0]["provider"], "fallback",
        "never sent where it must fail with context_length_exceeded"
    );
    assert_eq!(world.executions(&id, "primary"), 0);

    // A short prompt still goes to the primary.
    let short =
        json!({ "messages": [{"role": "user", "content": "hi"}], "params": {"max_tokens": 100} });
    let (_, job) = world.submit("short-1", &short, Some(5)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts[0]["provider"], "primary");

    // Nothing can hold prompt + max_tokens: the job fails at once, no attempt made.
    let body = json!({ "messages": [{"role": "user", "content": "hi"}], "params": {"max_tokens": 100_000} });
    let (_, job) = world.submit("huge-1", &body, Some(5)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "failed").await;
    assert!(attempts.is_empty(), "{attempts:?}");
    assert!(
        job["last_error"]
            .as_str()
            .unwrap()
            .contains("context_window"),
        "{job}"
    );
    world.stop().await;
}

/// An admin's word that an unknown attempt `executed`, with the provider's
/// result, is held to what an answer of the job is held to, as a
/// `complete` is: the result becomes the job's when the attempt wins.
/// Before, `null` was stored as a succeeded job's result.
async fn an_attempt_resolved_executed_takes_only_a_result_it_could_have_answered(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "drop_response",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 1;
    // No lookup: nothing but an admin can say whether the attempt ran.
    let world = start_world(backend, &providers, r, |c| {
        let path = c.providers_dir.join("primary.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("lookup = \"sim_ledger\"", "lookup = \"none\""),
        )
        .unwrap();
    })
    .await;
    let (status, job) = world.submit("dropped", &chat_body("x"), None).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&id, WAIT, |_, a| a.iter().any(|a| a["state"] == "unknown"))
        .await;
    let attempt = attempts[0]["id"].as_str().unwrap().to_string();
    let path = format!("/v1/admin/attempts/{attempt}/resolve");
    for result in [Value::Null, json!(42), json!({"text": "x"})] {
        let body =
            json!({"outcome": "executed", "result": result, "reason": "provider's dashboard"});
        let (status, body) = world.post(&world.admin_key, &path, &body).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid_request")),
            "{result}: {body}"
        );
    }
    let job = world.job(&id).await;
    assert_ne!(state(&job), "succeeded", "{job}");
    let body = json!({"outcome": "executed", "result": "it ran", "reason": "provider's dashboard"});
    let (status, body) = world.post(&world.admin_key, &path, &body).await;
    assert_eq!(status, 200, "{body}");
    let job = world.job(&id).await;
    assert_eq!(
        (state(&job), &job["result"]),
        ("succeeded", &json!("it ran")),
        "{job}"
    );

    // A job completed by hand while its attempt was unknown: the attempt
    // said executed afterwards loses (the job keeps its result), and the
    // result the admin gave is kept in the decision's event, marked lost,
    // where before it was kept nowhere (the provider was paid twice).
    let (_, job) = world.submit("dropped-2", &chat_body("y"), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&id, WAIT, |_, a| a.iter().any(|a| a["state"] == "unknown"))
        .await;
    let attempt = attempts[0]["id"].as_str().unwrap().to_string();
    let complete =
        json!({"action": "complete", "result": "typed by hand", "reason": "customer waiting"});
    let (status, body) = world
        .post(
            &world.admin_key,
            &format!("/v1/admin/jobs/{id}/resolve"),
            &complete,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let late =
        json!({"outcome": "executed", "result": "the provider's own", "reason": "dashboard"});
    let (status, body) = world
        .post(
            &world.admin_key,
            &format!("/v1/admin/attempts/{attempt}/resolve"),
            &late,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let job = world.job(&id).await;
    assert_eq!(job["result"], "typed by hand", "{job}");
    assert_eq!(world.attempts(&id).await[0]["state"], "discarded");
    let events = world.store.list_events(&id.clone().into()).await.unwrap();
    let resolved = events
        .iter()
        .find(|e| e.kind == "attempt_resolved")
        .expect("the settlement's event");
    let detail: Value = serde_json::from_str(resolved.detail.as_deref().unwrap()).unwrap();
    assert_eq!(detail["won"], false, "{detail}");
    assert_eq!(detail["result"], "the provider's own", "{detail}");
    world.stop().await;
}

/// An admin's `complete` is held to what an answer of the job is held to:
/// a result that breaks the job's contract or `response_format`, or is not
/// an answer at all (`null`, a number), is refused and the job stays in
/// review; one that fits becomes the result, stored as an answer would be.
async fn a_completed_job_takes_only_a_result_it_could_have_answered(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "primary-model",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 1;
    let world = start_world(backend, &providers, r, |_| {}).await;
    world.sim.models().set("primary-model", "fail:500").unwrap();
    let schema = json!({"type": "object", "required": ["city"],
                        "properties": {"city": {"type": "string"}}, "additionalProperties": false});
    let mut with_schema = chat_body("where?");
    with_schema["params"] = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "place", "schema": schema}}});
    let ticket = json!({"contract": "ticket-triage", "input": {"channel": "email",
        "customer_name": "Dana", "subject": "Charged twice", "body": "Refund one, please."}});
    let mut ids = Vec::new();
    for (key, body) in [
        ("plain", chat_body("x")),
        ("schema", with_schema),
        ("contract", ticket),
    ] {
        let (status, job) = world.submit(key, &body, None).await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_str().unwrap().to_string();
        world
            .until(&id, WAIT, |j, _| state(j) == "needs_review")
            .await;
        ids.push(id);
    }
    let (plain, with_schema, contract) = (&ids[0], &ids[1], &ids[2]);
    let w = &world;
    let resolve = |id: &str, result: Value| {
        let path = format!("/v1/admin/jobs/{id}/resolve");
        let body = json!({"action": "complete", "result": result, "reason": "answered by hand"});
        async move { w.post(&w.admin_key, &path, &body).await }
    };
    for (id, result) in [
        (plain, Value::Null),
        (plain, json!(42)),
        (with_schema, json!("not JSON")),
        (with_schema, json!(r#"{"town": "Paris"}"#)),
        (contract, json!({"category": "billing"})),
        (contract, json!("billing")),
    ] {
        let (status, body) = resolve(id, result.clone()).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid_request")),
            "{id} {result}: {body}"
        );
        assert_eq!(state(&world.job(id).await), "needs_review", "{result}");
    }
    let triaged = json!({"category": "billing", "priority": "normal", "summary": "Charged twice",
                         "language": "en", "needs_human": false, "product": null});
    for (id, result, stored) in [
        (plain, json!("done by hand"), json!("done by hand")),
        (
            with_schema,
            json!(r#"{"city": "Paris"}"#),
            json!(r#"{"city": "Paris"}"#),
        ),
        (contract, triaged.clone(), triaged),
    ] {
        let (status, body) = resolve(id, result).await;
        assert_eq!(status, 200, "{id}: {body}");
        let job = world.job(id).await;
        assert_eq!(
            (state(&job), &job["result"]),
            ("succeeded", &stored),
            "{job}"
        );
    }
    world.stop().await;
}
