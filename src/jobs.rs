//! Accepting and reading jobs: the logic behind `POST /v1/jobs` and friends.
//! Handlers extract and answer; this module decides, and reads an admin's
//! decision on a job in review or an unknown attempt (for the API, the
//! console and the CLI alike).

use crate::clock::Clock;
use crate::config::RouteConfig;
use crate::contracts::render::WireFormat;
use crate::contracts::Contract;
use crate::domain::fingerprint::{canonical_json, fingerprint_of_canonical};
use crate::domain::job::NewJob;
use crate::domain::request::IdempotencyKey;
use crate::domain::{Attempt, Job, JobId, JobRequest, OwnerId, RequestError};
use crate::engine::{Engine, Watch};
use crate::keys::Caller;
use crate::replays::{body_digest, Replays};
use crate::store::{
    event, AttemptResolution, CreateOutcome, JobResolution, NewEvent, Store, StoreError,
};
use crate::tenants::{check_new_job, Admission, CheckError, LimitError};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A job as the submitter sees it after `submit`.
#[derive(Debug)]
pub struct Submission {
    pub job: Job,
    /// True when the job existed already (a replay of the same intent).
    pub replayed: bool,
    /// The body's digest ([`JobBody`]), which matched the job's fingerprint.
    pub body_digest: [u8; 32],
    /// True when a replay was answered without reading the database.
    pub from_memory: bool,
    /// The attempt that won the job, when the replay memory holds it (or,
    /// after [`Engine::wait_settled`], when the commit that settled it
    /// handed it over).
    pub winner: Option<Arc<Attempt>>,
    /// For a job created here: the engine's waiter for it, registered
    /// before the job was handed to the engine, so that however soon it
    /// settles, its commit hands it (and its winner) over.
    pub watch: Option<Watch>,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("Idempotency-Key {key:?} was already used with a different request (job {job_id})")]
    KeyReused { key: String, job_id: JobId },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Refused by the owner's concurrent-jobs limit or token budget; nothing written.
    #[error(transparent)]
    Limited(#[from] LimitError),
}

impl From<CheckError> for SubmitError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Limited(l) => SubmitError::Limited(l),
            CheckError::Store(s) => SubmitError::Store(s),
        }
    }
}

/// A job request as a door hands it to [`submit`].
pub enum JobBody<'a> {
    /// The bytes of a job request (`POST /v1/jobs`'s body shape), parsed
    /// only when the replay memory does not answer them.
    Bytes(&'a [u8]),
    /// A request a dialect door decoded from its own body, with that body's
    /// digest ([`JobBody::decoded`]): nothing is encoded to be parsed again.
    Decoded {
        request: Box<JobRequest>,
        digest: [u8; 32],
    },
}

impl<'a> JobBody<'a> {
    /// A request `door` decoded from `raw`. Its digest is that of the door's
    /// name and the raw bytes: the same bytes at the same door decode to
    /// the same request, so the replay memory may answer them unread, and
    /// no other door's body (nor the job's own shape) shares it.
    pub fn decoded(door: &str, raw: &[u8], request: JobRequest) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(door.as_bytes());
        hasher.update([0]);
        hasher.update(raw);
        JobBody::Decoded {
            request: Box::new(request),
            digest: hasher.finalize().into(),
        }
    }

    fn digest(&self) -> [u8; 32] {
        match self {
            JobBody::Bytes(body) => body_digest(body),
            JobBody::Decoded { digest, .. } => *digest,
        }
    }

    /// The request, parsed and validated.
    pub fn request(&self) -> Result<Cow<'_, JobRequest>, RequestError> {
        match self {
            JobBody::Bytes(body) => {
                let request = JobRequest::parse(body)?;
                // What the other doors keep of their requests is theirs to
                // write: sent to `/v1/jobs`, it would make a job look like
                // one of theirs (a Response, say).
                if request.door.is_some() {
                    return Err(RequestError::Invalid(
                        "door: unknown field (written by onejob's other doors only)".to_string(),
                    ));
                }
                Ok(Cow::Owned(request))
            }
            JobBody::Decoded { request, .. } => {
                request.validate()?;
                Ok(Cow::Borrowed(&**request))
            }
        }
    }

    /// The route it names, if it names one (read again from bytes only for
    /// a refusal's log line).
    pub fn route(&self) -> Option<String> {
        match self {
            JobBody::Bytes(body) => {
                #[derive(serde::Deserialize)]
                struct Routed {
                    route: Option<String>,
                }
                let Routed { route } = serde_json::from_slice(body).ok()?;
                Some(route.unwrap_or_else(|| "default".to_string()))
            }
            JobBody::Decoded { request, .. } => Some(request.route.clone()),
        }
    }
}

/// What accepting a job needs of the server: its store, clock, routes,
/// engine (`None` when this server only stores jobs) and replay memory.
/// Every front door submits through one of these.
#[derive(Clone, Copy)]
pub struct Intake<'a> {
    pub store: &'a Arc<dyn Store>,
    pub clock: &'a dyn Clock,
    pub routes: &'a BTreeMap<String, RouteConfig>,
    pub engine: Option<&'a Engine>,
    pub replays: &'a Replays,
    /// The contracts this server loaded: a new job must name one of them
    /// and give every variable its template uses.
    pub contracts: &'a BTreeMap<String, Contract>,
}

/// Why a job naming a contract could never run here, if it could not: the
/// contract is not one this server loaded, or its template cannot be
/// rendered with the job's `input` (a variable missing, say). Caught at the
/// door, it is a `422` and nothing is written; the job's plan checks the
/// same again when it runs.
fn contract_problem(
    contracts: &BTreeMap<String, Contract>,
    request: &JobRequest,
) -> Option<String> {
    let name = request.contract.as_deref()?;
    let Some(contract) = contracts.get(name) else {
        let known: Vec<&str> = contracts.keys().map(String::as_str).collect();
        return Some(format!(
            "contract: unknown contract {name:?}; this server has: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    let input = request.input.as_ref()?;
    contract
        .render(input, WireFormat::OpenAi)
        .err()
        .map(|e| format!("input: contract {name}: {e}"))
}

/// Create the job for (caller, key), or return the one that exists.
///
/// Invariants 1 and 2: the database's UNIQUE constraint decides who creates;
/// the same key with another fingerprint is a conflict and changes nothing.
/// A replay of a job that can no longer change is answered from memory
/// (`replays`), its audit event batched; any other is the create's
/// conflict. A replay is answered whatever the limits; a new job must fit
/// the owner's concurrent-jobs limit and token budget (`admission`),
/// checked before anything is written or any provider called.
#[tracing::instrument(skip_all, fields(owner = %caller.owner_id))]
pub async fn submit(
    intake: Intake<'_>,
    caller: &Caller,
    key: &IdempotencyKey,
    body: &JobBody<'_>,
    admission: &Admission,
) -> Result<Submission, SubmitError> {
    let Intake {
        store,
        clock,
        routes,
        engine,
        replays,
        contracts,
    } = intake;
    // A replay of a job that can no longer change, with the very bytes that
    // matched it before: answered from memory, nothing parsed or read.
    let digest = body.digest();
    let remembered = replays.finished.get(&caller.owner_id, key.as_str());
    if let Some(hit) = &remembered {
        if hit.same_body(&digest) {
            replays
                .audit
                .record(&hit.job.id, &caller.owner_id, clock.now_ms());
            return Ok(Submission {
                job: Job::clone(&hit.job),
                replayed: true,
                body_digest: digest,
                from_memory: true,
                winner: hit.winner.clone(),
                watch: None,
            });
        }
    }
    let request = body.request()?;
    let normalised = request.to_value();
    let stored_request = canonical_json(&normalised);
    let fingerprint = fingerprint_of_canonical(&stored_request);

    // Nothing is read before the create: the UNIQUE constraint says whether
    // the key exists (invariant 1), and a create that meets it returns the
    // job that holds it. A new job, the common case, is one write and no
    // read; a replay that memory does not hold is that write's conflict.
    let replay = Replay {
        store: store.as_ref(),
        clock,
        caller,
        key,
        fingerprint: &fingerprint,
        digest,
        replays,
        from_memory: remembered.is_some(),
    };
    if let Some(hit) = remembered {
        // The same job under another body (reordered keys, another payload).
        return replay.answer(Job::clone(&hit.job)).await;
    }
    let Some(route) = routes.get(&request.route) else {
        // Refused as a new job: the key may still name a job made while
        // the route was configured (before a restart that removed it, or
        // on a server of a rolling deploy that has it), whose replay is
        // answered like any other.
        if let Some(job) = store
            .find_job_by_key(&caller.owner_id, key.as_str())
            .await?
        {
            return replay.answer(job).await;
        }
        let known: Vec<&str> = routes.keys().map(String::as_str).collect();
        return Err(RequestError::Invalid(format!(
            "route: unknown route {:?}; this server has: {}",
            request.route,
            known.join(", ")
        ))
        .into());
    };
    if let Some(problem) = contract_problem(contracts, &request) {
        // Refused as a new job, as a limit refuses one: the key may still
        // name a job that exists (made where the contract was loaded).
        if let Some(job) = store
            .find_job_by_key(&caller.owner_id, key.as_str())
            .await?
        {
            return replay.answer(job).await;
        }
        return Err(RequestError::Invalid(problem).into());
    }
    let now = clock.now_ms();
    if let Err(refused) =
        check_new_job(store.as_ref(), now, admission, request.params.max_tokens).await
    {
        // A replay is answered whatever the limits: refused as a new job,
        // the key may still name one that exists.
        if matches!(refused, CheckError::Limited(_)) {
            if let Some(job) = store
                .find_job_by_key(&caller.owner_id, key.as_str())
                .await?
            {
                return replay.answer(job).await;
            }
        }
        return Err(refused.into());
    }
    let id = JobId::new();
    // Created, claimed and its primary attempt started in one commit where
    // the route allows: this process drives it at once.
    let prestart = engine.and_then(|e| {
        e.prestart(
            &id,
            &caller.owner_id,
            key.as_str(),
            (&request, &stored_request),
            route,
            now,
        )
    });
    let new = NewJob {
        id,
        owner_id: caller.owner_id.clone(),
        idempotency_key: key.as_str().to_string(),
        fingerprint: fingerprint.clone(),
        request: stored_request,
        route: request.route.clone(),
        created_at: now,
        lease: engine.map(|e| e.lease_for_new_job(route, now)),
        key_id: Some(caller.key_family.clone()),
        primary: prestart.as_ref().map(|p| p.attempt().clone()),
    };
    let watch = engine.map(|e| e.watch(&new.id));
    // The job is committed with this process's lease: whoever commits it
    // must hand it to the engine, even if the client goes away meanwhile.
    let created = run_to_completion({
        let store = store.clone();
        let engine = engine.cloned();
        async move {
            let (id, owner, key) = (
                new.id.clone(),
                new.owner_id.clone(),
                new.idempotency_key.clone(),
            );
            let outcome = match store.create_job(new).await {
                Ok(outcome) => outcome,
                Err(e) if e.is_transient() => read_back_created(store.as_ref(), &id, &owner, &key)
                    .await
                    .map(CreateOutcome::Created)
                    .ok_or(e)?,
                Err(e) => return Err(e),
            };
            // A job read back with this request's id was committed by this
            // create, with its primary attempt if it had one.
            if let (CreateOutcome::Created(job), Some(engine)) = (&outcome, engine) {
                engine.adopt(job.clone(), prestart);
            }
            Ok::<_, StoreError>(outcome)
        }
    })
    .await?;
    match created {
        CreateOutcome::Created(job) => Ok(Submission {
            job,
            replayed: false,
            body_digest: digest,
            from_memory: false,
            winner: None,
            watch,
        }),
        CreateOutcome::Existing(job) => replay.answer(job).await,
    }
}

/// Run `work` — a commit and what must follow it — to its end even if the
/// caller stops waiting. axum drops a handler's future when its client
/// disconnects, and a dropped future stops at whatever `.await` it was at:
/// a job committed with this process's lease but never handed to the
/// engine would wait out its lease. The work runs as its own task, in the
/// caller's span (so a job adopted there continues the request's trace);
/// the caller only waits for its answer.
pub async fn run_to_completion<T, F>(work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let work = tracing::Instrument::instrument(Box::pin(work), tracing::Span::current());
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: only when the runtime shuts down.
        Err(_) => Err(StoreError::Closed),
    }
}

/// Read-back tries after a create whose answer was an error: 20 ms, then
/// doubling (about 0.6 s in all), within what a client waits for a `201`.
const READ_BACK_TRIES: u32 = 5;

/// A create that failed transiently may have committed with only its
/// acknowledgement lost; the job is then leased to this process and nobody
/// else takes it before the lease runs out. Read it back by key: found with
/// the id this request made, it is this request's job, created — answered
/// `201` and driven now. Not found (or the database still down): the error
/// stands; the client retries, and a job that did commit is picked up by
/// the next holder of its lease.
async fn read_back_created(
    store: &dyn Store,
    id: &JobId,
    owner: &OwnerId,
    key: &str,
) -> Option<Job> {
    let mut delay = Duration::from_millis(20);
    for _ in 0..READ_BACK_TRIES {
        match store.find_job_by_key(owner, key).await {
            Ok(Some(job)) if job.id == *id => {
                tracing::warn!(job_id = %job.id, "create's acknowledgement was lost; the job was committed and is driven now");
                return Some(job);
            }
            Ok(_) => return None,
            Err(e) if e.is_transient() => tokio::time::sleep(delay).await,
            Err(_) => return None,
        }
        delay *= 2;
    }
    None
}

/// What answering an existing job needs.
struct Replay<'a> {
    store: &'a dyn Store,
    clock: &'a dyn Clock,
    caller: &'a Caller,
    key: &'a IdempotencyKey,
    fingerprint: &'a str,
    digest: [u8; 32],
    replays: &'a Replays,
    from_memory: bool,
}

impl Replay<'_> {
    /// The same fingerprint is a replay (counted for the audit trail, and
    /// remembered with this body when the job can no longer change); another
    /// is a conflict, recorded before the answer.
    async fn answer(&self, job: Job) -> Result<Submission, SubmitError> {
        if job.fingerprint == self.fingerprint {
            self.replays
                .audit
                .record(&job.id, &self.caller.owner_id, self.clock.now_ms());
            self.replays.finished.remember(&job, Some(self.digest));
            return Ok(Submission {
                job,
                replayed: true,
                body_digest: self.digest,
                from_memory: self.from_memory,
                winner: None,
                watch: None,
            });
        }
        let detail = serde_json::json!({ "fingerprint": self.fingerprint }).to_string();
        self.store
            .record_event(NewEvent {
                job_id: job.id.clone(),
                attempt_id: None,
                kind: event::CONFLICT,
                actor: self.caller.owner_id.to_string(),
                detail: Some(detail),
                at: self.clock.now_ms(),
            })
            .await?;
        Err(SubmitError::KeyReused {
            key: self.key.as_str().to_string(),
            job_id: job.id,
        })
    }
}

/// The caller's job, or `None` when it does not exist or belongs to another
/// owner (the two are indistinguishable from outside).
pub async fn find_for(
    store: &dyn Store,
    caller: &Caller,
    id: &JobId,
) -> Result<Option<Job>, StoreError> {
    Ok(store
        .get_job(id)
        .await?
        .filter(|job| job.owner_id == caller.owner_id))
}

/// Why an admin's decision on a job in review, or on an unknown attempt,
/// was refused: its words, whatever surface (API, console, CLI) they came
/// through. The text names the API's fields; the CLI puts `--` in front.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    #[error("action: {0:?} is not complete, retry or close")]
    UnknownAction(String),
    #[error("outcome: {0:?} is not executed or not_executed")]
    UnknownOutcome(String),
    /// `complete` and `executed` need the result (`"action complete"`).
    #[error("result: required with {0}")]
    ResultRequired(&'static str),
    /// Every other choice takes none.
    #[error("result: only allowed with {0}")]
    ResultNotAllowed(&'static str),
}

/// An admin's decision on a job: `complete` with `result` (JSON text),
/// `retry` (a fresh retry budget) or `close`.
pub fn job_resolution(
    action: &str,
    result: Option<String>,
) -> Result<JobResolution, DecisionError> {
    const WITH: &str = "action complete";
    match (action, result) {
        ("complete", Some(result)) => Ok(JobResolution::Complete { result }),
        ("complete", None) => Err(DecisionError::ResultRequired(WITH)),
        ("retry" | "close", Some(_)) => Err(DecisionError::ResultNotAllowed(WITH)),
        ("retry", None) => Ok(JobResolution::Retry),
        ("close", None) => Ok(JobResolution::Close),
        (other, _) => Err(DecisionError::UnknownAction(other.to_string())),
    }
}

/// `resolution` as the store should record it: an admin's `complete` of
/// job `job_id` has its result held to what an answer of that job is held
/// to ([`crate::engine::plan::JobPlan::admins_result`]), so output that
/// breaks the job's schema or contract is never its result, whoever typed
/// it. The API, the console and the CLI call this before they resolve.
pub async fn checked_resolution(
    store: &dyn Store,
    contracts: &Arc<BTreeMap<String, Contract>>,
    job_id: &JobId,
    resolution: JobResolution,
) -> Result<JobResolution, ResolutionError> {
    let JobResolution::Complete { result } = &resolution else {
        return Ok(resolution);
    };
    // No such job: the store's refusal says so.
    let Some(job) = store.get_job(job_id).await? else {
        return Ok(resolution);
    };
    let result = admins_result(&job, contracts, result)?;
    Ok(JobResolution::Complete { result })
}

/// `resolution` as the store should record it: an admin's word that an
/// unknown attempt `executed`, with the provider's result, makes that
/// result the job's when the attempt wins, so it is held to the job's
/// schema or contract as [`checked_resolution`] holds a `complete`. The
/// API, the console and the CLI call this before they settle.
pub async fn checked_attempt_resolution(
    store: &dyn Store,
    contracts: &Arc<BTreeMap<String, Contract>>,
    attempt_id: &crate::domain::AttemptId,
    resolution: AttemptResolution,
) -> Result<AttemptResolution, ResolutionError> {
    let AttemptResolution::Executed { result } = &resolution else {
        return Ok(resolution);
    };
    // No such attempt (or job): the store's refusal says so.
    let Some(attempt) = store.get_attempt(attempt_id).await? else {
        return Ok(resolution);
    };
    let Some(job) = store.get_job(&attempt.job_id).await? else {
        return Ok(resolution);
    };
    let result = admins_result(&job, contracts, result)?;
    Ok(AttemptResolution::Executed { result })
}

/// An admin's `result` (JSON text) for `job`, as its plan records an
/// answer ([`crate::engine::plan::JobPlan::admins_result`]).
fn admins_result(
    job: &Job,
    contracts: &Arc<BTreeMap<String, Contract>>,
    result: &str,
) -> Result<String, ResolutionError> {
    let plan = crate::engine::plan::JobPlan::new(&job.id, &job.request, contracts)
        .map_err(|e| ResolutionError::Result(format!("cannot be checked here: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(result)
        .map_err(|e| ResolutionError::Result(format!("not JSON: {e}")))?;
    plan.admins_result(&value).map_err(ResolutionError::Result)
}

/// Why [`checked_resolution`] refused.
#[derive(Debug, thiserror::Error)]
pub enum ResolutionError {
    #[error("result: {0}")]
    Result(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An admin's settlement of an unknown attempt: `executed` with the
/// provider's `result` (JSON text), or `not_executed`.
pub fn attempt_resolution(
    outcome: &str,
    result: Option<String>,
) -> Result<AttemptResolution, DecisionError> {
    const WITH: &str = "outcome executed";
    match (outcome, result) {
        ("executed", Some(result)) => Ok(AttemptResolution::Executed { result }),
        ("executed", None) => Err(DecisionError::ResultRequired(WITH)),
        ("not_executed", Some(_)) => Err(DecisionError::ResultNotAllowed(WITH)),
        ("not_executed", None) => Ok(AttemptResolution::NotExecuted),
        (other, _) => Err(DecisionError::UnknownOutcome(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoded_body_is_known_by_its_door_and_bytes_alone() {
        let request = || JobRequest::parse(br#"{"messages":[{"role":"user","content":"hi"}]}"#);
        let raw = br#"{"model":"default","messages":[{"role":"user","content":"hi"}]}"#;
        let digest =
            |door: &str, raw: &[u8]| JobBody::decoded(door, raw, request().unwrap()).digest();
        assert_eq!(digest("openai.chat", raw), digest("openai.chat", raw));
        assert_ne!(digest("openai.chat", raw), digest("anthropic", raw));
        assert_ne!(digest("openai.chat", raw), digest("openai.chat", b"{}"));
        // Nor is it the digest of the same bytes sent as a job.
        assert_ne!(digest("openai.chat", raw), JobBody::Bytes(raw).digest());
        // A decoded request is held to the job's rules too.
        let mut empty = request().unwrap();
        empty.route = " ".into();
        let body = JobBody::decoded("openai.chat", raw, empty);
        assert!(matches!(body.request(), Err(RequestError::Invalid(m)) if m.starts_with("route:")));
    }

    #[test]
    fn a_job_decision_is_its_action_and_a_result_only_to_complete() {
        let result = || Some("\"done\"".to_string());
        assert_eq!(
            job_resolution("complete", result()),
            Ok(JobResolution::Complete {
                result: "\"done\"".into()
            })
        );
        assert_eq!(job_resolution("retry", None), Ok(JobResolution::Retry));
        assert_eq!(job_resolution("close", None), Ok(JobResolution::Close));
        assert_eq!(
            job_resolution("complete", None),
            Err(DecisionError::ResultRequired("action complete"))
        );
        assert_eq!(
            job_resolution("close", result()).unwrap_err().to_string(),
            "result: only allowed with action complete"
        );
        assert_eq!(
            job_resolution("finish", None).unwrap_err().to_string(),
            "action: \"finish\" is not complete, retry or close"
        );
    }

    #[test]
    fn an_attempt_settlement_is_its_outcome_and_a_result_only_if_executed() {
        assert_eq!(
            attempt_resolution("executed", Some("1".into())),
            Ok(AttemptResolution::Executed { result: "1".into() })
        );
        assert_eq!(
            attempt_resolution("not_executed", None),
            Ok(AttemptResolution::NotExecuted)
        );
        assert_eq!(
            attempt_resolution("executed", None)
                .unwrap_err()
                .to_string(),
            "result: required with outcome executed"
        );
        assert!(matches!(
            attempt_resolution("not_executed", Some("1".into())),
            Err(DecisionError::ResultNotAllowed(_))
        ));
        assert!(matches!(
            attempt_resolution("maybe", None),
            Err(DecisionError::UnknownOutcome(_))
        ));
    }
}
