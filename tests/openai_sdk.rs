//! The official `openai` Python SDK, unchanged, against onejob: the
//! simulator and a server on real sockets, the SDK in a subprocess. Each
//! case's observations are checked against the job rows and the simulator's
//! ledger. Skips loudly without `ONEJOB_TEST_PYTHON` (set by `.ci/run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::{python, sdk_cases};
use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::json;

on_both_backends!(the_official_sdk_works_unchanged);

async fn sdk_world(backend: Backend) -> World {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=5",
        },
        ProviderSpec {
            name: "long",
            model: "context_length",
        },
    ];
    start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("too-long".into(), route("long", &[]));
    })
    .await
}

async fn the_official_sdk_works_unchanged(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let world = sdk_world(backend).await;
    let [plain, twice, tools, schema, refusals] = sdk_cases(
        &python,
        &world.address,
        &world.key,
        [
            "plain",
            "same_key_twice",
            "tool_round_trip",
            "json_schema",
            "refusals_raise",
        ],
    )
    .await;

    let job_id = plain["job_id"].as_str().unwrap();
    assert_eq!(plain["provider"], "primary");
    assert_eq!(
        plain["model"], "healthy:latency=5",
        "the model that answered"
    );
    let job = world.job(job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], plain["content"],
        "the SDK got the stored result"
    );
    assert_eq!(world.executions(job_id, "primary"), 1);

    let job_id = twice["job_id"].as_str().unwrap();
    assert_eq!(
        world.deliveries(job_id, "primary"),
        1,
        "the second call was answered from the job, not sent again"
    );

    assert_eq!(tools["tool"], "get_weather");
    let first = tools["job_ids"][0].as_str().unwrap();
    let stored = world.job(first).await;
    assert_eq!(
        stored["result"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );

    let job_id = schema["job_id"].as_str().unwrap();
    assert_eq!(
        world.job(job_id).await["result"],
        schema["answer"].to_string()
    );

    assert_eq!(
        refusals,
        json!({"too-long": [400, "context_length_exceeded", "invalid_request_error"],
               "n": [422, "n"]})
    );
    // sdk-plain, sdk-twice, two tool turns, the schema job, the refused prompt;
    // n = 2 was refused before a job was made.
    assert_eq!(world.store.count_jobs().await.unwrap(), 6);
    world.stop().await;
}
