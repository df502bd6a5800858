//! Anthropic's Models API on `GET /v1/models` and `GET /v1/models/{model}`:
//! the routes as Anthropic's `ModelInfo`, listed in its pages. The paths
//! serve both SDKs; the router sends here a request that speaks
//! Anthropic's API ([`crate::http::speaks_anthropic`]) and any other to
//! the OpenAI door's.

use super::AnthropicError;
use crate::http::error::ApiError;
use crate::http::AppState;
use crate::keys::Caller;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

/// A query string as its pairs, in order (`lifecycle[]` repeats).
pub type Pairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The most a page lists, and how many when `limit` is not sent.
const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 20;

/// `GET /v1/models`: the routes, by name, a page of them: `limit` (1 to
/// 1000, default 20) after `after_id` or before `before_id` (a route's
/// name), filtered by `lifecycle[]` (every route is `active`).
pub async fn list(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    query: Pairs,
) -> Result<Json<Value>, AnthropicError> {
    caller?;
    let Query(pairs) = query.map_err(|e| AnthropicError::invalid("query", e.body_text()))?;
    let page = Page::of(&pairs)?;
    let names: Vec<&String> = state.config.routes.keys().filter(|_| page.active).collect();
    let (data, has_more) = match (&page.after, &page.before) {
        (_, Some(before)) => {
            let earlier: Vec<&String> = names.into_iter().filter(|n| *n < before).collect();
            let from = earlier.len().saturating_sub(page.limit);
            (earlier[from..].to_vec(), from > 0)
        }
        (after, None) => {
            let later: Vec<&String> = names
                .into_iter()
                .filter(|n| after.as_ref().is_none_or(|a| *n > a))
                .collect();
            let more = later.len() > page.limit;
            (later.into_iter().take(page.limit).collect(), more)
        }
    };
    Ok(Json(json!({
        "data": data.iter().map(|n| model_info(n)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": data.first(),
        "last_id": data.last(),
    })))
}

/// `GET /v1/models/{model}`: one route, or Anthropic's 404.
pub async fn show(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
) -> Result<Json<Value>, AnthropicError> {
    caller?;
    if !state.config.routes.contains_key(&name) {
        return Err(AnthropicError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("model: no route named {name:?} on this server"),
        ));
    }
    Ok(Json(model_info(&name)))
}

/// A route as Anthropic's `ModelInfo`. A route has no release date:
/// `created_at` is the epoch, as Anthropic's API says it for one unknown.
fn model_info(route: &str) -> Value {
    json!({
        "type": "model",
        "id": route,
        "display_name": route,
        "created_at": "1970-01-01T00:00:00Z",
        "lifecycle": "active",
    })
}

/// A list request's parameters, checked.
struct Page {
    limit: usize,
    after: Option<String>,
    before: Option<String>,
    /// The `lifecycle` filter takes `active` models (it does unless sent
    /// without it).
    active: bool,
}

impl Page {
    fn of(pairs: &[(String, String)]) -> Result<Page, AnthropicError> {
        let mut page = Page {
            limit: DEFAULT_LIMIT,
            after: None,
            before: None,
            active: true,
        };
        let mut lifecycles = Vec::new();
        for (name, value) in pairs {
            match name.as_str() {
                "limit" => {
                    page.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            AnthropicError::invalid(
                                "limit",
                                format!("must be an integer from 1 to {MAX_LIMIT}, not {value:?}"),
                            )
                        })?
                }
                "after_id" => page.after = Some(value.clone()),
                "before_id" => page.before = Some(value.clone()),
                "lifecycle" | "lifecycle[]" => match value.as_str() {
                    "active" | "deprecated" | "retired" => lifecycles.push(value.as_str()),
                    other => {
                        return Err(AnthropicError::invalid(
                            "lifecycle",
                            format!("{other:?} is not one of active, deprecated, retired"),
                        ))
                    }
                },
                // Anything else changes nothing here.
                _ => {}
            }
        }
        if page.after.is_some() && page.before.is_some() {
            return Err(AnthropicError::invalid(
                "before_id",
                "send before_id or after_id, not both",
            ));
        }
        page.active = lifecycles.is_empty() || lifecycles.contains(&"active");
        Ok(page)
    }
}
