//! `POST /v1/chat/completions` with `stream: true`, against the simulator's
//! stream faults: what the client received, the job and its attempts, and
//! the simulator's ledger.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{refuse_prefill, route, set_window, start_world, ProviderSpec, World};
use common::Backend;
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

on_both_backends!(
    a_resumed_stream_that_ends_in_an_error_keeps_the_clients_place,
    a_streamed_completion_arrives_in_pieces_and_replays_the_same_text,
    a_stream_cut_mid_answer_is_finished_by_a_fallback_that_continues_it,
    a_stream_cut_with_no_continuation_ends_with_an_error_naming_the_cut,
    a_cut_whose_fallback_cannot_take_a_prefill_is_restarted_and_streams_the_rest_once,
    a_restart_that_diverges_from_what_the_client_has_ends_with_an_error_naming_the_cut,
    a_client_told_error_is_not_billed_again_unless_the_route_completes_after_it,
    a_primary_silent_past_silence_ms_loses_the_stream_to_the_hedge,
    a_stalled_stream_is_bounded_by_stall_ms_and_continued,
    a_malformed_chunk_breaks_the_stream_and_it_is_continued,
    a_stream_closed_without_done_is_never_a_finished_answer,
    a_persistent_503_streams_from_the_fallback,
    a_client_that_drops_mid_stream_resumes_with_the_same_key,
    a_streamed_429_is_retried_on_the_same_provider_no_sooner_than_retry_after,
    a_streamed_500_once_is_retried_and_streams_the_whole_answer,
    a_reset_before_headers_is_rescued_by_the_fallback_at_once,
    a_streamed_replay_on_another_instance_gets_the_final_completion,
    a_streamed_content_filter_fails_after_one_attempt_with_its_reason,
    a_streamed_context_length_exceeded_moves_to_a_larger_window_never_back,
    a_streamed_context_length_exceeded_with_no_larger_window_ends_with_that_code,
    a_streamed_primary_down_for_a_while_is_routed_around_then_probed_back,
    the_simulator_streams_a_tool_call,
    a_healthy_stream_longer_than_attempt_timeout_is_not_cut,
    events_after_the_last_piece_keep_a_stream_alive,
    a_stream_that_said_why_it_stopped_is_whole_though_it_stays_open,
    a_tool_call_cut_mid_stream_is_not_continued,
    a_job_cancelled_mid_stream_ends_it_as_cancelled,
    a_provider_that_streams_no_usage_is_counted_by_onejob,
);

/// One SSE event as the client saw it.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    data: String,
}

impl Sse {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

fn parse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let (mut id, mut data) = (None, String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            Sse { id, data }
        })
        .collect()
}

fn body(text: &str) -> Value {
    json!({
        "model": "default",
        "messages": [{"role": "user", "content": text}],
        "stream": true,
        "stream_options": {"include_usage": true}
    })
}

fn request(world: &World, key: &str, body: &Value) -> reqwest::RequestBuilder {
    world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .json(body)
}

async fn stream(
    world: &World,
    key: &str,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Vec<Sse>) {
    let response = request(world, key, body).send().await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let text = response.text().await.unwrap();
    (status, headers, parse(&text))
}

fn content(events: &[Sse]) -> String {
    events
        .iter()
        .filter_map(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// The usage chunk's `usage` (`stream_options.include_usage`).
fn usage(events: &[Sse]) -> Value {
    events
        .iter()
        .map(Sse::json)
        .find(|v| v["usage"].is_object())
        .map(|v| v["usage"].clone())
        .expect("a usage chunk")
}

/// Tokens of `text` as `o200k_base` counts them (how onejob counts what a
/// cut attempt delivered).
fn o200k(text: &str) -> u64 {
    onejob::contracts::tokenizer::tokenizer("o200k_base")
        .unwrap()
        .encode_user_text("answer", text)
        .unwrap()
        .len() as u64
}

fn finish_reasons(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| {
            e.json()["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn ends_done(events: &[Sse]) -> bool {
    events.last().is_some_and(|e| e.data == "[DONE]")
}

fn error_event(events: &[Sse]) -> Option<Value> {
    events
        .iter()
        .map(Sse::json)
        .find(|v| v.get("error").is_some())
        .map(|v| v["error"].clone())
}

fn job_id(headers: &reqwest::header::HeaderMap) -> String {
    headers["x-onejob-job-id"].to_str().unwrap().to_string()
}

fn result_text(job: &Value) -> String {
    job["result"].as_str().expect("a text result").to_string()
}

/// The usage a healthy simulator reports for `text`, asked directly.
async fn healthy_usage(world: &World, text: &str) -> Value {
    let answer: Value = world
        .client
        .post(format!("{}/v1/chat/completions", world.sim.base_url()))
        .json(&json!({"model": "healthy", "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["usage"].clone()
}

/// What a healthy simulator answers to `text`, asked directly.
async fn healthy_answer(world: &World, text: &str) -> String {
    let answer = world
        .client
        .post(format!("{}/v1/chat/completions", world.sim.base_url()))
        .json(&json!({"model": "healthy", "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&answer).expect(&answer);
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn states(attempts: &[Value]) -> Vec<(String, String)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap().to_string(),
                a["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(provider: &str, state: &str) -> (String, String) {
    (provider.to_string(), state.to_string())
}

/// Milliseconds since the epoch of an RFC 3339 timestamp the API wrote.
fn ms(v: &Value) -> i64 {
    let t = humantime::parse_rfc3339(v.as_str().unwrap()).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn spec(name: &'static str, model: &'static str) -> ProviderSpec {
    ProviderSpec { name, model }
}

/// A streamed question that must be answered with a call of `get_weather`.
fn weather_ask() -> Value {
    let mut ask = body("Weather in Paris?");
    ask["tools"] = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    ask["tool_choice"] = json!("required");
    ask
}

/// Every `delta.tool_calls` piece the client was sent, in order.
fn tool_call_deltas(events: &[Sse]) -> Vec<Value> {
    events
        .iter()
        .flat_map(|e| {
            e.json()["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

async fn a_streamed_completion_arrives_in_pieces_and_replays_the_same_text(backend: Backend) {
    let providers = [spec("primary", "healthy")];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let (status, headers, events) = stream(&world, "s-1", &body("Tell me a story")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["x-onejob-provider"], "primary");
    let id = job_id(&headers);
    assert!(
        events.iter().all(|e| e.id.is_some()),
        "every event has an id"
    );
    let first = events[0].json();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["id"], format!("chatcmpl-{id}"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Sse::json).collect();
    assert!(
        chunks.iter().all(|c| c["model"] == "healthy"),
        "every chunk names the model that answered"
    );
    let text = content(&events);
    assert!(
        chunks
            .iter()
            .filter(|c| c["choices"][0]["delta"]["content"].is_string())
            .count()
            > 2,
        "the answer comes in pieces"
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert!(ends_done(&events));
    assert_eq!(text, healthy_answer(&world, "Tell me a story").await);

    // [DONE] came after the commit: the job is already succeeded.
    let job = world.job(&id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(result_text(&job), text);
    assert_eq!(
        states(&world.attempts(&id).await),
        vec![pair("primary", "succeeded")]
    );
    assert_eq!(world.executions(&id, "primary"), 1);

    // Replays, streamed and not, give the same text and run nothing.
    let (_, headers, again) = stream(&world, "s-1", &body("Tell me a story")).await;
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(content(&again), text);
    assert!(ends_done(&again));
    let mut plain = body("Tell me a story");
    plain.as_object_mut().unwrap().remove("stream");
    plain.as_object_mut().unwrap().remove("stream_options");
    let answer: Value = request(&world, "s-1", &plain)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

async fn a_stream_cut_mid_answer_is_finished_by_a_fallback_that_continues_it(backend: Backend) {
    let providers = [
        spec("primary", "stream_cut:tokens=2"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |c| {
        // The reconciler asks about the cut attempt only after the
        // continuation has had its chance: it would find the whole answer
        // the simulator made and win with it (a right ending, but not the
        // one this test is about; `finish_from_winner` streams the rest).
        c.engine.reconcile_min_age_ms = 10_000;
    })
    .await;
    let (status, headers, events) = stream(&world, "cut-1", &body("Explain tides")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    assert!(error_event(&events).is_none(), "{events:?}");
    let text = content(&events);
    assert_eq!(
        text,
        healthy_answer(&world, "Explain tides").await,
        "one whole answer"
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events));
    let models: Vec<Value> = events
        .iter()
        .map(Sse::json)
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .map(|c| c["model"].clone())
        .collect();
    assert!(
        models.iter().all(|m| m == "stream_cut:tokens=2"),
        "every chunk names the model that began the answer: {models:?}"
    );
    // Usage counts every delivered token: the cut owner's 32 characters
    // (counted by its tokenizer) and the continuation's own (the simulator
    // counts a token per 4 characters), and both owners' prompts.
    let usage = usage(&events);
    let rest = text.chars().count() - 32;
    assert_eq!(
        usage["completion_tokens"].as_u64().unwrap(),
        o200k(&text[..32]) + rest.div_ceil(4) as u64,
        "{usage}"
    );
    let alone = healthy_usage(&world, "Explain tides").await;
    assert!(
        usage["prompt_tokens"].as_u64().unwrap() >= 2 * alone["prompt_tokens"].as_u64().unwrap(),
        "both owners' prompts: {usage} vs {alone}"
    );

    let job = world.job(&id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(result_text(&job), text);
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["error_kind"], "stream_cut");
    assert_eq!(attempts[1]["provider"], "backup", "{attempts:?}");
    assert_eq!(attempts[1]["state"], "succeeded", "{attempts:?}");
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.executions(&id, "backup"), 1);
    world.stop().await;
}

async fn a_stream_cut_with_no_continuation_ends_with_an_error_naming_the_cut(backend: Backend) {
    let providers = [
        spec("primary", "stream_cut:tokens=2"),
        spec("backup", "no_prefill"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (status, headers, events) = stream(&world, "cut-2", &body("Explain tides")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    let error = error_event(&events).expect("an in-band error event");
    assert_eq!(error["code"], "stream_cut", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("primary"),
        "{error}"
    );
    assert!(
        finish_reasons(&events).is_empty(),
        "never a finish on a truncated answer"
    );
    assert!(!ends_done(&events));
    let partial = content(&events);
    assert_eq!(partial.chars().count(), 32, "two pieces of 16 characters");
    let backup = world.attempts(&id).await;
    assert!(
        backup
            .iter()
            .any(|a| a["provider"] == "backup" && a["state"] == "failed"),
        "the refusing fallback was asked: {backup:?}"
    );

    // The job goes on: the primary executed, the reconciler finds its answer.
    let (job, _) = world
        .until(&id, Duration::from_secs(20), |j, _| {
            j["state"] == "succeeded"
        })
        .await;
    let whole = result_text(&job);
    assert!(whole.starts_with(&partial) && whole.len() > partial.len());
    let (_, _, replay) = stream(&world, "cut-2", &body("Explain tides")).await;
    assert_eq!(content(&replay), whole, "a replay returns the final answer");
    assert_eq!(world.executions(&id, "primary"), 1);
    world.stop().await;
}

async fn a_cut_whose_fallback_cannot_take_a_prefill_is_restarted_and_streams_the_rest_once(
    backend: Backend,
) {
    let providers = [
        spec("primary", "stream_cut:tokens=2"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |c| {
        refuse_prefill(c, "backup");
        // The reconciler asks about the cut attempt only after the restart
        // has had its chance (it would find the primary's whole answer).
        c.engine.reconcile_min_age_ms = 10_000;
    })
    .await;
    let (status, headers, events) = stream(&world, "restart-1", &body("Explain tides")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    assert!(error_event(&events).is_none(), "{events:?}");
    let text = content(&events);
    let whole = healthy_answer(&world, "Explain tides").await;
    assert_eq!(
        text, whole,
        "the whole answer once, the prefix not repeated"
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events));
    // The restart's own usage is the whole answer's.
    let usage = usage(&events);
    assert_eq!(
        usage["completion_tokens"].as_u64().unwrap(),
        whole.chars().count().div_ceil(4) as u64,
        "{usage}"
    );
    let job = world.job(&id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(result_text(&job), text, "the result is what the client saw");
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["error_kind"], "stream_cut", "{attempts:?}");
    assert_eq!(attempts[1]["provider"], "backup", "{attempts:?}");
    assert_eq!(attempts[1]["state"], "succeeded", "{attempts:?}");
    assert_eq!(job["completed_by"], attempts[1]["id"]);
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.executions(&id, "backup"), 1);
    assert_eq!(world.counter("onejob_stream_restarts_total").await, 1.0);
    assert_eq!(
        world.counter("onejob_stream_restarts_diverged_total").await,
        0.0
    );
    world.stop().await;
}

async fn a_restart_that_diverges_from_what_the_client_has_ends_with_an_error_naming_the_cut(
    backend: Backend,
) {
    let providers = [
        spec("primary", "stream_cut:tokens=2"),
        // Another answer to the same prompt: it cannot repeat the prefix.
        spec("backup", "healthy:variant=1"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |c| {
        refuse_prefill(c, "backup");
        c.engine.reconcile_min_age_ms = 10_000;
    })
    .await;
    let (status, headers, events) = stream(&world, "restart-2", &body("Explain tides")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    let error = error_event(&events).expect("an in-band error event");
    assert_eq!(error["code"], "stream_cut", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("primary"), "names the cut: {error}");
    assert!(message.contains("diverged at char"), "{error}");
    assert!(
        finish_reasons(&events).is_empty(),
        "never a finish: {events:?}"
    );
    assert!(!ends_done(&events));
    let partial = content(&events);
    assert_eq!(partial.chars().count(), 32, "only the cut owner's pieces");
    assert!(healthy_answer(&world, "Explain tides")
        .await
        .starts_with(&partial));
    assert_eq!(world.counter("onejob_stream_restarts_total").await, 1.0);
    assert_eq!(
        world.counter("onejob_stream_restarts_diverged_total").await,
        1.0
    );
    // The restart, already running, may still win the job: its whole
    // answer is the result a replay returns.
    let (job, attempts) = world
        .until(&id, Duration::from_secs(20), |j, _| {
            j["state"] == "succeeded"
        })
        .await;
    assert_eq!(job["completed_by"], attempts[1]["id"], "{attempts:?}");
    let whole = result_text(&job);
    assert!(!whole.starts_with(&partial), "the restart's own answer");
    let (_, _, replay) = stream(&world, "restart-2", &body("Explain tides")).await;
    assert_eq!(content(&replay), whole, "a replay returns the job's answer");
    assert_eq!(world.executions(&id, "backup"), 1);
    world.stop().await;
}

/// A cut whose continuation is refused: the client's stream ends with the
/// cut. By default (`complete_after_stream_error = false`) nothing else is
/// asked of any provider: the job waits in review for its unknown attempt.
/// With the setting on, the job goes on and another attempt is run (billed).
async fn a_client_told_error_is_not_billed_again_unless_the_route_completes_after_it(
    backend: Backend,
) {
    for complete_after in [false, true] {
        let providers = [
            spec("primary", "stream_cut:tokens=2"),
            // Says it takes a prefill, then refuses it (never executed).
            spec("backup", "no_prefill"),
        ];
        let mut policy = route("primary", &["backup"]);
        policy.complete_after_stream_error = complete_after;
        let world = start_world(backend, &providers, policy, |c| {
            // The reconciler stays out of it: only the engine may ask again.
            c.engine.reconcile_min_age_ms = 60_000;
        })
        .await;
        let (_, headers, events) = stream(&world, "told-1", &body("Explain tides")).await;
        let id = job_id(&headers);
        let error = error_event(&events).expect("an in-band error event");
        assert_eq!(error["code"], "stream_cut", "{complete_after}: {error}");
        assert!(finish_reasons(&events).is_empty());
        if complete_after {
            // The old behaviour: the job goes on and runs another attempt.
            let (job, attempts) = world
                .until(&id, Duration::from_secs(20), |j, _| {
                    j["state"] == "succeeded"
                })
                .await;
            assert!(attempts.len() >= 3, "another attempt: {attempts:?}");
            assert_eq!(
                world.deliveries(&id, "primary") + world.deliveries(&id, "backup"),
                3,
                "the cut, the refused continuation and the retry: {attempts:?}"
            );
            assert!(job["completed_by"] == attempts.last().unwrap()["id"]);
        } else {
            // The cut attempt may have executed (unknown), so the job is
            // not failed: it waits in review, and nothing runs it again.
            let (job, attempts) = world
                .until(&id, Duration::from_secs(20), |j, _| {
                    j["state"] == "needs_review"
                })
                .await;
            assert_eq!(
                states(&attempts),
                vec![pair("primary", "unknown"), pair("backup", "failed")],
                "no attempt after the error"
            );
            assert!(
                job["last_error"]
                    .as_str()
                    .unwrap()
                    .contains("complete_after_stream_error"),
                "{job}"
            );
            assert_eq!(world.deliveries(&id, "primary"), 1);
            assert_eq!(
                world.deliveries(&id, "backup"),
                1,
                "only the refused continuation"
            );
            assert_eq!(world.executions(&id, "backup"), 0);
        }
        assert_eq!(world.executions(&id, "primary"), 1);
        world.stop().await;
    }
}

async fn a_primary_silent_past_silence_ms_loses_the_stream_to_the_hedge(backend: Backend) {
    let providers = [
        spec("primary", "slow_first_byte:ms=3000"),
        spec("backup", "healthy"),
    ];
    let mut r = route("primary", &["backup"]);
    r.silence_ms = 200;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, headers, events) = stream(&world, "slow-1", &body("Hello")).await;
    let id = job_id(&headers);
    assert_eq!(headers["x-onejob-provider"], "backup");
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert!(ends_done(&events));
    assert_eq!(events[0].json()["model"], "healthy");
    let attempts = world.attempts(&id).await;
    assert_eq!(
        states(&attempts),
        vec![pair("primary", "discarded"), pair("backup", "succeeded")]
    );
    assert_eq!(world.job(&id).await["completed_by"], attempts[1]["id"]);
    world.stop().await;
}

async fn a_stalled_stream_is_bounded_by_stall_ms_and_continued(backend: Backend) {
    let providers = [
        spec("primary", "stream_stall:tokens=2"),
        spec("backup", "healthy"),
    ];
    let mut r = route("primary", &["backup"]);
    r.stall_ms = 300;
    let world = start_world(backend, &providers, r, |c| {
        // As with a cut: the continuation, not the reconciler, is under test.
        c.engine.reconcile_min_age_ms = 10_000;
    })
    .await;
    let (_, headers, events) = stream(&world, "stall-1", &body("Explain tides")).await;
    let id = job_id(&headers);
    assert_eq!(
        content(&events),
        healthy_answer(&world, "Explain tides").await
    );
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["error_kind"], "stream_stall");
    // Unknown, or already reconciled (the simulator executed it) and
    // discarded: the continuation won the CAS.
    assert!(
        ["unknown", "discarded"].contains(&attempts[0]["state"].as_str().unwrap()),
        "{attempts:?}"
    );
    assert_eq!(attempts[1]["state"], "succeeded");
    // Time to first token is the first piece's arrival, not the attempt's
    // end: the stalled primary answered its first piece at once, and its
    // attempt never succeeded.
    let metrics = world.metrics().await;
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{provider=\"primary\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(
        line("onejob_time_to_first_token_seconds_count"),
        Some(1.0),
        "{metrics}"
    );
    let ttft = line("onejob_time_to_first_token_seconds_sum").unwrap();
    assert!(ttft < 0.3, "first piece before stall_ms, got {ttft} s");
    world.stop().await;
}

async fn a_malformed_chunk_breaks_the_stream_and_it_is_continued(backend: Backend) {
    let providers = [
        spec("primary", "stream_malformed:tokens=1"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "bad-1", &body("Explain tides")).await;
    let id = job_id(&headers);
    assert_eq!(
        content(&events),
        healthy_answer(&world, "Explain tides").await
    );
    assert_eq!(finish_reasons(&events), vec!["stop"], "{events:?}");
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["error_kind"], "malformed_chunk");
    assert_eq!(world.executions(&id, "backup"), 1);
    world.stop().await;
}

async fn a_stream_closed_without_done_is_never_a_finished_answer(backend: Backend) {
    // No fallback: the client must not take the text for a whole answer.
    let providers = [
        spec("primary", "stream_no_finish"),
        spec("nodone", "stream_no_done"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("nodone".into(), route("nodone", &[]));
    })
    .await;
    // A server that never sends `[DONE]` but said why it stopped: whole,
    // with its usage, and one execution.
    let mut ask = body("Explain tides");
    ask["model"] = json!("nodone");
    let (_, headers, events) = stream(&world, "nodone-0", &ask).await;
    let id = job_id(&headers);
    assert_eq!(
        content(&events),
        healthy_answer(&world, "Explain tides").await
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events), "the client gets its [DONE]");
    let usage = events.iter().rev().find_map(|e| {
        let u = e.json()["usage"].clone();
        (!u.is_null()).then_some(u)
    });
    assert!(usage.is_some_and(|u| u["completion_tokens"].as_u64() > Some(0)));
    assert_eq!(world.executions(&id, "nodone"), 1);
    let attempts = world.attempts(&id).await;
    assert_eq!(states(&attempts), vec![pair("nodone", "succeeded")]);
    // Closed cleanly before a finish reason: never a finished answer.
    let (_, headers, events) = stream(&world, "nodone-1", &body("Explain tides")).await;
    let id = job_id(&headers);
    let error = error_event(&events).expect("an error, not a finish");
    assert_eq!(error["code"], "stream_incomplete", "{error}");
    assert!(finish_reasons(&events).is_empty());
    assert!(!ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["error_kind"], "stream_incomplete");
    world.stop().await;
}

async fn a_persistent_503_streams_from_the_fallback(backend: Backend) {
    let providers = [spec("primary", "fail:503"), spec("backup", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "503-1", &body("Hello")).await;
    let id = job_id(&headers);
    assert_eq!(headers["x-onejob-provider"], "backup");
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["provider"], "primary");
    assert_eq!(attempts[0]["state"], "failed");
    assert_eq!(attempts.last().unwrap()["provider"], "backup");
    assert_eq!(attempts.last().unwrap()["state"], "succeeded");
    world.stop().await;
}

async fn a_client_that_drops_mid_stream_resumes_with_the_same_key(backend: Backend) {
    // The primary stalls after two pieces; the client drops there, and the
    // job goes on (stall, continuation) without it.
    let providers = [
        spec("primary", "stream_stall:tokens=2"),
        spec("backup", "healthy"),
    ];
    let mut r = route("primary", &["backup"]);
    r.stall_ms = 500;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let b = body("Explain tides");
    let response = request(&world, "resume-1", &b).send().await.unwrap();
    let id = job_id(response.headers());
    let mut bytes = response.bytes_stream();
    let mut seen = String::new();
    while parse(&seen).len() < 3 {
        seen.push_str(std::str::from_utf8(&bytes.next().await.unwrap().unwrap()).unwrap());
    }
    drop(bytes); // the client's connection is gone
    let before = parse(&seen);
    let last_id = before.last().unwrap().id.clone().unwrap();
    let had = content(&before);
    assert_eq!(had.chars().count(), 32);

    // Reconnect with the same key and the last event id: the rest, once.
    let response = request(&world, "resume-1", &b)
        .header("Last-Event-ID", &last_id)
        .send()
        .await
        .unwrap();
    assert_eq!(job_id(response.headers()), id, "the same job");
    let rest = parse(&response.text().await.unwrap());
    assert!(rest
        .iter()
        .all(|e| e.id.as_deref() != Some(last_id.as_str())));
    let whole = format!("{had}{}", content(&rest));
    assert_eq!(whole, healthy_answer(&world, "Explain tides").await);
    assert!(ends_done(&rest));

    // The finished job, resumed from the middle: the stored answer's rest.
    let response = request(&world, "resume-1", &b)
        .header("Last-Event-ID", &last_id)
        .send()
        .await
        .unwrap();
    let stored = parse(&response.text().await.unwrap());
    assert_eq!(format!("{had}{}", content(&stored)), whole);
    // Without Last-Event-ID: the whole answer.
    let (_, _, again) = stream(&world, "resume-1", &b).await;
    assert_eq!(content(&again), whole);
    // From the id of `[DONE]` itself, or one past the end: `[DONE]` again,
    // never an empty stream an SDK would take for a silent end.
    let done_id = again.last().unwrap().id.clone().unwrap();
    for after in [done_id.as_str(), "99999"] {
        let response = request(&world, "resume-1", &b)
            .header("Last-Event-ID", after)
            .send()
            .await
            .unwrap();
        let tail = parse(&response.text().await.unwrap());
        assert_eq!(tail.len(), 1, "{after}: {tail:?}");
        assert!(ends_done(&tail), "{after}: {tail:?}");
    }

    assert_eq!(world.executions(&id, "primary"), 1, "one execution");
    assert_eq!(world.executions(&id, "backup"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// A client resuming with `Last-Event-ID` whose job has no answer to send
/// (here: in review) gets the error with an id past its own, never one
/// that would move its place back to the start: an EventSource resuming
/// from that id again would be sent what it has shown already.
async fn a_resumed_stream_that_ends_in_an_error_keeps_the_clients_place(backend: Backend) {
    let mut r = route("primary", &[]);
    r.max_attempts = 1;
    let world = start_world(backend, &[spec("primary", "fail:500")], r, |_| {}).await;
    let b = body("Explain tides");
    let (_, _, first) = stream(&world, "placed", &b).await;
    assert!(error_event(&first).is_some(), "{first:?}");
    let response = request(&world, "placed", &b)
        .header("Last-Event-ID", "48")
        .send()
        .await
        .unwrap();
    let resumed = parse(&response.text().await.unwrap());
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert!(error_event(&resumed).is_some(), "{resumed:?}");
    assert_eq!(resumed[0].id.as_deref(), Some("48.1"), "{resumed:?}");
    world.stop().await;
}

async fn a_streamed_429_is_retried_on_the_same_provider_no_sooner_than_retry_after(
    backend: Backend,
) {
    let providers = [
        spec("primary", "rate_limit:retry_after=1,times=1"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "429-1", &body("Hello")).await;
    let id = job_id(&headers);
    assert_eq!(headers["x-onejob-provider"], "primary");
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(
        states(&attempts),
        vec![pair("primary", "failed"), pair("primary", "succeeded")]
    );
    assert_eq!(attempts[0]["error_kind"], "rate_limited");
    let refused_at = ms(&attempts[0]["finished_at"]);
    let retried_at = ms(&attempts[1]["started_at"]);
    assert!(
        retried_at - refused_at >= 1000,
        "Retry-After honoured: {attempts:?}"
    );
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.executions(&id, "backup"), 0);
    world.stop().await;
}

async fn a_streamed_500_once_is_retried_and_streams_the_whole_answer(backend: Backend) {
    let providers = [
        spec("primary", "fail:500,times=1"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "500-1", &body("Hello")).await;
    let id = job_id(&headers);
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    let attempts = world.attempts(&id).await;
    assert_eq!(
        states(&attempts),
        vec![pair("primary", "failed"), pair("primary", "succeeded")]
    );
    assert_eq!(world.executions(&id, "primary"), 1);
    world.stop().await;
}

async fn a_reset_before_headers_is_rescued_by_the_fallback_at_once(backend: Backend) {
    let providers = [spec("primary", "drop_response"), spec("backup", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "reset-1", &body("Hello")).await;
    let id = job_id(&headers);
    assert_eq!(headers["x-onejob-provider"], "backup");
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["provider"], "primary");
    assert_eq!(attempts[1]["provider"], "backup");
    assert_eq!(attempts[1]["kind"], "hedge");
    // At once: long before silence_ms (10 s) would have hedged.
    let reset_at = ms(&attempts[0]["started_at"]);
    let hedged_at = ms(&attempts[1]["started_at"]);
    assert!(hedged_at - reset_at < 10_000, "{attempts:?}");
    // The unknown attempt is reconciled: the simulator executed it, and its
    // late answer loses to the hedge's.
    let (job, attempts) = world
        .until(&id, Duration::from_secs(20), |_, a| {
            a[0]["state"] != "unknown"
        })
        .await;
    assert_eq!(attempts[0]["state"], "discarded", "{attempts:?}");
    assert_eq!(job["completed_by"], attempts[1]["id"]);
    assert_eq!(world.executions(&id, "primary"), 1);
    assert_eq!(world.executions(&id, "backup"), 1);
    world.stop().await;
}

async fn a_streamed_replay_on_another_instance_gets_the_final_completion(backend: Backend) {
    let providers = [spec("primary", "healthy:latency=1500")];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    // Instance B: the same database and providers, its own engine.
    let (other, stop_other, other_server) =
        common::world::serve(world.config().clone(), world.store.clone()).await;
    let b = body("Hello");
    let first = {
        let request = request(&world, "multi-1", &b);
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let id = job_id(response.headers());
            (id, parse(&response.text().await.unwrap()))
        })
    };
    // The job exists (driven by A) before B is asked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while world.store.count_jobs().await.unwrap() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job was never created"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let replay = world
        .client
        .post(format!("{other}/v1/chat/completions"))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "multi-1")
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let on_b = parse(&replay.text().await.unwrap());
    let (id, on_a) = first.await.unwrap();
    assert_eq!(
        content(&on_b),
        content(&on_a),
        "the final completion, streamed"
    );
    assert!(ends_done(&on_b));
    assert_eq!(world.executions(&id, "primary"), 1);
    let _ = stop_other.send(());
    other_server.await.unwrap();
    world.stop().await;
}

async fn a_streamed_content_filter_fails_after_one_attempt_with_its_reason(backend: Backend) {
    let providers = [spec("primary", "content_filter"), spec("backup", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (_, headers, events) = stream(&world, "filter-1", &body("Hello")).await;
    let id = job_id(&headers);
    let error = error_event(&events).expect("an error event");
    // The provider's refusal as OpenAI says it, for a job that is finished:
    // nothing about replaying.
    assert_eq!(error["code"], "content_policy_violation", "{error}");
    assert_eq!(error["type"], "invalid_request_error", "{error}");
    assert!(
        !error["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("replay"),
        "{error}"
    );
    assert!(content(&events).is_empty());
    assert!(!ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(
        states(&attempts),
        vec![pair("primary", "failed")],
        "one attempt"
    );
    assert_eq!(world.job(&id).await["state"], "failed");
    assert_eq!(world.executions(&id, "backup"), 0);
    // A streamed replay of the failed job ends as the live stream did.
    let (_, _, replayed) = stream(&world, "filter-1", &body("Hello")).await;
    let again = error_event(&replayed).expect("an error event on replay");
    assert_eq!(
        (&again["code"], &again["type"]),
        (&error["code"], &error["type"]),
        "{again}"
    );
    world.stop().await;
}

async fn a_streamed_context_length_exceeded_moves_to_a_larger_window_never_back(backend: Backend) {
    let providers = [
        spec("primary", "context_length"),
        spec("small", "healthy"),
        spec("large", "healthy"),
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
    let (status, headers, events) = stream(&world, "ctx-1", &body("Hello")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    assert_eq!(headers["x-onejob-provider"], "large");
    assert_eq!(content(&events), healthy_answer(&world, "Hello").await);
    assert_eq!(finish_reasons(&events), vec!["stop".to_string()]);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(
        states(&attempts),
        vec![pair("primary", "failed"), pair("large", "succeeded")]
    );
    assert_eq!(attempts[0]["error_kind"], "context_length_exceeded");
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
    assert_eq!(world.executions(&id, "large"), 1);
    world.stop().await;
}

async fn a_streamed_context_length_exceeded_with_no_larger_window_ends_with_that_code(
    backend: Backend,
) {
    let providers = [spec("primary", "context_length"), spec("backup", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |c| {
        set_window(c, "backup", 8_192)
    })
    .await;
    let (_, headers, events) = stream(&world, "ctx-2", &body("Hello")).await;
    let id = job_id(&headers);
    let error = error_event(&events).expect("an error event");
    assert_eq!(error["code"], "context_length_exceeded", "{error}");
    assert!(content(&events).is_empty());
    assert!(
        finish_reasons(&events).is_empty(),
        "never a finished answer"
    );
    assert!(!ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(states(&attempts), vec![pair("primary", "failed")]);
    assert_eq!(world.job(&id).await["state"], "failed");
    assert_eq!(world.deliveries(&id, "primary"), 1);
    assert_eq!(world.deliveries(&id, "backup"), 0);
    world.stop().await;
}

async fn a_streamed_primary_down_for_a_while_is_routed_around_then_probed_back(backend: Backend) {
    let providers = [spec("primary", "primary-model"), spec("backup", "healthy")];
    let mut r = route("primary", &["backup"]);
    // Each 503 fails over at once, so three streams make three failures.
    r.same_provider_retries = 0;
    let world = start_world(backend, &providers, r, |c| {
        c.engine.breaker_threshold = 3;
        c.engine.breaker_open_ms = 300;
        c.engine.breaker_probe_every = 2;
    })
    .await;
    world.sim.models().set("primary-model", "fail:503").unwrap();
    let expected = healthy_answer(&world, "Hello").await;
    let run = |i: usize| {
        let world = &world;
        async move {
            let (_, headers, events) = stream(world, &format!("brk-{i}"), &body("Hello")).await;
            let id = job_id(&headers);
            (headers, events, world.attempts(&id).await)
        }
    };
    // Down: three streams are served by the backup after a 503 each; the breaker opens.
    for i in 0..3 {
        let (headers, events, attempts) = run(i).await;
        assert_eq!(headers["x-onejob-provider"], "backup");
        assert_eq!(content(&events), expected);
        assert!(ends_done(&events));
        assert_eq!(
            states(&attempts),
            vec![pair("primary", "failed"), pair("backup", "succeeded")]
        );
    }
    // Open: the next stream starts on the backup without asking the primary.
    let (headers, events, attempts) = run(3).await;
    assert_eq!(headers["x-onejob-provider"], "backup");
    assert_eq!(content(&events), expected);
    assert_eq!(states(&attempts), vec![pair("backup", "succeeded")]);

    // Healthy again: after the open period a probe reaches the primary and
    // the streams return to it.
    world.sim.models().set("primary-model", "healthy").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut i = 4;
    loop {
        let (headers, events, attempts) = run(i).await;
        i += 1;
        assert_eq!(
            content(&events),
            expected,
            "every stream is one whole answer"
        );
        assert!(ends_done(&events));
        if headers["x-onejob-provider"] == "primary" {
            assert_eq!(states(&attempts), vec![pair("primary", "succeeded")]);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the primary was never probed back"
        );
    }
    // Closed: the next stream goes to the primary first, with no fallback.
    let (headers, _, attempts) = run(i).await;
    assert_eq!(headers["x-onejob-provider"], "primary");
    assert_eq!(states(&attempts), vec![pair("primary", "succeeded")]);
    world.stop().await;
}

/// The shipped default route is the simulator, so a new user's first
/// streamed tool call meets it: the call arrives as OpenAI streams it (id
/// and name, then the arguments in pieces) and the stream ends `tool_calls`.
async fn the_simulator_streams_a_tool_call(backend: Backend) {
    let providers = [spec("primary", "healthy")];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let ask = weather_ask();
    let (status, headers, events) = stream(&world, "tool-stream-1", &ask).await;
    assert_eq!(status, 200);
    assert!(ends_done(&events), "{events:?}");
    assert_eq!(finish_reasons(&events), vec!["tool_calls"]);
    let deltas = tool_call_deltas(&events);
    assert!(deltas.len() >= 2, "the call comes in pieces: {deltas:?}");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert!(deltas[0]["id"].is_string(), "{deltas:?}");
    let arguments: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    let arguments: Value = serde_json::from_str(&arguments).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    // The job keeps the call, as a non-streamed replay shows.
    let id = job_id(&headers);
    let job = world.stored_job(&id).await;
    let result: Value = serde_json::from_str(job.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(world.executions(&id, "primary"), 1);
    world.stop().await;
}

/// `attempt_timeout_ms` bounds the wait for a stream's first token, not the
/// stream: a healthy generation that runs longer is whole. Only
/// `stream_timeout_ms` bounds a whole stream.
async fn a_healthy_stream_longer_than_attempt_timeout_is_not_cut(backend: Backend) {
    // A piece every 150 ms: about 1.2 s of stream.
    let providers = [
        spec("primary", "healthy:gap=150"),
        spec("capped", "healthy:gap=150"),
    ];
    let mut long = route("primary", &[]);
    long.silence_ms = 300;
    long.attempt_timeout_ms = 400;
    long.stall_ms = 1_000;
    let mut capped = long.clone();
    capped.primary = "capped".into();
    capped.stream_timeout_ms = 500;
    capped.max_attempts = 1;
    let world = start_world(backend, &providers, long, |c| {
        c.routes.insert("capped".into(), capped);
    })
    .await;
    let (_, headers, events) = stream(&world, "long-1", &body("Tell a long story")).await;
    let id = job_id(&headers);
    assert_eq!(
        content(&events),
        healthy_answer(&world, "Tell a long story").await
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(states(&attempts), vec![pair("primary", "succeeded")]);
    let started = ms(&attempts[0]["started_at"]);
    let finished = ms(&attempts[0]["finished_at"]);
    assert!(
        finished - started > 400,
        "it ran past attempt_timeout_ms: {attempts:?}"
    );
    // With stream_timeout_ms = 500 the same stream is cut, never finished.
    let mut ask = body("Tell a long story");
    ask["model"] = json!("capped");
    let (_, headers, events) = stream(&world, "long-2", &ask).await;
    let id = job_id(&headers);
    assert!(finish_reasons(&events).is_empty(), "{events:?}");
    assert!(error_event(&events).is_some(), "{events:?}");
    // Why its attempt became unknown is in the event log (the attempt's
    // own row loses its error if the reconciler then finds it executed).
    let events = world
        .store
        .list_events(&onejob::domain::JobId::from(&id))
        .await
        .unwrap();
    let unknown = events
        .iter()
        .find(|e| e.kind == "attempt_unknown")
        .unwrap_or_else(|| panic!("{events:?}"));
    let detail: Value = serde_json::from_str(unknown.detail.as_deref().unwrap()).unwrap();
    assert_eq!(detail["error_kind"], "attempt_timeout", "{detail}");
    assert!(
        detail["message"]
            .as_str()
            .unwrap()
            .contains("stream_timeout_ms"),
        "{detail}"
    );
    world.stop().await;
}

/// The finish, the usage chunk and `[DONE]` are signs of life like the
/// pieces: a stream whose events keep coming within `stall_ms` is never a
/// stall. Before, the stall timer counted from the last piece, so a
/// healthy stream paced at 200 ms (three events after its last piece)
/// was taken for stalled at 450 ms and its job run again on the fallback.
async fn events_after_the_last_piece_keep_a_stream_alive(backend: Backend) {
    let providers = [
        spec("primary", "healthy:gap=200"),
        spec("backup", "healthy"),
    ];
    let mut r = route("primary", &["backup"]);
    r.stall_ms = 450;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, headers, events) = stream(&world, "paced-1", &body("Hi")).await;
    let id = job_id(&headers);
    assert!(error_event(&events).is_none(), "{events:?}");
    assert_eq!(content(&events), healthy_answer(&world, "Hi").await);
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events));
    let attempts = world.attempts(&id).await;
    assert_eq!(states(&attempts), vec![pair("primary", "succeeded")]);
    assert_eq!(world.executions(&id, "backup"), 0, "never run again");
    world.stop().await;
}

/// A provider that sent its finish and usage and then holds the
/// connection open (no `[DONE]`, no close) gave a whole answer: it ends
/// as that answer a short while after the finish. Before, the silence
/// after the finish was a stall: the job ran again on the fallback, whose
/// continuation was stuck onto the whole answer the client already had.
async fn a_stream_that_said_why_it_stopped_is_whole_though_it_stays_open(backend: Backend) {
    let providers = [
        spec("primary", "stream_no_close"),
        spec("backup", "healthy"),
    ];
    let mut r = route("primary", &["backup"]);
    r.stall_ms = 300;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, headers, events) = stream(&world, "open-1", &body("Explain tides")).await;
    let id = job_id(&headers);
    assert!(error_event(&events).is_none(), "{events:?}");
    assert_eq!(
        content(&events),
        healthy_answer(&world, "Explain tides").await,
        "the answer once, nothing stuck on"
    );
    assert_eq!(finish_reasons(&events), vec!["stop"]);
    assert!(ends_done(&events));
    assert!(usage(&events)["completion_tokens"].as_u64() > Some(0));
    let attempts = world.attempts(&id).await;
    assert_eq!(states(&attempts), vec![pair("primary", "succeeded")]);
    assert_eq!(world.executions(&id, "backup"), 0);
    world.stop().await;
}

/// A stream cut in the middle of a tool call is not continued: a prefill
/// carries text, so the fallback started the call again and the client
/// got one call spliced from two (`{"city":"yarrow tundra h{"city":…`)
/// under `finish_reason: tool_calls`. It ends with the cut, in-band.
async fn a_tool_call_cut_mid_stream_is_not_continued(backend: Backend) {
    let providers = [
        spec("primary", "stream_cut:tokens=2"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |c| {
        c.engine.reconcile_min_age_ms = 10_000;
    })
    .await;
    let ask = weather_ask();
    let (_, headers, events) = stream(&world, "tool-cut-1", &ask).await;
    let id = job_id(&headers);
    let calls = tool_call_deltas(&events);
    assert!(!calls.is_empty(), "part of the call was sent: {events:?}");
    let ids: Vec<&Value> = calls.iter().filter(|c| c["id"].is_string()).collect();
    assert_eq!(ids.len(), 1, "one call begun, never a second: {calls:?}");
    let error = error_event(&events).expect("the cut, in-band");
    assert_eq!(error["code"], "stream_cut", "{error}");
    assert!(finish_reasons(&events).is_empty(), "{events:?}");
    assert!(!ends_done(&events));
    assert_eq!(world.executions(&id, "backup"), 0, "no continuation");
    world.stop().await;
}

/// A cancel while the answer streams ends the client's stream with the
/// code a replay gives (`job_cancelled`), never `[DONE]`; before, it said
/// `job_finished` ("finished or cancelled by another party").
async fn a_job_cancelled_mid_stream_ends_it_as_cancelled(backend: Backend) {
    let providers = [spec("primary", "healthy:gap=150")];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;
    let response = request(&world, "cancel-mid-1", &body("Tell a long story"))
        .send()
        .await
        .unwrap();
    let id = job_id(response.headers());
    let mut bytes = response.bytes_stream();
    let mut seen = String::new();
    while content(&parse(&seen)).is_empty() {
        seen.push_str(std::str::from_utf8(&bytes.next().await.unwrap().unwrap()).unwrap());
    }
    let (status, _) = world
        .post(&world.key, &format!("/v1/jobs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 200);
    while let Some(chunk) = bytes.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events = parse(&seen);
    let error = error_event(&events).expect("the stream ends with an error");
    assert_eq!(error["code"], "job_cancelled", "{error}");
    assert!(!ends_done(&events), "{events:?}");
    assert!(finish_reasons(&events).is_empty(), "{events:?}");
    let (job, attempts) = world
        .until(&id, Duration::from_secs(10), |_, a| {
            a.iter().all(|a| a["state"] != "started")
        })
        .await;
    assert_eq!(job["state"], "cancelled");
    assert_eq!(attempts[0]["state"], "discarded", "{attempts:?}");
    world.stop().await;
}

/// A `kind = "openai"` provider with `stream_usage = false` (a server that
/// refuses `stream_options`) streams no usage. The client was told
/// `CompletionUsage(0, 0, 0)`, a replay too, the Messages door `0`/`0`,
/// and the attempt's usage was null, so no budget counted the answer.
/// onejob now counts it with the provider's tokenizer: the prompt as sent
/// and the text delivered, marked `estimated` on the attempt.
async fn a_provider_that_streams_no_usage_is_counted_by_onejob(backend: Backend) {
    std::env::set_var("ONEJOB_TEST_NO_USAGE_KEY", "sk-sim");
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |c| {
            let path = c.providers_dir.join("primary.toml");
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("kind = \"sim\"", "kind = \"openai\"")
                .replace("lookup = \"sim_ledger\"\n", "");
            let text =
                format!("api_key_env = \"ONEJOB_TEST_NO_USAGE_KEY\"\nstream_usage = false\n{text}");
            std::fs::write(path, text).unwrap();
        },
    )
    .await;
    let (status, headers, events) = stream(&world, "no-usage-1", &body("Tell me a story")).await;
    assert_eq!(status, 200);
    let id = job_id(&headers);
    let text = content(&events);
    assert!(!text.is_empty());
    let told = usage(&events);
    let (prompt, completion) = (
        told["prompt_tokens"].as_u64().unwrap(),
        told["completion_tokens"].as_u64().unwrap(),
    );
    assert!(prompt > 0, "{told}");
    assert_eq!(completion, o200k(&text), "{told}");
    assert_eq!(told["total_tokens"].as_u64(), Some(prompt + completion));

    // The attempt keeps the count, marked as onejob's own; a replay tells it.
    let attempts = world.attempts(&id).await;
    assert_eq!(
        attempts[0]["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "estimated": true}),
        "{attempts:?}"
    );
    let (_, _, again) = stream(&world, "no-usage-1", &body("Tell me a story")).await;
    assert_eq!(usage(&again), told);

    // The Messages door, streamed: its final usage.
    let response = world
        .client
        .post(format!("{}/v1/messages", world.address))
        .header("x-api-key", &world.key)
        .header("anthropic-version", "2023-06-01")
        .header("Idempotency-Key", "no-usage-2")
        .json(
            &json!({"model": "default", "max_tokens": 256, "stream": true,
                      "messages": [{"role": "user", "content": "Tell me a story"}]}),
        )
        .send()
        .await
        .unwrap();
    let sse = response.text().await.unwrap();
    let delta = parse(&sse)
        .iter()
        .map(Sse::json)
        .find(|v| v["type"] == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta in {sse}"));
    assert!(
        delta["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{sse}"
    );
    assert!(
        delta["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{sse}"
    );
    world.stop().await;
}
