//! Ops control of providers (admin key only): list what is configured with
//! its switch and eligibility, switch a provider on or off with a reason,
//! read the audit trail. `enabled` is read from the server's in-memory
//! switches, the same ones the engine consults, so what this answers is what
//! the engine does.

use super::auth::Admin;
use super::body::ApiQuery;
use super::error::ApiError;
use super::jobs::LimitedBody;
use super::AppState;
use crate::clock::rfc3339;
use crate::contracts::Contract;
use crate::contracts::EligibilitySnapshot;
use crate::domain::text::OneLine;
use crate::providers::config::{ProviderConfig, ProviderKind, Tokenizer};
use crate::providers::switches::{switch_provider, SwitchError};
use crate::store::{ProviderAuditEntry, ProviderSwitch};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most audit entries one answer carries.
const MAX_AUDIT: i64 = 1_000;

/// A configured provider as ops see it. Never carries an API key (only the
/// name of the variable holding it is configured, and not shown either).
#[derive(Debug, Serialize)]
pub struct ProviderView {
    pub name: String,
    pub kind: ProviderKind,
    pub model: String,
    pub base_url: String,
    pub tokenizer: Tokenizer,
    pub context_window: u32,
    pub digest: String,
    pub enabled: bool,
    pub changed_by: Option<String>,
    pub reason: Option<String>,
    pub changed_at: Option<String>,
    pub eligibility: Vec<Eligibility>,
    /// This server's circuit breaker for the provider (`closed` until it
    /// first sees the provider fail); breakers are per process.
    pub breaker: crate::domain::breaker::BreakerState,
}

impl ProviderView {
    /// `switch` is the provider's last switch; none means never switched (enabled).
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        digest: &str,
        switch: Option<&ProviderSwitch>,
        snapshot: Option<&EligibilitySnapshot>,
        contracts: &BTreeMap<String, Contract>,
    ) -> Self {
        ProviderView {
            name: name.to_string(),
            kind: config.kind,
            model: config.model.clone(),
            base_url: config.base_url.clone(),
            tokenizer: config.tokenizer,
            context_window: config.context_window,
            digest: digest.to_string(),
            enabled: switch.is_none_or(|s| s.enabled),
            changed_by: switch.map(|s| s.changed_by.clone()),
            reason: switch.map(|s| s.reason.clone()),
            changed_at: switch.map(|s| rfc3339(s.changed_at)),
            eligibility: eligibility(name, switch, snapshot, contracts),
            breaker: crate::domain::breaker::BreakerState::Closed {
                consecutive_failures: 0,
            },
        }
    }
}

/// Whether a provider may take over a job of one contract as a fallback,
/// and why not: the gate's own snapshot, so ops see what the engine decides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Eligibility {
    pub contract: String,
    pub eligible: bool,
    pub status: crate::contracts::EligibilityStatus,
    pub reason: String,
}

pub fn eligibility(
    provider: &str,
    switch: Option<&ProviderSwitch>,
    snapshot: Option<&EligibilitySnapshot>,
    contracts: &BTreeMap<String, Contract>,
) -> Vec<Eligibility> {
    use crate::contracts::EligibilityStatus;
    let disabled = switch.filter(|s| !s.enabled);
    contracts
        .keys()
        .map(|contract| {
            let (eligible, status, reason) = match (disabled, snapshot) {
                // The switch this server holds now, with who and why.
                (Some(s), _) => (
                    false,
                    EligibilityStatus::Disabled,
                    format!("{provider} is disabled by {}: {}", s.changed_by, s.reason),
                ),
                (None, Some(snapshot)) => {
                    let e = snapshot.get(provider, contract);
                    (e.eligible, e.status, e.reason)
                }
                (None, None) => (
                    false,
                    EligibilityStatus::Unknown,
                    "eligibility not loaded yet".to_string(),
                ),
            };
            Eligibility {
                contract: contract.clone(),
                eligible,
                status,
                reason,
            }
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct AuditView {
    pub id: i64,
    pub name: String,
    pub enabled: bool,
    pub actor: String,
    pub reason: String,
    pub at: String,
}

impl From<ProviderAuditEntry> for AuditView {
    fn from(e: ProviderAuditEntry) -> Self {
        AuditView {
            id: e.id,
            name: e.name,
            enabled: e.enabled,
            actor: e.actor,
            reason: e.reason,
            at: rfc3339(e.at),
        }
    }
}

impl From<SwitchError> for ApiError {
    fn from(e: SwitchError) -> Self {
        match e {
            SwitchError::UnknownProvider(_) => ApiError::NotFound("provider"),
            e @ SwitchError::InvalidReason(_) => ApiError::InvalidRequest(e.to_string()),
            SwitchError::Store(e) => e.into(),
        }
    }
}

pub fn view(state: &AppState, name: &str) -> Result<ProviderView, ApiError> {
    let entry = state
        .providers
        .get(name)
        .ok_or(ApiError::NotFound("provider"))?;
    let mut view = ProviderView::new(
        name,
        &entry.config,
        &entry.digest,
        state.switches.get(name).as_ref(),
        state.gate.snapshot().as_deref(),
        &state.contracts,
    );
    if let Some(breaker) = state
        .engine
        .as_ref()
        .and_then(|e| e.breakers().remove(name))
    {
        view.breaker = breaker;
    }
    Ok(view)
}

/// `GET /v1/admin/providers`
pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let providers = state
        .providers
        .names()
        .map(|name| view(&state, name))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(serde_json::json!({ "providers": providers })))
}

/// `POST /v1/admin/providers/{name}/enable`
pub async fn enable(
    state: State<AppState>,
    admin: Admin,
    name: Path<String>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<ProviderView>, ApiError> {
    switch(state, admin, name, body, true).await
}

/// `POST /v1/admin/providers/{name}/disable`
pub async fn disable(
    state: State<AppState>,
    admin: Admin,
    name: Path<String>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<ProviderView>, ApiError> {
    switch(state, admin, name, body, false).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchBody {
    reason: Option<String>,
}

async fn switch(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(name): Path<String>,
    body: Bytes,
    enabled: bool,
) -> Result<Json<ProviderView>, ApiError> {
    // An empty body is a missing reason (422), not malformed JSON; a body
    // of the wrong shape is a 422 naming the field.
    let body: SwitchBody = super::body::parse_or_default(&body)?;
    switch_as(&state, &admin, &name, enabled, body.reason.as_deref()).await?;
    Ok(Json(view(&state, &name)?))
}

/// An admin switches a provider on or off with a reason (audited); the API
/// and the console both call this, and the engine sees it at once.
pub async fn switch_as(
    state: &AppState,
    admin: &crate::keys::Caller,
    name: &str,
    enabled: bool,
    reason: Option<&str>,
) -> Result<(), ApiError> {
    // `admin:OWNER`, as every other admin decision is audited: the bare
    // owner read as the CLI's actor for an owner named `cli`.
    let actor = format!("admin:{}", admin.owner_id);
    let switch = switch_provider(
        state.store.as_ref(),
        state.providers.get(name).is_some(),
        name,
        enabled,
        &actor,
        reason,
        state.clock.now_ms(),
    )
    .await?;
    tracing::info!(provider = %name, enabled, actor = %actor, reason = %OneLine(&switch.reason), "provider switched");
    state.switches.record(switch);
    // The eligibility snapshot read the switch as it was: read again, so
    // the answer (and the engine's next hedge) sees the provider as it is.
    if let Err(e) = state.gate.refresh().await {
        tracing::warn!(error = %e, "cannot refresh eligibility after a provider switch");
    }
    Ok(())
}

/// `?limit=N`, read by hand so a bad value gets our JSON error shape.
#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    limit: Option<String>,
}

/// `GET /v1/admin/providers/{name}/audit`: newest first.
pub async fn audit(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if state.providers.get(&name).is_none() {
        return Err(ApiError::NotFound("provider"));
    }
    let limit = match query.limit.as_deref().map(str::parse::<i64>) {
        None => 100,
        Some(Ok(n)) if (1..=MAX_AUDIT).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::InvalidRequest(format!(
                "limit: a whole number from 1 to {MAX_AUDIT}"
            )))
        }
    };
    let entries: Vec<AuditView> = state
        .store
        .provider_audit(Some(&name), limit)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Json(
        serde_json::json!({ "provider": name, "audit": entries }),
    ))
}
