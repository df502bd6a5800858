//! The embedded SQLite backend.
//!
//! Durability: WAL with `synchronous=FULL`, so a commit has reached the disk
//! before any caller is answered. Writes go through one writer task that
//! groups the writes of concurrent callers into one `BEGIN IMMEDIATE`
//! transaction (group commit), each inside its own savepoint so one failed
//! write never undoes another. `BEGIN IMMEDIATE` takes SQLite's write lock
//! up front, which makes every guarded step atomic against other processes
//! on the same file too (they wait up to the busy timeout). Reads use a small
//! pool of their own connections and never wait for the writer.

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
use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, MappedMutexGuard, Mutex, MutexGuard};

mod ops {
    crate::store::ops::store_ops!(sqlx::SqliteConnection, "");
    crate::store::lifecycle::lifecycle_ops!(sqlx::SqliteConnection, "", "");
    crate::store::contract_runs::contract_run_ops!(sqlx::SqliteConnection);
    crate::store::console::console_ops!(
        sqlx::SqliteConnection,
        "idempotency_key",
        "+idempotency_key"
    );
    crate::store::tenants::tenant_ops!(sqlx::SqliteConnection);
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Most writes one commit carries.
const MAX_BATCH: usize = 128;
/// How long a writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections that serve reads, besides the writer's.
const READERS: usize = 4;

/// Hands a write's result to its caller once the batch's commit is known.
type Deliver = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One write: runs on the writer's connection inside the batch transaction
/// and says whether it succeeded (a failed write is rolled back to its
/// savepoint) and how to deliver its result. Given `Err` (the batch could not
/// even begin) it runs nothing and delivers that error.
type WriteFn = Box<
    dyn for<'c> FnOnce(Result<&'c mut SqliteConnection, String>) -> BoxFuture<'c, (bool, Deliver)>
        + Send,
>;

enum WriteCmd {
    Write(WriteFn),
    /// Commit what is queued before it, then stop the writer.
    Close(oneshot::Sender<()>),
}

pub struct SqliteStore {
    path: PathBuf,
    read: Readers,
    writer: mpsc::Sender<WriteCmd>,
}

/// The read connections: a few of our own rather than a sqlx pool, because
/// the pool pings every connection given back to it (one more round trip to
/// the connection's worker thread, in a spawned task, per read), and a
/// connection to a local file cannot go stale. `None` once closed.
struct Readers {
    conns: Vec<Mutex<Option<SqliteConnection>>>,
    next: AtomicUsize,
}

impl Readers {
    /// A free connection if there is one, else wait for one.
    async fn get(&self) -> Result<MappedMutexGuard<'_, SqliteConnection>, StoreError> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let free = (0..n).find_map(|i| self.conns[(start + i) % n].try_lock().ok());
        let guard = match free {
            Some(guard) => guard,
            None => self.conns[start].lock().await,
        };
        MutexGuard::try_map(guard, Option::as_mut).map_err(|_| StoreError::Closed)
    }

    async fn close(&self) {
        for conn in &self.conns {
            if let Some(conn) = conn.lock().await.take() {
                let _ = sqlx::Connection::close(conn).await;
            }
        }
    }
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let writer_conn = options.clone().connect().await?;
        let mut conns = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            conns.push(Mutex::new(Some(options.clone().connect().await?)));
        }
        let read = Readers {
            conns,
            next: AtomicUsize::new(0),
        };
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run_writer(writer_conn, rx));
        Ok(SqliteStore {
            path: path.to_path_buf(),
            read,
            writer: tx,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `op` in the next group commit; its result arrives after the commit.
    async fn write<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel::<Result<T, StoreError>>();
        self.writer
            .send(WriteCmd::Write(wrap(op, Some(reply))))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

fn wrap<T, F>(op: F, reply: Option<oneshot::Sender<Result<T, StoreError>>>) -> WriteFn
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
        + Send
        + 'static,
{
    Box::new(move |conn| {
        Box::pin(async move {
            let result = match conn {
                Ok(conn) => op(conn).await,
                Err(message) => Err(StoreError::Batch(message)),
            };
            let ok = result.is_ok();
            let deliver: Deliver = Box::new(move |commit| {
                let result = match commit {
                    Ok(()) => result,
                    Err(message) => Err(StoreError::Batch(message)),
                };
                match reply {
                    // The caller may have gone away; what was committed stays committed.
                    Some(reply) => {
                        let _ = reply.send(result);
                    }
                    None => {
                        if let Err(e) = result {
                            tracing::warn!(error = %e, "detached write failed");
                        }
                    }
                }
            });
            (ok, deliver)
        })
    })
}

/// The single writer: takes what is queued (up to `MAX_BATCH`), commits it as
/// one transaction, then answers every caller. While it commits, the next
/// batch queues up, so the batch grows with the load.
async fn run_writer(mut conn: SqliteConnection, mut rx: mpsc::Receiver<WriteCmd>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closing = None;
    while let Some(cmd) = rx.recv().await {
        let mut next = Some(cmd);
        while let Some(cmd) = next.take() {
            match cmd {
                WriteCmd::Write(op) => batch.push(op),
                WriteCmd::Close(done) => {
                    closing = Some(done);
                    break;
                }
            }
            if batch.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            commit_batch(&mut conn, &mut batch).await;
        }
        if let Some(done) = closing.take() {
            rx.close();
            let _ = sqlx::Connection::close(conn).await;
            let _ = done.send(());
            return;
        }
    }
}

async fn commit_batch(conn: &mut SqliteConnection, batch: &mut Vec<WriteFn>) {
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        tracing::error!(error = %e, "sqlite writer could not begin a transaction");
        let message = e.to_string();
        for op in batch.drain(..) {
            let (_, deliver) = op(Err(message.clone())).await;
            deliver(Err(message.clone()));
        }
        return;
    }
    let mut delivers = Vec::with_capacity(batch.len());
    // A lone write (the common case under light load) needs no savepoint:
    // the transaction is its own, and a failure rolls it back whole.
    let mut lone_write_failed = false;
    if batch.len() == 1 {
        for op in batch.drain(..) {
            let (ok, deliver) = op(Ok(&mut *conn)).await;
            lone_write_failed = !ok;
            delivers.push(deliver);
        }
    } else {
        // One savepoint per write, so a failed write never undoes another.
        // Releasing one and opening the next go to the connection's worker
        // thread as one call: a round trip per write, not two.
        let mut open = sqlx::query("SAVEPOINT op")
            .execute(&mut *conn)
            .await
            .is_ok();
        let last = batch.len() - 1;
        for (i, op) in batch.drain(..).enumerate() {
            if !open {
                let (_, deliver) = op(Err("sqlite savepoint failed".to_string())).await;
                delivers.push(deliver);
                open = sqlx::query("SAVEPOINT op")
                    .execute(&mut *conn)
                    .await
                    .is_ok();
                continue;
            }
            let (ok, deliver) = op(Ok(&mut *conn)).await;
            if !ok {
                let _ = sqlx::query("ROLLBACK TO SAVEPOINT op")
                    .execute(&mut *conn)
                    .await;
            }
            delivers.push(deliver);
            let next = if i == last {
                "RELEASE SAVEPOINT op"
            } else {
                "RELEASE SAVEPOINT op; SAVEPOINT op"
            };
            open = sqlx::query(next).execute(&mut *conn).await.is_ok();
        }
    }
    let end = if lone_write_failed {
        "ROLLBACK"
    } else {
        "COMMIT"
    };
    let commit = match sqlx::query(end).execute(&mut *conn).await {
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::error!(error = %e, "sqlite writer commit failed; the batch is rolled back");
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            Err(e.to_string())
        }
    };
    for deliver in delivers {
        deliver(commit.clone());
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run_direct(&mut *self.read.get().await?).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&mut *self.read.get().await?)
            .await?;
        Ok(())
    }

    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        self.write(move |c| Box::pin(ops::create_job(c, job))).await
    }

    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError> {
        ops::find_job_by_key(&mut *self.read.get().await?, owner_id, key).await
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        ops::get_job(&mut *self.read.get().await?, id).await
    }

    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
        ops::list_attempts(&mut *self.read.get().await?, job_id).await
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        self.write(move |c| Box::pin(ops::start_attempt(c, attempt)))
            .await
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        self.write(move |c| Box::pin(ops::finish_attempt(c, finish)))
            .await
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_event(c, &event).await }))
            .await
    }

    fn record_event_detached(&self, event: NewEvent) {
        let op = wrap::<(), _>(
            move |c| Box::pin(async move { ops::insert_event(c, &event).await }),
            None,
        );
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.writer.try_send(WriteCmd::Write(op))
        {
            let writer = self.writer.clone();
            tokio::spawn(async move {
                let _ = writer.send(cmd).await;
            });
        }
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_events(c, &events).await }))
            .await
    }

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
        ops::list_events(&mut *self.read.get().await?, job_id).await
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        ops::count_jobs(&mut *self.read.get().await?).await
    }

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_api_key(c, &key).await }))
            .await
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        ops::find_api_key(&mut *self.read.get().await?, key_hash).await
    }

    async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writer.send(WriteCmd::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        self.read.close().await;
    }

    async fn claim_jobs(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        reclaim_own: bool,
    ) -> Result<Vec<Job>, StoreError> {
        let owner = owner.to_string();
        self.write(move |c| {
            Box::pin(async move {
                ops::claim_jobs(c, &owner, now, lease_until, limit, reclaim_own).await
            })
        })
        .await
    }

    async fn renew_lease(
        &self,
        job_id: &str,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        let (job_id, owner) = (job_id.to_string(), owner.to_string());
        self.write(move |c| {
            Box::pin(async move { ops::renew_lease(c, &job_id, &owner, lease_until).await })
        })
        .await
    }

    async fn transition_job(
        &self,
        job_id: &str,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let (job_id, owner) = (job_id.to_string(), lease_owner.map(str::to_string));
        self.write(move |c| {
            Box::pin(async move {
                ops::transition_job(c, &job_id, owner.as_deref(), transition, at).await
            })
        })
        .await
    }

    async fn wake_job(&self, job_id: &str, at: Millis) -> Result<(), StoreError> {
        let job_id = job_id.to_string();
        self.write(move |c| Box::pin(async move { ops::wake_job(c, &job_id, at).await }))
            .await
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_stale_started(&mut *self.read.get().await?, started_before, limit).await
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_unknown_attempts(&mut *self.read.get().await?, after, limit).await
    }

    async fn cancel_job(
        &self,
        job_id: &str,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let (job_id, actor, reason) = (job_id.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c| {
            Box::pin(async move { ops::cancel_job(c, &job_id, &actor, &reason, at).await })
        })
        .await
    }

    async fn request_retry(
        &self,
        job_id: &str,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let (job_id, actor) = (job_id.to_string(), actor.to_string());
        self.write(move |c| {
            Box::pin(async move { ops::request_retry(c, &job_id, &actor, at).await })
        })
        .await
    }

    async fn resolve_job(
        &self,
        job_id: &str,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let (job_id, actor, reason) = (job_id.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c| {
            Box::pin(
                async move { ops::resolve_job(c, &job_id, resolution, &actor, &reason, at).await },
            )
        })
        .await
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &str,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let (attempt_id, actor, reason) = (
            attempt_id.to_string(),
            actor.to_string(),
            reason.to_string(),
        );
        self.write(move |c| {
            Box::pin(async move {
                ops::resolve_attempt(c, &attempt_id, resolution, &actor, &reason, at).await
            })
        })
        .await
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        ops::list_review(&mut *self.read.get().await?, limit).await
    }

    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        let (name, actor, reason) = (name.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c| {
            Box::pin(async move {
                ops::set_provider_enabled(c, &name, enabled, &actor, &reason, at).await
            })
        })
        .await
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        ops::provider_switches(&mut *self.read.get().await?).await
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<super::ProviderAuditEntry>, StoreError> {
        ops::provider_audit(&mut *self.read.get().await?, name, limit).await
    }

    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_contract_run(c, &run).await }))
            .await
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        ops::latest_contract_runs(&mut *self.read.get().await?).await
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        ops::contract_run(&mut *self.read.get().await?, id).await
    }

    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        ops::review_queue_depth(&mut *self.read.get().await?).await
    }

    async fn list_jobs(
        &self,
        filter: &super::console::JobFilter,
        limit: i64,
    ) -> Result<Vec<Job>, StoreError> {
        ops::list_jobs(&mut *self.read.get().await?, filter, limit).await
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<super::console::WindowStats, StoreError> {
        ops::window_stats(&mut *self.read.get().await?, from, to, column_ms).await
    }

    async fn list_api_keys(&self, owner: Option<&str>) -> Result<Vec<KeyRecord>, StoreError> {
        ops::list_keys(&mut *self.read.get().await?, owner).await
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        ops::get_key(&mut *self.read.get().await?, id).await
    }

    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError> {
        let (id, actor) = (id.to_string(), actor.to_string());
        self.write(move |c| Box::pin(async move { ops::revoke_key(c, &id, &actor, at).await }))
            .await
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        let actor = actor.to_string();
        self.write(move |c| Box::pin(async move { ops::rotate_key(c, &rotation, &actor).await }))
            .await
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::touch_keys(c, &used).await }))
            .await
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        ops::tenant_changes(&mut *self.read.get().await?).await
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        ops::owner_limits(&mut *self.read.get().await?).await
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::set_owner_limits(c, &row).await }))
            .await
    }

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError> {
        ops::tenant_audit(&mut *self.read.get().await?, limit).await
    }

    async fn heartbeat(
        &self,
        instance: &str,
        at: Millis,
        since: Millis,
    ) -> Result<i64, StoreError> {
        let instance = instance.to_string();
        self.write(move |c| Box::pin(async move { ops::heartbeat(c, &instance, at, since).await }))
            .await
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        let instance = instance.to_string();
        self.write(move |c| Box::pin(async move { ops::leave(c, &instance).await }))
            .await
    }

    async fn owner_load(
        &self,
        owner: &str,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError> {
        ops::owner_load(&mut *self.read.get().await?, owner, key, day).await
    }

    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let (id, actor, reason) = (id.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c| {
            Box::pin(async move {
                ops::set_key_limits(c, &id, limits.as_deref(), &actor, &reason, at).await
            })
        })
        .await
    }

    async fn usage(&self, owner: Option<&str>, from_day: i64) -> Result<Vec<UsageRow>, StoreError> {
        ops::usage(&mut *self.read.get().await?, owner, from_day).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Ten writes committed as one batch, every odd one failing after it
    /// wrote: each failure undoes its own row only, and its caller hears so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_in_a_batch_undoes_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(&dir.path().join("t.db")).await.unwrap());
        store
            .write(|c| {
                Box::pin(async move {
                    sqlx::query("CREATE TABLE probe (n INTEGER NOT NULL)")
                        .execute(&mut *c)
                        .await?;
                    Ok(())
                })
            })
            .await
            .unwrap();
        // Hold the writer until the ten are queued behind it.
        let (started, is_started) = oneshot::channel::<()>();
        let (release, released) = oneshot::channel::<()>();
        let holder = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(move |_| {
                        Box::pin(async move {
                            let _ = started.send(());
                            let _ = released.await;
                            Ok(())
                        })
                    })
                    .await
            })
        };
        is_started.await.unwrap();
        let writes: Vec<_> = (0..10i64)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .write(move |c| {
                            Box::pin(async move {
                                sqlx::query("INSERT INTO probe (n) VALUES ($1)")
                                    .bind(n)
                                    .execute(&mut *c)
                                    .await?;
                                if n % 2 == 1 {
                                    return Err(StoreError::NotFound("odd"));
                                }
                                Ok(n)
                            })
                        })
                        .await
                })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.writer.max_capacity() - store.writer.capacity() < 10 {
            assert!(tokio::time::Instant::now() < deadline, "writes not queued");
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        for (n, write) in writes.into_iter().enumerate() {
            let result = write.await.unwrap();
            assert_eq!(result.is_ok(), n % 2 == 0, "write {n}: {result:?}");
        }
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT n FROM probe ORDER BY n")
            .fetch_all(&mut *store.read.get().await.unwrap())
            .await
            .unwrap();
        let rows: Vec<i64> = rows.into_iter().map(|(n,)| n).collect();
        assert_eq!(rows, vec![0, 2, 4, 6, 8]);
    }
}
