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

use super::{
    ApiKey, CreateOutcome, FinishAttempt, FinishOutcome, JobEvent, NewEvent, Store, StoreError,
};
use crate::domain::attempt::NewAttempt;
use crate::domain::job::NewJob;
use crate::domain::{Attempt, GuardRefusal, Job};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection, SqlitePool};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

mod ops {
    crate::store::ops::store_ops!(sqlx::SqliteConnection, "");
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Most writes one commit carries.
const MAX_BATCH: usize = 128;
/// How long a writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

enum WriteOp {
    CreateJob(NewJob),
    StartAttempt(NewAttempt),
    FinishAttempt(FinishAttempt),
    Event(NewEvent),
    InsertApiKey(ApiKey),
    /// Commit what is queued before it, then stop the writer.
    Close,
}

enum WriteDone {
    Created(CreateOutcome),
    Started(Result<Attempt, GuardRefusal>),
    Finished(FinishOutcome),
    Done,
}

struct WriteCmd {
    op: WriteOp,
    reply: Option<oneshot::Sender<Result<WriteDone, StoreError>>>,
}

pub struct SqliteStore {
    path: PathBuf,
    read: SqlitePool,
    writer: mpsc::Sender<WriteCmd>,
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
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
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

    async fn write(&self, op: WriteOp) -> Result<WriteDone, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(WriteCmd {
                op,
                reply: Some(reply),
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// The single writer: takes what is queued (up to `MAX_BATCH`), commits it as
/// one transaction, then answers every caller. While it commits, the next
/// batch queues up, so the batch grows with the load.
async fn run_writer(mut conn: SqliteConnection, mut rx: mpsc::Receiver<WriteCmd>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(cmd) = rx.recv().await {
        batch.push(cmd);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => break,
            }
        }
        let closing = batch.iter().any(|cmd| matches!(cmd.op, WriteOp::Close));
        commit_batch(&mut conn, &mut batch).await;
        if closing {
            rx.close();
            while let Ok(cmd) = rx.try_recv() {
                answer(cmd, Err(StoreError::Closed));
            }
            break;
        }
    }
    let _ = sqlx::Connection::close(conn).await;
}

async fn commit_batch(conn: &mut SqliteConnection, batch: &mut Vec<WriteCmd>) {
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        tracing::error!(error = %e, "sqlite writer could not begin a transaction");
        let message = e.to_string();
        for cmd in batch.drain(..) {
            answer(cmd, Err(StoreError::Batch(message.clone())));
        }
        return;
    }
    let mut results = Vec::with_capacity(batch.len());
    for cmd in batch.iter_mut() {
        results.push(apply_in_savepoint(conn, &mut cmd.op).await);
    }
    if let Err(e) = sqlx::query("COMMIT").execute(&mut *conn).await {
        tracing::error!(error = %e, "sqlite writer commit failed; the batch is rolled back");
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        let message = e.to_string();
        for cmd in batch.drain(..) {
            answer(cmd, Err(StoreError::Batch(message.clone())));
        }
        return;
    }
    for (cmd, result) in batch.drain(..).zip(results) {
        answer(cmd, result);
    }
}

fn answer(cmd: WriteCmd, result: Result<WriteDone, StoreError>) {
    match cmd.reply {
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

async fn apply_in_savepoint(
    conn: &mut SqliteConnection,
    op: &mut WriteOp,
) -> Result<WriteDone, StoreError> {
    sqlx::query("SAVEPOINT op").execute(&mut *conn).await?;
    let result = apply(conn, op).await;
    if result.is_err() {
        sqlx::query("ROLLBACK TO SAVEPOINT op")
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("RELEASE SAVEPOINT op")
        .execute(&mut *conn)
        .await?;
    result
}

async fn apply(conn: &mut SqliteConnection, op: &mut WriteOp) -> Result<WriteDone, StoreError> {
    // Each op is applied once; taking it out leaves a cheap placeholder behind.
    let placeholder = WriteOp::Event(NewEvent {
        job_id: String::new(),
        attempt_id: None,
        kind: "",
        actor: String::new(),
        detail: None,
        at: 0,
    });
    Ok(match std::mem::replace(op, placeholder) {
        WriteOp::CreateJob(job) => WriteDone::Created(ops::create_job(conn, job).await?),
        WriteOp::StartAttempt(attempt) => {
            WriteDone::Started(ops::start_attempt(conn, attempt).await?)
        }
        WriteOp::FinishAttempt(finish) => {
            WriteDone::Finished(ops::finish_attempt(conn, finish).await?)
        }
        WriteOp::Event(event) => {
            ops::insert_event(conn, &event).await?;
            WriteDone::Done
        }
        WriteOp::InsertApiKey(key) => {
            ops::insert_api_key(conn, &key).await?;
            WriteDone::Done
        }
        WriteOp::Close => WriteDone::Done,
    })
}

fn unexpected() -> StoreError {
    StoreError::Corrupt("sqlite writer answered another kind of write".to_string())
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.read).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }

    async fn create_job(&self, job: NewJob) -> Result<CreateOutcome, StoreError> {
        match self.write(WriteOp::CreateJob(job)).await? {
            WriteDone::Created(outcome) => Ok(outcome),
            _ => Err(unexpected()),
        }
    }

    async fn find_job_by_key(&self, owner_id: &str, key: &str) -> Result<Option<Job>, StoreError> {
        ops::find_job_by_key(&mut *self.read.acquire().await?, owner_id, key).await
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        ops::get_job(&mut *self.read.acquire().await?, id).await
    }

    async fn list_attempts(&self, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
        ops::list_attempts(&mut *self.read.acquire().await?, job_id).await
    }

    async fn start_attempt(
        &self,
        attempt: NewAttempt,
    ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
        match self.write(WriteOp::StartAttempt(attempt)).await? {
            WriteDone::Started(outcome) => Ok(outcome),
            _ => Err(unexpected()),
        }
    }

    async fn finish_attempt(&self, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
        match self.write(WriteOp::FinishAttempt(finish)).await? {
            WriteDone::Finished(outcome) => Ok(outcome),
            _ => Err(unexpected()),
        }
    }

    async fn record_event(&self, event: NewEvent) -> Result<(), StoreError> {
        self.write(WriteOp::Event(event)).await.map(|_| ())
    }

    fn record_event_detached(&self, event: NewEvent) {
        let cmd = WriteCmd {
            op: WriteOp::Event(event),
            reply: None,
        };
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.writer.try_send(cmd) {
            let writer = self.writer.clone();
            tokio::spawn(async move {
                let _ = writer.send(cmd).await;
            });
        }
    }

    async fn list_events(&self, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
        ops::list_events(&mut *self.read.acquire().await?, job_id).await
    }

    async fn count_jobs(&self) -> Result<i64, StoreError> {
        ops::count_jobs(&mut *self.read.acquire().await?).await
    }

    async fn insert_api_key(&self, key: ApiKey) -> Result<(), StoreError> {
        self.write(WriteOp::InsertApiKey(key)).await.map(|_| ())
    }

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        ops::find_api_key(&mut *self.read.acquire().await?, key_hash).await
    }

    async fn close(&self) {
        let _ = self.write(WriteOp::Close).await;
        self.read.close().await;
    }
}
