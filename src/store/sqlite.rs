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

use super::signature::*;
use super::sql::db;
use super::Store;
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

/// The body of one listed query on SQLite: reads on a reader connection;
/// writes (one statement or several) through the write queue, their
/// arguments carried there owned. The queries written against
/// [`Db`](super::sql::db::Db) run there through rusqlite (`raw`).
macro_rules! sqlite_call {
    (raw $self:ident $name:ident($($arg:ident: $ty:ty),*)) => {{
        $(let $arg = <$ty as Carry>::carry($arg);)*
        $self
            .write_raw(move |c| db::now(ops::$name(c, $($arg.lend()),*)))
            .await
    }};
    (transaction $self:ident create_job($($args:tt)*)) => {
        sqlite_call!(raw $self create_job($($args)*))
    };
    (transaction $self:ident finish_attempt($($args:tt)*)) => {
        sqlite_call!(raw $self finish_attempt($($args)*))
    };
    (writer $self:ident record_event($($args:tt)*)) => {
        sqlite_call!(raw $self record_event($($args)*))
    };
    (reader $self:ident find_job_by_key($($args:tt)*)) => {
        sqlite_call!(raw_read $self find_job_by_key($($args)*))
    };
    (reader $self:ident get_job($($args:tt)*)) => {
        sqlite_call!(raw_read $self get_job($($args)*))
    };
    (raw_read $self:ident $name:ident($($arg:ident: $ty:ty),*)) => {
        $self.read.raw(|c| db::now(ops::$name(c, $($arg),*)))
    };
    (reader $self:ident $name:ident($($arg:ident: $ty:ty),*)) => {
        ops::$name(&mut *$self.read.get().await?, $($arg),*).await
    };
    ($writer_or_transaction:ident $self:ident $name:ident($($arg:ident: $ty:ty),*)) => {{
        $(let $arg = <$ty as Carry>::carry($arg);)*
        $self
            .write(move |c| {
                Box::pin(async move {
                    ops::$name(c, $($arg.lend()),*).await
                })
            })
            .await
    }};
}

macro_rules! sqlite_store {
    (
        { $($extra:tt)* }
        $(
            $(#[$meta:meta])*
            $conn:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        )*
    ) => {
        #[async_trait]
        impl Store for SqliteStore {
            $($extra)*
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret, StoreError> {
                    sqlite_call!($conn self $name($($arg: $ty),*))
                }
            )*
        }
    };
}

crate::store_methods!(sqlite_store {
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
});

/// An argument of a write on its way through the write queue: the caller
/// may go away while the write waits, so the queue holds it owned
/// (`carry`), and the operation gets it back as the type the [`Store`]
/// method takes (`held.lend()`: moved out when the method takes it owned,
/// borrowed from the queued write when it takes a reference).
trait Carry {
    type Owned: Send + 'static;
    fn carry(self) -> Self::Owned;
}

trait Lend {
    type Out;
    fn lend(self) -> Self::Out;
}

/// A `&str` argument, held while its write waits.
struct Str(String);

/// An `Option<&str>` argument, held while its write waits.
struct OptStr(Option<String>);

impl Carry for &str {
    type Owned = Str;
    fn carry(self) -> Str {
        Str(self.to_string())
    }
}

impl<'a> Lend for &'a Str {
    type Out = &'a str;
    fn lend(self) -> &'a str {
        &self.0
    }
}

impl Carry for Option<&str> {
    type Owned = OptStr;
    fn carry(self) -> OptStr {
        OptStr(self.map(str::to_string))
    }
}

impl<'a> Lend for &'a OptStr {
    type Out = Option<&'a str>;
    fn lend(self) -> Option<&'a str> {
        self.0.as_deref()
    }
}

/// Owned arguments are moved into the queue and out again.
macro_rules! carry_owned {
    ($($t:ty),* $(,)?) => {
        $(
            impl Carry for $t {
                type Owned = $t;
                fn carry(self) -> $t {
                    self
                }
            }

            impl Lend for $t {
                type Out = $t;
                fn lend(self) -> $t {
                    self
                }
            }
        )*
    };
}

carry_owned!(
    i64,
    bool,
    Option<String>,
    NewJob,
    NewAttempt,
    FinishAttempt,
    NewEvent,
    Vec<NewEvent>,
    ApiKey,
    JobTransition,
    JobResolution,
    AttemptResolution,
    NewContractRun,
    Rotation,
    Vec<(String, Millis)>,
    OwnerLimitsRow,
    Vec<HedgingShare>,
);

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
        assert_eq!(store.find_job_by_key("alice", "k").await.unwrap(), None);
        assert_eq!(store.count_jobs().await.unwrap(), 0);
        store.close().await;
        let by_key = store.find_job_by_key("alice", "k").await;
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
