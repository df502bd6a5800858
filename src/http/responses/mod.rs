//! OpenAI's Responses door: `POST /v1/responses`, `GET` and `DELETE
//! /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` and `GET
//! /v1/responses/{id}/input_items`, so `client.responses` of the official
//! SDKs works unchanged.
//!
//! A response is a job. Its id is the job id (`resp_` and the id without
//! its dashes), so every replay of a key has the same one, and it resolves
//! only for the job's owner: another owner's id is a 404 like an unknown
//! one. `Idempotency-Key` is required as on every door that makes a job;
//! retrieve, delete, cancel and input_items make none and need none.
//! `background: true` answers at once (`queued`/`in_progress`): the job is
//! in the database and runs whether or not this process lives, retrieve
//! polls it, cancel cancels it. `previous_response_id` rebuilds the
//! conversation from the stored jobs (the previous job's turns, its
//! instructions left out, then its answer). `store: false` hides the
//! response from retrieve and `previous_response_id`; the job stays durable.
//!
//! The dialect decodes (`decode`), the shared pipeline (`http::door`)
//! submits and settles, and the dialect encodes the Response (`encode`),
//! the stream (`stream`) and the errors (`error`).

mod decode;
mod encode;
mod error;
mod input;
mod items;
mod stream;

pub use error::ResponsesError;

use super::door::{self, LimitedBody, Settled};
use super::error::ApiError;
use super::AppState;
use crate::domain::request::IdempotencyKey;
use crate::domain::{Job, JobState};
use crate::jobs;
use crate::keys::Caller;
use crate::store::{event, NewEvent, Refusal};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use encode::{Shown, Stored};
use serde_json::{json, Value};

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Result<LimitedBody, ApiError>,
) -> Result<Response, ResponsesError> {
    let caller = caller?;
    let LimitedBody(raw) = body?;
    let mut arrival = door::arrive(&state, caller, &headers)?;
    let mut decoded = decode::decode(&raw)?;
    if let Some(given) = decoded.references() {
        let items = resolve_references(&state, &arrival.caller, given).await?;
        decoded.resolved(items)?;
    }
    let history = match &decoded.previous_response_id {
        Some(id) => previous_turns(&state, &arrival.caller, id).await?,
        None => Vec::new(),
    };
    let request = decoded
        .request(history)
        .map_err(|e| error::submit(jobs::SubmitError::from(e).into()))?;
    // A previous response's turns are part of the job, but need no place in
    // its digest: only a completed response (which never changes) can be
    // continued, and its id is in the bytes.
    let job_body = door::JobBody::decoded("openai.responses", &raw, request);
    if decoded.stream {
        let opened = door::open_stream(&state, &mut arrival, &job_body, &headers)
            .await
            .map_err(error::submit)?;
        let first_model = model_now(
            &state,
            &Settled {
                job: opened.job.clone(),
                attempts: Vec::new(),
                replayed: false,
            },
        );
        let encoder = stream::Encoder::new(&opened.job, first_model);
        return Ok(door::stream_response(opened, &arrival.key, encoder)?);
    }
    if decoded.background {
        arrival
            .key_body(&state, &job_body)
            .await
            .map_err(error::submit)?;
        let submission = door::submit(&state, &arrival, &job_body)
            .await
            .map_err(error::submit)?;
        let settled = settle(&state, submission.job, submission.replayed).await?;
        return Ok(shown_response(&state, &settled, Some(&arrival.key))?);
    }
    let settled = door::run(&state, &mut arrival, &job_body, &headers)
        .await
        .map_err(error::submit)?;
    // Cancelled: the Response as it is. Still running after the wait: a
    // 504 the SDK retries with the same key; failed: the error it is.
    if settled.job.state == JobState::Cancelled {
        return Ok(shown_response(&state, &settled, Some(&arrival.key))?);
    }
    let response = door::respond(
        &state,
        &settled,
        &arrival.key,
        |job, answer| Json(encode::response(job, Shown::answered(job, answer))).into_response(),
        |refused| encode::refusal(refused).into_response(),
    )?;
    Ok(response)
}

/// `?stream=true&starting_after=N` of a retrieve.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RetrieveQuery {
    #[serde(default)]
    stream: bool,
    starting_after: Option<u64>,
}

/// `GET /v1/responses/{id}`: the Response as its job is now; with
/// `stream=true`, its events once it is final (the stored answer, so the
/// same events, with the same sequence numbers, on every reading), from
/// past `starting_after`.
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
    query: Result<Query<RetrieveQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ResponsesError> {
    let caller = caller?;
    let Query(query) = query.map_err(|e| ResponsesError::invalid("query", e.body_text()))?;
    let job = find(&state, &caller, &id, None).await?;
    if query.stream {
        let opened = door::open_existing(&state, job, &headers).await?;
        let model = model_now(
            &state,
            &Settled {
                job: opened.job.clone(),
                attempts: Vec::new(),
                replayed: false,
            },
        );
        let encoder = stream::Encoder::new(&opened.job, model).starting_after(query.starting_after);
        let key = own_key(&opened.job)?;
        return Ok(door::stream_response(opened, &key, encoder)?);
    }
    let settled = settle(&state, job, false).await?;
    Ok(shown_response(&state, &settled, None)?)
}

/// `POST /v1/responses/{id}/cancel`: no more attempts; an attempt in flight
/// loses its compare-and-swap. A cancelled response answers the same
/// again; a finished one cannot be cancelled.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
) -> Result<Response, ResponsesError> {
    let caller = caller?;
    let job = find(&state, &caller, &id, None).await?;
    let cancelled = state
        .store
        .cancel_job(
            &job.id,
            &caller.owner_id,
            "cancelled by owner (POST /v1/responses/…/cancel)",
            state.clock.now_ms(),
        )
        .await
        .map_err(ApiError::from)?;
    let job = match cancelled {
        Ok(job) => job,
        Err(Refusal::Finished(_)) => {
            let now = state
                .store
                .get_job(&job.id)
                .await
                .map_err(ApiError::from)?
                .unwrap_or(job);
            if now.state != JobState::Cancelled {
                return Err(ResponsesError::new(
                    StatusCode::BAD_REQUEST,
                    "response_not_cancellable",
                    format!(
                        "Cannot cancel a response that is {}.",
                        encode::status_of(&now)
                    ),
                ));
            }
            now
        }
        Err(other) => return Err(ApiError::from(other).into()),
    };
    let settled = settle(&state, job, false).await?;
    Ok(shown_response(&state, &settled, None)?)
}

/// `DELETE /v1/responses/{id}`: the response is no longer shown (retrieve,
/// input_items and `previous_response_id` answer 404). The job stays, as
/// every job does: it is the record of what ran.
pub async fn delete(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ResponsesError> {
    let caller = caller?;
    let job = find(&state, &caller, &id, None).await?;
    state
        .store
        .record_event(NewEvent {
            job_id: job.id.clone(),
            attempt_id: None,
            kind: event::RESPONSE_DELETED,
            actor: caller.owner_id.to_string(),
            detail: None,
            at: state.clock.now_ms(),
        })
        .await
        .map_err(ApiError::from)?;
    Ok(Json(
        json!({"id": encode::response_id(&job.id), "object": "response", "deleted": true}),
    ))
}

/// `GET /v1/responses/{id}/input_items`: the response's own input items
/// (not those of a previous response), newest first unless `order=asc`.
pub async fn input_items(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
    page: Result<Query<items::Page>, QueryRejection>,
) -> Result<Json<Value>, ResponsesError> {
    let caller = caller?;
    let Query(page) = page.map_err(|e| ResponsesError::invalid("query", e.body_text()))?;
    let job = find(&state, &caller, &id, None).await?;
    Ok(Json(items::list(&job, &page)?))
}

/// The caller's shown response `id` as its job; 404 in OpenAI's shape for
/// an unknown id, another owner's, one not stored or deleted.
async fn find(
    state: &AppState,
    caller: &Caller,
    id: &str,
    param: Option<&str>,
) -> Result<Job, ResponsesError> {
    let not_found = || ResponsesError::response_not_found(id, param);
    let Some(job_id) = encode::job_id_of(id) else {
        return Err(not_found());
    };
    let job = jobs::find_for(state.store.as_ref(), caller, &job_id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(not_found)?;
    if !Stored::of(&job).is_shown() {
        return Err(not_found());
    }
    let deleted = state
        .store
        .has_event(&job.id, event::RESPONSE_DELETED.as_str())
        .await
        .map_err(ApiError::from)?;
    if deleted {
        return Err(not_found());
    }
    Ok(job)
}

/// The turns a response continues from `previous_response_id`: the
/// previous job's turns without its instructions, then its answer.
async fn previous_turns(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Vec<Value>, ResponsesError> {
    let job = find(state, caller, id, Some("previous_response_id")).await?;
    if job.state != JobState::Succeeded {
        return Err(ResponsesError {
            param: Some("previous_response_id".into()),
            ..ResponsesError::new(
                StatusCode::BAD_REQUEST,
                "previous_response_not_completed",
                format!(
                    "previous_response_id: response '{id}' is {}; only a completed response can be continued",
                    encode::status_of(&job)
                ),
            )
        });
    }
    let stored = Stored::of(&job);
    let mut turns: Vec<Value> = stored.request["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if stored
        .echo
        .get("instructions")
        .is_some_and(Value::is_string)
        && !turns.is_empty()
    {
        turns.remove(0);
    }
    let (text, calls) = door::result_parts(&job);
    let mut turn = json!({"role": "assistant", "content": text.unwrap_or_default()});
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
    }
    turns.push(turn);
    Ok(turns)
}

/// Input items with each `item_reference` replaced by the item it names,
/// as OpenAI resolves them: an output item of one of the caller's
/// completed responses (`msg_…`, `fc_…_N`, the ids a Response shows; the
/// AI SDK sends these when a response was stored), or one of a response's
/// own input items (`…_inN`, as `input_items` lists them). A response's
/// items never change once it completed, so the job's request is the same
/// on every retry.
async fn resolve_references(
    state: &AppState,
    caller: &Caller,
    items: &[Value],
) -> Result<Vec<Value>, ResponsesError> {
    let mut resolved = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if item["type"] != "item_reference" {
            resolved.push(item.clone());
            continue;
        }
        let field = format!("input[{i}]");
        if let Some(key) = item
            .as_object()
            .and_then(|o| o.keys().find(|k| !matches!(k.as_str(), "type" | "id")))
        {
            return Err(ResponsesError::unsupported(
                &format!("{field}.{key}"),
                "not supported by onejob",
            ));
        }
        let Some(id) = item["id"].as_str() else {
            return Err(ResponsesError::invalid(
                &format!("{field}.id"),
                "a string is required",
            ));
        };
        let param = format!("{field}.id");
        let not_found = || ResponsesError::item_not_found(id, &param);
        let Some((hex, which)) = encode::item_id_parts(id) else {
            return Err(not_found());
        };
        let job = find(state, caller, &format!("resp_{hex}"), None)
            .await
            .map_err(|_| not_found())?;
        let found = match which {
            encode::ItemOf::Output => {
                if job.state != JobState::Succeeded {
                    return Err(not_found());
                }
                let (text, tool_calls) = door::result_parts(&job);
                let answer = door::Answer {
                    text,
                    tool_calls,
                    usage: Default::default(),
                    model: String::new(),
                    // Only the items are read.
                    finish: crate::domain::FinishReason::Stop,
                };
                encode::output_items(&job, &answer)
                    .into_iter()
                    .find(|item| item["id"] == id)
            }
            encode::ItemOf::Input(n) => Stored::of(&job)
                .echo
                .get("input")
                .and_then(|given| given.get(n))
                .map(|given| items::full_item(hex, n, given))
                .filter(|item| item["id"] == id),
        };
        resolved.push(found.ok_or_else(not_found)?);
    }
    Ok(resolved)
}

/// A job with its attempts, as the door answers it.
async fn settle(state: &AppState, job: Job, replayed: bool) -> Result<Settled, ResponsesError> {
    let attempts = state
        .store
        .list_attempts(&job.id)
        .await
        .map_err(ApiError::from)?;
    Ok(Settled {
        job,
        attempts,
        replayed,
    })
}

/// The Response of a job as it is now, whatever its state, with the job
/// headers. `key`: the request's key; a call that makes no job names the
/// job's own.
fn shown_response(
    state: &AppState,
    settled: &Settled,
    key: Option<&door::DoorKey>,
) -> Result<Response, ApiError> {
    let job = &settled.job;
    let own;
    let key = match key {
        Some(key) => key,
        None => {
            own = own_key(job)?;
            &own
        }
    };
    door::respond(
        state,
        settled,
        key,
        |job, answer| Json(encode::response(job, Shown::answered(job, answer))).into_response(),
        |refused| {
            let error = match refused.why {
                door::Refusal::Pending | door::Refusal::Cancelled => Value::Null,
                _ => encode::failure(&refused),
            };
            let model = model_now(state, settled);
            Json(encode::response(
                job,
                Shown::without_answer(job, model, error),
            ))
            .into_response()
        },
    )
}

/// The model a Response without an answer names: the one that answered,
/// else the one its latest attempt asked, else the one its route's primary
/// will ask — a provider's model, never the route's name.
fn model_now(state: &AppState, settled: &Settled) -> String {
    let job = &settled.job;
    if settled.winner().is_some() {
        return door::answering_model(state, job, settled.winner());
    }
    let provider = match settled.attempts.last() {
        Some(attempt) => Some(attempt.provider.as_str()),
        None => state
            .config
            .routes
            .get(&job.route)
            .map(|r| r.primary.as_str()),
    };
    provider
        .and_then(|p| state.providers.get(p))
        .map(|p| p.config.model.clone())
        .unwrap_or_else(|| job.route.clone())
}

/// The job's own key, for the headers of a call that makes no job.
fn own_key(job: &Job) -> Result<door::DoorKey, ApiError> {
    Ok(door::DoorKey::client(
        IdempotencyKey::parse(job.idempotency_key.as_bytes())
            .map_err(|e| ApiError::Internal(anyhow::anyhow!(e)))?,
    ))
}
