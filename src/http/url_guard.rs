//! A URL that can name nothing is refused before any route reads it, the
//! same on every route and both databases, in the caller's dialect: a NUL
//! (`%00`) in the path or the query, which PostgreSQL cannot even compare
//! (a 500 there, a 404 or an empty list on SQLite), and a path that is not
//! UTF-8 once decoded (axum's path extractor answers that in plain text).

use super::error::ApiError;
use axum::http::request::Parts;
use axum::response::Response;

/// The refusal of a request whose URL names nothing; `None` for any other.
/// Called by the middleware every request passes ([`super::drain`]'s):
/// a middleware of its own cost about 1% of a job's instructions.
pub fn refusal(parts: &Parts) -> Option<Response> {
    let why = problem(parts.uri.path(), parts.uri.query())?;
    Some(super::in_dialect(
        &parts.headers,
        &parts.uri,
        ApiError::InvalidRequest(why.to_string()),
    ))
}

/// Why the URL of `path` and `query` names nothing, if it does not.
fn problem(path: &str, query: Option<&str>) -> Option<&'static str> {
    if has_nul(path) {
        return Some("path: must not hold a NUL character (%00)");
    }
    if query.is_some_and(has_nul) {
        return Some("query: must not hold a NUL character (%00)");
    }
    if path.contains('%') && std::str::from_utf8(&percent_decoded(path)).is_err() {
        return Some("path: must be UTF-8 once percent-decoded");
    }
    None
}

fn has_nul(text: &str) -> bool {
    text.as_bytes().windows(3).any(|w| w == b"%00")
}

/// `text` with each `%XX` made its byte; a `%` not followed by two hex
/// digits stays as it is (as the path extractor reads it).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_or_a_path_that_is_not_utf8_names_nothing() {
        assert_eq!(problem("/v1/jobs/job_1", None), None);
        assert_eq!(problem("/v1/jobs/caf%C3%A9", Some("owner=al%20ice")), None);
        assert_eq!(problem("/v1/jobs/100%", None), None);
        assert_eq!(problem("/v1/jobs/%zz", None), None);
        assert_eq!(
            problem("/v1/jobs/%00", None),
            Some("path: must not hold a NUL character (%00)")
        );
        assert_eq!(
            problem("/v1/webhooks", Some("owner=%00")),
            Some("query: must not hold a NUL character (%00)")
        );
        assert_eq!(
            problem("/v1/jobs/%FF", None),
            Some("path: must be UTF-8 once percent-decoded")
        );
        assert_eq!(
            problem("/v1/jobs/%C3", None),
            Some("path: must be UTF-8 once percent-decoded")
        );
    }
}
