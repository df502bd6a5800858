//! Who is calling: `Authorization: Bearer <key>` (or `x-api-key: <key>`,
//! as Anthropic's SDKs send it), resolved to an owner.
//! Live keys are cached (see [`crate::tenants`]): the replay path stays
//! one read, and a revoked key is refused by every server within a second.

use super::error::ApiError;
use super::AppState;
use crate::keys::Caller;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // Anthropic's SDKs send the key as `x-api-key`.
        let presented = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .or_else(|| parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()))
            .map(str::trim)
            .ok_or(ApiError::Unauthorized)?;
        let caller = state
            .tenants
            .authenticate(presented)
            .await?
            .ok_or(ApiError::Unauthorized)?;
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
