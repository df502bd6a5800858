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

use super::{CommitCounter, CreateOutcome, FinishAttempt, FinishOutcome, StoreError};
use crate::domain::job::NewJob;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::sql::postgres as ops;

/// One batch's statement: each call's answer, in the batch's order.
type RunBatch<T, R> =
    Box<dyn Fn(Arc<Conns>, Vec<T>) -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> + Send + Sync>;

/// Kept connections, each with when it was last used.
type Kept = Vec<(PoolConnection<Postgres>, Instant)>;

/// The connections a batcher's statements run on, kept between batches.
/// A connection given back to sqlx's pool is pinged there, always: a round
/// trip to PostgreSQL (and a wake-up of its backend) for every batch, as
/// many as the statements themselves. A kept connection is given back only
/// when a batch fails on it or its caller goes away mid-statement, or
/// when the store closes.
pub(crate) struct Conns {
    pool: PgPool,
    /// `None` once closed.
    kept: Mutex<Option<Kept>>,
    /// The most kept at once: the batches in flight.
    most: usize,
    /// A connection unused this long is pinged before it is used again.
    ping_idle_after: Duration,
    /// Each statement that committed, with the calls it carried.
    commits: Arc<CommitCounter>,
}

impl Conns {
    pub(crate) fn new(
        pool: PgPool,
        most: usize,
        ping_idle_after: Duration,
        commits: Arc<CommitCounter>,
    ) -> Self {
        Conns {
            pool,
            kept: Mutex::new(Some(Vec::new())),
            most,
            ping_idle_after,
            commits,
        }
    }

    /// A kept connection, or one from the pool. One idle for a while may
    /// have been dropped by the server meanwhile (a restart, an idle
    /// timeout), so it is pinged first, as the pool pings its idle ones.
    pub(crate) async fn take(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let kept = self
            .kept
            .lock()
            .ok()
            .and_then(|mut kept| kept.as_mut().and_then(Vec::pop));
        if let Some((mut conn, used)) = kept {
            if used.elapsed() < self.ping_idle_after
                || sqlx::Connection::ping(&mut *conn).await.is_ok()
            {
                return Ok(conn);
            }
        }
        self.pool.acquire().await
    }

    /// Keep `conn`, which a batch used without an error, for the next.
    pub(crate) fn keep(&self, conn: PoolConnection<Postgres>) {
        if let Ok(mut kept) = self.kept.lock() {
            if let Some(kept) = kept.as_mut().filter(|kept| kept.len() < self.most) {
                kept.push((conn, Instant::now()));
            }
        }
    }

    /// Give every kept connection back to the pool, and keep none from
    /// now on (the pool waits for its connections when it closes).
    pub(crate) fn close(&self) {
        let kept = self.kept.lock().ok().and_then(|mut kept| kept.take());
        drop(kept);
    }
}

/// Calls of one kind waiting for their shared statement, each with where
/// its own answer goes.
pub(crate) struct Batcher<T, R> {
    shared: Arc<Shared<T, R>>,
}

struct Shared<T, R> {
    conns: Arc<Conns>,
    queue: Mutex<Vec<(T, oneshot::Sender<R>)>>,
    slots: Arc<Semaphore>,
    max_batch: usize,
    run: RunBatch<T, R>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Batches of at most `max_batch` calls, at most `in_flight` at once,
    /// each run by `run`, which answers each call in the batch's order.
    /// Each statement that commits counts in `commits`, with the calls it
    /// carried (`create_batch`, `finish_batch`).
    pub(crate) fn new<F, Fut>(
        pool: PgPool,
        ping_idle_after: Duration,
        in_flight: usize,
        max_batch: usize,
        commits: Arc<CommitCounter>,
        run: F,
    ) -> Self
    where
        F: Fn(Arc<Conns>, Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        Batcher {
            shared: Arc::new(Shared {
                conns: Arc::new(Conns::new(pool, in_flight, ping_idle_after, commits)),
                queue: Mutex::new(Vec::new()),
                slots: Arc::new(Semaphore::new(in_flight)),
                max_batch,
                run: Box::new(move |conns, items| Box::pin(run(conns, items))),
            }),
        }
    }

    /// Give the kept connections back to the pool, and keep none from now
    /// on: before the pool closes.
    pub(crate) fn close(&self) {
        self.shared.conns.close();
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
        let answers = (self.run)(self.conns.clone(), items).await;
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
/// Batched creates in flight at once: one. While it runs, the next batch
/// fills up. With more, a caller that finds a slot free sends its batch at
/// once, so under load the statements carry few rows each, and most of
/// PostgreSQL's work per statement (plan nodes, triggers' set-up, commit)
/// is paid per job again: where PostgreSQL shares the cores with onejob, 4
/// in flight (and 2 finishes) did 16–23% fewer jobs/s than 1 at C=32, with
/// half as much again of PostgreSQL's CPU per job; measured again beside
/// each other on a quiet machine, 2 of each did 24–26% fewer jobs/s at
/// 51–69% more of PostgreSQL's CPU per job (`docs/benchmarks.md`).
pub(crate) const CREATE_BATCHES_IN_FLIGHT: usize = 1;

/// Each job's outcome, in `jobs`' order. A batch that fails is tried again
/// job by job, so a row that fails fails only its own create.
pub(crate) async fn create_batch(
    conns: Arc<Conns>,
    jobs: Vec<NewJob>,
) -> Vec<Result<CreateOutcome, StoreError>> {
    let mut conn = match conns.take().await {
        Ok(conn) => conn,
        Err(e) => return every_one_fails(jobs.len(), e.into()),
    };
    let inserted = match ops::insert_jobs_batched(&mut conn, &jobs).await {
        Ok(inserted) => {
            conns.commits.add(jobs.len());
            inserted
        }
        Err(e) if jobs.len() == 1 => return vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, jobs = jobs.len(), "a batch of creates failed; each is tried alone");
            let mut outcomes = Vec::with_capacity(jobs.len());
            for job in jobs {
                let outcome =
                    match ops::insert_jobs_batched(&mut conn, std::slice::from_ref(&job)).await {
                        Ok(inserted) => {
                            conns.commits.add(1);
                            ops::create_outcome(&mut *conn, job, inserted[0]).await
                        }
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
    if outcomes.iter().all(Result::is_ok) {
        conns.keep(conn);
    }
    outcomes
}

/// Most winning finishes one statement carries.
pub(crate) const MAX_FINISH_BATCH: usize = 64;
/// Batched finishes in flight at once: one, as for creates.
pub(crate) const FINISH_BATCHES_IN_FLIGHT: usize = 1;

/// A succeeded attempt's finish tried as a win in a shared statement:
/// `Ok(Ok(won))` when it won there, `Ok(Err(finish))` (the finish given
/// back) when it did not, and then nothing of it was written: the caller
/// runs the whole step in a transaction, which says what happened (a lost
/// CAS, an attempt gone or ended).
pub(crate) type TriedWin = Result<Result<FinishOutcome, Box<FinishAttempt>>, StoreError>;

/// Each finish's try, in `finishes`' order. A batch that fails is tried
/// again finish by finish.
pub(crate) async fn finish_batch(conns: Arc<Conns>, finishes: Vec<FinishAttempt>) -> Vec<TriedWin> {
    let mut conn = match conns.take().await {
        Ok(conn) => conn,
        Err(e) => return every_one_fails(finishes.len(), e.into()),
    };
    let won = match ops::finish_won_batched(&mut conn, &finishes).await {
        Ok(won) => {
            conns.commits.add(finishes.len());
            won
        }
        Err(e) if finishes.len() == 1 => return vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, finishes = finishes.len(), "a batch of finishes failed; each is tried alone");
            let mut tries = Vec::with_capacity(finishes.len());
            for finish in finishes {
                let won = ops::finish_won_batched(&mut conn, std::slice::from_ref(&finish)).await;
                if won.is_ok() {
                    conns.commits.add(1);
                }
                tries.push(won.map(|mut won| won.pop().flatten().ok_or(Box::new(finish))));
            }
            return tries;
        }
    };
    conns.keep(conn);
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
        let batcher = Arc::new(Batcher::new(
            pool,
            Duration::from_secs(1),
            1,
            8,
            Arc::default(),
            move |_conns, items: Vec<u32>| {
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
            },
        ));
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

    /// A batch whose statement never ran (the server is not there) counts
    /// no commit, though its calls were answered: only statements that
    /// committed do.
    #[tokio::test]
    async fn a_batch_that_never_ran_counts_no_commit() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(200))
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let commits = Arc::new(CommitCounter::default());
        let batcher = Batcher::new(
            pool,
            Duration::from_secs(1),
            1,
            8,
            commits.clone(),
            create_batch,
        );
        let job = NewJob {
            id: crate::domain::new_id().into(),
            owner_id: "alice".into(),
            idempotency_key: "k".to_string(),
            fingerprint: "f".to_string(),
            request: "{}".to_string(),
            route: "default".to_string(),
            created_at: 0,
            lease: None,
            key_id: None,
            primary: None,
        };
        let answer = batcher.call(job).await.unwrap();
        assert!(answer.is_err(), "{answer:?}");
        assert_eq!(commits.counts(), crate::store::CommitCounts::default());
    }

    /// A batch's connection serves the next batch as it is, not given back
    /// to the pool in between; one the server dropped meanwhile is pinged,
    /// found dead and replaced; and closing gives the kept ones back, so
    /// that the pool can close.
    #[tokio::test]
    async fn a_kept_connection_serves_the_next_batch_and_a_dead_one_is_replaced() {
        let Some(url) = std::env::var("ONEJOB_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            eprintln!(
                "SKIPPED (PostgreSQL): set ONEJOB_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres to run it"
            );
            return;
        };
        async fn backend(conn: &mut PoolConnection<Postgres>) -> i32 {
            sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut **conn)
                .await
                .unwrap()
        }
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        // Pinged whenever it is taken again.
        let conns = Conns::new(pool.clone(), 1, Duration::ZERO, Arc::default());

        let mut conn = conns.take().await.unwrap();
        let first = backend(&mut conn).await;
        conns.keep(conn);
        let kept = |conns: &Conns| conns.kept.lock().unwrap().as_ref().map(Vec::len);
        assert_eq!(kept(&conns), Some(1));
        assert_eq!(
            (pool.size(), pool.num_idle()),
            (1, 0),
            "kept, not in the pool"
        );
        let mut conn = conns.take().await.unwrap();
        assert_eq!(backend(&mut conn).await, first);
        conns.keep(conn);

        // The server drops it (a restart, an idle timeout).
        let mut other = pool.acquire().await.unwrap();
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(first)
            .fetch_one(&mut *other)
            .await
            .unwrap();
        assert!(terminated);
        drop(other);
        let mut conn = conns.take().await.unwrap();
        assert_ne!(backend(&mut conn).await, first);
        conns.keep(conn);

        conns.close();
        assert_eq!(kept(&conns), None);
        tokio::time::timeout(Duration::from_secs(10), pool.close())
            .await
            .expect("the kept connection went back to the pool");
    }
}
