//! Webhook endpoints of every owner and their latest deliveries, with the
//! same actions as `/v1/webhooks` and `onejob webhooks`: create, rotate (the
//! new secret shown once), delete, redeliver. Each calls
//! [`crate::webhooks::endpoints`] as the admin.

use super::form::ConsoleForm;
use super::session::{self, UiAdmin};
use super::{error_page, layout, render_page, when_ago};
use crate::domain::{JobId, OwnerId};
use crate::http::error::ApiError;
use crate::http::AppState;
use crate::webhooks::endpoints::{Actor, NewEndpoint, Webhooks};
use crate::webhooks::EVENT_TYPES;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};

/// Latest deliveries shown per endpoint.
const DELIVERIES_SHOWN: i64 = 10;

fn webhooks(state: &AppState) -> Webhooks<'_> {
    Webhooks {
        store: state.store.as_ref(),
        clock: state.clock.as_ref(),
        config: &state.config.webhooks,
        key: state.config.webhook_key.as_ref(),
    }
}

fn admin_actor(admin: &UiAdmin) -> Actor<'_> {
    Actor {
        owner_id: &admin.caller.owner_id,
        is_admin: true,
    }
}

#[derive(Serialize)]
struct DeliveryRow {
    id: String,
    event_type: String,
    job_id: JobId,
    state: &'static str,
    tries: i64,
    created: String,
    last: String,
    finished: bool,
}

#[derive(Serialize)]
struct EndpointRow {
    id: String,
    owner: OwnerId,
    url: String,
    description: String,
    events: String,
    enabled: bool,
    disabled_reason: Option<String>,
    rotating_until: Option<String>,
    created: String,
    deliveries: Vec<DeliveryRow>,
}

/// `GET /ui/webhooks`
pub async fn page(State(state): State<AppState>, admin: UiAdmin) -> Response {
    let hooks = webhooks(&state);
    let now = state.clock.now_ms();
    let endpoints = match hooks.list(admin_actor(&admin), None).await {
        Ok(e) => e,
        Err(e) => return error_page(e.into()),
    };
    let mut rows = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        let deliveries = match hooks
            .deliveries(admin_actor(&admin), &e.id, DELIVERIES_SHOWN)
            .await
        {
            Ok(d) => d,
            Err(e) => return error_page(e.into()),
        };
        rows.push(EndpointRow {
            deliveries: deliveries
                .iter()
                .map(|(d, tries)| DeliveryRow {
                    id: d.id.clone(),
                    event_type: d.event_type.clone(),
                    job_id: d.job_id.clone(),
                    state: d.state.as_str(),
                    tries: d.tries,
                    created: when_ago(d.created_at, now),
                    last: tries.last().map_or_else(
                        || "—".to_string(),
                        |t| {
                            format!(
                                "{} in {} ms{}",
                                t.status
                                    .map_or_else(|| "no answer".to_string(), |s| s.to_string()),
                                t.latency_ms,
                                t.error
                                    .as_deref()
                                    .map(|e| format!(": {e}"))
                                    .unwrap_or_default()
                            )
                        },
                    ),
                    finished: d.state != crate::store::webhooks::DeliveryState::Pending,
                })
                .collect(),
            id: e.id.clone(),
            owner: e.owner_id.clone(),
            url: e.url.clone(),
            description: e.description.clone(),
            events: e.event_types().join(", "),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            rotating_until: e
                .previous_secret_until
                .filter(|&u| u > now)
                .map(|u| when_ago(u, now)),
            created: when_ago(e.created_at, now),
        });
    }
    render_page(
        "webhooks.html",
        minijinja::context! {
            endpoints => rows,
            event_types => EVENT_TYPES,
            configured => state.config.webhook_key.is_some(),
            key_env => state.config.webhooks.secret_key_env,
            ..layout(&admin, "Webhooks", "webhooks")
        },
    )
    .into_response()
}

#[derive(Deserialize)]
pub struct CreateForm {
    #[serde(default)]
    csrf: String,
    owner: String,
    url: String,
    #[serde(default)]
    description: String,
    /// Comma-separated event types; empty: every job.* type.
    #[serde(default)]
    events: String,
}

/// The page that shows a new secret, once.
fn secret_page(
    admin: &UiAdmin,
    what: &str,
    endpoint: &str,
    owner: &OwnerId,
    secret: &str,
) -> Response {
    render_page(
        "webhook_secret.html",
        minijinja::context! {
            what => what, endpoint => endpoint, endpoint_owner => owner, secret => secret,
            ..layout(admin, "Webhook secret", "webhooks")
        },
    )
    .into_response()
}

/// `POST /ui/webhooks`
pub async fn create(
    State(state): State<AppState>,
    admin: UiAdmin,
    ConsoleForm(form): ConsoleForm<CreateForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    if form.owner.trim().is_empty() {
        return error_page(ApiError::InvalidRequest("owner: required".to_string()));
    }
    let events: Vec<String> = form
        .events
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    let new = NewEndpoint {
        url: form.url.trim().to_string(),
        events: (!events.is_empty()).then_some(events),
        description: Some(form.description),
        owner: Some(form.owner.trim().into()),
    };
    match webhooks(&state).create(admin_actor(&admin), new).await {
        Ok((endpoint, secret)) => {
            secret_page(&admin, "created", &endpoint.id, &endpoint.owner_id, &secret)
        }
        Err(e) => error_page(e.into()),
    }
}

#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/webhooks/{id}/rotate`
pub async fn rotate(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<String>,
    ConsoleForm(form): ConsoleForm<ActionForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    match webhooks(&state).rotate(admin_actor(&admin), &id).await {
        Ok((endpoint, secret)) => {
            secret_page(&admin, "rotated", &endpoint.id, &endpoint.owner_id, &secret)
        }
        Err(e) => error_page(e.into()),
    }
}

/// `POST /ui/webhooks/{id}/delete`
pub async fn delete(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<String>,
    ConsoleForm(form): ConsoleForm<ActionForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    match webhooks(&state).delete(admin_actor(&admin), &id).await {
        Ok(()) => Redirect::to("/ui/webhooks").into_response(),
        Err(e) => error_page(e.into()),
    }
}

/// `POST /ui/webhooks/{id}/deliveries/{delivery_id}/redeliver`
pub async fn redeliver(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path((id, delivery_id)): Path<(String, String)>,
    ConsoleForm(form): ConsoleForm<ActionForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    match webhooks(&state)
        .redeliver(admin_actor(&admin), &id, &delivery_id)
        .await
    {
        Ok(_) => {
            if let Some(deliverer) = &state.webhooks {
                deliverer.wake();
            }
            Redirect::to(&format!("/ui/webhooks#{id}")).into_response()
        }
        Err(e) => error_page(e.into()),
    }
}
