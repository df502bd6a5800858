//! `/v1/webhooks`: an owner's signed webhook endpoints (the admin's key
//! sees every owner's). Handlers call [`crate::webhooks::endpoints`], as
//! the CLI does.

use super::body;
use super::body::ApiQuery;
use super::error::ApiError;
use super::jobs::LimitedBody;
use super::AppState;
use crate::domain::OwnerId;
use crate::keys::Caller;
use crate::webhooks::endpoints::{Actor, NewEndpoint, WebhookError, Webhooks};
use crate::webhooks::views::{DeliveryView, EndpointView, EndpointWithSecret};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

fn webhooks(state: &AppState) -> Webhooks<'_> {
    Webhooks {
        store: state.store.as_ref(),
        clock: state.clock.as_ref(),
        config: &state.config.webhooks,
        key: state.config.webhook_key.as_ref(),
    }
}

fn actor(caller: &Caller) -> Actor<'_> {
    Actor {
        owner_id: &caller.owner_id,
        is_admin: caller.is_admin,
    }
}

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        match e {
            WebhookError::Invalid(m) => ApiError::InvalidRequest(m),
            WebhookError::NotFound(what) => ApiError::NotFound(what),
            e @ WebhookError::DeliveryPending => ApiError::DeliveryPending(e.to_string()),
            e @ WebhookError::UrlTaken(_) => ApiError::EndpointExists(e.to_string()),
            e @ WebhookError::NoKey(_) => ApiError::WebhooksNotConfigured(e.to_string()),
            WebhookError::Secret(e) => ApiError::Internal(e.into()),
            WebhookError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/webhooks` `{"url", "events", "description"}`: 201 with the
/// endpoint and its `secret`, shown this once.
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    LimitedBody(raw): LimitedBody,
) -> Result<(StatusCode, Json<EndpointWithSecret>), ApiError> {
    let new: NewEndpoint = body::parse(&raw)?;
    let (endpoint, secret) = webhooks(&state).create(actor(&caller), new).await?;
    Ok((
        StatusCode::CREATED,
        Json(EndpointWithSecret {
            endpoint: EndpointView::new(&endpoint, state.clock.now_ms()),
            secret,
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// One owner's endpoints only: the caller's own, or (admin) any.
    #[serde(default, deserialize_with = "crate::http::body::owner_filter")]
    owner: Option<OwnerId>,
}

/// `GET /v1/webhooks`: without secrets.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let now = state.clock.now_ms();
    let owner = crate::http::body::owner_asked(&caller, q.owner.as_ref())?;
    let endpoints = webhooks(&state).list(actor(&caller), owner).await?;
    let views: Vec<EndpointView> = endpoints
        .iter()
        .map(|e| EndpointView::new(e, now))
        .collect();
    Ok(Json(json!({ "data": views })))
}

pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EndpointView>, ApiError> {
    let endpoint = webhooks(&state).get(actor(&caller), &id).await?;
    Ok(Json(EndpointView::new(&endpoint, state.clock.now_ms())))
}

/// `DELETE /v1/webhooks/{id}`: the endpoint and its deliveries.
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    webhooks(&state).delete(actor(&caller), &id).await?;
    Ok(Json(json!({ "id": id, "deleted": true })))
}

/// `POST /v1/webhooks/{id}/rotate`: a new secret, shown this once; the old
/// one signs beside it until `previous_secret_until`.
/// `POST /v1/webhooks/{id}/rotate` takes no field: the grace is the
/// server's `rotation_grace_ms`. A body is still read, so a field a
/// client believes it set (`{"grace": "1h"}`, as a key's rotation takes)
/// is refused rather than ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateBody {}

pub async fn rotate(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    LimitedBody(raw): LimitedBody,
) -> Result<Json<EndpointWithSecret>, ApiError> {
    let RotateBody {} = body::parse_or_default(&raw)?;
    let (endpoint, secret) = webhooks(&state).rotate(actor(&caller), &id).await?;
    Ok(Json(EndpointWithSecret {
        endpoint: EndpointView::new(&endpoint, state.clock.now_ms()),
        secret,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    limit: Option<i64>,
}

/// `GET /v1/webhooks/{id}/deliveries`: newest first, each with its tries
/// (status, latency, error).
pub async fn deliveries(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<DeliveriesQuery>,
) -> Result<Json<Value>, ApiError> {
    let rows = webhooks(&state)
        .deliveries(actor(&caller), &id, q.limit.unwrap_or(50))
        .await?;
    let views: Vec<DeliveryView> = rows
        .iter()
        .map(|(d, tries)| DeliveryView::new(d, tries))
        .collect();
    Ok(Json(json!({ "data": views })))
}

/// `POST /v1/webhooks/{id}/deliveries/{delivery_id}/redeliver`: send it
/// again now, with the same `webhook-id` and body; answered as the
/// deliveries list shows it, with its tries so far. 409
/// `delivery_pending` while it is still being retried.
pub async fn redeliver(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, delivery_id)): Path<(String, String)>,
) -> Result<Json<DeliveryView>, ApiError> {
    let (delivery, tries) = webhooks(&state)
        .redeliver(actor(&caller), &id, &delivery_id)
        .await?;
    if let Some(deliverer) = &state.webhooks {
        deliverer.wake();
    }
    Ok(Json(DeliveryView::new(&delivery, &tries)))
}
