//! The official `anthropic` Python SDK, unchanged, against onejob's
//! `/v1/messages`: the simulator and a server on real sockets, the SDK in a
//! subprocess (`tests/python/anthropic_cases.py`). Each case's observations
//! are checked against the job rows and the simulator's ledger. Skips loudly
//! without `ONEJOB_TEST_PYTHON` (set by `.ci/run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::{cases_of, python};
use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    the_official_anthropic_sdk_works_unchanged,
    the_anthropic_sdk_streams_through_absorbed_faults,
);

fn spec(name: &'static str, model: &'static str) -> ProviderSpec {
    ProviderSpec { name, model }
}

/// What a healthy simulator answers to `text` with these `max_tokens`, asked directly.
async fn healthy_answer(world: &World, text: &str) -> String {
    let answer: Value = world
        .client
        .post(format!("{}/v1/chat/completions", world.sim.base_url()))
        .json(&json!({"model": "healthy", "max_tokens": 256,
                      "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn request_of(world: &World, job_id: &str) -> Value {
    let job = world.stored_job(job_id).await;
    serde_json::from_str(&job.request).unwrap()
}

async fn the_official_anthropic_sdk_works_unchanged(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let providers = [
        spec("primary", "healthy:latency=5"),
        spec("filtering", "content_filter"),
        spec("long", "context_length"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("filter".into(), route("filtering", &[]));
        c.routes.insert("too-long".into(), route("long", &[]));
    })
    .await;
    let [plain, system, twice, streamed, events, tools, counted, refusals, models] = cases_of(
        "anthropic_cases.py",
        &python,
        &world.address,
        &world.key,
        [
            "plain",
            "system_blocks",
            "same_key_twice",
            "stream_helper",
            "stream_events",
            "tool_round_trip",
            "count_tokens",
            "refusals",
            "models",
        ],
    )
    .await;

    let job_id = plain["job_id"].as_str().unwrap();
    assert_eq!(plain["provider"], "primary");
    assert_eq!(
        plain["model"], "healthy:latency=5",
        "the model that answered"
    );
    assert_eq!(plain["id"], format!("msg_{}", job_id.replace('-', "")));
    let job = world.job(job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], plain["text"],
        "the SDK got the stored result"
    );
    assert_eq!(world.attempts(job_id).await[0]["id"], plain["attempt"]);
    assert_eq!(world.executions(job_id, "primary"), 1);
    let request = request_of(&world, job_id).await;
    assert_eq!(
        request["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(request["params"]["temperature"], 0.0);
    assert_eq!(request["params"]["user"], "user-7");

    let request = request_of(&world, system["job_id"].as_str().unwrap()).await;
    assert_eq!(
        request["messages"][0],
        json!({"role": "system", "content": "Answer in one word."}),
        "system blocks are the system text"
    );

    let job_id = twice["job_id"].as_str().unwrap();
    assert_eq!(
        world.deliveries(job_id, "primary"),
        1,
        "the second call was answered from the job, not sent again"
    );

    let job_id = streamed["job_id"].as_str().unwrap();
    assert_eq!(streamed["model"], "healthy:latency=5");
    let job = world.job(job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], streamed["text"],
        "the streamed text is the stored one"
    );
    assert_eq!(world.executions(job_id, "primary"), 1);
    let usage = world.attempts(job_id).await[0]["usage"].clone();
    assert_eq!(
        streamed["usage"],
        json!([usage["prompt_tokens"], usage["completion_tokens"]]),
        "the final message's usage is the attempt's"
    );

    assert_eq!(
        events["kinds"],
        json!([
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ])
    );

    assert_eq!(tools["tool"], "get_weather");
    let first = tools["job_ids"][0].as_str().unwrap();
    let stored = world.job(first).await;
    assert_eq!(
        stored["result"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        world.executions(first, "primary"),
        1,
        "the streamed replay ran nothing"
    );
    let second = request_of(&world, tools["job_ids"][1].as_str().unwrap()).await;
    let turns = second["messages"].as_array().unwrap();
    assert_eq!(turns[1]["role"], "assistant");
    assert_eq!(turns[1]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(turns[2]["role"], "tool");
    assert_eq!(turns[2]["tool_call_id"], turns[1]["tool_calls"][0]["id"]);
    assert!(turns[2].get("is_error").is_none(), "{}", turns[2]);
    // The tool's failure, as the SDK sent it, is the job's request.
    let failed = request_of(&world, tools["job_ids"][2].as_str().unwrap()).await;
    assert_eq!(
        failed["messages"][2],
        json!({"role": "tool", "tool_call_id": turns[2]["tool_call_id"],
               "content": "ValueError: the weather service is down", "is_error": true})
    );

    assert_eq!(counted["tokenizer"], "o200k_base");
    assert!(counted["input_tokens"].as_u64().unwrap() > 0);

    let streamed_too_long = refusals["too-long-streamed"].clone();
    assert_eq!(streamed_too_long[0], "invalid_request_error");
    assert!(
        streamed_too_long[1]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: "),
        "streamed, the SDK sees what it sees unstreamed: {streamed_too_long}"
    );
    let mut refusals = refusals;
    refusals
        .as_object_mut()
        .unwrap()
        .remove("too-long-streamed");
    assert_eq!(
        refusals,
        json!({
            "filter": [400, "BadRequestError", "invalid_request_error"],
            "too-long": [400, "BadRequestError", "invalid_request_error"],
            "no-credentials": [401, "AuthenticationError", "authentication_error"],
        })
    );
    // The routes, as the SDK's Models API reads them (`GET /v1/models`
    // answered it OpenAI's list, and the SDK found no `display_name`).
    let epoch = "1970-01-01T00:00:00+00:00";
    assert_eq!(
        models["listed"],
        json!([
            ["model", "default", "default", epoch, "active"],
            ["model", "filter", "filter", epoch, "active"],
            ["model", "too-long", "too-long", epoch, "active"],
        ])
    );
    assert_eq!(
        models["walked"],
        json!(["default", "filter", "too-long"]),
        "a page at a time"
    );
    assert_eq!(models["first_page"], json!([["default"], true, "default"]));
    assert_eq!(models["one"], json!(["model", "filter", "filter"]));
    assert_eq!(models["missing"], json!([404, "not_found_error"]));
    // plain, system, twice, stream, events, three tool turns, the filtered
    // and the too-long prompts (the second streamed); counting, the
    // refused key and the models made none.
    assert_eq!(world.store.count_jobs().await.unwrap(), 11);
    world.stop().await;
}

async fn the_anthropic_sdk_streams_through_absorbed_faults(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let providers = [
        spec("primary", "healthy"),
        spec("backup", "healthy"),
        spec("resetting", "drop_response"),
        spec("down", "fail:503"),
        spec("slow", "slow_first_byte:ms=5000"),
        spec("cutting", "stream_cut:tokens=2"),
        spec("cutting-too", "stream_cut:tokens=2"),
        spec("no-prefill", "no_prefill"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        // The reconciler asks about a cut attempt only after the
        // continuation has had its chance (see tests/openai_stream.rs).
        c.engine.reconcile_min_age_ms = 10_000;
        c.routes
            .insert("reset".into(), route("resetting", &["backup"]));
        c.routes
            .insert("unavailable".into(), route("down", &["backup"]));
        let mut slow = route("slow", &["backup"]);
        slow.silence_ms = 300;
        c.routes.insert("slow".into(), slow);
        c.routes.insert("cut".into(), route("cutting", &["backup"]));
        c.routes.insert(
            "cut-no-prefill".into(),
            route("cutting-too", &["no-prefill"]),
        );
    })
    .await;
    let [reset, unavailable, slow, cut, cut_np] = cases_of(
        "anthropic_cases.py",
        &python,
        &world.address,
        &world.key,
        [
            "reset_before_headers",
            "unavailable_503",
            "slow_first_token",
            "cut_with_prefill_fallback",
            "cut_without_prefill_fallback",
        ],
    )
    .await;
    let whole = healthy_answer(&world, "Explain tides").await;

    for (case, first) in [
        (&reset, "resetting"),
        (&unavailable, "down"),
        (&slow, "slow"),
        (&cut, "cutting"),
    ] {
        let job_id = case["job_id"].as_str().unwrap();
        assert_eq!(case["text"], whole.as_str(), "{first}: one whole answer");
        let attempts = world.attempts(job_id).await;
        assert_eq!(attempts[0]["provider"], first, "{first}: {attempts:?}");
        let winner = attempts
            .iter()
            .find(|a| a["state"] == "succeeded")
            .unwrap_or_else(|| panic!("{first}: no winner in {attempts:?}"));
        assert_eq!(winner["provider"], "backup", "{first}: {attempts:?}");
        assert_eq!(world.executions(job_id, "backup"), 1, "{first}");
        let job = world.job(job_id).await;
        assert_eq!(job["state"], "succeeded", "{first}");
        assert_eq!(job["result"], whole.as_str(), "{first}");
    }
    assert_eq!(reset["provider"], "backup");
    assert_eq!(slow["provider"], "backup", "the hedge owns the stream");
    assert_eq!(slow["model"], "healthy");
    assert_eq!(
        cut["provider"], "cutting",
        "the stream began on the cut provider"
    );
    assert_eq!(
        cut["model"], "stream_cut:tokens=2",
        "the model that began the answer"
    );
    let cut_attempts = world.attempts(cut["job_id"].as_str().unwrap()).await;
    assert_eq!(cut_attempts[0]["error_kind"], "stream_cut");

    // Without a fallback that continues a prefill: never `end_turn` on a
    // truncated text — whole, or an error event.
    let partial = cut_np["text"].as_str().unwrap();
    if cut_np["stop_reason"] == "end_turn" {
        assert_eq!(partial, whole, "ended whole");
    } else {
        assert_eq!(cut_np["stop_reason"], Value::Null, "{cut_np}");
        assert_eq!(cut_np["error"], "api_error", "{cut_np}");
        assert!(
            cut_np["message"].as_str().unwrap().contains("stream_cut"),
            "{cut_np}"
        );
        assert!(
            whole.starts_with(partial) && partial.len() < whole.len(),
            "{cut_np}"
        );
    }
    world.stop().await;
}
