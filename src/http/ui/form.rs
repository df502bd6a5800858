//! The console's form and query extractors: a body or query string that
//! does not decode is answered with the console's own refusal page (the
//! field and the problem), where axum's extractors answer with a line of
//! plain text.

use super::session::refused;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::response::Response;
use serde::de::DeserializeOwned;

/// A posted `application/x-www-form-urlencoded` form.
pub struct ConsoleForm<T>(pub T);

/// A page's query string.
pub struct ConsoleQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ConsoleForm<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Form::<T>::from_request(request, state).await {
            Ok(axum::extract::Form(form)) => Ok(ConsoleForm(form)),
            Err(rejection) => Err(refused(rejection.status(), &rejection.body_text())),
        }
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ConsoleQuery<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(query)) => Ok(ConsoleQuery(query)),
            Err(rejection) => Err(refused(rejection.status(), &rejection.body_text())),
        }
    }
}
