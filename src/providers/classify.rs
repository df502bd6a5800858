//! Error classification shared by every adapter: each way a call can end is
//! sorted, where it is born, into succeeded, failed (retryable or not) or
//! unknown (the provider may have executed the work; invariant 3).
//!
//! The rule of thumb: `failed` only when the provider said no, or when the
//! request provably never left (connect refused, DNS failure, connect
//! timeout). Anything that went wrong after the request may have been sent —
//! a read timeout, a reset, a gateway error, a truncated or unreadable
//! success body — is `unknown`.

use super::{Ambiguous, AttemptOutcome, Failure, Success};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::{Duration, SystemTime};

/// What a provider's error body says, in either published shape:
/// OpenAI `{"error":{"message","type","code"}}` or Anthropic
/// `{"type":"error","error":{"type","message"}}`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorBody {
    pub kind: Option<String>,
    pub code: Option<String>,
    pub message: Option<String>,
}

impl ErrorBody {
    pub fn parse(body: &[u8]) -> Self {
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return ErrorBody::default();
        };
        let error = &value["error"];
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        ErrorBody {
            kind: text(&error["type"]),
            code: text(&error["code"]),
            message: text(&error["message"]).or_else(|| text(&value["message"])),
        }
    }

    fn mentions(&self, needles: &[&str]) -> bool {
        [&self.kind, &self.code, &self.message]
            .into_iter()
            .flatten()
            .map(|s| s.to_ascii_lowercase())
            .any(|s| needles.iter().any(|n| s.contains(n)))
    }
}

/// Codes and phrases by which OpenAI, Azure OpenAI and Anthropic say the
/// prompt does not fit.
const CONTEXT_LENGTH: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "context window",
];
/// ... and that the content was refused by a safety policy.
const CONTENT_POLICY: &[&str] = &[
    "content_policy",
    "content_filter",
    "content management policy",
    "safety system",
    "usage policies",
];

fn failure(retryable: bool, kind: &str, message: String, status: Option<u16>) -> AttemptOutcome {
    AttemptOutcome::Failed(Failure {
        retryable,
        retry_after: None,
        kind: kind.to_string(),
        message,
        status,
    })
}

pub fn unknown(kind: &str, message: impl Into<String>) -> AttemptOutcome {
    AttemptOutcome::Unknown(Ambiguous {
        kind: kind.to_string(),
        message: message.into(),
    })
}

/// Classify a complete HTTP answer. `parse_success` turns a 2xx body into a
/// [`Success`] (or a definitive [`Failure`], e.g. a refusal); a body it
/// cannot read makes the outcome unknown, since the provider did answer
/// something and may have executed the work.
pub fn classify_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    parse_success: impl FnOnce(&[u8]) -> Result<Result<Success, Failure>, String>,
) -> AttemptOutcome {
    let code = status.as_u16();
    if status.is_success() {
        return match parse_success(body) {
            Ok(Ok(success)) => AttemptOutcome::Succeeded(success),
            Ok(Err(failure)) => AttemptOutcome::Failed(failure),
            Err(e) => unknown("invalid_body", format!("{code} with unreadable body: {e}")),
        };
    }
    let error = ErrorBody::parse(body);
    let message = error
        .message
        .clone()
        .unwrap_or_else(|| format!("HTTP {code}"));
    let outcome = match code {
        502 | 504 => return unknown("gateway_error", format!("HTTP {code}: {message}")),
        _ if code == 529 || error.kind.as_deref() == Some("overloaded_error") => {
            failure(true, "overloaded", message, Some(code))
        }
        400 | 403 | 413 | 422 if error.mentions(CONTEXT_LENGTH) => {
            failure(false, "context_length_exceeded", message, Some(code))
        }
        400 | 403 | 422 if error.mentions(CONTENT_POLICY) => {
            failure(false, "content_policy", message, Some(code))
        }
        429 if error.mentions(&["insufficient_quota"]) => {
            failure(false, "quota_exceeded", message, Some(code))
        }
        429 => failure(true, "rate_limited", message, Some(code)),
        // 408: the server gave up waiting for our request, so it did not run it.
        408 => failure(true, "request_timeout", message, Some(code)),
        // 409: the same key is in flight; retrying with the same key is safe.
        409 => failure(true, "conflict", message, Some(code)),
        400 => failure(false, "bad_request", message, Some(code)),
        401 => failure(false, "unauthorized", message, Some(code)),
        403 => failure(false, "forbidden", message, Some(code)),
        404 => failure(false, "not_found", message, Some(code)),
        413 => failure(false, "request_too_large", message, Some(code)),
        422 => failure(false, "unprocessable", message, Some(code)),
        503 => failure(true, "unavailable", message, Some(code)),
        c if (500..=599).contains(&c) => failure(true, "server_error", message, Some(code)),
        c if (400..=499).contains(&c) => failure(false, "client_error", message, Some(code)),
        // Redirects are not followed, and 1xx never reaches us: the provider
        // did not run a request it redirected.
        _ => failure(false, "unexpected_status", message, Some(code)),
    };
    match outcome {
        AttemptOutcome::Failed(mut f) if f.retryable => {
            f.retry_after = retry_after(headers, SystemTime::now());
            AttemptOutcome::Failed(f)
        }
        other => other,
    }
}

/// `retry-after-ms` (OpenAI) wins over `Retry-After` (seconds or HTTP date).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An error from sending the request, before any response header arrived.
pub fn classify_send_error(error: &reqwest::Error) -> AttemptOutcome {
    let detail = error_chain(error);
    if error.is_connect() {
        // Connect refused, DNS failure, TLS handshake or connect timeout:
        // no byte of the request was written.
        return failure(true, "connect_failed", detail, None);
    }
    if error.is_builder() {
        return failure(false, "bad_request", detail, None);
    }
    if error.is_timeout() {
        return unknown("timeout", detail);
    }
    // The connection broke after (part of) the request may have been written.
    unknown("connection_reset", detail)
}

/// An error while reading the body of a response whose headers arrived.
pub fn classify_body_error(status: StatusCode, error: &reqwest::Error) -> AttemptOutcome {
    unknown(
        "truncated_body",
        format!(
            "HTTP {} body cut off: {}",
            status.as_u16(),
            error_chain(error)
        ),
    )
}

/// The error and its causes, one line, for messages and logs.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn never_parsed(_: &[u8]) -> Result<Result<Success, Failure>, String> {
        Err("not expected".into())
    }

    fn failed(status: u16, body: &str) -> Failure {
        let status = StatusCode::from_u16(status).unwrap();
        match classify_response(status, &HeaderMap::new(), body.as_bytes(), never_parsed) {
            AttemptOutcome::Failed(f) => f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gateway_errors_are_unknown() {
        for status in [502, 504] {
            let s = StatusCode::from_u16(status).unwrap();
            let outcome = classify_response(s, &HeaderMap::new(), b"", never_parsed);
            assert!(matches!(outcome, AttemptOutcome::Unknown(a) if a.kind == "gateway_error"));
        }
    }

    #[test]
    fn status_and_body_pick_the_kind() {
        let ctx = r#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert_eq!(failed(400, ctx).kind, "context_length_exceeded");
        assert!(!failed(400, ctx).retryable);
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 300000 tokens > 200000 maximum"}}"#;
        assert_eq!(failed(400, anthropic).kind, "context_length_exceeded");
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let f = failed(529, overloaded);
        assert!(f.retryable && f.kind == "overloaded");
        assert_eq!(failed(401, "").kind, "unauthorized");
        assert!(failed(500, "").retryable);
        let quota = r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(!failed(429, quota).retryable);
    }

    #[test]
    fn retry_after_reads_ms_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
    }
}
