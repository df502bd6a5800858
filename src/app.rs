//! Start-up as an object: `Application::build(config)` binds the listener,
//! loads the providers and contracts, then opens and migrates the store; `run_until_stopped` serves until the
//! shutdown signal, lets in-flight requests finish, then flushes the store.
//! Tests build the same object on port 0.

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::contracts::EligibilityCache;
use crate::engine::gate::EligibilityGate;
use crate::engine::Engine;
use crate::http::{self, AppServices, AppState};
use crate::metrics::Metrics;
use crate::providers::catalog::Catalog;
use crate::providers::switches::{ProviderSwitches, REFRESH_EVERY};
use crate::store::{self, Store};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long shutdown waits for jobs being driven to finish their round.
const ENGINE_DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Providers(#[from] crate::providers::config::ProviderConfigError),
    #[error(transparent)]
    Contracts(#[from] crate::contracts::ContractError),
    #[error("cannot open database {url}: {source}")]
    Database {
        url: String,
        source: store::StoreError,
    },
    #[error(transparent)]
    Webhooks(crate::webhooks::delivery::ClientError),
    #[error("{0}")]
    Routes(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub struct Application {
    listener: TcpListener,
    state: AppState,
}

/// What a start needs besides the database, each of which can refuse it:
/// the listening socket, the provider files (with their API keys) checked
/// against the routes, and the contracts.
struct Parts {
    listener: TcpListener,
    providers: Arc<Catalog>,
    contracts: Arc<std::collections::BTreeMap<String, crate::contracts::Contract>>,
}

impl Parts {
    async fn load(config: &Config) -> Result<Self, StartError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let providers = Arc::new(Catalog::load(
            &config.providers_dir,
            config.sim_base_url.as_deref(),
        )?);
        // A server that runs jobs refuses a route naming a provider it does
        // not have (every job of it would be taken and then fail); one
        // without an engine leaves its jobs to servers that have them.
        let unconfigured = config.unconfigured_route_providers(|p| providers.get(p).is_some());
        if config.engine.enabled && !unconfigured.is_empty() {
            return Err(StartError::Routes(unconfigured.join("; ")));
        }
        let contracts = Arc::new(if config.contracts_dir.exists() {
            crate::contracts::load_all(&config.contracts_dir)?
        } else {
            Default::default()
        });
        Ok(Parts {
            listener,
            providers,
            contracts,
        })
    }
}

impl Application {
    pub async fn build(config: Config) -> Result<Self, StartError> {
        // Everything that can refuse the configuration or the address is
        // checked before the database is opened: a refused start leaves no
        // new database behind.
        let parts = Parts::load(&config).await?;
        let store =
            store::connect(&config.database)
                .await
                .map_err(|source| StartError::Database {
                    url: config.database.to_string(),
                    source,
                })?;
        store
            .migrate()
            .await
            .map_err(|source| StartError::Database {
                url: config.database.to_string(),
                source,
            })?;
        Self::assemble(config, store, Arc::new(SystemClock), parts).await
    }

    pub async fn with_store(
        config: Config,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError> {
        let parts = Parts::load(&config).await?;
        Self::assemble(config, store, clock, parts).await
    }

    async fn assemble(
        config: Config,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        parts: Parts,
    ) -> Result<Self, StartError> {
        let Parts {
            listener,
            providers,
            contracts,
        } = parts;
        // Loaded before the first request: a provider switched off stays off
        // from the first attempt on.
        let switches = Arc::new(ProviderSwitches::default());
        switches
            .refresh(store.as_ref())
            .await
            .map_err(|source| StartError::Database {
                url: config.database.to_string(),
                source,
            })?;
        let cache = EligibilityCache::new(store.clone(), providers.clone(), contracts.clone());
        let gate = Arc::new(
            EligibilityGate::load(switches.clone(), cache)
                .await
                .map_err(|source| StartError::Database {
                    url: config.database.to_string(),
                    source,
                })?,
        );
        let tenants =
            crate::tenants::Tenants::load(store.clone(), clock.clone(), config.limits.clone())
                .await
                .map_err(|source| StartError::Database {
                    url: config.database.to_string(),
                    source,
                })?;
        let config = Arc::new(config);
        let metrics = Arc::new(Metrics::default());
        let webhooks = if config.webhooks.enabled {
            Some(
                crate::webhooks::delivery::Deliverer::new(
                    config.webhooks.clone(),
                    config.webhook_key.clone(),
                    store.clone(),
                    clock.clone(),
                    metrics.clone(),
                )
                .map_err(StartError::Webhooks)?,
            )
        } else {
            None
        };
        let engine = config.engine.enabled.then(|| {
            Engine::new(
                config.clone(),
                store.clone(),
                clock.clone(),
                providers.clone(),
                contracts.clone(),
                gate.clone(),
                metrics.clone(),
            )
        });
        let state = AppState::new(AppServices {
            config,
            store,
            clock,
            tenants,
            providers,
            contracts,
            engine,
            metrics,
            switches,
            gate,
            replays: Arc::default(),
            ui_sessions: Arc::default(),
            webhooks,
        });
        Ok(Application { listener, state })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| self.state.config.listen)
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.state.store.clone()
    }

    pub fn switches(&self) -> Arc<ProviderSwitches> {
        self.state.switches.clone()
    }

    /// The HTTP routes over this application's state, to call in-process
    /// (tests drop a request's future at a chosen await, as a client
    /// disconnect does).
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// Serve until `shutdown` resolves; in-flight requests finish first, then
    /// every queued write is committed before this returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let store = self.state.store.clone();
        let refresher = self
            .state
            .switches
            .clone()
            .spawn_refresher(store.clone(), REFRESH_EVERY);
        let eligibility_refresher = self.state.gate.clone().spawn_refresher(REFRESH_EVERY);
        let tenants = self.state.tenants.clone();
        let tenant_watcher = tenants.clone().spawn_watcher();
        let replay_audit = self.state.replays.audit.clone();
        let audit_flusher = replay_audit.clone().spawn_flusher(store.clone());
        let (stop, stopped) = watch::channel(false);
        let engine = self.state.engine.clone().map(|engine| {
            let stopped = stopped.clone();
            let runner = engine.clone();
            (
                engine,
                tokio::spawn(async move { runner.run(stopped).await }),
            )
        });
        let webhooks = self.state.webhooks.clone().map(|deliverer| {
            let stopped = stopped.clone();
            tokio::spawn(deliverer.run(stopped))
        });
        let header_read_timeout = self.state.config.header_read_timeout;
        let router = http::router(self.state);
        let served = http::serve::serve(self.listener, router, header_read_timeout, shutdown).await;
        let _ = stop.send(true);
        if let Some((engine, runner)) = engine {
            let _ = runner.await;
            if !engine.drain(ENGINE_DRAIN).await {
                tracing::warn!("jobs still in flight at shutdown; another process resumes them");
            }
        }
        if let Some(webhooks) = webhooks {
            // Tries in flight are left to their leases: another process (or
            // this one, restarted) sends them again with the same id.
            webhooks.abort();
        }
        refresher.abort();
        eligibility_refresher.abort();
        tenant_watcher.abort();
        tenants.stop().await;
        audit_flusher.abort();
        replay_audit.flush(store.as_ref()).await;
        served?;
        store.close().await;
        Ok(())
    }
}

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: call it before saying that
/// the process listens, so a signal sent as soon as a script (or a test)
/// reads that line is a clean stop, not the default action's kill.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (mut term, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let interrupt = async {
                match interrupt.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = term => {},
                _ = interrupt => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received; finishing in-flight requests");
    }
}
