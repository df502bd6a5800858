//! Ops control of providers over real HTTP: who may see and switch them,
//! what a switch records, and what is refused without writing anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{error_code, spawn_app, Backend, TestApp};
use onejob::clock::SystemClock;
use serde_json::{json, Value};

on_both_backends!(
    list_shows_the_shipped_providers_enabled,
    non_admin_keys_are_forbidden_and_no_key_is_unauthorized,
    disabling_with_a_reason_shows_who_and_why_and_is_audited,
    a_switch_without_a_valid_reason_is_refused_and_nothing_is_written,
    an_unknown_provider_is_not_found,
    admin_bodies_get_coded_errors_and_nothing_is_written,
);

async fn admin_key(app: &TestApp) -> String {
    onejob::keys::create_key(app.store.as_ref(), &SystemClock, "ops", true)
        .await
        .unwrap()
}

async fn post(app: &TestApp, key: Option<&str>, path: &str, body: &str) -> reqwest::Response {
    let mut request = app
        .client
        .post(format!("{}{path}", app.address))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

async fn providers(app: &TestApp, key: &str) -> Vec<Value> {
    let response = app.get(key, "/v1/admin/providers").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["providers"].as_array().unwrap().clone()
}

fn find<'a>(providers: &'a [Value], name: &str) -> &'a Value {
    providers
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {providers:?}"))
}

async fn list_shows_the_shipped_providers_enabled(backend: Backend) {
    let app = spawn_app(backend).await;
    let admin = admin_key(&app).await;
    let response = app.get(&admin, "/v1/admin/providers").await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(!text.to_lowercase().contains("api_key"), "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let list = body["providers"].as_array().unwrap();
    for name in ["sim", "sim-backup"] {
        let p = find(list, name);
        assert_eq!(p["enabled"], true, "{p}");
        assert_eq!(p["kind"], "sim");
        assert_eq!(p["tokenizer"], "o200k_base");
        assert_eq!(p["context_window"], 16384);
        assert_eq!(p["digest"].as_str().unwrap().len(), 64);
        assert!(p["changed_by"].is_null() && p["reason"].is_null() && p["changed_at"].is_null());
        let eligibility = p["eligibility"].as_array().unwrap();
        assert!(!eligibility.is_empty(), "one entry per shipped contract");
        // Enabled, but no contract run has proven it yet: not a fallback.
        assert!(
            eligibility
                .iter()
                .all(|e| e["eligible"] == false && e["status"] == "never_run"),
            "{p}"
        );
    }
    assert_eq!(find(list, "sim")["model"], "healthy");
    app.stop().await;
}

async fn non_admin_keys_are_forbidden_and_no_key_is_unauthorized(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app.get(&app.key, "/v1/admin/providers").await;
    assert_eq!(response.status(), 403);
    assert_eq!(error_code(response).await, "forbidden");
    let response = app
        .client
        .get(format!("{}/v1/admin/providers", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(error_code(response).await, "unauthorized");

    let body = json!({ "reason": "not mine to switch" }).to_string();
    let response = post(
        &app,
        Some(&app.key),
        "/v1/admin/providers/sim/disable",
        &body,
    )
    .await;
    assert_eq!(response.status(), 403);
    assert_eq!(error_code(response).await, "forbidden");
    let response = post(&app, None, "/v1/admin/providers/sim/disable", &body).await;
    assert_eq!(response.status(), 401);
    let response = app.get(&app.key, "/v1/admin/providers/sim/audit").await;
    assert_eq!(response.status(), 403);

    assert!(app.store.provider_switches().await.unwrap().is_empty());
    assert!(app.store.provider_audit(None, 10).await.unwrap().is_empty());
    app.stop().await;
}

async fn disabling_with_a_reason_shows_who_and_why_and_is_audited(backend: Backend) {
    let app = spawn_app(backend).await;
    let admin = admin_key(&app).await;
    let body = json!({ "reason": "upstream returns 500s" }).to_string();
    let response = post(&app, Some(&admin), "/v1/admin/providers/sim/disable", &body).await;
    assert_eq!(response.status(), 200);
    let answered: Value = response.json().await.unwrap();
    assert_eq!(answered["name"], "sim");
    assert_eq!(answered["enabled"], false);
    assert_eq!(answered["changed_by"], "admin:ops");
    assert_eq!(answered["reason"], "upstream returns 500s");

    let list = providers(&app, &admin).await;
    let sim = find(&list, "sim");
    assert_eq!(sim["enabled"], false);
    assert_eq!(sim["changed_by"], "admin:ops");
    assert_eq!(sim["reason"], "upstream returns 500s");
    assert!(sim["changed_at"].as_str().unwrap().ends_with('Z'), "{sim}");
    let eligibility = sim["eligibility"].as_array().unwrap();
    assert!(eligibility.iter().all(|e| e["eligible"] == false), "{sim}");
    assert!(eligibility[0]["reason"]
        .as_str()
        .unwrap()
        .contains("upstream returns 500s"));
    assert_eq!(find(&list, "sim-backup")["enabled"], true);

    let switches = app.store.provider_switches().await.unwrap();
    assert_eq!(switches.len(), 1);
    assert!(!switches[0].enabled);

    let body = json!({ "reason": "fixed upstream" }).to_string();
    let response = post(&app, Some(&admin), "/v1/admin/providers/sim/enable", &body).await;
    assert_eq!(response.status(), 200);
    let answered: Value = response.json().await.unwrap();
    assert_eq!(answered["enabled"], true);
    // The answer says what the engine now decides: no longer disabled
    // (never run, as no contract run was made here).
    let eligibility = answered["eligibility"].as_array().unwrap();
    assert!(!eligibility.is_empty());
    assert!(
        eligibility.iter().all(|e| e["status"] == "never_run"),
        "{answered}"
    );
    assert_eq!(find(&providers(&app, &admin).await, "sim")["enabled"], true);

    let response = app.get(&admin, "/v1/admin/providers/sim/audit").await;
    assert_eq!(response.status(), 200);
    let audit: Value = response.json().await.unwrap();
    let entries = audit["audit"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{audit}");
    assert_eq!(entries[0]["enabled"], true, "newest first: {audit}");
    assert_eq!(entries[0]["reason"], "fixed upstream");
    assert_eq!(entries[1]["enabled"], false);
    assert_eq!(entries[1]["reason"], "upstream returns 500s");
    assert!(entries.iter().all(|e| e["actor"] == "admin:ops"));
    let other: Value = app
        .get(&admin, "/v1/admin/providers/sim-backup/audit")
        .await
        .json()
        .await
        .unwrap();
    assert!(other["audit"].as_array().unwrap().is_empty(), "{other}");

    let newest: Value = app
        .get(&admin, "/v1/admin/providers/sim/audit?limit=1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(newest["audit"].as_array().unwrap().len(), 1, "{newest}");
    assert_eq!(newest["audit"][0]["reason"], "fixed upstream");
    for bad in ["0", "lots", "-3", "1001"] {
        let response = app
            .get(
                &admin,
                &format!("/v1/admin/providers/sim/audit?limit={bad}"),
            )
            .await;
        assert_eq!(response.status(), 422, "limit={bad}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
    }
    app.stop().await;
}

async fn a_switch_without_a_valid_reason_is_refused_and_nothing_is_written(backend: Backend) {
    let app = spawn_app(backend).await;
    let admin = admin_key(&app).await;
    let too_long = json!({ "reason": "x".repeat(501) }).to_string();
    for body in [
        "",
        "{}",
        r#"{"reason": ""}"#,
        r#"{"reason": "   "}"#,
        &too_long,
    ] {
        let response = post(&app, Some(&admin), "/v1/admin/providers/sim/disable", body).await;
        assert_eq!(response.status(), 422, "body {body:?}");
        assert_eq!(error_code(response).await, "invalid_request");
    }
    let response = post(&app, Some(&admin), "/v1/admin/providers/sim/disable", "{").await;
    assert_eq!(response.status(), 400);
    assert_eq!(error_code(response).await, "malformed_json");

    assert!(app.store.provider_switches().await.unwrap().is_empty());
    assert!(app.store.provider_audit(None, 10).await.unwrap().is_empty());
    assert_eq!(find(&providers(&app, &admin).await, "sim")["enabled"], true);
    app.stop().await;
}

async fn an_unknown_provider_is_not_found(backend: Backend) {
    let app = spawn_app(backend).await;
    let admin = admin_key(&app).await;
    let body = json!({ "reason": "typo" }).to_string();
    for action in ["enable", "disable"] {
        let path = format!("/v1/admin/providers/no-such-provider/{action}");
        let response = post(&app, Some(&admin), &path, &body).await;
        assert_eq!(response.status(), 404);
        assert_eq!(error_code(response).await, "not_found");
    }
    let response = app
        .get(&admin, "/v1/admin/providers/no-such-provider/audit")
        .await;
    assert_eq!(response.status(), 404);
    assert!(app.store.provider_switches().await.unwrap().is_empty());
    assert!(app.store.provider_audit(None, 10).await.unwrap().is_empty());
    app.stop().await;
}

/// Every admin endpoint that reads a body answers a body it cannot take
/// with the API's JSON errors (a 413 with its code, malformed JSON a 400,
/// a wrong shape a 422), and writes nothing.
async fn admin_bodies_get_coded_errors_and_nothing_is_written(backend: Backend) {
    let app = spawn_app(backend).await;
    let admin = admin_key(&app).await;
    let key = app.store.list_api_keys(None).await.unwrap()[0].id.clone();
    let keys_before = app.store.list_api_keys(None).await.unwrap().len();
    // The keys made so far are audited; nothing after them may be.
    let audit_before = app.store.tenant_audit(10).await.unwrap();
    let too_big = " ".repeat(1024 * 1024 + 1);
    let paths = [
        "/v1/admin/providers/sim/disable".to_string(),
        "/v1/admin/providers/sim/enable".to_string(),
        "/v1/admin/contracts/run".to_string(),
        "/v1/admin/keys".to_string(),
        format!("/v1/admin/keys/{key}/rotate"),
        format!("/v1/admin/keys/{key}/revoke"),
        format!("/v1/admin/keys/{key}/limits"),
        "/v1/admin/limits/alice".to_string(),
    ];
    for path in &paths {
        let response = post(&app, Some(&admin), path, &too_big).await;
        assert_eq!(response.status(), 413, "{path}");
        assert_eq!(error_code(response).await, "payload_too_large", "{path}");
        let response = post(&app, Some(&admin), path, "{").await;
        assert_eq!(response.status(), 400, "{path}");
        assert_eq!(error_code(response).await, "malformed_json", "{path}");
    }
    for (path, body) in [
        ("/v1/admin/providers/sim/disable", r#"{"reason": 5}"#),
        (
            "/v1/admin/providers/sim/disable",
            r#"{"reason": "maintenance", "until": "monday"}"#,
        ),
        ("/v1/admin/contracts/run", r#"{"provider": 5}"#),
        ("/v1/admin/contracts/run", r#"{"providers": ["sim"]}"#),
        // serde would read a struct from an array of its fields.
        ("/v1/admin/keys", r#"["dave"]"#),
        ("/v1/admin/limits/alice", r#"[{"tokens_per_day": 7}, "r"]"#),
        ("/v1/admin/providers/sim/disable", r#"["maintenance"]"#),
        // ... and so would it limits, read by position (a rate of 1, a
        // burst of 2, …), or none from `[]`.
        (
            "/v1/admin/limits/alice",
            r#"{"limits": [1, 2, 3, 4], "reason": "r"}"#,
        ),
        ("/v1/admin/limits/alice", r#"{"limits": [], "reason": "r"}"#),
        ("/v1/admin/keys", r#"{"owner": "dave", "limits": [1]}"#),
        // Owners no key could have.
        (
            "/v1/admin/limits/al%20ice",
            r#"{"limits": {}, "reason": "r"}"#,
        ),
        ("/v1/admin/keys", r#"{"owner": "a/b"}"#),
        // A NUL PostgreSQL cannot store (a 500 there before), an escape
        // that would reach the terminal of `providers list`.
        (
            "/v1/admin/providers/sim/disable",
            r#"{"reason": "maint\u0000x"}"#,
        ),
        (
            "/v1/admin/providers/sim/disable",
            r#"{"reason": "\u001b[2J"}"#,
        ),
        (
            "/v1/admin/limits/alice",
            r#"{"limits": {"concurrent_jobs": 4}, "reason": "a\u0000b"}"#,
        ),
        // A rate whose wait overflowed a `Duration`: every request of the
        // owner panicked the server's task.
        (
            "/v1/admin/limits/alice",
            r#"{"limits": {"requests_per_second": 1e-300}, "reason": "r"}"#,
        ),
        ("/v1/admin/keys", r#"{"owner": "x", "expires_in": "0d"}"#),
    ] {
        let response = post(&app, Some(&admin), path, body).await;
        assert_eq!(response.status(), 422, "{path} {body}");
        assert_eq!(
            error_code(response).await,
            "invalid_request",
            "{path} {body}"
        );
    }

    // The message speaks JSON, not the server's Rust types.
    let response = post(
        &app,
        Some(&admin),
        "/v1/admin/limits/alice",
        r#"{"limits": 5, "reason": "r"}"#,
    )
    .await;
    assert_eq!(response.status(), 422);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "limits: invalid type: integer `5`, expected an object"
    );

    assert!(app.store.provider_switches().await.unwrap().is_empty());
    assert!(app.store.provider_audit(None, 10).await.unwrap().is_empty());
    assert!(app.store.latest_contract_runs().await.unwrap().is_empty());
    assert_eq!(
        app.store.list_api_keys(None).await.unwrap().len(),
        keys_before
    );
    assert!(app.store.owner_limits().await.unwrap().is_empty());
    assert_eq!(app.store.tenant_audit(10).await.unwrap(), audit_before);
    assert_eq!(find(&providers(&app, &admin).await, "sim")["enabled"], true);
    app.stop().await;
}
