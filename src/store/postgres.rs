//! The PostgreSQL backend: a connection pool, one READ COMMITTED transaction
//! per write, and `FOR UPDATE` on the row a guarded step decides about, so
//! concurrent connections (and processes) queue on that row instead of
//! racing past the check. Dispatchers claim with `SKIP LOCKED`. The creates
//! of concurrent callers share one statement and its commit, and so do
//! their succeeded attempts' wins (`batches.rs`): most of PostgreSQL's work
//! per statement (building the plan's nodes, the commit) is the same for
//! one row or many.

use super::batches::{self, Batcher, TriedWin};
use super::console::{JobFilter, WindowStats};
use super::hedging::HedgingShare;
use super::tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};
use super::webhooks::{
    ClaimedDelivery, WebhookCounts, WebhookDelivery, WebhookEndpoint, WebhookTry, WebhookTryRecord,
};
use super::AttemptOutcome;
use super::{
    ApiKey, AttemptResolution, AttemptStore, CommitCounter, CommitCounts, ConsoleStore,
    ContractRun, ContractRunStore, ContractRunSummary, CreateOutcome, EventStore, FinishAttempt,
    FinishOutcome, HedgingStore, JobEvent, JobResolution, JobStore, JobTransition, KeyStore,
    NewContractRun, NewEvent, ProviderAuditEntry, ProviderSwitch, Refusal, ReviewItem, Store,
    StoreError, SwitchStore, WebhookStore,
};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, AttemptId, GuardRefusal, Job, JobId, Millis, OwnerId};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::sql::postgres as ops;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A pooled connection idle this long is pinged before it is used.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

pub struct PgStore {
    pool: PgPool,
    /// Creates waiting for the next shared statement (`batches.rs`).
    creates: Batcher<NewJob, Result<CreateOutcome, StoreError>>,
    /// Succeeded attempts' finishes waiting for the next shared statement.
    wins: Batcher<FinishAttempt, TriedWin>,
    /// The two batchers' statements.
    commits: Arc<CommitCounter>,
}

impl PgStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        // The pool retries a refused connection until its acquire timeout
        // and then says only that it timed out: one connection first says
        // at once why none can be made (refused, no such database, a bad
        // password), within the same bound.
        let first = tokio::time::timeout(
            Duration::from_secs(10),
            sqlx::Connection::connect_with(&options),
        )
        .await;
        match first {
            Ok(Ok(conn)) => {
                let conn: sqlx::PgConnection = conn;
                let _ = sqlx::Connection::close(conn).await;
            }
            Ok(Err(e)) => return Err(e.into()),
            // A server that accepts but does not answer: the pool's own
            // bound below says so as before.
            Err(_elapsed) => {}
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            // sqlx pings a connection when it is given back (always) and,
            // by default, again when it is taken: a round trip on every
            // store call's path. Taken soon after its last use, a
            // connection was just proven live by that ping; one idle for
            // longer may have been dropped by the server meanwhile (a
            // restart, an idle timeout), so only that one is pinged.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        let commits = Arc::new(CommitCounter::default());
        let creates = Batcher::new(
            pool.clone(),
            PING_IDLE_AFTER,
            batches::CREATE_BATCHES_IN_FLIGHT,
            batches::MAX_CREATE_BATCH,
            commits.clone(),
            batches::create_batch,
        );
        let wins = Batcher::new(
            pool.clone(),
            PING_IDLE_AFTER,
            batches::FINISH_BATCHES_IN_FLIGHT,
            batches::MAX_FINISH_BATCH,
            commits.clone(),
            batches::finish_batch,
        );
        Ok(PgStore {
            pool,
            creates,
            wins,
            commits,
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // Another program's tables and no migrations of ours: refused
        // before the migrator creates its table there.
        let (ours, tables): (bool, bool) = sqlx::query_as(
            "SELECT to_regclass('_sqlx_migrations') IS NOT NULL, \
             EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema())",
        )
        .fetch_one(&self.pool)
        .await?;
        if tables && !ours {
            return Err(StoreError::NotOnejob);
        }
        // The migrator takes an advisory lock, so concurrent starts are safe.
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn commit_counts(&self) -> CommitCounts {
        self.commits.counts()
    }

    fn record_event_detached(&self, event: NewEvent) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let result = match pool.acquire().await {
                Ok(mut conn) => ops::insert_event(&mut *conn, &event).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "detached event write failed");
            }
        });
    }

    async fn close(&self) {
        self.creates.close();
        self.wins.close();
        self.pool.close().await;
    }
}

#[async_trait]
impl JobStore for PgStore {
    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        // In the next shared statement, which commits on its own.
        self.creates.call(job).await?
    }

    async fn find_job_by_key(
        &self,
        owner_id: &OwnerId,
        key: &str,
    ) -> Result<Option<Job>, StoreError> {
        ops::find_job_by_key(&mut *self.pool.acquire().await?, owner_id, key).await
    }

    async fn latest_job_by_keys(
        &self,
        owner_id: &OwnerId,
        keys: &[String],
    ) -> Result<Option<Job>, StoreError> {
        ops::latest_job_by_keys(&mut *self.pool.acquire().await?, owner_id, keys).await
    }

    async fn get_job(&self, id: &JobId) -> Result<Option<Job>, StoreError> {
        ops::get_job(&mut *self.pool.acquire().await?, id).await
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        ops::count_jobs(&mut *self.pool.acquire().await?).await
    }

    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::claim_jobs(&mut *tx, owner, now, lease_until, limit, reclaim_own).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn renew_lease(
        &self,
        job_id: &JobId,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        ops::renew_lease(&mut *self.pool.acquire().await?, job_id, owner, lease_until).await
    }

    async fn transition_job(
        &self,
        job_id: &JobId,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::transition_job(&mut *tx, job_id, lease_owner, transition, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn wake_job(&self, job_id: &JobId, at: Millis) -> Result<(), StoreError> {
        ops::wake_job(&mut *self.pool.acquire().await?, job_id, at).await
    }

    async fn cancel_job(
        &self,
        job_id: &JobId,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::cancel_job(&mut *tx, job_id, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn request_retry(
        &self,
        job_id: &JobId,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::request_retry(&mut *tx, job_id, actor, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn resolve_job(
        &self,
        job_id: &JobId,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::resolve_job(&mut *tx, job_id, resolution, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        ops::list_review(&mut *self.pool.acquire().await?, limit).await
    }
}

#[async_trait]
impl AttemptStore for PgStore {
    async fn list_attempts(&self, job_id: &JobId) -> Result<Vec<Attempt>, StoreError> {
        ops::list_attempts(&mut *self.pool.acquire().await?, job_id).await
    }

    async fn get_attempt(&self, attempt_id: &AttemptId) -> Result<Option<Attempt>, StoreError> {
        ops::get_attempt(&mut *self.pool.acquire().await?, attempt_id).await
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::start_attempt(&mut *tx, attempt).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        // A win goes in the next shared statement, which commits on its
        // own; anything else (a failure, a lost CAS, an attempt gone or
        // ended) is told by the whole step in a transaction.
        let finish = finish.storable();
        let finish = match finish.outcome {
            AttemptOutcome::Succeeded(_) => match self.wins.call(finish).await?? {
                Ok(won) => return Ok(won),
                Err(not_won) => *not_won,
            },
            _ => finish,
        };
        let mut tx = self.pool.begin().await?;
        let value = ops::finish_attempt(&mut *tx, finish).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &AttemptId)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_unknown_attempts(
            &mut *self.pool.acquire().await?,
            after.map(|(at, id)| (at, id.as_str())),
            limit,
        )
        .await
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_stale_started(&mut *self.pool.acquire().await?, started_before, limit).await
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &AttemptId,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value =
            ops::resolve_attempt(&mut *tx, attempt_id, resolution, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }
}

#[async_trait]
impl EventStore for PgStore {
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        ops::record_event(&mut *self.pool.acquire().await?, event).await
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::record_events(&mut *tx, events).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn list_events(&self, job_id: &JobId) -> Result<Vec<JobEvent>, StoreError> {
        ops::list_events(&mut *self.pool.acquire().await?, job_id).await
    }

    async fn has_event(&self, job_id: &JobId, kind: &str) -> Result<bool, StoreError> {
        ops::has_event(&mut *self.pool.acquire().await?, job_id, kind).await
    }
}

#[async_trait]
impl KeyStore for PgStore {
    async fn insert_api_key(&self, key: ApiKey, actor: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        ops::create_api_key(&mut *tx, key, actor).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        ops::find_api_key(&mut *self.pool.acquire().await?, key_hash).await
    }

    async fn list_api_keys(&self, owner: Option<&OwnerId>) -> Result<Vec<KeyRecord>, StoreError> {
        ops::list_api_keys(&mut *self.pool.acquire().await?, owner.map(OwnerId::as_str)).await
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        ops::get_api_key(&mut *self.pool.acquire().await?, id).await
    }

    async fn revoke_api_key(
        &self,
        id: &str,
        actor: &str,
        reason: Option<&str>,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::revoke_api_key(&mut *tx, id, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::rotate_api_key(&mut *tx, rotation, actor).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::touch_api_keys(&mut *tx, used).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        ops::tenant_changes(&mut *self.pool.acquire().await?).await
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        ops::owner_limits(&mut *self.pool.acquire().await?).await
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::set_owner_limits(&mut *tx, row).await?;
        tx.commit().await?;
        Ok(value)
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
        let mut tx = self.pool.begin().await?;
        let value = ops::heartbeat(&mut *tx, instance, at, since).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        ops::leave_instances(&mut *self.pool.acquire().await?, instance).await
    }

    async fn owner_load(
        &self,
        owner: &OwnerId,
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
        let mut tx = self.pool.begin().await?;
        let value = ops::set_key_limits(&mut *tx, id, limits, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn usage(
        &self,
        owner: Option<&OwnerId>,
        from_day: i64,
    ) -> Result<Vec<UsageRow>, StoreError> {
        ops::usage(
            &mut *self.pool.acquire().await?,
            owner.map(OwnerId::as_str),
            from_day,
        )
        .await
    }
}

#[async_trait]
impl SwitchStore for PgStore {
    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::set_provider_enabled(&mut *tx, name, enabled, actor, reason, at).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        ops::provider_switches(&mut *self.pool.acquire().await?).await
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError> {
        ops::provider_audit(&mut *self.pool.acquire().await?, name, limit).await
    }
}

#[async_trait]
impl ContractRunStore for PgStore {
    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        ops::insert_contract_run(&mut *self.pool.acquire().await?, run).await
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        ops::latest_contract_runs(&mut *self.pool.acquire().await?).await
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        ops::contract_run(&mut *self.pool.acquire().await?, id).await
    }
}

#[async_trait]
impl ConsoleStore for PgStore {
    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        ops::review_queue_depth(&mut *self.pool.acquire().await?).await
    }

    async fn list_jobs(&self, filter: &JobFilter, limit: i64) -> Result<Vec<Job>, StoreError> {
        ops::list_jobs(&mut *self.pool.acquire().await?, filter, limit).await
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<WindowStats, StoreError> {
        ops::window_stats(&mut *self.pool.acquire().await?, from, to, column_ms).await
    }
}

#[async_trait]
impl HedgingStore for PgStore {
    async fn put_hedging_shares(
        &self,
        shares: Vec<HedgingShare>,
        forget_before: Millis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::put_hedging_shares(&mut *tx, shares, forget_before).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn hedging_shares(&self, since: Millis) -> Result<Vec<HedgingShare>, StoreError> {
        ops::hedging_shares(&mut *self.pool.acquire().await?, since).await
    }
}

#[async_trait]
impl WebhookStore for PgStore {
    async fn insert_webhook_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        ops::insert_webhook_endpoint(&mut *self.pool.acquire().await?, endpoint).await
    }

    async fn list_webhook_endpoints(
        &self,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<WebhookEndpoint>, StoreError> {
        ops::list_webhook_endpoints(&mut *self.pool.acquire().await?, owner.map(OwnerId::as_str))
            .await
    }

    async fn get_webhook_endpoint(&self, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        ops::get_webhook_endpoint(&mut *self.pool.acquire().await?, id).await
    }

    async fn delete_webhook_endpoint(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::delete_webhook_endpoint(&mut *tx, id).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &str,
        previous_until: Millis,
        at: Millis,
    ) -> Result<bool, StoreError> {
        ops::rotate_webhook_secret(
            &mut *self.pool.acquire().await?,
            id,
            secret,
            previous_until,
            at,
        )
        .await
    }

    async fn claim_webhook_deliveries(
        &self,
        instance: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        per_endpoint: i64,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::claim_webhook_deliveries(
            &mut *tx,
            instance,
            now,
            lease_until,
            limit,
            per_endpoint,
        )
        .await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn record_webhook_try(&self, record: WebhookTryRecord) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let value = ops::record_webhook_try(&mut *tx, record).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn list_webhook_deliveries(
        &self,
        endpoint_id: &str,
        limit: i64,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        ops::list_webhook_deliveries(&mut *self.pool.acquire().await?, endpoint_id, limit).await
    }

    async fn get_webhook_delivery(&self, id: &str) -> Result<Option<WebhookDelivery>, StoreError> {
        ops::get_webhook_delivery(&mut *self.pool.acquire().await?, id).await
    }

    async fn list_webhook_tries(&self, delivery_id: &str) -> Result<Vec<WebhookTry>, StoreError> {
        ops::list_webhook_tries(&mut *self.pool.acquire().await?, delivery_id).await
    }

    async fn redeliver_webhook(&self, id: &str, at: Millis) -> Result<bool, StoreError> {
        ops::redeliver_webhook(&mut *self.pool.acquire().await?, id, at).await
    }

    async fn webhook_counts(&self) -> Result<WebhookCounts, StoreError> {
        ops::webhook_counts(&mut *self.pool.acquire().await?).await
    }
}
