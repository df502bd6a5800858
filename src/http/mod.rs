//! The HTTP API (axum): routes, shared state, auth and the error shape.

pub mod admin_contracts;
pub mod auth;
pub mod error;
pub mod jobs;
pub mod views;

use crate::clock::Clock;
use crate::config::Config;
use crate::contracts::Contract;
use crate::providers::catalog::Catalog;
use crate::store::Store;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything a handler may use.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub keys: Arc<auth::KeyCache>,
    pub providers: Arc<Catalog>,
    pub contracts: Arc<BTreeMap<String, Contract>>,
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/jobs", post(jobs::create))
        .route("/v1/jobs/{id}", get(jobs::show))
        .route("/v1/jobs/{id}/attempts", get(jobs::attempts))
        .route("/v1/admin/contracts/run", post(admin_contracts::run))
        .route("/v1/admin/contracts/runs", get(admin_contracts::latest))
        .route("/v1/admin/contracts/runs/{id}", get(admin_contracts::show))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Liveness: the process answers.
async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Readiness: the database answers.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(serde_json::json!({ "status": "ready", "database": state.store.backend() })),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(
                    serde_json::json!({ "status": "unavailable", "database": state.store.backend() }),
                ),
            )
        }
    }
}
