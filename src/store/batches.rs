//! PostgreSQL's shared statements: the creates and the winning finishes of
//! concurrent callers each go in one statement and its commit. Most of
//! PostgreSQL's work per statement (building the plan's nodes, the AFTER
//! triggers' set-up, the commit's WAL flush) is the same for one row or
//! many, and on a machine where PostgreSQL shares the cores with onejob
//! that work, not the rows, set the jobs per second.
//!
//! A [`Batcher`] queues calls of one kind. While `in_flight` statements run,
//! what arrives queues; the next free slot takes all of it (up to
//! `max_batch`). A call that finds a slot free runs the statement itself,
//! on its own task, with whatever queued beside it: alone, a call is a
//! batch of one, sent at once, and no other task is woken for it (on a
//! virtual machine each wake-up of a sleeping thread is an interrupt
//! round trip, the larger part of a lone job's time).
//!
//! The callers are tasks that outlive their clients (`run_to_completion`,
//! the engine's attempts). A caller dropped while it runs a batch leaves
//! the statement to finish on PostgreSQL's side; the others of that batch
//! are answered `StoreError::Closed` and read back what committed, as
//! after any lost acknowledgement.

use super::{CreateOutcome, FinishAttempt, FinishOutcome, StoreError};
use crate::domain::job::NewJob;
use sqlx::PgPool;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::sql::postgres as ops;

/// One batch's statement: each call's answer, in the batch's order.
type RunBatch<T, R> =
    Box<dyn Fn(PgPool, Vec<T>) -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> + Send + Sync>;

/// Calls of one kind waiting for their shared statement, each with where
/// its own answer goes.
pub(crate) struct Batcher<T, R> {
    shared: Arc<Shared<T, R>>,
}

struct Shared<T, R> {
    pool: PgPool,
    queue: Mutex<Vec<(T, oneshot::Sender<R>)>>,
    slots: Arc<Semaphore>,
    max_batch: usize,
    run: RunBatch<T, R>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Batches of at most `max_batch` calls, at most `in_flight` at once,
    /// each run by `run`, which answers each call in the batch's order.
    pub(crate) fn new<F, Fut>(pool: PgPool, in_flight: usize, max_batch: usize, run: F) -> Self
    where
        F: Fn(PgPool, Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        Batcher {
            shared: Arc::new(Shared {
                pool,
                queue: Mutex::new(Vec::new()),
                slots: Arc::new(Semaphore::new(in_flight)),
                max_batch,
                run: Box::new(move |pool, items| Box::pin(run(pool, items))),
            }),
        }
    }

    /// Queue `item` for the next statement and wait for its answer.
    pub(crate) async fn call(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.shared
            .queue
            .lock()
            .map_err(|_| StoreError::Closed)?
            .push((item, reply));
        if let Ok(slot) = self.shared.slots.clone().try_acquire_owned() {
            self.shared.run_next(slot).await;
        }
        answer.await.map_err(|_| StoreError::Closed)
    }
}

impl<T: Send + 'static, R: Send + 'static> Shared<T, R> {
    /// Run the queue's next batch in `slot`, answer its calls, give the
    /// slot back, and start the batch after it if one queued meanwhile
    /// (its callers found every slot taken and only wait).
    async fn run_next(self: &Arc<Self>, slot: OwnedSemaphorePermit) {
        let batch = self.take_batch();
        if !batch.is_empty() {
            let (items, replies): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
            let answers = (self.run)(self.pool.clone(), items).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The caller may have gone; what was committed stays committed.
                let _ = reply.send(answer);
            }
        }
        drop(slot);
        if self.has_queued() {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                Self::spawn_next(self.clone(), slot);
            }
        }
    }

    /// [`run_next`](Self::run_next) on a task of its own.
    fn spawn_next(shared: Arc<Self>, slot: OwnedSemaphorePermit) {
        let next: Pin<Box<dyn Future<Output = ()> + Send>> =
            Box::pin(async move { shared.run_next(slot).await });
        tokio::spawn(next);
    }

    fn take_batch(&self) -> Vec<(T, oneshot::Sender<R>)> {
        let Ok(mut queue) = self.queue.lock() else {
            return Vec::new();
        };
        let n = queue.len().min(self.max_batch);
        queue.drain(..n).collect()
    }

    fn has_queued(&self) -> bool {
        self.queue.lock().map(|q| !q.is_empty()).unwrap_or(false)
    }
}

/// Most creates one statement carries.
pub(crate) const MAX_CREATE_BATCH: usize = 64;
/// Batched creates in flight at once; while they run, the next batches
/// fill up.
pub(crate) const CREATE_BATCHES_IN_FLIGHT: usize = 4;

/// Each job's outcome, in `jobs`' order. A batch that fails is tried again
/// job by job, so a row that fails fails only its own create.
pub(crate) async fn create_batch(
    pool: PgPool,
    jobs: Vec<NewJob>,
) -> Vec<Result<CreateOutcome, StoreError>> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return every_one_fails(jobs.len(), e.into()),
    };
    let inserted = match ops::insert_jobs_batched(&mut conn, &jobs).await {
        Ok(inserted) => inserted,
        Err(e) if jobs.len() == 1 => return vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, jobs = jobs.len(), "a batch of creates failed; each is tried alone");
            let mut outcomes = Vec::with_capacity(jobs.len());
            for job in jobs {
                let outcome =
                    match ops::insert_jobs_batched(&mut conn, std::slice::from_ref(&job)).await {
                        Ok(inserted) => ops::create_outcome(&mut *conn, job, inserted[0]).await,
                        Err(e) => Err(e),
                    };
                outcomes.push(outcome);
            }
            return outcomes;
        }
    };
    let mut outcomes = Vec::with_capacity(jobs.len());
    for (job, inserted) in jobs.into_iter().zip(inserted) {
        outcomes.push(ops::create_outcome(&mut *conn, job, inserted).await);
    }
    outcomes
}

/// Most winning finishes one statement carries.
pub(crate) const MAX_FINISH_BATCH: usize = 64;
/// Batched finishes in flight at once.
pub(crate) const FINISH_BATCHES_IN_FLIGHT: usize = 2;

/// A succeeded attempt's finish tried as a win in a shared statement:
/// `Ok(Ok(won))` when it won there, `Ok(Err(finish))` (the finish given
/// back) when it did not, and then nothing of it was written: the caller
/// runs the whole step in a transaction, which says what happened (a lost
/// CAS, an attempt gone or ended).
pub(crate) type TriedWin = Result<Result<FinishOutcome, Box<FinishAttempt>>, StoreError>;

/// Each finish's try, in `finishes`' order. A batch that fails is tried
/// again finish by finish.
pub(crate) async fn finish_batch(pool: PgPool, finishes: Vec<FinishAttempt>) -> Vec<TriedWin> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return every_one_fails(finishes.len(), e.into()),
    };
    let won = match ops::finish_won_batched(&mut conn, &finishes).await {
        Ok(won) => won,
        Err(e) if finishes.len() == 1 => return vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, finishes = finishes.len(), "a batch of finishes failed; each is tried alone");
            let mut tries = Vec::with_capacity(finishes.len());
            for finish in finishes {
                let won = ops::finish_won_batched(&mut conn, std::slice::from_ref(&finish)).await;
                tries.push(won.map(|mut won| won.pop().flatten().ok_or(Box::new(finish))));
            }
            return tries;
        }
    };
    finishes
        .into_iter()
        .zip(won)
        .map(|(finish, won)| Ok(won.ok_or_else(|| Box::new(finish))))
        .collect()
}

/// The answer of a batch that could not start: the same error for each.
fn every_one_fails<R>(n: usize, error: StoreError) -> Vec<Result<R, StoreError>> {
    if n == 1 {
        return vec![Err(error)];
    }
    let message = error.to_string();
    (0..n)
        .map(|_| Err(StoreError::Batch(message.clone())))
        .collect()
}
