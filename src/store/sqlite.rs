//! The embedded SQLite backend.
//!
//! Durability: WAL with `synchronous=FULL`, so a commit has reached the disk
//! before any caller is answered. Writes go through one writer thread that
//! groups the writes of concurrent callers into `BEGIN IMMEDIATE`
//! transactions (group commit), each write inside its own savepoint so one
//! failed write never undoes another. `BEGIN IMMEDIATE` takes SQLite's write
//! lock up front, which makes every guarded step atomic against other
//! processes on the same file too (they wait up to the busy timeout). Reads
//! use a small pool of their own connections and never wait for the writer.
//!
//! The writer holds two connections to the file: a rusqlite one, for the
//! queries written against [`Db`](super::sql::db::Db) (a job's create and
//! finish, events), which run as direct calls on the writer's thread, and
//! a sqlx one for the rest. The queued writes are committed in the order
//! they came: each run of writes of one kind is one transaction on its
//! connection, so a batch of a job's path is one transaction and one fsync.

use super::console::{JobFilter, WindowStats};
use super::hedging::HedgingShare;
use super::sql::db;
use super::tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};
use super::webhooks::{
    ClaimedDelivery, WebhookCounts, WebhookDelivery, WebhookEndpoint, WebhookTry, WebhookTryRecord,
};
use super::{
    ApiKey, AttemptResolution, AttemptStore, ConsoleStore, ContractRun, ContractRunStore,
    ContractRunSummary, CreateOutcome, EventStore, FinishAttempt, FinishOutcome, HedgingStore,
    JobEvent, JobResolution, JobStore, JobTransition, KeyStore, NewContractRun, NewEvent,
    ProviderAuditEntry, ProviderSwitch, Refusal, ReviewItem, Store, StoreError, SwitchStore,
    WebhookStore,
};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, AttemptId, GuardRefusal, Job, JobId, Millis, OwnerId};
use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, MappedMutexGuard, Mutex, MutexGuard};

use super::sql::sqlite as ops;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Most writes one commit carries.
const MAX_BATCH: usize = 128;
/// How long a writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections that serve reads, besides the writer's.
const READERS: usize = 4;
/// Statements the writer's rusqlite connection keeps prepared: every query
/// of a job's path, with room to spare.
const RAW_STATEMENTS: usize = 64;

/// Hands a write's result to its caller once the batch's commit is known.
type Deliver = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One write through sqlx: runs on the writer's sqlx connection inside the
/// transaction and says whether it succeeded (a failed write is rolled back
/// to its savepoint) and how to deliver its result. Given `Err` (the
/// transaction could not even begin) it runs nothing and delivers that
/// error.
type WriteFn = Box<
    dyn for<'c> FnOnce(Result<&'c mut SqliteConnection, String>) -> BoxFuture<'c, (bool, Deliver)>
        + Send,
>;

/// The same through rusqlite, a direct call on the writer's thread.
type RawFn = Box<dyn FnOnce(Result<&mut rusqlite::Connection, String>) -> (bool, Deliver) + Send>;

/// One queued write, by the connection it runs on.
enum Write {
    Sqlx(WriteFn),
    Raw(RawFn),
}

enum WriteCmd {
    Write(Write),
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
/// connection to a local file cannot go stale.
///
/// Each is opened on first need: only when every open one is busy. Opening
/// one costs SQLite a parse of the whole schema (its pragmas read it), so a
/// CLI command that reads once, or a store whose reads never overlap, opens
/// one, not [`READERS`].
///
/// The reads written against [`Db`](super::sql::db::Db) (a job by its key
/// or id: the replay check before every create) run on rusqlite
/// connections of their own instead, inline on the caller's thread: an
/// indexed read of one row takes SQLite microseconds, less than the
/// hand-off to a connection's worker thread and back.
struct Readers {
    options: SqliteConnectOptions,
    conns: Vec<Mutex<Reader>>,
    next: AtomicUsize,
    path: PathBuf,
    /// `None` once the store is closed.
    raw: std::sync::Mutex<Option<Vec<rusqlite::Connection>>>,
}

enum Reader {
    Unopened,
    Open(SqliteConnection),
    Closed,
}

impl Readers {
    fn new(options: SqliteConnectOptions, path: &Path) -> Self {
        Readers {
            options,
            conns: (0..READERS).map(|_| Mutex::new(Reader::Unopened)).collect(),
            next: AtomicUsize::new(0),
            path: path.to_path_buf(),
            raw: std::sync::Mutex::new(Some(Vec::new())),
        }
    }

    /// Run a read on a free rusqlite connection (opened if none is free;
    /// at most [`READERS`] are kept).
    fn raw<T>(
        &self,
        read: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let free = match self.raw.lock().as_deref_mut() {
            Ok(Some(pool)) => pool.pop(),
            _ => return Err(StoreError::Closed),
        };
        let mut conn = match free {
            Some(conn) => conn,
            None => open_raw(&self.path)?,
        };
        let answer = read(&mut conn);
        if let Ok(Some(pool)) = self.raw.lock().as_deref_mut() {
            if pool.len() < READERS {
                pool.push(conn);
            }
        }
        answer
    }

    /// A free open connection if there is one, else a free slot opened now,
    /// else wait for one.
    async fn get(&self) -> Result<MappedMutexGuard<'_, SqliteConnection>, StoreError> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut unopened = None;
        let mut chosen = None;
        for i in 0..n {
            let Ok(guard) = self.conns[(start + i) % n].try_lock() else {
                continue;
            };
            match *guard {
                Reader::Open(_) | Reader::Closed => {
                    chosen = Some(guard);
                    break;
                }
                Reader::Unopened if unopened.is_none() => unopened = Some(guard),
                Reader::Unopened => {}
            }
        }
        let mut guard = match chosen.or(unopened) {
            Some(guard) => guard,
            None => self.conns[start].lock().await,
        };
        if let Reader::Unopened = *guard {
            *guard = Reader::Open(self.options.clone().connect().await?);
        }
        MutexGuard::try_map(guard, |reader| match reader {
            Reader::Open(conn) => Some(conn),
            Reader::Unopened | Reader::Closed => None,
        })
        .map_err(|_| StoreError::Closed)
    }

    async fn close(&self) {
        if let Ok(mut raw) = self.raw.lock() {
            *raw = None;
        }
        for conn in &self.conns {
            let mut reader = conn.lock().await;
            if let Reader::Open(conn) = std::mem::replace(&mut *reader, Reader::Closed) {
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
        // After sqlx's: the file exists and is in WAL mode (a property of
        // the file).
        let raw = open_raw(path)?;
        raw.set_prepared_statement_cache_capacity(RAW_STATEMENTS);
        let read = Readers::new(options, path);
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        let writer = Writer {
            conn: writer_conn,
            raw,
        };
        // A thread of its own: the rusqlite writes and every commit's fsync
        // block it, not the server's runtime.
        // No I/O or timer driver: the writer only awaits channels (its
        // queue, sqlx's worker), so it parks on a futex, and waking it
        // costs no eventfd write and epoll round.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| StoreError::Batch(format!("sqlite writer runtime: {e}")))?;
        std::thread::Builder::new()
            .name("onejob-sqlite-writer".to_string())
            .spawn(move || runtime.block_on(run_writer(writer, rx)))
            .map_err(|e| StoreError::Batch(format!("sqlite writer thread: {e}")))?;
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
        self.queue(Write::Sqlx(wrap(op, Some(reply)))).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// The same for a write through rusqlite.
    async fn write_raw<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<Result<T, StoreError>>();
        self.queue(Write::Raw(wrap_raw(op, Some(reply)))).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn queue(&self, write: Write) -> Result<(), StoreError> {
        self.writer
            .send(WriteCmd::Write(write))
            .await
            .map_err(|_| StoreError::Closed)
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
            (result.is_ok(), deliver(result, reply))
        })
    })
}

fn wrap_raw<T, F>(op: F, reply: Option<oneshot::Sender<Result<T, StoreError>>>) -> RawFn
where
    T: Send + 'static,
    F: FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
{
    Box::new(move |conn| {
        let result = match conn {
            Ok(conn) => op(conn),
            Err(message) => Err(StoreError::Batch(message)),
        };
        (result.is_ok(), deliver(result, reply))
    })
}

/// How a write's result reaches its caller, given the commit's.
fn deliver<T: Send + 'static>(
    result: Result<T, StoreError>,
    reply: Option<oneshot::Sender<Result<T, StoreError>>>,
) -> Deliver {
    Box::new(move |commit| {
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
    })
}

/// A rusqlite connection to the file, set as sqlx's are (`synchronous` and
/// `foreign_keys` are a connection's own; WAL is the file's).
fn open_raw(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// The writer's two connections to the file.
struct Writer {
    conn: SqliteConnection,
    raw: rusqlite::Connection,
}

/// The single writer: takes what is queued (up to `MAX_BATCH`), commits it,
/// then answers every caller. While it commits, the next batch queues up,
/// so the batch grows with the load.
async fn run_writer(mut writer: Writer, mut rx: mpsc::Receiver<WriteCmd>) {
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
        commit_in_order(&mut writer, &mut batch).await;
        if let Some(done) = closing.take() {
            rx.close();
            drop(writer.raw);
            let _ = sqlx::Connection::close(writer.conn).await;
            let _ = done.send(());
            return;
        }
    }
}

/// Commit the batch in queue order: each run of consecutive writes on one
/// connection is one transaction there.
async fn commit_in_order(writer: &mut Writer, batch: &mut Vec<Write>) {
    let mut writes = batch.drain(..).peekable();
    while let Some(first) = writes.next() {
        match first {
            Write::Raw(op) => {
                let mut run = vec![op];
                while let Some(Write::Raw(_)) = writes.peek() {
                    if let Some(Write::Raw(op)) = writes.next() {
                        run.push(op);
                    }
                }
                commit_raw(&mut writer.raw, run);
            }
            Write::Sqlx(op) => {
                let mut run = vec![op];
                while let Some(Write::Sqlx(_)) = writes.peek() {
                    if let Some(Write::Sqlx(op)) = writes.next() {
                        run.push(op);
                    }
                }
                commit_sqlx(&mut writer.conn, run).await;
            }
        }
    }
}

/// One transaction of rusqlite writes, each in its own savepoint unless it
/// is alone (then the transaction is its own, and a failure rolls it back
/// whole).
fn commit_raw(conn: &mut rusqlite::Connection, run: Vec<RawFn>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        tracing::error!(error = %e, "sqlite writer could not begin a transaction");
        let message = e.to_string();
        for op in run {
            let (_, deliver) = op(Err(message.clone()));
            deliver(Err(message.clone()));
        }
        return;
    }
    let lone = run.len() == 1;
    let mut lone_write_failed = false;
    let mut delivers = Vec::with_capacity(run.len());
    for op in run {
        if lone {
            let (ok, deliver) = op(Ok(&mut *conn));
            lone_write_failed = !ok;
            delivers.push(deliver);
            continue;
        }
        if let Err(e) = conn.execute_batch("SAVEPOINT op") {
            let (_, deliver) = op(Err(format!("sqlite savepoint failed: {e}")));
            delivers.push(deliver);
            continue;
        }
        let (ok, deliver) = op(Ok(&mut *conn));
        if !ok {
            let _ = conn.execute_batch("ROLLBACK TO SAVEPOINT op");
        }
        let _ = conn.execute_batch("RELEASE SAVEPOINT op");
        delivers.push(deliver);
    }
    let end = if lone_write_failed {
        "ROLLBACK"
    } else {
        "COMMIT"
    };
    let commit = conn.execute_batch(end).map_err(|e| {
        tracing::error!(error = %e, "sqlite writer commit failed; the batch is rolled back");
        let _ = conn.execute_batch("ROLLBACK");
        e.to_string()
    });
    for deliver in delivers {
        deliver(commit.clone());
    }
}

/// One transaction of sqlx writes, as [`commit_raw`].
async fn commit_sqlx(conn: &mut SqliteConnection, run: Vec<WriteFn>) {
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        tracing::error!(error = %e, "sqlite writer could not begin a transaction");
        let message = e.to_string();
        for op in run {
            let (_, deliver) = op(Err(message.clone())).await;
            deliver(Err(message.clone()));
        }
        return;
    }
    let mut delivers = Vec::with_capacity(run.len());
    let mut lone_write_failed = false;
    if run.len() == 1 {
        for op in run {
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
        let last = run.len() - 1;
        for (i, op) in run.into_iter().enumerate() {
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

    fn record_event_detached(&self, event: NewEvent) {
        let op = wrap_raw::<(), _>(move |c| db::now(ops::insert_event(c, &event)), None);
        if let Err(mpsc::error::TrySendError::Full(cmd)) =
            self.writer.try_send(WriteCmd::Write(Write::Raw(op)))
        {
            let writer = self.writer.clone();
            tokio::spawn(async move {
                let _ = writer.send(cmd).await;
            });
        }
    }

    async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writer.send(WriteCmd::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        self.read.close().await;
    }
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        self.write_raw(move |c| db::now(ops::create_job(c, job)))
            .await
    }

    async fn find_job_by_key(
        &self,
        owner_id: &OwnerId,
        key: &str,
    ) -> Result<Option<Job>, StoreError> {
        self.read
            .raw(|c| db::now(ops::find_job_by_key(c, owner_id, key)))
    }

    async fn get_job(&self, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.read.raw(|c| db::now(ops::get_job(c, id)))
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        ops::count_jobs(&mut *self.read.get().await?).await
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
        job_id: &JobId,
        owner: &str,
        lease_until: Millis,
    ) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        let owner = owner.to_string();
        self.write(move |c| {
            Box::pin(async move { ops::renew_lease(c, &job_id, &owner, lease_until).await })
        })
        .await
    }

    async fn transition_job(
        &self,
        job_id: &JobId,
        lease_owner: Option<&str>,
        transition: JobTransition,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        let lease_owner = lease_owner.map(str::to_string);
        self.write(move |c| {
            Box::pin(async move {
                ops::transition_job(c, &job_id, lease_owner.as_deref(), transition, at).await
            })
        })
        .await
    }

    async fn wake_job(&self, job_id: &JobId, at: Millis) -> Result<(), StoreError> {
        let job_id = job_id.to_string();
        self.write(move |c| Box::pin(async move { ops::wake_job(c, &job_id, at).await }))
            .await
    }

    async fn cancel_job(
        &self,
        job_id: &JobId,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let job_id = job_id.to_string();
        let actor = actor.to_string();
        let reason = reason.to_string();
        self.write(move |c| {
            Box::pin(async move { ops::cancel_job(c, &job_id, &actor, &reason, at).await })
        })
        .await
    }

    async fn request_retry(
        &self,
        job_id: &JobId,
        actor: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let job_id = job_id.to_string();
        let actor = actor.to_string();
        self.write(move |c| {
            Box::pin(async move { ops::request_retry(c, &job_id, &actor, at).await })
        })
        .await
    }

    async fn resolve_job(
        &self,
        job_id: &JobId,
        resolution: JobResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let job_id = job_id.to_string();
        let actor = actor.to_string();
        let reason = reason.to_string();
        self.write(move |c| {
            Box::pin(
                async move { ops::resolve_job(c, &job_id, resolution, &actor, &reason, at).await },
            )
        })
        .await
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        ops::list_review(&mut *self.read.get().await?, limit).await
    }
}

#[async_trait]
impl AttemptStore for SqliteStore {
    async fn list_attempts(&self, job_id: &JobId) -> Result<Vec<Attempt>, StoreError> {
        ops::list_attempts(&mut *self.read.get().await?, job_id).await
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        self.write(move |c| Box::pin(async move { ops::start_attempt(c, attempt).await }))
            .await
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        self.write_raw(move |c| db::now(ops::finish_attempt(c, finish)))
            .await
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &AttemptId)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        ops::list_unknown_attempts(
            &mut *self.read.get().await?,
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
        ops::list_stale_started(&mut *self.read.get().await?, started_before, limit).await
    }

    async fn resolve_attempt(
        &self,
        attempt_id: &AttemptId,
        resolution: AttemptResolution,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<Result<Job, Refusal>, StoreError> {
        let attempt_id = attempt_id.to_string();
        let actor = actor.to_string();
        let reason = reason.to_string();
        self.write(move |c| {
            Box::pin(async move {
                ops::resolve_attempt(c, &attempt_id, resolution, &actor, &reason, at).await
            })
        })
        .await
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        self.write_raw(move |c| db::now(ops::record_event(c, event)))
            .await
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::record_events(c, events).await }))
            .await
    }

    async fn list_events(&self, job_id: &JobId) -> Result<Vec<JobEvent>, StoreError> {
        ops::list_events(&mut *self.read.get().await?, job_id).await
    }

    async fn has_event(&self, job_id: &JobId, kind: &str) -> Result<bool, StoreError> {
        ops::has_event(&mut *self.read.get().await?, job_id, kind).await
    }
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_api_key(c, key).await }))
            .await
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        ops::find_api_key(&mut *self.read.get().await?, key_hash).await
    }

    async fn list_api_keys(&self, owner: Option<&OwnerId>) -> Result<Vec<KeyRecord>, StoreError> {
        ops::list_api_keys(&mut *self.read.get().await?, owner.map(OwnerId::as_str)).await
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        ops::get_api_key(&mut *self.read.get().await?, id).await
    }

    async fn revoke_api_key(&self, id: &str, actor: &str, at: Millis) -> Result<bool, StoreError> {
        let id = id.to_string();
        let actor = actor.to_string();
        self.write(move |c| Box::pin(async move { ops::revoke_api_key(c, &id, &actor, at).await }))
            .await
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        let actor = actor.to_string();
        self.write(move |c| Box::pin(async move { ops::rotate_api_key(c, rotation, &actor).await }))
            .await
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::touch_api_keys(c, used).await }))
            .await
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        ops::tenant_changes(&mut *self.read.get().await?).await
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        ops::owner_limits(&mut *self.read.get().await?).await
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::set_owner_limits(c, row).await }))
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
        self.write(move |c| Box::pin(async move { ops::leave_instances(c, &instance).await }))
            .await
    }

    async fn owner_load(
        &self,
        owner: &OwnerId,
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
        let id = id.to_string();
        let actor = actor.to_string();
        let reason = reason.to_string();
        self.write(move |c| {
            Box::pin(async move { ops::set_key_limits(c, &id, limits, &actor, &reason, at).await })
        })
        .await
    }

    async fn usage(
        &self,
        owner: Option<&OwnerId>,
        from_day: i64,
    ) -> Result<Vec<UsageRow>, StoreError> {
        ops::usage(
            &mut *self.read.get().await?,
            owner.map(OwnerId::as_str),
            from_day,
        )
        .await
    }
}

#[async_trait]
impl SwitchStore for SqliteStore {
    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError> {
        let name = name.to_string();
        let actor = actor.to_string();
        let reason = reason.to_string();
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
    ) -> Result<Vec<ProviderAuditEntry>, StoreError> {
        ops::provider_audit(&mut *self.read.get().await?, name, limit).await
    }
}

#[async_trait]
impl ContractRunStore for SqliteStore {
    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        self.write(move |c| Box::pin(async move { ops::insert_contract_run(c, run).await }))
            .await
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        ops::latest_contract_runs(&mut *self.read.get().await?).await
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        ops::contract_run(&mut *self.read.get().await?, id).await
    }
}

#[async_trait]
impl ConsoleStore for SqliteStore {
    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        ops::review_queue_depth(&mut *self.read.get().await?).await
    }

    async fn list_jobs(&self, filter: &JobFilter, limit: i64) -> Result<Vec<Job>, StoreError> {
        ops::list_jobs(&mut *self.read.get().await?, filter, limit).await
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<WindowStats, StoreError> {
        ops::window_stats(&mut *self.read.get().await?, from, to, column_ms).await
    }
}

#[async_trait]
impl HedgingStore for SqliteStore {
    async fn put_hedging_shares(
        &self,
        shares: Vec<HedgingShare>,
        forget_before: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |c| {
            Box::pin(async move { ops::put_hedging_shares(c, shares, forget_before).await })
        })
        .await
    }

    async fn hedging_shares(&self, since: Millis) -> Result<Vec<HedgingShare>, StoreError> {
        ops::hedging_shares(&mut *self.read.get().await?, since).await
    }
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn insert_webhook_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        self.write(move |c| {
            Box::pin(async move { ops::insert_webhook_endpoint(c, endpoint).await })
        })
        .await
    }

    async fn list_webhook_endpoints(
        &self,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<WebhookEndpoint>, StoreError> {
        ops::list_webhook_endpoints(&mut *self.read.get().await?, owner.map(OwnerId::as_str)).await
    }

    async fn get_webhook_endpoint(&self, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        ops::get_webhook_endpoint(&mut *self.read.get().await?, id).await
    }

    async fn delete_webhook_endpoint(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| Box::pin(async move { ops::delete_webhook_endpoint(c, &id).await }))
            .await
    }

    async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &str,
        previous_until: Millis,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let id = id.to_string();
        let secret = secret.to_string();
        self.write(move |c| {
            Box::pin(async move {
                ops::rotate_webhook_secret(c, &id, &secret, previous_until, at).await
            })
        })
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
        let instance = instance.to_string();
        self.write(move |c| {
            Box::pin(async move {
                ops::claim_webhook_deliveries(c, &instance, now, lease_until, limit, per_endpoint)
                    .await
            })
        })
        .await
    }

    async fn record_webhook_try(&self, record: WebhookTryRecord) -> Result<bool, StoreError> {
        self.write(move |c| Box::pin(async move { ops::record_webhook_try(c, record).await }))
            .await
    }

    async fn list_webhook_deliveries(
        &self,
        endpoint_id: &str,
        limit: i64,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        ops::list_webhook_deliveries(&mut *self.read.get().await?, endpoint_id, limit).await
    }

    async fn get_webhook_delivery(&self, id: &str) -> Result<Option<WebhookDelivery>, StoreError> {
        ops::get_webhook_delivery(&mut *self.read.get().await?, id).await
    }

    async fn list_webhook_tries(&self, delivery_id: &str) -> Result<Vec<WebhookTry>, StoreError> {
        ops::list_webhook_tries(&mut *self.read.get().await?, delivery_id).await
    }

    async fn redeliver_webhook(&self, id: &str, at: Millis) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| Box::pin(async move { ops::redeliver_webhook(c, &id, at).await }))
            .await
    }

    async fn webhook_counts(&self) -> Result<WebhookCounts, StoreError> {
        ops::webhook_counts(&mut *self.read.get().await?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    async fn store_with_probe() -> (tempfile::TempDir, Arc<SqliteStore>) {
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
        (dir, store)
    }

    /// Holds the writer inside a write until `release` is sent: what is
    /// queued meanwhile is committed as one batch.
    async fn hold_writer(
        store: &Arc<SqliteStore>,
    ) -> (
        oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
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
        (release, holder)
    }

    async fn wait_until_queued(store: &SqliteStore, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.writer.max_capacity() - store.writer.capacity() < n {
            assert!(tokio::time::Instant::now() < deadline, "writes not queued");
            tokio::task::yield_now().await;
        }
    }

    /// The probe's rows in the order they were inserted.
    async fn probe_rows(store: &SqliteStore) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT n FROM probe ORDER BY rowid")
            .fetch_all(&mut *store.read.get().await.unwrap())
            .await
            .unwrap();
        rows.into_iter().map(|(n,)| n).collect()
    }

    /// Insert `n` into the probe, through sqlx (`raw` false) or rusqlite;
    /// an odd `n` then fails.
    async fn insert_probe(store: &SqliteStore, n: i64, raw: bool) -> Result<i64, StoreError> {
        const INSERT: &str = "INSERT INTO probe (n) VALUES ($1)";
        let fail_odd = move || match n % 2 {
            1 => Err(StoreError::NotFound("odd")),
            _ => Ok(n),
        };
        if raw {
            store
                .write_raw(move |c| {
                    db::now(db::Db::execute(c, INSERT, db::args![n]))?;
                    fail_odd()
                })
                .await
        } else {
            store
                .write(move |c| {
                    Box::pin(async move {
                        sqlx::query(INSERT).bind(n).execute(&mut *c).await?;
                        fail_odd()
                    })
                })
                .await
        }
    }

    /// Ten writes committed as one batch, every odd one failing after it
    /// wrote: each failure undoes its own row only, and its caller hears so.
    /// Through either connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_in_a_batch_undoes_only_itself() {
        for raw in [false, true] {
            let (_dir, store) = store_with_probe().await;
            let (release, holder) = hold_writer(&store).await;
            let writes: Vec<_> = (0..10i64)
                .map(|n| {
                    let store = store.clone();
                    tokio::spawn(async move { insert_probe(&store, n, raw).await })
                })
                .collect();
            wait_until_queued(&store, 10).await;
            release.send(()).unwrap();
            holder.await.unwrap().unwrap();
            for (n, write) in writes.into_iter().enumerate() {
                let result = write.await.unwrap();
                assert_eq!(
                    result.is_ok(),
                    n % 2 == 0,
                    "raw {raw}, write {n}: {result:?}"
                );
            }
            // Spawned at once, the ten queue in any order.
            let mut rows = probe_rows(&store).await;
            rows.sort();
            assert_eq!(rows, vec![0, 2, 4, 6, 8], "raw {raw}");
        }
    }

    /// A closed store refuses reads on either kind of reader connection.
    #[tokio::test]
    async fn reads_after_close_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db")).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(
            store.find_job_by_key(&"alice".into(), "k").await.unwrap(),
            None
        );
        assert_eq!(store.count_jobs().await.unwrap(), 0);
        store.close().await;
        let by_key = store.find_job_by_key(&"alice".into(), "k").await;
        assert!(matches!(by_key, Err(StoreError::Closed)), "{by_key:?}");
        let count = store.count_jobs().await;
        assert!(matches!(count, Err(StoreError::Closed)), "{count:?}");
    }

    /// Writes through the two connections, queued in one batch, are
    /// committed in the order they were queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_both_kinds_commits_in_queue_order() {
        let (_dir, store) = store_with_probe().await;
        let (release, holder) = hold_writer(&store).await;
        let kinds = [true, true, false, true, false, false, true];
        let mut writes = Vec::new();
        for (i, raw) in kinds.into_iter().enumerate() {
            let n = 2 * i as i64;
            let store2 = store.clone();
            writes.push(tokio::spawn(
                async move { insert_probe(&store2, n, raw).await },
            ));
            // Queued one after the other, not racing.
            wait_until_queued(&store, i + 1).await;
        }
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(probe_rows(&store).await, vec![0, 2, 4, 6, 8, 10, 12]);
    }
}
