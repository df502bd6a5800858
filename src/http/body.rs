//! JSON bodies of the admin and job-action endpoints: malformed JSON is a
//! 400 `malformed_json`; JSON of the wrong shape is a 422 `invalid_request`
//! naming the field. Query strings of the wrong shape are that 422 too.

use super::error::ApiError;
use crate::domain::json_error::path_error;
use crate::domain::reason::check_reason;
use serde::de::DeserializeOwned;

pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::MalformedJson(format!("body is not valid JSON: {e}")))?;
    // serde would read a struct from an array of its fields in order
    // (`["dave"]` as `{"owner": "dave"}`): every body here is an object.
    if !value.is_object() {
        return Err(ApiError::InvalidRequest(
            "body must be a JSON object".to_string(),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| ApiError::InvalidRequest(path_error(e)))
}

/// Like `parse`, but an empty body means the type's default.
pub fn parse_or_default<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse(body)
}

/// A required human reason (audited), trimmed, by the one rule
/// ([`check_reason`]): 1–500 characters.
pub fn reason(reason: &str) -> Result<&str, ApiError> {
    check_reason(reason).map_err(|e| ApiError::InvalidRequest(format!("reason: {e}")))
}

/// An `owner` filter of a query (`?owner=`), held to the owner rule: a
/// name no owner can have is refused, not answered with an empty list.
/// For `#[serde(default, deserialize_with = "body::owner_filter")]`.
pub fn owner_filter<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<crate::domain::OwnerId>, D::Error> {
    let name: Option<String> = serde::Deserialize::deserialize(deserializer)?;
    name.map(|n| crate::domain::OwnerId::parse_name(&n).map_err(serde::de::Error::custom))
        .transpose()
}

/// The owner a list asks for with `?owner=`, held to who asks: a key may
/// name its own owner; only an admin key may name another, which any other
/// key is refused (`403 forbidden`) rather than answered with its own
/// owner's data under another's name. `None`: nothing asked.
pub fn owner_asked<'a>(
    caller: &crate::keys::Caller,
    asked: Option<&'a crate::domain::OwnerId>,
) -> Result<Option<&'a crate::domain::OwnerId>, ApiError> {
    match asked {
        Some(owner) if !caller.is_admin && *owner != caller.owner_id => {
            Err(ApiError::OtherOwner(format!(
                "owner: this key belongs to owner {}; only an admin key may ask for another owner's",
                caller.owner_id
            )))
        }
        asked => Ok(asked),
    }
}

/// A query string (axum's `Query`), refused as a body of the wrong shape
/// is: `422 invalid_request` naming the parameter, in the API's JSON,
/// where axum's own rejection is a line of plain text.
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(query)) => Ok(ApiQuery(query)),
            Err(rejection) => Err(ApiError::InvalidRequest(format!(
                "query: {}",
                rejection.body_text()
            ))),
        }
    }
}
