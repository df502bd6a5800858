//! Pure types and transitions: jobs, attempts, job requests, fingerprints and
//! the guard that decides whether an attempt may start. No I/O here.

pub mod attempt;
pub mod breaker;
pub mod fingerprint;
pub mod job;
pub mod lifecycle;
pub mod request;
pub mod retry;

pub use attempt::{Attempt, AttemptKind, AttemptState, GuardRefusal, LiveAttempts};
pub use job::{Job, JobState};
pub use request::{JobRequest, RequestError};

/// Milliseconds since the Unix epoch; every timestamp onejob stores.
pub type Millis = i64;

/// A new random, time-ordered identifier (UUID v7), used for jobs and attempts.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
