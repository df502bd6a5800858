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

use super::signature::*;
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
/// connection to a local file cannot go stale.
///
/// Each is opened on first need: only when every open one is busy. Opening
/// one costs SQLite a parse of the whole schema (its pragmas read it), so a
/// CLI command that reads once, or a store whose reads never overlap, opens
/// one, not [`READERS`].
struct Readers {
    options: SqliteConnectOptions,
    conns: Vec<Mutex<Reader>>,
    next: AtomicUsize,
}

enum Reader {
    Unopened,
    Open(SqliteConnection),
    Closed,
}

impl Readers {
    fn new(options: SqliteConnectOptions) -> Self {
        Readers {
            options,
            conns: (0..READERS).map(|_| Mutex::new(Reader::Unopened)).collect(),
            next: AtomicUsize::new(0),
        }
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
        let read = Readers::new(options);
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

/// The body of one listed query on SQLite: reads on a reader connection;
/// writes (one statement or several) through the write queue, their
/// arguments carried there owned.
macro_rules! sqlite_call {
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
);

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
