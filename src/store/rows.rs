//! Row types shared by both backends and their conversion to domain types.

use super::sql::db::{Columns, Row};
use super::{
    parse_attempt_kind, parse_attempt_state, parse_job_state, ApiKey, JobEvent, StoreError,
};
use crate::domain::{Attempt, AttemptId, ErrorKind, EventKind, FinishReason, Job};

/// The column list of `JobRow`, as a literal for `concat!`.
macro_rules! job_columns {
    () => {
        "id, owner_id, idempotency_key, fingerprint, request, route, state, version, result, \
         completed_by, last_error, attempt_count, created_at, updated_at, next_run_at, lease_owner, \
         lease_until, budget_start"
    };
}
pub(crate) use job_columns;

/// The column list of `AttemptRow`, as a literal for `concat!`.
macro_rules! attempt_columns {
    () => {
        "id, job_id, seq, provider, kind, state, read_version, started_at, finished_at, \
         error_kind, error_message, output, usage, provider_request_id, finish_reason"
    };
}
pub(crate) use attempt_columns;

pub(crate) struct JobRow {
    id: String,
    owner_id: String,
    idempotency_key: String,
    fingerprint: String,
    request: String,
    route: String,
    state: String,
    version: i64,
    result: Option<String>,
    completed_by: Option<String>,
    last_error: Option<String>,
    attempt_count: i64,
    created_at: i64,
    updated_at: i64,
    next_run_at: Option<i64>,
    lease_owner: Option<String>,
    lease_until: Option<i64>,
    budget_start: i64,
}

impl JobRow {
    pub(crate) fn owner_id(&self) -> &str {
        &self.owner_id
    }

    pub(crate) fn route(&self) -> &str {
        &self.route
    }
}

impl Row for JobRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(JobRow {
            id: row.get("id")?,
            owner_id: row.get("owner_id")?,
            idempotency_key: row.get("idempotency_key")?,
            fingerprint: row.get("fingerprint")?,
            request: row.get("request")?,
            route: row.get("route")?,
            state: row.get("state")?,
            version: row.get("version")?,
            result: row.get("result")?,
            completed_by: row.get("completed_by")?,
            last_error: row.get("last_error")?,
            attempt_count: row.get("attempt_count")?,
            created_at: row.get("created_at")?,
            updated_at: row.get("updated_at")?,
            next_run_at: row.get("next_run_at")?,
            lease_owner: row.get("lease_owner")?,
            lease_until: row.get("lease_until")?,
            budget_start: row.get("budget_start")?,
        })
    }
}

/// A job in the review queue with its last attempt's start, in one row.
pub(crate) struct ReviewRow {
    pub job: JobRow,
    pub last_attempt_at: Option<i64>,
}

impl Row for ReviewRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(ReviewRow {
            job: JobRow::decode(row)?,
            last_attempt_at: row.get("last_attempt_at")?,
        })
    }
}

impl TryFrom<JobRow> for Job {
    type Error = StoreError;
    fn try_from(r: JobRow) -> Result<Self, StoreError> {
        Ok(Job {
            state: parse_job_state(&r.state)?,
            id: r.id.into(),
            owner_id: r.owner_id.into(),
            idempotency_key: r.idempotency_key,
            fingerprint: r.fingerprint,
            request: r.request,
            route: r.route,
            version: r.version,
            result: r.result,
            completed_by: r.completed_by,
            last_error: r.last_error,
            attempt_count: r.attempt_count,
            created_at: r.created_at,
            updated_at: r.updated_at,
            next_run_at: r.next_run_at,
            lease_owner: r.lease_owner,
            lease_until: r.lease_until,
            budget_start: r.budget_start,
        })
    }
}

pub(crate) struct AttemptRow {
    id: String,
    job_id: String,
    seq: i64,
    provider: String,
    kind: String,
    state: String,
    read_version: i64,
    started_at: i64,
    finished_at: Option<i64>,
    error_kind: Option<String>,
    error_message: Option<String>,
    output: Option<String>,
    usage: Option<String>,
    provider_request_id: Option<String>,
    finish_reason: Option<String>,
}

impl Row for AttemptRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(AttemptRow {
            id: row.get("id")?,
            job_id: row.get("job_id")?,
            seq: row.get("seq")?,
            provider: row.get("provider")?,
            kind: row.get("kind")?,
            state: row.get("state")?,
            read_version: row.get("read_version")?,
            started_at: row.get("started_at")?,
            finished_at: row.get("finished_at")?,
            error_kind: row.get("error_kind")?,
            error_message: row.get("error_message")?,
            output: row.get("output")?,
            usage: row.get("usage")?,
            provider_request_id: row.get("provider_request_id")?,
            finish_reason: row.get("finish_reason")?,
        })
    }
}

impl TryFrom<AttemptRow> for Attempt {
    type Error = StoreError;
    fn try_from(r: AttemptRow) -> Result<Self, StoreError> {
        Ok(Attempt {
            kind: parse_attempt_kind(&r.kind)?,
            state: parse_attempt_state(&r.state)?,
            id: r.id.into(),
            job_id: r.job_id.into(),
            seq: r.seq,
            provider: r.provider,
            read_version: r.read_version,
            started_at: r.started_at,
            finished_at: r.finished_at,
            error_kind: r.error_kind.as_deref().map(ErrorKind::parse),
            error_message: r.error_message,
            output: r.output,
            usage: r.usage,
            provider_request_id: r.provider_request_id,
            // A reason a later build wrote and this one does not know is
            // told as an unknown one is: by the answer.
            finish_reason: r
                .finish_reason
                .as_deref()
                .and_then(FinishReason::parse_stored),
        })
    }
}

pub(crate) struct EventRow {
    id: i64,
    job_id: String,
    attempt_id: Option<String>,
    kind: String,
    actor: String,
    detail: Option<String>,
    at: i64,
}

impl Row for EventRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(EventRow {
            id: row.get("id")?,
            job_id: row.get("job_id")?,
            attempt_id: row.get("attempt_id")?,
            kind: row.get("kind")?,
            actor: row.get("actor")?,
            detail: row.get("detail")?,
            at: row.get("at")?,
        })
    }
}

impl From<EventRow> for JobEvent {
    fn from(r: EventRow) -> Self {
        JobEvent {
            id: r.id,
            job_id: r.job_id.into(),
            attempt_id: r.attempt_id.map(AttemptId::from),
            kind: EventKind::parse(&r.kind),
            actor: r.actor,
            detail: r.detail,
            at: r.at,
        }
    }
}

pub(crate) struct ApiKeyRow {
    id: String,
    owner_id: String,
    key_hash: String,
    prefix: String,
    is_admin: bool,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
    limits: Option<String>,
    family_id: Option<String>,
}

impl Row for ApiKeyRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(ApiKeyRow {
            id: row.get("id")?,
            owner_id: row.get("owner_id")?,
            key_hash: row.get("key_hash")?,
            prefix: row.get("prefix")?,
            is_admin: row.get("is_admin")?,
            created_at: row.get("created_at")?,
            expires_at: row.get("expires_at")?,
            revoked_at: row.get("revoked_at")?,
            limits: row.get("limits")?,
            family_id: row.get("family_id")?,
        })
    }
}

impl From<ApiKeyRow> for ApiKey {
    fn from(r: ApiKeyRow) -> Self {
        ApiKey {
            id: r.id,
            owner_id: r.owner_id.into(),
            key_hash: r.key_hash,
            prefix: r.prefix,
            is_admin: r.is_admin,
            created_at: r.created_at,
            expires_at: r.expires_at,
            revoked_at: r.revoked_at,
            limits: r.limits,
            family_id: r.family_id,
        }
    }
}

/// Counts the guard needs, read in the same atomic step as the insert.
pub(crate) struct LiveRow {
    pub started: Option<i64>,
    pub unknown: Option<i64>,
    pub hedges: Option<i64>,
    pub started_here: Option<i64>,
    pub unknown_here: Option<i64>,
}

impl Row for LiveRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(LiveRow {
            started: row.get("started")?,
            unknown: row.get("unknown")?,
            hedges: row.get("hedges")?,
            started_here: row.get("started_here")?,
            unknown_here: row.get("unknown_here")?,
        })
    }
}

impl From<LiveRow> for crate::domain::LiveAttempts {
    fn from(r: LiveRow) -> Self {
        crate::domain::LiveAttempts {
            started: r.started.unwrap_or(0),
            unknown: r.unknown.unwrap_or(0),
            hedges: r.hedges.unwrap_or(0),
            started_here: r.started_here.unwrap_or(0),
            unknown_here: r.unknown_here.unwrap_or(0),
        }
    }
}
