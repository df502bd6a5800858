//! Who is calling: `Authorization: Bearer <key>`, resolved to an owner.
//! Verified keys are cached briefly so the replay path stays one read.

use super::error::ApiError;
use super::AppState;
use crate::keys::{authenticate, Caller};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CACHE_TTL: Duration = Duration::from_secs(30);
const CACHE_MAX: usize = 10_000;

/// Positive lookups only: an unknown key always goes to the database.
#[derive(Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<String, (Caller, Instant)>>,
}

impl KeyCache {
    fn get(&self, key: &str) -> Option<Caller> {
        let entries = self.entries.lock().ok()?;
        entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(c, _)| c.clone())
    }

    fn put(&self, key: &str, caller: &Caller) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= CACHE_MAX {
                entries.clear();
            }
            entries.insert(key.to_string(), (caller.clone(), Instant::now()));
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let presented = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(ApiError::Unauthorized)?;
        if let Some(caller) = state.keys.get(presented) {
            return Ok(caller);
        }
        let caller = authenticate(state.store.as_ref(), presented)
            .await?
            .ok_or(ApiError::Unauthorized)?;
        state.keys.put(presented, &caller);
        Ok(caller)
    }
}

/// A caller holding an admin key.
pub struct Admin(pub Caller);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if !caller.is_admin {
            return Err(ApiError::Forbidden);
        }
        Ok(Admin(caller))
    }
}
