//! What an entry of a job's event log records: its kind, stored as text in
//! `job_events.kind` and shown in the API, the console and `onejob demo`.
//!
//! [`EventKind::as_str`] is that text and [`EventKind::parse`] reads it
//! back. A kind this build does not name is kept as [`EventKind::Other`],
//! not refused: the log is an append-only audit shared by every instance,
//! and an instance one release behind must still read (and show) a job
//! whose log a newer one wrote to.

use serde::{Serialize, Serializer};
use std::fmt;

#[derive(Debug, Clone)]
pub enum EventKind {
    Created,
    Replayed,
    Conflict,
    AttemptStarted,
    AttemptSucceeded,
    AttemptFailed,
    AttemptUnknown,
    CasLost,
    Cancelled,
    AttemptAbandoned,
    RetryScheduled,
    BlockedOnUnknown,
    JobFailed,
    NeedsReview,
    RetryRequested,
    Resolved,
    AttemptResolved,
    /// A Response deleted through `DELETE /v1/responses/{id}`: the job stays,
    /// the response is no longer shown.
    ResponseDeleted,
    /// A kind this build does not name, kept as it was written. Made by
    /// [`EventKind::parse`] only, so it never spells a named kind.
    Other(String),
}

/// Every named kind (all but [`EventKind::Other`]): what
/// [`EventKind::parse`] reads. A variant added above is added here.
pub const NAMED: &[EventKind] = &[
    EventKind::Created,
    EventKind::Replayed,
    EventKind::Conflict,
    EventKind::AttemptStarted,
    EventKind::AttemptSucceeded,
    EventKind::AttemptFailed,
    EventKind::AttemptUnknown,
    EventKind::CasLost,
    EventKind::Cancelled,
    EventKind::AttemptAbandoned,
    EventKind::RetryScheduled,
    EventKind::BlockedOnUnknown,
    EventKind::JobFailed,
    EventKind::NeedsReview,
    EventKind::RetryRequested,
    EventKind::Resolved,
    EventKind::AttemptResolved,
    EventKind::ResponseDeleted,
];

impl EventKind {
    /// The kind as stored and shown (`attempt_started`).
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Created => "created",
            EventKind::Replayed => "replayed",
            EventKind::Conflict => "conflict",
            EventKind::AttemptStarted => "attempt_started",
            EventKind::AttemptSucceeded => "attempt_succeeded",
            EventKind::AttemptFailed => "attempt_failed",
            EventKind::AttemptUnknown => "attempt_unknown",
            EventKind::CasLost => "cas_lost",
            EventKind::Cancelled => "cancelled",
            EventKind::AttemptAbandoned => "attempt_abandoned",
            EventKind::RetryScheduled => "retry_scheduled",
            EventKind::BlockedOnUnknown => "blocked_on_unknown",
            EventKind::JobFailed => "job_failed",
            EventKind::NeedsReview => "needs_review",
            EventKind::RetryRequested => "retry_requested",
            EventKind::Resolved => "resolved",
            EventKind::AttemptResolved => "attempt_resolved",
            EventKind::ResponseDeleted => "response_deleted",
            EventKind::Other(kind) => kind,
        }
    }

    /// The kind `text` spells: a named one, else [`EventKind::Other`]
    /// keeping the text. `parse(k.as_str())` is `k` for every kind.
    pub fn parse(text: &str) -> EventKind {
        NAMED
            .iter()
            .find(|k| k.as_str() == text)
            .cloned()
            .unwrap_or_else(|| EventKind::Other(text.to_string()))
    }
}

/// Two kinds are the same when they are spelt the same.
impl PartialEq for EventKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for EventKind {}

/// A kind compares with its text, as tests and templates spell it.
impl PartialEq<str> for EventKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for EventKind {
    fn from(text: &str) -> Self {
        EventKind::parse(text)
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_text() {
        let mut seen = std::collections::HashSet::new();
        for kind in NAMED {
            let text = kind.as_str();
            assert!(seen.insert(text), "{text} spelt twice");
            let parsed = EventKind::parse(text);
            assert_eq!(&parsed, kind, "{text}");
            assert!(!matches!(parsed, EventKind::Other(_)), "{text}");
            assert_eq!(serde_json::to_string(kind).unwrap(), format!("\"{text}\""));
        }
        // A newer build's kind is kept, not refused.
        let newer = EventKind::parse("webhook_delivered");
        assert_eq!(newer, EventKind::Other("webhook_delivered".into()));
        assert_eq!(newer.as_str(), "webhook_delivered");
    }

    /// Every variant declared in the enum (but `Other`) is in [`NAMED`], read
    /// from this file's own source: a variant added without its entry there
    /// would parse back as `Other` and fail here instead.
    #[test]
    fn named_holds_every_variant_declared() {
        let declared = crate::domain::declared_variants(include_str!("event_kind.rs"), "EventKind");
        let named: std::collections::BTreeSet<String> =
            NAMED.iter().map(|kind| format!("{kind:?}")).collect();
        assert!(declared.len() > 10, "{declared:?}");
        assert_eq!(declared, named);
    }
}
