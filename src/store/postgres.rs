//! The PostgreSQL backend: a connection pool, one READ COMMITTED transaction
//! per write, and `FOR UPDATE` on the row a guarded step decides about, so
//! concurrent connections (and processes) queue on that row instead of
//! racing past the check.

use super::{
    ApiKey, CreateOutcome, FinishAttempt, FinishOutcome, JobEvent, NewEvent, Store, StoreError,
};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;

mod ops {
    crate::store::ops::store_ops!(sqlx::PgConnection, " FOR UPDATE");
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
        let mut tx = self.pool.begin().await?;
        let outcome = ops::create_job(&mut tx, job).await?;
        tx.commit().await?;
        Ok(outcome)
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
        let mut tx = self.pool.begin().await?;
        let outcome = ops::start_attempt(&mut tx, attempt).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcome = ops::finish_attempt(&mut tx, finish).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        ops::insert_event(&mut *self.pool.acquire().await?, &event).await
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
}
