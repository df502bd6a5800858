//! Popular Python clients, pinned in `tests/python/requirements*.txt` and
//! unchanged but for the base URL, against onejob with retry protection on
//! (`idempotency = "fingerprint"`, no key sent): langchain-openai,
//! pydantic-ai, instructor and the official SDK's own retries. The cases
//! (`tests/python/client_cases.py`) print the job id of every answer; here
//! each is checked against the job rows and the simulator's ledger: one job
//! per step, each executed upstream once. Skips loudly without
//! `ONEJOB_TEST_PYTHON` / `ONEJOB_TEST_PYTHON_INSTRUCTOR` (set by `.ci/run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::clients::{
    client_world, jobs_made, one_execution_per_step, one_failed_job, request_of, responses_served,
};
use common::python::{cases_of, instructor_python, python};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    langchain_structured_output_and_a_named_message,
    langchain_over_the_responses_api,
    a_pydantic_ai_agent_runs_its_tool_loop_once,
    instructor_reasks_after_a_failed_validation,
    the_openai_sdk_retrying_a_failure_makes_one_job,
);

async fn langchain_structured_output_and_a_named_message(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let world = client_world(backend).await;
    let [structured, named] = cases_of(
        "client_cases.py",
        &python,
        &world.address,
        &world.key,
        ["langchain_structured", "langchain_named"],
    )
    .await;

    let structured_id = &one_execution_per_step(&world, &structured, 1).await[0];
    let job = world.job(structured_id).await;
    let call = &job["result"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "Triage");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments, structured["answer"],
        "langchain parsed the stored tool call"
    );
    let sent = request_of(&world, structured_id).await;
    assert_eq!(sent["params"]["parallel_tool_calls"], false);

    let named_id = &one_execution_per_step(&world, &named, 1).await[0];
    assert_ne!(named_id, structured_id);
    assert_eq!(world.job(named_id).await["result"], named["content"]);
    let sent = request_of(&world, named_id).await;
    assert_eq!(
        sent["messages"][1]["name"], "ada",
        "the name is kept: {sent}"
    );
    jobs_made(&world, 2).await;
    world.stop().await;
}

async fn langchain_over_the_responses_api(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let world = client_world(backend).await;
    if !responses_served(&world, "langchain-openai, use_responses_api=True").await {
        world.stop().await;
        return;
    }
    let [answered] = cases_of(
        "client_cases.py",
        &python,
        &world.address,
        &world.key,
        ["langchain_responses"],
    )
    .await;
    let id = &one_execution_per_step(&world, &answered, 1).await[0];
    assert_eq!(world.job(id).await["result"], answered["content"]);
    jobs_made(&world, 1).await;
    world.stop().await;
}

async fn a_pydantic_ai_agent_runs_its_tool_loop_once(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let world = client_world(backend).await;
    let [agent] = cases_of(
        "client_cases.py",
        &python,
        &world.address,
        &world.key,
        ["pydantic_ai_tool"],
    )
    .await;
    assert_eq!(agent["tool_calls"], 1);
    let ids = one_execution_per_step(&world, &agent, 2).await;
    jobs_made(&world, 2).await;
    let asked = world.job(&ids[0]).await;
    assert_eq!(
        asked["result"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(world.job(&ids[1]).await["result"], agent["output"]);
    world.stop().await;
}

async fn instructor_reasks_after_a_failed_validation(backend: Backend) {
    let Some(python) = instructor_python() else {
        return;
    };
    let world = client_world(backend).await;
    let [reask] = cases_of(
        "client_cases.py",
        &python,
        &world.address,
        &world.key,
        ["instructor_reask"],
    )
    .await;
    assert_eq!(reask["validations"], 2);
    let ids = one_execution_per_step(&world, &reask, 2).await;
    jobs_made(&world, 2).await;
    // The re-ask carries the refused call and the error as a named tool turn.
    let sent = request_of(&world, &ids[1]).await;
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["name"], "Ticket");
    let answered = world.job(&ids[1]).await;
    let arguments = answered["result"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        reask["answer"]
    );
    world.stop().await;
}

async fn the_openai_sdk_retrying_a_failure_makes_one_job(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let world = client_world(backend).await;
    let [failed, timed_out] = cases_of(
        "client_cases.py",
        &python,
        &world.address,
        &world.key,
        ["openai_blind_retry", "openai_timeout_retry"],
    )
    .await;

    // A job that failed: its 502 says `x-should-retry: false`, which the
    // SDK honours; had it retried, the same body would be the same job.
    assert_eq!(failed["error"]["status"], 502, "{failed}");
    let (_, attempts) = one_failed_job(&world, &failed).await;

    // A lost answer (the SDK's own timeout): it retried the same body, and
    // that was the same job, run upstream once.
    let tries = timed_out["requests"].as_u64().unwrap();
    assert!(tries >= 2, "{timed_out}");
    let answered = timed_out["job_ids"].as_array().unwrap();
    assert_eq!(
        answered.len(),
        1,
        "only the last try was answered: {timed_out}"
    );
    let slow_id = answered[0].as_str().unwrap();
    assert_eq!(world.executions(slow_id, "sluggish"), 1);
    assert_eq!(world.deliveries(slow_id, "sluggish"), 1);
    assert_eq!(world.job(slow_id).await["result"], timed_out["content"]);
    eprintln!(
        "openai SDK retries: a failed job {} request(s), {} upstream attempt(s); \
         a timed-out call {tries} requests, 1 job, 1 execution",
        failed["requests"], attempts
    );
    jobs_made(&world, 2).await;
    world.stop().await;
}

/// What instructor's re-ask relies on: a forced `tool_choice` (a named
/// function, or `required`) is obeyed even when the last turn answers a
/// tool call; with `auto` the model answers in text.
#[tokio::test]
async fn a_forced_tool_choice_calls_the_tool_after_a_tool_result() {
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await.unwrap();
    let tools = json!([{"type": "function", "function": {"name": "Ticket",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}},
                       "required": ["title"]}}}]);
    let messages = json!([
        {"role": "user", "content": "File a ticket."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "Ticket", "arguments": "{\"title\":\"x\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "Ticket",
         "content": "Validation Error found: write it again"},
    ]);
    let client = reqwest::Client::new();
    for (choice, calls) in [
        (
            json!({"type": "function", "function": {"name": "Ticket"}}),
            true,
        ),
        (json!("required"), true),
        (json!("auto"), false),
    ] {
        let answer: Value = client
            .post(format!("{}/v1/chat/completions", sim.base_url()))
            .json(
                &json!({"model": "healthy", "messages": messages, "tools": tools,
                          "tool_choice": choice}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let choice_answer = &answer["choices"][0];
        assert_eq!(
            choice_answer["finish_reason"],
            if calls { "tool_calls" } else { "stop" },
            "tool_choice {choice}: {answer}"
        );
    }
}
