//! Jobs in the store: the idempotent create, claims and leases, the
//! engine's job steps, user and admin decisions, the review queue: the
//! [`JobStore`] trait and its types. The SQL is in `sql/jobs.rs`.

use crate::domain::job::NewJob;
use crate::domain::{Job, JobId, Millis, OwnerId};
use crate::store::StoreError;
use async_trait::async_trait;

/// The answer to an idempotent create.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// This call inserted the job.
    Created(Job),
    /// A job with this owner and key already existed; it is returned as stored.
    Existing(Job),
}

/// A job-level step of the engine. Each applies only while the job is not
/// final and, when a lease holder is given, only while it still holds the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum JobTransition {
    /// Wait for a retry at `next_run_at` (state `pending`), keeping the lease until `lease_until`.
    Backoff {
        next_run_at: Millis,
        lease_until: Millis,
        reason: String,
    },
    /// Nothing to drive until an unknown attempt is settled; the lease is
    /// released. Should none be live any more (settled meanwhile), the job is
    /// runnable at once instead.
    BlockOnUnknown,
    /// The provider said no: the job is `failed` (version bumped).
    Fail { reason: String },
    /// A human decides: `needs_review`.
    Review { reason: String },
    /// Give the job back; any dispatcher may take it at `next_run_at`.
    Release { next_run_at: Millis },
}

/// An admin's decision on a job.
#[derive(Debug, Clone, PartialEq)]
pub enum JobResolution {
    /// Finish the job with this result (JSON text), as if an attempt had won.
    Complete { result: String },
    /// Start a fresh retry budget now.
    Retry,
    /// Stop: no result, no more attempts (`cancelled`).
    Close,
}

/// Why a user or admin request on a job was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not found")]
    NotFound,
    #[error("the job is already {0}")]
    Finished(&'static str),
    #[error("an attempt of this job is started or its outcome is unknown")]
    OutcomeUnknown,
    #[error("the attempt is {0}, not unknown")]
    NotUnknown(&'static str),
}

/// A job waiting for a human, as the review queue shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewItem {
    pub job: Job,
    pub last_attempt_at: Option<Millis>,
}

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Insert the job unless (owner, key) exists; the database decides.
    /// Writes the `created` event in the same commit.
    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError>;

    /// The job that holds (owner, key): one indexed read.
    async fn find_job_by_key(
        &self,
        owner_id: &OwnerId,
        key: &str,
    ) -> Result<Option<Job>, StoreError>;

    /// The newest of the owner's jobs held by any of `keys` (one
    /// statement): a keyless request's earlier windows, under
    /// `idempotency = "fingerprint"`.
    async fn latest_job_by_keys(
        &self,
        owner_id: &OwnerId,
        keys: &[String],
    ) -> Result<Option<Job>, StoreError>;

    async fn get_job(&self, id: &JobId) -> Result<Option<Job>, StoreError>;

    async fn count_jobs(&self) -> Result<i64, StoreError>;

    /// Take up to `limit` jobs that want a driver now and whose lease is free
    /// or expired (`FOR UPDATE SKIP LOCKED` on PostgreSQL). With
    /// `reclaim_own`, jobs already leased to `owner` are taken too (their
    /// lease is never shortened): after a claim whose acknowledgement was
    /// lost, the jobs it leased to `owner` are found again at once instead
    /// of waiting out a lease nobody drives under.
    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError>;

    /// Extend a held lease; false when it was lost.
    async fn renew_lease(
        &self,
        job_id: &JobId,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError>;

    /// Apply an engine step; false when the job is final or the lease was lost.
    async fn transition_job(
        &self,
        job_id: &JobId,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Make a job without a driver runnable at `at` (after an unknown attempt is settled).
    async fn wake_job(&self, job_id: &JobId, at: Millis) -> Result<(), StoreError>;

    async fn cancel_job(
        &self,
        job_id: &JobId,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    /// `POST /v1/jobs/{id}/retry`: refused while an attempt is started or unknown.
    async fn request_retry(
        &self,
        job_id: &JobId,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    async fn resolve_job(
        &self,
        job_id: &JobId,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError>;

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError>;
}
