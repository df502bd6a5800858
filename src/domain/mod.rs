//! Pure types and transitions: jobs, attempts and the kinds of their
//! errors, the kinds of a job's events, job requests, fingerprints, owners' and keys' limits, the rule
//! for an audited change's reason, and the guard that decides whether an
//! attempt may start. No I/O here.

pub mod attempt;
pub mod breaker;
pub mod error_kind;
pub mod event_kind;
pub mod fingerprint;
pub mod finish;
pub mod hedging;
pub mod ids;
pub mod job;
pub mod json_error;
pub mod lifecycle;
pub mod limits;
pub mod reason;
pub mod request;
pub mod retry;
pub mod text;

pub use attempt::{Attempt, AttemptKind, AttemptState, GuardRefusal, LiveAttempts};
pub use error_kind::ErrorKind;
pub use event_kind::EventKind;
pub use finish::FinishReason;
pub use ids::{AttemptId, JobId, OwnerId};
pub use job::{Job, JobState};
pub use request::{JobRequest, RequestError};

/// `value` as compact JSON text, the same as `value.to_string()`, written
/// straight into the string: `to_string` goes through `fmt`, a call per
/// token, and cost twice as much on a job's path. (Serialising a `Value`
/// cannot fail: its keys are strings.)
pub fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Milliseconds since the Unix epoch; every timestamp onejob stores.
pub type Millis = i64;

/// A new random, time-ordered identifier (UUID v7), used for jobs and attempts.
/// On a thread inside [`ids_from_counter`] it is the next of a counter's ids.
pub fn new_id() -> String {
    IDS.with(|ids| {
        ids.borrow_mut().as_mut().map(|next| {
            *next += 1;
            uuid::Uuid::from_u128(*next).to_string()
        })
    })
    .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}

thread_local! {
    /// The last id [`new_id`] gave on this thread under [`ids_from_counter`].
    static IDS: std::cell::RefCell<Option<u128>> = const { std::cell::RefCell::new(None) };
}

/// Until the guard is dropped, [`new_id`] on this thread gives ids counted
/// up from `start` (still UUID-shaped and increasing) instead of wall-clock
/// and random ones: a deterministic simulation, run on one thread, then
/// makes the same ids from the same seed.
pub fn ids_from_counter(start: u128) -> CountedIds {
    IDS.with(|ids| *ids.borrow_mut() = Some(start));
    CountedIds(std::marker::PhantomData)
}

/// Restores random ids on its thread when dropped.
pub struct CountedIds(std::marker::PhantomData<*const ()>);

impl Drop for CountedIds {
    fn drop(&mut self) {
        IDS.with(|ids| *ids.borrow_mut() = None);
    }
}

/// The variants an enum declares, read from its file's source (all but
/// `Other(String)`): what a test compares a list of every variant with.
#[cfg(test)]
pub(crate) fn declared_variants(
    source: &str,
    enum_name: &str,
) -> std::collections::BTreeSet<String> {
    source
        .split(&format!("pub enum {enum_name} {{"))
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//"))
        .filter_map(|line| line.strip_suffix(','))
        .filter(|variant| *variant != "Other(String)")
        .map(str::to_string)
        .collect()
}
