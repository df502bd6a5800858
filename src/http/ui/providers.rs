//! Providers as ops run them: the enabled switch with who, why and when and
//! its audit trail, this server's breaker, eligibility per contract with the
//! reason, and the contract suite run from a button with its report. Every
//! action goes through the API's own functions (`switch_as`, `run_as`).

use super::form::ConsoleForm;
use super::session::{self, UiAdmin};
use super::{breaker_text, error_page, layout, render_page, when};
use crate::contracts::eligibility::deciding_run;
use crate::http::admin_contracts::run_as;
use crate::http::admin_providers::{switch_as, view};
use crate::http::error::ApiError;
use crate::http::AppState;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct EligibilityRow {
    contract: String,
    eligible: bool,
    reason: String,
}

#[derive(Serialize)]
struct RunRow {
    id: String,
    contract: String,
    passed: bool,
    first_failure: Option<String>,
    finished: String,
    actor: String,
}

#[derive(Serialize)]
struct ProviderRow {
    name: String,
    kind: String,
    model: String,
    enabled: bool,
    changed_by: Option<String>,
    reason: Option<String>,
    changed_at: Option<String>,
    breaker: String,
    breaker_class: &'static str,
    eligibility: Vec<EligibilityRow>,
    runs: Vec<RunRow>,
    /// The hedge's silence threshold in force on each route it serves.
    thresholds: Vec<super::hedging::ThresholdRow>,
}

#[derive(Serialize)]
struct AuditRow {
    name: String,
    enabled: bool,
    actor: String,
    reason: String,
    at: String,
}

/// `GET /ui/providers`
pub async fn page(State(state): State<AppState>, admin: UiAdmin) -> Response {
    let (runs, audit) = match (
        state.store.latest_contract_runs().await,
        state.store.provider_audit(None, 50).await,
    ) {
        (Ok(r), Ok(a)) => (r, a),
        (Err(e), _) | (_, Err(e)) => return error_page(e.into()),
    };
    let now = state.clock.now_ms();
    let mut rows = Vec::new();
    for name in state.providers.names() {
        let v = match view(&state, name) {
            Ok(v) => v,
            Err(e) => return error_page(e),
        };
        let (breaker, breaker_class) = breaker_text(&v.breaker, now);
        rows.push(ProviderRow {
            name: v.name,
            kind: format!("{:?}", v.kind).to_lowercase(),
            model: v.model,
            enabled: v.enabled,
            changed_by: v.changed_by,
            reason: v.reason,
            changed_at: v
                .changed_at
                .as_deref()
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| super::when_ago(d.as_millis() as i64, now)),
            breaker,
            breaker_class,
            thresholds: super::hedging::thresholds(&state, name),
            eligibility: v
                .eligibility
                .into_iter()
                .map(|e| EligibilityRow {
                    contract: e.contract,
                    eligible: e.eligible,
                    reason: e.reason,
                })
                .collect(),
            // Per contract, the run that decides its eligibility.
            runs: state
                .contracts
                .values()
                .filter_map(|contract| {
                    let digest = &state.providers.get(name)?.digest;
                    deciding_run(&runs, name, digest, contract)
                })
                .map(|r| RunRow {
                    id: r.id.clone(),
                    contract: r.contract.clone(),
                    passed: r.passed,
                    first_failure: r.first_failure.clone(),
                    finished: when(r.finished_at),
                    actor: r.actor.clone(),
                })
                .collect(),
        });
    }
    let audit: Vec<AuditRow> = audit
        .into_iter()
        .map(|a| AuditRow {
            name: a.name,
            enabled: a.enabled,
            actor: a.actor,
            reason: a.reason,
            at: when(a.at),
        })
        .collect();
    render_page(
        "providers.html",
        minijinja::context! {
            providers => rows,
            audit => audit,
            ..layout(&admin, "Providers", "providers")
        },
    )
    .into_response()
}

#[derive(Deserialize)]
pub struct SwitchForm {
    #[serde(default)]
    csrf: String,
    /// `enable` or `disable`.
    to: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/providers/{name}/switch`
pub async fn switch(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(name): Path<String>,
    ConsoleForm(form): ConsoleForm<SwitchForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    let enabled = match form.to.as_str() {
        "enable" => true,
        "disable" => false,
        other => {
            return error_page(ApiError::InvalidRequest(format!(
                "to: {other:?} is not enable or disable"
            )))
        }
    };
    match switch_as(&state, &admin.caller, &name, enabled, Some(&form.reason)).await {
        Ok(()) => Redirect::to("/ui/providers").into_response(),
        Err(e) => error_page(e),
    }
}

#[derive(Deserialize)]
pub struct RunForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/providers/{name}/contracts`: run the provider's contract suite.
pub async fn run_contracts(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(name): Path<String>,
    ConsoleForm(form): ConsoleForm<RunForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    if state.providers.get(&name).is_none() {
        return error_page(ApiError::NotFound("provider"));
    }
    match run_as(&state, &admin.caller, Some(&name), None).await {
        Ok(_) => Redirect::to(&format!("/ui/providers#runs-{name}")).into_response(),
        Err(crate::contracts::RunError::Store(e)) => error_page(e.into()),
        Err(e) => error_page(ApiError::InvalidRequest(e.to_string())),
    }
}

#[derive(Serialize)]
struct CheckRow {
    case: String,
    check: String,
    passed: bool,
    message: String,
}

/// `GET /ui/contract-runs/{id}`: one run's full report.
pub async fn contract_run(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<String>,
) -> Response {
    let run = match state.store.contract_run(&id).await {
        Ok(Some(run)) => run,
        Ok(None) => return error_page(ApiError::NotFound("contract run")),
        Err(e) => return error_page(e.into()),
    };
    let report: crate::contracts::ContractReport = match serde_json::from_str(&run.report) {
        Ok(r) => r,
        Err(e) => {
            return error_page(ApiError::Internal(anyhow::anyhow!(
                "stored report {id}: {e}"
            )))
        }
    };
    let checks: Vec<CheckRow> = report
        .checks
        .into_iter()
        .map(|c| CheckRow {
            case: c.case,
            check: serde_json::to_value(c.check)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            passed: c.passed,
            message: c.message,
        })
        .collect();
    let s = run.summary;
    render_page(
        "contract_run.html",
        minijinja::context! {
            run => minijinja::context! {
                id => s.id, contract => s.contract, provider => s.provider, passed => s.passed,
                first_failure => s.first_failure, started => when(s.started_at),
                finished => when(s.finished_at), actor => s.actor,
                contract_digest => s.contract_digest, provider_digest => s.provider_digest,
            },
            checks => checks,
            ..layout(&admin, "Contract run", "providers")
        },
    )
    .into_response()
}
