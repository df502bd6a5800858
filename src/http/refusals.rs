//! One log line for every refused request (a 4xx answer): its status, its
//! stable error code, the owner when the key was good, the method and the
//! path, never the key. Without it an operator cannot see why an SDK fails.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::{Arc, Mutex};

/// What the request's handling learnt that its refusal's line names: the
/// owner, once a key was resolved (see `auth`).
#[derive(Debug, Clone, Default)]
pub struct Note(Arc<Mutex<Option<String>>>);

impl Note {
    pub fn set_owner(&self, owner: &str) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(owner.to_string());
        }
    }

    fn owner(&self) -> Option<String> {
        self.0.lock().ok().and_then(|slot| slot.clone())
    }
}

/// The stable code of an error answer, put on the response by the error
/// types of every dialect.
#[derive(Debug, Clone)]
pub struct ErrorCode(pub String);

pub async fn log_refusals(mut request: Request, next: Next) -> Response {
    let note = Note::default();
    request.extensions_mut().insert(note.clone());
    let method = request.method().clone();
    let uri = request.uri().clone();
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() {
        let code = response.extensions().get::<ErrorCode>();
        tracing::info!(
            status = status.as_u16(),
            code = code.map_or("-", |c| c.0.as_str()),
            owner = note.owner().as_deref().unwrap_or("-"),
            method = %method,
            path = uri.path(),
            "request refused"
        );
    }
    response
}
