//! `POST /v1/messages` and `/v1/messages/count_tokens` over raw HTTP: the
//! statuses, shapes and headers an Anthropic client sees, checked against
//! the job rows and the simulator's ledger (and, for the native pass-through,
//! what a fake Anthropic upstream received).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod upstream;

use common::world::{refuse_prefill, route, set_window, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    a_message_is_answered_in_anthropics_shape_by_the_model_that_answered,
    the_same_key_with_another_body_is_a_conflict_in_anthropics_shape,
    a_streamed_replay_of_a_message_is_the_same_job_and_its_events_are_anthropics,
    refused_requests_are_invalid_request_errors_and_write_nothing,
    a_call_without_credentials_is_an_authentication_error,
    count_tokens_needs_no_key_calls_no_provider_and_names_its_tokenizer,
    context_length_exceeded_moves_to_a_larger_window_never_back,
    context_length_exceeded_with_no_larger_window_is_an_invalid_request_error,
    a_content_filter_is_an_invalid_request_error_after_one_attempt,
    a_cut_restarted_on_a_fallback_without_prefill_is_one_message_or_an_error_event,
    blocks_reach_an_anthropic_provider_natively_with_cache_control_untouched,
    a_failed_tool_result_reaches_each_wire_as_it_can_say_it,
    disable_parallel_tool_use_is_one_tool_call_per_turn_on_every_wire,
    a_job_the_providers_overload_ended_is_an_overloaded_error,
    a_job_rate_limited_into_review_may_be_asked_again,
    a_streamed_context_length_exceeded_says_what_the_answer_says,
    a_cancelled_job_streamed_says_what_the_answer_says,
    a_job_overloaded_into_review_streamed_is_an_overloaded_error,
    a_live_stream_overloaded_into_review_ends_as_its_replay_does,
    structured_output_asked_in_anthropics_words_is_the_jobs_response_format,
    a_job_still_pending_streamed_says_what_the_answer_says,
    the_models_api_answers_in_anthropics_shape_when_asked_with_anthropic_version,
    prompt_cache_tokens_reach_every_door_and_the_budget,
);

/// A world whose one route has one provider, `primary`, on the simulator's
/// `model` (a behaviour such as `"healthy"` or `"overloaded"`).
async fn primary_world(backend: Backend, model: &'static str) -> World {
    start_world(
        backend,
        &[spec("primary", model)],
        route("primary", &[]),
        |_| {},
    )
    .await
}

fn spec(name: &'static str, model: &'static str) -> ProviderSpec {
    ProviderSpec { name, model }
}

fn message_body(text: &str) -> Value {
    json!({
        "model": "default",
        "max_tokens": 256,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": text}],
    })
}

fn post(world: &World, path: &str, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
    let mut request = world
        .client
        .post(format!("{}{path}", world.address))
        .header("x-api-key", &world.key)
        .header("anthropic-version", "2023-06-01")
        .json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request
}

async fn send(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
        .to_str()
        .unwrap()
}

/// An error in Anthropic's shape: its status, `error.type` and message.
fn anthropic_error(status: u16, body: &Value) -> (u16, String, String) {
    assert_eq!(body["type"], "error", "{body}");
    (
        status,
        body["error"]["type"].as_str().unwrap().to_string(),
        body["error"]["message"].as_str().unwrap().to_string(),
    )
}

/// The `event:` name and JSON data of each SSE event.
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

async fn a_message_is_answered_in_anthropics_shape_by_the_model_that_answered(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    let (status, headers, message) = send(post(
        &world,
        "/v1/messages",
        Some("m-1"),
        &message_body("Say hello."),
    ))
    .await;
    assert_eq!(status, 200, "{message}");
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(header(&headers, "x-onejob-provider"), "primary");
    let attempts = world.attempts(&job_id).await;
    assert_eq!(header(&headers, "x-onejob-attempt"), attempts[0]["id"]);
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["id"], format!("msg_{}", job_id.replace('-', "")));
    assert_eq!(
        message["model"], "healthy",
        "the model that answered, not the route"
    );
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["stop_sequence"], Value::Null);
    assert_eq!(message["content"][0]["type"], "text");
    let job = world.job(&job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        message["content"][0]["text"], job["result"],
        "the stored answer"
    );
    assert!(
        message["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{message}"
    );
    assert!(
        message["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{message}"
    );
    // The system text reached the job as a system turn.
    let stored = world.stored_job(&job_id).await;
    let request: Value = serde_json::from_str(&stored.request).unwrap();
    assert_eq!(
        request["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(request["params"]["max_tokens"], 256);
    assert_eq!(world.executions(&job_id, "primary"), 1);

    // Bearer works too, and the replay is the same message, not run again.
    let (status, headers, again) = send(
        world
            .client
            .post(format!("{}/v1/messages", world.address))
            .bearer_auth(&world.key)
            .header("Idempotency-Key", "m-1")
            .json(&message_body("Say hello.")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "idempotent-replayed"), "true");
    assert_eq!(again, message);
    assert_eq!(world.executions(&job_id, "primary"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

async fn the_same_key_with_another_body_is_a_conflict_in_anthropics_shape(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    let (status, _, _) = send(post(
        &world,
        "/v1/messages",
        Some("m-2"),
        &message_body("One."),
    ))
    .await;
    assert_eq!(status, 200);
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("m-2"),
        &message_body("Two."),
    ))
    .await;
    let (status, kind, message) = anthropic_error(status, &body);
    assert_eq!((status, kind.as_str()), (409, "invalid_request_error"));
    assert!(message.contains("m-2"), "{message}");
    assert_eq!(
        header(&headers, "x-should-retry"),
        "false",
        "the SDK must not retry it"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

async fn a_streamed_replay_of_a_message_is_the_same_job_and_its_events_are_anthropics(
    backend: Backend,
) {
    let world = primary_world(backend, "healthy").await;
    let body = message_body("Explain tides");
    let (_, headers, message) = send(post(&world, "/v1/messages", Some("m-3"), &body)).await;
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let response = post(&world, "/v1/messages", Some("m-3"), &streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(response.headers(), "content-type"),
        "text/event-stream"
    );
    assert_eq!(
        header(response.headers(), "x-onejob-job-id"),
        job_id,
        "the same job"
    );
    assert_eq!(header(response.headers(), "x-onejob-provider"), "primary");
    let text = response.text().await.unwrap();
    let events = events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            name.as_str(),
            "every event names its type: {text}"
        );
    }
    let start = &events[0].1["message"];
    assert_eq!(start["id"], message["id"]);
    assert_eq!(start["model"], "healthy");
    // Its input tokens were 0; now the prompt's, as count_tokens says.
    let mut prompt = body.clone();
    prompt.as_object_mut().unwrap().remove("max_tokens");
    let (_, _, counted) = send(post(&world, "/v1/messages/count_tokens", None, &prompt)).await;
    assert_eq!(
        start["usage"],
        json!({"input_tokens": counted["input_tokens"], "output_tokens": 0}),
        "message_start has the prompt's tokens: {start} {counted}"
    );
    assert!(counted["input_tokens"].as_u64().unwrap() > 0, "{counted}");
    assert_eq!(events[3].1["delta"]["type"], "text_delta");
    assert_eq!(events[3].1["delta"]["text"], message["content"][0]["text"]);
    assert_eq!(events[5].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[5].1["usage"], message["usage"], "the final usage");
    assert_eq!(
        world.executions(&job_id, "primary"),
        1,
        "streamed or not, one execution"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

async fn refused_requests_are_invalid_request_errors_and_write_nothing(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    let (status, headers, body) =
        send(post(&world, "/v1/messages", None, &message_body("No key."))).await;
    let (status, kind, message) = anthropic_error(status, &body);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.contains("Idempotency-Key"), "{message}");
    assert_eq!(header(&headers, "x-should-retry"), "false");

    let mut cases: Vec<(Value, u16, &str, &str)> = Vec::new();
    let mut no_max = message_body("x");
    no_max.as_object_mut().unwrap().remove("max_tokens");
    cases.push((no_max, 400, "invalid_request_error", "max_tokens"));
    let mut thinking = message_body("x");
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    cases.push((thinking, 400, "invalid_request_error", "thinking"));
    let mut server_tool = message_body("x");
    server_tool["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    cases.push((
        server_tool,
        400,
        "invalid_request_error",
        "web_search_20250305",
    ));
    let mut top_choice = message_body("x");
    top_choice["tool_choice"] = json!({"type": "sometimes"});
    cases.push((top_choice, 400, "invalid_request_error", "tool_choice.type"));
    let mut hot = message_body("x");
    hot["temperature"] = json!(7);
    cases.push((hot, 400, "invalid_request_error", "temperature"));
    let mut empty_block = message_body("x");
    empty_block["messages"] = json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]);
    cases.push((
        empty_block,
        400,
        "invalid_request_error",
        "must be non-empty",
    ));
    for content in [json!(""), json!([])] {
        let mut empty_turn = message_body("x");
        empty_turn["messages"] = json!([
            {"role": "user", "content": content},
            {"role": "assistant", "content": "Sure"},
            {"role": "user", "content": "go on"},
        ]);
        cases.push((
            empty_turn,
            400,
            "invalid_request_error",
            "messages[0].content",
        ));
    }
    // 1.5 is an OpenAI temperature, not an Anthropic one.
    let mut warm = message_body("x");
    warm["temperature"] = json!(1.5);
    cases.push((warm, 400, "invalid_request_error", "between 0 and 1"));
    // A tool's failure is taken, but only as text, as documented.
    let mut image_result = message_body("x");
    image_result["messages"] = json!([
        {"role": "user", "content": "Draw it"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "draw", "input": {}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
            "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
    ]);
    cases.push((
        image_result,
        400,
        "invalid_request_error",
        "messages[2].content[0].content[0].type",
    ));
    let mut odd_flag = message_body("x");
    odd_flag["messages"] = json!([
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "go", "input": {}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes", "content": "no"}
        ]},
    ]);
    cases.push((odd_flag, 400, "invalid_request_error", "is_error"));
    let mut odd_parallel = message_body("x");
    odd_parallel["tools"] = json!([{"name": "go", "input_schema": {"type": "object"}}]);
    odd_parallel["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": "yes"});
    cases.push((
        odd_parallel,
        400,
        "invalid_request_error",
        "disable_parallel_tool_use",
    ));
    let mut stops = message_body("x");
    stops["stop_sequences"] = json!(["a", "b", "c", "d", "e"]);
    cases.push((stops, 400, "invalid_request_error", "stop_sequences"));
    let mut unknown_route = message_body("x");
    unknown_route["model"] = json!("claude-nonexistent");
    cases.push((unknown_route, 404, "not_found_error", "claude-nonexistent"));
    for (i, (body, want_status, want_kind, names)) in cases.into_iter().enumerate() {
        let key = format!("bad-{i}");
        let (status, _, answer) = send(post(&world, "/v1/messages", Some(&key), &body)).await;
        let (status, kind, message) = anthropic_error(status, &answer);
        assert_eq!(
            (status, kind.as_str()),
            (want_status, want_kind),
            "{body}: {message}"
        );
        assert!(message.contains(names), "{message} should name {names}");
    }
    let (status, _, answer) =
        send(post(&world, "/v1/messages", Some("bad-json"), &json!(null)).body("{\"model\":"))
            .await;
    assert_eq!(anthropic_error(status, &answer).0, 400);
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        0,
        "nothing written"
    );
    assert_eq!(world.sim.ledger().total_executions(), 0);
    world.stop().await;
}

async fn a_call_without_credentials_is_an_authentication_error(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    // The message names the header the key came in, as Anthropic's does
    // (it said "send Authorization: Bearer <key>" to an SDK that sends
    // x-api-key).
    let messages = world.client.post(format!("{}/v1/messages", world.address));
    let count = world
        .client
        .post(format!("{}/v1/messages/count_tokens", world.address));
    for (request, said) in [
        (
            messages.try_clone().unwrap(),
            "x-api-key header is required",
        ),
        (
            messages
                .try_clone()
                .unwrap()
                .header("x-api-key", "oj_not-a-key"),
            "invalid x-api-key",
        ),
        (
            messages.try_clone().unwrap().bearer_auth("oj_not-a-key"),
            "invalid bearer token in the Authorization header",
        ),
        (
            count.header("x-api-key", "oj_not-a-key"),
            "invalid x-api-key",
        ),
    ] {
        let (status, headers, body) = send(
            request
                .header("Idempotency-Key", "auth-1")
                .json(&message_body("Hello")),
        )
        .await;
        let (status, kind, message) = anthropic_error(status, &body);
        assert_eq!((status, kind.as_str()), (401, "authentication_error"));
        assert_eq!(message, said);
        assert_eq!(header(&headers, "x-should-retry"), "false");
    }
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);
    world.stop().await;
}

async fn count_tokens_needs_no_key_calls_no_provider_and_names_its_tokenizer(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    let short = json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}]});
    let long = json!({
        "model": "default",
        "system": "You are a careful assistant who answers in full sentences.",
        "messages": [{"role": "user", "content": "Explain the tides, the moon and the sun."}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    });
    let (status, headers, counted) =
        send(post(&world, "/v1/messages/count_tokens", None, &short)).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["tokenizer"], "o200k_base");
    assert_eq!(header(&headers, "x-onejob-tokenizer"), "o200k_base");
    let few = counted["input_tokens"].as_u64().unwrap();
    assert!(few > 0);
    let (_, _, counted) = send(post(&world, "/v1/messages/count_tokens", None, &long)).await;
    let many = counted["input_tokens"].as_u64().unwrap();
    assert!(
        many > few + 20,
        "system, text and tools are counted: {few} vs {many}"
    );
    let (status, _, body) = send(post(
        &world,
        "/v1/messages/count_tokens",
        None,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "Hi"}]}),
    ))
    .await;
    assert_eq!(anthropic_error(status, &body).1, "not_found_error");
    assert_eq!(world.store.count_jobs().await.unwrap(), 0, "no job");
    assert_eq!(world.sim.ledger().total_executions(), 0, "no upstream call");
    world.stop().await;
}

async fn context_length_exceeded_moves_to_a_larger_window_never_back(backend: Backend) {
    let providers = [spec("primary", "context_length"), spec("large", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["large"]), |c| {
        set_window(c, "large", 65_536);
    })
    .await;
    let (status, headers, message) = send(post(
        &world,
        "/v1/messages",
        Some("long-1"),
        &message_body("A long story"),
    ))
    .await;
    assert_eq!(status, 200, "{message}");
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(header(&headers, "x-onejob-provider"), "large");
    assert_eq!(message["model"], "healthy");
    let attempts = world.attempts(&job_id).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["error_kind"], "context_length_exceeded");
    assert_eq!(
        world.deliveries(&job_id, "primary"),
        1,
        "never re-sent to it"
    );
    world.stop().await;
}

async fn context_length_exceeded_with_no_larger_window_is_an_invalid_request_error(
    backend: Backend,
) {
    let world = primary_world(backend, "context_length").await;
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("long-2"),
        &message_body("A long story"),
    ))
    .await;
    let (status, kind, message) = anthropic_error(status, &body);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.starts_with("prompt is too long"), "{message}");
    assert_eq!(header(&headers, "x-should-retry"), "false");
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(world.job(&job_id).await["state"], "failed");
    assert_eq!(world.attempts(&job_id).await.len(), 1);
    world.stop().await;
}

async fn a_content_filter_is_an_invalid_request_error_after_one_attempt(backend: Backend) {
    let providers = [spec("primary", "content_filter"), spec("backup", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["backup"]), |_| {}).await;
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("filter-1"),
        &message_body("Hello"),
    ))
    .await;
    let (status, kind, _) = anthropic_error(status, &body);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(world.attempts(&job_id).await.len(), 1, "one attempt");
    assert_eq!(world.executions(&job_id, "backup"), 0);

    // Streamed, the refusal is an in-band error event of the same type.
    let mut streamed = message_body("Hello again");
    streamed["stream"] = json!(true);
    let response = post(&world, "/v1/messages", Some("filter-2"), &streamed)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let events = events(&text);
    let (name, error) = events.last().unwrap();
    assert_eq!(name, "error", "{text}");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
    assert!(
        !error["error"]["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("replay"),
        "a finished job has nothing to replay: {text}"
    );
    assert!(events.iter().all(|(n, _)| n != "message_stop"), "{text}");
    world.stop().await;
}

/// A stream cut after 32 characters whose fallback cannot continue a
/// prefill: the fallback's restart repeats them (held back), and the client
/// gets one whole message, begun by the cut model, with the restart's usage;
/// a restart that says something else is an `error` event, never
/// `message_stop`.
async fn a_cut_restarted_on_a_fallback_without_prefill_is_one_message_or_an_error_event(
    backend: Backend,
) {
    let providers = [
        spec("cutting", "stream_cut:tokens=2"),
        spec("backup", "healthy"),
        spec("other", "healthy:variant=1"),
    ];
    let world = start_world(backend, &providers, route("cutting", &["backup"]), |c| {
        refuse_prefill(c, "backup");
        refuse_prefill(c, "other");
        c.engine.reconcile_min_age_ms = 10_000;
        c.routes
            .insert("diverging".into(), route("cutting", &["other"]));
    })
    .await;
    // What a healthy simulator answers, asked directly.
    let answer: Value = world
        .client
        .post(format!("{}/v1/chat/completions", world.sim.base_url()))
        .json(&json!({"model": "healthy", "messages": [{"role": "user", "content": "Explain tides"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let whole = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let streamed = |route: &str| {
        json!({"model": route, "max_tokens": 256, "stream": true,
               "messages": [{"role": "user", "content": "Explain tides"}]})
    };
    let response = post(&world, "/v1/messages", Some("cut-1"), &streamed("default"))
        .send()
        .await
        .unwrap();
    let job_id = header(response.headers(), "x-onejob-job-id").to_string();
    let text = response.text().await.unwrap();
    let restarted = events(&text);
    let said: String = restarted
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(said, whole, "one whole message, nothing repeated: {text}");
    assert_eq!(restarted[0].1["message"]["model"], "stream_cut:tokens=2");
    let delta = &restarted
        .iter()
        .find(|(n, _)| n == "message_delta")
        .unwrap()
        .1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn", "{text}");
    assert_eq!(
        delta["usage"]["output_tokens"].as_u64().unwrap(),
        whole.chars().count().div_ceil(4) as u64,
        "the restart's own usage is the whole answer's: {text}"
    );
    assert_eq!(restarted.last().unwrap().0, "message_stop");
    assert_eq!(world.job(&job_id).await["result"], json!(whole));
    assert_eq!(world.executions(&job_id, "backup"), 1);

    let response = post(
        &world,
        "/v1/messages",
        Some("cut-2"),
        &streamed("diverging"),
    )
    .send()
    .await
    .unwrap();
    let text = response.text().await.unwrap();
    let diverged = events(&text);
    let (name, error) = diverged.last().unwrap();
    assert_eq!(name, "error", "{text}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("diverged at char"),
        "{text}"
    );
    assert!(diverged.iter().all(|(n, _)| n != "message_stop"), "{text}");
    world.stop().await;
}

const NATIVE_ANSWER: &str = r#"{"id":"msg_up","type":"message","role":"assistant","model":"claude-test",
 "content":[{"type":"text","text":"Cached."}],
 "stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":2}}"#;

async fn blocks_reach_an_anthropic_provider_natively_with_cache_control_untouched(
    backend: Backend,
) {
    let up = upstream::upstream(upstream::json(200, NATIVE_ANSWER)).await;
    let base_url = up.base_url.clone();
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
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
    let cached = json!({"type": "ephemeral"});
    let body = json!({
        "model": "native",
        "max_tokens": 100,
        "system": "Be brief.",
        "metadata": {"user_id": "u-7"},
        "stop_sequences": ["END"],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "A long document.", "cache_control": cached},
                {"type": "text", "text": " And a question."}
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}
            ]},
            // An empty last assistant turn asks for nothing: Anthropic takes
            // it, and onejob drops it rather than send an empty turn on.
            {"role": "assistant", "content": ""}
        ],
    });
    let (status, headers, message) =
        send(post(&world, "/v1/messages", Some("native-1"), &body)).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(header(&headers, "x-onejob-provider"), "native");
    assert_eq!(message["model"], "claude-test");
    assert_eq!(message["content"][0]["text"], "Cached.");
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-api-key"], upstream::KEY_VALUE);
    let sent = &seen[0].body;
    assert_eq!(sent["model"], "claude-test");
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["max_tokens"], 100);
    assert_eq!(sent["metadata"], json!({"user_id": "u-7"}));
    assert_eq!(sent["stop_sequences"], json!(["END"]));
    assert_eq!(sent["tool_choice"], json!({"type": "auto"}));
    assert_eq!(sent["tools"][0]["input_schema"], json!({"type": "object"}));
    assert_eq!(
        sent["messages"][0]["content"][0],
        json!({"type": "text", "text": "A long document.", "cache_control": cached}),
        "{sent}"
    );
    assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(
        sent["messages"][1]["content"][0]["input"],
        json!({"city": "Paris"})
    );
    assert_eq!(
        sent["messages"][2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"})
    );
    assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
    world.stop().await;
}

const OPENAI_ANSWER: &str = r#"{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"gpt-test",
 "choices":[{"index":0,"message":{"role":"assistant","content":"Noted."},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;

/// A world whose route `default` is the simulator (provider `primary`),
/// `native` a fake Anthropic upstream (`kind = "anthropic"`) and `openai` a
/// fake OpenAI one (`kind = "openai"`), with what each upstream receives.
async fn wired_world(backend: Backend) -> (World, upstream::Upstream, upstream::Upstream) {
    let anthropic = upstream::upstream(upstream::json(200, NATIVE_ANSWER)).await;
    let openai = upstream::upstream(upstream::json(200, OPENAI_ANSWER)).await;
    let (anthropic_url, openai_url) = (anthropic.base_url.clone(), openai.base_url.clone());
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |c| {
            std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
            for (name, kind, url, model, lookup) in [
                ("native", "anthropic", &anthropic_url, "claude-test", ""),
                ("openai", "openai", &openai_url, "gpt-test", "lookup = \"none\"\n"),
            ] {
                let text = format!(
                    "kind = \"{kind}\"\nbase_url = \"{url}\"\nmodel = \"{model}\"\n\
                     api_key_env = \"{}\"\ntokenizer = \"o200k_base\"\ncontext_window = 16384\n{lookup}",
                    upstream::KEY_ENV
                );
                std::fs::write(c.providers_dir.join(format!("{name}.toml")), text).unwrap();
                c.routes.insert(name.into(), route(name, &[]));
            }
        },
    )
    .await;
    (world, anthropic, openai)
}

/// A tool call, and its result: the tool raised (`is_error`), as
/// pydantic-ai sends a `ModelRetry` and the AI SDK a throwing `execute`.
fn failed_tool_body(model: &str, is_error: bool) -> Value {
    let mut result = json!({
        "type": "tool_result", "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "ValueError: no city called Atlantis"}],
    });
    if is_error {
        result["is_error"] = json!(true);
    }
    json!({
        "model": model,
        "max_tokens": 100,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "The weather in Atlantis?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Atlantis"}}
            ]},
            {"role": "user", "content": [result]},
        ],
    })
}

/// A `tool_result` with `is_error: true` was refused, failing the whole
/// run of a pydantic-ai agent or an AI SDK tool loop whose tool raised.
/// It is taken: an Anthropic provider is told the tool failed, an OpenAI
/// one (no such field) gets the text alone, and the flag is part of the
/// job's request, so the same key without it is another request.
async fn a_failed_tool_result_reaches_each_wire_as_it_can_say_it(backend: Backend) {
    let (world, anthropic, openai) = wired_world(backend).await;
    let error_text = "ValueError: no city called Atlantis";
    let sent = on_each_wire(&world, &anthropic, &openai, "failed-tool", |model| {
        failed_tool_body(model, true)
    })
    .await;
    assert_eq!(
        sent.anthropic["messages"][2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": error_text, "is_error": true}]),
        "{}",
        sent.anthropic
    );
    assert_eq!(
        sent.openai["messages"][2],
        json!({"role": "tool", "content": error_text, "tool_call_id": "toolu_1"}),
        "{}",
        sent.openai
    );
    assert_eq!(
        sent.stored["messages"][2],
        json!({"role": "tool", "content": error_text, "tool_call_id": "toolu_1", "is_error": true})
    );
    // The flag is part of the request: the same key without it conflicts.
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("failed-tool-default"),
        &failed_tool_body("default", false),
    ))
    .await;
    let (status, kind, _) = anthropic_error(status, &body);
    assert_eq!((status, kind.as_str()), (409, "invalid_request_error"));
    assert_eq!(header(&headers, "x-should-retry"), "false");
    assert_eq!(
        world.executions(&sent.job_id, "primary"),
        1,
        "never run again"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 3);
    world.stop().await;
}

/// What one request made of `body_for(route)` became on each wire: the
/// bodies the Anthropic and OpenAI fakes received (routes `native` and
/// `openai`), and the job request stored for the simulator's (`default`),
/// which ran it once. Each answered 200 by the provider its route names.
struct OnEachWire {
    anthropic: Value,
    openai: Value,
    stored: Value,
    job_id: String,
}

async fn on_each_wire(
    world: &World,
    anthropic: &upstream::Upstream,
    openai: &upstream::Upstream,
    key: &str,
    body_for: impl Fn(&str) -> Value,
) -> OnEachWire {
    let mut job_id = String::new();
    for route in ["native", "openai", "default"] {
        let idempotency_key = format!("{key}-{route}");
        let (status, headers, message) = send(post(
            world,
            "/v1/messages",
            Some(&idempotency_key),
            &body_for(route),
        ))
        .await;
        assert_eq!(status, 200, "{route}: {message}");
        if route != "default" {
            assert_eq!(header(&headers, "x-onejob-provider"), route);
        }
        job_id = header(&headers, "x-onejob-job-id").to_string();
    }
    assert_eq!(world.executions(&job_id, "primary"), 1);
    let stored = world.stored_job(&job_id).await;
    let (anthropic, openai) = (anthropic.seen(), openai.seen());
    assert_eq!((anthropic.len(), openai.len()), (1, 1));
    OnEachWire {
        anthropic: anthropic[0].body.clone(),
        openai: openai[0].body.clone(),
        stored: serde_json::from_str(&stored.request).unwrap(),
        job_id,
    }
}

/// `tool_choice.disable_parallel_tool_use: true` (the AI SDK's
/// generateObject and streamObject send it) was refused. It is Chat
/// Completions' `parallel_tool_calls: false`: an Anthropic provider gets it
/// back on its tool choice, an OpenAI one as `parallel_tool_calls`.
async fn disable_parallel_tool_use_is_one_tool_call_per_turn_on_every_wire(backend: Backend) {
    let (world, anthropic, openai) = wired_world(backend).await;
    let sent = on_each_wire(&world, &anthropic, &openai, "one-call", |model| {
        json!({
            "model": model,
            "max_tokens": 100,
            "tools": [{"name": "json", "description": "Respond with a JSON object.",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [{"role": "user", "content": "Name a city."}],
        })
    })
    .await;
    assert_eq!(
        sent.anthropic["tool_choice"],
        json!({"type": "any", "disable_parallel_tool_use": true}),
        "{}",
        sent.anthropic
    );
    assert_eq!(
        sent.openai["parallel_tool_calls"],
        json!(false),
        "{}",
        sent.openai
    );
    assert_eq!(sent.openai["tool_choice"], json!("required"));
    assert_eq!(sent.stored["params"]["parallel_tool_calls"], json!(false));
    world.stop().await;
}

/// A job its provider's overload ended (its retries ran out, so it went to
/// review) answered `500 api_error`; the error table says `529
/// overloaded_error`, Anthropic's own for it.
async fn a_job_the_providers_overload_ended_is_an_overloaded_error(backend: Backend) {
    let world = primary_world(backend, "overloaded").await;
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("busy-1"),
        &message_body("Hello"),
    ))
    .await;
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    let attempts = world.attempts(&job_id).await;
    let (status, kind, message) = anthropic_error(status, &body);
    assert_eq!(
        (status, kind.as_str()),
        (529, "overloaded_error"),
        "{message} {attempts:?}"
    );
    // Its retries ran out: the job waits in review, where it may still be
    // settled, so the SDK may ask again (and gets the same job).
    assert_eq!(world.job(&job_id).await["state"], "needs_review");
    assert_eq!(header(&headers, "x-should-retry"), "true");
    assert!(
        attempts.len() > 1 && attempts.iter().all(|a| a["error_kind"] == "overloaded"),
        "{attempts:?}"
    );
    assert_eq!(
        world.executions(&job_id, "primary"),
        0,
        "never run upstream"
    );
    let (status, headers, body) = send(post(
        &world,
        "/v1/messages",
        Some("busy-1"),
        &message_body("Hello"),
    ))
    .await;
    assert_eq!(anthropic_error(status, &body).1, "overloaded_error");
    assert_eq!(header(&headers, "idempotent-replayed"), "true");
    assert_eq!(world.attempts(&job_id).await.len(), attempts.len());
    world.stop().await;
}

/// A job its provider rate-limited until its retries ran out waits in
/// review, where an admin may still settle it, as one overloaded into it
/// does. Its `429 rate_limit_error` said `x-should-retry: false`, so the
/// SDK gave up on a job that may still answer; it now says `true`, as the
/// overloaded one's 529 does, and the SDK's retry is the same job.
async fn a_job_rate_limited_into_review_may_be_asked_again(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "rate_limit:retry_after=0")],
        {
            let mut limited = route("primary", &[]);
            limited.max_attempts = 2;
            limited
        },
        |_| {},
    )
    .await;
    let body = message_body("Hello");
    let (status, headers, answer) =
        send(post(&world, "/v1/messages", Some("limited-1"), &body)).await;
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    let (status, kind, message) = anthropic_error(status, &answer);
    assert_eq!(
        (status, kind.as_str()),
        (429, "rate_limit_error"),
        "{message}"
    );
    assert_eq!(world.job(&job_id).await["state"], "needs_review");
    assert_eq!(header(&headers, "x-should-retry"), "true");
    assert!(message.contains("it may still be settled"), "{message}");
    let attempts = world.attempts(&job_id).await;
    assert!(
        attempts.len() == 2 && attempts.iter().all(|a| a["error_kind"] == "rate_limited"),
        "{attempts:?}"
    );
    let (status, headers, again) =
        send(post(&world, "/v1/messages", Some("limited-1"), &body)).await;
    assert_eq!(anthropic_error(status, &again), (429, kind, message));
    assert_eq!(header(&headers, "idempotent-replayed"), "true");
    assert_eq!(header(&headers, "x-onejob-job-id"), job_id);
    assert_eq!(
        world.attempts(&job_id).await.len(),
        2,
        "the replay ran nothing"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// The `error` event that ends a stream, as Anthropic's error: its type
/// and message.
async fn stream_error(world: &World, key: &str, body: &Value) -> (String, String) {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let response = post(world, "/v1/messages", Some(key), &streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let events = events(&text);
    let (name, error) = events.last().unwrap();
    assert_eq!(name, "error", "{text}");
    assert!(events.iter().all(|(n, _)| n != "message_stop"), "{text}");
    (
        error["error"]["type"].as_str().unwrap().to_string(),
        error["error"]["message"].as_str().unwrap().to_string(),
    )
}

/// A streamed request whose job failed with `context_length_exceeded`
/// ended with `context_length_exceeded: job … is failed: …`, where the
/// answer says `prompt is too long: …`, the text clients (pydantic-ai)
/// classify it by. The stream now says what the answer says.
async fn a_streamed_context_length_exceeded_says_what_the_answer_says(backend: Backend) {
    let world = primary_world(backend, "context_length").await;
    let body = message_body("A long story");
    let (kind, streamed) = stream_error(&world, "long-s", &body).await;
    assert_eq!(kind, "invalid_request_error", "{streamed}");
    assert!(streamed.starts_with("prompt is too long: "), "{streamed}");
    let (status, headers, answer) = send(post(&world, "/v1/messages", Some("long-s"), &body)).await;
    let (status, answered_kind, answered) = anthropic_error(status, &answer);
    assert_eq!(
        (status, answered_kind.as_str()),
        (400, "invalid_request_error")
    );
    assert_eq!(streamed, answered, "the stream says what the answer says");
    // A streamed replay (the stored answer) too.
    assert_eq!(
        stream_error(&world, "long-s", &body).await,
        (answered_kind, answered)
    );
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(world.attempts(&job_id).await.len(), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// A cancelled job, replayed: answered `409 invalid_request_error` "… is
/// cancelled: no result", it streamed an `api_error` "job_cancelled: … no
/// result yet" (a cancelled job never gets a result). The stream now says
/// what the answer says.
async fn a_cancelled_job_streamed_says_what_the_answer_says(backend: Backend) {
    let world = primary_world(backend, "slow_first_byte:ms=5000").await;
    let body = message_body("Hello");
    let (status, headers, _) =
        send(post(&world, "/v1/messages", Some("cancelled-1"), &body).header("Prefer", "wait=0"))
            .await;
    assert_eq!(status, 504);
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    let (status, _) = world
        .post(&world.key, &format!("/v1/jobs/{job_id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 200);

    let (status, headers, answer) =
        send(post(&world, "/v1/messages", Some("cancelled-1"), &body)).await;
    let (status, kind, answered) = anthropic_error(status, &answer);
    assert_eq!((status, kind.as_str()), (409, "invalid_request_error"));
    assert_eq!(answered, format!("job {job_id} is cancelled: no result"));
    assert_eq!(header(&headers, "x-should-retry"), "false");
    assert_eq!(
        stream_error(&world, "cancelled-1", &body).await,
        (kind, answered),
        "the stream says what the answer says"
    );
    assert_eq!(world.job(&job_id).await["state"], "cancelled");
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// `GET /v1/models` answered OpenAI's list (`object`, `created`,
/// `owned_by`) to the Anthropic SDK, which reads Anthropic's Models API
/// there (`type`, `display_name`, `created_at`, pages by `after_id`), and
/// an unknown model as OpenAI's error. Asked with `anthropic-version` (as
/// every Anthropic SDK asks) it now answers in Anthropic's shape; without
/// it, in OpenAI's still.
async fn the_models_api_answers_in_anthropics_shape_when_asked_with_anthropic_version(
    backend: Backend,
) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |c| {
            c.routes.insert("fast".into(), route("primary", &[]));
            c.routes.insert("slow".into(), route("primary", &[]));
        },
    )
    .await;
    let get = |path: &str| {
        world
            .client
            .get(format!("{}{path}", world.address))
            .header("anthropic-version", "2023-06-01")
    };
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };

    let (status, _, page) = send(get("/v1/models").header("x-api-key", &world.key)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(ids(&page), ["default", "fast", "slow"]);
    assert_eq!(
        page["data"][1],
        json!({"type": "model", "id": "fast", "display_name": "fast",
               "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active"})
    );
    assert_eq!(
        (&page["has_more"], &page["first_id"], &page["last_id"]),
        (&json!(false), &json!("default"), &json!("slow"))
    );
    assert!(page.get("object").is_none(), "{page}");

    // Pages, as the SDK's auto-pagination walks them.
    let (_, _, first) = send(get("/v1/models?limit=2").header("x-api-key", &world.key)).await;
    assert_eq!(ids(&first), ["default", "fast"]);
    assert_eq!(
        (&first["has_more"], &first["last_id"]),
        (&json!(true), &json!("fast"))
    );
    let (_, _, next) =
        send(get("/v1/models?limit=2&after_id=fast").header("x-api-key", &world.key)).await;
    assert_eq!(ids(&next), ["slow"]);
    assert_eq!(next["has_more"], false);
    let (_, _, before) =
        send(get("/v1/models?limit=1&before_id=slow").header("x-api-key", &world.key)).await;
    assert_eq!(ids(&before), ["fast"]);
    assert_eq!(
        (&before["has_more"], &before["first_id"]),
        (&json!(true), &json!("fast"))
    );
    let (_, _, retired) =
        send(get("/v1/models?lifecycle[]=retired").header("x-api-key", &world.key)).await;
    assert_eq!(
        retired,
        json!({"data": [], "has_more": false, "first_id": null, "last_id": null})
    );
    let (status, headers, refused) =
        send(get("/v1/models?limit=0").header("x-api-key", &world.key)).await;
    let (status, kind, message) = anthropic_error(status, &refused);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.starts_with("limit: "), "{message}");
    assert_eq!(header(&headers, "x-should-retry"), "false");

    let (status, _, one) = send(get("/v1/models/slow").header("x-api-key", &world.key)).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&one["type"], &one["id"]),
        (&json!("model"), &json!("slow"))
    );
    let (status, headers, missing) =
        send(get("/v1/models/nope").header("x-api-key", &world.key)).await;
    let (status, kind, message) = anthropic_error(status, &missing);
    assert_eq!((status, kind.as_str()), (404, "not_found_error"));
    assert!(message.contains("\"nope\""), "{message}");
    assert_eq!(header(&headers, "x-should-retry"), "false");
    let (status, _, unauthorized) = send(get("/v1/models")).await;
    assert_eq!(
        anthropic_error(status, &unauthorized),
        (
            401,
            "authentication_error".into(),
            "x-api-key header is required".into()
        )
    );

    // Without the header: OpenAI's shape, as before.
    let (status, openai) = world.get(&world.key, "/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["data"][0]["object"], "model");
    let (status, missing) = world.get(&world.key, "/v1/models/nope").await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["code"], "model_not_found");
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);
    world.stop().await;
}

/// A job its provider's overload sent to review answers `529
/// overloaded_error`, but streamed it ended with an `api_error`
/// ("job_needs_review: …"), which the SDK raises as another error. A
/// streamed replay's error is now `overloaded_error` too (and a live
/// stream's: [`a_live_stream_overloaded_into_review_ends_as_its_replay_does`]).
async fn a_job_overloaded_into_review_streamed_is_an_overloaded_error(backend: Backend) {
    let world = primary_world(backend, "overloaded").await;
    let body = message_body("Hello");
    let (status, headers, answer) = send(post(&world, "/v1/messages", Some("busy-s"), &body)).await;
    let (status, kind, _) = anthropic_error(status, &answer);
    assert_eq!((status, kind.as_str()), (529, "overloaded_error"));
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(world.job(&job_id).await["state"], "needs_review");
    let (replayed, message) = stream_error(&world, "busy-s", &body).await;
    assert_eq!(replayed, "overloaded_error", "{message}");
    assert!(
        message.starts_with(&format!("job_needs_review: job {job_id} is needs_review: ")),
        "{message}"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// A job still pending when the wait ends answers `504 timeout_error`
/// ("job … is still pending; replay this request …"); streamed it ended
/// with an `api_error` "job_pending: job … is pending: no result yet". The
/// stream now says what the answer says. (No engine runs the job, so it
/// stays pending.)
async fn a_job_still_pending_streamed_says_what_the_answer_says(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |c| c.engine.enabled = false,
    )
    .await;
    let body = message_body("Hello");
    let (status, headers, answer) =
        send(post(&world, "/v1/messages", Some("pending-1"), &body).header("Prefer", "wait=0"))
            .await;
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    let (status, kind, answered) = anthropic_error(status, &answer);
    assert_eq!((status, kind.as_str()), (504, "timeout_error"));
    assert_eq!(header(&headers, "x-should-retry"), "true");
    assert!(
        answered.starts_with(&format!(
            "job {job_id} is still pending; replay this request"
        )),
        "{answered}"
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let response = post(&world, "/v1/messages", Some("pending-1"), &streamed)
        .header("Prefer", "wait=0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let events = events(&text);
    assert_eq!(events.len(), 1, "{text}");
    let (name, error) = &events[0];
    assert_eq!(name, "error", "{text}");
    assert_eq!(
        (&error["error"]["type"], &error["error"]["message"]),
        (&json!(kind), &json!(answered)),
        "the stream says what the answer says"
    );
    assert_eq!(world.job(&job_id).await["state"], "pending");
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

const CACHED_USAGE: &str = r#"{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":1000,"cache_creation_input_tokens":200}"#;

/// An Anthropic upstream that served most of the prompt from its cache:
/// `input_tokens` 10, `cache_read_input_tokens` 1000,
/// `cache_creation_input_tokens` 200. Whole, and streamed (usage in
/// `message_start`, output tokens in `message_delta`).
fn cached_answers() -> (String, String) {
    let whole = format!(
        r#"{{"id":"msg_up","type":"message","role":"assistant","model":"claude-test",
        "content":[{{"type":"text","text":"Cached."}}],"stop_reason":"end_turn",
        "stop_sequence":null,"usage":{CACHED_USAGE}}}"#
    );
    let start = r#"{"type":"message_start","message":{"id":"msg_up","type":"message","role":"assistant",
        "model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,
        "usage":{"input_tokens":10,"output_tokens":1,"cache_read_input_tokens":1000,"cache_creation_input_tokens":200}}}"#;
    let frames = [
        ("message_start", start.replace('\n', "")),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#
                .to_string(),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Cached."}}"#
                .to_string(),
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#.to_string(),
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}"#
                .to_string(),
        ),
        ("message_stop", r#"{"type":"message_stop"}"#.to_string()),
    ];
    let streamed = frames
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    (whole, streamed)
}

/// Anthropic's prompt-cache tokens were dropped: the Chat door said
/// `prompt_tokens` 10 for a prompt of 1210, the Messages door gave no
/// `cache_read_input_tokens`, and the budget counted 13 tokens. Every door
/// now tells them as its wire does (OpenAI's `prompt_tokens` counts them,
/// with `prompt_tokens_details.cached_tokens`; Anthropic's keeps them beside
/// `input_tokens`), whole and streamed, and the day's usage counts them.
async fn prompt_cache_tokens_reach_every_door_and_the_budget(backend: Backend) {
    let (whole, streamed) = cached_answers();
    let whole_up = upstream::upstream(upstream::json(200, &whole)).await;
    let stream_up = upstream::upstream(upstream::json(200, &streamed)).await;
    let openai_up = upstream::upstream(upstream::json(
        200,
        r#"{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"gpt-test",
        "choices":[{"index":0,"message":{"role":"assistant","content":"Noted."},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":1010,"completion_tokens":2,"total_tokens":1012,
                 "prompt_tokens_details":{"cached_tokens":1000}}}"#,
    ))
    .await;
    let (whole_url, stream_url) = (whole_up.base_url.clone(), stream_up.base_url.clone());
    let openai_url = openai_up.base_url.clone();
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |c| {
            std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
            for (name, kind, url) in [
                ("cached", "anthropic", &whole_url),
                ("cached-stream", "anthropic", &stream_url),
                ("cached-openai", "openai", &openai_url),
            ] {
                let text = format!(
                    "kind = \"{kind}\"\nbase_url = \"{url}\"\nmodel = \"claude-test\"\n\
                     api_key_env = \"{}\"\ntokenizer = \"o200k_base\"\ncontext_window = 16384\n",
                    upstream::KEY_ENV
                );
                std::fs::write(c.providers_dir.join(format!("{name}.toml")), text).unwrap();
                c.routes.insert(name.into(), route(name, &[]));
            }
        },
    )
    .await;
    let chat = |model: &str, stream: bool| {
        let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    let anthropic_usage = json!({"input_tokens": 10, "output_tokens": 3,
        "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200});

    // Chat Completions, whole.
    let response = chat_completion(&world, "cache-chat", &chat("cached", false)).await;
    assert_eq!(response.status(), 200);
    let completion: Value = response.json().await.unwrap();
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 1210, "completion_tokens": 3, "total_tokens": 1213,
               "prompt_tokens_details": {"cached_tokens": 1000}}),
        "{completion}"
    );

    // Chat Completions, streamed: the usage chunk.
    let response = chat_completion(&world, "cache-chat-stream", &chat("cached-stream", true)).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
        .unwrap_or_else(|| panic!("no usage chunk in {text}"));
    assert_eq!(
        usage,
        json!({"prompt_tokens": 1210, "completion_tokens": 3, "total_tokens": 1213,
               "prompt_tokens_details": {"cached_tokens": 1000}}),
        "{text}"
    );

    // Messages, whole and streamed: Anthropic's own fields.
    let mut body = message_body("hi");
    body["model"] = json!("cached");
    let (status, _, message) = send(post(&world, "/v1/messages", Some("cache-msg"), &body)).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["usage"], anthropic_usage, "{message}");
    body["model"] = json!("cached-stream");
    body["stream"] = json!(true);
    let response = post(&world, "/v1/messages", Some("cache-msg-stream"), &body)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let (_, delta) = events(&text)
        .into_iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta in {text}"));
    assert_eq!(delta["usage"], anthropic_usage, "{text}");

    // OpenAI's `cached_tokens` the other way: Anthropic's cache read.
    body["model"] = json!("cached-openai");
    body.as_object_mut().unwrap().remove("stream");
    let (status, _, message) = send(post(&world, "/v1/messages", Some("cache-oa"), &body)).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 10, "output_tokens": 2,
               "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0}),
        "{message}"
    );

    // The budget counts every prompt token: four answers of 1213 tokens
    // and one of 1012.
    let response = world
        .client
        .get(format!("{}/v1/usage", world.address))
        .bearer_auth(&world.key)
        .send()
        .await
        .unwrap();
    let report: Value = response.json().await.unwrap();
    assert_eq!(report["totals"]["tokens"], 4 * 1213 + 1012, "{report}");
    world.stop().await;
}

/// A streamed request whose job's retries ran out on its provider's
/// overload (so it went to review) ended its live stream with an
/// `api_error`, while its replay's stream (and the answer) said
/// `overloaded_error`: the SDK raised an `APIStatusError` the first time
/// and an `OverloadedError` the next, for the same job. The live stream's
/// error now carries the job's last failure as the stored one does, and
/// one mapping types both.
async fn a_live_stream_overloaded_into_review_ends_as_its_replay_does(backend: Backend) {
    let world = primary_world(backend, "overloaded").await;
    let body = message_body("Hello");
    let (live, message) = stream_error(&world, "busy-live", &body).await;
    assert_eq!(live, "overloaded_error", "{message}");
    assert!(message.starts_with("job_needs_review: job "), "{message}");
    let (status, headers, answer) =
        send(post(&world, "/v1/messages", Some("busy-live"), &body)).await;
    let job_id = header(&headers, "x-onejob-job-id").to_string();
    assert_eq!(world.job(&job_id).await["state"], "needs_review");
    let attempts = world.attempts(&job_id).await;
    assert!(
        attempts.len() > 1 && attempts.iter().all(|a| a["error_kind"] == "overloaded"),
        "{attempts:?}"
    );
    let (status, answered, _) = anthropic_error(status, &answer);
    assert_eq!((status, answered.as_str()), (529, "overloaded_error"));
    let (replayed, _) = stream_error(&world, "busy-live", &body).await;
    assert_eq!(
        replayed, live,
        "the replay's stream says what the live one said"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

/// `output_config.format` (Anthropic's structured outputs, what LangChain's
/// `ChatAnthropic.with_structured_output(method="json_schema")` sends) was
/// refused as "not supported by onejob". It is the job's `response_format`
/// now: the answer follows the schema, and the job says what was asked.
/// Its other settings are refused by name, and nothing is written.
async fn structured_output_asked_in_anthropics_words_is_the_jobs_response_format(backend: Backend) {
    let world = primary_world(backend, "healthy").await;
    let schema = json!({"type": "object", "additionalProperties": false,
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]});
    let mut body = message_body("Who is the user?");
    body["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}});
    let response = post(&world, "/v1/messages", None, &body)
        .header("Idempotency-Key", "structured")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let job_id = response.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    let message: Value = response.json().await.unwrap();
    let text = message["content"][0]["text"].as_str().unwrap();
    let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(answer["name"].is_string(), "{answer}");
    assert!(answer["age"].is_i64(), "{answer}");
    let job = world
        .store
        .get_job(&job_id.as_str().into())
        .await
        .unwrap()
        .unwrap();
    let request: Value = serde_json::from_str(&job.request).unwrap();
    assert_eq!(
        request["params"]["response_format"]["json_schema"]["schema"], schema,
        "{request}"
    );

    for (config, field) in [
        (json!({"effort": "high"}), "output_config.effort"),
        (
            json!({"format": {"type": "json_object"}}),
            "output_config.format.type",
        ),
        (
            json!({"format": {"type": "json_schema"}}),
            "output_config.format.schema",
        ),
    ] {
        let mut body = message_body("Who?");
        body["output_config"] = config;
        let response = post(&world, "/v1/messages", None, &body)
            .header("Idempotency-Key", format!("refused-{field}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{field}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(field),
            "{error}"
        );
    }
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        1,
        "refusals wrote nothing"
    );
    world.stop().await;
}

/// `POST /v1/chat/completions` with the world's key and `idempotency_key`.
async fn chat_completion(world: &World, idempotency_key: &str, body: &Value) -> reqwest::Response {
    world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", idempotency_key)
        .json(body)
        .send()
        .await
        .unwrap()
}
