//! Why an attempt ended without an answer: the stable, machine-readable
//! kind an adapter (or the engine) classifies it as, where it is born
//! (invariant 3).
//!
//! The kind is stored as text (`attempts.error_kind`), shown in JSON (the
//! job's attempts, the console, events' details) and named in the errors a
//! client reads. [`ErrorKind::as_str`] is that text and [`ErrorKind::parse`]
//! reads it back; a kind onejob does not know (a newer build's, or a
//! provider's own code) is kept as [`ErrorKind::Other`], so nothing is lost.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// One kind per way an attempt can end without an answer. The comments say
/// which outcome carries it: *failed* (the provider said no, or the request
/// never left), *unknown* (the provider may have run it) or *discarded*.
#[derive(Debug, Clone)]
pub enum ErrorKind {
    // --- failed: the provider said no ---
    /// The prompt does not fit the model's context window.
    ContextLengthExceeded,
    /// The provider refused the content by a safety policy.
    ContentPolicy,
    /// The account's quota is used up (not a rate limit: waiting won't do).
    QuotaExceeded,
    RateLimited,
    /// 408: the provider gave up waiting for the request, so did not run it.
    RequestTimeout,
    /// 409: the same key is in flight at the provider.
    Conflict,
    BadRequest,
    Unauthorized,
    /// The credentials could not be obtained for now (a token exchange
    /// failed retryably).
    AuthUnavailable,
    Forbidden,
    NotFound,
    RequestTooLarge,
    Unprocessable,
    Unavailable,
    ServerError,
    /// A 4xx the table does not name.
    ClientError,
    /// A status that is neither success nor error (a redirect).
    UnexpectedStatus,
    Overloaded,
    /// The provider refused the prompt as such (a blocked or invalid prompt).
    InvalidPrompt,
    // --- failed: the request never left ---
    ConnectFailed,
    /// The job's request could not be made into this provider's.
    InvalidRequest,
    /// No provider of the route admitted the attempt.
    NoProvider,
    /// The unknown attempt a hedge was to back up was settled meanwhile.
    HedgeNotNeeded,
    /// The output broke the job's contract (`response_format`).
    ContractViolation,
    /// Reconciliation: the provider has no record of the key.
    NotExecuted,
    // --- unknown: the provider may have run it ---
    Timeout,
    ConnectionReset,
    /// 502 or 504 from a gateway.
    GatewayError,
    TruncatedBody,
    /// A success status with a body that cannot be read.
    InvalidBody,
    /// The attempt's own deadline ran out.
    AttemptTimeout,
    /// The process driving the attempt stopped.
    DriverLost,
    StreamCut,
    StreamAbandoned,
    /// The stream closed before the provider said why it stopped.
    StreamIncomplete,
    /// An error event in the stream.
    StreamError,
    /// No chunk within `stall_ms`.
    StreamStall,
    MalformedChunk,
    // --- discarded ---
    /// Dropped in flight because another attempt had won.
    Abandoned,
    /// A kind this build does not name, kept as it was written. Made by
    /// [`ErrorKind::parse`] only, so it never spells a named kind.
    Other(String),
}

/// Every named kind, in declaration order (all but [`ErrorKind::Other`]):
/// what [`ErrorKind::parse`] reads. A variant added above is added here.
pub const NAMED: &[ErrorKind] = &[
    ErrorKind::ContextLengthExceeded,
    ErrorKind::ContentPolicy,
    ErrorKind::QuotaExceeded,
    ErrorKind::RateLimited,
    ErrorKind::RequestTimeout,
    ErrorKind::Conflict,
    ErrorKind::BadRequest,
    ErrorKind::Unauthorized,
    ErrorKind::AuthUnavailable,
    ErrorKind::Forbidden,
    ErrorKind::NotFound,
    ErrorKind::RequestTooLarge,
    ErrorKind::Unprocessable,
    ErrorKind::Unavailable,
    ErrorKind::ServerError,
    ErrorKind::ClientError,
    ErrorKind::UnexpectedStatus,
    ErrorKind::Overloaded,
    ErrorKind::InvalidPrompt,
    ErrorKind::ConnectFailed,
    ErrorKind::InvalidRequest,
    ErrorKind::NoProvider,
    ErrorKind::HedgeNotNeeded,
    ErrorKind::ContractViolation,
    ErrorKind::NotExecuted,
    ErrorKind::Timeout,
    ErrorKind::ConnectionReset,
    ErrorKind::GatewayError,
    ErrorKind::TruncatedBody,
    ErrorKind::InvalidBody,
    ErrorKind::AttemptTimeout,
    ErrorKind::DriverLost,
    ErrorKind::StreamCut,
    ErrorKind::StreamAbandoned,
    ErrorKind::StreamIncomplete,
    ErrorKind::StreamError,
    ErrorKind::StreamStall,
    ErrorKind::MalformedChunk,
    ErrorKind::Abandoned,
];

impl ErrorKind {
    /// The kind as stored and shown (`rate_limited`).
    pub fn as_str(&self) -> &str {
        use ErrorKind::*;
        match self {
            ContextLengthExceeded => "context_length_exceeded",
            ContentPolicy => "content_policy",
            QuotaExceeded => "quota_exceeded",
            RateLimited => "rate_limited",
            RequestTimeout => "request_timeout",
            Conflict => "conflict",
            BadRequest => "bad_request",
            Unauthorized => "unauthorized",
            AuthUnavailable => "auth_unavailable",
            Forbidden => "forbidden",
            NotFound => "not_found",
            RequestTooLarge => "request_too_large",
            Unprocessable => "unprocessable",
            Unavailable => "unavailable",
            ServerError => "server_error",
            ClientError => "client_error",
            UnexpectedStatus => "unexpected_status",
            Overloaded => "overloaded",
            InvalidPrompt => "invalid_prompt",
            ConnectFailed => "connect_failed",
            InvalidRequest => "invalid_request",
            NoProvider => "no_provider",
            HedgeNotNeeded => "hedge_not_needed",
            ContractViolation => "contract_violation",
            NotExecuted => "not_executed",
            Timeout => "timeout",
            ConnectionReset => "connection_reset",
            GatewayError => "gateway_error",
            TruncatedBody => "truncated_body",
            InvalidBody => "invalid_body",
            AttemptTimeout => "attempt_timeout",
            DriverLost => "driver_lost",
            StreamCut => "stream_cut",
            StreamAbandoned => "stream_abandoned",
            StreamIncomplete => "stream_incomplete",
            StreamError => "stream_error",
            StreamStall => "stream_stall",
            MalformedChunk => "malformed_chunk",
            Abandoned => "abandoned",
            Other(kind) => kind,
        }
    }

    /// The provider refused this request as such (its size, content,
    /// form, the caller's rate or quota), the request could be made into
    /// no provider's (`invalid_request`), or the answer broke its contract:
    /// what a client is told even when the job went to review, where any
    /// other kind is the job's own business (`job_needs_review`).
    pub fn is_refusal(&self) -> bool {
        use ErrorKind::*;
        matches!(
            self,
            ContextLengthExceeded
                | ContentPolicy
                | RateLimited
                | QuotaExceeded
                | ContractViolation
                | BadRequest
                | Unprocessable
                | InvalidPrompt
                | InvalidRequest
        )
    }

    /// The kind `text` spells: a named one, else [`ErrorKind::Other`]
    /// keeping the text. `parse(k.as_str())` is `k` for every kind.
    pub fn parse(text: &str) -> ErrorKind {
        NAMED
            .iter()
            .find(|k| k.as_str() == text)
            .cloned()
            .unwrap_or_else(|| ErrorKind::Other(text.to_string()))
    }
}

/// Two kinds are the same when they are spelt the same (so an
/// `Other("rate_limited")` built by hand still equals `RateLimited`).
impl PartialEq for ErrorKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ErrorKind {}

impl std::hash::Hash for ErrorKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

/// A kind compares with its text, as tests and logs spell it.
impl PartialEq<str> for ErrorKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for ErrorKind {
    fn from(text: &str) -> Self {
        ErrorKind::parse(text)
    }
}

impl Serialize for ErrorKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(ErrorKind::parse(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_text_and_json() {
        let mut kinds = NAMED.to_vec();
        kinds.push(ErrorKind::parse("a_providers_own_code"));
        for kind in &kinds {
            let text = kind.as_str();
            assert_eq!(&ErrorKind::parse(text), kind, "{text}");
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(&serde_json::from_str::<ErrorKind>(&json).unwrap(), kind);
        }
    }

    #[test]
    fn named_kinds_are_spelt_once_and_never_parse_as_other() {
        let mut seen = std::collections::HashSet::new();
        for kind in NAMED {
            assert!(seen.insert(kind.as_str()), "{kind} spelt twice");
            assert!(!matches!(kind, ErrorKind::Other(_)));
            assert!(!matches!(
                ErrorKind::parse(kind.as_str()),
                ErrorKind::Other(_)
            ));
        }
        assert_eq!(
            ErrorKind::parse("not_a_kind"),
            ErrorKind::Other("not_a_kind".into())
        );
        assert_eq!(
            ErrorKind::Other("rate_limited".into()),
            ErrorKind::RateLimited
        );
    }

    /// Every variant declared in the enum (but `Other`) is in [`NAMED`], read
    /// from this file's own source: a variant added without its entry there
    /// would parse back as `Other` and fail here instead.
    #[test]
    fn named_holds_every_variant_declared() {
        let declared = crate::domain::declared_variants(include_str!("error_kind.rs"), "ErrorKind");
        let named: std::collections::BTreeSet<String> =
            NAMED.iter().map(|kind| format!("{kind:?}")).collect();
        assert!(declared.len() > 10, "{declared:?}");
        assert_eq!(declared, named);
    }
}
