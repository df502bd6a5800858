//! One log line for every refused request (a 4xx answer): its status, its
//! stable error code, the owner when the key was good, the route when the
//! body named one, the method and the path, never the key. Without it an
//! operator cannot see why an SDK fails.

use crate::domain::OwnerId;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::{Arc, Mutex};

/// What the request's handling learnt that its refusal's line names: the
/// owner once a key was resolved (`auth`), the route once a door decoded
/// the body (`door::submit`).
#[derive(Debug, Clone, Default)]
struct Note(Arc<Mutex<Learnt>>);

#[derive(Debug, Default)]
struct Learnt {
    owner: Option<OwnerId>,
    route: Option<String>,
}

tokio::task_local! {
    /// The note of the request this task is handling.
    static NOTE: Note;
}

fn learn(f: impl FnOnce(&mut Learnt)) {
    let _ = NOTE.try_with(|note| {
        if let Ok(mut learnt) = note.0.lock() {
            f(&mut learnt);
        }
    });
}

/// The owner of the request being handled, for its refusal's line.
pub fn note_owner(owner: &OwnerId) {
    learn(|l| l.owner = Some(owner.clone()));
}

/// The route of the request being handled, for its refusal's line.
pub fn note_route(route: &str) {
    learn(|l| l.route = Some(route.to_string()));
}

/// The stable code of an error answer, put on the response by the error
/// types of every dialect.
#[derive(Debug, Clone)]
pub struct ErrorCode(pub String);

pub async fn log_refusals(request: Request, next: Next) -> Response {
    let note = Note::default();
    let method = request.method().clone();
    let uri = request.uri().clone();
    let response = NOTE.scope(note.clone(), next.run(request)).await;
    let status = response.status();
    if status.is_client_error() {
        let code = response.extensions().get::<ErrorCode>();
        let learnt = note.0.lock().map(|l| (l.owner.clone(), l.route.clone()));
        let (owner, route) = learnt.unwrap_or_default();
        tracing::info!(
            status = status.as_u16(),
            code = code.map_or("-", |c| c.0.as_str()),
            owner = owner.as_deref().unwrap_or("-"),
            route = route.as_deref().unwrap_or("-"),
            method = %method,
            path = uri.path(),
            "request refused"
        );
    }
    response
}
