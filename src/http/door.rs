//! The front-door pipeline every dialect shares.
//!
//! A door (the jobs API, OpenAI Chat Completions, Anthropic Messages)
//! decodes its request into the domain's job request and hands it here;
//! this module runs the steps that are the same whatever the dialect —
//! the `Idempotency-Key`, admission by the limits, the one idempotent
//! submit and its counters, waiting for the job to settle — and gives
//! back the engine's canonical answer ([`Outcome`]) or its stream events
//! ([`Opened`]). The door encodes those, and its errors, in its own shape.
//! Nothing here knows a dialect, and no door imports another (the two
//! that answer in OpenAI's error shape share `http::openai_error`; where
//! two doors share a path, `GET /v1/models`, the router chooses by the
//! caller's dialect): adding one touches its own module and the router.

use super::error::ApiError;
use super::AppState;
use crate::config::IdempotencyMode;
use crate::domain::job::{last_failure, Unanswered};
use crate::domain::request::IdempotencyKey;
use crate::domain::{Attempt, AttemptId, ErrorKind, FinishReason, Job, JobState, OwnerId};
use crate::engine::stream::{StreamEvent, StreamHub};
use crate::engine::{Handed, Until};
pub use crate::jobs::JobBody;
use crate::jobs::{self, Intake, Submission};
use crate::keys::Caller;
use crate::metrics::Metrics;
use crate::providers::stream::Delta;
use crate::providers::Usage;
use crate::tenants::Admission;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The longest `Prefer: wait` honoured, in seconds.
pub const MAX_WAIT_SECS: u64 = 300;

/// How long a door that answers with the result (not a job) holds the
/// request when the client sends no `Prefer: wait`.
pub const DEFAULT_WAIT_SECS: u64 = 120;

/// The raw request body, with the size limit answered as a JSON 413.
pub struct LimitedBody(pub Bytes);

impl FromRequest<AppState> for LimitedBody {
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config.max_body_bytes;
        let timeout = state.config.body_read_timeout;
        // A client that trickles its body is cut off (slowloris).
        let read = tokio::time::timeout(timeout, Bytes::from_request(req, state))
            .await
            .map_err(|_| ApiError::RequestTimeout(timeout.as_millis() as u64))?;
        match read {
            Ok(bytes) => Ok(LimitedBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(limit))
            }
            Err(rejection) => Err(ApiError::MalformedJson(rejection.body_text())),
        }
    }
}

/// `Prefer: wait=N` (RFC 7240): hold the answer up to N seconds (at most
/// `MAX_WAIT_SECS`) for the job to reach a final state.
pub fn preferred_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .find_map(|pref| {
            pref.trim()
                .strip_prefix("wait=")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|n| n.min(MAX_WAIT_SECS))
}

/// The key a request runs under.
#[derive(Debug, Clone)]
pub struct DoorKey {
    pub key: IdempotencyKey,
    /// Made by onejob (`idempotency = "optional"` and the client sent
    /// none): the client's own retries are not protected.
    pub made_here: bool,
    /// Not the client's: echoed in the answer's `Idempotency-Key`, so the
    /// client can replay it (made here, or the body's fingerprint key).
    pub echoed: bool,
    /// `idempotency = "fingerprint"` and the client sent none: the key is
    /// the body's, known once the door has decoded it ([`Arrival::key_body`]).
    by_body: bool,
}

impl DoorKey {
    /// A key the client sent (or a job's own, for a call that makes none).
    pub fn client(key: IdempotencyKey) -> Self {
        DoorKey {
            key,
            made_here: false,
            echoed: false,
            by_body: false,
        }
    }
}

/// The client's `Idempotency-Key`, or when it sent none, by the server's
/// `idempotency` mode: a refusal, a placeholder for the body's fingerprint
/// key, or a fresh one made here.
pub fn door_key(state: &AppState, headers: &HeaderMap) -> Result<DoorKey, ApiError> {
    let made = |prefix: &str, made_here: bool, by_body: bool| {
        let made = format!("{prefix}{}", crate::domain::new_id());
        IdempotencyKey::parse(made.as_bytes())
            .map(|key| DoorKey {
                key,
                made_here,
                echoed: true,
                by_body,
            })
            .map_err(ApiError::InvalidIdempotencyKey)
    };
    let mut sent = headers.get_all("idempotency-key").iter();
    let first = sent.next();
    // Two keys on one request would name two jobs; taking either would
    // silently run the job the client did not mean on a retry.
    if let Some(first) = first {
        if sent.any(|other| other != first) {
            return Err(ApiError::InvalidIdempotencyKey(
                "Idempotency-Key was sent more than once with different values; send one".into(),
            ));
        }
    }
    match first {
        Some(raw) => IdempotencyKey::parse(raw.as_bytes())
            .map(DoorKey::client)
            .map_err(ApiError::InvalidIdempotencyKey),
        None => match state.config.idempotency {
            IdempotencyMode::Optional => made("onejob-made-", true, false),
            IdempotencyMode::Fingerprint => made("onejob-fp-pending-", false, true),
            IdempotencyMode::Required => Err(ApiError::MissingIdempotencyKey),
        },
    }
}

/// How far back a keyless request looks for its job still running: an
/// hour, in windows, at least one and at most 32 of them.
fn fingerprint_lookback(window_ms: i64) -> i64 {
    let window_ms = window_ms.max(1);
    ((3_600_000 + window_ms - 1) / window_ms).clamp(1, 32)
}

/// The key of a keyless request under `idempotency = "fingerprint"`: its
/// owner's (keys are per owner) for its canonical body, in the window its
/// job was created in. Windows are `fingerprint_window` long; the key of
/// an earlier window names the same intent while its job is younger than
/// one window, so a retry across a window's edge still finds its job, and
/// while that job has not finished (it may run longer than a window; an
/// SDK's retry of it is no new intent), as far back as
/// [`fingerprint_lookback`]. The newest such job wins.
async fn fingerprint_key(
    state: &AppState,
    owner: &OwnerId,
    job_body: &JobBody<'_>,
) -> Result<IdempotencyKey, ApiError> {
    let request = job_body.request().map_err(jobs::SubmitError::Request)?;
    let fingerprint = crate::domain::fingerprint::fingerprint(&request.to_value());
    let digest = fingerprint.get(..32).unwrap_or(&fingerprint);
    let window = state.config.fingerprint_window.as_millis().max(1) as i64;
    let now = state.clock.now_ms();
    let name = |bucket: i64| format!("onejob-fp-{digest}-{bucket}");
    let bucket = now / window;
    let earlier: Vec<String> = (1..=fingerprint_lookback(window))
        .map(|back| name(bucket - back))
        .collect();
    let key = match state.store.latest_job_by_keys(owner, &earlier).await? {
        Some(job) if job.created_at > now - window || !job.state.is_final() => job.idempotency_key,
        _ => name(bucket),
    };
    IdempotencyKey::parse(key.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)
}

/// A request let in at a door: who asks, under which key, admitted by the
/// request rate (before its body is decoded, so every request counts).
pub struct Arrival {
    pub caller: Caller,
    pub key: DoorKey,
    admission: Admission,
}

impl Arrival {
    /// Under `idempotency = "fingerprint"`, a keyless request's key is its
    /// body's: every door calls this with the job body it decoded, before
    /// the key is used (the submit, a stream's hub). Otherwise a no-op.
    pub async fn key_body(
        &mut self,
        state: &AppState,
        job_body: &JobBody<'_>,
    ) -> Result<(), ApiError> {
        if self.key.by_body {
            self.key.key = fingerprint_key(state, &self.caller.owner_id, job_body).await?;
            self.key.by_body = false;
        }
        Ok(())
    }
}

/// The key, then the caller's request-rate limit.
pub fn arrive(state: &AppState, caller: Caller, headers: &HeaderMap) -> Result<Arrival, ApiError> {
    let key = door_key(state, headers)?;
    let admission = state.tenants.admit(&caller)?;
    Ok(Arrival {
        caller,
        key,
        admission,
    })
}

/// The one submit every door makes, with its counters: `job_body` is the
/// job request the door decoded, or `POST /v1/jobs`'s body as it came.
pub async fn submit(
    state: &AppState,
    arrival: &Arrival,
    job_body: &JobBody<'_>,
) -> Result<Submission, ApiError> {
    if arrival.key.by_body {
        // A door that skipped `key_body` would run under the placeholder: a
        // fresh key, and no protection the client was promised.
        return Err(ApiError::Internal(anyhow::anyhow!(
            "a keyless request reached submit before its fingerprint key was made"
        )));
    }
    let intake = Intake {
        store: &state.store,
        clock: state.clock.as_ref(),
        routes: &state.config.routes,
        engine: state.engine.as_ref(),
        replays: &state.replays,
        contracts: &state.contracts,
    };
    let submitted = jobs::submit(
        intake,
        &arrival.caller,
        &arrival.key.key,
        job_body,
        &arrival.admission,
    )
    .await;
    let submission = match submitted {
        Ok(s) => s,
        Err(e) => {
            // The route, for the refusal's log line. Only a configured
            // route's name: whatever else a client wrote there (a key
            // pasted as the model) is never logged.
            if let Some(route) = job_body.route() {
                if state.config.routes.contains_key(&route) {
                    super::refusals::note_route(&route);
                }
            }
            if matches!(e, jobs::SubmitError::KeyReused { .. }) {
                Metrics::inc(&state.metrics.idempotency_conflicts);
            }
            return Err(e.into());
        }
    };
    Metrics::inc(if submission.replayed {
        &state.metrics.jobs_replayed
    } else {
        &state.metrics.jobs_created
    });
    if submission.from_memory {
        Metrics::inc(&state.metrics.replays_from_memory);
    }
    Ok(submission)
}

/// Hold a submitted job until it is final (or `wait` passes); a job that
/// settles here is remembered so its next replay is answered from memory.
/// When the commit that settled it handed its winner over, that is
/// `submission.winner` afterwards, and remembered with the job.
pub async fn wait_final(
    state: &AppState,
    submission: &mut Submission,
    wait: Duration,
    until: Until,
) -> Job {
    let job = submission.job.clone();
    let watch = submission.watch.take();
    if job.state.is_final() {
        return job;
    }
    match wait_until(state, &job.id, wait, watch, until).await {
        Some(Handed {
            job: settled,
            winner,
        }) => {
            let finished = &state.replays.finished;
            let digest = Some(submission.body_digest);
            match &winner {
                Some(won) => finished.remember_with_winner(&settled, digest, won),
                None => finished.remember(&settled, digest),
            }
            if winner.is_some() {
                submission.winner = winner;
            }
            settled
        }
        None => job,
    }
}

/// Hold until the job reaches what `until` names, at most `limit`: told
/// by this server's engine when it drives the job, else by reading the
/// job every [`POLL`] (another server drives it, or this one runs no
/// engine, `[engine] enabled = false`, and leaves its jobs to the others).
/// `None` when the job cannot be read.
async fn wait_until(
    state: &AppState,
    job_id: &crate::domain::JobId,
    limit: Duration,
    watch: Option<crate::engine::Watch>,
    until: Until,
) -> Option<Handed> {
    if let Some(engine) = &state.engine {
        return engine.wait_settled(job_id, limit, watch, until).await;
    }
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let job = state.store.get_job(job_id).await.ok().flatten()?;
        let now = tokio::time::Instant::now();
        if until.reached(&job) || now >= deadline {
            return Some(Handed { job, winner: None });
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// How often a wait without an engine reads its job.
const POLL: Duration = Duration::from_millis(250);

/// A job as a door answers it: its attempts and the one that won.
pub struct Settled {
    pub job: Job,
    pub attempts: Vec<Attempt>,
    pub replayed: bool,
}

impl Settled {
    pub fn winner(&self) -> Option<&Attempt> {
        self.attempts
            .iter()
            .find(|a| self.job.completed_by.as_deref() == Some(a.id.as_str()))
    }
}

/// Submit, hold until final, read the attempts: what a door that answers
/// with the result (not a job) needs.
pub async fn run(
    state: &AppState,
    arrival: &mut Arrival,
    job_body: &JobBody<'_>,
    headers: &HeaderMap,
) -> Result<Settled, ApiError> {
    arrival.key_body(state, job_body).await?;
    let mut submission = submit(state, arrival, job_body).await?;
    let wait = preferred_wait(headers)
        .unwrap_or(DEFAULT_WAIT_SECS)
        .min(MAX_WAIT_SECS);
    let job = wait_final(
        state,
        &mut submission,
        Duration::from_secs(wait),
        Until::Answer,
    )
    .await;
    let attempts = attempts_to_answer(state, &job, submission.winner.as_deref()).await?;
    Ok(Settled {
        job,
        attempts,
        replayed: submission.replayed,
    })
}

/// The attempts a door answers a settled job with: for a succeeded job the
/// winner alone does (its provider, id and usage), and the replay memory
/// may hold it, read once by the first answer; otherwise the job's attempts
/// as stored (a refusal explains itself by the last failed one).
async fn attempts_to_answer(
    state: &AppState,
    job: &Job,
    remembered: Option<&Attempt>,
) -> Result<Vec<Attempt>, ApiError> {
    let succeeded = job.state == JobState::Succeeded;
    if let Some(winner) =
        remembered.filter(|w| succeeded && job.completed_by.as_deref() == Some(w.id.as_str()))
    {
        return Ok(vec![winner.clone()]);
    }
    let attempts = state.store.list_attempts(&job.id).await?;
    if succeeded {
        if let Some(winner) = attempts
            .iter()
            .find(|a| job.completed_by.as_deref() == Some(a.id.as_str()))
        {
            state.replays.finished.remember_winner(job, winner);
        }
    }
    Ok(attempts)
}

/// The model that answered: the model the winning attempt's provider asks
/// for (the route's name when no attempt won, e.g. a result set by an admin).
pub fn answering_model(state: &AppState, job: &Job, winner: Option<&Attempt>) -> String {
    winner
        .and_then(|w| state.providers.get(&w.provider))
        .map(|p| p.config.model.clone())
        .unwrap_or_else(|| job.route.clone())
}

/// The engine's answer, whatever door asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The assistant's text; `None` for a tool-call turn without text.
    pub text: Option<String>,
    /// OpenAI-shaped `{"id","type":"function","function":{"name","arguments"}}`.
    pub tool_calls: Vec<Value>,
    pub usage: Usage,
    /// The model that answered (never the route).
    pub model: String,
    /// Why the provider stopped: the winner's, or, when it kept none (an
    /// attempt recorded before it was kept, an admin's answer), by the
    /// answer ([`FinishReason::told`]).
    pub finish: FinishReason,
}

/// Why a job has no answer for the client, whatever door asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Still running after the wait; the same request picks it up again.
    Pending,
    Cancelled,
    ContextLengthExceeded,
    ContentPolicy,
    RateLimited,
    /// Output broke the request's `response_format`.
    ContractViolation,
    /// The provider refused the request as malformed (its kind kept).
    BadRequest(ErrorKind),
    /// Waiting for a human, or for its provider's record of an attempt
    /// whose outcome is unknown: it may still end with an answer, which a
    /// replay with the same key gets. (One a provider's refusal sent to
    /// review, e.g. rate-limited until its retries ran out, is told as
    /// that refusal.)
    NeedsReview,
    /// Failed otherwise (the provider's kind, when one is known).
    Failed(Option<ErrorKind>),
}

impl Refusal {
    /// How the kind of an attempt's failure is told to a client, by every
    /// door and in every stream: the provider's refusals
    /// ([`ErrorKind::is_refusal`]) by class, any other kind kept as it is.
    pub fn of_kind(kind: &ErrorKind) -> Refusal {
        match kind {
            ErrorKind::ContextLengthExceeded => Refusal::ContextLengthExceeded,
            ErrorKind::ContentPolicy => Refusal::ContentPolicy,
            ErrorKind::RateLimited | ErrorKind::QuotaExceeded => Refusal::RateLimited,
            ErrorKind::ContractViolation => Refusal::ContractViolation,
            // The request itself: a provider refused it, or it could be
            // made into no provider's (`invalid_request`).
            ErrorKind::BadRequest
            | ErrorKind::Unprocessable
            | ErrorKind::InvalidPrompt
            | ErrorKind::InvalidRequest => Refusal::BadRequest(kind.clone()),
            other => Refusal::Failed(Some(other.clone())),
        }
    }

    /// The refusal of a stream's error `code`: a provider's kind by
    /// [`Refusal::of_kind`]; any other code (`stream_cut`, `job_failed`, …)
    /// is a failure that keeps it.
    pub fn of_stream_code(code: &str) -> Refusal {
        Refusal::of_kind(&ErrorKind::parse(code))
    }
}

/// A refusal and the message that explains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub why: Refusal,
    pub message: String,
    /// Whether the client is told it may send the same request again
    /// (`x-should-retry: true`): the job is pending or in review, so it may
    /// still answer it, whatever its refusal says (a job rate-limited into
    /// review as much as one overloaded into it), and the key is the
    /// client's (one made here cannot be sent again). A finished job
    /// answers every replay the same.
    pub client_may_retry: bool,
}

/// A settled job as the engine's answer, or why there is none.
pub fn outcome(
    state: &AppState,
    settled: &Settled,
    key_made_here: bool,
) -> Result<Answer, Refused> {
    let job = &settled.job;
    if let Some(unanswered) =
        Unanswered::of(job.state, &settled.attempts, job.last_error.as_deref())
    {
        return Err(refusal(job, unanswered, key_made_here));
    }
    let winner = settled.winner();
    Ok(answer_of(state, job, winner))
}

/// A settled job's answer through a door: the door encodes the answer
/// (`answered`) or the refusal (`refused`) in its dialect, and every door's
/// job headers are added here, once.
pub fn respond(
    state: &AppState,
    settled: &Settled,
    key: &DoorKey,
    answered: impl FnOnce(&Job, Answer) -> Response,
    refused: impl FnOnce(Refused) -> Response,
) -> Result<Response, ApiError> {
    let mut response = match outcome(state, settled, key.made_here) {
        Ok(answer) => answered(&settled.job, answer),
        Err(refusal) => refused(refusal),
    };
    let winner = settled
        .winner()
        .map(|w| (w.provider.as_str(), w.id.as_str()));
    job_headers(
        response.headers_mut(),
        &settled.job,
        winner,
        key,
        settled.replayed,
    )?;
    Ok(response)
}

/// A job's result as the assistant's text (`None` for a tool-call turn
/// without text) and its OpenAI-shaped tool calls.
pub fn result_parts(job: &Job) -> (Option<String>, Vec<Value>) {
    let result: Value = job
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    match result {
        Value::String(text) => (Some(text), Vec::new()),
        Value::Object(mut turn) if turn.contains_key("tool_calls") => (
            turn.remove("content")
                .and_then(|c| c.as_str().map(str::to_string)),
            match turn.remove("tool_calls") {
                Some(Value::Array(calls)) => calls,
                _ => Vec::new(),
            },
        ),
        // A contract job's result is its validated JSON.
        other => (Some(other.to_string()), Vec::new()),
    }
}

fn answer_of(state: &AppState, job: &Job, winner: Option<&Attempt>) -> Answer {
    let usage = winner
        .and_then(|w| w.usage.as_deref())
        .and_then(|u| serde_json::from_str::<Usage>(u).ok())
        .unwrap_or_default();
    let (text, tool_calls) = result_parts(job);
    let finish = FinishReason::told(
        winner.and_then(|w| w.finish_reason.as_ref()),
        !tool_calls.is_empty(),
    );
    Answer {
        text,
        tool_calls,
        usage,
        model: answering_model(state, job, winner),
        finish,
    }
}

/// A job that did not succeed ([`Unanswered`]), classified once for every
/// door: a provider's refusal kept, the message naming the job.
fn refusal(job: &Job, unanswered: Unanswered, key_made_here: bool) -> Refused {
    let detail = job.last_error.as_deref().unwrap_or("no result");
    let message = format!("job {} is {}: {detail}", job.id, job.state.as_str());
    let client_may_retry = !job.state.is_final() && !key_made_here;
    let in_review = |why| Refused {
        why,
        message: format!(
            "{message}; it may still be settled (its provider's record of an attempt, \
             or an admin): replay this request with the same Idempotency-Key, or GET /v1/jobs/{}",
            job.id
        ),
        client_may_retry,
    };
    let why = match unanswered {
        Unanswered::Pending => {
            return Refused {
                why: Refusal::Pending,
                message: format!(
                    "job {} is still {}; replay this request with the same Idempotency-Key, or GET /v1/jobs/{}",
                    job.id,
                    job.state.as_str(),
                    job.id
                ),
                client_may_retry,
            }
        }
        Unanswered::Cancelled => Refusal::Cancelled,
        Unanswered::NeedsReview(Some(kind)) => return in_review(Refusal::of_kind(&kind)),
        Unanswered::NeedsReview(None) => return in_review(Refusal::NeedsReview),
        Unanswered::Failed(Some(kind)) => Refusal::of_kind(&kind),
        Unanswered::Failed(None) => Refusal::Failed(None),
    };
    Refused {
        why,
        message,
        client_may_retry,
    }
}

/// The headers every door sends with a job's answer: which job and which
/// attempt (and its provider) answered, the key made here, a replay.
pub fn job_headers(
    headers: &mut HeaderMap,
    job: &Job,
    answered_by: Option<(&str, &str)>,
    key: &DoorKey,
    replayed: bool,
) -> Result<(), ApiError> {
    let value = |s: &str| HeaderValue::from_str(s).map_err(|e| ApiError::Internal(e.into()));
    headers.insert("x-onejob-job-id", value(&job.id)?);
    if let Some((provider, attempt_id)) = answered_by {
        headers.insert("x-onejob-provider", value(provider)?);
        headers.insert("x-onejob-attempt", value(attempt_id)?);
    }
    if key.echoed {
        headers.insert("idempotency-key", value(key.key.as_str())?);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(())
}

/// Where a streamed answer's events come from.
pub enum Events {
    /// The job is driven streamed here: its events as they happen.
    Live(Arc<StreamHub>),
    /// The job finished (or is driven elsewhere): its stored answer, as the
    /// events a stream would have had.
    Stored(Vec<StreamEvent>),
}

/// A streamed request, submitted: its job and its events.
pub struct Opened {
    pub job: Job,
    pub replayed: bool,
    pub events: Events,
    /// The first event (an attempt's `Start` names the provider and
    /// attempt for the headers).
    pub first: Option<StreamEvent>,
}

impl Opened {
    /// The provider and attempt that own the stream, for the headers.
    pub fn answered_by(&self) -> Option<(&str, &str)> {
        match &self.first {
            Some(StreamEvent::Start {
                provider,
                attempt_id,
                ..
            }) => Some((provider.as_str(), attempt_id.as_str())),
            _ => None,
        }
    }
}

/// Submit a streamed request. When this process drives the job streamed,
/// its hub's events (headers wait for the first, so they can name the
/// provider that owns the stream); otherwise the stored answer once the
/// job is final.
pub async fn open_stream(
    state: &AppState,
    arrival: &mut Arrival,
    job_body: &JobBody<'_>,
    headers: &HeaderMap,
) -> Result<Opened, ApiError> {
    arrival.key_body(state, job_body).await?;
    let (owner, key) = (&arrival.caller.owner_id, arrival.key.key.as_str());
    let hub = state.engine.as_ref().map(|e| e.stream_hub(owner, key));
    let submitted = submit(state, arrival, job_body).await;
    // A hub no driver here took (the job is finished, or driven unstreamed
    // or elsewhere) is of no use: the stored answer is streamed instead.
    // Nor is one whose stream ended in an error: the job went on, and the
    // replay waits for its final answer.
    let hub = match (hub, &state.engine) {
        (Some(hub), Some(engine)) if !hub.is_driven() => {
            engine.release_hub(owner, key, &hub);
            None
        }
        (Some(hub), _) if hub.ended_in_error() => None,
        (hub, _) => hub,
    };
    let mut submission = submitted?;
    if let Some(hub) = hub {
        hub.changed_past(0).await;
        let first = hub.events_from(0).0.into_iter().next();
        return Ok(Opened {
            job: submission.job,
            replayed: submission.replayed,
            events: Events::Live(hub),
            first,
        });
    }
    let wait = preferred_wait(headers)
        .unwrap_or(DEFAULT_WAIT_SECS)
        .min(MAX_WAIT_SECS);
    let watch = submission.watch.take();
    let waited = wait_until(
        state,
        &submission.job.id,
        Duration::from_secs(wait),
        watch,
        Until::Answer,
    )
    .await;
    let (job, winner) = match waited {
        Some(Handed { job, winner }) => (job, winner.or(submission.winner)),
        None => (submission.job, submission.winner),
    };
    // The winner answers a succeeded job; a failed one (or one in review)
    // is told by its last failed attempt's kind ([`Unanswered`]).
    let attempts = if job.state == JobState::Succeeded || Unanswered::reads_attempts(job.state) {
        attempts_to_answer(state, &job, winner.as_deref()).await?
    } else {
        Vec::new()
    };
    let settled = Settled {
        job,
        attempts,
        replayed: submission.replayed,
    };
    let events = stored_events(state, &settled);
    Ok(Opened {
        first: events.first().cloned(),
        job: settled.job,
        replayed: settled.replayed,
        events: Events::Stored(events),
    })
}

/// A job that exists already, streamed again by id (no submit): its
/// stored answer once it is final, or what it is after the wait. Always
/// the stored answer, so the events are the same on every reading.
pub async fn open_existing(
    state: &AppState,
    job: Job,
    headers: &HeaderMap,
) -> Result<Opened, ApiError> {
    let wait = preferred_wait(headers)
        .unwrap_or(DEFAULT_WAIT_SECS)
        .min(MAX_WAIT_SECS);
    let job = if job.state.is_final() {
        job
    } else {
        wait_until(
            state,
            &job.id,
            Duration::from_secs(wait),
            None,
            Until::Answer,
        )
        .await
        .map_or(job, |handed| handed.job)
    };
    // The winner answers a succeeded job; a failed one (or one in review)
    // is told by its last failed attempt's kind ([`Unanswered`]).
    let attempts = if job.state == JobState::Succeeded || Unanswered::reads_attempts(job.state) {
        attempts_to_answer(state, &job, None).await?
    } else {
        Vec::new()
    };
    let settled = Settled {
        job,
        attempts,
        replayed: false,
    };
    let events = stored_events(state, &settled);
    Ok(Opened {
        first: events.first().cloned(),
        job: settled.job,
        replayed: false,
        events: Events::Stored(events),
    })
}

/// The events of a finished (or failed) job, as a stream would have had them.
fn stored_events(state: &AppState, settled: &Settled) -> Vec<StreamEvent> {
    let job = &settled.job;
    if let Some(unanswered) =
        Unanswered::of(job.state, &settled.attempts, job.last_error.as_deref())
    {
        // Said as its answer says it: a finished job (failed, cancelled)
        // never gets a result; one pending or in review may, and the
        // message says how to ask again.
        let code = unanswered.code().to_string();
        let message = refusal(job, unanswered, false).message;
        let last_failure = last_failure(&settled.attempts).cloned();
        return vec![StreamEvent::Error {
            code,
            message,
            last_failure,
        }];
    }
    let winner = settled.winner();
    let answer = answer_of(state, job, winner);
    let model = answer.model;
    let mut events = vec![StreamEvent::Start {
        model: model.clone(),
        provider: winner.map(|a| a.provider.clone()).unwrap_or_default(),
        // No winner (an admin's answer): an empty id, as the stream has always said.
        attempt_id: winner.map_or_else(|| AttemptId::from(""), |a| a.id.clone()),
    }];
    if let Some(text) = answer.text.filter(|t| !t.is_empty()) {
        events.push(StreamEvent::Piece {
            model: model.clone(),
            delta: Delta::text(text),
        });
    }
    for (index, call) in answer.tool_calls.into_iter().enumerate() {
        let mut piece = call;
        piece["index"] = json!(index);
        events.push(StreamEvent::Piece {
            model: model.clone(),
            delta: Delta {
                content: String::new(),
                tool_calls: vec![piece],
            },
        });
    }
    let usage = winner
        .and_then(|a| a.usage.as_deref())
        .and_then(|u| serde_json::from_str::<Usage>(u).ok());
    events.push(StreamEvent::Finish {
        model,
        finish_reason: answer.finish,
        usage,
    });
    events
}

/// A dialect's stream encoding: each event as the frames its clients read.
pub trait StreamEncoder: Send + 'static {
    fn encode(&mut self, event: &StreamEvent) -> String;
}

/// The response body of a stream: the events, encoded, until it ends.
fn sse_body(events: Events, mut encoder: impl StreamEncoder) -> Body {
    let hub = match events {
        Events::Stored(events) => {
            let text: String = events.iter().map(|e| encoder.encode(e)).collect();
            return Body::from(text);
        }
        Events::Live(hub) => hub,
    };
    // The hub's events from the start (the encoder skips what the client
    // has), buffered then live.
    let frames = futures::stream::unfold(
        (hub, encoder, 0usize, false),
        |(hub, mut encoder, next, done)| async move {
            if done {
                return None;
            }
            loop {
                let (events, ended) = hub.events_from(next);
                if !events.is_empty() {
                    let text: String = events.iter().map(|e| encoder.encode(e)).collect();
                    let next = next + events.len();
                    let done = ended && hub.events_from(next).0.is_empty();
                    return Some((
                        Ok::<_, std::io::Error>(Bytes::from(text)),
                        (hub, encoder, next, done),
                    ));
                }
                if ended {
                    return None;
                }
                hub.changed_past(next).await;
            }
        },
    );
    Body::from_stream(frames)
}

/// A `200 text/event-stream` response with the job's headers, its body
/// the events as `encoder` writes them.
pub fn stream_response(
    opened: Opened,
    key: &DoorKey,
    encoder: impl StreamEncoder,
) -> Result<Response, ApiError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    job_headers(
        &mut headers,
        &opened.job,
        opened.answered_by(),
        key,
        opened.replayed,
    )?;
    let mut response = Response::new(sse_body(opened.events, encoder));
    *response.status_mut() = StatusCode::OK;
    *response.headers_mut() = headers;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_refused_by_class_exactly_when_it_is_a_refusal() {
        let mut kinds = crate::domain::error_kind::NAMED.to_vec();
        kinds.push(ErrorKind::parse("a_providers_own_code"));
        for kind in kinds {
            let by_class = !matches!(Refusal::of_kind(&kind), Refusal::Failed(_));
            assert_eq!(by_class, kind.is_refusal(), "{kind}");
        }
    }
}
