//! Admin: run contract tests and see, per (contract, provider), the latest
//! run and whether the provider is eligible.

use super::error::ApiError;
use super::jobs::LimitedBody;
use super::AppState;
use crate::clock::rfc3339;
use crate::contracts::eligibility::{deciding_run, is_enabled, EligibilitySnapshot};
use crate::contracts::{run_contracts, ContractReport, Eligibility, RunError};
use crate::http::auth::Admin;
use crate::store::ContractRunSummary;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    provider: Option<String>,
    contract: Option<String>,
}

#[derive(Serialize)]
struct RunAnswer {
    passed: bool,
    reports: Vec<ContractReport>,
}

/// `POST /v1/admin/contracts/run`: body `{"provider"?, "contract"?}` (or
/// none) selects the pairs; answers once every selected run is stored.
pub async fn run(
    State(state): State<AppState>,
    Admin(caller): Admin,
    LimitedBody(body): LimitedBody,
) -> Result<Response, Response> {
    // None selects every pair; malformed JSON is a 400, a body of the
    // wrong shape a 422 naming the field.
    let selection: RunBody =
        super::body::parse_or_default(&body).map_err(IntoResponse::into_response)?;
    let reports = run_as(
        &state,
        &caller,
        selection.provider.as_deref(),
        selection.contract.as_deref(),
    )
    .await
    .map_err(run_error)?;
    let passed = reports.iter().all(|r| r.passed);
    Ok(Json(RunAnswer { passed, reports }).into_response())
}

/// An admin runs the contract suite (of one provider and/or contract, or
/// all); the runs are stored and the engine's eligibility refreshed. The API
/// and the console both call this.
pub async fn run_as(
    state: &AppState,
    admin: &crate::keys::Caller,
    provider: Option<&str>,
    contract: Option<&str>,
) -> Result<Vec<ContractReport>, RunError> {
    let reports = run_contracts(
        &state.providers,
        &state.contracts,
        state.store.as_ref(),
        state.clock.as_ref(),
        provider,
        contract,
        &format!("admin:{}", admin.owner_id),
    )
    .await?;
    // The engine decides with the new runs from now on, not in 250 ms.
    if let Err(e) = state.gate.refresh().await {
        tracing::warn!(error = %e, "cannot refresh eligibility after a contract run");
    }
    Ok(reports)
}

/// An unknown name answers 404 with a code saying which kind of name; the
/// message lists the known ones.
fn run_error(e: RunError) -> Response {
    let code = match &e {
        RunError::UnknownProvider { .. } => "unknown_provider",
        RunError::UnknownContract { .. } => "unknown_contract",
        RunError::Store(_) => return ApiError::Internal(e.into()).into_response(),
    };
    let body = serde_json::json!({ "error": { "code": code, "message": e.to_string() } });
    let mut response = (StatusCode::NOT_FOUND, Json(body)).into_response();
    response
        .headers_mut()
        .insert("x-should-retry", HeaderValue::from_static("false"));
    response
}

#[derive(Serialize)]
struct RunView {
    id: String,
    passed: bool,
    first_failure: Option<String>,
    contract_digest: String,
    provider_digest: String,
    started_at: String,
    finished_at: String,
    actor: String,
}

impl From<&ContractRunSummary> for RunView {
    fn from(run: &ContractRunSummary) -> Self {
        RunView {
            id: run.id.clone(),
            passed: run.passed,
            first_failure: run.first_failure.clone(),
            contract_digest: run.contract_digest.clone(),
            provider_digest: run.provider_digest.clone(),
            started_at: rfc3339(run.started_at),
            finished_at: rfc3339(run.finished_at),
            actor: run.actor.clone(),
        }
    }
}

#[derive(Serialize)]
struct PairView {
    contract: String,
    provider: String,
    enabled: bool,
    eligibility: Eligibility,
    latest_run: Option<RunView>,
}

/// `GET /v1/admin/contracts/runs`: every loaded (contract, provider) pair
/// with its latest run (if any) and eligibility.
pub async fn latest(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let switches = state.store.provider_switches().await?;
    let runs = state.store.latest_contract_runs().await?;
    let snapshot = EligibilitySnapshot::build(&state.providers, &state.contracts, &switches, &runs);
    let mut pairs = Vec::new();
    for contract in state.contracts.values() {
        for provider in state.providers.entries() {
            let name = provider.name.as_str();
            pairs.push(PairView {
                contract: contract.name.clone(),
                provider: name.to_string(),
                enabled: is_enabled(&switches, name),
                eligibility: snapshot.get(name, &contract.name),
                latest_run: deciding_run(&runs, name, &provider.digest, contract)
                    .map(RunView::from),
            });
        }
    }
    Ok(Json(serde_json::json!({ "runs": pairs })))
}

/// `GET /v1/admin/contracts/runs/{id}`: one run with its full report.
pub async fn show(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run = state
        .store
        .contract_run(&id)
        .await?
        .ok_or(ApiError::NotFound("contract run"))?;
    let report: serde_json::Value = serde_json::from_str(&run.report)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored report {id}: {e}")))?;
    Ok(Json(serde_json::json!({
        "run": RunView::from(&run.summary),
        "contract": run.summary.contract,
        "provider": run.summary.provider,
        "report": report,
    })))
}
