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
use crate::domain::ErrorKind;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::{Duration, SystemTime};

/// What a provider's error body says, in the shapes the OpenAI-wire
/// servers answer in: OpenAI `{"error":{"message","type","code"}}` (also
/// Groq, Together, DeepSeek, OpenRouter, llama.cpp's server), Anthropic
/// `{"type":"error","error":{"type","message"}}`, the error at the top
/// level `{"object":"error","message","type","code"}` (vLLM, Mistral), or
/// a bare string `{"error":"…"}` (Ollama).
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
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let error = match &value["error"] {
            Value::Object(_) => &value["error"],
            Value::String(message) => {
                return ErrorBody {
                    kind: None,
                    code: None,
                    message: Some(message.clone()),
                }
            }
            _ => &value,
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

/// Codes and phrases by which OpenAI, Azure OpenAI, Anthropic and the
/// OpenAI-compatible servers say the prompt does not fit.
const CONTEXT_LENGTH: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "context window",
    // llama.cpp's server
    "exceed_context_size",
    "exceeds the available context size",
    // Together (text-generation-inference's validation)
    "`max_new_tokens` must be <=",
];
/// ... and that the content was refused by a safety policy.
const CONTENT_POLICY: &[&str] = &[
    "content_policy",
    "content_filter",
    "content management policy",
    "safety system",
    "usage policies",
];

fn failure(
    retryable: bool,
    kind: ErrorKind,
    message: String,
    status: Option<u16>,
) -> AttemptOutcome {
    AttemptOutcome::Failed(Failure {
        retryable,
        retry_after: None,
        kind,
        message,
        status,
    })
}

pub fn unknown(kind: ErrorKind, message: impl Into<String>) -> AttemptOutcome {
    AttemptOutcome::Unknown(Ambiguous {
        kind,
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
            Err(e) => unknown(
                ErrorKind::InvalidBody,
                format!("{code} with unreadable body: {e}"),
            ),
        };
    }
    let error = ErrorBody::parse(body);
    let message = error
        .message
        .clone()
        .unwrap_or_else(|| format!("HTTP {code}"));
    let outcome = match code {
        502 | 504 => return unknown(ErrorKind::GatewayError, format!("HTTP {code}: {message}")),
        _ if code == 529 || error.kind.as_deref() == Some("overloaded_error") => {
            failure(true, ErrorKind::Overloaded, message, Some(code))
        }
        400 | 403 | 413 | 422 if error.mentions(CONTEXT_LENGTH) => {
            failure(false, ErrorKind::ContextLengthExceeded, message, Some(code))
        }
        400 | 403 | 422 if error.mentions(CONTENT_POLICY) => {
            failure(false, ErrorKind::ContentPolicy, message, Some(code))
        }
        429 if error.mentions(&["insufficient_quota"]) => {
            failure(false, ErrorKind::QuotaExceeded, message, Some(code))
        }
        429 => failure(true, ErrorKind::RateLimited, message, Some(code)),
        // 408: the server gave up waiting for our request, so it did not run it.
        408 => failure(true, ErrorKind::RequestTimeout, message, Some(code)),
        // 409: the same key is in flight; retrying with the same key is safe.
        409 => failure(true, ErrorKind::Conflict, message, Some(code)),
        400 => failure(false, ErrorKind::BadRequest, message, Some(code)),
        401 => failure(false, ErrorKind::Unauthorized, message, Some(code)),
        403 => failure(false, ErrorKind::Forbidden, message, Some(code)),
        404 => failure(false, ErrorKind::NotFound, message, Some(code)),
        413 => failure(false, ErrorKind::RequestTooLarge, message, Some(code)),
        422 => failure(false, ErrorKind::Unprocessable, message, Some(code)),
        503 => failure(true, ErrorKind::Unavailable, message, Some(code)),
        c if (500..=599).contains(&c) => failure(true, ErrorKind::ServerError, message, Some(code)),
        c if (400..=499).contains(&c) => {
            failure(false, ErrorKind::ClientError, message, Some(code))
        }
        // Redirects are not followed, and 1xx never reaches us: the provider
        // did not run a request it redirected.
        _ => failure(false, ErrorKind::UnexpectedStatus, message, Some(code)),
    };
    match outcome {
        AttemptOutcome::Failed(mut f) if f.retryable => {
            f.retry_after = retry_after(headers, SystemTime::now());
            AttemptOutcome::Failed(f)
        }
        other => other,
    }
}

/// How one row of a provider's error table sorts an answer: definitive
/// (never retried), retryable (a definitive no for now), or ambiguous (the
/// work may have been done; invariant 3), and as which kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Definitive(ErrorKind),
    Retryable(ErrorKind),
    Ambiguous(ErrorKind),
}

impl Verdict {
    fn outcome(
        self,
        message: String,
        status: u16,
        retry_after: Option<Duration>,
    ) -> AttemptOutcome {
        let (retryable, kind) = match self {
            Verdict::Ambiguous(kind) => return unknown(kind, message),
            Verdict::Definitive(kind) => (false, kind),
            Verdict::Retryable(kind) => (true, kind),
        };
        AttemptOutcome::Failed(Failure {
            retryable,
            retry_after: retry_after.filter(|_| retryable),
            kind,
            message,
            status: Some(status),
        })
    }
}

/// Gemini's table (AI Studio and Vertex AI answer alike): the
/// `google.rpc.Code` name in `error.status`. An input too long is an
/// `INVALID_ARGUMENT` whose message says so ([`GEMINI_CONTEXT_LENGTH`]).
pub const GEMINI_TABLE: &[(&str, Verdict)] = &[
    (
        "INVALID_ARGUMENT",
        Verdict::Definitive(ErrorKind::BadRequest),
    ),
    (
        "FAILED_PRECONDITION",
        Verdict::Definitive(ErrorKind::BadRequest),
    ),
    ("OUT_OF_RANGE", Verdict::Definitive(ErrorKind::BadRequest)),
    (
        "UNAUTHENTICATED",
        Verdict::Definitive(ErrorKind::Unauthorized),
    ),
    (
        "PERMISSION_DENIED",
        Verdict::Definitive(ErrorKind::Forbidden),
    ),
    ("NOT_FOUND", Verdict::Definitive(ErrorKind::NotFound)),
    (
        "RESOURCE_EXHAUSTED",
        Verdict::Retryable(ErrorKind::RateLimited),
    ),
    ("INTERNAL", Verdict::Retryable(ErrorKind::ServerError)),
    ("UNAVAILABLE", Verdict::Retryable(ErrorKind::Unavailable)),
    // Google's own deadline ran out while the model worked: it may have
    // finished, as a gateway timeout may.
    ("DEADLINE_EXCEEDED", Verdict::Ambiguous(ErrorKind::Timeout)),
];

/// How Gemini says the prompt does not fit: "The input token count (N)
/// exceeds the maximum number of tokens allowed (M)."
pub const GEMINI_CONTEXT_LENGTH: &[&str] = &[
    "exceeds the maximum number of tokens",
    "input token count",
    "input is too long",
];

/// Classify a Gemini answer by [`GEMINI_TABLE`], carrying the provider's
/// status name in the message (`RESOURCE_EXHAUSTED: …`) and the delay its
/// `google.rpc.RetryInfo` detail asks for. A status the table does not
/// know is classified by its HTTP code, as any provider's.
pub fn classify_gemini(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    parse_success: impl FnOnce(&[u8]) -> Result<Result<Success, Failure>, String>,
) -> AttemptOutcome {
    if status.is_success() {
        return classify_response(status, headers, body, parse_success);
    }
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = &value["error"];
    let rpc = error["status"].as_str().unwrap_or_default();
    let Some((_, verdict)) = GEMINI_TABLE.iter().find(|(name, _)| *name == rpc) else {
        return classify_response(status, headers, body, parse_success);
    };
    let text = error["message"].as_str().unwrap_or_default();
    let lower = text.to_ascii_lowercase();
    let verdict = match verdict.clone() {
        Verdict::Definitive(ErrorKind::BadRequest)
            if GEMINI_CONTEXT_LENGTH.iter().any(|n| lower.contains(n)) =>
        {
            Verdict::Definitive(ErrorKind::ContextLengthExceeded)
        }
        other => other,
    };
    let delay = gemini_retry_delay(error).or_else(|| retry_after(headers, SystemTime::now()));
    verdict.outcome(format!("{rpc}: {text}"), status.as_u16(), delay)
}

/// The `retryDelay` of a `google.rpc.RetryInfo` in `error.details`: a
/// protobuf Duration in JSON, seconds with an `s` suffix ("37s", "1.5s").
pub fn gemini_retry_delay(error: &Value) -> Option<Duration> {
    error["details"]
        .as_array()?
        .iter()
        .find(|d| {
            d["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .and_then(|d| d["retryDelay"].as_str())
        .and_then(|d| d.trim().strip_suffix('s'))
        .and_then(|secs| secs.parse::<f64>().ok())
        .filter(|secs| secs.is_finite() && *secs >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Azure OpenAI's table: the `error.code` it adds to OpenAI's shape. What
/// it does not list is classified as OpenAI's answers are.
pub const AZURE_TABLE: &[(&str, Verdict)] = &[
    (
        "content_filter",
        Verdict::Definitive(ErrorKind::ContentPolicy),
    ),
    (
        "ResponsibleAIPolicyViolation",
        Verdict::Definitive(ErrorKind::ContentPolicy),
    ),
    (
        "context_length_exceeded",
        Verdict::Definitive(ErrorKind::ContextLengthExceeded),
    ),
    (
        "DeploymentNotFound",
        Verdict::Definitive(ErrorKind::NotFound),
    ),
    (
        "OperationNotSupported",
        Verdict::Definitive(ErrorKind::BadRequest),
    ),
    ("429", Verdict::Retryable(ErrorKind::RateLimited)),
    (
        "InternalServerError",
        Verdict::Retryable(ErrorKind::ServerError),
    ),
    (
        "ServiceUnavailable",
        Verdict::Retryable(ErrorKind::Unavailable),
    ),
];

/// Classify an Azure OpenAI answer by [`AZURE_TABLE`]. A content-filter
/// refusal keeps the filter's verdict per category in its message
/// (`filtered: violence (medium)`).
pub fn classify_azure(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    parse_success: impl FnOnce(&[u8]) -> Result<Result<Success, Failure>, String>,
) -> AttemptOutcome {
    if status.is_success() || matches!(status.as_u16(), 502 | 504) {
        return classify_response(status, headers, body, parse_success);
    }
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = &value["error"];
    let code = match &error["code"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    };
    let inner = error["innererror"]["code"].as_str().unwrap_or_default();
    let row = AZURE_TABLE
        .iter()
        .find(|(name, _)| *name == code)
        .or_else(|| AZURE_TABLE.iter().find(|(name, _)| *name == inner));
    let Some((_, verdict)) = row else {
        return classify_response(status, headers, body, parse_success);
    };
    let mut message = format!("{code}: {}", error["message"].as_str().unwrap_or_default());
    let categories = azure_filtered_categories(&error["innererror"]["content_filter_result"]);
    if !categories.is_empty() {
        message.push_str(&format!(" [filtered: {}]", categories.join(", ")));
    }
    verdict.clone().outcome(
        message,
        status.as_u16(),
        retry_after(headers, SystemTime::now()),
    )
}

/// The categories an Azure content-filter result marks as filtered (or,
/// for jailbreak and protected material, detected), each with its severity
/// when it has one: `["violence (medium)", "jailbreak"]`.
pub fn azure_filtered_categories(result: &Value) -> Vec<String> {
    let Some(categories) = result.as_object() else {
        return Vec::new();
    };
    let mut filtered: Vec<String> = categories
        .iter()
        .filter(|(_, v)| v["filtered"] == true || v["detected"] == true)
        .map(|(name, v)| match v["severity"].as_str() {
            Some(severity) => format!("{name} ({severity})"),
            None => name.clone(),
        })
        .collect();
    filtered.sort();
    filtered
}

/// Bedrock's table: the error type AWS names in the `x-amzn-ErrorType`
/// header (or the body's `__type`). An input too long is a
/// `ValidationException` whose message says so ([`BEDROCK_CONTEXT_LENGTH`]).
pub const BEDROCK_TABLE: &[(&str, Verdict)] = &[
    (
        "ValidationException",
        Verdict::Definitive(ErrorKind::BadRequest),
    ),
    (
        "AccessDeniedException",
        Verdict::Definitive(ErrorKind::Forbidden),
    ),
    (
        "UnrecognizedClientException",
        Verdict::Definitive(ErrorKind::Unauthorized),
    ),
    (
        "InvalidSignatureException",
        Verdict::Definitive(ErrorKind::Unauthorized),
    ),
    (
        "ExpiredTokenException",
        Verdict::Definitive(ErrorKind::Unauthorized),
    ),
    (
        "ResourceNotFoundException",
        Verdict::Definitive(ErrorKind::NotFound),
    ),
    (
        "ServiceQuotaExceededException",
        Verdict::Definitive(ErrorKind::QuotaExceeded),
    ),
    (
        "ThrottlingException",
        Verdict::Retryable(ErrorKind::RateLimited),
    ),
    (
        "ModelNotReadyException",
        Verdict::Retryable(ErrorKind::Unavailable),
    ),
    // The model timed out before answering: AWS documents a retry.
    (
        "ModelTimeoutException",
        Verdict::Retryable(ErrorKind::RequestTimeout),
    ),
    (
        "ModelErrorException",
        Verdict::Retryable(ErrorKind::ServerError),
    ),
    (
        "ServiceUnavailableException",
        Verdict::Retryable(ErrorKind::Unavailable),
    ),
    (
        "InternalServerException",
        Verdict::Retryable(ErrorKind::ServerError),
    ),
];

/// How Bedrock's `ValidationException` says the prompt does not fit
/// ("Input is too long for requested model.", "prompt is too long",
/// "… exceeds max tokens").
pub const BEDROCK_CONTEXT_LENGTH: &[&str] = &[
    "too long",
    "max tokens",
    "maximum context length",
    "context window",
];

/// The AWS error type of an answer: `x-amzn-ErrorType` up to its first
/// `:` (AWS appends a URL), else the body's `__type` after its `#`.
pub fn aws_error_type(headers: &HeaderMap, body: &Value) -> Option<String> {
    let header = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or(v).trim().to_string());
    header.filter(|t| !t.is_empty()).or_else(|| {
        body["__type"]
            .as_str()
            .map(|t| t.rsplit('#').next().unwrap_or(t).to_string())
    })
}

/// Classify a Bedrock answer by [`BEDROCK_TABLE`], the error type kept at
/// the head of the message (`ThrottlingException: …`). A type the table
/// does not know is classified by its HTTP code, as any provider's.
pub fn classify_bedrock(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    parse_success: impl FnOnce(&[u8]) -> Result<Result<Success, Failure>, String>,
) -> AttemptOutcome {
    if status.is_success() {
        return classify_response(status, headers, body, parse_success);
    }
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let Some(error_type) = aws_error_type(headers, &value) else {
        return classify_response(status, headers, body, parse_success);
    };
    let Some((_, verdict)) = BEDROCK_TABLE.iter().find(|(name, _)| *name == error_type) else {
        return classify_response(status, headers, body, parse_success);
    };
    let text = value["message"]
        .as_str()
        .or(value["Message"].as_str())
        .unwrap_or_default();
    let verdict = match verdict.clone() {
        Verdict::Definitive(ErrorKind::BadRequest) => {
            Verdict::Definitive(bedrock_bad_request(text))
        }
        other => other,
    };
    verdict.outcome(
        format!("{error_type}: {text}"),
        status.as_u16(),
        retry_after(headers, SystemTime::now()),
    )
}

/// What a Bedrock `ValidationException` says, by its message: a prompt
/// past the context window, one a safety policy refused (a refusal the
/// next provider would repeat), else a malformed request.
fn bedrock_bad_request(message: &str) -> ErrorKind {
    let lower = message.to_ascii_lowercase();
    if BEDROCK_CONTEXT_LENGTH.iter().any(|n| lower.contains(n)) {
        ErrorKind::ContextLengthExceeded
    } else if CONTENT_POLICY.iter().any(|n| lower.contains(n)) {
        ErrorKind::ContentPolicy
    } else {
        ErrorKind::BadRequest
    }
}

/// An exception ConverseStream sends in its stream before any event of the
/// answer (`throttlingException`, `validationException`, …: the type in
/// lower camel case), as the definitive failure [`BEDROCK_TABLE`] makes of
/// it; `None` for a type the table does not know, which stays a cut.
pub fn bedrock_stream_exception(error_type: &str, message: &str) -> Option<Failure> {
    let mut chars = error_type.chars();
    let first = chars.next()?;
    let error_type = format!("{}{}", first.to_ascii_uppercase(), chars.as_str());
    let (_, verdict) = BEDROCK_TABLE.iter().find(|(name, _)| *name == error_type)?;
    let (retryable, kind) = match verdict.clone() {
        Verdict::Definitive(ErrorKind::BadRequest) => (false, bedrock_bad_request(message)),
        Verdict::Definitive(kind) => (false, kind),
        Verdict::Retryable(kind) => (true, kind),
        Verdict::Ambiguous(_) => return None,
    };
    Some(Failure {
        retryable,
        retry_after: None,
        kind,
        message: format!("{error_type}: {message}"),
        status: None,
    })
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
        return failure(true, ErrorKind::ConnectFailed, detail, None);
    }
    if error.is_builder() {
        return failure(false, ErrorKind::BadRequest, detail, None);
    }
    if error.is_timeout() {
        return unknown(ErrorKind::Timeout, detail);
    }
    // The connection broke after (part of) the request may have been written.
    unknown(ErrorKind::ConnectionReset, detail)
}

/// An error while reading the body of a response whose headers arrived.
pub fn classify_body_error(status: StatusCode, error: &reqwest::Error) -> AttemptOutcome {
    unknown(
        ErrorKind::TruncatedBody,
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

    fn gemini(status: u16, body: &str) -> AttemptOutcome {
        let status = StatusCode::from_u16(status).unwrap();
        classify_gemini(status, &HeaderMap::new(), body.as_bytes(), never_parsed)
    }

    fn sorted_as(outcome: &AttemptOutcome) -> (Verdict, String) {
        match outcome {
            AttemptOutcome::Failed(f) if f.retryable => {
                (Verdict::Retryable(f.kind.clone()), f.message.clone())
            }
            AttemptOutcome::Failed(f) => (Verdict::Definitive(f.kind.clone()), f.message.clone()),
            AttemptOutcome::Unknown(a) => (Verdict::Ambiguous(a.kind.clone()), a.message.clone()),
            other => panic!("{other:?}"),
        }
    }

    /// The HTTP status Google answers with each `google.rpc.Code`.
    fn http_status_of(rpc: &str) -> u16 {
        match rpc {
            "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => 400,
            "UNAUTHENTICATED" => 401,
            "PERMISSION_DENIED" => 403,
            "NOT_FOUND" => 404,
            "RESOURCE_EXHAUSTED" => 429,
            "UNAVAILABLE" => 503,
            "DEADLINE_EXCEEDED" => 504,
            _ => 500,
        }
    }

    #[test]
    fn every_gemini_row_sorts_its_status_and_carries_the_code() {
        for (rpc, verdict) in GEMINI_TABLE {
            let code = http_status_of(rpc);
            let body = format!(r#"{{"error":{{"code":{code},"message":"m","status":"{rpc}"}}}}"#);
            let (sorted, message) = sorted_as(&gemini(code, &body));
            assert_eq!(&sorted, verdict, "{rpc}");
            assert_eq!(message, format!("{rpc}: m"), "{rpc}");
        }
    }

    #[test]
    fn gemini_input_too_long_is_context_length_and_exhaustion_waits_as_told() {
        let long = r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(
            sorted_as(&gemini(400, long)).0,
            Verdict::Definitive(ErrorKind::ContextLengthExceeded)
        );
        let exhausted = r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED",
            "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2.5s"}]}}"#;
        let AttemptOutcome::Failed(f) = gemini(429, exhausted) else {
            panic!()
        };
        assert_eq!(f.retry_after, Some(Duration::from_millis(2500)));
        // A status the table does not know falls back to the HTTP code.
        let odd = r#"{"error":{"code":409,"message":"m","status":"ABORTED"}}"#;
        assert_eq!(
            sorted_as(&gemini(409, odd)).0,
            Verdict::Retryable(ErrorKind::Conflict)
        );
    }

    fn bedrock(status: u16, error_type: &str, body: &str) -> AttemptOutcome {
        let status = StatusCode::from_u16(status).unwrap();
        let mut headers = HeaderMap::new();
        let value = format!("{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/");
        headers.insert("x-amzn-errortype", HeaderValue::from_str(&value).unwrap());
        classify_bedrock(status, &headers, body.as_bytes(), never_parsed)
    }

    #[test]
    fn every_bedrock_row_sorts_its_type_and_carries_it() {
        for (error_type, verdict) in BEDROCK_TABLE {
            let status = match *error_type {
                "ThrottlingException" | "ModelNotReadyException" => 429,
                "AccessDeniedException" | "UnrecognizedClientException" => 403,
                "ResourceNotFoundException" => 404,
                "ModelTimeoutException" => 408,
                "ModelErrorException" => 424,
                "ServiceUnavailableException" => 503,
                "InternalServerException" => 500,
                _ => 400,
            };
            let (sorted, message) = sorted_as(&bedrock(status, error_type, r#"{"message":"m"}"#));
            assert_eq!(&sorted, verdict, "{error_type}");
            assert_eq!(message, format!("{error_type}: m"), "{error_type}");
        }
        let long = r#"{"message":"Input is too long for requested model."}"#;
        assert_eq!(
            sorted_as(&bedrock(400, "ValidationException", long)).0,
            Verdict::Definitive(ErrorKind::ContextLengthExceeded)
        );
        // The body's `__type` names the error when the header does not.
        let typed = r#"{"__type":"com.amazon.coral.service#ThrottlingException","message":"slow"}"#;
        let outcome = classify_bedrock(
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
            typed.as_bytes(),
            never_parsed,
        );
        assert_eq!(
            sorted_as(&outcome).0,
            Verdict::Retryable(ErrorKind::RateLimited)
        );
    }

    fn azure(status: u16, body: &str) -> AttemptOutcome {
        let status = StatusCode::from_u16(status).unwrap();
        classify_azure(status, &HeaderMap::new(), body.as_bytes(), never_parsed)
    }

    #[test]
    fn every_azure_row_sorts_its_code_and_carries_it() {
        for (code, verdict) in AZURE_TABLE {
            let status = match verdict {
                Verdict::Retryable(ErrorKind::RateLimited) => 429,
                Verdict::Retryable(ErrorKind::Unavailable) => 503,
                Verdict::Retryable(_) => 500,
                Verdict::Definitive(ErrorKind::NotFound) => 404,
                _ => 400,
            };
            let body = format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#);
            let (sorted, message) = sorted_as(&azure(status, &body));
            assert_eq!(&sorted, verdict, "{code}");
            assert_eq!(message, format!("{code}: m"), "{code}");
        }
        // The inner code decides when the outer one is unlisted.
        let inner = r#"{"error":{"code":"BadRequest","message":"m",
            "innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":
            {"hate":{"filtered":true,"severity":"high"},"jailbreak":{"filtered":true,"detected":true}}}}}"#;
        let (sorted, message) = sorted_as(&azure(400, inner));
        assert_eq!(sorted, Verdict::Definitive(ErrorKind::ContentPolicy));
        assert!(
            message.ends_with("[filtered: hate (high), jailbreak]"),
            "{message}"
        );
        // 502 and 504 stay unknown whatever the body says.
        assert_eq!(
            sorted_as(&azure(504, "")).0,
            Verdict::Ambiguous(ErrorKind::GatewayError)
        );
    }
}
