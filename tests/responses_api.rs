//! `/v1/responses` over raw HTTP: what a client sees when a request is
//! refused (built-in tools, a missing or reused key), the 404 that never
//! tells one owner about another's responses, `store: false`, and a
//! streamed failure that ends in `response.failed`, never in
//! `response.completed`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, set_window, start_world, ProviderSpec, World};
use common::Backend;
use onejob::clock::SystemClock;
use onejob::domain::JobId;
use serde_json::{json, Value};

on_both_backends!(
    built_in_tools_are_refused_by_name_and_make_no_job,
    a_key_is_required_and_a_reused_one_is_a_conflict,
    another_owners_response_is_not_found_like_an_unknown_one,
    a_response_not_stored_is_not_shown_but_its_job_is_durable,
    a_streamed_failure_ends_in_response_failed,
    a_job_still_running_or_too_long_is_the_error_a_client_acts_on,
    cancel_delete_and_input_items_answer_in_openai_shapes,
    context_length_exceeded_moves_to_a_larger_window,
    an_item_reference_is_the_item_it_names,
);

fn spec(name: &'static str, model: &'static str) -> ProviderSpec {
    ProviderSpec { name, model }
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn call(
    world: &World,
    method: reqwest::Method,
    path: &str,
    api_key: &str,
    idempotency_key: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    let mut request = world
        .client
        .request(method, format!("{}{path}", world.address))
        .bearer_auth(api_key);
    if let Some(key) = idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Answer {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn create(world: &World, key: Option<&str>, body: &Value) -> Answer {
    call(
        world,
        reqwest::Method::POST,
        "/v1/responses",
        &world.key,
        key,
        Some(body),
    )
    .await
}

/// Every OpenAI error has these four fields.
fn assert_openai_error(answer: &Answer, status: u16, kind: &str, code: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    let error = answer.body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{}", answer.body));
    let mut fields: Vec<&str> = error.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        ["code", "message", "param", "type"],
        "{}",
        answer.body
    );
    assert_eq!(error["type"], kind, "{}", answer.body);
    assert_eq!(error["code"], code, "{}", answer.body);
    assert!(answer.headers.contains_key("x-should-retry"));
}

async fn built_in_tools_are_refused_by_name_and_make_no_job(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |_| {},
    )
    .await;
    for tool in [
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
    ] {
        let body = json!({"model": "default", "input": "Hi.",
                          "tools": [{"type": "function", "name": "f"}, {"type": tool}]});
        let answer = create(&world, Some(&format!("tool-{tool}")), &body).await;
        assert_openai_error(
            &answer,
            422,
            "invalid_request_error",
            "unsupported_parameter",
        );
        assert_eq!(answer.body["error"]["param"], "tools[1].type");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("\"{tool}\"")), "{message}");
    }
    let answer = create(
        &world,
        Some("tool-choice"),
        &json!({"model": "default", "input": "Hi.", "tool_choice": {"type": "web_search_preview"}}),
    )
    .await;
    assert_openai_error(
        &answer,
        422,
        "invalid_request_error",
        "unsupported_parameter",
    );
    assert_eq!(answer.body["error"]["param"], "tool_choice");
    let answer = create(
        &world,
        Some("reasoning-item"),
        &json!({"model": "default", "input": [{"type": "reasoning", "summary": []}]}),
    )
    .await;
    assert_openai_error(
        &answer,
        422,
        "invalid_request_error",
        "unsupported_parameter",
    );
    assert_eq!(answer.body["error"]["param"], "input[0].type");
    for (body, param) in [
        (json!({"model": "default", "input": []}), "input"),
        (
            json!({"model": "default", "input": "Hi.", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": "default", "input": "Hi.", "temperature": 3}),
            "temperature",
        ),
    ] {
        let answer = create(&world, Some("invalid"), &body).await;
        assert_openai_error(&answer, 422, "invalid_request_error", "invalid_request");
        assert_eq!(answer.body["error"]["param"], param, "{}", answer.body);
    }
    let answer = create(
        &world,
        Some("no-route"),
        &json!({"model": "nope", "input": "Hi."}),
    )
    .await;
    assert_openai_error(&answer, 404, "not_found_error", "model_not_found");
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);
    world.stop().await;
}

async fn a_key_is_required_and_a_reused_one_is_a_conflict(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |_| {},
    )
    .await;
    let body = json!({"model": "default", "input": "Once."});
    let answer = create(&world, None, &body).await;
    assert_openai_error(
        &answer,
        400,
        "invalid_request_error",
        "missing_idempotency_key",
    );
    assert_eq!(answer.body["error"]["param"], "Idempotency-Key");
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);

    let first = create(&world, Some("k-1"), &body).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["object"], "response");
    assert_eq!(first.body["status"], "completed");
    let job_id = first.headers["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        first.body["id"],
        format!("resp_{}", job_id.replace('-', ""))
    );
    assert!(first.headers.contains_key("x-onejob-provider"));
    assert!(first.headers.contains_key("x-onejob-attempt"));

    let replay = create(&world, Some("k-1"), &body).await;
    assert_eq!(replay.body, first.body, "a replay is the same Response");
    assert_eq!(replay.headers["idempotent-replayed"], "true");

    let other = create(
        &world,
        Some("k-1"),
        &json!({"model": "default", "input": "Twice."}),
    )
    .await;
    assert_openai_error(&other, 409, "conflict_error", "idempotency_key_reused");
    assert_eq!(other.headers["x-should-retry"], "false");
    assert_eq!(world.executions(&job_id, "primary"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);

    // Calls that make no job need no key.
    let id = first.body["id"].as_str().unwrap();
    let shown = call(
        &world,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(shown.body["output"], first.body["output"]);
    assert_eq!(shown.headers["x-onejob-job-id"], job_id.as_str());
    world.stop().await;
}

async fn another_owners_response_is_not_found_like_an_unknown_one(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |_| {},
    )
    .await;
    let bob = onejob::keys::create_key(world.store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();
    let mine = create(
        &world,
        Some("mine"),
        &json!({"model": "default", "input": "Mine.", "background": true}),
    )
    .await;
    assert_eq!(mine.status, 200, "{}", mine.body);
    let id = mine.body["id"].as_str().unwrap().to_string();
    let unknown = format!("resp_{}", "0".repeat(32));
    for path in ["", "/input_items"] {
        let get = reqwest::Method::GET;
        let theirs = call(
            &world,
            get.clone(),
            &format!("/v1/responses/{id}{path}"),
            &bob,
            None,
            None,
        )
        .await;
        let none = call(
            &world,
            get.clone(),
            &format!("/v1/responses/{unknown}{path}"),
            &bob,
            None,
            None,
        )
        .await;
        assert_openai_error(&theirs, 404, "not_found_error", "response_not_found");
        assert_openai_error(&none, 404, "not_found_error", "response_not_found");
        assert_eq!(
            theirs.body["error"]["message"]
                .as_str()
                .unwrap()
                .replace(&id, "ID"),
            none.body["error"]["message"]
                .as_str()
                .unwrap()
                .replace(&unknown, "ID"),
        );
        let malformed = call(
            &world,
            get,
            &format!("/v1/responses/nope{path}"),
            &bob,
            None,
            None,
        )
        .await;
        assert_openai_error(&malformed, 404, "not_found_error", "response_not_found");
    }
    let cancel = call(
        &world,
        reqwest::Method::POST,
        &format!("/v1/responses/{id}/cancel"),
        &bob,
        None,
        None,
    )
    .await;
    assert_openai_error(&cancel, 404, "not_found_error", "response_not_found");
    let delete = call(
        &world,
        reqwest::Method::DELETE,
        &format!("/v1/responses/{id}"),
        &bob,
        None,
        None,
    )
    .await;
    assert_openai_error(&delete, 404, "not_found_error", "response_not_found");
    let continued = call(
        &world,
        reqwest::Method::POST,
        "/v1/responses",
        &bob,
        Some("bob-continues"),
        Some(&json!({"model": "default", "input": "Go on.", "previous_response_id": id})),
    )
    .await;
    assert_openai_error(&continued, 404, "not_found_error", "response_not_found");
    assert_eq!(continued.body["error"]["param"], "previous_response_id");

    // Bob's calls changed nothing: alice's response runs on and is shown.
    let job_id = mine.headers["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    let (job, _) = world
        .until(&job_id, std::time::Duration::from_secs(20), |j, _| {
            j["state"] == "succeeded"
        })
        .await;
    assert_eq!(job["state"], "succeeded", "bob's cancel cancelled nothing");
    let row = world.stored_job(&job_id).await;
    let events = world
        .store
        .list_events(&JobId::from(&job_id))
        .await
        .unwrap();
    assert!(
        !events.iter().any(|e| e.actor == "bob"),
        "bob left no trace on alice's job: {events:?}"
    );
    assert_eq!(row.owner_id, "alice");
    let shown = call(
        &world,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(shown.body["status"], "completed", "{}", shown.body);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);
    world.stop().await;
}

async fn a_response_not_stored_is_not_shown_but_its_job_is_durable(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |_| {},
    )
    .await;
    let answer = create(
        &world,
        Some("unstored"),
        &json!({"model": "default", "input": "Hi.", "store": false}),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["store"], false);
    let id = answer.body["id"].as_str().unwrap();
    let shown = call(
        &world,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_openai_error(&shown, 404, "not_found_error", "response_not_found");
    let job_id = answer.headers["x-onejob-job-id"].to_str().unwrap();
    let job = world.job(job_id).await;
    assert_eq!(
        job["state"], "succeeded",
        "the job is kept whatever store says"
    );
    let replay = create(
        &world,
        Some("unstored"),
        &json!({"model": "default", "input": "Hi.", "store": false}),
    )
    .await;
    assert_eq!(
        replay.body["output"], answer.body["output"],
        "and replays by key"
    );
    let background = create(
        &world,
        Some("unstored-bg"),
        &json!({"model": "default", "input": "Hi.", "store": false, "background": true}),
    )
    .await;
    assert_openai_error(&background, 422, "invalid_request_error", "invalid_request");
    world.stop().await;
}

async fn a_streamed_failure_ends_in_response_failed(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("filtering", "content_filter")],
        route("filtering", &[]),
        |_| {},
    )
    .await;
    let answer = create(
        &world,
        Some("refused"),
        &json!({"model": "default", "input": "Hi.", "stream": true}),
    )
    .await;
    assert_eq!(answer.status, 200);
    let text = answer.body.as_str().unwrap().to_string();
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{text}");
    assert_eq!(kinds.last(), Some(&"response.failed"), "{text}");
    assert!(!kinds.contains(&"response.completed"), "{text}");
    let last: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .map(|d| serde_json::from_str(d).unwrap())
        .unwrap();
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["output"], json!([]));
    assert!(last["response"]["error"]["message"].is_string(), "{last}");
    // The provider's refusal keeps its code, with nothing about replaying.
    assert_eq!(
        last["response"]["error"]["code"], "content_policy_violation",
        "{last}"
    );
    assert!(
        !last["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("replay"),
        "{last}"
    );
    // Unstreamed, the same job is the error a client acts on.
    let again = create(
        &world,
        Some("refused"),
        &json!({"model": "default", "input": "Hi."}),
    )
    .await;
    assert_openai_error(
        &again,
        400,
        "invalid_request_error",
        "content_policy_violation",
    );
    world.stop().await;
}

async fn a_job_still_running_or_too_long_is_the_error_a_client_acts_on(backend: Backend) {
    let providers = [
        spec("slow", "slow_first_byte:ms=3000"),
        spec("long", "context_length"),
    ];
    let world = start_world(backend, &providers, route("slow", &[]), |c| {
        c.routes.insert("too-long".into(), route("long", &[]));
    })
    .await;
    // Still running after `Prefer: wait=1`: a 504 the SDK retries with the
    // same key, and the Response to poll meanwhile.
    let response = world
        .client
        .post(format!("{}/v1/responses", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "slow-1")
        .header("Prefer", "wait=1")
        .json(&json!({"model": "default", "input": "Take your time."}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    assert_eq!(response.headers()["x-should-retry"], "true");
    let job_id = response.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "job_pending", "{body}");
    let id = format!("resp_{}", job_id.replace('-', ""));
    let shown = call(
        &world,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert!(
        ["queued", "in_progress", "completed"].contains(&shown.body["status"].as_str().unwrap()),
        "{}",
        shown.body
    );
    let replay = create(
        &world,
        Some("slow-1"),
        &json!({"model": "default", "input": "Take your time."}),
    )
    .await;
    assert_eq!(replay.status, 200, "{}", replay.body);
    assert_eq!(replay.body["status"], "completed");
    assert_eq!(replay.body["id"], id.as_str());
    assert_eq!(world.executions(&job_id, "slow"), 1);

    let long = create(
        &world,
        Some("long-1"),
        &json!({"model": "too-long", "input": "Far too long."}),
    )
    .await;
    assert_openai_error(
        &long,
        400,
        "invalid_request_error",
        "context_length_exceeded",
    );
    assert_eq!(long.body["error"]["param"], "input");
    let job_id = long.headers["x-onejob-job-id"].to_str().unwrap();
    let id = format!("resp_{}", job_id.replace('-', ""));
    let shown = call(
        &world,
        reqwest::Method::GET,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(shown.body["status"], "failed", "{}", shown.body);
    assert_eq!(
        shown.body["error"]["code"], "invalid_prompt",
        "{}",
        shown.body
    );
    assert_eq!(shown.body["output"], json!([]));
    world.stop().await;
}

async fn cancel_delete_and_input_items_answer_in_openai_shapes(backend: Backend) {
    let providers = [
        spec("primary", "healthy"),
        spec("slow", "slow_first_byte:ms=3000"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("slow".into(), route("slow", &[]));
    })
    .await;
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;
    let input = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One."},
        {"type": "message", "role": "assistant", "content": "Two."},
        {"role": "user", "content": [{"type": "input_text", "text": "Three."}]},
    ]);
    let done = create(
        &world,
        Some("items"),
        &json!({"model": "default", "input": input}),
    )
    .await;
    assert_eq!(done.body["status"], "completed", "{}", done.body);
    let id = done.body["id"].as_str().unwrap().to_string();

    // input_items: newest first, paged by limit and after.
    let page = call(
        &world,
        get.clone(),
        &format!("/v1/responses/{id}/input_items?limit=3"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body["object"], "list");
    assert_eq!(page.body["has_more"], true);
    let texts = |body: &Value| -> Vec<String> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["content"][0]["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(&page.body), ["Three.", "Two.", "One."]);
    assert_eq!(page.body["data"][1]["content"][0]["type"], "output_text");
    assert_eq!(page.body["data"][2]["content"][0]["type"], "input_text");
    assert_eq!(page.body["first_id"], page.body["data"][0]["id"]);
    let last = page.body["last_id"].as_str().unwrap();
    let rest = call(
        &world,
        get.clone(),
        &format!("/v1/responses/{id}/input_items?limit=3&after={last}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(texts(&rest.body), ["Be brief."]);
    assert_eq!(rest.body["has_more"], false);
    let bad = call(
        &world,
        get.clone(),
        &format!("/v1/responses/{id}/input_items?limit=many"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_openai_error(&bad, 422, "invalid_request_error", "invalid_request");

    // A completed response cannot be cancelled; a running one can, twice.
    let refused = call(
        &world,
        post.clone(),
        &format!("/v1/responses/{id}/cancel"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_openai_error(
        &refused,
        400,
        "invalid_request_error",
        "response_not_cancellable",
    );
    let running = create(
        &world,
        Some("to-cancel"),
        &json!({"model": "slow", "input": "Hi.", "background": true}),
    )
    .await;
    let running_id = running.body["id"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let cancelled = call(
            &world,
            post.clone(),
            &format!("/v1/responses/{running_id}/cancel"),
            &world.key,
            None,
            None,
        )
        .await;
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);
        assert_eq!(cancelled.body["status"], "cancelled");
        assert_eq!(cancelled.body["output"], json!([]));
    }
    let job_id = running.headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.job(job_id).await["state"], "cancelled");

    // Delete: the OpenAI answer, then a 404 everywhere; the job stays.
    let deleted = call(
        &world,
        reqwest::Method::DELETE,
        &format!("/v1/responses/{id}"),
        &world.key,
        None,
        None,
    )
    .await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "response", "deleted": true})
    );
    for path in ["", "/input_items"] {
        let gone = call(
            &world,
            get.clone(),
            &format!("/v1/responses/{id}{path}"),
            &world.key,
            None,
            None,
        )
        .await;
        assert_openai_error(&gone, 404, "not_found_error", "response_not_found");
    }
    let job_id = done.headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.job(job_id).await["state"], "succeeded");
    let events = world.store.list_events(&JobId::from(job_id)).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.kind == "response_deleted" && e.actor == "alice"));
    world.stop().await;
}

async fn context_length_exceeded_moves_to_a_larger_window(backend: Backend) {
    let providers = [spec("primary", "context_length"), spec("large", "healthy")];
    let world = start_world(backend, &providers, route("primary", &["large"]), |c| {
        set_window(c, "large", 65_536);
    })
    .await;
    let answer = create(
        &world,
        Some("long"),
        &json!({"model": "default", "input": "A long story"}),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["status"], "completed");
    assert_eq!(answer.body["model"], "healthy", "the model that answered");
    assert_eq!(answer.headers["x-onejob-provider"], "large");
    let job_id = answer.headers["x-onejob-job-id"].to_str().unwrap();
    let attempts = world.attempts(job_id).await;
    assert_eq!(
        attempts[0]["error_kind"], "context_length_exceeded",
        "{attempts:?}"
    );
    assert_eq!(
        world.deliveries(job_id, "primary"),
        1,
        "never re-sent to it"
    );
    world.stop().await;
}

/// The AI SDK's default OpenAI provider sends a stored answer back as an
/// `item_reference` to its id on the conversation's next turn: the
/// reference is the item it names, of the caller's own responses only.
async fn an_item_reference_is_the_item_it_names(backend: Backend) {
    let world = start_world(
        backend,
        &[spec("primary", "healthy")],
        route("primary", &[]),
        |_| {},
    )
    .await;
    let first = create(
        &world,
        Some("turn-1"),
        &json!({"model": "default", "input": "What is two and two?"}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let message = &first.body["output"][0];
    assert_eq!(message["type"], "message", "{}", first.body);
    let message_id = message["id"].as_str().unwrap().to_string();
    let said = message["content"][0]["text"].as_str().unwrap().to_string();
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}]);
    let asked = create(
        &world,
        Some("turn-tool"),
        &json!({"model": "default", "input": "Weather in Paris?", "tools": tools,
                "tool_choice": "required"}),
    )
    .await;
    assert_eq!(asked.status, 200, "{}", asked.body);
    let tool_call = asked.body["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "function_call")
        .unwrap_or_else(|| panic!("{}", asked.body))
        .clone();

    let next = json!({"model": "default", "tools": tools, "input": [
        {"role": "user", "content": "What is two and two?"},
        {"type": "item_reference", "id": message_id},
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "item_reference", "id": tool_call["id"]},
        {"type": "function_call_output", "call_id": tool_call["call_id"], "output": "18 C"},
    ]});
    let mut next = next;
    next["parallel_tool_calls"] = json!(false);
    let second = create(&world, Some("turn-2"), &next).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.body["parallel_tool_calls"], false, "{}", second.body);
    let job_id = second.headers["x-onejob-job-id"].to_str().unwrap();
    let job = world.stored_job(job_id).await;
    let request: Value = serde_json::from_str(&job.request).unwrap();
    let turns = request["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 5, "{request}");
    assert_eq!(turns[1], json!({"role": "assistant", "content": said}));
    assert_eq!(turns[3]["role"], "assistant");
    assert_eq!(turns[3]["tool_calls"][0]["id"], tool_call["call_id"]);
    assert_eq!(turns[3]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(turns[4]["tool_call_id"], tool_call["call_id"]);
    assert_eq!(request["params"]["parallel_tool_calls"], false);
    // input_items lists the items referred to, as they are.
    let listed = call_input_items(&world, &second.body["id"]).await;
    assert_eq!(listed["data"][1]["id"], message_id.as_str(), "{listed}");
    assert_eq!(listed["data"][1]["content"][0]["text"], said.as_str());
    assert_eq!(listed["data"][3]["type"], "function_call");
    // A retry is the same job.
    let again = create(&world, Some("turn-2"), &next).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["id"], second.body["id"]);

    // Another owner's item, an unknown one and one onejob never made are
    // not found, and make no job.
    let jobs = world.store.count_jobs().await.unwrap();
    let bob = onejob::keys::create_key(world.store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();
    let unknown = format!("msg_{}", "0".repeat(32));
    for (who, id) in [
        (bob.as_str(), message_id.as_str()),
        (world.key.as_str(), unknown.as_str()),
        (world.key.as_str(), "msg_abc"),
    ] {
        let body = json!({"model": "default", "input": [
            {"role": "user", "content": "Hi"},
            {"type": "item_reference", "id": id},
        ]});
        let answer = call(
            &world,
            reqwest::Method::POST,
            "/v1/responses",
            who,
            Some(&format!("ref-{id}")),
            Some(&body),
        )
        .await;
        assert_openai_error(&answer, 404, "not_found_error", "item_not_found");
        assert_eq!(answer.body["error"]["param"], "input[1].id");
        assert!(answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(id));
    }
    assert_eq!(world.store.count_jobs().await.unwrap(), jobs);
    world.stop().await;
}

async fn call_input_items(world: &World, id: &Value) -> Value {
    let path = format!(
        "/v1/responses/{}/input_items?order=asc",
        id.as_str().unwrap()
    );
    let listed = call(world, reqwest::Method::GET, &path, &world.key, None, None).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    listed.body
}
