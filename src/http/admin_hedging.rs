//! `GET /v1/admin/routes/{name}/hedging` (admin key only): the silence
//! threshold in force for each provider of a route (learned or the fixed
//! `silence_ms`), its samples, and the cost of hedging over the route's
//! window: hedge rate, win rate, hedges the budget denied, latency saved
//! and tokens spent on discarded attempts. Read from the engine, which
//! holds what every instance shared (`engine::hedging`).

use super::auth::Admin;
use super::error::ApiError;
use super::AppState;
use crate::engine::hedging::RouteHedging;
use axum::extract::{Path, State};
use axum::Json;

pub async fn show(
    State(state): State<AppState>,
    _admin: Admin,
    Path(name): Path<String>,
) -> Result<Json<RouteHedging>, ApiError> {
    let engine = state
        .engine
        .as_ref()
        .ok_or(ApiError::NotFound("hedging (this server runs no engine)"))?;
    engine
        .hedging(&name)
        .map(Json)
        .ok_or(ApiError::NotFound("route"))
}
