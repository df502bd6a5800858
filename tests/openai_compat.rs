//! `POST /v1/chat/completions`: OpenAI's shape, onejob's idempotency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod upstream;

use common::world::{distrust_keys, route, serve, set_window, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    a_completion_is_one_job_however_often_it_is_sent,
    the_answer_names_the_model_and_attempt_that_answered,
    provider_refusals_keep_their_code_in_openais_error_shape,
    a_job_in_review_tells_the_client_it_may_still_answer,
    an_unknown_attempt_is_waited_out_where_the_client_can_only_take_an_answer,
    tool_definitions_count_toward_a_context_window,
    what_onejob_cannot_honour_is_refused_naming_the_field,
    tool_calls_make_a_round_trip,
    a_json_schema_answer_is_validated_and_a_broken_one_never_returned,
    keyless_calls_get_a_made_key_when_idempotency_is_optional,
    image_parts_go_only_to_providers_that_accept_images,
    stream_is_not_part_of_the_fingerprint,
    what_mainstream_clients_send_reaches_an_openai_provider,
    answer_changing_openai_fields_skip_providers_on_other_wires,
    an_unknown_path_answers_in_the_callers_error_shape,
    keyless_calls_are_keyed_by_their_body_in_fingerprint_mode,
    a_fingerprint_key_names_its_job_for_one_window,
    a_fingerprint_key_finds_its_job_while_it_runs,
    a_provider_that_refuses_a_field_that_changes_the_answer_is_skipped,
    a_refused_key_is_told_by_the_header_it_came_in,
    stream_options_without_a_stream_is_refused_as_openai_refuses_it,
    usage_past_u32_is_kept_whole_from_the_provider_to_the_client,
    a_temperature_above_one_skips_providers_on_anthropics_wire,
    a_json_object_job_skips_providers_on_anthropics_wire,
);

async fn complete(
    world: &World,
    key: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .json(body);
    if let Some(k) = key {
        request = request.header("Idempotency-Key", k);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.json().await.unwrap())
}

async fn a_completion_is_one_job_however_often_it_is_sent(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=30",
        },
        ProviderSpec {
            name: "refuser",
            model: "reject",
        },
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("refused".into(), route("refuser", &[]));
    })
    .await;
    let body = json!({
        "model": "default",
        "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        "temperature": 0,
        "max_completion_tokens": 64,
        "user": "ignored-by-onejob"
    });
    let (status, headers, first) = complete(&world, Some("chat-1"), &body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    let content = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty());
    assert!(
        first["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{first}"
    );
    let job_id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
    assert_eq!(first["id"], format!("chatcmpl-{job_id}"));

    let (status, headers, again) = complete(&world, Some("chat-1"), &body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        again["choices"], first["choices"],
        "the same completion, not a second one"
    );
    assert_eq!(world.executions(&job_id, "primary"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);

    let (status, _, err) = complete(&world, None, &body).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (400, Some("missing_idempotency_key"))
    );
    let mut other_route = body.clone();
    other_route["model"] = json!("gpt-nonexistent");
    let (status, _, err) = complete(&world, Some("chat-3"), &other_route).await;
    assert_eq!(
        (
            status,
            err["error"]["code"].as_str(),
            err["error"]["param"].as_str()
        ),
        (404, Some("model_not_found"), Some("model"))
    );
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        1,
        "refused requests wrote nothing"
    );

    let mut refused = body.clone();
    refused["model"] = json!("refused");
    let (status, headers, err) = complete(&world, Some("chat-4"), &refused).await;
    assert_eq!(
        (
            status,
            err["error"]["code"].as_str(),
            err["error"]["type"].as_str()
        ),
        (400, Some("bad_request"), Some("invalid_request_error")),
        "the provider's refusal, in OpenAI's error shape: {err}"
    );
    assert!(err["error"].as_object().unwrap().contains_key("param"));
    assert_eq!(headers["x-should-retry"], "false");
    world.stop().await;
}

async fn the_answer_names_the_model_and_attempt_that_answered(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "fail:503",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy:latency=5",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.same_provider_retries = 0;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}],
                      "stop": "END", "seed": 7, "user": "u-1",
                      "presence_penalty": 0.5, "frequency_penalty": -0.5});
    let (status, headers, answer) = complete(&world, Some("named-1"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["model"], "healthy:latency=5",
        "the fallback's model answered"
    );
    assert_eq!(headers["x-onejob-provider"], "fallback");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    let attempts = world.attempts(job_id).await;
    let winner = attempts.iter().find(|a| a["state"] == "succeeded").unwrap();
    assert_eq!(headers["x-onejob-attempt"], winner["id"].as_str().unwrap());
    // The sampling options were carried into the job, not dropped.
    let job = world.stored_job(job_id).await;
    let request: Value = serde_json::from_str(&job.request).unwrap();
    assert_eq!(
        request["params"],
        json!({"stop": ["END"], "seed": 7, "user": "u-1",
               "presence_penalty": 0.5, "frequency_penalty": -0.5})
    );

    let (status, models) = world.get(&world.key, "/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(
        models["data"],
        json!([{"id": "default", "object": "model", "created": 0, "owned_by": "onejob"}])
    );
    let (status, missing) = world.get(&world.key, "/v1/models/nope").await;
    assert_eq!(
        (status, missing["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let response = world
        .client
        .get(format!("{}/v1/models", world.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["x-should-retry"], "false");
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"]["type"], "authentication_error");
    world.stop().await;
}

async fn provider_refusals_keep_their_code_in_openais_error_shape(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "long",
            model: "context_length",
        },
        ProviderSpec {
            name: "filtered",
            model: "content_filter",
        },
        ProviderSpec {
            name: "limited",
            model: "rate_limit:retry_after=0",
        },
    ];
    let world = start_world(backend, &providers, route("long", &[]), |c| {
        c.routes.insert("filtered".into(), route("filtered", &[]));
        let mut limited = route("limited", &[]);
        limited.max_attempts = 2;
        c.routes.insert("limited".into(), limited);
    })
    .await;
    for (model, status, code) in [
        ("default", 400, "context_length_exceeded"),
        ("filtered", 400, "content_policy_violation"),
        ("limited", 429, "rate_limit_exceeded"),
    ] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let (got, headers, err) = complete(&world, Some(&format!("refused-{model}")), &body).await;
        assert_eq!(
            (got, err["error"]["code"].as_str()),
            (status, Some(code)),
            "{model}: {err}"
        );
        let error = err["error"].as_object().unwrap();
        for field in ["message", "type", "param", "code"] {
            assert!(
                error.contains_key(field),
                "{model}: {field} missing in {err}"
            );
        }
        let job_id = headers["x-onejob-job-id"].to_str().unwrap();
        let state = world.job(job_id).await["state"].clone();
        // A failed job answers every replay the same. The rate-limited one
        // ran out of retries into review, where an admin may still settle
        // it: like every job in review it may be asked again (it said
        // `false`, and a client that believed it and asked again under a
        // new key paid twice).
        let (want_state, retry) = match model {
            "limited" => ("needs_review", "true"),
            _ => ("failed", "false"),
        };
        assert_eq!(state, want_state, "{model}");
        assert_eq!(headers["x-should-retry"], retry, "{model}: {err}");
    }
    // No provider's window holds the prompt and max_tokens: the job fails
    // before any attempt, and the client hears it as OpenAI would say it
    // (a 400 the SDK does not retry), not as a 502 it retries twice.
    let body = json!({"model": "filtered", "max_tokens": 1_000_000,
                      "messages": [{"role": "user", "content": "hi"}]});
    let mut job_id = String::new();
    for _ in 0..2 {
        let (got, headers, err) = complete(&world, Some("too-big"), &body).await;
        job_id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
        assert_eq!(
            (got, err["error"]["code"].as_str()),
            (400, Some("context_length_exceeded")),
            "{err}"
        );
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert_eq!(headers["x-should-retry"], "false");
    }
    assert_eq!(
        world.executions(&job_id, "filtered"),
        0,
        "no provider was asked"
    );
    world.stop().await;
}

/// A job in review is not finished: its provider's record of an attempt
/// or an admin may still settle it with an answer, which the same request
/// then gets. So its 502 says `x-should-retry: true` (it said `false`, "a
/// replay answers the same", and a client that believed it and asked
/// again under a new key paid twice).
/// An attempt whose answer was lost is unknown until the reconciler asks
/// the provider. The jobs API answers at that point (its caller reads
/// `blocked_on`); a chat client can only take an answer or an error, so
/// its door holds on, and the answer the reconciler finds is what it
/// gets. So does a client of a server that runs no engine: it waits for
/// the job another server runs.
async fn an_unknown_attempt_is_waited_out_where_the_client_can_only_take_an_answer(
    backend: Backend,
) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "drop_response",
        },
        ProviderSpec {
            name: "backup",
            model: "healthy",
        },
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        // Blocked on the unknown attempt, not re-sent under its key.
        distrust_keys(c, "primary");
        // Asked about only once the first answer was due.
        c.engine.reconcile_min_age_ms = 300;
        c.routes.insert("ok".into(), route("backup", &[]));
    })
    .await;
    let ask = |text: &str| json!({"messages": [{"role": "user", "content": text}]});
    let (status, job) = world.submit("jobs-api", &ask("dropped"), Some(10)).await;
    assert_eq!(
        (status, job["state"].as_str(), job["blocked_on"].as_str()),
        (201, Some("running"), Some("unknown_attempt")),
        "{job}"
    );

    let body =
        json!({"model": "default", "messages": [{"role": "user", "content": "dropped too"}]});
    let (status, headers, answer) = complete(&world, Some("chat"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["choices"][0]["message"]["content"].is_string());
    let id = headers["x-onejob-job-id"].to_str().unwrap();
    let attempts = world.attempts(id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["state"], "succeeded", "{attempts:?}");
    // Its error says why it was unknown before it was found executed.
    assert!(attempts[0]["error_kind"].is_string(), "{attempts:?}");

    // A server without an engine, on the same database.
    let mut config = world.config().clone();
    config.engine.enabled = false;
    let (other, stop, task) = serve(config, world.db.store().await).await;
    let answer = world
        .client
        .post(format!("{other}/v1/chat/completions"))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "elsewhere")
        .json(&json!({"model": "ok", "messages": [{"role": "user", "content": "run elsewhere"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let job = world
        .client
        .post(format!("{other}/v1/jobs"))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "elsewhere-job")
        .header("Prefer", "wait=10")
        .json(
            &json!({"route": "ok", "messages": [{"role": "user", "content": "run elsewhere too"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(job.status(), 201);
    let job: Value = job.json().await.unwrap();
    assert_eq!(job["state"], "succeeded", "{job}");
    // Each job ran once upstream (the first still waits for its settling).
    assert_eq!(world.sim.ledger().total_executions(), 4);
    stop.send(()).unwrap();
    task.await.unwrap();
    world.stop().await;
}

/// A provider reads the tool definitions with the prompt: a window that
/// the messages fit but the tools do not is too small, and the job goes
/// to a provider with a larger one without calling the small one.
async fn tool_definitions_count_toward_a_context_window(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "small",
            model: "healthy",
        },
        ProviderSpec {
            name: "large",
            model: "healthy",
        },
    ];
    let world = start_world(backend, &providers, route("small", &["large"]), |c| {
        set_window(c, "small", 1_000);
    })
    .await;
    let long = "Looks the weather up in one city, by its name. ".repeat(120);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": long, "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body = json!({"model": "default", "max_tokens": 100, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, headers, answer) = complete(&world, Some("many-tools"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "large");
    let id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(
        world.deliveries(id, "small"),
        0,
        "the small window was not tried"
    );
    // Without the tools the same messages fit the small window.
    let plain = json!({"model": "default", "max_tokens": 100,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, headers, answer) = complete(&world, Some("no-tools"), &plain).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "small");
    world.stop().await;
}

async fn a_job_in_review_tells_the_client_it_may_still_answer(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "fail:500",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 1;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, err) = complete(&world, Some("in-review"), &body).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (502, Some("job_needs_review")),
        "{err}"
    );
    assert_eq!(headers["x-should-retry"], "true");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replay this request with the same Idempotency-Key"),
        "{err}"
    );
    let id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
    let (status, answer) = world
        .post(
            &world.admin_key,
            &format!("/v1/admin/jobs/{id}/resolve"),
            &json!({"action": "complete", "result": "answered by hand", "reason": "support ticket"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, headers, answer) = complete(&world, Some("in-review"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "answered by hand"
    );
    assert_eq!(headers["x-onejob-job-id"].to_str().unwrap(), id);
    world.stop().await;
}

async fn what_onejob_cannot_honour_is_refused_naming_the_field(backend: Backend) {
    let world = primary_world(backend).await;
    let base = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    for (extra, param) in [
        (json!({"n": 2}), "n"),
        (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
        (json!({"parallel_tool_calls": "no"}), "parallel_tool_calls"),
        (json!({"logprobs": true}), "logprobs"),
        (
            json!({"messages": [{"role": "user", "content": "hi", "name": 7}]}),
            "messages[0].name",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"stream": "yes"}), "stream"),
        (json!({"stream_options": 5}), "stream_options"),
        (
            json!({"stream": true, "stream_options": {"include_usage": "yes"}}),
            "stream_options.include_usage",
        ),
        (
            json!({"stream": true, "stream_options": {"foo": 1}}),
            "stream_options.foo",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
    ] {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, headers, err) = complete(&world, Some(&format!("no-{param}")), &body).await;
        assert_eq!(
            (status, err["error"]["param"].as_str()),
            (422, Some(param)),
            "{err}"
        );
        assert!(
            err["error"]["message"].as_str().unwrap().contains(param),
            "{err}"
        );
        assert_eq!(headers["x-should-retry"], "false");
    }
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        0,
        "nothing was written"
    );
    world.stop().await;
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": false}}}])
}

async fn tool_calls_make_a_round_trip(backend: Backend) {
    let world = primary_world(backend).await;
    let ask = json!({"model": "default", "tools": weather_tool(), "tool_choice": "auto",
                     "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, _, first) = complete(&world, Some("tool-1"), &ask).await;
    assert_eq!(status, 200, "{first}");
    let choice = &first["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");

    let answer = json!({"model": "default", "tools": weather_tool(),
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     choice["message"].clone(),
                     {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 18}"}]});
    let (status, _, second) = complete(&world, Some("tool-2"), &answer).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["choices"][0]["finish_reason"], "stop");
    assert!(!second["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    world.stop().await;
}

async fn a_json_schema_answer_is_validated_and_a_broken_one_never_returned(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "ignore_system",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.same_provider_retries = 0;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let schema = json!({"type": "object", "properties": {"label": {"type": "string", "enum": ["bug", "question"]},
                        "score": {"type": "integer"}}, "required": ["label", "score"], "additionalProperties": false});
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "classify: it crashes"}],
                      "response_format": {"type": "json_schema", "json_schema": {"name": "triage", "schema": schema, "strict": true}}});
    let (status, headers, answer) = complete(&world, Some("schema-1"), &body).await;
    assert_eq!(status, 200, "{answer}");
    let content: Value =
        serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(
        ["bug", "question"].contains(&content["label"].as_str().unwrap()),
        "{content}"
    );
    assert!(content["score"].is_i64(), "{content}");
    assert_eq!(headers["x-onejob-provider"], "fallback");
    let attempts = world
        .attempts(headers["x-onejob-job-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (
            attempts[0]["provider"].as_str(),
            attempts[0]["error_kind"].as_str()
        ),
        (Some("primary"), Some("contract_violation")),
        "prose that breaks the schema is a failed attempt, never the result: {attempts:?}"
    );

    let json_object = json!({"model": "default", "messages": [{"role": "user", "content": "as JSON please"}],
                             "response_format": {"type": "json_object"}});
    let (status, _, answer) = complete(&world, Some("object-1"), &json_object).await;
    assert_eq!(status, 200, "{answer}");
    let content: Value =
        serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(content.is_object());
    world.stop().await;
}

async fn keyless_calls_get_a_made_key_when_idempotency_is_optional(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.idempotency = onejob::config::IdempotencyMode::Optional;
    })
    .await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, first) = complete(&world, None, &body).await;
    assert_eq!(status, 200, "{first}");
    let made = headers["idempotency-key"].to_str().unwrap().to_string();
    assert!(made.starts_with("onejob-made-"), "{made}");
    let (_, headers2, _) = complete(&world, None, &body).await;
    assert_ne!(
        headers2["idempotency-key"],
        made.as_str(),
        "each keyless call is its own job"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 2);
    // The made key replays like any other.
    let (status, again_headers, again) = complete(&world, Some(&made), &body).await;
    assert_eq!(status, 200);
    assert_eq!(again_headers["idempotent-replayed"], "true");
    assert_eq!(again["choices"], first["choices"]);
    assert!(
        !again_headers.contains_key("idempotency-key"),
        "a client key is not echoed"
    );
    world.stop().await;
}

async fn stream_is_not_part_of_the_fingerprint(backend: Backend) {
    // The job request a completion makes never holds stream or
    // stream_options, so a replay may ask either way.
    let plain = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let mut streamed = plain.clone();
    streamed["stream_options"] = json!({"include_usage": true});
    streamed["stream"] = json!(true);
    let world = primary_world(backend).await;
    let (status, h1, _) = complete(&world, Some("fp-1"), &plain).await;
    assert_eq!(status, 200);
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "fp-1")
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "not a 409: the same intent");
    assert_eq!(h1["x-onejob-job-id"], response.headers()["x-onejob-job-id"]);
    assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    world.stop().await;
}

async fn image_parts_go_only_to_providers_that_accept_images(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "text-only",
            model: "healthy",
        },
        ProviderSpec {
            name: "vision",
            model: "healthy",
        },
    ];
    let world = start_world(backend, &providers, route("text-only", &["vision"]), |c| {
        let path = c.providers_dir.join("text-only.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(path, format!("accepts_images = false\n{text}")).unwrap();
    })
    .await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let (status, headers, answer) = complete(&world, Some("image-1"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "vision");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(
        world.deliveries(job_id, "text-only"),
        0,
        "never sent where images are not accepted"
    );
    let job = world.stored_job(job_id).await;
    let request: Value = serde_json::from_str(&job.request).unwrap();
    assert_eq!(
        request["messages"][0]["parts"][1]["type"], "image_url",
        "the part is kept"
    );
    assert_eq!(
        request["messages"][0]["content"],
        "What is in this picture?"
    );
    // Text-only content is not kept as parts: the same intent as a string.
    let text_parts = json!({"model": "default", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}]});
    let (status, h1, _) = complete(&world, Some("image-2"), &text_parts).await;
    assert_eq!(status, 200);
    let plain = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let (status, h2, _) = complete(&world, Some("image-2"), &plain).await;
    assert_eq!(status, 200);
    assert_eq!(h1["x-onejob-job-id"], h2["x-onejob-job-id"]);
    world.stop().await;
}

const UPSTREAM_ANSWER: &str = r#"{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"gpt-test",
 "choices":[{"index":0,"message":{"role":"assistant","content":"Bonjour."},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;

/// Provider `name` of a world becomes `kind = "openai"` at `base_url`.
fn point_at_openai(config: &onejob::config::Config, name: &str, base_url: &str) {
    std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
    let text = format!(
        "kind = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"gpt-test\"\napi_key_env = \"{}\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 16384\nlookup = \"none\"\n",
        upstream::KEY_ENV
    );
    std::fs::write(config.providers_dir.join(format!("{name}.toml")), text).unwrap();
}

/// langchain's `with_structured_output(method="function_calling")` sends
/// `parallel_tool_calls: false`; instructor's re-ask and langchain's named
/// messages send a message `name`; newer SDKs send the rest. Each reaches
/// an OpenAI provider as the client wrote it.
async fn what_mainstream_clients_send_reaches_an_openai_provider(backend: Backend) {
    let up = upstream::upstream(upstream::json(200, UPSTREAM_ANSWER)).await;
    let world = openai_upstream_world(backend, &up.base_url).await;
    let body = json!({"model": "default", "tools": weather_tool(), "parallel_tool_calls": false,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Say hello in French.", "name": "ada"}],
        "metadata": {"ticket": "T-1"}, "store": false, "service_tier": "flex",
        "prompt_cache_key": "greeting", "safety_identifier": "user-7",
        "reasoning_effort": "low", "verbosity": "low"});
    let (status, headers, answer) = complete(&world, Some("fields-1"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "Bonjour.");
    assert_eq!(headers["x-onejob-provider"], "primary");
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "one upstream request");
    let sent = &seen[0].body;
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["messages"][1]["name"], "ada", "{sent}");
    for (field, value) in [
        ("metadata", json!({"ticket": "T-1"})),
        ("store", json!(false)),
        ("service_tier", json!("flex")),
        ("prompt_cache_key", json!("greeting")),
        ("safety_identifier", json!("user-7")),
        ("reasoning_effort", json!("low")),
        ("verbosity", json!("low")),
    ] {
        assert_eq!(sent[field], value, "{field}: {sent}");
    }
    // The same body again is the same job: nothing more upstream.
    let (status, again, _) = complete(&world, Some("fields-1"), &body).await;
    assert_eq!(status, 200);
    assert_eq!(again["x-onejob-job-id"], headers["x-onejob-job-id"]);
    assert_eq!(up.seen().len(), 1);
    world.stop().await;
}

/// One provider, `primary`, of `kind = "openai"` pointed at `base_url` (a
/// fake upstream), on the default route.
async fn openai_upstream_world(backend: Backend, base_url: &str) -> World {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    start_world(backend, &providers, route("primary", &[]), |c| {
        point_at_openai(c, "primary", base_url)
    })
    .await
}

/// One provider, `primary` on the simulator's healthy model, on the
/// default route.
async fn primary_world(backend: Backend) -> World {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    start_world(backend, &providers, route("primary", &[]), |_| {}).await
}

/// A route whose primary `claude` speaks Anthropic's wire (the simulator
/// speaks it too, at /v1/messages) and whose fallback `gpt` speaks
/// OpenAI's; `tune` adds to the config.
async fn claude_then_gpt(
    backend: Backend,
    tune: impl FnOnce(&mut onejob::config::Config),
) -> World {
    let providers = [
        ProviderSpec {
            name: "claude",
            model: "healthy",
        },
        ProviderSpec {
            name: "gpt",
            model: "healthy",
        },
    ];
    start_world(backend, &providers, route("claude", &["gpt"]), |c| {
        std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
        let path = c.providers_dir.join("claude.toml");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("kind = \"sim\"", "kind = \"anthropic\"")
            .replace("lookup = \"sim_ledger\"\n", "");
        let key = format!("api_key_env = \"{}\"\n", upstream::KEY_ENV);
        std::fs::write(path, format!("{key}{text}")).unwrap();
        tune(c);
    })
    .await
}

/// `reasoning_effort` changes the answer and only OpenAI's wire takes it:
/// a route whose primary speaks Anthropic's wire runs the job on the
/// fallback that does, never on the primary without it.
async fn answer_changing_openai_fields_skip_providers_on_other_wires(backend: Backend) {
    let world = claude_then_gpt(backend, |_| {}).await;
    let body = json!({"model": "default", "reasoning_effort": "high",
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, answer) = complete(&world, Some("effort-1"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "gpt");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.deliveries(job_id, "claude"), 0);
    // Without it the primary takes the job.
    let plain = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, _) = complete(&world, Some("effort-2"), &plain).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-onejob-provider"], "claude");
    world.stop().await;
}

/// `response_format: json_object` went to a `kind = "anthropic"` provider
/// with nothing to say it (Anthropic's wire has no such mode): it answered
/// prose, each attempt failed the job's JSON check and was paid for, and
/// the client got a 502. Such a provider is skipped for the job now; the
/// fallback answers with a JSON object.
async fn a_json_object_job_skips_providers_on_anthropics_wire(backend: Backend) {
    let world = claude_then_gpt(backend, |_| {}).await;
    let body = json!({"model": "default", "response_format": {"type": "json_object"},
                      "messages": [{"role": "user", "content": "Give me a JSON object"}]});
    let (status, headers, answer) = complete(&world, Some("json-object"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "gpt");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.deliveries(job_id, "claude"), 0);
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(content).is_ok_and(|v| v.is_object()),
        "{content}"
    );
    world.stop().await;
}

/// An SDK pointed at a path onejob does not serve reads a 404 it can parse:
/// OpenAI's shape, or Anthropic's for a caller sending `anthropic-version`.
async fn an_unknown_path_answers_in_the_callers_error_shape(backend: Backend) {
    let world = primary_world(backend).await;
    let url = format!("{}/v1/no/such/endpoint", world.address);
    let response = world
        .client
        .post(&url)
        .bearer_auth(&world.key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert!(body["error"].get("param").is_some(), "{body}");
    let response = world
        .client
        .post(&url)
        .header("x-api-key", &world.key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);
    world.stop().await;
}

/// `idempotency = "fingerprint"`: an unmodified SDK (no key) keeps retry
/// protection. Its blind retry of the same body is the same job, run once
/// upstream, streamed or not; the next step of an agent loop (a longer
/// conversation) is a new job; the Anthropic door keys the same way.
async fn keyless_calls_are_keyed_by_their_body_in_fingerprint_mode(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.idempotency = onejob::config::IdempotencyMode::Fingerprint;
    })
    .await;
    let step1 =
        json!({"model": "default", "messages": [{"role": "user", "content": "Plan a trip"}]});
    let (status, headers, first) = complete(&world, None, &step1).await;
    assert_eq!(status, 200, "{first}");
    let key = headers["idempotency-key"].to_str().unwrap().to_string();
    assert!(key.starts_with("onejob-fp-"), "{key}");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
    // The SDK's retry: same body, no key.
    let (status, again, second) = complete(&world, None, &step1).await;
    assert_eq!(status, 200);
    assert_eq!(again["x-onejob-job-id"], job_id.as_str());
    assert_eq!(again["idempotent-replayed"], "true");
    assert_eq!(second["choices"], first["choices"]);
    // Streamed, the same intent: the same job.
    let mut streamed = step1.clone();
    streamed["stream"] = json!(true);
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-onejob-job-id"], job_id.as_str());
    let text = response.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(world.executions(&job_id, "primary"), 1, "run once upstream");
    // The loop's next step is another body: a new job.
    let mut step2 = step1.clone();
    step2["messages"] = json!([{"role": "user", "content": "Plan a trip"},
        first["choices"][0]["message"].clone(),
        {"role": "user", "content": "Make it shorter"}]);
    let (status, next, _) = complete(&world, None, &step2).await;
    assert_eq!(status, 200);
    assert_ne!(next["x-onejob-job-id"], job_id.as_str());
    assert_ne!(next["idempotency-key"], key.as_str());
    // The echoed key replays like a client's own.
    let (_, replay, _) = complete(&world, Some(&key), &step1).await;
    assert_eq!(replay["x-onejob-job-id"], job_id.as_str());
    // Another door, another body shape: keyed the same way, by its job body.
    let message = |text: &str| {
        json!({"model": "default", "max_tokens": 64,
               "messages": [{"role": "user", "content": text}]})
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let response = world
            .client
            .post(format!("{}/v1/messages", world.address))
            .header("x-api-key", &world.key)
            .header("anthropic-version", "2023-06-01")
            .json(&message("Name a colour"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        ids.push(response.headers()["x-onejob-job-id"].clone());
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(world.store.count_jobs().await.unwrap(), 3);
    world.stop().await;
}

/// A fingerprint key names its job for one window after the job was made:
/// with a 1 ms window, the same body a request later is a new job.
async fn a_fingerprint_key_names_its_job_for_one_window(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.idempotency = onejob::config::IdempotencyMode::Fingerprint;
        c.fingerprint_window = std::time::Duration::from_millis(1);
    })
    .await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    let (_, first, _) = complete(&world, None, &body).await;
    let (_, second, _) = complete(&world, None, &body).await;
    assert_ne!(first["x-onejob-job-id"], second["x-onejob-job-id"]);
    assert_eq!(world.store.count_jobs().await.unwrap(), 2);
    world.stop().await;
}

/// A keyless request's job that runs longer than a window is still the
/// job of an SDK's retry of it, however many windows later: before, the
/// retry after the window made a second job and a second charge. Once the
/// job has finished and is older than a window, the same body is a new
/// intent again. The job is aged in the database (created five windows
/// ago, under that window's key) instead of waiting.
async fn a_fingerprint_key_finds_its_job_while_it_runs(backend: Backend) {
    // Running for 5 s: the checks below take milliseconds, and the server
    // stops (draining its jobs) soon after.
    let providers = [ProviderSpec {
        name: "primary",
        model: "slow_first_byte:ms=5000",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.idempotency = onejob::config::IdempotencyMode::Fingerprint;
        c.fingerprint_window = std::time::Duration::from_secs(1);
    })
    .await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "long"}]});
    let keyless = || {
        world
            .client
            .post(format!("{}/v1/chat/completions", world.address))
            .bearer_auth(&world.key)
            .header("Prefer", "wait=0")
            .json(&body)
            .send()
    };
    let first = keyless().await.unwrap();
    assert_eq!(first.status(), 504);
    let running: onejob::domain::JobId =
        first.headers()["x-onejob-job-id"].to_str().unwrap().into();
    let job = world.store.get_job(&running).await.unwrap().unwrap();
    let (prefix, bucket) = job.idempotency_key.rsplit_once('-').unwrap();
    let aged_key = format!("{prefix}-{}", bucket.parse::<i64>().unwrap() - 5);
    let sql = format!(
        "UPDATE jobs SET created_at = created_at - 5000, idempotency_key = '{aged_key}' \
         WHERE id = '{running}'"
    );
    assert_eq!(world.db.execute(&sql).await, 1);

    let retried = keyless().await.unwrap();
    assert_eq!(retried.status(), 504);
    assert_eq!(
        retried.headers()["x-onejob-job-id"].to_str().unwrap(),
        running.as_str(),
        "the retry of a running job is that job"
    );
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);

    // Finished, and older than a window: the same body is a new job.
    let cancel = |id: String| {
        world
            .client
            .post(format!("{}/v1/jobs/{id}/cancel", world.address))
            .bearer_auth(&world.key)
            .send()
    };
    assert_eq!(cancel(running.to_string()).await.unwrap().status(), 200);
    let cancelled = world.store.get_job(&running).await.unwrap().unwrap();
    assert!(cancelled.state.is_final());
    let again = keyless().await.unwrap();
    let new_id = again.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_ne!(new_id, running.as_str());
    assert_eq!(world.store.count_jobs().await.unwrap(), 2);
    world.stop().await;
}

/// `refuses = ["seed"]` in a provider's file: a job that sets `seed` is
/// never sent there (leaving it out would change the answer); a job
/// without it is.
async fn a_provider_that_refuses_a_field_that_changes_the_answer_is_skipped(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "strict",
            model: "healthy",
        },
        ProviderSpec {
            name: "other",
            model: "healthy",
        },
    ];
    let world = start_world(backend, &providers, route("strict", &["other"]), |c| {
        let path = c.providers_dir.join("strict.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(path, format!("refuses = [\"seed\", \"user\"]\n{text}")).unwrap();
    })
    .await;
    let seeded = json!({"model": "default", "seed": 7, "user": "u-1",
                        "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, answer) = complete(&world, Some("refuses-1"), &seeded).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "other");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.deliveries(job_id, "strict"), 0);
    // `user` does not change the answer: left out, and the job runs there.
    let unseeded = json!({"model": "default", "user": "u-1",
                          "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, _) = complete(&world, Some("refuses-2"), &unseeded).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-onejob-provider"], "strict");
    world.stop().await;
}

/// A refused key at the doors in OpenAI's (and onejob's) shape was told
/// "send Authorization: Bearer <key>" even when the caller had sent its
/// key as `x-api-key`, which onejob reads: the caller looked for a header
/// problem it did not have. The message now names the header the key came
/// in, as the Messages door's does; no key at all still says how to send
/// one.
async fn a_refused_key_is_told_by_the_header_it_came_in(backend: Backend) {
    let world = primary_world(backend).await;
    let chat = json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}]});
    let responses = json!({"model": "default", "input": "Hi"});
    let job = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let by_header = [
        (
            "x-api-key",
            "invalid API key in the x-api-key header (unknown, revoked or expired)",
        ),
        (
            "authorization",
            "invalid API key in the Authorization header (unknown, revoked or expired)",
        ),
        ("", "missing API key; send Authorization: Bearer <key>"),
    ];
    for (path, body) in [
        ("/v1/chat/completions", &chat),
        ("/v1/responses", &responses),
        ("/v1/jobs", &job),
    ] {
        for (header, said) in by_header {
            let mut request = world
                .client
                .post(format!("{}{path}", world.address))
                .header("Idempotency-Key", "auth-1")
                .json(body);
            request = match header {
                "x-api-key" => request.header("x-api-key", "oj_not-a-key"),
                "authorization" => request.bearer_auth("oj_not-a-key"),
                _ => request,
            };
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{path} {header}");
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["error"]["message"], said, "{path} {header}: {error}");
            assert_eq!(error["error"]["code"], "unauthorized", "{path}");
            if path != "/v1/jobs" {
                assert_eq!(error["error"]["type"], "authentication_error", "{path}");
            }
        }
    }
    assert_eq!(world.store.count_jobs().await.unwrap(), 0);
    world.stop().await;
}

/// `stream_options` on a request that does not stream was taken silently
/// and answered unstreamed; OpenAI refuses it (`400
/// invalid_request_error`, `param: "stream_options"`), and a client
/// written against OpenAI learns of its mistake only there. onejob now
/// refuses it the same way, before any job is made; `null` is no option.
async fn stream_options_without_a_stream_is_refused_as_openai_refuses_it(backend: Backend) {
    let world = primary_world(backend).await;
    let base = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
    for (i, extra) in [
        json!({"stream": false, "stream_options": {"include_usage": true}}),
        json!({"stream_options": {"include_usage": true}}),
        json!({"stream": null, "stream_options": {}}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, headers, err) = complete(&world, Some(&format!("opts-{i}")), &body).await;
        assert_eq!(status, 400, "{extra}: {err}");
        assert_eq!(
            err["error"],
            json!({
                "message": "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "type": "invalid_request_error",
                "param": "stream_options",
                "code": "invalid_request",
            }),
            "{extra}"
        );
        assert_eq!(headers["x-should-retry"], "false");
    }
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        0,
        "nothing written"
    );
    // Absent or null, with or without a stream, it is no option at all.
    let mut body = base.clone();
    body["stream_options"] = Value::Null;
    let (status, _, answer) = complete(&world, Some("opts-null"), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    world.stop().await;
}

/// A provider's usage counts were held as u32: one reporting more than
/// 4,294,967,295 tokens was answered (and stored, and charged) as exactly
/// 4,294,967,295, and a replay could not read its stored usage back. The
/// store keeps BIGINTs and the answers u64s: the counts are now u64 end to
/// end, whole in the answer, the attempt, the usage report and a replay's
/// stream.
async fn usage_past_u32_is_kept_whole_from_the_provider_to_the_client(backend: Backend) {
    let answer = r#"{"id":"chatcmpl-big","object":"chat.completion","created":1,"model":"gpt-test",
 "choices":[{"index":0,"message":{"role":"assistant","content":"Long."},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":5000000000,"completion_tokens":4300000001,"total_tokens":9300000001}}"#;
    let up = upstream::upstream(upstream::json(200, answer)).await;
    let world = openai_upstream_world(backend, &up.base_url).await;
    let body = json!({"model": "default", "messages": [{"role": "user", "content": "Go on."}]});
    let (status, headers, completion) = complete(&world, Some("big-1"), &body).await;
    assert_eq!(status, 200, "{completion}");
    let (prompt, output, total) = (5_000_000_000_u64, 4_300_000_001_u64, 9_300_000_001_u64);
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": total})
    );
    let job_id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
    let attempts = world.attempts(&job_id).await;
    assert_eq!(
        attempts[0]["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": output}),
        "{attempts:?}"
    );
    let (status, usage) = world.get(&world.key, "/v1/usage").await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(usage["totals"]["tokens"], total, "{usage}");
    // A streamed replay reads the stored usage back.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "big-1")
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let usage_chunk: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|chunk| chunk["usage"].is_object())
        .unwrap_or_else(|| panic!("no usage chunk in {text}"));
    assert_eq!(usage_chunk["usage"]["total_tokens"], total, "{text}");
    assert_eq!(up.seen().len(), 1, "the replay ran nothing upstream");
    world.stop().await;
}

/// `temperature: 1.7` reached a `kind = "anthropic"` provider as it was:
/// Anthropic takes 0 to 1, so the real API answers 400 and the job failed
/// as `bad_request` instead of going to a fallback that can honour it. Such
/// a provider is now skipped for the job; 1 and below still go there; a
/// route with nothing else refuses the request naming the field, and
/// nothing is sent.
async fn a_temperature_above_one_skips_providers_on_anthropics_wire(backend: Backend) {
    let world = claude_then_gpt(backend, |c| {
        c.routes.insert("claude-only".into(), route("claude", &[]));
    })
    .await;
    let hot = json!({"model": "default", "temperature": 1.7,
                     "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, answer) = complete(&world, Some("hot-1"), &hot).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-onejob-provider"], "gpt");
    let job_id = headers["x-onejob-job-id"].to_str().unwrap();
    assert_eq!(world.deliveries(job_id, "claude"), 0);

    let mild = json!({"model": "default", "temperature": 1,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, _) = complete(&world, Some("hot-2"), &mild).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-onejob-provider"], "claude");

    let mut alone = hot.clone();
    alone["model"] = json!("claude-only");
    let (status, headers, err) = complete(&world, Some("hot-3"), &alone).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{err}"
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temperature"),
        "{err}"
    );
    assert_eq!(headers["x-should-retry"], "false");
    world.stop().await;
}
