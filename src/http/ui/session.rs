//! Console sessions: an admin key, presented once on the login form, becomes
//! a random session token in an `HttpOnly; SameSite=Strict` cookie (`Secure`
//! when the request came over TLS through a proxy). Sessions live in this
//! process's memory (a restart logs everyone out) and keep the key itself
//! server-side, so every request re-checks it with
//! [`crate::keys::authenticate`]: a revoked or demoted key ends its sessions.
//!
//! Every form carries the session's CSRF token; the login form, which has
//! no session yet, carries a token that must match a cookie set with it
//! (double submit).

use crate::http::AppState;
use crate::keys::{authenticate, Caller};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const SESSION_COOKIE: &str = "onejob_session";
pub const LOGIN_CSRF_COOKIE: &str = "onejob_login_csrf";
/// How long a session lasts without a new login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
const MAX_SESSIONS: usize = 10_000;

struct Session {
    key: String,
    csrf: String,
    expires: Instant,
}

/// The sessions this process issued, by the SHA-256 of their token (a leaked
/// memory dump or log line never carries a usable token).
#[derive(Default)]
pub struct Sessions {
    by_token_hash: Mutex<HashMap<String, Session>>,
}

pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Equal without telling by its timing where two tokens differ.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Sessions {
    /// A new session for `key`; returns its token (for the cookie).
    pub fn open(&self, key: &str) -> String {
        let token = random_token();
        if let Ok(mut map) = self.by_token_hash.lock() {
            let now = Instant::now();
            map.retain(|_, s| s.expires > now);
            if map.len() >= MAX_SESSIONS {
                map.clear();
            }
            map.insert(
                token_hash(&token),
                Session {
                    key: key.to_string(),
                    csrf: random_token(),
                    expires: now + SESSION_TTL,
                },
            );
        }
        token
    }

    pub fn close(&self, token: &str) {
        if let Ok(mut map) = self.by_token_hash.lock() {
            map.remove(&token_hash(token));
        }
    }

    /// (key, csrf token) of a live session.
    fn get(&self, token: &str) -> Option<(String, String)> {
        let map = self.by_token_hash.lock().ok()?;
        map.get(&token_hash(token))
            .filter(|s| s.expires > Instant::now())
            .map(|s| (s.key.clone(), s.csrf.clone()))
    }
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Whether the client reached us over TLS (through a terminating proxy).
fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// `Set-Cookie` for a console cookie; `max_age` 0 deletes it.
pub fn set_cookie(headers: &HeaderMap, name: &str, value: &str, max_age: u64) -> HeaderValue {
    let secure = if behind_tls(headers) { "; Secure" } else { "" };
    let text =
        format!("{name}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=1"))
}

/// A console request from a logged-in admin.
pub struct UiAdmin {
    pub caller: Caller,
    pub csrf: String,
    pub token: String,
}

impl UiAdmin {
    /// Whether a form carries this session's CSRF token.
    pub fn csrf_ok(&self, presented: &str) -> bool {
        same_token(presented, &self.csrf)
    }
}

/// The answer to a form without the session's CSRF token.
pub fn csrf_refused() -> Response {
    refused(
        StatusCode::FORBIDDEN,
        "invalid or missing CSRF token; reload the page and try again",
    )
}

/// A plain refusal page.
pub fn refused(status: StatusCode, message: &str) -> Response {
    let body = super::render_page(
        "refused.html",
        minijinja::context! { title => "Refused", message => message, status => status.as_u16() },
    );
    (status, body).into_response()
}

impl FromRequestParts<AppState> for UiAdmin {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/ui/login").into_response();
        let token = cookie(&parts.headers, SESSION_COOKIE).ok_or_else(to_login)?;
        let (key, csrf) = state.ui_sessions.get(&token).ok_or_else(to_login)?;
        let caller = match authenticate(state.store.as_ref(), &key).await {
            Ok(Some(caller)) => caller,
            Ok(None) => {
                state.ui_sessions.close(&token);
                return Err(to_login());
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot check a console session's key");
                return Err(refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database is not answering",
                ));
            }
        };
        if !caller.is_admin {
            state.ui_sessions.close(&token);
            return Err(refused(
                StatusCode::FORBIDDEN,
                "the console needs an admin key",
            ));
        }
        Ok(UiAdmin {
            caller,
            csrf,
            token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "ab"));
        assert!(!same_token("", "a"));
    }

    #[test]
    fn a_closed_session_is_gone() {
        let sessions = Sessions::default();
        let token = sessions.open("oj_x");
        assert_eq!(sessions.get(&token).map(|s| s.0), Some("oj_x".to_string()));
        sessions.close(&token);
        assert!(sessions.get(&token).is_none());
    }
}
