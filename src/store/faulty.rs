//! A fault-injecting [`Store`] wrapper, for tests (test-support type).
//!
//! [`FaultyStore`] wraps a real store (SQLite or PostgreSQL) and forwards
//! every call to it, except where a test asked for a fault:
//!
//! - [`FaultyStore::fail_next`]: the next `n` calls of one method fail with a
//!   transient database error before reaching the database (nothing written);
//! - [`FaultyStore::fail_next_after_commit`]: the next `n` calls of one method
//!   reach the database and commit, then the caller gets the error anyway (the
//!   acknowledgement was lost: the ambiguous case a retry must survive);
//! - [`FaultyStore::set_down`]: while on, every call fails (a database blip);
//! - [`FaultyStore::hold`]: calls of one method park before or after reaching
//!   the database until [`FaultyStore::release`] (to drop a caller at a
//!   chosen await, deterministically).
//!
//! Method names are the [`Store`] trait's (`"create_job"`, `"start_attempt"`,
//! `"finish_attempt"`, …). [`FaultyStore::calls`] counts the calls each
//! method received, failed ones included. The injected error is
//! [`StoreError::Database`] with an `io::ErrorKind::ConnectionReset`, which
//! [`StoreError::is_transient`] reports as transient, like a real dropped
//! connection.

use super::tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};
use super::{
    console, ApiKey, AttemptResolution, CreateOutcome, FinishAttempt, FinishOutcome, JobEvent,
    JobResolution, JobTransition, NewEvent, ProviderAuditEntry, ProviderSwitch, Refusal,
    ReviewItem, Store, StoreError,
};
use super::{ContractRun, ContractRunSummary, NewContractRun};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job, Millis};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Where a held call parks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldPoint {
    /// Before the call reaches the database: nothing is written yet.
    Before,
    /// After the database answered (a write is committed), before the caller
    /// sees the answer.
    After,
}

struct Hold {
    point: HoldPoint,
    /// How many calls have parked so far.
    parked: watch::Sender<usize>,
    /// Turned on by `release`.
    open: watch::Sender<bool>,
}

#[derive(Default)]
struct Faults {
    fail_before: HashMap<String, usize>,
    fail_after: HashMap<String, usize>,
    holds: HashMap<String, Arc<Hold>>,
    calls: HashMap<String, usize>,
    failed: HashMap<String, usize>,
}

/// A [`Store`] that forwards to a real one and fails or holds chosen calls.
/// Test support: a server never builds one.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    down: AtomicBool,
    faults: Mutex<Faults>,
}

/// The error an injected fault returns: a connection reset, as when the
/// database server goes away mid-call.
pub fn injected_error() -> StoreError {
    StoreError::Database(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected by FaultyStore",
    )))
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            down: AtomicBool::new(false),
            faults: Mutex::new(Faults::default()),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The next `n` calls of `method` fail before reaching the database.
    pub fn fail_next(&self, method: &str, n: usize) {
        *self
            .faults()
            .fail_before
            .entry(method.to_string())
            .or_default() += n;
    }

    /// The next `n` calls of `method` reach the database (and commit), then
    /// return the injected error instead of the answer.
    pub fn fail_next_after_commit(&self, method: &str, n: usize) {
        *self
            .faults()
            .fail_after
            .entry(method.to_string())
            .or_default() += n;
    }

    /// While on, every call fails before reaching the database.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Calls of `method` park at `point` until [`FaultyStore::release`].
    pub fn hold(&self, method: &str, point: HoldPoint) {
        let hold = Hold {
            point,
            parked: watch::channel(0).0,
            open: watch::channel(false).0,
        };
        self.faults()
            .holds
            .insert(method.to_string(), Arc::new(hold));
    }

    /// Wait until `n` calls of `method` are parked by its hold (counting
    /// since `hold` was called). Returns at once if `method` is not held.
    pub async fn parked(&self, method: &str, n: usize) {
        let hold = self.faults().holds.get(method).cloned();
        if let Some(hold) = hold {
            let mut rx = hold.parked.subscribe();
            let _ = rx.wait_for(|parked| *parked >= n).await;
        }
    }

    /// Let every parked call of `method` go on and stop holding new ones.
    pub fn release(&self, method: &str) {
        if let Some(hold) = self.faults().holds.remove(method) {
            hold.open.send_replace(true);
        }
    }

    /// How many calls `method` has received (failed and held ones included).
    pub fn calls(&self, method: &str) -> usize {
        self.faults().calls.get(method).copied().unwrap_or(0)
    }

    /// How many calls of `method` got an injected error.
    pub fn failures(&self, method: &str) -> usize {
        self.faults().failed.get(method).copied().unwrap_or(0)
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        // A panic while holding this lock cannot leave the maps half-updated.
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count the call, fail it if asked, park it if held before.
    async fn before(&self, method: &str) -> Result<(), StoreError> {
        let hold = {
            let mut faults = self.faults();
            *faults.calls.entry(method.to_string()).or_default() += 1;
            let fail = match faults.fail_before.get_mut(method) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => self.is_down(),
            };
            if fail {
                *faults.failed.entry(method.to_string()).or_default() += 1;
                return Err(injected_error());
            }
            faults.holds.get(method).cloned()
        };
        if let Some(hold) = hold {
            if hold.point == HoldPoint::Before {
                park(&hold).await;
            }
        }
        Ok(())
    }

    /// Park the call if held after; fail it if asked to fail after commit.
    async fn after<T>(&self, method: &str, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let hold = self.faults().holds.get(method).cloned();
        if let Some(hold) = hold {
            if hold.point == HoldPoint::After {
                park(&hold).await;
            }
        }
        let mut faults = self.faults();
        if let Some(left) = faults.fail_after.get_mut(method) {
            if *left > 0 {
                *left -= 1;
                *faults.failed.entry(method.to_string()).or_default() += 1;
                return Err(injected_error());
            }
        }
        result
    }
}

async fn park(hold: &Hold) {
    let mut open = hold.open.subscribe();
    hold.parked.send_modify(|parked| *parked += 1);
    let _ = open.wait_for(|open| *open).await;
}

/// Forward one call through the fault points.
macro_rules! forward {
    ($self:ident, $name:literal, $call:expr) => {{
        $self.before($name).await?;
        let result = $call.await;
        $self.after($name, result).await
    }};
}

#[async_trait]
impl Store for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// Detached events are dropped (with nothing written) while the store is
    /// down, as a real detached write would fail.
    fn record_event_detached(&self, event: NewEvent) {
        *self
            .faults()
            .calls
            .entry("record_event_detached".to_string())
            .or_default() += 1;
        if !self.is_down() {
            self.inner.record_event_detached(event);
        }
    }

    async fn close(&self) {
        self.inner.close().await
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        forward!(self, "migrate", self.inner.migrate())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        forward!(self, "ping", self.inner.ping())
    }

    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        forward!(self, "create_job", self.inner.create_job(job))
    }

    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError> {
        forward!(
            self,
            "find_job_by_key",
            self.inner.find_job_by_key(owner_id, key)
        )
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        forward!(self, "get_job", self.inner.get_job(id))
    }

    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
        forward!(self, "list_attempts", self.inner.list_attempts(job_id))
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        forward!(self, "start_attempt", self.inner.start_attempt(attempt))
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        forward!(self, "finish_attempt", self.inner.finish_attempt(finish))
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        forward!(self, "record_event", self.inner.record_event(event))
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        forward!(self, "record_events", self.inner.record_events(events))
    }

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
        forward!(self, "list_events", self.inner.list_events(job_id))
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        forward!(self, "count_jobs", self.inner.count_jobs())
    }

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        forward!(self, "insert_api_key", self.inner.insert_api_key(key))
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        forward!(self, "find_api_key", self.inner.find_api_key(key_hash))
    }

    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError> {
        forward!(
            self,
            "claim_jobs",
            self.inner
                .claim_jobs(owner, now, lease_until, limit, reclaim_own)
        )
    }

    async fn renew_lease(
        &self,
        job_id: &str,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        forward!(
            self,
            "renew_lease",
            self.inner.renew_lease(job_id, owner, lease_until)
        )
    }

    async fn transition_job(
        &self,
        job_id: &str,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        forward!(
            self,
            "transition_job",
            self.inner
                .transition_job(job_id, lease_owner, transition, at)
        )
    }

    async fn wake_job(&self, job_id: &str, at: Millis) -> Result<(), StoreError> {
        forward!(self, "wake_job", self.inner.wake_job(job_id, at))
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        forward!(
            self,
            "list_unknown_attempts",
            self.inner.list_unknown_attempts(after, limit)
        )
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        forward!(
            self,
            "list_stale_started",
            self.inner.list_stale_started(started_before, limit)
        )
    }

    async fn cancel_job(
        &self,
        job_id: &str,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        forward!(
            self,
            "cancel_job",
            self.inner.cancel_job(job_id, actor, reason, at)
        )
    }

    async fn request_retry(
        &self,
        job_id: &str,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        forward!(
            self,
            "request_retry",
            self.inner.request_retry(job_id, actor, at)
        )
    }

    async fn resolve_job(
        &self,
        job_id: &str,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        forward!(
            self,
            "resolve_job",
            self.inner
                .resolve_job(job_id, resolution, actor, reason, at)
        )
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &str,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        forward!(
            self,
            "resolve_attempt",
            self.inner
                .resolve_attempt(attempt_id, resolution, actor, reason, at)
        )
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        forward!(self, "list_review", self.inner.list_review(limit))
    }

    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        forward!(
            self,
            "set_provider_enabled",
            self.inner
                .set_provider_enabled(name, enabled, actor, reason, at)
        )
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        forward!(self, "provider_switches", self.inner.provider_switches())
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError> {
        forward!(
            self,
            "provider_audit",
            self.inner.provider_audit(name, limit)
        )
    }

    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        forward!(
            self,
            "insert_contract_run",
            self.inner.insert_contract_run(run)
        )
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        forward!(
            self,
            "latest_contract_runs",
            self.inner.latest_contract_runs()
        )
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        forward!(self, "contract_run", self.inner.contract_run(id))
    }

    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        forward!(self, "review_queue_depth", self.inner.review_queue_depth())
    }

    async fn list_jobs(
        &self,
        filter: &console::JobFilter,
        limit: i64,
    ) -> Result<Vec<Job>, StoreError> {
        forward!(self, "list_jobs", self.inner.list_jobs(filter, limit))
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<console::WindowStats, StoreError> {
        forward!(
            self,
            "window_stats",
            self.inner.window_stats(from, to, column_ms)
        )
    }

    async fn list_api_keys(&self, owner: Option<&str>) -> Result<Vec<KeyRecord>, StoreError> {
        forward!(self, "list_api_keys", self.inner.list_api_keys(owner))
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        forward!(self, "get_api_key", self.inner.get_api_key(id))
    }

    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError> {
        forward!(
            self,
            "revoke_api_key",
            self.inner.revoke_api_key(id, actor, at)
        )
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        forward!(
            self,
            "rotate_api_key",
            self.inner.rotate_api_key(rotation, actor)
        )
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        forward!(self, "touch_api_keys", self.inner.touch_api_keys(used))
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        forward!(self, "tenant_changes", self.inner.tenant_changes())
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        forward!(self, "owner_limits", self.inner.owner_limits())
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        forward!(self, "set_owner_limits", self.inner.set_owner_limits(row))
    }

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError> {
        forward!(self, "tenant_audit", self.inner.tenant_audit(limit))
    }

    async fn heartbeat(
        &self,
        instance: &str,
        at: Millis,
        since: Millis,
    ) -> Result<i64, StoreError> {
        forward!(self, "heartbeat", self.inner.heartbeat(instance, at, since))
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        forward!(
            self,
            "leave_instances",
            self.inner.leave_instances(instance)
        )
    }

    async fn owner_load(
        &self,
        owner: &str,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError> {
        forward!(self, "owner_load", self.inner.owner_load(owner, key, day))
    }

    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError> {
        forward!(
            self,
            "set_key_limits",
            self.inner.set_key_limits(id, limits, actor, reason, at)
        )
    }

    async fn usage(&self, owner: Option<&str>, from_day: i64) -> Result<Vec<UsageRow>, StoreError> {
        forward!(self, "usage", self.inner.usage(owner, from_day))
    }
}
