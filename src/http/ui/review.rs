//! The review queue and its decisions. Each decision asks for a reason and
//! goes through the same functions as `POST /v1/admin/jobs/{id}/resolve` and
//! `/v1/admin/attempts/{id}/resolve`, so it is refused and audited alike.

use super::form::ConsoleForm;
use super::session::{self, UiAdmin};
use super::{error_page, layout, render_page, when};
use crate::domain::{AttemptId, AttemptState, JobId, OwnerId};
use crate::http::admin_review::{decide_job, settle_attempt};
use crate::http::body;
use crate::http::error::ApiError;
use crate::http::AppState;
use crate::jobs;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};

/// Most items the page shows.
const MAX_ITEMS: i64 = 200;

#[derive(Serialize)]
struct UnknownAttempt {
    id: AttemptId,
    seq: i64,
    provider: String,
}

#[derive(Serialize)]
struct Item {
    job_id: JobId,
    owner: OwnerId,
    key: String,
    route: String,
    last_error: Option<String>,
    attempt_count: i64,
    last_attempt_at: Option<String>,
    since: String,
    unknown: Vec<UnknownAttempt>,
}

/// `GET /ui/review`
pub async fn page(State(state): State<AppState>, admin: UiAdmin) -> Response {
    let items = match state.store.list_review(MAX_ITEMS).await {
        Ok(items) => items,
        Err(e) => return error_page(e.into()),
    };
    let mut rows = Vec::with_capacity(items.len());
    for item in items {
        let attempts = match state.store.list_attempts(&item.job.id).await {
            Ok(a) => a,
            Err(e) => return error_page(e.into()),
        };
        rows.push(Item {
            unknown: attempts
                .into_iter()
                .filter(|a| a.state == AttemptState::Unknown)
                .map(|a| UnknownAttempt {
                    id: a.id,
                    seq: a.seq,
                    provider: a.provider,
                })
                .collect(),
            job_id: item.job.id,
            owner: item.job.owner_id,
            key: item.job.idempotency_key,
            route: item.job.route,
            last_error: item.job.last_error,
            attempt_count: item.job.attempt_count,
            last_attempt_at: item.last_attempt_at.map(when),
            since: when(item.job.updated_at),
        });
    }
    render_page(
        "review.html",
        minijinja::context! { items => rows, ..layout(&admin, "Review queue", "review") },
    )
    .into_response()
}

#[derive(Deserialize)]
pub struct ResolveJobForm {
    #[serde(default)]
    csrf: String,
    action: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    reason: String,
    /// Where to go after: a console path.
    #[serde(default)]
    back: String,
}

/// The form's result as JSON text, `None` when the field is empty (whether
/// the choice takes one is [`jobs::job_resolution`]'s to say).
fn result_json(text: &str) -> Result<Option<String>, ApiError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ApiError::InvalidRequest(format!("result: not JSON: {e}")))?;
    Ok(Some(value.to_string()))
}

fn back_to(back: &str, default: &str) -> Redirect {
    // Only console paths: never an open redirect.
    if back.starts_with("/ui/") && !back.starts_with("/ui//") {
        Redirect::to(back)
    } else {
        Redirect::to(default)
    }
}

/// `POST /ui/jobs/{id}/resolve`
pub async fn resolve_job(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<JobId>,
    ConsoleForm(form): ConsoleForm<ResolveJobForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    let decided = async {
        let reason = body::reason(&form.reason)?;
        let resolution = jobs::job_resolution(&form.action, result_json(&form.result)?)?;
        decide_job(&state, &admin.caller, &id, resolution, reason).await
    }
    .await;
    match decided {
        Ok(_) => back_to(&form.back, "/ui/review").into_response(),
        Err(e) => error_page(e),
    }
}

#[derive(Deserialize)]
pub struct ResolveAttemptForm {
    #[serde(default)]
    csrf: String,
    outcome: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    back: String,
}

/// `POST /ui/attempts/{id}/resolve`
pub async fn resolve_attempt(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<AttemptId>,
    ConsoleForm(form): ConsoleForm<ResolveAttemptForm>,
) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return session::csrf_refused();
    }
    let settled = async {
        let reason = body::reason(&form.reason)?;
        let resolution = jobs::attempt_resolution(&form.outcome, result_json(&form.result)?)?;
        settle_attempt(&state, &admin.caller, &id, resolution, reason).await
    }
    .await;
    match settled {
        Ok(job) => back_to(&form.back, &format!("/ui/jobs/{}", job.id)).into_response(),
        Err(e) => error_page(e),
    }
}
