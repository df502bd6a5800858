//! OpenAI's Chat Completions door: `POST /v1/chat/completions` and
//! `GET /v1/models`, so the official SDKs work unchanged.
//!
//! `model` names a route; `GET /v1/models` lists the routes (the router
//! sends a request that speaks Anthropic's API to the Messages door's
//! Models API instead, [`crate::http::router`]). The
//! `Idempotency-Key` header is required as on `POST /v1/jobs` (the SDKs pass
//! it with `extra_headers`), unless `[server] idempotency = "optional"`: a
//! keyless call then gets a fresh key, echoed in the `Idempotency-Key`
//! response header. The call runs a job, holds until it is final, and
//! answers as OpenAI would: `model` names the model that answered, and
//! `x-onejob-job-id`, `x-onejob-provider`, `x-onejob-attempt` say which job
//! and attempt. Errors are in OpenAI's shape (`message`, `type`, `param`,
//! `code`), with the provider's code kept and `x-should-retry` always set.
//!
//! The dialect decodes (`decode`), the shared pipeline (`http::door`)
//! submits and settles, and the dialect encodes the answer (`encode`), the
//! stream (`stream`) and the errors (`error`).

mod decode;
mod encode;
mod error;
mod stream;

pub use error::CompatError;

use super::door::{self, LimitedBody};
use super::error::ApiError;
use super::AppState;
use crate::keys::Caller;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub async fn create(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Result<LimitedBody, ApiError>,
) -> Result<Response, CompatError> {
    let caller = caller?;
    let LimitedBody(raw) = body?;
    let mut arrival = door::arrive(&state, caller, &headers)?;
    let decoded = decode::decode(&raw)?;
    let job_body = door::JobBody::decoded("openai.chat", &raw, decoded.request);
    if let Some(ask) = decoded.stream {
        let opened = door::open_stream(&state, &mut arrival, &job_body, &headers)
            .await
            .map_err(CompatError::submitted)?;
        let renderer = stream::Renderer::new(&opened.job, ask, &headers);
        return Ok(door::stream_response(opened, &arrival.key, renderer)?);
    }
    let settled = door::run(&state, &mut arrival, &job_body, &headers)
        .await
        .map_err(CompatError::submitted)?;
    let response = door::respond(
        &state,
        &settled,
        &arrival.key,
        |job, answer| encode::completion(job, answer).into_response(),
        |refused| encode::refusal(refused).into_response(),
    )?;
    Ok(response)
}

/// `GET /v1/models`: the routes, as OpenAI models.
pub async fn list_models(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<Json<Value>, CompatError> {
    caller?;
    let data: Vec<Value> = state.config.routes.keys().map(|name| model(name)).collect();
    Ok(Json(json!({ "object": "list", "data": data })))
}

/// `GET /v1/models/{model}`: one route, as an OpenAI model.
pub async fn show_model(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
) -> Result<Json<Value>, CompatError> {
    caller?;
    if !state.config.routes.contains_key(&name) {
        return Err(CompatError::model_not_found(format!(
            "no route named {name:?} on this server"
        )));
    }
    Ok(Json(model(&name)))
}

fn model(route: &str) -> Value {
    json!({ "id": route, "object": "model", "created": 0, "owned_by": "onejob" })
}
