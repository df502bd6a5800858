//! A streamed job's [`StreamHub`]: what the job has told its clients, in
//! order. The round that owns the stream (`round.rs`, through its relay,
//! `relay.rs`) pushes the owning attempt's pieces here; clients (the first
//! request and any replay with the same key) read it from any position, so
//! a client that lost its connection resumes where it left off. A hub is
//! taken by the driver of its job (one process drives a job, by its
//! lease), ends with a finish (after the CAS committed the answer,
//! invariant 5) or an error, and lingers for resuming clients.

use super::Inner;
use crate::domain::job::{last_failure, Unanswered};
use crate::domain::{AttemptId, ErrorKind, FinishReason, Job, JobId, JobState, OwnerId};
use crate::providers::stream::Delta;
use crate::providers::Usage;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// How long a finished job's hub stays for resuming clients; after that a
/// replay streams the stored completion.
const HUB_LINGER: Duration = Duration::from_secs(60);

/// What a streamed job has told its clients, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// An attempt owns the stream (OpenAI's first chunk, with the role).
    Start {
        model: String,
        provider: String,
        attempt_id: AttemptId,
    },
    Piece {
        model: String,
        delta: Delta,
    },
    /// The answer is committed (the job succeeded).
    Finish {
        model: String,
        finish_reason: FinishReason,
        usage: Option<Usage>,
    },
    /// The stream ends without a whole answer; the job goes on.
    Error {
        code: String,
        message: String,
        /// When the stream ends because the job failed or went to review:
        /// its last failed attempt's kind, which `code` does not keep for a
        /// job in review unless it is a provider's refusal (a door may tell
        /// it, e.g. an overload). The same on the live stream and on the
        /// stored answer's.
        last_failure: Option<ErrorKind>,
    },
}

impl StreamEvent {
    pub fn ends_stream(&self) -> bool {
        matches!(self, StreamEvent::Finish { .. } | StreamEvent::Error { .. })
    }
}

#[derive(Debug, Default)]
struct HubState {
    /// A driver in this process runs the job streamed.
    driven: bool,
    events: Vec<StreamEvent>,
}

/// One streamed job's events, shared by its driver and its clients.
#[derive(Debug)]
pub struct StreamHub {
    state: Mutex<HubState>,
    /// The number of events, for clients waiting for the next one.
    count: watch::Sender<usize>,
}

impl Default for StreamHub {
    fn default() -> Self {
        StreamHub {
            state: Mutex::new(HubState::default()),
            count: watch::channel(0).0,
        }
    }
}

impl StreamHub {
    fn state(&self) -> MutexGuard<'_, HubState> {
        // Every mutation is a push or a flag: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a driver here runs the job streamed (so clients read here).
    pub fn is_driven(&self) -> bool {
        self.state().driven
    }

    /// Still taking events (no finish, no error yet).
    pub fn is_open(&self) -> bool {
        !self.state().events.last().is_some_and(|e| e.ends_stream())
    }

    /// The stream ended with an error: the job goes on without it, and a
    /// replay waits for the job's final answer instead.
    pub fn ended_in_error(&self) -> bool {
        matches!(self.state().events.last(), Some(StreamEvent::Error { .. }))
    }

    /// The error the stream ended with, if it did: its code and message.
    pub fn error(&self) -> Option<(String, String)> {
        match self.state().events.last() {
            Some(StreamEvent::Error { code, message, .. }) => Some((code.clone(), message.clone())),
            _ => None,
        }
    }

    /// Events from `from` on, and whether the stream has ended.
    pub fn events_from(&self, from: usize) -> (Vec<StreamEvent>, bool) {
        let state = self.state();
        let ended = state.events.last().is_some_and(|e| e.ends_stream());
        (state.events.get(from..).unwrap_or_default().to_vec(), ended)
    }

    /// Resolves when there may be events past `seen`.
    pub async fn changed_past(&self, seen: usize) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|n| *n > seen).await;
    }

    pub(super) fn push(&self, event: StreamEvent) {
        let mut state = self.state();
        if state.events.last().is_some_and(|e| e.ends_stream()) {
            return;
        }
        state.events.push(event);
        let n = state.events.len();
        drop(state);
        self.count.send_replace(n);
    }

    pub(super) fn fail(&self, code: &str, message: &str) {
        self.push(StreamEvent::Error {
            code: code.to_string(),
            message: message.to_string(),
            last_failure: None,
        });
    }
}

type HubKey = (OwnerId, String);

impl Inner {
    fn hubs(&self) -> MutexGuard<'_, std::collections::HashMap<HubKey, Arc<StreamHub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hub of the job `(owner, key)` names, made if there is none.
    pub(crate) fn stream_hub(&self, owner: &OwnerId, key: &str) -> Arc<StreamHub> {
        self.hubs()
            .entry((owner.clone(), key.to_string()))
            .or_default()
            .clone()
    }

    /// Whether a streaming client waits for the job `(owner, key)` names.
    pub(crate) fn has_hub(&self, owner: &OwnerId, key: &str) -> bool {
        self.hubs().contains_key(&(owner.clone(), key.to_string()))
    }

    /// Forget `hub` unless a driver took it.
    pub(crate) fn release_hub(&self, owner: &OwnerId, key: &str, hub: &Arc<StreamHub>) {
        let mut hubs = self.hubs();
        let k = (owner.clone(), key.to_string());
        if hubs
            .get(&k)
            .is_some_and(|h| Arc::ptr_eq(h, hub) && !h.is_driven())
        {
            hubs.remove(&k);
        }
    }

    /// Called as a driver takes `job`: the job runs streamed when a client
    /// waits on an open hub for it.
    pub(super) fn claim_hub(&self, job: &Job) -> Option<Arc<StreamHub>> {
        let hubs = self.hubs();
        let hub = hubs.get(&(job.owner_id.clone(), job.idempotency_key.clone()))?;
        if !hub.is_open() {
            return None;
        }
        hub.state().driven = true;
        Some(hub.clone())
    }
}

/// After the driver stopped: a hub still open gets the job's state as its
/// error (it failed, went to review, or waits on an unknown outcome), then
/// lingers for resuming clients.
pub(super) async fn close_after_drive(
    inner: &Arc<Inner>,
    job_id: &JobId,
    owner: &OwnerId,
    key: &str,
    hub: Arc<StreamHub>,
) {
    if hub.is_open() {
        let (code, message, last) = match inner.store.get_job(job_id).await {
            Ok(Some(now)) => {
                // A job failed (or sent to review) by a provider's refusal
                // keeps the provider's code (e.g. `content_policy`).
                let attempts = if Unanswered::reads_attempts(now.state) {
                    inner.store.list_attempts(job_id).await.unwrap_or_default()
                } else {
                    Vec::new()
                };
                // A job that succeeded with its stream still open (the
                // answer was not streamed here): a replay has it.
                let code = Unanswered::of(now.state, &attempts, now.last_error.as_deref())
                    .unwrap_or(Unanswered::Pending)
                    .code()
                    .to_string();
                let last = last_failure(&attempts).cloned();
                // A job that is finished (failed or cancelled) has no other
                // answer to come: nothing is said about replaying it.
                let finished = matches!(now.state, JobState::Failed | JobState::Cancelled);
                let message = format!(
                    "job {} is {}: {}{}",
                    now.id,
                    now.state.as_str(),
                    now.last_error.as_deref().unwrap_or("no result yet"),
                    if finished {
                        ""
                    } else {
                        "; replay this request with the same Idempotency-Key for its final answer"
                    }
                );
                (code, message, last)
            }
            _ => (
                "job_pending".to_string(),
                format!("job {job_id} is not finished; replay this request with the same Idempotency-Key"),
                None,
            ),
        };
        hub.push(StreamEvent::Error {
            code,
            message,
            last_failure: last,
        });
    }
    hub.state().driven = false;
    let linger = inner.clone();
    let key = (owner.clone(), key.to_string());
    inner.spawn(async move {
        tokio::time::sleep(HUB_LINGER).await;
        let mut hubs = linger.hubs();
        if hubs.get(&key).is_some_and(|h| Arc::ptr_eq(h, &hub)) {
            hubs.remove(&key);
        }
    });
}
