//! Scripted providers: in-process `Provider`s whose every call draws its
//! behaviour from a seeded RNG, on the simulated clock. A provider is a
//! server apart from the engine: once a request has reached it, the work
//! runs to its end (and is written in its ledger) whether or not the caller
//! still listens — a timeout, a dropped loser or a killed instance does not
//! stop it.

use async_trait::async_trait;
use onejob::providers::{
    Ambiguous, AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Success, Usage,
};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one call does, drawn per call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    /// Executes and answers after `ms`.
    Answer { ms: u64 },
    /// Never answers and never executes (a black hole).
    Silence,
    /// Executes after `ms`, then the connection resets: the caller sees an
    /// ambiguous reset, the work is in the ledger (the lost response).
    LostResponse { ms: u64 },
    /// The connection resets after the request was sent, before the
    /// provider did anything: ambiguous to the caller, nothing executed.
    ResetNotExecuted { ms: u64 },
    /// Executes; the body is cut mid-way (ambiguous; executed).
    Cut { ms: u64 },
    /// 429 with a Retry-After; nothing executed.
    RateLimited { ms: u64, retry_after_ms: u64 },
    /// 503; nothing executed.
    Unavailable { ms: u64 },
    /// 400: a definitive no; nothing executed.
    Reject { ms: u64 },
}

/// How often each behaviour is drawn (weights), and the latencies.
#[derive(Debug, Clone)]
pub struct Temper {
    pub weights: Vec<(Kind, u32)>,
    /// Answer latency range (ms).
    pub latency: (u64, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Answer,
    Silence,
    LostResponse,
    ResetNotExecuted,
    Cut,
    RateLimited,
    Unavailable,
    Reject,
}

/// A heavy-tailed latency: lognormal around `median_ms`, a share `tail_p`
/// of calls `tail_factor` times slower, everything `slow_factor` times
/// slower from `slow_from_ms` (virtual ms since the start) on. Replaces the
/// temper's uniform latency range (`Scripted::with_latency`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyModel {
    pub median_ms: f64,
    pub sigma: f64,
    pub tail_p: f64,
    pub tail_factor: f64,
    pub slow_from_ms: Option<u64>,
    pub slow_factor: f64,
}

impl LatencyModel {
    pub fn lognormal(median_ms: f64, sigma: f64) -> Self {
        LatencyModel {
            median_ms,
            sigma,
            tail_p: 0.0,
            tail_factor: 1.0,
            slow_from_ms: None,
            slow_factor: 1.0,
        }
    }

    /// One latency at virtual time `now` (ms since the start).
    pub fn draw(&self, rng: &mut StdRng, now: u64) -> u64 {
        // Box-Muller: one standard normal from two uniforms.
        let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let mut ms = self.median_ms * (self.sigma * z).exp();
        if rng.gen_bool(self.tail_p) {
            ms *= self.tail_factor;
        }
        if self.slow_from_ms.is_some_and(|from| now >= from) {
            ms *= self.slow_factor;
        }
        ms.round().max(1.0) as u64
    }
}

/// One key's record on the provider's side.
#[derive(Debug, Clone, Default)]
pub struct KeyRecord {
    /// Requests that arrived with the key.
    pub calls: u32,
    /// Times the work was actually executed (charged).
    pub executions: u32,
    /// Executions begun and not yet done.
    pub in_progress: u32,
    /// The answer of the latest execution.
    pub answer: Option<Success>,
}

pub type Ledger = Arc<Mutex<BTreeMap<String, KeyRecord>>>;

/// Every call a provider got: (virtual ms since the start, key, what it did).
pub type CallLog = Arc<Mutex<Vec<(u64, String, String)>>>;

pub struct Scripted {
    name: String,
    /// Repeats with a known key get the recorded answer (or a 409 while
    /// the first is running) instead of a second execution.
    pub honours_keys: bool,
    /// Whether `lookup` can tell (a ledger lookup) or never can.
    pub can_look_up: bool,
    temper: Temper,
    rng: Mutex<StdRng>,
    /// Behaviours to play first, in order, before any is drawn.
    script: Mutex<std::collections::VecDeque<Behaviour>>,
    /// Answer latencies drawn from this instead of the temper's range.
    latency: Option<LatencyModel>,
    pub ledger: Ledger,
    /// Every call, in order: (virtual ms since start, key, behaviour).
    pub log: CallLog,
    started: tokio::time::Instant,
}

impl Scripted {
    pub fn new(
        name: &str,
        honours_keys: bool,
        can_look_up: bool,
        temper: Temper,
        rng: StdRng,
        started: tokio::time::Instant,
    ) -> Self {
        Scripted {
            name: name.to_string(),
            honours_keys,
            can_look_up,
            temper,
            rng: Mutex::new(rng),
            script: Mutex::default(),
            latency: None,
            ledger: Arc::default(),
            log: Arc::default(),
            started,
        }
    }

    /// Answers take latencies drawn from `model`.
    #[allow(dead_code, reason = "used by the hedging simulation only")]
    pub fn with_latency(mut self, model: LatencyModel) -> Self {
        self.latency = Some(model);
        self
    }

    /// The next calls behave like this, in order (then draws resume).
    #[allow(dead_code, reason = "used by tests/engine_clock.rs")]
    pub fn script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.script.lock().unwrap().extend(behaviours);
    }

    /// Executions of the work with `key` so far.
    #[allow(dead_code, reason = "used by tests/engine_clock.rs")]
    pub fn executions(&self, key: &str) -> u32 {
        self.ledger
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |r| r.executions)
    }

    fn draw(&self) -> Behaviour {
        if let Some(next) = self.script.lock().unwrap().pop_front() {
            return next;
        }
        let mut rng = self.rng.lock().unwrap();
        let total: u32 = self.temper.weights.iter().map(|(_, w)| w).sum();
        let mut pick = rng.gen_range(0..total.max(1));
        let mut kind = Kind::Answer;
        for (k, w) in &self.temper.weights {
            if pick < *w {
                kind = *k;
                break;
            }
            pick -= w;
        }
        let (lo, hi) = self.temper.latency;
        let ms = match &self.latency {
            Some(model) => model.draw(&mut rng, self.now()),
            None => rng.gen_range(lo..=hi),
        };
        let short = rng.gen_range(1..=20);
        match kind {
            Kind::Answer => Behaviour::Answer { ms },
            Kind::Silence => Behaviour::Silence,
            Kind::LostResponse => Behaviour::LostResponse { ms },
            Kind::ResetNotExecuted => Behaviour::ResetNotExecuted { ms: short },
            Kind::Cut => Behaviour::Cut { ms },
            Kind::RateLimited => Behaviour::RateLimited {
                ms: short,
                retry_after_ms: rng.gen_range(10..=500),
            },
            Kind::Unavailable => Behaviour::Unavailable { ms: short },
            Kind::Reject => Behaviour::Reject { ms: short },
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The work, run on the provider's side: recorded when it ends.
    fn execute(&self, key: &str, ms: u64) -> tokio::sync::oneshot::Receiver<Success> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ledger = self.ledger.clone();
        let name = self.name.clone();
        let key = key.to_string();
        ledger
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .in_progress += 1;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let answer = {
                let mut ledger = ledger.lock().unwrap();
                let record = ledger.entry(key.clone()).or_default();
                record.in_progress -= 1;
                record.executions += 1;
                // Each execution answers differently, so a second one would
                // show in a job's result.
                let answer = Success {
                    output: format!("{name} answers {key} (execution {})", record.executions),
                    tool_calls: Vec::new(),
                    usage: Some(Usage::new(7, 5)),
                    provider_request_id: Some(format!("{name}-{key}-{}", record.executions)),
                    latency: Duration::from_millis(ms),
                    finish: None,
                };
                record.answer = Some(answer.clone());
                answer
            };
            let _ = tx.send(answer);
        });
        rx
    }
}

fn unknown(kind: &str, message: &str) -> AttemptOutcome {
    AttemptOutcome::Unknown(Ambiguous {
        kind: kind.into(),
        message: message.to_string(),
    })
}

fn failed(retryable: bool, kind: &str, status: u16, retry_after: Option<u64>) -> AttemptOutcome {
    AttemptOutcome::Failed(Failure {
        retryable,
        retry_after: retry_after.map(Duration::from_millis),
        kind: kind.into(),
        message: format!("scripted {status}"),
        status: Some(status),
    })
}

#[async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let key = request.idempotency_key.clone();
        let behaviour = self.draw();
        let seen = {
            let mut ledger = self.ledger.lock().unwrap();
            let record = ledger.entry(key.clone()).or_default();
            record.calls += 1;
            (record.in_progress, record.answer.clone())
        };
        self.log
            .lock()
            .unwrap()
            .push((self.now(), key.clone(), format!("{behaviour:?}")));
        if self.honours_keys {
            match seen {
                // A repeat of finished work: the recorded answer, no second execution.
                (_, Some(answer)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    return AttemptOutcome::Succeeded(answer);
                }
                // The first is still running: a conflict, retry later.
                (running, None) if running > 0 => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    return failed(true, "conflict", 409, Some(100));
                }
                _ => {}
            }
        }
        match behaviour {
            Behaviour::Answer { ms } => match self.execute(&key, ms).await {
                Ok(answer) => AttemptOutcome::Succeeded(answer),
                Err(_) => std::future::pending().await,
            },
            Behaviour::Silence => std::future::pending().await,
            Behaviour::LostResponse { ms } => {
                let _ = self.execute(&key, ms).await;
                unknown("connection_reset", "reset after the provider executed")
            }
            Behaviour::Cut { ms } => {
                let _ = self.execute(&key, ms).await;
                unknown("truncated_body", "the body was cut")
            }
            Behaviour::ResetNotExecuted { ms } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                unknown("connection_reset", "reset after send")
            }
            Behaviour::RateLimited { ms, retry_after_ms } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                failed(true, "rate_limited", 429, Some(retry_after_ms))
            }
            Behaviour::Unavailable { ms } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                failed(true, "unavailable", 503, None)
            }
            Behaviour::Reject { ms } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                failed(false, "bad_request", 400, None)
            }
        }
    }

    async fn lookup(&self, idempotency_key: &str) -> Lookup {
        if !self.can_look_up {
            return Lookup::CannotTell(format!("{} offers no lookup", self.name));
        }
        let ledger = self.ledger.lock().unwrap();
        match ledger.get(idempotency_key) {
            Some(record) if record.in_progress > 0 => {
                Lookup::CannotTell("the work with this key is still running".to_string())
            }
            Some(KeyRecord {
                answer: Some(answer),
                ..
            }) => Lookup::Found(answer.clone()),
            _ => Lookup::NotFound,
        }
    }
}
