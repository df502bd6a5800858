//! The store as the simulation sees it: the real SQLite store (its own
//! runtime, its own threads), called so that each call completes before the
//! simulated world moves on. The simulation's runtime thread waits for the
//! answer, so no simulated task runs and no simulated time passes while the
//! database works: a call is one atomic step at one instant, and the order
//! of calls is the order the simulated tasks make them. That is what makes a
//! seed replay exactly (sqlx's SQLite connections answer from their own
//! threads, at times the simulation cannot control).

use async_trait::async_trait;
use onejob::domain::attempt::NewAttempt;
use onejob::domain::job::NewJob;
use onejob::domain::{Attempt, GuardRefusal, Job, Millis};
use onejob::store::console::{JobFilter, WindowStats};
use onejob::store::tenants::{
    KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow,
};
use onejob::store::{
    ApiKey, AttemptResolution, ContractRun, ContractRunSummary, CreateOutcome, FinishAttempt,
    FinishOutcome, JobEvent, JobResolution, JobTransition, NewContractRun, NewEvent,
    ProviderAuditEntry, ProviderSwitch, Refusal, ReviewItem, Store, StoreError,
};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

/// One process's connection to the database. When the process dies, its
/// connection dies with it: every later call fails and nothing more is
/// written.
pub struct SyncStore {
    inner: Arc<dyn Store>,
    /// The runtime the real store's tasks (SQLite's group-commit writer) live on.
    rt: Handle,
    /// Calls made.
    calls: AtomicU64,
    dead: AtomicBool,
    /// Die at this call (1-based): before it reaches the database, or right
    /// after it committed (the caller never hears).
    kill_at: Option<(u64, bool)>,
    /// Called once when this store dies at `kill_at` (kills the engine).
    on_kill: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

fn dead<T>() -> Result<T, StoreError> {
    Err(StoreError::Closed)
}

impl SyncStore {
    pub fn new(inner: Arc<dyn Store>, rt: Handle, kill_at: Option<(u64, bool)>) -> Self {
        SyncStore {
            inner,
            rt,
            calls: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            kill_at,
            on_kill: Mutex::new(None),
        }
    }

    pub fn on_kill(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_kill.lock().unwrap() = Some(Box::new(f));
    }

    /// Close the real store (its connections and threads) and forget the
    /// kill hook (it holds the engine, which holds this store).
    pub fn shut(&self) {
        self.die();
        self.on_kill.lock().unwrap().take();
        let inner = self.inner.clone();
        run_on(&self.rt, async move { inner.close().await });
    }

    /// The process is gone: nothing more reaches the database from it.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn die_at_kill_point(&self) {
        self.die();
        let kill = self.on_kill.lock().unwrap().take();
        if let Some(kill) = kill {
            kill();
        }
    }

    /// Run one store call to its end on the store's runtime, blocking this
    /// (the simulation's) thread meanwhile; `None` when the process is dead
    /// (or dies at this call).
    fn blocking<T: Send>(&self, call: impl Future<Output = T> + Send) -> Option<T> {
        if self.is_dead() {
            return None;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let kill_here = self.kill_at.filter(|(at, _)| *at == n);
        if let Some((_, false)) = kill_here {
            self.die_at_kill_point();
            return None;
        }
        // On this thread, in the store runtime's context (anything the call
        // spawns goes there); nothing of the simulation's runtime runs meanwhile.
        // Unconstrained: the calling task's cooperative budget (128 channel
        // operations per poll) would otherwise run out after some 60 calls
        // made without yielding, and tokio defers the wake-up of an
        // exhausted budget to a scheduler this thread is blocking.
        let answer = {
            let _context = self.rt.enter();
            futures::executor::block_on(tokio::task::unconstrained(call))
        };
        if kill_here.is_some() {
            self.die_at_kill_point();
            return None;
        }
        Some(answer)
    }
}

/// Run `call` to its end on `rt` (from a thread of its own, so this works
/// from inside another runtime), blocking the calling thread meanwhile.
pub fn run_on<T: Send>(rt: &Handle, call: impl Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(call))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[async_trait]
impl Store for SyncStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.blocking(self.inner.migrate()).unwrap_or_else(dead)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(self.inner.ping()).unwrap_or_else(dead)
    }

    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        self.blocking(self.inner.create_job(job))
            .unwrap_or_else(dead)
    }

    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError> {
        self.blocking(self.inner.find_job_by_key(owner_id, key))
            .unwrap_or_else(dead)
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        self.blocking(self.inner.get_job(id)).unwrap_or_else(dead)
    }

    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
        self.blocking(self.inner.list_attempts(job_id))
            .unwrap_or_else(dead)
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        self.blocking(self.inner.start_attempt(attempt))
            .unwrap_or_else(dead)
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        self.blocking(self.inner.finish_attempt(finish))
            .unwrap_or_else(dead)
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        self.blocking(self.inner.record_event(event))
            .unwrap_or_else(dead)
    }

    fn record_event_detached(&self, event: NewEvent) {
        // Waited for here: another process's write must not race it to the
        // database, or the event log's order would vary from run to run.
        let _ = self.blocking(self.inner.record_event(event));
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        self.blocking(self.inner.record_events(events))
            .unwrap_or_else(dead)
    }

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
        self.blocking(self.inner.list_events(job_id))
            .unwrap_or_else(dead)
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        self.blocking(self.inner.count_jobs()).unwrap_or_else(dead)
    }

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.blocking(self.inner.insert_api_key(key))
            .unwrap_or_else(dead)
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        self.blocking(self.inner.find_api_key(key_hash))
            .unwrap_or_else(dead)
    }

    async fn close(&self) {
        self.blocking(self.inner.close()).unwrap_or_default()
    }

    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError> {
        self.blocking(
            self.inner
                .claim_jobs(owner, now, lease_until, limit, reclaim_own),
        )
        .unwrap_or_else(dead)
    }

    async fn renew_lease(
        &self,
        job_id: &str,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        self.blocking(self.inner.renew_lease(job_id, owner, lease_until))
            .unwrap_or_else(dead)
    }

    async fn transition_job(
        &self,
        job_id: &str,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        self.blocking(
            self.inner
                .transition_job(job_id, lease_owner, transition, at),
        )
        .unwrap_or_else(dead)
    }

    async fn wake_job(&self, job_id: &str, at: Millis) -> Result<(), StoreError> {
        self.blocking(self.inner.wake_job(job_id, at))
            .unwrap_or_else(dead)
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        self.blocking(self.inner.list_unknown_attempts(after, limit))
            .unwrap_or_else(dead)
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        self.blocking(self.inner.list_stale_started(started_before, limit))
            .unwrap_or_else(dead)
    }

    async fn cancel_job(
        &self,
        job_id: &str,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        self.blocking(self.inner.cancel_job(job_id, actor, reason, at))
            .unwrap_or_else(dead)
    }

    async fn request_retry(
        &self,
        job_id: &str,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        self.blocking(self.inner.request_retry(job_id, actor, at))
            .unwrap_or_else(dead)
    }

    async fn resolve_job(
        &self,
        job_id: &str,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        self.blocking(
            self.inner
                .resolve_job(job_id, resolution, actor, reason, at),
        )
        .unwrap_or_else(dead)
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &str,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        self.blocking(
            self.inner
                .resolve_attempt(attempt_id, resolution, actor, reason, at),
        )
        .unwrap_or_else(dead)
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        self.blocking(self.inner.list_review(limit))
            .unwrap_or_else(dead)
    }

    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        self.blocking(
            self.inner
                .set_provider_enabled(name, enabled, actor, reason, at),
        )
        .unwrap_or_else(dead)
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        self.blocking(self.inner.provider_switches())
            .unwrap_or_else(dead)
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError> {
        self.blocking(self.inner.provider_audit(name, limit))
            .unwrap_or_else(dead)
    }

    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        self.blocking(self.inner.insert_contract_run(run))
            .unwrap_or_else(dead)
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        self.blocking(self.inner.latest_contract_runs())
            .unwrap_or_else(dead)
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        self.blocking(self.inner.contract_run(id))
            .unwrap_or_else(dead)
    }

    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        self.blocking(self.inner.review_queue_depth())
            .unwrap_or_else(dead)
    }

    async fn list_jobs(&self, filter: &JobFilter, limit: i64) -> Result<Vec<Job>, StoreError> {
        self.blocking(self.inner.list_jobs(filter, limit))
            .unwrap_or_else(dead)
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<WindowStats, StoreError> {
        self.blocking(self.inner.window_stats(from, to, column_ms))
            .unwrap_or_else(dead)
    }

    async fn list_api_keys(&self, owner: Option<&str>) -> Result<Vec<KeyRecord>, StoreError> {
        self.blocking(self.inner.list_api_keys(owner))
            .unwrap_or_else(dead)
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.blocking(self.inner.get_api_key(id))
            .unwrap_or_else(dead)
    }

    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError> {
        self.blocking(self.inner.revoke_api_key(id, actor, at))
            .unwrap_or_else(dead)
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        self.blocking(self.inner.rotate_api_key(rotation, actor))
            .unwrap_or_else(dead)
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        self.blocking(self.inner.touch_api_keys(used))
            .unwrap_or_else(dead)
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        self.blocking(self.inner.tenant_changes())
            .unwrap_or_else(dead)
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        self.blocking(self.inner.owner_limits())
            .unwrap_or_else(dead)
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        self.blocking(self.inner.set_owner_limits(row))
            .unwrap_or_else(dead)
    }

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError> {
        self.blocking(self.inner.tenant_audit(limit))
            .unwrap_or_else(dead)
    }

    async fn heartbeat(
        &self,
        instance: &str,
        at: Millis,
        since: Millis,
    ) -> Result<i64, StoreError> {
        self.blocking(self.inner.heartbeat(instance, at, since))
            .unwrap_or_else(dead)
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        self.blocking(self.inner.leave_instances(instance))
            .unwrap_or_else(dead)
    }

    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError> {
        self.blocking(self.inner.set_key_limits(id, limits, actor, reason, at))
            .unwrap_or_else(dead)
    }

    async fn owner_load(
        &self,
        owner: &str,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError> {
        self.blocking(self.inner.owner_load(owner, key, day))
            .unwrap_or_else(dead)
    }

    async fn usage(&self, owner: Option<&str>, from_day: i64) -> Result<Vec<UsageRow>, StoreError> {
        self.blocking(self.inner.usage(owner, from_day))
            .unwrap_or_else(dead)
    }
}
