//! Popular Node clients, pinned in `tests/node/package.json` (+ lock) and
//! unchanged but for the base URL, against onejob with retry protection on
//! (`idempotency = "fingerprint"`, no key sent): openai-node's `runTools`,
//! the Vercel AI SDK's `generateText` tool loop and `streamText` over Chat
//! Completions, its default `openai(model)` over the Responses API, and
//! its blind retries. The cases (`tests/node/cases.mjs`) print the job id
//! of every answer; here each is checked against the job rows and the
//! simulator's ledger: one job per step, each executed upstream once.
//! Skips loudly without `ONEJOB_TEST_NODE` (set by `.ci/run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::clients::{
    client_world, jobs_made, one_execution_per_step, one_failed_job, responses_served,
};
use common::node::{node, node_cases};
use common::world::World;
use common::Backend;
use serde_json::Value;

on_both_backends!(
    openai_node_run_tools_runs_each_step_once,
    the_ai_sdk_tool_loop_over_chat_completions_runs_each_step_once,
    the_ai_sdk_streams_a_tool_loop_over_chat_completions,
    the_ai_sdk_default_provider_speaks_the_responses_api,
    the_ai_sdk_default_provider_carries_a_conversation_on,
    the_ai_sdk_retrying_a_failure_makes_one_job,
);

/// The tool loop's two jobs: the first answered with a call of
/// `get_weather`, the second with the text the client ended on.
async fn a_tool_loop(world: &World, seen: &Value) {
    assert_eq!(seen["tool_calls"], 1, "{seen}");
    let ids = one_execution_per_step(world, seen, 2).await;
    let asked = world.job(&ids[0]).await;
    assert_eq!(
        asked["result"]["tool_calls"][0]["function"]["name"], "get_weather",
        "{asked}"
    );
    assert_eq!(world.job(&ids[1]).await["result"], seen["text"]);
    jobs_made(world, 2).await;
}

async fn openai_node_run_tools_runs_each_step_once(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    let [run] = node_cases(&node, &world.address, &world.key, ["openai_run_tools"]).await;
    a_tool_loop(&world, &run).await;
    world.stop().await;
}

async fn the_ai_sdk_tool_loop_over_chat_completions_runs_each_step_once(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    let [run] = node_cases(&node, &world.address, &world.key, ["ai_chat_tool_loop"]).await;
    assert_eq!(run["steps"], 2);
    a_tool_loop(&world, &run).await;
    world.stop().await;
}

async fn the_ai_sdk_streams_a_tool_loop_over_chat_completions(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    let [run] = node_cases(&node, &world.address, &world.key, ["ai_chat_stream"]).await;
    assert!(run["pieces"].as_u64().unwrap() > 1, "{run}");
    a_tool_loop(&world, &run).await;
    world.stop().await;
}

/// The Responses door (`/v1/responses`) lands on another branch: until
/// then the server answers 404 there and this case skips, saying so.
async fn the_ai_sdk_default_provider_speaks_the_responses_api(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    if !responses_served(&world, "the AI SDK's default provider, openai(model)").await {
        world.stop().await;
        return;
    }
    jobs_made(&world, 0).await;
    let [run] = node_cases(
        &node,
        &world.address,
        &world.key,
        ["ai_responses_tool_loop"],
    )
    .await;
    assert_eq!(run["steps"], 2);
    assert_eq!(run["tool_calls"], 1, "{run}");
    one_execution_per_step(&world, &run, 2).await;
    jobs_made(&world, 2).await;
    world.stop().await;
}

/// The second turn refers to the first answer by its item id (the SDK's
/// way with a stored response): the job gets that answer as the
/// assistant's turn.
async fn the_ai_sdk_default_provider_carries_a_conversation_on(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    let [run] = node_cases(
        &node,
        &world.address,
        &world.key,
        ["ai_responses_conversation"],
    )
    .await;
    assert_eq!(run["statuses"], serde_json::json!([200, 200]), "{run}");
    let ids = one_execution_per_step(&world, &run, 2).await;
    let second = world.stored_job(&ids[1]).await;
    let request: Value = serde_json::from_str(&second.request).unwrap();
    assert_eq!(
        request["messages"][1],
        serde_json::json!({"role": "assistant", "content": run["first"]}),
        "{request}"
    );
    jobs_made(&world, 2).await;
    world.stop().await;
}

async fn the_ai_sdk_retrying_a_failure_makes_one_job(backend: Backend) {
    let Some(node) = node() else {
        return;
    };
    let world = client_world(backend).await;
    let [retried] = node_cases(&node, &world.address, &world.key, ["ai_blind_retry"]).await;
    assert_eq!(
        retried["requests"], 3,
        "maxRetries: 2 sent the call three times: {retried}"
    );
    let (_, attempts) = one_failed_job(&world, &retried).await;
    eprintln!(
        "AI SDK blind retry: {} requests, 1 job, {attempts} upstream attempt(s), {}",
        retried["requests"], retried["error"]
    );
    jobs_made(&world, 1).await;
    world.stop().await;
}
