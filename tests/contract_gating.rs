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
    why_every_provider_was_passed_over_is_in_the_event_log,
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

/// A console session for `key`: the login form's CSRF cookie and field,
/// then the session cookie the login sets.
async fn console_session(world: &World, key: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let form = http
        .get(format!("{}/ui/login", world.address))
        .send()
        .await
        .unwrap();
    let cookie = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(|v| v.split(';').next().unwrap().to_string())
            .unwrap()
    };
    let login_cookie = cookie(&form, "onejob_login_csrf");
    let html = form.text().await.unwrap();
    let at = html.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = html[at..].split('"').next().unwrap().to_string();
    let answer = http
        .post(format!("{}/ui/login", world.address))
        .header("cookie", login_cookie)
        .form(&[("key", key), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);
    cookie(&answer, "onejob_session")
}

/// When no provider may take a job, its event log says why each was passed
/// over (switched off, not eligible for the job's contract), as the
/// console's job page shows it, and so does the job's last error.
async fn why_every_provider_was_passed_over_is_in_the_event_log(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy",
        },
        ProviderSpec {
            name: "fallback",
            model: "healthy",
        },
    ];
    let mut r = route("primary", &["fallback"]);
    r.max_attempts = 2;
    let world = start_world(backend, &providers, r, |_| {}).await;
    let (status, body) = world
        .post(
            &world.admin_key,
            "/v1/admin/providers/primary/disable",
            &json!({ "reason": "maintenance window" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let (_, job) = world.submit("passed-over", &ticket(1), None).await;
    let id = job["id"].as_str().unwrap().to_string();
    let (job, attempts) = world
        .until(&id, WAIT, |j, _| j["state"] == "needs_review")
        .await;
    assert!(attempts.is_empty(), "{attempts:?}");
    assert_eq!(world.executions(&id, "primary"), 0);
    assert_eq!(world.executions(&id, "fallback"), 0);
    let disabled = "primary: disabled (maintenance window)";
    let ineligible = "fallback: not eligible as fallback for ticket-triage: no contract run yet";
    let last_error = job["last_error"].as_str().unwrap();
    assert!(
        last_error.contains(disabled) && last_error.contains(ineligible),
        "{job}"
    );

    // The event log as stored: one retry and then review, each with why.
    let events = world
        .store
        .list_events(&onejob::domain::JobId::from(id.as_str()))
        .await
        .unwrap();
    let reasons: Vec<(&str, String)> = events
        .iter()
        .filter(|e| ["retry_scheduled", "needs_review"].contains(&e.kind.as_str()))
        .map(|e| {
            let detail: Value = serde_json::from_str(e.detail.as_deref().unwrap()).unwrap();
            (
                e.kind.as_str(),
                detail["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["retry_scheduled", "needs_review"],
        "{events:?}"
    );
    for (kind, reason) in &reasons {
        assert!(
            reason.contains(disabled) && reason.contains(ineligible),
            "{kind}: {reason}"
        );
    }

    // And as the console's job page shows it.
    let session = console_session(&world, &world.admin_key).await;
    let page = world
        .client
        .get(format!("{}/ui/jobs/{id}", world.address))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("retry_scheduled"), "{html}");
    assert!(html.contains(disabled), "{html}");
    assert!(html.contains(ineligible), "{html}");
    world.stop().await;
}
