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
        if let Ok(permit) = self.shared.slots.clone().try_acquire_owned() {
            self.shared.clone().run_next(permit).await;
        }
        answer.await.map_err(|_| StoreError::Closed)
    }
}

impl<T: Send + 'static, R: Send + 'static> Shared<T, R> {
    /// Run the queue's next batch in a statement slot and answer its calls.
    async fn run_next(self: Arc<Self>, permit: OwnedSemaphorePermit) {
        let _slot = Slot {
            shared: self.clone(),
            permit: Some(permit),
        };
        let batch = self.take_batch();
        if batch.is_empty() {
            return;
        }
        let (items, replies): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
        let answers = (self.run)(self.pool.clone(), items).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            // The caller may have gone; what was committed stays committed.
            let _ = reply.send(answer);
        }
    }

    /// [`run_next`](Self::run_next) on a task of its own.
    fn spawn_next(shared: Arc<Self>, permit: OwnedSemaphorePermit) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let next: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(shared.run_next(permit));
        runtime.spawn(next);
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

/// A statement slot in use. Given back when dropped (its batch answered,
/// or its caller gone mid-batch), and then the queue's next batch, if one
/// waits, is started on a task of its own: its callers found every slot
/// taken and only wait.
struct Slot<T: Send + 'static, R: Send + 'static> {
    shared: Arc<Shared<T, R>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<T: Send + 'static, R: Send + 'static> Drop for Slot<T, R> {
    fn drop(&mut self) {
        drop(self.permit.take());
        if self.shared.has_queued() {
            if let Ok(permit) = self.shared.slots.clone().try_acquire_owned() {
                Shared::spawn_next(self.shared.clone(), permit);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A caller dropped while its batch runs (its client gone, the runtime
    /// shutting its task down) gives its slot back, and the batch that
    /// queued behind it runs: its caller is answered, not left waiting.
    #[tokio::test]
    async fn a_batch_queued_behind_a_dropped_caller_still_runs() {
        // Never connected: the batches here do not touch the database.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let (started, first_started) = oneshot::channel::<()>();
        let started = Mutex::new(Some(started));
        let first = AtomicBool::new(true);
        let batcher = Arc::new(Batcher::new(pool, 1, 8, move |_pool, items: Vec<u32>| {
            let hold = first.swap(false, Ordering::SeqCst);
            let started = started.lock().unwrap().take();
            async move {
                if hold {
                    if let Some(started) = started {
                        let _ = started.send(());
                    }
                    std::future::pending::<()>().await;
                }
                items.into_iter().map(|n| n * 10).collect()
            }
        }));
        let holder = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call(1).await }
        });
        first_started.await.unwrap();
        let queued = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call(2).await }
        });
        while batcher.shared.queue.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        holder.abort();
        let answer = tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("the queued call is answered")
            .unwrap();
        assert_eq!(answer.unwrap(), 20);
        assert!(batcher.shared.queue.lock().unwrap().is_empty());
    }
}
