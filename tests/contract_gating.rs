//! Contracts gate failover, through the engine: only a provider whose latest
//! contract run passed (for the current contract and provider config) is
//! hedged or failed over to, and output that breaks the contract is never a
//! job's result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

on_both_backends!(
    an_ineligible_fallback_is_never_hedged_or_failed_over_to,
    a_passing_run_makes_the_fallback_eligible_until_the_contract_changes,
    output_that_breaks_the_schema_is_never_a_result,
);

const WAIT: Duration = Duration::from_secs(15);

fn ticket(i: usize) -> Value {
    json!({
        "contract": "ticket-triage",
        "input": {
            "channel": "email",
            "customer_name": "Dana Whitfield",
            "subject": format!("Charged twice, ticket {i}"),
            "body": "I was charged twice for March. Please refund one payment."
        }
    })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

async fn run_contracts(world: &World, provider: &str) -> Value {
    let body = json!({ "provider": provider, "contract": "ticket-triage" });
    let (status, answer) = world
        .post(&world.admin_key, "/v1/admin/contracts/run", &body)
        .await;
    assert_eq!(status, 200, "{answer}");
    answer
}

async fn eligibility(world: &World, provider: &str) -> Value {
    let (_, body) = world.get(&world.admin_key, "/v1/admin/providers").await;
    let entry = body["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == provider)
        .unwrap()
        .clone();
    entry["eligibility"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["contract"] == "ticket-triage")
        .unwrap()
        .clone()
}

async fn an_ineligible_fallback_is_never_hedged_or_failed_over_to(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=700",
        },
        ProviderSpec {
            name: "fallback",
            model: "hallucinate_key",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 100;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let report = run_contracts(&world, "fallback").await;
    assert_eq!(
        report["passed"], false,
        "hallucinate_key fails its contract"
    );
    let e = eligibility(&world, "fallback").await;
    assert_eq!(e["eligible"], false);
    assert!(e["reason"].as_str().unwrap().contains("schema"), "{e}");

    let (_, job) = world.submit("t-1", &ticket(1), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "succeeded")
        .await;
    assert_eq!(
        attempts.len(),
        1,
        "the job waited on the primary alone: {attempts:?}"
    );
    assert_eq!(attempts[0]["provider"], "primary");
    assert_eq!(job["completed_by"], attempts[0]["id"]);
    assert_eq!(world.executions(&id, "fallback"), 0);
    world.stop().await;
}

async fn a_passing_run_makes_the_fallback_eligible_until_the_contract_changes(backend: Backend) {
    let contracts = tempfile::tempdir().unwrap();
    copy_dir(Path::new("contracts"), contracts.path());
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=700",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 100;
    let dir = contracts.path().to_path_buf();
    let mut world = start_world(backend, &providers, r, |c| c.contracts_dir = dir).await;
    assert_eq!(eligibility(&world, "fallback").await["status"], "never_run");
    let (_, job) = world.submit("before-run", &ticket(1), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "succeeded")
        .await;
    assert!(
        attempts.iter().all(|a| a["provider"] == "primary"),
        "never run: no hedge {attempts:?}"
    );

    assert_eq!(run_contracts(&world, "fallback").await["passed"], true);
    assert_eq!(eligibility(&world, "fallback").await["eligible"], true);
    let (_, job) = world.submit("after-run", &ticket(2), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "succeeded")
        .await;
    let hedge = attempts
        .iter()
        .find(|a| a["kind"] == "hedge")
        .expect("hedged to the eligible fallback");
    assert_eq!(hedge["provider"], "fallback");
    assert_eq!(job["completed_by"], hedge["id"], "the fast fallback won");

    // The contract changes (a deploy with an edited schema): old runs are stale.
    let schema_path = contracts.path().join("ticket-triage/schema.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    schema["description"] = json!("edited after the run");
    std::fs::write(&schema_path, serde_json::to_string_pretty(&schema).unwrap()).unwrap();
    world.restart(|_| {}).await;
    let e = eligibility(&world, "fallback").await;
    assert_eq!(
        (e["eligible"].as_bool(), e["status"].as_str()),
        (Some(false), Some("contract_changed")),
        "{e}"
    );
    let (_, job) = world.submit("after-change", &ticket(3), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "succeeded")
        .await;
    assert!(
        attempts.iter().all(|a| a["provider"] == "primary"),
        "stale run: no hedge {attempts:?}"
    );

    assert_eq!(run_contracts(&world, "fallback").await["passed"], true);
    assert_eq!(eligibility(&world, "fallback").await["eligible"], true);
    world.stop().await;
}

async fn output_that_breaks_the_schema_is_never_a_result(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "hallucinate_key",
    }];
    let mut r = route("primary", &[]);
    r.max_attempts = 2;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (_, job) = world.submit("bad-output", &ticket(1), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "needs_review")
        .await;
    assert!(job["result"].is_null(), "{job}");
    assert!(job["completed_by"].is_null());
    assert_eq!(attempts.len(), 2);
    for a in &attempts {
        assert_eq!(
            (a["state"].as_str(), a["error_kind"].as_str()),
            (Some("failed"), Some("contract_violation"))
        );
        assert!(
            a["error_message"]
                .as_str()
                .unwrap()
                .contains("confidence_note"),
            "{a}"
        );
    }
    world.stop().await;
}
