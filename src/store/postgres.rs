//! The PostgreSQL backend: a connection pool, one READ COMMITTED transaction
//! per write, and `FOR UPDATE` on the row a guarded step decides about, so
//! concurrent connections (and processes) queue on that row instead of
//! racing past the check. Dispatchers claim with `SKIP LOCKED`.

use super::tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};
use super::{
    ApiKey, AttemptResolution, CreateOutcome, FinishAttempt, FinishOutcome, JobEvent,
    JobResolution, JobTransition, NewEvent, ProviderSwitch, Refusal, ReviewItem, Store, StoreError,
};
use super::{ContractRun, ContractRunSummary, NewContractRun};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job, Millis};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;

mod ops {
    crate::store::ops::store_ops!(sqlx::PgConnection, " FOR UPDATE");
    crate::store::lifecycle::lifecycle_ops!(
        sqlx::PgConnection,
        " FOR UPDATE",
        " FOR UPDATE SKIP LOCKED"
    );
    crate::store::contract_runs::contract_run_ops!(sqlx::PgConnection);
    crate::store::console::console_ops!(
        sqlx::PgConnection,
        "idempotency_key COLLATE \"C\"",
        "idempotency_key COLLATE \"C\""
    );
    crate::store::tenants::tenant_ops!(sqlx::PgConnection);
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(PgStore { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Run one store operation in its own transaction and commit it.
macro_rules! in_tx {
    ($store:expr, |$c:ident| $op:expr) => {{
        let mut tx = $store.pool.begin().await?;
        let $c: &mut PgConnection = &mut tx;
        let value = $op.await?;
        tx.commit().await?;
        Ok(value)
    }};
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // The migrator takes an advisory lock, so concurrent starts are safe.
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        in_tx!(self, |c| ops::create_job(c, job))
    }

    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError> {
        ops::find_job_by_key(&mut *self.pool.acquire().await?, owner_id, key).await
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        ops::get_job(&mut *self.pool.acquire().await?, id).await
    }

    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
        ops::list_attempts(&mut *self.pool.acquire().await?, job_id).await
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        in_tx!(self, |c| ops::start_attempt(c, attempt))
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        in_tx!(self, |c| ops::finish_attempt(c, finish))
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        ops::insert_event(&mut *self.pool.acquire().await?, &event).await
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        in_tx!(self, |c| ops::insert_events(c, &events))
    }

    fn record_event_detached(&self, event: NewEvent) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let result = match pool.acquire().await {
                Ok(mut conn) => ops::insert_event(&mut conn, &event).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "detached event write failed");
            }
        });
    }

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
        ops::list_events(&mut *self.pool.acquire().await?, job_id).await
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        ops::count_jobs(&mut *self.pool.acquire().await?).await
    }

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        ops::insert_api_key(&mut *self.pool.acquire().await?, &key).await
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        ops::find_api_key(&mut *self.pool.acquire().await?, key_hash).await
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError> {
        in_tx!(self, |c| ops::claim_jobs(
            c,
            owner,
            now,
            lease_until,
            limit,
            reclaim_own
        ))
    }

    async fn renew_lease(
        &self,
        job_id: &str,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        ops::renew_lease(&mut *self.pool.acquire().await?, job_id, owner, lease_until).await
    }

    async fn transition_job(
        &self,
        job_id: &str,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        in_tx!(self, |c| ops::transition_job(
            c,
            job_id,
            lease_owner,
            transition,
            at
        ))
    }

    async fn wake_job(&self, job_id: &str, at: Millis) -> Result<(), StoreError> {
        ops::wake_job(&mut *self.pool.acquire().await?, job_id, at).await
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_stale_started(&mut *self.pool.acquire().await?, started_before, limit).await
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_unknown_attempts(&mut *self.pool.acquire().await?, after, limit).await
    }

    async fn cancel_job(
        &self,
        job_id: &str,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        in_tx!(self, |c| ops::cancel_job(c, job_id, actor, reason, at))
    }

    async fn request_retry(
        &self,
        job_id: &str,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        in_tx!(self, |c| ops::request_retry(c, job_id, actor, at))
    }

    async fn resolve_job(
        &self,
        job_id: &str,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        in_tx!(self, |c| ops::resolve_job(
            c, job_id, resolution, actor, reason, at
        ))
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &str,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        in_tx!(self, |c| ops::resolve_attempt(
            c, attempt_id, resolution, actor, reason, at
        ))
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        ops::list_review(&mut *self.pool.acquire().await?, limit).await
    }

    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        in_tx!(self, |c| ops::set_provider_enabled(
            c, name, enabled, actor, reason, at
        ))
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        ops::provider_switches(&mut *self.pool.acquire().await?).await
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<super::ProviderAuditEntry>, StoreError> {
        ops::provider_audit(&mut *self.pool.acquire().await?, name, limit).await
    }

    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        ops::insert_contract_run(&mut *self.pool.acquire().await?, &run).await
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        ops::latest_contract_runs(&mut *self.pool.acquire().await?).await
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        ops::contract_run(&mut *self.pool.acquire().await?, id).await
    }

    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        ops::review_queue_depth(&mut *self.pool.acquire().await?).await
    }

    async fn list_jobs(
        &self,
        filter: &super::console::JobFilter,
        limit: i64,
    ) -> Result<Vec<Job>, StoreError> {
        ops::list_jobs(&mut *self.pool.acquire().await?, filter, limit).await
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<super::console::WindowStats, StoreError> {
        ops::window_stats(&mut *self.pool.acquire().await?, from, to, column_ms).await
    }

    async fn list_api_keys(&self, owner: Option<&str>) -> Result<Vec<KeyRecord>, StoreError> {
        ops::list_keys(&mut *self.pool.acquire().await?, owner).await
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        ops::get_key(&mut *self.pool.acquire().await?, id).await
    }

    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError> {
        in_tx!(self, |c| ops::revoke_key(c, id, actor, at))
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        in_tx!(self, |c| ops::rotate_key(c, &rotation, actor))
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        in_tx!(self, |c| ops::touch_keys(c, &used))
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        ops::tenant_changes(&mut *self.pool.acquire().await?).await
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        ops::owner_limits(&mut *self.pool.acquire().await?).await
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        in_tx!(self, |c| ops::set_owner_limits(c, &row))
    }

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError> {
        ops::tenant_audit(&mut *self.pool.acquire().await?, limit).await
    }

    async fn heartbeat(
        &self,
        instance: &str,
        at: Millis,
        since: Millis,
    ) -> Result<i64, StoreError> {
        in_tx!(self, |c| ops::heartbeat(c, instance, at, since))
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        ops::leave(&mut *self.pool.acquire().await?, instance).await
    }

    async fn owner_load(
        &self,
        owner: &str,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError> {
        ops::owner_load(&mut *self.pool.acquire().await?, owner, key, day).await
    }

    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError> {
        in_tx!(self, |c| ops::set_key_limits(
            c,
            id,
            limits.as_deref(),
            actor,
            reason,
            at
        ))
    }

    async fn usage(&self, owner: Option<&str>, from_day: i64) -> Result<Vec<UsageRow>, StoreError> {
        ops::usage(&mut *self.pool.acquire().await?, owner, from_day).await
    }
}
