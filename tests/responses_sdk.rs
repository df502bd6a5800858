//! The official `openai` Python SDK's `client.responses`, unchanged,
//! against onejob's `/v1/responses`: the simulator and a server on real
//! sockets, the SDK in a subprocess (`tests/python/responses_cases.py`).
//! Each case's observations are checked against the job rows and the
//! simulator's ledger. Skips loudly without `ONEJOB_TEST_PYTHON`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::{Process, ServeConfig};
use common::python::{cases_of, cases_with, python};
use common::world::{provider_dir, route, start_world, ProviderSpec, World};
use common::{Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::domain::JobId;
use onejob::domain::{AttemptState, JobState};
use onejob::providers::stable_key;
use onejob::sim::SimServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

on_both_backends!(
    the_official_sdk_speaks_responses_unchanged,
    a_background_response_survives_a_kill_9_of_its_server,
    a_cut_or_refused_stream_never_completes_on_a_truncated_answer,
);

fn spec(name: &'static str, model: &'static str) -> ProviderSpec {
    ProviderSpec { name, model }
}

async fn request_of(world: &World, job_id: &str) -> Value {
    let job = world.stored_job(job_id).await;
    serde_json::from_str(&job.request).unwrap()
}

const TEXT_EVENTS: [&str; 9] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];

async fn the_official_sdk_speaks_responses_unchanged(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let providers = [
        spec("primary", "healthy:latency=5"),
        spec("slow", "slow_first_byte:ms=3000"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("slow".into(), route("slow", &[]));
    })
    .await;
    let other_key = onejob::keys::create_key(world.store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();
    let [plain, twice, streamed, events, tools, schema, previous, background, by_id, cancel, items, refusals] =
        cases_with(
            "responses_cases.py",
            &python,
            &world.address,
            &world.key,
            &[("ONEJOB_OTHER_API_KEY", &other_key)],
            [
                "plain",
                "same_key_twice",
                "stream_helper",
                "stream_events",
                "function_round_trip",
                "json_schema",
                "previous_response",
                "background",
                "background_streamed_by_id",
                "cancel",
                "items_and_delete",
                "refusals",
            ],
        )
        .await;

    // A plain call: the job's id, result, model and usage.
    let job_id = plain["job_id"].as_str().unwrap();
    assert_eq!(plain["id"], format!("resp_{}", job_id.replace('-', "")));
    assert_eq!(plain["provider"], "primary");
    assert_eq!(
        plain["model"], "healthy:latency=5",
        "the model that answered"
    );
    let job = world.job(job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], plain["text"],
        "the SDK got the stored result"
    );
    let attempts = world.attempts(job_id).await;
    assert_eq!(attempts[0]["id"], plain["attempt"]);
    assert_eq!(
        plain["usage"],
        json!([
            attempts[0]["usage"]["prompt_tokens"],
            attempts[0]["usage"]["completion_tokens"]
        ])
    );
    assert_eq!(world.executions(job_id, "primary"), 1);
    let request = request_of(&world, job_id).await;
    assert_eq!(
        request["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    );
    assert_eq!(request["params"]["temperature"], 0.0);
    assert_eq!(request["params"]["max_tokens"], 64);

    // The same key twice: one upstream execution, the same response id.
    let job_id = twice["job_id"].as_str().unwrap();
    assert_eq!(
        world.deliveries(job_id, "primary"),
        1,
        "the replay and the conflict were answered from the job, not sent again"
    );

    assert_eq!(streamed["kinds"], json!(TEXT_EVENTS));
    assert_eq!(streamed["model"], "healthy:latency=5");
    let job_id = uuid_of(&streamed["id"]);
    let job = world.job(&job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], streamed["text"],
        "the streamed text is the stored one"
    );
    assert_eq!(world.executions(&job_id, "primary"), 1);
    let usage = world.attempts(&job_id).await[0]["usage"].clone();
    assert_eq!(
        streamed["usage"],
        json!([usage["prompt_tokens"], usage["completion_tokens"]])
    );

    assert_eq!(events["kinds"], json!(TEXT_EVENTS));
    assert_eq!(uuid_of(&events["id"]), events["job_id"].as_str().unwrap());

    // Function calls: asked, replayed streamed (nothing ran again), answered.
    let first = tools["job_ids"][0].as_str().unwrap();
    let stored = world.job(first).await;
    let call = &stored["result"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["id"], tools["call_id"]);
    assert_eq!(
        world.executions(first, "primary"),
        1,
        "the streamed replay ran nothing"
    );
    assert_eq!(
        tools["kinds"],
        json!([
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ])
    );
    let second = request_of(&world, tools["job_ids"][1].as_str().unwrap()).await;
    let turns = second["messages"].as_array().unwrap();
    assert_eq!(turns[0]["role"], "user");
    assert_eq!(turns[1]["role"], "assistant");
    assert_eq!(turns[1]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(turns[1]["tool_calls"][0]["id"], tools["call_id"]);
    assert_eq!(turns[2]["role"], "tool");
    assert_eq!(turns[2]["tool_call_id"], tools["call_id"]);
    assert_eq!(
        second["params"]["tools"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(second["params"]["tools"][0]["function"]["strict"], true);
    let third = request_of(&world, tools["job_ids"][2].as_str().unwrap()).await;
    assert_eq!(
        third["messages"], second["messages"],
        "previous_response_id and the output alone make the same turns"
    );

    // json_schema: the job checked the answer against the schema.
    assert_eq!(schema["format"], "json_schema");
    let request = request_of(&world, &uuid_of(&schema["id"])).await;
    assert_eq!(request["params"]["response_format"]["type"], "json_schema");
    assert_eq!(
        request["params"]["response_format"]["json_schema"]["schema"]["required"],
        json!(["city", "temp_c"])
    );

    // previous_response_id: the first job's turns and answer, not its
    // instructions; another owner's id is a 404 like an unknown one.
    let [first, second] = [0, 1].map(|i| previous["job_ids"][i].as_str().unwrap().to_string());
    let first_result = world.job(&first).await["result"].clone();
    let request = request_of(&world, &second).await;
    assert_eq!(
        request["messages"],
        json!([
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first_result},
            {"role": "user", "content": "What is my name?"},
        ])
    );
    for body in [
        &previous["other_create"],
        &previous["other_retrieve"],
        &previous["unknown"],
    ] {
        assert_eq!(body["type"], "not_found_error", "{body}");
        assert_eq!(body["code"], "response_not_found", "{body}");
    }
    let other_message = previous["other_retrieve"]["message"].as_str().unwrap();
    let unknown_message = previous["unknown"]["message"].as_str().unwrap();
    let redact = |m: &str| m.replace(|c: char| c.is_ascii_hexdigit(), "");
    assert_eq!(
        redact(other_message),
        redact(unknown_message),
        "no existence leaks"
    );

    // background: answered before the job ran, then polled to completion.
    assert!(
        ["queued", "in_progress"].contains(&background["first"].as_str().unwrap()),
        "{background}"
    );
    assert_eq!(
        background["first_model"], "healthy:latency=5",
        "a queued response names the model that will answer, not the route"
    );
    assert_eq!(background["model"], "healthy:latency=5");
    let job = world.job(background["job_id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["result"], background["text"]);

    // Streamed by id: the stored answer's events, the same on a resumed reading.
    assert_eq!(by_id["kinds"], json!(TEXT_EVENTS));
    assert_eq!(
        by_id["resumed"].as_array().unwrap()[..],
        by_id["all"].as_array().unwrap()[5..],
        "starting_after=4 resumes at the fifth event"
    );
    let job_id = by_id["job_id"].as_str().unwrap();
    assert_eq!(world.job(job_id).await["result"], by_id["text"]);
    assert_eq!(
        world.executions(job_id, "primary"),
        1,
        "reading it ran nothing"
    );

    let job = world.job(cancel["job_id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "cancelled", "{cancel}");

    assert_eq!(
        items["items"],
        json!([
            ["message", "developer", "Be brief."],
            ["message", "user", "Hi there."]
        ])
    );
    let job = world.job(items["job_id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "succeeded", "a deleted response's job stays");

    assert_eq!(
        refusals,
        json!({
            "web_search": [422, "tools[0].type", true],
            "no_key": [400, "missing_idempotency_key"],
            "bad_credentials": [401, "authentication_error"],
        })
    );
    // plain, twice, stream, events, three tool turns, schema, two previous,
    // two background, cancel, items; the other owner's, the conflict and the
    // refusals made none.
    assert_eq!(world.store.count_jobs().await.unwrap(), 14);
    world.stop().await;
}

/// `resp_<hex>` back to the job id.
fn uuid_of(response_id: &Value) -> String {
    let hex = response_id.as_str().unwrap().strip_prefix("resp_").unwrap();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

async fn a_background_response_survives_a_kill_9_of_its_server(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(&[spec("primary", "healthy:latency=4000")], &sim.base_url());
    let dir = tempfile::tempdir().unwrap();
    // The provider takes 4 s: long enough for the SDK's process to start,
    // create and exit, and the kill to find the attempt at the provider.
    // Lease = silence + attempt timeout + margin: a killed process's job
    // is taken over 7.5 s after its last renewal.
    let config = ServeConfig {
        providers_dir: providers.path(),
        primary: "primary",
        fallbacks: &[],
        silence_ms: 1_000,
        attempt_timeout_ms: 6_000,
        max_attempts: 4,
        max_concurrent_jobs: None,
        lease_margin_ms: Some(500),
    }
    .write(dir.path());
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let a = Process::serve(&db, Some(&config));
    let [started] = cases_of(
        "responses_cases.py",
        &python,
        &a.address,
        &key,
        ["background_start"],
    )
    .await;
    let job_id = JobId::from(started["job_id"].as_str().unwrap());

    // Kill A while its attempt is at the provider.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempts = store.list_attempts(&job_id).await.unwrap();
        if attempts.iter().any(|a| a.state == AttemptState::Started) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no attempt started: {attempts:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill();
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert!(
        !job.state.is_final(),
        "killed before the job was done: {job:?}"
    );

    let b = Process::serve(&db, Some(&config));
    let id = started["id"].as_str().unwrap();
    let [finished] = cases_with(
        "responses_cases.py",
        &python,
        &b.address,
        &key,
        &[("ONEJOB_RESPONSE_ID", id)],
        ["background_finish"],
    )
    .await;
    assert_eq!(finished["status"], "completed", "{finished}");
    assert_eq!(finished["id"], id);
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(
        job.result
            .as_deref()
            .map(|r| serde_json::from_str::<Value>(r).unwrap()),
        Some(finished["text"].clone()),
    );
    assert_eq!(
        sim.ledger().executions(&stable_key(&job_id, "primary")),
        1,
        "the work ran once across the kill"
    );
    assert_eq!(store.count_jobs().await.unwrap(), 1);
    drop(b);
}

async fn a_cut_or_refused_stream_never_completes_on_a_truncated_answer(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let providers = [
        spec("primary", "healthy"),
        spec("filtering", "content_filter"),
        spec("cutting", "stream_cut:tokens=2"),
        spec("no-prefill", "no_prefill"),
        spec("cutting-too", "stream_cut:tokens=2"),
        spec("backup", "healthy"),
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        // The reconciler asks about a cut attempt only after the
        // continuation has had its chance (see tests/openai_stream.rs).
        c.engine.reconcile_min_age_ms = 10_000;
        c.routes.insert("filter".into(), route("filtering", &[]));
        c.routes
            .insert("cut-no-prefill".into(), route("cutting", &["no-prefill"]));
        c.routes
            .insert("cut".into(), route("cutting-too", &["backup"]));
    })
    .await;
    let [refused, continued, cut] = cases_of(
        "responses_cases.py",
        &python,
        &world.address,
        &world.key,
        [
            "stream_refused",
            "cut_with_prefill_fallback",
            "cut_without_prefill_fallback",
        ],
    )
    .await;
    assert_eq!(
        refused["kinds"],
        json!([
            "response.created",
            "response.in_progress",
            "response.failed"
        ])
    );

    // Continued on a fallback that takes a prefill: one whole answer, the
    // one the job committed, each provider executing once.
    let job_id = uuid_of(&continued["id"]);
    let job = world.job(&job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["result"], continued["text"], "one whole answer");
    let attempts = world.attempts(&job_id).await;
    assert_eq!(attempts[0]["provider"], "cutting-too", "{attempts:?}");
    assert_eq!(attempts[0]["error_kind"], "stream_cut", "{attempts:?}");
    assert_eq!(world.executions(&job_id, "backup"), 1);

    let kinds = cut["kinds"].as_array().unwrap();
    let last = kinds.last().unwrap();
    eprintln!("the cut stream ended with {last}");
    let job_id = uuid_of(&cut["id"]);
    let (job, _) = world
        .until(&job_id, Duration::from_secs(30), |j, _| {
            j["state"] == "succeeded"
        })
        .await;
    let whole = job["result"].as_str().unwrap();
    let partial = cut["text"].as_str().unwrap();
    if last == "response.completed" {
        assert_eq!(cut["final"], whole, "ended whole: {cut}");
        assert_eq!(partial, whole, "{cut}");
    } else {
        assert_eq!(last, "response.failed", "{cut}");
        assert!(!kinds.contains(&json!("response.completed")), "{cut}");
        assert!(
            cut["error"].as_str().unwrap().contains("stream_cut"),
            "{cut}"
        );
        assert!(
            whole.starts_with(partial) && partial.len() < whole.len(),
            "what was streamed is the start of the answer the job went on to: {cut}, {whole:?}"
        );
    }
    let attempts = world.attempts(&job_id).await;
    assert_eq!(attempts[0]["error_kind"], "stream_cut", "{attempts:?}");
    world.stop().await;
}
