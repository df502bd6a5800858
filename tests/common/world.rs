//! A whole onejob world for engine tests: the simulator on a real socket,
//! provider files pointing at it, and a server with its engine running, over
//! a fresh database.

use super::{Backend, TestDb};
use onejob::app::Application;
use onejob::clock::SystemClock;
use onejob::config::{Config, Overrides, RouteConfig};
use onejob::sim::{SimHandle, SimServer};
use onejob::store::faulty::FaultyStore;
use onejob::store::Store;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A provider of the world: a name and the simulator model it asks for.
pub struct ProviderSpec {
    pub name: &'static str,
    pub model: &'static str,
}

pub fn route(primary: &str, fallbacks: &[&str]) -> RouteConfig {
    RouteConfig {
        primary: primary.to_string(),
        fallbacks: fallbacks.iter().map(|s| s.to_string()).collect(),
        silence_ms: 10_000,
        attempt_timeout_ms: 20_000,
        max_hedges: 1,
        max_attempts: 4,
        same_provider_retries: 1,
        backoff_base_ms: 10,
        backoff_cap_ms: 50,
        unknown_deadline_ms: 60_000,
        stall_ms: 10_000,
        ..RouteConfig::builtin_default()
    }
}

pub struct World {
    pub address: String,
    /// The server's routes, to call in-process.
    pub router: axum::Router,
    config: Config,
    pub store: Arc<dyn Store>,
    pub client: reqwest::Client,
    pub key: String,
    pub admin_key: String,
    pub sim: SimHandle,
    pub db: TestDb,
    _providers: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// Write `providers` as provider files of kind sim in a new directory.
pub fn provider_dir(providers: &[ProviderSpec], base_url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for p in providers {
        write_provider(dir.path(), p.name, p.model, base_url, 16_384);
    }
    dir
}

/// One simulator provider file, `NAME.toml`, in `dir`.
pub fn write_provider(
    dir: &std::path::Path,
    name: &str,
    model: &str,
    base_url: &str,
    context_window: u32,
) {
    let text = format!(
        "kind = \"sim\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\ntokenizer = \"o200k_base\"\n\
         context_window = {context_window}\nhonours_idempotency_key = true\nlookup = \"sim_ledger\"\n\
         [timeouts]\nconnect_ms = 1000\nfirst_byte_ms = 30000\ntotal_ms = 30000\n"
    );
    std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
}

/// Make provider `name` of a world say it does not honour idempotency keys
/// (its file is rewritten before the server loads it, from `tune`): an
/// unknown attempt there then blocks re-sending to it (invariant 3).
pub fn distrust_keys(config: &Config, name: &str) {
    edit_provider(
        config,
        name,
        "honours_idempotency_key = true",
        "honours_idempotency_key = false",
    );
}

/// Give provider `name` of a world another context window (from `tune`).
pub fn set_window(config: &Config, name: &str, window: u32) {
    edit_provider(
        config,
        name,
        "context_window = 16384",
        &format!("context_window = {window}"),
    );
}

/// Make provider `name` of a world say it cannot continue a prefill (from
/// `tune`): a stream cut mid-answer is restarted on it, not continued.
pub fn refuse_prefill(config: &Config, name: &str) {
    edit_provider(
        config,
        name,
        "lookup = \"sim_ledger\"\n",
        "lookup = \"sim_ledger\"\nsupports_prefill = false\n",
    );
}

/// [`distrust_keys`] for a provider directory made by [`provider_dir`].
pub fn distrust_keys_in(dir: &std::path::Path, name: &str) {
    edit_provider_file(
        dir,
        name,
        "honours_idempotency_key = true",
        "honours_idempotency_key = false",
    );
}

fn edit_provider(config: &Config, name: &str, from: &str, to: &str) {
    edit_provider_file(&config.providers_dir, name, from, to);
}

fn edit_provider_file(dir: &std::path::Path, name: &str, from: &str, to: &str) {
    let path = dir.join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{path:?} has no {from:?}");
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// The engine settings tests use: fast polling and reconciliation.
pub fn fast_engine(config: &mut Config) {
    config.engine.poll_interval_ms = 20;
    config.engine.reconcile_interval_ms = 20;
    config.engine.reconcile_min_age_ms = 0;
    config.engine.rng_seed = Some(42);
}

pub async fn start_world(
    backend: Backend,
    providers: &[ProviderSpec],
    route: RouteConfig,
    tune: impl FnOnce(&mut Config),
) -> World {
    start_world_on(backend, providers, route, tune, |store| store).await
}

/// `start_world` with the server's store wrapped in a [`FaultyStore`]
/// (returned too); `World::store` stays the real one, for the test's reads.
pub async fn start_faulty_world(
    backend: Backend,
    providers: &[ProviderSpec],
    route: RouteConfig,
    tune: impl FnOnce(&mut Config),
) -> (World, Arc<FaultyStore>) {
    let mut faulty = None;
    let world = start_world_on(backend, providers, route, tune, |store| {
        let wrapped = Arc::new(FaultyStore::new(store));
        faulty = Some(wrapped.clone());
        wrapped
    })
    .await;
    (world, faulty.unwrap())
}

async fn start_world_on(
    backend: Backend,
    providers: &[ProviderSpec],
    route: RouteConfig,
    tune: impl FnOnce(&mut Config),
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> World {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let dir = provider_dir(providers, &sim.base_url());
    let db = TestDb::new(backend).await;
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        database_url: Some(db.url_string()),
    };
    let mut config = Config::load(None, &overrides).unwrap();
    config.providers_dir = dir.path().to_path_buf();
    config.routes.clear();
    config.routes.insert("default".into(), route);
    fast_engine(&mut config);
    tune(&mut config);
    let store = db.store().await;
    let (address, router, tx, server) = serve_routed(config.clone(), wrap(store.clone())).await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let admin_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "ops", true)
        .await
        .unwrap();
    World {
        address,
        router,
        config,
        store,
        // The server ends a keep-alive connection idle for its
        // header_read_timeout (10 s); a client that keeps one longer may
        // send on it as it closes (hyper: IncompleteMessage), as a GET did
        // after a ten-second SDK run in CI. Idle connections are dropped
        // well before the server's limit.
        client: reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap(),
        key,
        admin_key,
        sim,
        db,
        _providers: dir,
        shutdown: Some(tx),
        server: Some(server),
    }
}

/// A server (with its engine, if the config enables it) on the config's
/// address; its address, a stop switch and the task to await after stopping.
pub async fn serve(
    config: Config,
    store: Arc<dyn Store>,
) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (address, _, tx, server) = serve_routed(config, store).await;
    (address, tx, server)
}

/// [`serve`], and the server's routes to call in-process.
pub async fn serve_routed(
    config: Config,
    store: Arc<dyn Store>,
) -> (
    String,
    axum::Router,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let app = Application::with_store(config, store, Arc::new(SystemClock))
        .await
        .unwrap();
    let address = format!("http://{}", app.local_addr());
    let router = app.router();
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        app.run_until_stopped(async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (address, router, tx, server)
}

impl World {
    /// `GET /metrics`, as text.
    #[allow(dead_code)]
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.address))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of the unlabelled series `name` in `GET /metrics`.
    #[allow(dead_code)]
    pub async fn counter(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// The configuration the server runs with (to start another instance).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The directory the server's provider files are in.
    pub fn providers_path(&self) -> &std::path::Path {
        self._providers.path()
    }

    /// Stop the server and start a new one on the same database and
    /// simulator (as after a deploy), with `tune` applied to its config.
    pub async fn restart(&mut self, tune: impl FnOnce(&mut Config)) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap();
        }
        tune(&mut self.config);
        let store = self.db.store().await;
        let (address, router, tx, server) = serve_routed(self.config.clone(), store.clone()).await;
        self.address = address;
        self.router = router;
        self.store = store;
        self.shutdown = Some(tx);
        self.server = Some(server);
    }

    /// `POST /v1/jobs`, optionally holding for the result (`Prefer: wait`).
    pub async fn submit(&self, key: &str, body: &Value, wait_secs: Option<u64>) -> (u16, Value) {
        let mut request = self
            .client
            .post(format!("{}/v1/jobs", self.address))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", key)
            .json(body);
        if let Some(secs) = wait_secs {
            request = request.header("Prefer", format!("wait={secs}"));
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.address))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.address))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The job's row as the store holds it, read past the API.
    pub async fn stored_job(&self, id: &str) -> onejob::domain::Job {
        self.store
            .get_job(&onejob::domain::JobId::from(id))
            .await
            .unwrap()
            .expect("the job is stored")
    }

    pub async fn job(&self, id: &str) -> Value {
        self.get(&self.key, &format!("/v1/jobs/{id}")).await.1
    }

    pub async fn attempts(&self, id: &str) -> Vec<Value> {
        let body = self
            .get(&self.key, &format!("/v1/jobs/{id}/attempts"))
            .await
            .1;
        body["attempts"].as_array().cloned().unwrap_or_default()
    }

    /// Poll `check` on the job until it holds, at most `limit`. Waiting for
    /// the engine is the point here; the poll only observes.
    pub async fn until(
        &self,
        id: &str,
        limit: Duration,
        check: impl Fn(&Value, &[Value]) -> bool,
    ) -> (Value, Vec<Value>) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let job = self.job(id).await;
            let attempts = self.attempts(id).await;
            if check(&job, &attempts) {
                return (job, attempts);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition not reached within {limit:?}; job {job}, attempts {attempts:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many requests reached the simulator under this job's key at
    /// `provider` (replays of a recorded key count too).
    pub fn deliveries(&self, job_id: &str, provider: &str) -> u64 {
        self.sim
            .ledger()
            .deliveries(&onejob::providers::stable_key(&job_id.into(), provider))
    }

    /// How many times the simulator executed the work under this job's key at `provider`.
    pub fn executions(&self, job_id: &str, provider: &str) -> u64 {
        self.sim
            .ledger()
            .executions(&onejob::providers::stable_key(&job_id.into(), provider))
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap();
        }
    }
}
