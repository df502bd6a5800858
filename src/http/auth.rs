//! Who is calling: `Authorization: Bearer <key>` (or `x-api-key: <key>`,
//! as Anthropic's SDKs send it), resolved to an owner.
//! Live keys are cached (see [`crate::tenants`]): the replay path stays
//! one read, and a revoked key is refused by every server within a second.

use super::error::{ApiError, KeyHeader};
use super::AppState;
use crate::keys::Caller;
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::HeaderMap;

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let (presented, header) = presented_key(&parts.headers);
        let refused = || ApiError::Unauthorized(header);
        let presented = presented.ok_or_else(refused)?;
        let caller = state
            .tenants
            .authenticate(presented)
            .await?
            .ok_or_else(refused)?;
        super::refusals::note_owner(&caller.owner_id);
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

/// The key a request presents and the header it came in:
/// `Authorization: Bearer` first, else `x-api-key` (as Anthropic's SDKs
/// send it). The one reading of the credentials headers, so a refusal
/// names the header the key was read from.
pub fn presented_key(headers: &HeaderMap) -> (Option<&str>, KeyHeader) {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    if let Some(key) = bearer {
        return (Some(key.trim()), KeyHeader::Bearer);
    }
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) => (Some(key.trim()), KeyHeader::XApiKey),
        // An `x-api-key` that is not text is a key that was sent, and wrong.
        None if headers.contains_key("x-api-key") => (None, KeyHeader::XApiKey),
        None => (None, KeyHeader::Missing),
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme's
/// name is case-insensitive (RFC 9110, section 11.1), so `bearer` is one too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer oj_1", "bearer oj_1", "BEARER oj_1"] {
            assert_eq!(bearer_token(value), Some("oj_1"), "{value}");
        }
        for value in ["Basic oj_1", "Bearer", "Beareroj_1", "oj_1"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
