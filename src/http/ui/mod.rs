//! The ops console at `/ui`: server-rendered HTML (minijinja templates
//! compiled into the binary) and SVG drawn by the server. No script, no
//! front-end build, no CDN: every byte a page needs is served from here, so
//! the console works offline.
//!
//! - [`session`]: admin key → session cookie, CSRF tokens, logout.
//! - [`form`]: forms and query strings that do not decode get a refusal page.
//! - [`jobs`]: the filtered, paged job list and each job's page.
//! - [`timeline`]: a job's attempts drawn on one time axis.
//! - [`review`]: the review queue and its audited decisions.
//! - [`providers`]: switches, breakers, eligibility, contract runs.
//! - [`overview`]: charts over a chosen window, from the database.
//! - [`hedging`]: thresholds in force, every provider, hedging's cost.
//! - [`webhooks`]: every owner's webhook endpoints, deliveries and their actions.
//!
//! Every action calls the same logic function as its API endpoint, so the
//! console audits (and refuses) exactly as the API does.

pub mod form;
pub mod hedging;
pub mod jobs;
pub mod overview;
pub mod providers;
pub mod review;
pub mod session;
pub mod svg;
pub mod timeline;
pub mod webhooks;

use super::AppState;
use crate::http::error::ApiError;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use form::ConsoleForm;
use serde::Deserialize;
use session::{cookie, refused, set_cookie, UiAdmin, LOGIN_CSRF_COOKIE, SESSION_COOKIE};
use std::sync::OnceLock;

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("refused.html", include_str!("templates/refused.html")),
    ("jobs.html", include_str!("templates/jobs.html")),
    ("job.html", include_str!("templates/job.html")),
    ("review.html", include_str!("templates/review.html")),
    ("providers.html", include_str!("templates/providers.html")),
    (
        "contract_run.html",
        include_str!("templates/contract_run.html"),
    ),
    ("overview.html", include_str!("templates/overview.html")),
    ("webhooks.html", include_str!("templates/webhooks.html")),
    (
        "webhook_secret.html",
        include_str!("templates/webhook_secret.html"),
    ),
];

const CSS: &str = include_str!("templates/console.css");

fn templates() -> &'static minijinja::Environment<'static> {
    static ENV: OnceLock<minijinja::Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = minijinja::Environment::new();
        // `.html` names turn on HTML auto-escaping.
        for (name, source) in TEMPLATES {
            if let Err(e) = env.add_template(name, source) {
                tracing::error!(template = name, error = %e, "console template does not compile");
            }
        }
        env
    })
}

/// A page rendered from `name`; a template error is logged and shown as a
/// plain message (it is a bug, never the user's input).
pub fn render_page(name: &str, ctx: minijinja::Value) -> Html<String> {
    let rendered = templates().get_template(name).and_then(|t| t.render(ctx));
    match rendered {
        Ok(html) => Html(html),
        Err(e) => {
            tracing::error!(
                template = name,
                error = format!("{e:#}"),
                "cannot render a console page"
            );
            Html("<!doctype html><title>onejob</title><p>This page could not be drawn; the error is in the server log.</p>".to_string())
        }
    }
}

/// An API error on a console page: same status, the message as text.
pub fn error_page(e: ApiError) -> Response {
    let status = e.status_code();
    if status.is_server_error() {
        let _ = e.into_response(); // logs the cause once, as the API does
        return refused(status, "internal error; the cause is in the server log");
    }
    refused(status, &e.to_string())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/overview") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/overview") }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/assets/console.css", get(css))
        .route("/ui/overview", get(overview::page))
        .route("/ui/jobs", get(jobs::list))
        .route("/ui/jobs/{id}", get(jobs::show))
        .route("/ui/review", get(review::page))
        .route("/ui/jobs/{id}/resolve", post(review::resolve_job))
        .route("/ui/attempts/{id}/resolve", post(review::resolve_attempt))
        .route("/ui/providers", get(providers::page))
        .route("/ui/providers/{name}/switch", post(providers::switch))
        .route(
            "/ui/providers/{name}/contracts",
            post(providers::run_contracts),
        )
        .route("/ui/contract-runs/{id}", get(providers::contract_run))
        .route("/ui/webhooks", get(webhooks::page).post(webhooks::create))
        .route("/ui/webhooks/{id}/rotate", post(webhooks::rotate))
        .route("/ui/webhooks/{id}/delete", post(webhooks::delete))
        .route(
            "/ui/webhooks/{id}/deliveries/{delivery_id}/redeliver",
            post(webhooks::redeliver),
        )
}

/// The console's forms are read by axum's `Form`, which waits for a body as
/// long as the client takes: the body is read here first, whole, within
/// `body_read_timeout` and `max_body_bytes` (as the API's `LimitedBody`),
/// so a client that trickles one cannot hold a request open.
pub(super) async fn read_body_within(
    limits: super::drain::DrainLimits,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        limits.max_time,
        axum::body::to_bytes(body, limits.max_bytes),
    )
    .await;
    match read {
        Ok(Ok(bytes)) => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            next.run(request).await
        }
        Ok(Err(_)) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the form is larger than {} bytes", limits.max_bytes),
        )
            .into_response(),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the form did not arrive within {} ms",
                limits.max_time.as_millis()
            ),
        )
            .into_response(),
    }
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        CSS,
    )
}

fn login_page(headers: &HeaderMap, status: StatusCode, error: Option<&str>) -> Response {
    let csrf = session::random_token();
    let page = render_page(
        "login.html",
        minijinja::context! { title => "Log in", csrf => csrf, error => error },
    );
    let mut response = (status, page).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(headers, LOGIN_CSRF_COOKIE, &csrf, 600),
    );
    response
}

async fn login_form(headers: HeaderMap) -> Response {
    login_page(&headers, StatusCode::OK, None)
}

#[derive(Deserialize)]
pub struct LoginForm {
    key: String,
    #[serde(default)]
    csrf: String,
}

async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<LoginForm>,
) -> Response {
    let expected = cookie(&headers, LOGIN_CSRF_COOKIE).unwrap_or_default();
    if expected.is_empty() || !session::same_token(&form.csrf, &expected) {
        return refused(
            StatusCode::FORBIDDEN,
            "invalid or missing CSRF token; reload the login page and try again",
        );
    }
    let key = form.key.trim();
    match crate::keys::authenticate(state.store.as_ref(), key).await {
        Ok(Some(caller)) if caller.is_admin => {
            let token = state.ui_sessions.open(key);
            tracing::info!(owner = %caller.owner_id, "console login");
            let mut response = Redirect::to("/ui/overview").into_response();
            let cookies = response.headers_mut();
            cookies.append(
                header::SET_COOKIE,
                set_cookie(
                    &headers,
                    SESSION_COOKIE,
                    &token,
                    session::SESSION_TTL.as_secs(),
                ),
            );
            cookies.append(
                header::SET_COOKIE,
                set_cookie(&headers, LOGIN_CSRF_COOKIE, "", 0),
            );
            response
        }
        Ok(Some(_)) => login_page(
            &headers,
            StatusCode::FORBIDDEN,
            Some("This key is not an admin key; the console needs one."),
        ),
        Ok(None) => login_page(&headers, StatusCode::UNAUTHORIZED, Some("Unknown key.")),
        Err(e) => error_page(e.into()),
    }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(state): State<AppState>,
    admin: UiAdmin,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    state.ui_sessions.close(&admin.token);
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&headers, SESSION_COOKIE, "", 0),
    );
    response
}

/// What every page's layout needs.
pub fn layout(admin: &UiAdmin, title: &str, nav: &str) -> minijinja::Value {
    minijinja::context! {
        title => title,
        nav => nav,
        owner => admin.caller.owner_id,
        csrf => admin.csrf,
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC (5 min ago)`: when, and how long before `now`.
pub fn when_ago(ms: crate::domain::Millis, now: crate::domain::Millis) -> String {
    let ago = (now - ms).max(0) / 1000;
    let ago = match ago {
        0..=4 => "just now".to_string(),
        5..=59 => format!("{ago} s ago"),
        60..=3_599 => format!("{} min ago", ago / 60),
        3_600..=86_399 => format!("{} h ago", ago / 3_600),
        _ => format!("{} days ago", ago / 86_400),
    };
    format!("{} UTC ({ago})", when(ms))
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn when(ms: crate::domain::Millis) -> String {
    let text = crate::clock::rfc3339(ms);
    text.get(..19).unwrap_or(&text).replace('T', " ")
}

pub(super) fn breaker_text(
    state: &crate::domain::breaker::BreakerState,
    now: crate::domain::Millis,
) -> (String, &'static str) {
    match state {
        crate::domain::breaker::BreakerState::Closed {
            consecutive_failures,
        } => (
            format!("closed ({consecutive_failures} failures in a row)"),
            "enabled",
        ),
        crate::domain::breaker::BreakerState::Open { until } => (
            format!("open for {} more", timeline::span((until - now).max(0))),
            "disabled",
        ),
        crate::domain::breaker::BreakerState::HalfOpen { .. } => {
            ("half-open: probing".to_string(), "unknown")
        }
    }
}
