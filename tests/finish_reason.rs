//! Why the provider stopped, as each door tells it: an answer the provider
//! cut at the token limit is truncated whether it was streamed or not, and
//! stays so on every replay (unstreamed, streamed, `GET /v1/responses/{id}`)
//! and in the winning attempt's row. The simulator's `max_tokens` behaviour
//! cuts an answer at the request's limit and stops for its length; a fake
//! Anthropic upstream stops on a stop sequence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod upstream;

use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    chat_tells_a_length_stop_unstreamed_and_on_every_replay,
    chat_streamed_then_replayed_unstreamed_is_still_a_length_stop,
    messages_tell_max_tokens_unstreamed_and_after_a_stream,
    responses_are_incomplete_when_cut_and_retrieve_says_so,
    an_answer_within_the_limit_stops_as_before,
    a_stop_sequence_reaches_the_messages_door_with_its_sequence,
    a_winner_recorded_before_finish_reasons_were_kept_is_told_as_before,
);

async fn world(backend: Backend) -> World {
    start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "max_tokens",
        }],
        route("primary", &[]),
        |_| {},
    )
    .await
}

/// A request through a door, with the key and the door's auth.
fn post(world: &World, path: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
    let request = world
        .client
        .post(format!("{}{path}", world.address))
        .header("Idempotency-Key", key)
        .json(body);
    if path == "/v1/messages" {
        request
            .header("x-api-key", &world.key)
            .header("anthropic-version", "2023-06-01")
    } else {
        request.bearer_auth(&world.key)
    }
}

async fn send(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, String) {
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

async fn send_json(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, text) = send(request).await;
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: {text}"));
    (status, headers, body)
}

/// Each SSE event's `event:` name (empty without one) and JSON data.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let (mut name, mut data) = (String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

/// The `finish_reason` of a chat stream's finishing chunk.
fn streamed_finish_reason(text: &str) -> Value {
    events(text)
        .iter()
        .filter_map(|(_, data)| data.pointer("/choices/0/finish_reason"))
        .find(|reason| !reason.is_null())
        .cloned()
        .unwrap_or_else(|| panic!("no finish reason in {text}"))
}

/// The `message_delta` of a Messages stream.
fn message_delta(text: &str) -> Value {
    events(text)
        .into_iter()
        .find(|(name, _)| name == "message_delta")
        .map(|(_, data)| data)
        .unwrap_or_else(|| panic!("no message_delta in {text}"))
}

fn job_id(headers: &reqwest::header::HeaderMap) -> String {
    headers["x-onejob-job-id"].to_str().unwrap().to_string()
}

/// The finish reason the job's winning attempt row keeps.
async fn winners_finish_reason(world: &World, job: &str) -> Value {
    let attempts = world.attempts(job).await;
    let winner = attempts
        .iter()
        .find(|a| a["state"] == "succeeded")
        .unwrap_or_else(|| panic!("no winner in {attempts:?}"));
    winner["finish_reason"].clone()
}

fn chat_body(max_tokens: Option<u32>, stream: bool) -> Value {
    let mut body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "stream": stream,
    });
    if let Some(limit) = max_tokens {
        body["max_tokens"] = json!(limit);
    }
    body
}

async fn chat_tells_a_length_stop_unstreamed_and_on_every_replay(backend: Backend) {
    let world = world(backend).await;
    let body = chat_body(Some(2), false);
    let (status, headers, first) =
        send_json(post(&world, "/v1/chat/completions", "cut-1", &body)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["choices"][0]["finish_reason"], "length", "{first}");
    let text = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.chars().count() <= 8, "cut at 2 tokens: {text:?}");
    let job = job_id(&headers);
    assert_eq!(winners_finish_reason(&world, &job).await, "length");

    // A replay of the key, unstreamed and streamed, says the same.
    let (_, _, replay) = send_json(post(&world, "/v1/chat/completions", "cut-1", &body)).await;
    assert_eq!(replay["choices"][0]["finish_reason"], "length", "{replay}");
    let (status, _, streamed) = send(post(
        &world,
        "/v1/chat/completions",
        "cut-1",
        &chat_body(Some(2), true),
    ))
    .await;
    assert_eq!(status, 200, "{streamed}");
    assert_eq!(streamed_finish_reason(&streamed), "length", "{streamed}");
    world.stop().await;
}

async fn chat_streamed_then_replayed_unstreamed_is_still_a_length_stop(backend: Backend) {
    let world = world(backend).await;
    let (status, headers, streamed) = send(post(
        &world,
        "/v1/chat/completions",
        "cut-2",
        &chat_body(Some(2), true),
    ))
    .await;
    assert_eq!(status, 200, "{streamed}");
    assert_eq!(streamed_finish_reason(&streamed), "length", "{streamed}");
    let job = job_id(&headers);
    assert_eq!(winners_finish_reason(&world, &job).await, "length");

    let (_, _, replay) = send_json(post(
        &world,
        "/v1/chat/completions",
        "cut-2",
        &chat_body(Some(2), false),
    ))
    .await;
    assert_eq!(replay["choices"][0]["finish_reason"], "length", "{replay}");
    world.stop().await;
}

fn message_body(stream: bool) -> Value {
    json!({
        "model": "default",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "stream": stream,
    })
}

async fn messages_tell_max_tokens_unstreamed_and_after_a_stream(backend: Backend) {
    let world = world(backend).await;
    let (status, _, message) =
        send_json(post(&world, "/v1/messages", "m-1", &message_body(false))).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["stop_reason"], "max_tokens", "{message}");
    assert_eq!(message["stop_sequence"], Value::Null);

    // Streamed first, then replayed unstreamed and streamed again.
    let (status, headers, streamed) =
        send(post(&world, "/v1/messages", "m-2", &message_body(true))).await;
    assert_eq!(status, 200, "{streamed}");
    assert_eq!(
        message_delta(&streamed)["delta"]["stop_reason"],
        "max_tokens",
        "{streamed}"
    );
    assert_eq!(
        winners_finish_reason(&world, &job_id(&headers)).await,
        "length"
    );
    let (_, _, replay) = send_json(post(&world, "/v1/messages", "m-2", &message_body(false))).await;
    assert_eq!(replay["stop_reason"], "max_tokens", "{replay}");
    let (_, _, again) = send(post(&world, "/v1/messages", "m-2", &message_body(true))).await;
    assert_eq!(
        message_delta(&again)["delta"]["stop_reason"],
        "max_tokens",
        "{again}"
    );
    world.stop().await;
}

fn response_body(stream: bool) -> Value {
    json!({
        "model": "default",
        "input": "Tell me a long story about a lighthouse.",
        "max_output_tokens": 2,
        "stream": stream,
    })
}

async fn responses_are_incomplete_when_cut_and_retrieve_says_so(backend: Backend) {
    let world = world(backend).await;
    let (status, _, response) =
        send_json(post(&world, "/v1/responses", "r-1", &response_body(false))).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(
        response["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(response["completed_at"], Value::Null);
    let id = response["id"].as_str().unwrap();
    let (_, retrieved) = world.get(&world.key, &format!("/v1/responses/{id}")).await;
    assert_eq!(retrieved["status"], "incomplete", "{retrieved}");
    assert_eq!(
        retrieved["incomplete_details"]["reason"],
        "max_output_tokens"
    );

    // Streamed: `response.incomplete`, and retrieve says the same after.
    let (status, _, streamed) =
        send(post(&world, "/v1/responses", "r-2", &response_body(true))).await;
    assert_eq!(status, 200, "{streamed}");
    let last = events(&streamed).pop().unwrap();
    assert_eq!(last.0, "response.incomplete", "{streamed}");
    let id = last.1["response"]["id"].as_str().unwrap().to_string();
    let (_, retrieved) = world.get(&world.key, &format!("/v1/responses/{id}")).await;
    assert_eq!(retrieved["status"], "incomplete", "{retrieved}");
    assert_eq!(
        retrieved["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    world.stop().await;
}

async fn an_answer_within_the_limit_stops_as_before(backend: Backend) {
    let world = world(backend).await;
    let (status, headers, completion) = send_json(post(
        &world,
        "/v1/chat/completions",
        "whole-1",
        &chat_body(None, false),
    ))
    .await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        winners_finish_reason(&world, &job_id(&headers)).await,
        "stop"
    );
    let (_, _, response) = send_json(post(
        &world,
        "/v1/responses",
        "whole-2",
        &json!({"model": "default", "input": "Hi"}),
    ))
    .await;
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(response["incomplete_details"], Value::Null);
    world.stop().await;
}

const STOPPED_AT_A_SEQUENCE: &str = r#"{"id":"msg_up","type":"message","role":"assistant",
 "model":"claude-test","content":[{"type":"text","text":"Hello"}],"stop_reason":"stop_sequence",
 "stop_sequence":"END","usage":{"input_tokens":10,"output_tokens":3}}"#;

async fn a_stop_sequence_reaches_the_messages_door_with_its_sequence(backend: Backend) {
    let up = upstream::upstream(upstream::json(200, STOPPED_AT_A_SEQUENCE)).await;
    let base_url = up.base_url.clone();
    let world = start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        |c| {
            std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
            let text = format!(
                "kind = \"anthropic\"\nbase_url = \"{base_url}\"\nmodel = \"claude-test\"\n\
                 api_key_env = \"{}\"\ntokenizer = \"o200k_base\"\ncontext_window = 16384\n",
                upstream::KEY_ENV
            );
            std::fs::write(c.providers_dir.join("native.toml"), text).unwrap();
            c.routes.insert("native".into(), route("native", &[]));
        },
    )
    .await;
    let body = json!({
        "model": "native",
        "max_tokens": 100,
        "stop_sequences": ["END"],
        "messages": [{"role": "user", "content": "Say hello, then END."}],
    });
    let (status, headers, message) = send_json(post(&world, "/v1/messages", "s-1", &body)).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["stop_reason"], "stop_sequence", "{message}");
    assert_eq!(message["stop_sequence"], "END");
    let attempts = world.attempts(&job_id(&headers)).await;
    assert_eq!(attempts[0]["finish_reason"], "stop_sequence");
    assert_eq!(attempts[0]["stop_sequence"], "END");
    // The same job through a stream replay, and through the chat door's
    // vocabulary (OpenAI has no stop-sequence reason: `stop`).
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, _, text) = send(post(&world, "/v1/messages", "s-1", &streamed)).await;
    let delta = message_delta(&text);
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{text}");
    assert_eq!(delta["delta"]["stop_sequence"], "END", "{text}");
    world.stop().await;
}

async fn a_winner_recorded_before_finish_reasons_were_kept_is_told_as_before(backend: Backend) {
    let world = world(backend).await;
    let body = chat_body(Some(2), false);
    let (_, headers, first) = send_json(post(&world, "/v1/chat/completions", "old-1", &body)).await;
    assert_eq!(first["choices"][0]["finish_reason"], "length");
    // As a build before migration 0017 (SQLite) / 0015 (PostgreSQL) left it.
    let job = job_id(&headers);
    world
        .db
        .execute(&format!(
            "UPDATE attempts SET finish_reason = NULL WHERE job_id = '{job}'"
        ))
        .await;
    // A new server, so nothing remembered of the job answers for the row.
    let mut world = world;
    world.restart(|_| {}).await;
    let (_, _, replay) = send_json(post(&world, "/v1/chat/completions", "old-1", &body)).await;
    assert_eq!(replay["choices"][0]["finish_reason"], "stop", "{replay}");
    assert_eq!(winners_finish_reason(&world, &job).await, Value::Null);
    world.stop().await;
}
