//! The embedded SQLite backend, on rusqlite alone.
//!
//! Durability: WAL with `synchronous=FULL`, so a commit has reached the disk
//! before any caller is answered. Concurrent writes go through one writer
//! thread that groups them into `BEGIN IMMEDIATE` transactions (group
//! commit); a write with no other in flight commits on its caller's thread
//! (see [`SqliteStore::write`]). A batch runs its writes one after the
//! other; if one fails, the batch is rolled back and run again with each
//! write in its own savepoint, so one failed write never undoes another.
//! `BEGIN IMMEDIATE` takes SQLite's write lock up front, which makes every
//! guarded step atomic against other processes on the same file too (they
//! wait up to the busy timeout). Reads use a few connections of their own
//! and never wait for the writer.
//!
//! Every statement is a direct call into SQLite on the thread that runs it:
//! the writer's own thread for batched writes; the caller's for a lone
//! write and for the reads of a job's path (an indexed read takes SQLite
//! microseconds, less than a hand-off to another thread and back); and a
//! blocking thread of the runtime for the reads that may scan (the
//! console's lists and counts, usage over days). The queries are the shared
//! ones of `sql/`, written against
//! [`Db`](super::sql::db::Db), which rusqlite's connection implements.

use super::console::{JobFilter, WindowStats};
use super::hedging::HedgingShare;
use super::sql::db;
use super::tenants::{KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow};
use super::webhooks::{
    ClaimedDelivery, WebhookCounts, WebhookDelivery, WebhookEndpoint, WebhookTry, WebhookTryRecord,
};
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
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

use super::sql::sqlite as ops;

/// The migrations, in the directory sqlx's `migrate!` reads at build time;
/// applied by [`migrate`] as sqlx's migrator would, so a file migrated by
/// an earlier build (sqlx's) carries on.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Most writes one commit carries.
const MAX_BATCH: usize = 128;
/// How long a writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The page size of a new database file, in bytes. Every page a commit
/// changes is written whole to the WAL (and, in a batch run again for a
/// failed write, copied to a savepoint's journal): a job's commits change
/// about 25 pages, most of them
/// index pages holding one new entry. Half SQLite's default 4,096 halves
/// those bytes; `docs/benchmarks.md` has the measurement (1,024 made the
/// trees deeper and gained no more).
const PAGE_SIZE: i64 = 2048;
/// Read connections kept open when idle.
const READERS: usize = 4;
/// Statements each connection keeps prepared: every query of a job's path,
/// with room to spare.
const PREPARED_STATEMENTS: usize = 64;

/// One queued write. `run` does it on the writer's connection inside the
/// batch's transaction, keeps its result and says whether it succeeded; it
/// may run again when the batch's first try is rolled back (a write is a
/// function of the database, so the second run is the one that counts).
/// `deliver` hands the last result to its caller once the commit is known,
/// or the commit's error; a write never run gets that error.
trait QueuedWrite: Send {
    fn run(&mut self, conn: &mut rusqlite::Connection) -> bool;
    fn deliver(self: Box<Self>, commit: Result<(), String>);
}

type Write = Box<dyn QueuedWrite>;

enum WriteCmd {
    Write(Write),
    /// Commit what is queued before it, then stop the writer.
    Close(oneshot::Sender<()>),
}

pub struct SqliteStore {
    path: PathBuf,
    read: Readers,
    writer: mpsc::Sender<WriteCmd>,
    /// The write connection (`None` once the store is closed). The writer
    /// thread holds it while it commits a batch; a write that finds no
    /// other in flight commits on it itself (see [`SqliteStore::write`]).
    conn: Arc<Mutex<Option<rusqlite::Connection>>>,
    /// Calls of [`SqliteStore::write`] not answered yet.
    writing: AtomicUsize,
    /// Every commit of writes, the writer's and its callers'.
    commits: Arc<CommitCounter>,
}

thread_local! {
    /// Whether a write on this thread waits for another process's write
    /// lock: the writer thread's do (up to [`BUSY_TIMEOUT`]); a write
    /// committed by its caller does not, and goes to the writer instead.
    static WAITS_FOR_LOCK: Cell<bool> = const { Cell::new(true) };
}

/// The write connection's busy handler: SQLite's own busy timeout (the
/// same sleeps, up to [`BUSY_TIMEOUT`] in all), except on a thread that
/// must not wait.
fn wait_for_lock(tries: i32) -> bool {
    const SLEEPS_MS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];
    let sleep = |try_: usize| SLEEPS_MS[try_.min(SLEEPS_MS.len() - 1)];
    let tries = usize::try_from(tries).unwrap_or(0);
    let slept: u64 = (0..tries).map(sleep).sum();
    let left = (BUSY_TIMEOUT.as_millis() as u64).saturating_sub(slept);
    if !WAITS_FOR_LOCK.get() || left == 0 {
        return false;
    }
    std::thread::sleep(Duration::from_millis(sleep(tries).min(left)));
    true
}

/// Pending once, waking itself: the runtime polls it again after the
/// tasks already queued on this thread. (tokio's `yield_now` leaves the
/// wake-up to the runtime's scheduler, which never gives it when the
/// future is polled by another executor on a runtime's thread, as the
/// tests' blocking store wrapper does.)
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Counts a call of [`SqliteStore::write`] in flight until it is dropped,
/// answered or not.
struct Writing<'a>(&'a AtomicUsize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The read connections: a free one is taken for a read and given back
/// after it; one is opened when none is free, and at most [`READERS`] are
/// kept. Opening one costs SQLite a parse of the whole schema, so a CLI
/// command that reads once, or a store whose reads never overlap, opens
/// one.
struct Readers {
    path: PathBuf,
    /// `None` once the store is closed.
    free: std::sync::Mutex<Option<Vec<rusqlite::Connection>>>,
}

impl Readers {
    fn new(path: &Path) -> Self {
        Readers {
            path: path.to_path_buf(),
            free: std::sync::Mutex::new(Some(Vec::new())),
        }
    }

    /// Run a read on a free connection, on the calling thread: the reads
    /// of a job's path, an indexed row or a few, which take SQLite
    /// microseconds (less than a hand-off to another thread and back).
    fn raw<T>(
        &self,
        read: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.take()?;
        let answer = read(&mut conn);
        self.give_back(conn);
        answer
    }

    /// Run a read that may scan (the console's lists and counts, usage
    /// over days) on a blocking thread of the runtime, so that the few
    /// milliseconds it takes on a large file never hold up a worker that
    /// serves requests.
    async fn scan<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let mut conn = self.take()?;
        let (conn, answer) = tokio::task::spawn_blocking(move || {
            let answer = read(&mut conn);
            (conn, answer)
        })
        .await
        .map_err(|e| StoreError::Batch(format!("sqlite read task: {e}")))?;
        self.give_back(conn);
        answer
    }

    /// A free connection, or a new one when none is free.
    fn take(&self) -> Result<rusqlite::Connection, StoreError> {
        let free = match self.free.lock().as_deref_mut() {
            Ok(Some(pool)) => pool.pop(),
            _ => return Err(StoreError::Closed),
        };
        match free {
            Some(conn) => Ok(conn),
            None => open_conn(&self.path),
        }
    }

    /// Keep `conn` for the next read, unless [`READERS`] are kept already
    /// or the store is closed.
    fn give_back(&self, conn: rusqlite::Connection) {
        if let Ok(Some(pool)) = self.free.lock().as_deref_mut() {
            if pool.len() < READERS {
                pool.push(conn);
            }
        }
    }

    fn close(&self) {
        if let Ok(mut free) = self.free.lock() {
            *free = None;
        }
    }
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = open_conn(path)?;
        // A new file's page size; SQLite keeps an existing file's.
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        // WAL is a property of the file: set once, by the writer's
        // connection, before any reader opens.
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt(format!(
                "{}: journal mode is {mode}, not WAL",
                path.display()
            )));
        }
        conn.busy_handler(Some(wait_for_lock))?;
        let read = Readers::new(path);
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        let conn = Arc::new(Mutex::new(Some(conn)));
        let writer_conn = conn.clone();
        let commits = Arc::new(CommitCounter::default());
        let writer_commits = commits.clone();
        // A thread of its own: the batches of concurrent writes and their
        // commits' fsyncs block it, not the server's runtime.
        std::thread::Builder::new()
            .name("onejob-sqlite-writer".to_string())
            .spawn(move || run_writer(&writer_conn, &writer_commits, rx))
            .map_err(|e| StoreError::Batch(format!("sqlite writer thread: {e}")))?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            read,
            writer: tx,
            conn,
            writing: AtomicUsize::new(0),
            commits,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `op` in the next group commit; its result arrives after the
    /// commit. `op` may be run twice (see [`QueuedWrite`]).
    ///
    /// A write with no other in flight first lets the tasks already queued
    /// on its thread run. If none of them writes and nothing is queued, it is
    /// committed here, on the calling thread, as a transaction of its own:
    /// handed to the writer thread and back, a lone write pays two wake-ups
    /// of sleeping threads (on a virtual machine, interrupt round trips that
    /// cost more than its statements). Under load a write almost never
    /// finds itself alone after that yield (4 writes in 10,000 at C=32), so
    /// writes still share commits. Without the yield they did not: a write
    /// committed on the one async worker kept every other task from
    /// reaching its own write, so the next found itself alone too, and each
    /// write paid an fsync of its own. A write that would wait for another
    /// process's write lock goes to the writer thread instead.
    async fn write<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let alone = self.writing.fetch_add(1, Ordering::AcqRel) == 0;
        let _writing = Writing(&self.writing);
        let (reply, answer) = oneshot::channel::<Result<T, StoreError>>();
        let mut write = wrap(op, Some(reply));
        if alone {
            // The tasks already queued run first: if one writes too, both
            // writes go to the writer, to share a commit.
            YieldOnce(false).await;
            if self.writing.load(Ordering::Acquire) == 1 {
                write = match self.commit_here(write) {
                    None => return answer.await.map_err(|_| StoreError::Closed)?,
                    Some(write) => write,
                };
            }
        }
        self.writer
            .send(WriteCmd::Write(write))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Commit `write` on this thread if the connection is free and no
    /// other process holds the write lock; otherwise hand it back, not run.
    fn commit_here(&self, mut write: Write) -> Option<Write> {
        // Writes queued (detached ones count none in `writing`) go first.
        if self.writer.capacity() < self.writer.max_capacity() {
            return Some(write);
        }
        let Ok(mut slot) = self.conn.try_lock() else {
            return Some(write);
        };
        let Some(conn) = slot.as_mut() else {
            return Some(write);
        };
        WAITS_FOR_LOCK.set(false);
        let began = control(conn, "BEGIN IMMEDIATE");
        WAITS_FOR_LOCK.set(true);
        let committed = began
            .ok()
            .map(|()| commit_begun(conn, &self.commits, std::slice::from_mut(&mut write)));
        drop(slot);
        match committed {
            Some(committed) => {
                write.deliver(committed);
                None
            }
            None => Some(write),
        }
    }
}

fn wrap<T, F>(op: F, reply: Option<oneshot::Sender<Result<T, StoreError>>>) -> Write
where
    T: Send + 'static,
    F: FnMut(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
{
    Box::new(Queued {
        op,
        result: None,
        reply,
    })
}

/// A write and its caller (`None`: detached, a failure is logged).
struct Queued<T, F> {
    op: F,
    result: Option<Result<T, StoreError>>,
    reply: Option<oneshot::Sender<Result<T, StoreError>>>,
}

impl<T, F> QueuedWrite for Queued<T, F>
where
    T: Send + 'static,
    F: FnMut(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &mut rusqlite::Connection) -> bool {
        let result = (self.op)(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn deliver(self: Box<Self>, commit: Result<(), String>) {
        let result = match (commit, self.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(StoreError::Batch("the write was not run".into())),
            (Err(message), _) => Err(StoreError::Batch(message)),
        };
        match self.reply {
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
    }
}

/// A connection to the file: `synchronous` and `foreign_keys` are a
/// connection's own settings (WAL is the file's).
fn open_conn(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    // The WAL's frames reach the file in one write per commit; that needs
    // `synchronous = FULL`, set next (see `wal_writes`).
    super::wal_writes::register()?;
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        path,
        rusqlite::OpenFlags::default(),
        super::wal_writes::NAME,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(PREPARED_STATEMENTS);
    Ok(conn)
}

/// The single writer: takes what is queued (up to `MAX_BATCH`), commits it,
/// then answers every caller. While it commits, the next batch queues up,
/// so the batch grows with the load.
fn run_writer(
    conn: &Mutex<Option<rusqlite::Connection>>,
    commits: &CommitCounter,
    mut rx: mpsc::Receiver<WriteCmd>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closing = None;
    while let Some(cmd) = rx.blocking_recv() {
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
            let mut slot = lock(conn);
            let committed = match slot.as_mut() {
                Some(conn) => commit(conn, commits, &mut batch),
                None => Err("the store is closed".to_string()),
            };
            drop(slot);
            for write in batch.drain(..) {
                write.deliver(committed.clone());
            }
        }
        if let Some(done) = closing.take() {
            rx.close();
            *lock(conn) = None;
            let _ = done.send(());
            return;
        }
    }
}

/// The write connection, for the writer thread. A write that panicked on
/// it (on a caller's thread) left it poisoned, perhaps in a transaction:
/// that is rolled back, and the writes go on.
fn lock(
    conn: &Mutex<Option<rusqlite::Connection>>,
) -> std::sync::MutexGuard<'_, Option<rusqlite::Connection>> {
    conn.lock().unwrap_or_else(|poisoned| {
        let mut slot = poisoned.into_inner();
        if let Some(c) = slot.as_mut().filter(|c| !c.is_autocommit()) {
            let _ = c.execute_batch("ROLLBACK");
        }
        conn.clear_poison();
        slot
    })
}

/// One transaction of writes. They run one after the other, with no
/// savepoint: a savepoint copies each page a write first touches to its
/// journal, and costs two statements more per write. If one fails, the
/// transaction is rolled back (a failed write may have written part of
/// what it meant to) and the batch runs again with each write in its own
/// savepoint, so only the failed ones are undone. A write alone is its own
/// transaction, and a failure rolls it back whole.
fn commit(
    conn: &mut rusqlite::Connection,
    commits: &CommitCounter,
    run: &mut [Write],
) -> Result<(), String> {
    begin(conn)?;
    commit_begun(conn, commits, run)
}

/// [`commit`], once its transaction has begun; a commit is counted in
/// `commits`.
fn commit_begun(
    conn: &mut rusqlite::Connection,
    commits: &CommitCounter,
    run: &mut [Write],
) -> Result<(), String> {
    if run.len() == 1 {
        if !run[0].run(conn) {
            return match control(conn, "ROLLBACK") {
                Ok(()) => Ok(()),
                Err(e) => Err(rolled_back(conn, e)),
            };
        }
    } else if !run.iter_mut().all(|write| write.run(conn)) {
        // An error may have ended the transaction already (SQLite rolls
        // back by itself on some); then there is nothing to roll back.
        if let Err(e) = control(conn, "ROLLBACK") {
            if !conn.is_autocommit() {
                return Err(rolled_back(conn, e));
            }
        }
        begin(conn)?;
        for write in run.iter_mut() {
            if let Err(e) = control(conn, "SAVEPOINT op") {
                tracing::error!(error = %e, "sqlite savepoint failed; the batch is rolled back");
                return Err(rolled_back(conn, e));
            }
            if !write.run(conn) {
                let _ = control(conn, "ROLLBACK TO SAVEPOINT op");
            }
            let _ = control(conn, "RELEASE SAVEPOINT op");
        }
    }
    control(conn, "COMMIT").map_err(|e| {
        tracing::error!(error = %e, "sqlite writer commit failed; the batch is rolled back");
        rolled_back(conn, e)
    })?;
    commits.add(run.len());
    Ok(())
}

fn begin(conn: &rusqlite::Connection) -> Result<(), String> {
    control(conn, "BEGIN IMMEDIATE").map_err(|e| {
        tracing::error!(error = %e, "sqlite writer could not begin a transaction");
        e.to_string()
    })
}

/// Roll back what the transaction holds, for `error`'s sake.
fn rolled_back(conn: &rusqlite::Connection, error: rusqlite::Error) -> String {
    let _ = conn.execute_batch("ROLLBACK");
    error.to_string()
}

/// A transaction-control statement, kept prepared: `execute_batch` would
/// parse it again on every call, and a batch run again runs two per write.
fn control(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// The migration from which the webhook triggers exist only while an
/// endpoint does: it and every later one end by making them follow the
/// endpoints, in their own transaction (`ops::webhook_triggers_follow_endpoints`).
const WEBHOOK_TRIGGERS_FOLLOW_ENDPOINTS: i64 = 16;

/// Apply the migrations not yet applied, each in its own transaction with
/// its row in `_sqlx_migrations`, as sqlx's migrator does (the same table,
/// the same checksums): a file an earlier build migrated is recognised, a
/// migration edited after it was applied is refused, and a failed one
/// leaves nothing behind.
fn migrate(conn: &mut rusqlite::Connection) -> Result<(), StoreError> {
    use sqlx::migrate::MigrateError;
    // Another program's tables and no migrations of ours: refused before
    // anything is written to that file.
    let (ours, tables): (bool, bool) = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'), \
         EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%')",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    if tables && !ours {
        return Err(StoreError::NotOnejob);
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations ( \
         version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
         success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
    )?;
    let applied: Vec<(i64, Vec<u8>, bool)> = conn
        .prepare("SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<_, _>>()?;
    if let Some((version, _, _)) = applied.iter().find(|(_, _, success)| !success) {
        return Err(MigrateError::Dirty(*version).into());
    }
    let known = |version: i64| MIGRATOR.iter().any(|m| m.version == version);
    if let Some((version, _, _)) = applied.iter().find(|(version, _, _)| !known(*version)) {
        return Err(MigrateError::VersionMissing(*version).into());
    }
    for migration in MIGRATOR.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        match applied
            .iter()
            .find(|(version, _, _)| *version == migration.version)
        {
            Some((_, checksum, _)) if checksum[..] != migration.checksum[..] => {
                return Err(MigrateError::VersionMismatch(migration.version).into());
            }
            Some(_) => continue,
            None => {}
        }
        let started = std::time::Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let applied = (|| {
            // rusqlite's error would quote the whole migration.
            conn.execute_batch(&migration.sql)
                .map_err(|e| StoreError::MigrationFailed {
                    version: migration.version,
                    description: migration.description.to_string(),
                    message: match e {
                        rusqlite::Error::SqlInputError { msg, .. } => msg,
                        other => other.to_string(),
                    },
                })?;
            if migration.version >= WEBHOOK_TRIGGERS_FOLLOW_ENDPOINTS {
                db::now(ops::webhook_triggers_follow_endpoints(conn))?;
            }
            conn.execute(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES (?1, ?2, TRUE, ?3, -1)",
                rusqlite::params![migration.version, &*migration.description, &*migration.checksum],
            )?;
            Ok::<_, StoreError>(())
        })();
        match applied {
            Ok(()) => conn.execute_batch("COMMIT")?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
        conn.execute(
            "UPDATE _sqlx_migrations SET execution_time = ?1 WHERE version = ?2",
            rusqlite::params![started.elapsed().as_nanos() as i64, migration.version],
        )?;
    }
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // On a connection of its own, outside the write queue (whose
        // batches are transactions already): each migration's transaction
        // takes the write lock like any write, from this process or another.
        migrate(&mut open_conn(&self.path)?)?;
        // What the readers have prepared may name what a migration changed.
        if let Ok(Some(free)) = self.read.free.lock().as_deref_mut() {
            free.clear();
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read
            .raw(|c| Ok(c.query_row("SELECT 1", [], |row| row.get::<_, i64>(0))?))?;
        Ok(())
    }

    fn record_event_detached(&self, event: NewEvent) {
        let op = wrap::<(), _>(move |c| db::now(ops::insert_event(c, &event)), None);
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.writer.try_send(WriteCmd::Write(op))
        {
            let writer = self.writer.clone();
            tokio::spawn(async move {
                let _ = writer.send(cmd).await;
            });
        }
    }

    fn commit_counts(&self) -> CommitCounts {
        self.commits.counts()
    }

    async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writer.send(WriteCmd::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        self.read.close();
    }
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        self.write(move |c| db::now(ops::create_job(c, job.clone())))
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

    async fn latest_job_by_keys(
        &self,
        owner_id: &OwnerId,
        keys: &[String],
    ) -> Result<Option<Job>, StoreError> {
        self.read
            .raw(|c| db::now(ops::latest_job_by_keys(c, owner_id, keys)))
    }

    async fn get_job(&self, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.read.raw(|c| db::now(ops::get_job(c, id)))
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        self.read.raw(|c| db::now(ops::count_jobs(c)))
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
            db::now(ops::claim_jobs(
                c,
                &owner,
                now,
                lease_until,
                limit,
                reclaim_own,
            ))
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
        self.write(move |c| db::now(ops::renew_lease(c, &job_id, &owner, lease_until)))
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
            db::now(ops::transition_job(
                c,
                &job_id,
                lease_owner.as_deref(),
                transition.clone(),
                at,
            ))
        })
        .await
    }

    async fn wake_job(&self, job_id: &JobId, at: Millis) -> Result<(), StoreError> {
        let job_id = job_id.to_string();
        self.write(move |c| db::now(ops::wake_job(c, &job_id, at)))
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
        self.write(move |c| db::now(ops::cancel_job(c, &job_id, &actor, &reason, at)))
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
        self.write(move |c| db::now(ops::request_retry(c, &job_id, &actor, at)))
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
            db::now(ops::resolve_job(
                c,
                &job_id,
                resolution.clone(),
                &actor,
                &reason,
                at,
            ))
        })
        .await
    }

    async fn list_review(&self, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
        self.read
            .scan(move |c| db::now(ops::list_review(c, limit)))
            .await
    }
}

#[async_trait]
impl AttemptStore for SqliteStore {
    async fn list_attempts(&self, job_id: &JobId) -> Result<Vec<Attempt>, StoreError> {
        self.read.raw(|c| db::now(ops::list_attempts(c, job_id)))
    }

    async fn get_attempt(&self, attempt_id: &AttemptId) -> Result<Option<Attempt>, StoreError> {
        self.read.raw(|c| db::now(ops::get_attempt(c, attempt_id)))
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        self.write(move |c| db::now(ops::start_attempt(c, attempt.clone())))
            .await
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        let finish = finish.storable();
        self.write(move |c| db::now(ops::finish_attempt(c, finish.clone())))
            .await
    }

    async fn list_unknown_attempts(
        &self,
        after: Option<(Millis, &AttemptId)>,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        self.read.raw(|c| {
            db::now(ops::list_unknown_attempts(
                c,
                after.map(|(at, id)| (at, id.as_str())),
                limit,
            ))
        })
    }

    async fn list_stale_started(
        &self,
        started_before: Millis,
        limit: i64,
    ) -> Result<Vec<Attempt>, StoreError> {
        self.read
            .raw(|c| db::now(ops::list_stale_started(c, started_before, limit)))
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
            db::now(ops::resolve_attempt(
                c,
                &attempt_id,
                resolution.clone(),
                &actor,
                &reason,
                at,
            ))
        })
        .await
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::record_event(c, event.clone())))
            .await
    }

    async fn record_events(&self, events: Vec<NewEvent>) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::record_events(c, events.clone())))
            .await
    }

    async fn list_events(&self, job_id: &JobId) -> Result<Vec<JobEvent>, StoreError> {
        self.read.raw(|c| db::now(ops::list_events(c, job_id)))
    }

    async fn has_event(&self, job_id: &JobId, kind: &str) -> Result<bool, StoreError> {
        self.read.raw(|c| db::now(ops::has_event(c, job_id, kind)))
    }
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn insert_api_key(&self, key: ApiKey, actor: &str) -> Result<(), StoreError> {
        let actor = actor.to_string();
        self.write(move |c| db::now(ops::create_api_key(c, key.clone(), &actor)))
            .await
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        self.read.raw(|c| db::now(ops::find_api_key(c, key_hash)))
    }

    async fn list_api_keys(&self, owner: Option<&OwnerId>) -> Result<Vec<KeyRecord>, StoreError> {
        self.read
            .raw(|c| db::now(ops::list_api_keys(c, owner.map(OwnerId::as_str))))
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.read.raw(|c| db::now(ops::get_api_key(c, id)))
    }

    async fn revoke_api_key(
        &self,
        id: &str,
        actor: &str,
        reason: Option<&str>,
        at: Millis,
    ) -> Result<bool, StoreError> {
        let id = id.to_string();
        let actor = actor.to_string();
        let reason = reason.map(str::to_string);
        self.write(move |c| db::now(ops::revoke_api_key(c, &id, &actor, reason.as_deref(), at)))
            .await
    }

    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError> {
        let actor = actor.to_string();
        self.write(move |c| db::now(ops::rotate_api_key(c, rotation.clone(), &actor)))
            .await
    }

    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::touch_api_keys(c, used.clone())))
            .await
    }

    async fn tenant_changes(&self) -> Result<i64, StoreError> {
        self.read.raw(|c| db::now(ops::tenant_changes(c)))
    }

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError> {
        self.read.raw(|c| db::now(ops::owner_limits(c)))
    }

    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::set_owner_limits(c, row.clone())))
            .await
    }

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError> {
        self.read.raw(|c| db::now(ops::tenant_audit(c, limit)))
    }

    async fn heartbeat(
        &self,
        instance: &str,
        at: Millis,
        since: Millis,
    ) -> Result<i64, StoreError> {
        let instance = instance.to_string();
        self.write(move |c| db::now(ops::heartbeat(c, &instance, at, since)))
            .await
    }

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError> {
        let instance = instance.to_string();
        self.write(move |c| db::now(ops::leave_instances(c, &instance)))
            .await
    }

    async fn owner_load(
        &self,
        owner: &OwnerId,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError> {
        self.read
            .raw(|c| db::now(ops::owner_load(c, owner, key, day)))
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
            db::now(ops::set_key_limits(
                c,
                &id,
                limits.clone(),
                &actor,
                &reason,
                at,
            ))
        })
        .await
    }

    async fn usage(
        &self,
        owner: Option<&OwnerId>,
        from_day: i64,
    ) -> Result<Vec<UsageRow>, StoreError> {
        let owner = owner.cloned();
        self.read
            .scan(move |c| db::now(ops::usage(c, owner.as_deref(), from_day)))
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
            db::now(ops::set_provider_enabled(
                c, &name, enabled, &actor, &reason, at,
            ))
        })
        .await
    }

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError> {
        self.read.raw(|c| db::now(ops::provider_switches(c)))
    }

    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError> {
        self.read
            .raw(|c| db::now(ops::provider_audit(c, name, limit)))
    }
}

#[async_trait]
impl ContractRunStore for SqliteStore {
    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::insert_contract_run(c, run.clone())))
            .await
    }

    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError> {
        self.read.raw(|c| db::now(ops::latest_contract_runs(c)))
    }

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError> {
        self.read.raw(|c| db::now(ops::contract_run(c, id)))
    }
}

#[async_trait]
impl ConsoleStore for SqliteStore {
    async fn review_queue_depth(&self) -> Result<i64, StoreError> {
        self.read.raw(|c| db::now(ops::review_queue_depth(c)))
    }

    async fn list_jobs(&self, filter: &JobFilter, limit: i64) -> Result<Vec<Job>, StoreError> {
        let filter = filter.clone();
        self.read
            .scan(move |c| db::now(ops::list_jobs(c, &filter, limit)))
            .await
    }

    async fn window_stats(
        &self,
        from: Millis,
        to: Millis,
        column_ms: i64,
    ) -> Result<WindowStats, StoreError> {
        self.read
            .scan(move |c| db::now(ops::window_stats(c, from, to, column_ms)))
            .await
    }
}

#[async_trait]
impl HedgingStore for SqliteStore {
    async fn put_hedging_shares(
        &self,
        shares: Vec<HedgingShare>,
        forget_before: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::put_hedging_shares(c, shares.clone(), forget_before)))
            .await
    }

    async fn hedging_shares(&self, since: Millis) -> Result<Vec<HedgingShare>, StoreError> {
        self.read.raw(|c| db::now(ops::hedging_shares(c, since)))
    }
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn insert_webhook_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        self.write(move |c| db::now(ops::insert_webhook_endpoint(c, endpoint.clone())))
            .await
    }

    async fn list_webhook_endpoints(
        &self,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<WebhookEndpoint>, StoreError> {
        self.read
            .raw(|c| db::now(ops::list_webhook_endpoints(c, owner.map(OwnerId::as_str))))
    }

    async fn get_webhook_endpoint(&self, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.read.raw(|c| db::now(ops::get_webhook_endpoint(c, id)))
    }

    async fn delete_webhook_endpoint(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| db::now(ops::delete_webhook_endpoint(c, &id)))
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
            db::now(ops::rotate_webhook_secret(
                c,
                &id,
                &secret,
                previous_until,
                at,
            ))
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
            db::now(ops::claim_webhook_deliveries(
                c,
                &instance,
                now,
                lease_until,
                limit,
                per_endpoint,
            ))
        })
        .await
    }

    async fn record_webhook_try(&self, record: WebhookTryRecord) -> Result<bool, StoreError> {
        self.write(move |c| db::now(ops::record_webhook_try(c, record.clone())))
            .await
    }

    async fn list_webhook_deliveries(
        &self,
        endpoint_id: &str,
        limit: i64,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        self.read
            .raw(|c| db::now(ops::list_webhook_deliveries(c, endpoint_id, limit)))
    }

    async fn get_webhook_delivery(&self, id: &str) -> Result<Option<WebhookDelivery>, StoreError> {
        self.read.raw(|c| db::now(ops::get_webhook_delivery(c, id)))
    }

    async fn list_webhook_tries(&self, delivery_id: &str) -> Result<Vec<WebhookTry>, StoreError> {
        self.read
            .raw(|c| db::now(ops::list_webhook_tries(c, delivery_id)))
    }

    async fn redeliver_webhook(&self, id: &str, at: Millis) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| db::now(ops::redeliver_webhook(c, &id, at)))
            .await
    }

    async fn webhook_counts(&self) -> Result<WebhookCounts, StoreError> {
        self.read.raw(|c| db::now(ops::webhook_counts(c)))
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
            .write(|c| Ok(c.execute_batch("CREATE TABLE probe (n INTEGER NOT NULL)")?))
            .await
            .unwrap();
        (dir, store)
    }

    fn page_size(store: &SqliteStore) -> i64 {
        store
            .read
            .raw(|c| Ok(c.query_row("PRAGMA page_size", [], |row| row.get(0))?))
            .unwrap()
    }

    #[tokio::test]
    async fn a_new_file_takes_the_page_size_and_an_existing_file_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("new.db")).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(page_size(&store), PAGE_SIZE);
        store.close().await;

        // A file an earlier build made, with SQLite's default pages (its
        // migrator's table first, as sqlx's made it; a file of tables
        // and no migrations is another program's, and refused).
        let old = dir.path().join("old.db");
        rusqlite::Connection::open(&old)
            .unwrap()
            .execute_batch(
                "PRAGMA journal_mode = WAL; CREATE TABLE _sqlx_migrations ( \
                 version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                 installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
                 success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
            )
            .unwrap();
        let store = SqliteStore::open(&old).await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(page_size(&store), 4096);
        assert_eq!(store.count_jobs().await.unwrap(), 0);
        store.close().await;
    }

    /// Holds the writer thread inside a write until `release` is sent:
    /// what is queued meanwhile is committed as one batch.
    async fn hold_writer(
        store: &Arc<SqliteStore>,
    ) -> (
        oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
        let (started, is_started) = oneshot::channel::<()>();
        let (release, released) = oneshot::channel::<()>();
        // Counted as a write in flight until the holder is answered, so
        // that the holder's write, and every write while it holds, goes to
        // the writer thread.
        store.writing.fetch_add(1, Ordering::AcqRel);
        let holder = {
            let store = store.clone();
            tokio::spawn(async move {
                let (mut started, mut released) = (Some(started), Some(released));
                let held = store
                    .write(move |_| {
                        if let (Some(started), Some(released)) = (started.take(), released.take()) {
                            let _ = started.send(());
                            // The writer's own thread, outside any runtime.
                            let _ = released.blocking_recv();
                        }
                        Ok(())
                    })
                    .await;
                store.writing.fetch_sub(1, Ordering::AcqRel);
                held
            })
        };
        is_started.await.unwrap();
        (release, holder)
    }

    /// Insert `n` into the probe, answering the name of the thread the
    /// write ran on.
    async fn insert_probe_on(store: &SqliteStore, n: i64) -> Result<String, StoreError> {
        store
            .write(move |c| {
                db::now(db::Db::execute(
                    c,
                    "INSERT INTO probe (n) VALUES ($1)",
                    db::args![n],
                ))?;
                Ok(std::thread::current().name().unwrap_or("").to_string())
            })
            .await
    }

    const WRITER: &str = "onejob-sqlite-writer";

    /// A write with no other in flight commits on its caller's thread; a
    /// write while another is in flight goes to the writer thread. Both
    /// are committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_lone_write_commits_on_its_callers_thread() {
        let (_dir, store) = store_with_probe().await;
        let lone = {
            let store = store.clone();
            tokio::spawn(async move { insert_probe_on(&store, 1).await })
        };
        let thread = lone.await.unwrap().unwrap();
        assert_ne!(thread, WRITER);

        let (release, holder) = hold_writer(&store).await;
        let queued = {
            let store = store.clone();
            tokio::spawn(async move { insert_probe_on(&store, 2).await })
        };
        wait_until_queued(&store, 1).await;
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), WRITER);
        assert_eq!(probe_rows(&store).await, vec![1, 2]);
    }

    /// While another connection (another process, say) holds the write
    /// lock, a lone write does not wait for it on the caller's thread,
    /// which would stop the runtime's one worker: it goes to the writer
    /// thread, which waits, and commits once the lock is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_lone_write_leaves_a_held_lock_to_the_writer_thread() {
        let (dir, store) = store_with_probe().await;
        let other = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let write = {
            let store = store.clone();
            tokio::spawn(async move { insert_probe_on(&store, 7).await })
        };
        // Each of these runs on the one worker after the write's task has
        // had its turns: they finish only if that worker is not blocked.
        // (Waited for on this thread: the runtime's timers would stop with
        // its worker.)
        for _ in 0..10 {
            let (pong, ponged) = std::sync::mpsc::channel();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let _ = pong.send(());
            });
            ponged
                .recv_timeout(Duration::from_secs(5))
                .expect("the runtime's worker is blocked");
        }
        assert!(!write.is_finished());
        assert_eq!(probe_rows(&store).await, Vec::<i64>::new());
        other.execute_batch("COMMIT").unwrap();
        assert_eq!(write.await.unwrap().unwrap(), WRITER);
        assert_eq!(probe_rows(&store).await, vec![7]);
    }

    /// A write that panics on its caller's thread, inside its transaction,
    /// leaves nothing behind: the next write rolls the transaction back
    /// and commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_write_that_panicked_on_its_callers_thread_is_rolled_back() {
        let (_dir, store) = store_with_probe().await;
        let panicked = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(|c| -> Result<(), StoreError> {
                        db::now(db::Db::execute(
                            c,
                            "INSERT INTO probe (n) VALUES ($1)",
                            db::args![1i64],
                        ))?;
                        assert_ne!(std::thread::current().name(), Some(WRITER));
                        panic!("a write's bug");
                    })
                    .await
            })
        };
        assert!(panicked.await.unwrap_err().is_panic());
        insert_probe_on(&store, 2).await.unwrap();
        assert_eq!(probe_rows(&store).await, vec![2]);
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
        let rows: Vec<(i64,)> = store
            .read
            .raw(|c| {
                db::now(db::Db::fetch_all(
                    c,
                    "SELECT n FROM probe ORDER BY rowid",
                    &[],
                ))
            })
            .unwrap();
        rows.into_iter().map(|(n,)| n).collect()
    }

    /// Insert `n` into the probe; an odd `n` then fails.
    async fn insert_probe(store: &SqliteStore, n: i64) -> Result<i64, StoreError> {
        insert_probe_counted(store, n, Arc::default()).await
    }

    /// [`insert_probe`], counting each time the write runs in `runs`.
    async fn insert_probe_counted(
        store: &SqliteStore,
        n: i64,
        runs: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<i64, StoreError> {
        store
            .write(move |c| {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                db::now(db::Db::execute(
                    c,
                    "INSERT INTO probe (n) VALUES ($1)",
                    db::args![n],
                ))?;
                match n % 2 {
                    1 => Err(StoreError::NotFound("odd")),
                    _ => Ok(n),
                }
            })
            .await
    }

    /// Ten writes committed as one batch, every odd one failing after it
    /// wrote: each failure undoes its own row only, and its caller hears so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_in_a_batch_undoes_only_itself() {
        let (_dir, store) = store_with_probe().await;
        let (release, holder) = hold_writer(&store).await;
        let writes: Vec<_> = (0..10i64)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move { insert_probe(&store, n).await })
            })
            .collect();
        wait_until_queued(&store, 10).await;
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        for (n, write) in writes.into_iter().enumerate() {
            let result = write.await.unwrap();
            assert_eq!(result.is_ok(), n % 2 == 0, "write {n}: {result:?}");
        }
        // Spawned at once, the ten queue in any order.
        let mut rows = probe_rows(&store).await;
        rows.sort();
        assert_eq!(rows, vec![0, 2, 4, 6, 8]);
    }

    /// A batch runs each write once when all succeed. When one fails, the
    /// batch is rolled back and runs again, each write in a savepoint: the
    /// writes before the failure run twice, and their rows are written once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_run_again_for_a_failure_writes_each_row_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (_dir, store) = store_with_probe().await;
        let batch = |ns: Vec<i64>, runs: Arc<AtomicUsize>| {
            let store = store.clone();
            async move {
                let (release, holder) = hold_writer(&store).await;
                let mut writes = Vec::new();
                for (i, n) in ns.into_iter().enumerate() {
                    let (store2, runs) = (store.clone(), runs.clone());
                    writes.push(tokio::spawn(async move {
                        insert_probe_counted(&store2, n, runs).await
                    }));
                    // Queued in this order, so the failure's place is known.
                    wait_until_queued(&store, i + 1).await;
                }
                release.send(()).unwrap();
                holder.await.unwrap().unwrap();
                let mut results = Vec::new();
                for write in writes {
                    results.push(write.await.unwrap().is_ok());
                }
                results
            }
        };
        let runs = Arc::new(AtomicUsize::new(0));
        let all_ok = batch(vec![0, 2, 4, 6], runs.clone()).await;
        assert_eq!(all_ok, vec![true; 4]);
        assert_eq!(runs.load(Ordering::SeqCst), 4, "each write ran once");

        let runs = Arc::new(AtomicUsize::new(0));
        let one_failed = batch(vec![10, 12, 13, 14], runs.clone()).await;
        assert_eq!(one_failed, vec![true, true, false, true]);
        // 10, 12 and 13 (which failed) on the first try; all four again.
        assert_eq!(runs.load(Ordering::SeqCst), 7);
        assert_eq!(probe_rows(&store).await, vec![0, 2, 4, 6, 10, 12, 14]);
    }

    /// Every commit of writes counts once, with the writes it carried: a
    /// lone write's on its caller's thread, and a batch's on the writer's
    /// (a write that failed in a batch that committed is carried too). A
    /// lone write that failed was rolled back: nothing counts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_commit_counts_once_with_the_writes_it_carried() {
        let (_dir, store) = store_with_probe().await;
        let since = |before: CommitCounts| {
            let now = store.commit_counts();
            (now.commits - before.commits, now.writes - before.writes)
        };
        let before = store.commit_counts();
        insert_probe(&store, 0).await.unwrap();
        assert_eq!(since(before), (1, 1), "a lone write");

        let before = store.commit_counts();
        insert_probe(&store, 1).await.unwrap_err();
        assert_eq!(since(before), (0, 0), "a lone write rolled back");

        let before = store.commit_counts();
        let (release, holder) = hold_writer(&store).await;
        let mut writes = Vec::new();
        for (i, n) in [10i64, 12, 13, 14].into_iter().enumerate() {
            let store2 = store.clone();
            writes.push(tokio::spawn(async move { insert_probe(&store2, n).await }));
            wait_until_queued(&store, i + 1).await;
        }
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        let results: Vec<bool> = futures::future::join_all(writes)
            .await
            .into_iter()
            .map(|w| w.unwrap().is_ok())
            .collect();
        assert_eq!(results, vec![true, true, false, true]);
        // The holder's write alone, then the four queued behind it.
        assert_eq!(since(before), (2, 5), "two batches");
        assert_eq!(probe_rows(&store).await, vec![0, 10, 12, 14]);
    }

    /// A closed store refuses reads.
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

    /// Writes queued in one batch are committed in the order they were
    /// queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_commits_in_queue_order() {
        let (_dir, store) = store_with_probe().await;
        let (release, holder) = hold_writer(&store).await;
        let mut writes = Vec::new();
        for i in 0..7 {
            let n = 2 * i as i64;
            let store2 = store.clone();
            writes.push(tokio::spawn(async move { insert_probe(&store2, n).await }));
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

    /// A migration changed after it was applied is refused, as sqlx's
    /// migrator refuses it, and nothing more is applied.
    #[tokio::test]
    async fn an_edited_migration_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db")).await.unwrap();
        store.migrate().await.unwrap();
        store
            .write(|c| {
                Ok(c.execute_batch(
                    "UPDATE _sqlx_migrations SET checksum = X'00' WHERE version = 1",
                )?)
            })
            .await
            .unwrap();
        let again = store.migrate().await;
        assert!(
            matches!(
                again,
                Err(StoreError::Migrate(
                    sqlx::migrate::MigrateError::VersionMismatch(1)
                ))
            ),
            "{again:?}"
        );
    }

    /// SQLite is built as `.cargo/config.toml` says (`LIBSQLITE3_FLAGS`):
    /// the options reach the compiled-in library.
    #[test]
    fn sqlite_is_built_with_the_configured_options() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
        // Each connection's page cache its own, with no mutex around it.
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
    }
}
