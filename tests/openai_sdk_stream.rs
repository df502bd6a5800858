//! The official `openai` Python SDK, unchanged, streaming from onejob:
//! pieces as they come, the same text on a replay, and a stream cut with no
//! continuation raising in the SDK instead of passing for a whole answer.
//! Skips loudly without `ONEJOB_TEST_PYTHON` (set by `.ci/run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::{python, sdk_cases};
use common::world::{route, start_world, ProviderSpec};
use common::Backend;
use std::time::Duration;

on_both_backends!(the_official_sdk_streams_unchanged);

async fn the_official_sdk_streams_unchanged(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy",
        },
        ProviderSpec {
            name: "cutter",
            model: "stream_cut:tokens=2",
        },
        ProviderSpec {
            name: "refuser",
            model: "no_prefill",
        },
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("cut".into(), route("cutter", &["refuser"]));
    })
    .await;
    let [streamed, cut] = sdk_cases(
        &python,
        &world.address,
        &world.key,
        ["streamed", "stream_cut_raises"],
    )
    .await;

    let job_id = streamed["job_id"].as_str().unwrap();
    assert_eq!(streamed["models"], serde_json::json!(["healthy"]));
    let job = world.job(job_id).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(
        job["result"], streamed["content"],
        "the SDK got the stored result"
    );
    assert_eq!(
        world.executions(job_id, "primary"),
        1,
        "replays ran nothing"
    );

    let job_id = cut["job_id"].as_str().unwrap();
    assert_eq!(cut["error"]["code"], "stream_cut", "{cut}");
    let partial = cut["partial"].as_str().unwrap();
    assert_eq!(partial.chars().count(), 32, "two pieces, then the error");
    // The job goes on and finishes with the whole answer (the reconciler
    // finds what the cut provider executed); the SDK never saw it as done.
    let (job, _) = world
        .until(job_id, Duration::from_secs(20), |j, _| {
            j["state"] == "succeeded"
        })
        .await;
    let whole = job["result"].as_str().unwrap();
    assert!(whole.starts_with(partial) && whole.len() > partial.len());
    assert_eq!(world.executions(job_id, "cutter"), 1);
    world.stop().await;
}
