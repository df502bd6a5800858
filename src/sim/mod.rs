//! The simulated provider: a real HTTP server speaking OpenAI's and
//! Anthropic's wire formats, whose `model` picks a behaviour (healthy,
//! hanging, dropping the connection after executing, rate limiting, …), with
//! a ledger counting executions per `Idempotency-Key`.
//!
//! Endpoints: `POST /v1/chat/completions`, `GET /v1/chat/completions?metadata[K]=V`
//! (stored completions), `POST /v1/messages`, Gemini's
//! `POST /v1beta/models/{model}:generateContent` (also `:streamGenerateContent`,
//! `:countTokens`), Azure OpenAI's `POST /openai/deployments/{d}/chat/completions`,
//! Bedrock's `POST /model/{modelId}/converse` (also `/converse-stream`,
//! `/count-tokens`),
//! `GET /sim/ledger?key=K`, `GET /healthz`.

mod bedrock;
pub mod behaviour;
mod gemini;
pub mod ledger;
pub mod schema_gen;
mod wire;

use axum::routing::{get, post};
use axum::Router;
use behaviour::{Behaviour, Latency};
use ledger::Ledger;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Behaviour overrides, optionally read from `--config FILE`:
///
/// ```toml
/// default_latency = "10..50"    # ms, fixed ("20") or uniform ("LO..HI")
/// default_behaviour = "healthy" # for a model name that is not a behaviour spec
/// ```
#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    pub default_latency: Option<Latency>,
    pub default_behaviour: Option<Behaviour>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimConfigFile {
    default_latency: Option<String>,
    default_behaviour: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    #[error("cannot read simulator config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("simulator config {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

impl SimConfig {
    pub fn load(path: &Path) -> Result<Self, SimConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |message: String| SimConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: SimConfigFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        Ok(SimConfig {
            default_latency: file
                .default_latency
                .as_deref()
                .map(Latency::parse)
                .transpose()
                .map_err(|m| invalid(format!("default_latency: {m}")))?,
            default_behaviour: file
                .default_behaviour
                .as_deref()
                .map(Behaviour::parse)
                .transpose()
                .map_err(|m| invalid(format!("default_behaviour: {m}")))?,
        })
    }
}

type StoredCompletion = (Map<String, Value>, Value);

pub(crate) struct SimState {
    config: SimConfig,
    ledger: Arc<Ledger>,
    /// Model names bound to a behaviour at run time (`PUT /sim/models/NAME`),
    /// so a test or demo can make a provider fail for a while, then recover.
    models: Arc<Models>,
    stored: Mutex<Vec<StoredCompletion>>,
    /// Requests per model name that met a transient (`times=N`) fault.
    faults_met: Mutex<std::collections::HashMap<String, u64>>,
    /// Requests that met a `tail=`, numbered for [`behaviour::Tail::wait_of`].
    tailed: std::sync::atomic::AtomicU64,
    closing: watch::Receiver<bool>,
}

/// Model name → behaviour, changeable while the simulator runs.
#[derive(Default)]
pub struct Models(Mutex<std::collections::HashMap<String, Behaviour>>);

impl Models {
    /// Bind `model` to the behaviour `spec` (e.g. `fail:503`, `healthy:latency=20`).
    pub fn set(&self, model: &str, spec: &str) -> Result<(), String> {
        let behaviour = Behaviour::parse(spec)?;
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(model.to_string(), behaviour);
        Ok(())
    }

    pub(crate) fn get(&self, model: &str) -> Option<Behaviour> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(model)
            .copied()
    }
}

impl SimState {
    /// Resolves when the server shuts down (hanging handlers wait on this).
    async fn closing(&self) {
        let mut closing = self.closing.clone();
        // An error means the sender is gone: the server is going away too.
        let _ = closing.wait_for(|c| *c).await;
    }

    /// Whether this request for `model` still meets a fault that applies
    /// `times` times; counts it when it does.
    fn meets_fault(&self, model: &str, times: Option<u64>) -> bool {
        let Some(times) = times else {
            return true;
        };
        let mut met = self.faults_met.lock().unwrap_or_else(|e| e.into_inner());
        let count = met.entry(model.to_string()).or_default();
        if *count < times {
            *count += 1;
            true
        } else {
            false
        }
    }

    fn store(&self, metadata: Map<String, Value>, completion: Value) {
        self.stored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((metadata, completion));
    }

    fn stored_matching(&self, filters: &[(&str, &str)]) -> Vec<Value> {
        self.stored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(meta, _)| {
                filters
                    .iter()
                    .all(|(k, v)| meta.get(*k).and_then(Value::as_str) == Some(*v))
            })
            .map(|(_, completion)| completion.clone())
            .collect()
    }
}

fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(wire::openai_chat).get(wire::list_stored),
        )
        .route("/v1/messages", post(wire::anthropic_messages))
        .route(
            "/v1/messages/count_tokens",
            post(wire::anthropic_count_tokens),
        )
        .route("/v1beta/models/{model_method}", post(gemini::models))
        .route("/model/{model}/{operation}", post(bedrock::model))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(wire::openai_chat),
        )
        .route("/sim/ledger", get(wire::ledger))
        .route("/sim/models/{model}", axum::routing::put(wire::set_model))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// Serve the simulator on `listener` until the process ends.
pub async fn serve(listener: TcpListener, config: SimConfig) -> std::io::Result<()> {
    serve_with_shutdown(
        listener,
        config,
        Arc::new(Ledger::default()),
        Arc::new(Models::default()),
        std::future::pending(),
    )
    .await
}

/// Serve until `shutdown` resolves; then hanging requests are released and
/// in-flight ones finish.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    config: SimConfig,
    ledger: Arc<Ledger>,
    models: Arc<Models>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing_tx, closing) = watch::channel(false);
    load_tokenizer().await;
    let state = Arc::new(SimState {
        config,
        ledger,
        models,
        stored: Mutex::new(Vec::new()),
        faults_met: Mutex::new(std::collections::HashMap::new()),
        tailed: std::sync::atomic::AtomicU64::new(0),
        closing,
    });
    tracing::info!(addr = ?listener.local_addr().ok(), "simulator listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = closing_tx.send(true);
        })
        .await
}

/// Build the tokenizer usage is counted with (once per process; it takes a
/// while, more in debug builds) before serving, so no request waits for it
/// and latency-sensitive callers see the first answer as fast as the rest.
async fn load_tokenizer() {
    let loaded = tokio::task::spawn_blocking(|| {
        crate::contracts::tokenizer::tokenizer(wire::SIM_TOKENIZER).map(|_| ())
    })
    .await;
    match loaded {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "simulator tokenizer unavailable; usage will be estimated")
        }
        Err(e) => {
            tracing::warn!(error = %e, "simulator tokenizer load panicked; usage will be estimated")
        }
    }
}

/// The simulator as an object, for tests and the demo: start on a port
/// (0 for any), read the ledger, shut down.
pub struct SimServer;

impl SimServer {
    pub async fn start(addr: &str) -> std::io::Result<SimHandle> {
        Self::start_with(addr, SimConfig::default()).await
    }

    pub async fn start_with(addr: &str, config: SimConfig) -> std::io::Result<SimHandle> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        load_tokenizer().await;
        let ledger = Arc::new(Ledger::default());
        let models = Arc::new(Models::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with_shutdown(
            listener,
            config,
            ledger.clone(),
            models.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        Ok(SimHandle {
            local_addr,
            ledger,
            models,
            stop: Some(stop),
            task,
        })
    }
}

pub struct SimHandle {
    local_addr: SocketAddr,
    ledger: Arc<Ledger>,
    models: Arc<Models>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl SimHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://ADDR`, the `base_url` a provider config points at.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// A provider file (`providers/NAME.toml`) of kind sim that asks this
    /// simulator for `model` (a behaviour spec such as `healthy`).
    pub fn provider_toml(&self, model: &str) -> String {
        format!(
            "kind = \"sim\"\nbase_url = \"{}\"\nmodel = \"{model}\"\ntokenizer = \"o200k_base\"\n\
             context_window = 16384\nhonours_idempotency_key = true\nlookup = \"sim_ledger\"\n\
             [timeouts]\nconnect_ms = 1000\nfirst_byte_ms = 30000\ntotal_ms = 30000\n",
            self.base_url()
        )
    }

    /// Run-time model bindings (see [`Models`]).
    pub fn models(&self) -> &Models {
        &self.models
    }

    /// Stop accepting, release hanging requests, wait for the server to end.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
