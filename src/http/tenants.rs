//! Keys, limits and usage over HTTP. Admin: `/v1/admin/keys` (list, create,
//! revoke, rotate), `/v1/admin/limits` (read, change at run time, audited),
//! `/v1/admin/usage`, `/v1/admin/tenants/audit`. Any key: `GET /v1/usage`
//! (its owner's own usage). Handlers call the same functions as the CLI.

use super::auth::Admin;
use super::body::ApiQuery;
use super::error::ApiError;
use super::jobs::LimitedBody;
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::OwnerId;
use crate::keys::{self, key_state, Caller, KeyError};
use crate::store::tenants::{KeyRecord, OwnerLimitsRow, TenantAuditEntry};
use crate::tenants::limits::Limits;
use crate::tenants::usage::{self, UsageReport};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A key as listed: never the secret, never its hash.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub id: String,
    pub owner: OwnerId,
    pub prefix: String,
    pub admin: bool,
    /// `active`, `rotating` (replaced; works until `expires_at`), `expired` or `revoked`.
    pub state: &'static str,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
    pub replaced_by: Option<String>,
    /// The key's own limits, in addition to its owner's; `{}` when none.
    pub limits: serde_json::Value,
}

impl KeyView {
    pub fn new(k: KeyRecord, now: i64) -> Self {
        KeyView {
            state: key_state(&k, now),
            id: k.id,
            owner: k.owner_id,
            prefix: k.prefix,
            admin: k.is_admin,
            created_at: rfc3339(k.created_at),
            last_used_at: k.last_used_at.map(rfc3339),
            expires_at: k.expires_at.map(rfc3339),
            revoked_at: k.revoked_at.map(rfc3339),
            replaced_by: k.replaced_by,
            limits: k
                .limits
                .as_deref()
                .and_then(|l| serde_json::from_str(l).ok())
                .unwrap_or_else(|| json!({})),
        }
    }
}

impl From<KeyError> for ApiError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::InvalidOwner => ApiError::InvalidRequest(format!("owner: {e}")),
            KeyError::InvalidDuration(m) => ApiError::InvalidRequest(m),
            KeyError::NotFound(_) => ApiError::NotFound("key"),
            KeyError::NotLive(_) => ApiError::KeyNotLive(e.to_string()),
            KeyError::InvalidLimits(m) => ApiError::InvalidRequest(m),
            e @ KeyError::InvalidReason(_) => ApiError::InvalidRequest(e.to_string()),
            KeyError::Store(s) => s.into(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct OwnerQuery {
    #[serde(default, deserialize_with = "crate::http::body::owner_filter")]
    owner: Option<OwnerId>,
}

pub async fn list_keys(
    State(state): State<AppState>,
    Admin(_): Admin,
    ApiQuery(q): ApiQuery<OwnerQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let now = state.clock.now_ms();
    let keys: Vec<KeyView> = keys::list(state.store.as_ref(), q.owner.as_ref())
        .await?
        .into_iter()
        .map(|k| KeyView::new(k, now))
        .collect();
    Ok(Json(json!({ "keys": keys })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    owner: String,
    #[serde(default)]
    admin: bool,
    /// e.g. "30d"; never expires when absent.
    #[serde(default)]
    expires_in: Option<String>,
    /// The key's own limits, in addition to its owner's.
    #[serde(default)]
    limits: Limits,
}

pub async fn create_key(
    State(state): State<AppState>,
    Admin(admin): Admin,
    LimitedBody(body): LimitedBody,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let req: CreateKey = super::body::parse(&body)?;
    let expires_in = req
        .expires_in
        .as_deref()
        .map(|t| keys::parse_duration("expires_in", t))
        .transpose()?;
    let actor = format!("admin:{}", admin.owner_id);
    let created = keys::create(
        state.store.as_ref(),
        state.clock.as_ref(),
        &req.owner,
        req.admin,
        expires_in,
        req.limits,
        &actor,
    )
    .await?;
    tracing::info!(key = %created.record.id, owner = %req.owner, actor = %actor, "key created");
    let view = KeyView::new(created.record, state.clock.now_ms());
    Ok((
        StatusCode::CREATED,
        Json(json!({ "key": view, "secret": created.secret })),
    ))
}

/// `POST /v1/admin/keys/{id}/revoke`: no body, or `{"reason": "…"}`
/// (kept in the audit trail).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeKey {
    #[serde(default)]
    reason: Option<String>,
}

pub async fn revoke_key(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(id): Path<String>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<KeyView>, ApiError> {
    let req: RevokeKey = super::body::parse_or_default(&body)?;
    let actor = format!("admin:{}", admin.owner_id);
    let record = keys::revoke(
        state.store.as_ref(),
        state.clock.as_ref(),
        &id,
        &actor,
        req.reason.as_deref(),
    )
    .await?;
    // This server refuses it at once; the others within a second.
    state.tenants.watch_once().await?;
    tracing::info!(key = %id, actor = %actor, "key revoked");
    Ok(Json(KeyView::new(record, state.clock.now_ms())))
}

/// Replace key `id`'s own limits (those of its rotations too): audited;
/// every server applies them within a second. `{"limits": {}, …}` leaves
/// the key with none of its own.
pub async fn set_key_limits(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(id): Path<String>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<KeyView>, ApiError> {
    let req: SetLimits = super::body::parse(&body)?;
    let reason = super::body::reason(&req.reason)?;
    let actor = format!("admin:{}", admin.owner_id);
    let record = keys::set_limits(
        state.store.as_ref(),
        state.clock.as_ref(),
        &id,
        req.limits,
        &actor,
        reason,
    )
    .await?;
    state.tenants.watch_once().await?;
    tracing::info!(key = %id, actor = %actor, reason, "key limits changed");
    Ok(Json(KeyView::new(record, state.clock.now_ms())))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateKey {
    /// How long the old secret keeps working, e.g. "1h" [default: 24h].
    #[serde(default)]
    grace: Option<String>,
    /// Why (kept in the audit trail).
    #[serde(default)]
    reason: Option<String>,
}

pub const DEFAULT_GRACE: &str = "24h";

pub async fn rotate_key(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(id): Path<String>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req: RotateKey = super::body::parse_or_default(&body)?;
    let grace = keys::parse_duration("grace", req.grace.as_deref().unwrap_or(DEFAULT_GRACE))?;
    let actor = format!("admin:{}", admin.owner_id);
    let rotated = keys::rotate(
        state.store.as_ref(),
        state.clock.as_ref(),
        &id,
        grace,
        &actor,
        req.reason.as_deref(),
    )
    .await?;
    state.tenants.watch_once().await?;
    tracing::info!(key = %id, new_key = %rotated.created.record.id, actor = %actor, "key rotated");
    let now = state.clock.now_ms();
    Ok(Json(json!({
        "key": KeyView::new(rotated.created.record, now),
        "secret": rotated.created.secret,
        "old": KeyView::new(rotated.old, now),
    })))
}

#[derive(Debug, Serialize)]
struct LimitsOverrideView {
    owner: OwnerId,
    limits: serde_json::Value,
    changed_by: String,
    reason: String,
    changed_at: String,
}

pub async fn show_limits(
    State(state): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let config = state.tenants.config();
    let overrides: Vec<LimitsOverrideView> = state
        .store
        .owner_limits()
        .await?
        .into_iter()
        .map(|r| LimitsOverrideView {
            limits: serde_json::from_str(&r.limits).unwrap_or_default(),
            owner: r.owner_id,
            changed_by: r.changed_by,
            reason: r.reason,
            changed_at: rfc3339(r.changed_at),
        })
        .collect();
    let mut effective = serde_json::Map::new();
    let owners = config
        .owners
        .keys()
        .cloned()
        .chain(overrides.iter().map(|o| o.owner.clone()));
    for owner in owners {
        let limits = state.tenants.limits_for(&owner);
        effective.insert(owner.into_string(), json!(limits));
    }
    Ok(Json(json!({
        "default": config.default,
        "owners": config.owners,
        "overrides": overrides,
        "effective": effective,
        "live_instances": state.tenants.live_instances(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetLimits {
    limits: Limits,
    reason: String,
}

/// Replace `owner`'s run-time limits (fields left out fall back to the
/// config file's); audited; every server applies them within a second.
pub async fn set_limits(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(owner): Path<OwnerId>,
    LimitedBody(body): LimitedBody,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req: SetLimits = super::body::parse(&body)?;
    let reason = super::body::reason(&req.reason)?;
    if !OwnerId::is_valid_name(&owner) {
        return Err(ApiError::InvalidRequest(format!(
            "owner: must be {}",
            OwnerId::NAME_RULE
        )));
    }
    state
        .tenants
        .config()
        .check_override(&owner, &req.limits)
        .map_err(|e| ApiError::InvalidRequest(format!("limits.{e}")))?;
    let row = OwnerLimitsRow {
        owner_id: owner.clone(),
        limits: serde_json::to_string(&req.limits).map_err(|e| ApiError::Internal(e.into()))?,
        changed_by: format!("admin:{}", admin.owner_id),
        reason: reason.to_string(),
        changed_at: state.clock.now_ms(),
    };
    state.store.set_owner_limits(row).await?;
    state.tenants.watch_once().await?;
    tracing::info!(owner = %owner, actor = %admin.owner_id, reason, "limits changed");
    Ok(Json(
        json!({ "owner": owner, "limits": state.tenants.limits_for(&owner) }),
    ))
}

#[derive(Debug, Serialize)]
struct AuditView {
    id: i64,
    subject: String,
    action: String,
    actor: String,
    detail: Option<serde_json::Value>,
    at: String,
}

impl From<TenantAuditEntry> for AuditView {
    fn from(e: TenantAuditEntry) -> Self {
        AuditView {
            id: e.id,
            subject: e.subject,
            action: e.action,
            actor: e.actor,
            detail: e.detail.and_then(|d| serde_json::from_str(&d).ok()),
            at: rfc3339(e.at),
        }
    }
}

pub async fn audit(
    State(state): State<AppState>,
    Admin(_): Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let entries: Vec<AuditView> = state
        .store
        .tenant_audit(1_000)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Json(json!({ "entries": entries })))
}

#[derive(Debug, Deserialize)]
pub struct UsageQuery {
    days: Option<String>,
    #[serde(default, deserialize_with = "crate::http::body::owner_filter")]
    owner: Option<OwnerId>,
}

fn days(q: &UsageQuery) -> Result<u32, ApiError> {
    match &q.days {
        None => Ok(7),
        Some(d) => d
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=usage::MAX_DAYS).contains(n))
            .ok_or_else(|| ApiError::InvalidRequest(format!("days: 1-{}", usage::MAX_DAYS))),
    }
}

/// The caller's own usage: `owner` may name the caller's owner (an admin
/// key: any owner); another owner is a `403 forbidden`.
pub async fn own_usage(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let owner = super::body::owner_asked(&caller, q.owner.as_ref())?.unwrap_or(&caller.owner_id);
    let report = usage::report(
        state.store.as_ref(),
        state.clock.as_ref(),
        Some(owner),
        days(&q)?,
    )
    .await?;
    let limits = state.tenants.limits_for(owner);
    Ok(Json(with_limits(report, owner, limits)))
}

fn with_limits(report: UsageReport, owner: &OwnerId, limits: Limits) -> serde_json::Value {
    let used = report.today.get(owner).copied().unwrap_or(0);
    let mut value = json!(report);
    value["owner"] = json!(owner);
    value["limits"] = json!(limits);
    value["budget"] = json!({
        "tokens_per_day": limits.tokens_per_day,
        "used_today": used,
        "remaining_today": limits.tokens_per_day.map(|l| (l as i64 - used).max(0)),
    });
    value
}

pub async fn admin_usage(
    State(state): State<AppState>,
    Admin(_): Admin,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let report = usage::report(
        state.store.as_ref(),
        state.clock.as_ref(),
        q.owner.as_ref(),
        days(&q)?,
    )
    .await?;
    Ok(Json(match q.owner.as_ref() {
        Some(owner) => with_limits(report, owner, state.tenants.limits_for(owner)),
        None => json!(report),
    }))
}
