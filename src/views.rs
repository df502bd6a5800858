//! What the API shows of jobs and attempts.

use crate::clock::rfc3339;
use crate::domain::{
    Attempt, AttemptId, AttemptState, ErrorKind, FinishReason, Job, JobId, JobState,
};
use serde::Serialize;
use serde_json::value::RawValue;

#[derive(Debug, Serialize)]
pub struct JobView {
    pub id: JobId,
    pub state: JobState,
    pub version: i64,
    pub route: String,
    pub idempotency_key: String,
    /// The winning attempt's output: embedded as JSON when it is JSON.
    pub result: Option<Box<RawValue>>,
    pub completed_by: Option<String>,
    pub last_error: Option<String>,
    pub attempt_count: i64,
    /// `"unknown_attempt"` while the job waits on an attempt whose outcome is unknown.
    pub blocked_on: Option<&'static str>,
    pub created_at: String,
    pub updated_at: String,
}

impl JobView {
    pub fn new(job: Job) -> Self {
        let blocked_on = job.is_blocked_on_unknown().then_some("unknown_attempt");
        JobView {
            result: job.result.map(embed_json),
            id: job.id,
            state: job.state,
            version: job.version,
            route: job.route,
            idempotency_key: job.idempotency_key,
            completed_by: job.completed_by,
            last_error: job.last_error,
            attempt_count: job.attempt_count,
            blocked_on,
            created_at: rfc3339(job.created_at),
            updated_at: rfc3339(job.updated_at),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AttemptView {
    pub id: AttemptId,
    pub seq: i64,
    pub provider: String,
    pub kind: crate::domain::AttemptKind,
    pub state: AttemptState,
    pub read_version: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub error_kind: Option<ErrorKind>,
    pub error_message: Option<String>,
    pub output: Option<Box<RawValue>>,
    pub usage: Option<Box<RawValue>>,
    pub provider_request_id: Option<String>,
    /// Why the provider stopped, for the winner (`stop`, `length`,
    /// `tool_calls`, `stop_sequence`, `content_filter`); `null` for every
    /// other attempt, and for a winner recorded before it was kept.
    pub finish_reason: Option<&'static str>,
    /// The stop sequence that ended the answer, when the provider said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        AttemptView {
            id: a.id,
            seq: a.seq,
            provider: a.provider,
            kind: a.kind,
            state: a.state,
            read_version: a.read_version,
            started_at: rfc3339(a.started_at),
            finished_at: a.finished_at.map(rfc3339),
            error_kind: a.error_kind,
            error_message: a.error_message,
            output: a.output.map(embed_json),
            usage: a.usage.map(embed_json),
            provider_request_id: a.provider_request_id,
            finish_reason: a.finish_reason.as_ref().map(FinishReason::name),
            stop_sequence: match a.finish_reason {
                Some(FinishReason::StopSequence(sequence)) => sequence,
                _ => None,
            },
        }
    }
}

/// Stored JSON text goes out as it is; other text goes out as a JSON string.
fn embed_json(text: String) -> Box<RawValue> {
    RawValue::from_string(text.clone()).unwrap_or_else(|_| {
        let quoted = serde_json::Value::String(text).to_string();
        // A serialised JSON string is always valid JSON.
        RawValue::from_string(quoted).unwrap_or_else(|_| Box::<RawValue>::default())
    })
}
