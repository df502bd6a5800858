//! The job list (filters, newest first, keyset-paged) and each job's page:
//! its timeline, attempts and event log.

use super::form::ConsoleQuery;
use super::session::UiAdmin;
use super::{error_page, layout, render_page, timeline, when};
use crate::domain::{AttemptId, AttemptState, JobId, JobState, Millis, OwnerId};
use crate::http::error::ApiError;
use crate::http::AppState;
use crate::store::console::JobFilter;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// Rows per page.
pub const PAGE: i64 = 50;

/// The filter form, as the browser sends it (empty fields are no filter).
#[derive(Debug, Default, Deserialize, Serialize, Clone)]
pub struct ListQuery {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub route: String,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub owner: String,
    /// `YYYY-MM-DDTHH:MM` (UTC), as a `datetime-local` input sends it.
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub key: String,
    /// `CREATED_AT:ID` of the last row of the previous page.
    #[serde(default)]
    pub before: String,
}

fn some(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// A `datetime-local` value (UTC) as milliseconds since the epoch.
fn parse_time(field: &str, text: &str) -> Result<Option<Millis>, ApiError> {
    let Some(t) = some(text) else {
        return Ok(None);
    };
    let mut normal = t.replace('T', " ");
    if normal.len() == 16 {
        normal.push_str(":00");
    }
    humantime::parse_rfc3339_weak(&normal)
        .ok()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| Some(d.as_millis() as Millis))
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "{field}: expected a time like 2026-11-30T17:00 (UTC)"
            ))
        })
}

impl ListQuery {
    pub fn filter(&self) -> Result<JobFilter, ApiError> {
        let state = match some(&self.state) {
            Some(s) if JobState::parse(&s).is_none() => {
                return Err(ApiError::InvalidRequest(format!(
                    "state: unknown state {s:?}"
                )))
            }
            other => other,
        };
        let before = match some(&self.before) {
            None => None,
            Some(cursor) => {
                let parsed = cursor
                    .split_once(':')
                    .and_then(|(at, id)| Some((at.parse::<Millis>().ok()?, id.to_string())));
                Some(parsed.ok_or_else(|| {
                    ApiError::InvalidRequest("before: not a page cursor".to_string())
                })?)
            }
        };
        Ok(JobFilter {
            state,
            route: some(&self.route),
            provider: some(&self.provider),
            owner: some(&self.owner).map(OwnerId::from),
            created_from: parse_time("from", &self.from)?,
            created_to: parse_time("to", &self.to)?,
            key_prefix: some(&self.key),
            before,
        })
    }

    /// This query's link with another cursor.
    fn link(&self, before: Option<String>) -> String {
        let mut next = self.clone();
        next.before = before.unwrap_or_default();
        let pairs = [
            ("state", &next.state),
            ("route", &next.route),
            ("provider", &next.provider),
            ("owner", &next.owner),
            ("from", &next.from),
            ("to", &next.to),
            ("key", &next.key),
            ("before", &next.before),
        ];
        let query: Vec<String> = pairs
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", url_encode(v)))
            .collect();
        format!("/ui/jobs?{}", query.join("&"))
    }
}

pub fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Serialize)]
struct Row {
    id: JobId,
    state: &'static str,
    route: String,
    owner: OwnerId,
    key: String,
    attempts: i64,
    created: String,
    updated: String,
    last_error: Option<String>,
}

/// `GET /ui/jobs`
pub async fn list(
    State(state): State<AppState>,
    admin: UiAdmin,
    ConsoleQuery(query): ConsoleQuery<ListQuery>,
) -> Response {
    let filter = match query.filter() {
        Ok(f) => f,
        Err(e) => return error_page(e),
    };
    // One row more than shown says whether there is a next page.
    let mut jobs = match state.store.list_jobs(&filter, PAGE + 1).await {
        Ok(jobs) => jobs,
        Err(e) => return error_page(e.into()),
    };
    let more = jobs.len() as i64 > PAGE;
    jobs.truncate(PAGE as usize);
    let next = more
        .then(|| {
            jobs.last()
                .map(|j| query.link(Some(format!("{}:{}", j.created_at, j.id))))
        })
        .flatten();
    let rows: Vec<Row> = jobs
        .into_iter()
        .map(|j| Row {
            state: j.state.as_str(),
            created: when(j.created_at),
            updated: when(j.updated_at),
            id: j.id,
            route: j.route,
            owner: j.owner_id,
            key: j.idempotency_key,
            attempts: j.attempt_count,
            last_error: j.last_error,
        })
        .collect();
    let states = [
        "pending",
        "running",
        "succeeded",
        "failed",
        "needs_review",
        "cancelled",
    ];
    let routes: Vec<&String> = state.config.routes.keys().collect();
    let providers: Vec<&str> = state.providers.names().collect();
    render_page(
        "jobs.html",
        minijinja::context! {
            rows => rows,
            q => query,
            states => states,
            routes => routes,
            providers => providers,
            next => next,
            first => (!query.before.is_empty()).then(|| query.link(None)),
            ..layout(&admin, "Jobs", "jobs")
        },
    )
    .into_response()
}

#[derive(Serialize)]
struct AttemptRow {
    id: AttemptId,
    seq: i64,
    kind: &'static str,
    provider: String,
    state: &'static str,
    ending: String,
    ending_class: &'static str,
    started: String,
    took: Option<String>,
    error: Option<String>,
    usage: Option<String>,
    unknown: bool,
}

#[derive(Serialize)]
struct EventRow {
    at: String,
    offset: String,
    kind: String,
    attempt: Option<AttemptId>,
    actor: String,
    detail: Option<String>,
}

/// `GET /ui/jobs/{id}`
pub async fn show(
    State(state): State<AppState>,
    admin: UiAdmin,
    Path(id): Path<JobId>,
) -> Response {
    let job = match state.store.get_job(&id).await {
        Ok(Some(job)) => job,
        Ok(None) => return error_page(ApiError::NotFound("job")),
        Err(e) => return error_page(e.into()),
    };
    let (attempts, events) = match (
        state.store.list_attempts(&id).await,
        state.store.list_events(&id).await,
    ) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => return error_page(e.into()),
    };
    let route = state.config.routes.get(&job.route);
    let now = state.clock.now_ms();
    let svg = timeline::draw(
        &job,
        &attempts,
        &events,
        route.map(|r| r.silence_ms),
        route.map(|r| r.attempt_timeout_ms),
        now,
    );
    let attempt_rows: Vec<AttemptRow> = attempts
        .iter()
        .map(|a| {
            let ending = timeline::ending(&job, a, &events);
            AttemptRow {
                id: a.id.clone(),
                seq: a.seq,
                kind: a.kind.as_str(),
                provider: a.provider.clone(),
                state: a.state.as_str(),
                ending: ending.label,
                ending_class: ending.class,
                started: format!("+{}", timeline::span(a.started_at - job.created_at)),
                took: a.finished_at.map(|f| timeline::span(f - a.started_at)),
                error: a
                    .error_kind
                    .as_ref()
                    .map(|k| format!("{k}: {}", a.error_message.as_deref().unwrap_or(""))),
                usage: a.usage.clone(),
                unknown: a.state == AttemptState::Unknown,
            }
        })
        .collect();
    let event_rows: Vec<EventRow> = events
        .into_iter()
        .map(|e| EventRow {
            at: when(e.at),
            offset: format!("+{}", timeline::span(e.at - job.created_at)),
            kind: e.kind.to_string(),
            attempt: e.attempt_id,
            actor: e.actor,
            detail: e.detail,
        })
        .collect();
    let reviewable = matches!(
        job.state,
        JobState::NeedsReview | JobState::Running | JobState::Pending
    );
    render_page(
        "job.html",
        minijinja::context! {
            job => minijinja::context! {
                id => job.id,
                state => job.state.as_str(),
                route => job.route,
                owner => job.owner_id,
                key => job.idempotency_key,
                version => job.version,
                completed_by => job.completed_by,
                last_error => job.last_error,
                result => job.result,
                created => when(job.created_at),
                updated => when(job.updated_at),
            },
            reviewable => reviewable,
            timeline => minijinja::Value::from_safe_string(svg),
            attempts => attempt_rows,
            events => event_rows,
            silence => route.map(|r| timeline::span(r.silence_ms as i64)),
            timeout => route.map(|r| timeline::span(r.attempt_timeout_ms as i64)),
            ..layout(&admin, &format!("Job {id}"), "jobs")
        },
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_filter_is_a_clear_error() {
        let q = ListQuery {
            state: "nope".into(),
            ..Default::default()
        };
        assert!(q.filter().unwrap_err().to_string().contains("state"));
        let q = ListQuery {
            from: "yesterday".into(),
            ..Default::default()
        };
        assert!(q.filter().unwrap_err().to_string().contains("from"));
        let q = ListQuery {
            from: "2026-11-30T17:00".into(),
            before: "5:abc".into(),
            ..Default::default()
        };
        let f = q.filter().unwrap();
        assert_eq!(f.created_from, Some(1_796_058_000_000));
        assert_eq!(f.before, Some((5, "abc".to_string())));
    }
}
