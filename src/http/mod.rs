//! The HTTP API (axum): routes, shared state, auth and the error shape.

pub mod admin_contracts;
pub mod admin_hedging;
pub mod admin_providers;
pub mod admin_review;
pub mod anthropic;
pub mod auth;
pub mod body;
pub mod door;
pub mod drain;
pub mod error;
pub mod job_actions;
pub mod jobs;
pub mod openai;
pub mod openai_error;
pub mod refusals;
pub mod responses;
pub mod serve;
pub mod tenants;
pub mod ui;
pub mod url_guard;
pub use crate::views;
pub mod webhooks;

use crate::clock::Clock;
use crate::config::Config;
use crate::contracts::Contract;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::providers::catalog::Catalog;
use crate::providers::switches::ProviderSwitches;
use crate::store::Store;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything a handler may use, behind one `Arc`: axum clones the state
/// for every extractor and middleware of every request, and one count to
/// bump is cheaper than one per service (fourteen atomic increments and
/// decrements, on counters both cores write).
#[derive(Clone)]
pub struct AppState(Arc<AppServices>);

impl AppState {
    pub fn new(services: AppServices) -> Self {
        AppState(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppServices;

    fn deref(&self) -> &AppServices {
        &self.0
    }
}

/// The services of [`AppState`].
pub struct AppServices {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    /// Keys (cached), limits and usage.
    pub tenants: Arc<crate::tenants::Tenants>,
    pub providers: Arc<Catalog>,
    pub contracts: Arc<BTreeMap<String, Contract>>,
    /// `None` when this server only accepts and stores jobs.
    pub engine: Option<Engine>,
    pub metrics: Arc<Metrics>,
    /// Whether a provider may take an attempt, and as whose fallback.
    pub gate: Arc<crate::engine::gate::EligibilityGate>,
    /// Which providers are switched on (in memory, refreshed from the store).
    pub switches: Arc<ProviderSwitches>,
    /// Replays of finished jobs answered from memory, and their audit.
    pub replays: Arc<crate::replays::Replays>,
    /// Sessions of the ops console (`/ui`).
    pub ui_sessions: Arc<ui::session::Sessions>,
    /// The webhook sender, when this process delivers (`[webhooks] enabled`).
    pub webhooks: Option<Arc<crate::webhooks::delivery::Deliverer>>,
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes;
    let drain = drain::DrainLimits {
        max_bytes: body_limit,
        max_time: state.config.body_read_timeout,
    };
    let traced = state.config.telemetry.tracing_enabled();
    let router = Router::new()
        .route("/v1/jobs", post(jobs::create))
        .route("/v1/jobs/{id}", get(jobs::show))
        .route("/v1/jobs/{id}/attempts", get(jobs::attempts))
        .route("/v1/chat/completions", post(openai::create))
        .route("/v1/messages", post(anthropic::create))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/models", get(list_models))
        .route("/v1/models/{model}", get(show_model))
        .route("/v1/jobs/{id}/retry", post(job_actions::retry))
        .route("/v1/jobs/{id}/cancel", post(job_actions::cancel))
        .route("/v1/admin/review", get(admin_review::list))
        .route(
            "/v1/admin/jobs/{id}/resolve",
            post(admin_review::resolve_job),
        )
        .route(
            "/v1/admin/attempts/{id}/resolve",
            post(admin_review::resolve_attempt),
        )
        .route("/metrics", get(metrics))
        .route("/v1/admin/providers", get(admin_providers::list))
        .route(
            "/v1/admin/providers/{name}/enable",
            post(admin_providers::enable),
        )
        .route(
            "/v1/admin/providers/{name}/disable",
            post(admin_providers::disable),
        )
        .route(
            "/v1/admin/providers/{name}/audit",
            get(admin_providers::audit),
        )
        .route("/v1/admin/routes/{name}/hedging", get(admin_hedging::show))
        .route("/v1/admin/contracts/run", post(admin_contracts::run))
        .route("/v1/admin/contracts/runs", get(admin_contracts::latest))
        .route("/v1/admin/contracts/runs/{id}", get(admin_contracts::show))
        .route(
            "/v1/admin/keys",
            get(tenants::list_keys).post(tenants::create_key),
        )
        .route("/v1/admin/keys/{id}/revoke", post(tenants::revoke_key))
        .route("/v1/admin/keys/{id}/rotate", post(tenants::rotate_key))
        .route("/v1/admin/keys/{id}/limits", post(tenants::set_key_limits))
        .route("/v1/admin/limits", get(tenants::show_limits))
        .route("/v1/admin/limits/{owner}", post(tenants::set_limits))
        .route("/v1/admin/tenants/audit", get(tenants::audit))
        .route("/v1/admin/usage", get(tenants::admin_usage))
        .route("/v1/usage", get(tenants::own_usage))
        .route("/v1/webhooks", get(webhooks::list).post(webhooks::create))
        .route(
            "/v1/webhooks/{id}",
            get(webhooks::show).delete(webhooks::delete),
        )
        .route("/v1/webhooks/{id}/rotate", post(webhooks::rotate))
        .route("/v1/webhooks/{id}/deliveries", get(webhooks::deliveries))
        .route(
            "/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver",
            post(webhooks::redeliver),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(
            ui::routes().layer(axum::middleware::from_fn(move |request, next| {
                ui::read_body_within(drain, request, next)
            })),
        )
        .fallback(unknown_route)
        .method_not_allowed_fallback(|headers: HeaderMap, uri: Uri| async move {
            in_dialect(&headers, &uri, ApiError::MethodNotAllowed)
        })
        .layer(DefaultBodyLimit::max(body_limit))
        // A body answered before it was read is read to its end (bounded), so
        // the answer arrives and the connection stays usable.
        .layer(axum::middleware::from_fn(move |request, next| {
            drain::drain_unread_body(drain, request, next)
        }))
        .layer(axum::middleware::from_fn(refusals::log_refusals))
        .with_state(state);
    if traced {
        router.layer(axum::middleware::from_fn(crate::telemetry::trace_request))
    } else {
        router
    }
}

/// A path no route serves: 404 in the shape the caller's SDK reads, so an
/// SDK pointed at an endpoint onejob lacks says so instead of failing to
/// parse the error.
async fn unknown_route(headers: HeaderMap, uri: Uri) -> Response {
    in_dialect(&headers, &uri, ApiError::NotFound("route"))
}

/// Whether a request speaks Anthropic's API: its SDKs send
/// `anthropic-version` with every request, OpenAI's never do. Where two
/// doors share a path (the Models API), or no door decoded the request,
/// this decides whose shape it is answered in.
pub(crate) fn speaks_anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

/// `GET /v1/models`, which both SDKs ask: Anthropic's Models API to a
/// caller that speaks Anthropic's, OpenAI's list to any other.
async fn list_models(
    state: State<AppState>,
    caller: Result<crate::keys::Caller, ApiError>,
    headers: HeaderMap,
    query: anthropic::models::Pairs,
) -> Response {
    if speaks_anthropic(&headers) {
        anthropic::models::list(state, caller, query)
            .await
            .into_response()
    } else {
        openai::list_models(state, caller).await.into_response()
    }
}

/// `GET /v1/models/{model}`, in the caller's dialect as [`list_models`].
async fn show_model(
    state: State<AppState>,
    caller: Result<crate::keys::Caller, ApiError>,
    headers: HeaderMap,
    model: axum::extract::Path<String>,
) -> Response {
    if speaks_anthropic(&headers) {
        anthropic::models::show(state, caller, model)
            .await
            .into_response()
    } else {
        openai::show_model(state, caller, model)
            .await
            .into_response()
    }
}

/// An error for a request no door decoded: Anthropic's shape for a caller
/// that speaks Anthropic ([`speaks_anthropic`]), OpenAI's for any other
/// `/v1/` path, onejob's own elsewhere.
pub(crate) fn in_dialect(headers: &HeaderMap, uri: &Uri, error: ApiError) -> Response {
    if speaks_anthropic(headers) {
        anthropic::AnthropicError::from(error).into_response()
    } else if uri.path().starts_with("/v1/") {
        openai::CompatError::from(error).into_response()
    } else {
        error.into_response()
    }
}

/// Prometheus text. The review-queue depth is read from the database here,
/// so every replica reports the same queue.
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut hedging = String::new();
    if let Some(engine) = state.engine.as_ref() {
        engine.report_gauges(&state.metrics);
        hedging = engine.hedging_metrics();
    }
    let commits = state.store.commit_counts();
    state
        .metrics
        .set_store_commits(commits.commits, commits.writes);
    match state.store.review_queue_depth().await {
        Ok(depth) => state.metrics.set_review_queue_depth(depth),
        Err(e) => tracing::warn!(error = %e, "cannot count the review queue for /metrics"),
    }
    match state.store.webhook_counts().await {
        Ok(counts) => {
            state
                .metrics
                .set_webhook_deliveries(counts.pending, counts.delivered, counts.failed)
        }
        Err(e) => tracing::warn!(error = %e, "cannot count webhook deliveries for /metrics"),
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        state.metrics.render(&hedging),
    )
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
