//! Rescue instead of block: an attempt that ends `unknown` is hedged to
//! another provider at once; a provider that honours idempotency keys is
//! retried with the same key; retryable refusals retry the same provider
//! first (never sooner than Retry-After); a provider's
//! `context_length_exceeded` moves to a larger window; a content-policy
//! refusal ends the job. The simulator on a real socket, both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{distrust_keys, route, set_window, start_world, ProviderSpec, World};
use common::{chat_body, Backend};
use onejob::domain::AttemptState;
use onejob::domain::JobId;
use serde_json::Value;
use std::time::Duration;

on_both_backends!(
    an_unknown_ending_is_hedged_to_the_fallback_at_once,
    a_retry_to_a_provider_that_honours_keys_carries_the_same_key,
    a_rate_limit_retries_the_same_provider_no_sooner_than_retry_after,
    a_persistent_503_retries_the_same_provider_once_then_moves_along,
    context_length_exceeded_moves_to_a_larger_window_never_back,
    context_length_exceeded_with_no_larger_window_fails_with_that_code,
    a_content_filter_fails_the_job_after_one_attempt,
);

const WAIT: Duration = Duration::from_secs(10);

fn state(job: &Value) -> &str {
    job["state"].as_str().unwrap_or_default()
}

fn two(primary_model: &'static str) -> [ProviderSpec; 2] {
    [
        ProviderSpec {
            name: "primary",
            model: primary_model,
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ]
}

async fn submit(world: &World, key: &str) -> String {
    let (status, job) = world.submit(key, &chat_body(key), None).await;
    assert_eq!(status, 201, "{job}");
    job["id"].as_str().unwrap().to_string()
}

async fn an_unknown_ending_is_hedged_to_the_fallback_at_once(backend: Backend) {
    let mut r = route("primary", &["fallback"]);
    // The silence hedge would come only after a minute: any hedge seen
    // sooner is the rescue.
    r.silence_ms = 60_000;
    r.attempt_timeout_ms = 400;
    let world = start_world(backend, &two("primary-model"), r, |c| {
        distrust_keys(c, "primary");
        // The reconciler asks only after the rescue has had its chance (it
        // could otherwise find the executed work first and win with it).
        c.engine.reconcile_min_age_ms = 1_000;
    })
    .await;
    // Reset after the request was sent (executed), a body that is not JSON
    // (executed), an attempt timeout (never executed).
    for (fault, executed, primary_ends) in [
        ("drop_response", 1, "discarded"),
        ("malformed_body", 1, "discarded"),
        ("hang", 0, "failed"),
    ] {
        world.sim.models().set("primary-model", fault).unwrap();
        let id = submit(&world, &format!("rescue-{fault}")).await;
        let (job, attempts) = world
            .until(&id, WAIT, |j, a| {
                state(j) == "succeeded" && a.iter().all(|a| a["state"] != "unknown")
            })
            .await;
        assert_eq!(attempts.len(), 2, "{fault}: {attempts:?}");
        let (primary, hedge) = (&attempts[0], &attempts[1]);
        assert_eq!(
            (hedge["provider"].as_str(), hedge["kind"].as_str()),
            (Some("fallback"), Some("hedge")),
            "{fault}"
        );
        assert_eq!(
            job["completed_by"], hedge["id"],
            "{fault}: the fallback won"
        );
        // The unknown attempt was reconciled afterwards: found executed (its
        // late result lost the compare-and-swap), or found not executed.
        assert_eq!(primary["state"], primary_ends, "{fault}: {primary}");
        assert_eq!(world.executions(&id, "primary"), executed, "{fault}");
        assert_eq!(
            world.deliveries(&id, "primary"),
            1,
            "{fault}: nothing re-sent to the provider whose outcome was unknown"
        );
        assert_eq!(world.executions(&id, "fallback"), 1, "{fault}");
        let events: Vec<String> = world
            .store
            .list_events(&JobId::from(&id))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect();
        assert!(
            events.contains(&"attempt_unknown".to_string()),
            "{events:?}"
        );
    }
    world.stop().await;
}

async fn a_retry_to_a_provider_that_honours_keys_carries_the_same_key(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "drop_response",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        // The reconciler stays out of it: the retry alone settles the job.
        c.engine.reconcile_min_age_ms = 600_000;
    })
    .await;
    let id = submit(&world, "same-key").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (attempts[0]["state"].as_str(), attempts[1]["kind"].as_str()),
        (Some("unknown"), Some("retry")),
        "the retry started while the first attempt was still unknown"
    );
    assert_eq!(job["completed_by"], attempts[1]["id"]);
    assert_eq!(
        world.deliveries(&id, "primary"),
        2,
        "both requests carried the same key"
    );
    assert_eq!(
        world.executions(&id, "primary"),
        1,
        "the provider deduplicated the retry by its key"
    );
    world.stop().await;
}

async fn a_rate_limit_retries_the_same_provider_no_sooner_than_retry_after(backend: Backend) {
    let world = start_world(
        backend,
        &two("rate_limit:retry_after=1,times=1"),
        route("primary", &["fallback"]),
        |_| {},
    )
    .await;
    let id = submit(&world, "rate-limited").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (
            attempts[0]["error_kind"].as_str(),
            attempts[1]["provider"].as_str(),
            attempts[1]["kind"].as_str()
        ),
        (Some("rate_limited"), Some("primary"), Some("retry"))
    );
    assert_eq!(job["completed_by"], attempts[1]["id"]);
    let stored = world.store.list_attempts(&JobId::from(&id)).await.unwrap();
    let waited = stored[1].started_at - stored[0].finished_at.unwrap();
    assert!(
        waited >= 1_000,
        "the retry waited {waited} ms; Retry-After asked for 1 s"
    );
    assert_eq!(world.deliveries(&id, "primary"), 2);
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.deliveries(&id, "fallback"), 0);
    world.stop().await;
}

async fn a_persistent_503_retries_the_same_provider_once_then_moves_along(backend: Backend) {
    let world = start_world(
        backend,
        &two("fail:503"),
        route("primary", &["fallback"]),
        |_| {},
    )
    .await;
    let id = submit(&world, "unavailable").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    let path: Vec<(&str, &str)> = attempts
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap(),
                a["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        path,
        [
            ("primary", "failed"),
            ("primary", "failed"),
            ("fallback", "succeeded")
        ]
    );
    assert_eq!(job["completed_by"], attempts[2]["id"]);
    assert_eq!(world.deliveries(&id, "primary"), 2);
    assert_eq!(
        world.executions(&id, "primary"),
        0,
        "a 503 executes nothing"
    );
    assert_eq!(world.executions(&id, "fallback"), 1);
    world.stop().await;
}

async fn context_length_exceeded_moves_to_a_larger_window_never_back(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "context_length",
        },
        ProviderSpec {
            name: "small",
            model: "healthy",
        },
        ProviderSpec {
            name: "large",
            model: "healthy",
        },
    ];
    let world = start_world(
        backend,
        &providers,
        route("primary", &["small", "large"]),
        |c| {
            set_window(c, "small", 8_192);
            set_window(c, "large", 32_768);
        },
    )
    .await;
    let id = submit(&world, "too-long").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "succeeded").await;
    let path: Vec<(&str, &str)> = attempts
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap(),
                a["error_kind"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        path,
        [("primary", "context_length_exceeded"), ("large", "-")]
    );
    assert_eq!(job["completed_by"], attempts[1]["id"]);
    assert_eq!(
        world.deliveries(&id, "primary"),
        1,
        "never re-sent to the provider that refused it"
    );
    assert_eq!(
        world.deliveries(&id, "small"),
        0,
        "a smaller window is skipped"
    );
    world.stop().await;
}

async fn context_length_exceeded_with_no_larger_window_fails_with_that_code(backend: Backend) {
    let world = start_world(
        backend,
        &two("context_length"),
        route("primary", &["fallback"]),
        |c| set_window(c, "fallback", 8_192),
    )
    .await;
    let id = submit(&world, "too-long").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "failed").await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["error_kind"], "context_length_exceeded");
    let last_error = job["last_error"].as_str().unwrap();
    assert!(
        last_error.starts_with("context_length_exceeded"),
        "{last_error}"
    );
    assert_eq!(world.deliveries(&id, "primary"), 1);
    assert_eq!(world.deliveries(&id, "fallback"), 0);
    world.stop().await;
}

async fn a_content_filter_fails_the_job_after_one_attempt(backend: Backend) {
    let world = start_world(
        backend,
        &two("content_filter"),
        route("primary", &["fallback"]),
        |_| {},
    )
    .await;
    let id = submit(&world, "refused").await;
    let (job, attempts) = world.until(&id, WAIT, |j, _| state(j) == "failed").await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["error_kind"], "content_policy");
    let stored = world.store.list_attempts(&JobId::from(&id)).await.unwrap();
    assert_eq!(stored[0].state, AttemptState::Failed);
    let last_error = job["last_error"].as_str().unwrap();
    assert!(
        last_error.contains("content_policy") && last_error.contains("safety system"),
        "the provider's code and reason are kept: {last_error}"
    );
    assert_eq!(world.deliveries(&id, "fallback"), 0);
    world.stop().await;
}
