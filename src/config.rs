//! Typed configuration: `onejob.toml` plus command-line flags and `ONEJOB_*`
//! environment variables (flags win, then the environment, then the file).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::domain::hedging::HedgePolicy;
pub use crate::store::DatabaseUrl;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_CONFIG: &str = "onejob.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A value given on the command line or in the environment, not the
    /// file: the error names where it came from.
    #[error("{given}: {message}")]
    Override {
        given: &'static str,
        message: String,
    },
    #[error(transparent)]
    DatabaseUrl(#[from] crate::store::InvalidDatabaseUrl),
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub engine: EngineConfig,
    #[serde(default)]
    pub routes: BTreeMap<String, RouteConfig>,
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// `[limits.default]`, `[limits.owners.NAME]`: per-owner request rate,
    /// concurrent jobs and tokens per day.
    #[serde(default)]
    pub limits: crate::domain::limits::LimitsConfig,
    /// `[webhooks]`: delivery of signed events to owners' endpoints.
    #[serde(default)]
    pub webhooks: crate::webhooks::WebhooksConfig,
}

/// How the engine inside `onejob serve` runs jobs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Run jobs in this process (false: accept and store only).
    pub enabled: bool,
    /// How often the dispatcher looks for runnable jobs it was not handed
    /// directly (retries due, jobs of a crashed process).
    pub poll_interval_ms: u64,
    /// How often unknown attempts are reconciled with their provider.
    pub reconcile_interval_ms: u64,
    /// An unknown attempt is first asked about this long after it started
    /// (some providers list stored work only after a delay).
    pub reconcile_min_age_ms: u64,
    /// Jobs driven at once by this process.
    pub max_concurrent_jobs: usize,
    /// Added to a route's silence_ms + attempt_timeout_ms to make a job's
    /// lease: how long a crashed process's jobs wait before another takes them.
    pub lease_margin_ms: u64,
    /// How long a losing attempt still in flight after another won may
    /// finish (its usage is then recorded) before its request is dropped.
    pub loser_grace_ms: u64,
    pub breaker_threshold: u32,
    pub breaker_open_ms: u64,
    pub breaker_probe_every: u32,
    /// Seed for backoff jitter; random when absent.
    pub rng_seed: Option<u64>,
}

impl EngineConfig {
    /// The settings whose zero would stop the engine quietly: no job ever
    /// driven, no poll, no unknown attempt ever asked about, a breaker that
    /// trips on nothing.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in [
            ("poll_interval_ms", self.poll_interval_ms),
            ("reconcile_interval_ms", self.reconcile_interval_ms),
            ("max_concurrent_jobs", self.max_concurrent_jobs as u64),
            ("breaker_threshold", u64::from(self.breaker_threshold)),
            ("breaker_probe_every", u64::from(self.breaker_probe_every)),
        ] {
            if value == 0 {
                return Err(format!("engine.{name}: must be at least 1"));
            }
        }
        Ok(())
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            enabled: true,
            poll_interval_ms: 250,
            reconcile_interval_ms: 1_000,
            reconcile_min_age_ms: 2_000,
            max_concurrent_jobs: 4_096,
            lease_margin_ms: 5_000,
            loser_grace_ms: 1_000,
            breaker_threshold: 5,
            breaker_open_ms: 5_000,
            breaker_probe_every: 10,
            rng_seed: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub database_url: Option<String>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: Option<usize>,
    /// A client must send its request headers within this (slowloris guard).
    pub header_read_timeout_ms: Option<u64>,
    /// ...and a job or completion body within this, else 408.
    pub body_read_timeout_ms: Option<u64>,
    /// One TOML per provider [default: providers/ beside the config].
    pub providers_dir: Option<String>,
    /// One folder per contract [default: contracts/ beside the config].
    pub contracts_dir: Option<String>,
    /// Whether `Idempotency-Key` is required [default: required].
    pub idempotency: Option<IdempotencyMode>,
    /// With `idempotency = "fingerprint"`: how long after a job's creation
    /// a keyless request with the same body is that job [default: 300].
    pub fingerprint_window_s: Option<u64>,
    /// Threads that run requests and jobs [default: the machine's cores
    /// less one, at least 1]. See [`default_workers`].
    pub workers: Option<usize>,
}

/// The largest `[server] workers` accepted: more threads than this is a typo.
pub const MAX_WORKERS: usize = 1024;

/// `[server] workers` when the file sets none: one thread per core but one,
/// and at least one. The core left over is the SQLite writer's (about 40%
/// of the server's CPU under load runs there) and the rest of the machine's.
/// On a 2-core machine a second async worker mostly costs the wake-ups of
/// handing tasks between the two: in six runs beside two workers, one used
/// 4–12% less CPU per durable job through `/v1/jobs` (chat: −16% to +1%),
/// at a rate within the machine's noise (docs/benchmarks.md).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_sub(1)
        .max(1)
}

/// `[server] idempotency`: what a create without `Idempotency-Key` gets.
/// - `required` (the default): refused.
/// - `fingerprint`: the key of its owner and canonical body, for
///   `fingerprint_window_s` after the job it names was created. An SDK's
///   blind retry of the same body is then the same job, and the next step
///   of an agent loop (another body) a new one.
/// - `optional`: a fresh server-made key, not protected against the
///   client's own retries.
///
/// The key used is echoed in the `Idempotency-Key` response header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdempotencyMode {
    #[default]
    Required,
    Fingerprint,
    Optional,
}

/// The policy a job runs under.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub primary: String,
    #[serde(default)]
    pub fallbacks: Vec<String>,
    #[serde(default = "defaults::silence_ms")]
    pub silence_ms: u64,
    #[serde(default = "defaults::attempt_timeout_ms")]
    pub attempt_timeout_ms: u64,
    #[serde(default = "defaults::max_hedges")]
    pub max_hedges: u32,
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// A retryable refusal (429, 5xx) is retried on the same provider this
    /// many times (never sooner than its Retry-After) before the job moves
    /// along the route.
    #[serde(default = "defaults::same_provider_retries")]
    pub same_provider_retries: u32,
    #[serde(default = "defaults::backoff_base_ms")]
    pub backoff_base_ms: u64,
    #[serde(default = "defaults::backoff_cap_ms")]
    pub backoff_cap_ms: u64,
    #[serde(default = "defaults::unknown_deadline_ms")]
    pub unknown_deadline_ms: u64,
    /// Streamed attempts: once a stream has started, the longest silence
    /// between two chunks; then the stream counts as broken (`unknown`).
    #[serde(default = "defaults::stall_ms")]
    pub stall_ms: u64,
    /// Streamed attempts: the longest a whole stream may run. A streamed
    /// attempt's first piece must come within `attempt_timeout_ms`; after
    /// that only `stall_ms` and this bound it, so a healthy long generation
    /// is never cut at `attempt_timeout_ms`.
    #[serde(default = "defaults::stream_timeout_ms")]
    pub stream_timeout_ms: u64,
    /// Streamed jobs: when a client's stream ended with an error, whether the
    /// job goes on in the background (and may run, and bill, another
    /// attempt). Off: a job whose client was told "error" is not run again;
    /// attempts already in flight settle normally (a late success still wins).
    #[serde(default)]
    pub complete_after_stream_error: bool,
    /// How the hedge's silence threshold is chosen: `fixed` (`silence_ms`)
    /// or `auto` (learned per provider; see `docs/hedging.md`).
    #[serde(default)]
    pub silence: SilenceMode,
    /// `auto`: the quantile of the provider's time to first token (or to
    /// answer) that the hedge waits for.
    #[serde(default = "defaults::hedge_quantile")]
    pub hedge_quantile: f64,
    /// `auto`: the learned threshold is clamped to at least this
    /// [default: 50].
    #[serde(default)]
    pub silence_min_ms: Option<u64>,
    /// `auto`: ... and to at most this [default: `silence_ms`].
    #[serde(default)]
    pub silence_max_ms: Option<u64>,
    /// Over `hedge_window_ms`, hedges may not exceed this share of the
    /// route's jobs [default: 5 with `silence = "auto"`, no budget with a
    /// fixed silence].
    #[serde(default)]
    pub hedge_budget_percent: Option<f64>,
    /// The budget's sliding window; the learned estimate forgets at the
    /// same pace (a sample's weight halves every quarter window).
    #[serde(default = "defaults::hedge_window_ms")]
    pub hedge_window_ms: u64,
}

/// The hedging settings of a route, read by the engine's policy
/// ([`HedgePolicy`]): here, so the domain's hedging math imports no config.
impl RouteConfig {
    /// What this route says about hedging, with its defaults resolved.
    pub fn hedge_policy(&self) -> HedgePolicy {
        let route = self;
        let auto = route.silence == SilenceMode::Auto;
        HedgePolicy {
            auto,
            quantile: route.hedge_quantile,
            fixed_ms: route.silence_ms,
            min_ms: route
                .silence_min_ms
                .unwrap_or(crate::domain::hedging::DEFAULT_SILENCE_MIN_MS),
            max_ms: route.silence_max_ms.unwrap_or(route.silence_ms),
            budget_percent: route
                .hedge_budget_percent
                .or(auto.then_some(crate::domain::hedging::DEFAULT_BUDGET_PERCENT)),
            window_ms: route.hedge_window_ms.max(1) as i64,
        }
    }

    /// The settings' own rules, for `onejob serve --validate` and start-up.
    pub fn check_hedging(&self) -> Result<(), String> {
        let route = self;
        let auto = route.silence == SilenceMode::Auto;
        if !(0.5..=0.999).contains(&route.hedge_quantile) {
            return Err(format!(
                "hedge_quantile ({}) must be between 0.5 and 0.999",
                route.hedge_quantile
            ));
        }
        if let Some(b) = route.hedge_budget_percent {
            if !(0.0..=100.0).contains(&b) {
                return Err(format!(
                    "hedge_budget_percent ({b}) must be between 0 and 100"
                ));
            }
        }
        if route.hedge_window_ms < 1_000 {
            return Err(format!(
                "hedge_window_ms ({}) must be at least 1000",
                route.hedge_window_ms
            ));
        }
        if !auto {
            for (name, set) in [
                ("silence_min_ms", route.silence_min_ms.is_some()),
                ("silence_max_ms", route.silence_max_ms.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "{name} applies only with silence = \"auto\" (silence is \"fixed\": silence_ms is the threshold)"
                    ));
                }
            }
            return Ok(());
        }
        let policy = route.hedge_policy();
        if policy.min_ms == 0 || policy.min_ms > policy.max_ms {
            return Err(format!(
                "silence_min_ms ({}) must be at least 1 and at most silence_max_ms ({})",
                policy.min_ms, policy.max_ms
            ));
        }
        if route.attempt_timeout_ms <= policy.max_ms {
            return Err(format!(
                "attempt_timeout_ms ({}) must exceed silence_max_ms ({})",
                route.attempt_timeout_ms, policy.max_ms
            ));
        }
        Ok(())
    }
}

/// `silence = "fixed" | "auto"` on a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SilenceMode {
    #[default]
    Fixed,
    Auto,
}

mod defaults {
    pub fn silence_ms() -> u64 {
        10_000
    }
    pub fn attempt_timeout_ms() -> u64 {
        60_000
    }
    pub fn max_hedges() -> u32 {
        1
    }
    pub fn max_attempts() -> u32 {
        4
    }
    pub fn same_provider_retries() -> u32 {
        1
    }
    pub fn backoff_base_ms() -> u64 {
        200
    }
    pub fn backoff_cap_ms() -> u64 {
        10_000
    }
    pub fn unknown_deadline_ms() -> u64 {
        600_000
    }
    pub fn stall_ms() -> u64 {
        10_000
    }
    pub fn stream_timeout_ms() -> u64 {
        600_000
    }
    pub fn hedge_quantile() -> f64 {
        0.95
    }
    pub fn hedge_window_ms() -> u64 {
        300_000
    }
}

/// What the command line (or the environment) overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub database_url: Option<String>,
}

/// Resolved configuration every command uses.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory of the config file; relative paths are resolved against it.
    pub base_dir: PathBuf,
    pub listen: SocketAddr,
    pub database: DatabaseUrl,
    pub max_body_bytes: usize,
    pub header_read_timeout: std::time::Duration,
    pub body_read_timeout: std::time::Duration,
    pub providers_dir: PathBuf,
    pub contracts_dir: PathBuf,
    pub routes: BTreeMap<String, RouteConfig>,
    pub engine: EngineConfig,
    pub idempotency: IdempotencyMode,
    /// See [`IdempotencyMode::Fingerprint`].
    pub fingerprint_window: std::time::Duration,
    /// Async worker threads of `onejob serve`'s runtime (`[server] workers`).
    pub workers: usize,
    pub limits: crate::domain::limits::LimitsConfig,
    /// Set by `onejob demo` and tests that start their own simulator: every
    /// `kind = "sim"` provider talks to this URL instead of its `base_url`.
    pub sim_base_url: Option<String>,
    /// Logs and traces (`[telemetry]`).
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// `[webhooks]`.
    pub webhooks: crate::webhooks::WebhooksConfig,
    /// The key webhook secrets are encrypted with at rest, read from the
    /// variable `[webhooks] secret_key_env` names; `None` when it is unset.
    pub webhook_key: Option<crate::webhooks::secrets::SecretKey>,
}

impl Config {
    /// Each provider a route names that `configured` does not know, as
    /// `routes.NAME.FIELD: …`: the server refuses to start with one (every
    /// job of the route would be accepted and then fail), and `--validate`
    /// lists them.
    pub fn unconfigured_route_providers(&self, configured: impl Fn(&str) -> bool) -> Vec<String> {
        let mut problems = Vec::new();
        for (route_name, route) in &self.routes {
            let fallbacks = route.fallbacks.iter().map(|f| ("fallbacks", f));
            for (field, provider) in std::iter::once(("primary", &route.primary)).chain(fallbacks) {
                if !configured(provider) {
                    problems.push(format!(
                        "routes.{route_name}.{field}: provider {provider:?} is not configured in {}",
                        self.providers_dir.display()
                    ));
                }
            }
        }
        problems
    }

    /// Load `path`. A missing file is an error only when it was asked for by
    /// name; otherwise the built-in defaults apply.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let (file_path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let file = match std::fs::read_to_string(&file_path) {
            Ok(text) => Self::parse_file(&file_path, &text)?,
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => FileConfig {
                server: ServerSection::default(),
                engine: EngineConfig::default(),
                routes: BTreeMap::new(),
                telemetry: Default::default(),
                limits: Default::default(),
                webhooks: Default::default(),
            },
            Err(source) => {
                return Err(ConfigError::Read {
                    path: file_path,
                    source,
                })
            }
        };
        let base_dir = file_path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::resolve(file, base_dir, &file_path, overrides)
    }

    pub fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    fn resolve(
        file: FileConfig,
        base_dir: PathBuf,
        file_path: &Path,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: file_path.to_path_buf(),
            message,
        };
        let not_an_address = |text: &str| format!("{text:?} is not an address like 127.0.0.1:8080");
        let listen: SocketAddr = match (&overrides.listen, file.server.listen) {
            (Some(given), _) => given.parse().map_err(|_| ConfigError::Override {
                given: "--listen (or ONEJOB_LISTEN)",
                message: not_an_address(given),
            })?,
            (None, in_file) => {
                let text = in_file.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
                text.parse()
                    .map_err(|_| invalid(format!("server.listen: {}", not_an_address(&text))))?
            }
        };
        // A path written in the file is relative to the file's folder; one
        // given on the command line (or in the environment) is relative to
        // the working directory, as every other path a shell user types.
        let database = match (&overrides.database_url, file.server.database_url) {
            (Some(url), _) => DatabaseUrl::parse(url)?,
            (None, Some(url)) => match DatabaseUrl::parse(&url)? {
                DatabaseUrl::Sqlite(p) if p.is_relative() => DatabaseUrl::Sqlite(base_dir.join(p)),
                other => other,
            },
            (None, None) => DatabaseUrl::Sqlite(base_dir.join("onejob.db")),
        };
        let workers = match file.server.workers {
            None => default_workers(),
            Some(n) if (1..=MAX_WORKERS).contains(&n) => n,
            Some(n) => {
                return Err(invalid(format!(
                    "server.workers: {n} is not between 1 and {MAX_WORKERS}"
                )))
            }
        };
        let mut routes = file.routes;
        for (name, route) in &routes {
            route
                .check_hedging()
                .map_err(|e| invalid(format!("routes.{name}: {e}")))?;
            if route.attempt_timeout_ms <= route.silence_ms {
                return Err(invalid(format!(
                    "routes.{name}: attempt_timeout_ms ({}) must exceed silence_ms ({})",
                    route.attempt_timeout_ms, route.silence_ms
                )));
            }
            if route.stream_timeout_ms < route.attempt_timeout_ms {
                return Err(invalid(format!(
                    "routes.{name}: stream_timeout_ms ({}) must be at least attempt_timeout_ms ({})",
                    route.stream_timeout_ms, route.attempt_timeout_ms
                )));
            }
            if route.max_attempts == 0 {
                return Err(invalid(format!(
                    "routes.{name}: max_attempts must be at least 1"
                )));
            }
            // A provider named twice is tried once all the same: the
            // second mention is a typo for another provider, or a hedge
            // the operator believes is there and is not.
            let mut named = vec![&route.primary];
            for fallback in &route.fallbacks {
                if named.contains(&fallback) {
                    return Err(invalid(format!(
                        "routes.{name}.fallbacks: provider {fallback:?} is named twice in the route"
                    )));
                }
                named.push(fallback);
            }
            if route.backoff_cap_ms < route.backoff_base_ms {
                return Err(invalid(format!(
                    "routes.{name}: backoff_cap_ms must be at least backoff_base_ms"
                )));
            }
        }
        file.engine.check().map_err(invalid)?;
        file.limits.check().map_err(invalid)?;
        file.webhooks.check().map_err(invalid)?;
        let webhook_key =
            crate::webhooks::secrets::SecretKey::from_env(&file.webhooks.secret_key_env)
                .map_err(invalid)?;
        if routes.is_empty() {
            routes.insert("default".to_string(), RouteConfig::builtin_default());
        }
        Ok(Config {
            base_dir: base_dir.clone(),
            listen,
            database,
            max_body_bytes: file.server.max_body_bytes.unwrap_or(1024 * 1024),
            header_read_timeout: std::time::Duration::from_millis(
                file.server.header_read_timeout_ms.unwrap_or(10_000).max(1),
            ),
            body_read_timeout: std::time::Duration::from_millis(
                file.server.body_read_timeout_ms.unwrap_or(30_000).max(1),
            ),
            providers_dir: base_dir
                .join(file.server.providers_dir.as_deref().unwrap_or("providers")),
            contracts_dir: base_dir
                .join(file.server.contracts_dir.as_deref().unwrap_or("contracts")),
            routes,
            engine: file.engine,
            idempotency: file.server.idempotency.unwrap_or_default(),
            fingerprint_window: std::time::Duration::from_secs(
                file.server.fingerprint_window_s.unwrap_or(300).max(1),
            ),
            workers,
            limits: file.limits,
            sim_base_url: None,
            telemetry: file.telemetry,
            webhooks: file.webhooks,
            webhook_key,
        })
    }
}

impl RouteConfig {
    /// The route used when the file defines none: the built-in simulator.
    pub fn builtin_default() -> Self {
        RouteConfig {
            primary: "sim".to_string(),
            fallbacks: vec!["sim-backup".to_string()],
            silence_ms: defaults::silence_ms(),
            attempt_timeout_ms: defaults::attempt_timeout_ms(),
            max_hedges: defaults::max_hedges(),
            max_attempts: defaults::max_attempts(),
            same_provider_retries: defaults::same_provider_retries(),
            backoff_base_ms: defaults::backoff_base_ms(),
            backoff_cap_ms: defaults::backoff_cap_ms(),
            unknown_deadline_ms: defaults::unknown_deadline_ms(),
            stall_ms: defaults::stall_ms(),
            stream_timeout_ms: defaults::stream_timeout_ms(),
            complete_after_stream_error: false,
            silence: SilenceMode::Fixed,
            hedge_quantile: defaults::hedge_quantile(),
            silence_min_ms: None,
            silence_max_ms: None,
            hedge_budget_percent: None,
            hedge_window_ms: defaults::hedge_window_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::hedging::{LatencyEstimate, Reading};

    fn route(extra: &str) -> RouteConfig {
        toml::from_str(&format!("primary = \"a\"\n{extra}")).unwrap()
    }

    fn read(e: &LatencyEstimate, now: crate::domain::Millis) -> Reading {
        let mut r = Reading::default();
        r.add(&e.snapshot(now), now);
        r
    }

    #[test]
    fn the_threshold_is_fixed_until_enough_samples_then_learned_and_clamped() {
        let policy = route(
            "silence = \"auto\"\nsilence_ms = 2000\nsilence_min_ms = 100\nsilence_max_ms = 1500\n",
        )
        .hedge_policy();
        assert_eq!(policy.budget_percent, Some(5.0));
        let mut e = LatencyEstimate::new(60_000, 0);
        for _ in 0..29 {
            e.observe(400, 0);
        }
        assert_eq!(policy.threshold_ms(Some(&read(&e, 0))), (2000, false));
        e.observe(400, 0);
        let (ms, learned) = policy.threshold_ms(Some(&read(&e, 0)));
        assert!(learned && (380..=420).contains(&ms), "{ms}");
        let mut slow = LatencyEstimate::new(60_000, 0);
        let mut fast = LatencyEstimate::new(60_000, 0);
        for _ in 0..100 {
            slow.observe(60_000, 0);
            fast.observe(3, 0);
        }
        assert_eq!(policy.threshold_ms(Some(&read(&slow, 0))), (1500, true));
        assert_eq!(policy.threshold_ms(Some(&read(&fast, 0))), (100, true));
        // A fixed silence is never learned, and has no budget unless given.
        let fixed = route("silence_ms = 700\n").hedge_policy();
        assert_eq!(fixed.threshold_ms(Some(&read(&slow, 0))), (700, false));
        assert_eq!(fixed.budget_percent, None);
    }

    #[test]
    fn bad_settings_are_refused_with_their_name() {
        let err = |extra: &str| route(extra).check_hedging().unwrap_err();
        assert!(err("hedge_quantile = 1.5\n").contains("hedge_quantile"));
        assert!(err("hedge_budget_percent = 120\n").contains("hedge_budget_percent"));
        assert!(err("silence_min_ms = 10\n").contains("only with silence = \"auto\""));
        assert!(
            err("silence = \"auto\"\nsilence_min_ms = 900\nsilence_max_ms = 800\n")
                .contains("silence_min_ms")
        );
        assert!(err("silence = \"auto\"\nsilence_max_ms = 90000\n").contains("attempt_timeout_ms"));
        assert!(err("hedge_window_ms = 5\n").contains("hedge_window_ms"));
        assert!(
            toml::from_str::<RouteConfig>("primary = \"a\"\nsilence = \"sometimes\"\n")
                .unwrap_err()
                .to_string()
                .contains("auto")
        );
        route("silence = \"auto\"\n").check_hedging().unwrap();
    }
    use super::*;

    #[test]
    fn an_engine_setting_whose_zero_would_stop_it_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("onejob.toml");
        for name in [
            "poll_interval_ms",
            "reconcile_interval_ms",
            "max_concurrent_jobs",
            "breaker_threshold",
            "breaker_probe_every",
        ] {
            std::fs::write(&path, format!("[engine]\n{name} = 0\n")).unwrap();
            let err = Config::load(Some(&path), &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("engine.{name}")), "{name}: {err}");
        }
        std::fs::write(&path, "[engine]\nmax_concurrent_jobs = 1\n").unwrap();
        Config::load(Some(&path), &Overrides::default()).unwrap();
    }

    #[test]
    fn a_relative_database_path_is_relative_to_where_it_was_written() {
        let file = |db: Option<&str>| {
            let text = match db {
                Some(db) => format!("[server]\ndatabase_url = {db:?}\n"),
                None => String::new(),
            };
            Config::parse_file(Path::new("cfg/onejob.toml"), &text).unwrap()
        };
        let resolve = |db: Option<&str>, flag: Option<&str>| {
            let overrides = Overrides {
                database_url: flag.map(str::to_string),
                ..Overrides::default()
            };
            Config::resolve(
                file(db),
                PathBuf::from("cfg"),
                Path::new("cfg/onejob.toml"),
                &overrides,
            )
            .unwrap()
            .database
        };
        // In the file: next to the file.
        assert_eq!(
            resolve(Some("jobs.db"), None),
            DatabaseUrl::Sqlite("cfg/jobs.db".into())
        );
        // On the command line: where the user stands, not cfg/cfg/….
        assert_eq!(
            resolve(Some("jobs.db"), Some("cfg/u.db")),
            DatabaseUrl::Sqlite("cfg/u.db".into())
        );
        assert_eq!(
            resolve(None, Some("u.db")),
            DatabaseUrl::Sqlite("u.db".into())
        );
        assert_eq!(
            resolve(None, None),
            DatabaseUrl::Sqlite("cfg/onejob.db".into())
        );
    }

    #[test]
    fn workers_default_to_the_cores_but_one_and_a_bad_count_is_refused_by_name() {
        let resolve = |text: &str| {
            let file = Config::parse_file(Path::new("onejob.toml"), text)?;
            Config::resolve(
                file,
                PathBuf::from("."),
                Path::new("onejob.toml"),
                &Overrides::default(),
            )
        };
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(resolve("").unwrap().workers, (cores - 1).max(1));
        assert_eq!(resolve("[server]\nworkers = 3\n").unwrap().workers, 3);
        for bad in ["0", "1025"] {
            let e = resolve(&format!("[server]\nworkers = {bad}\n")).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("server.workers: {bad} is not between 1 and 1024")),
                "{e}"
            );
        }
        let e = resolve("[server]\nworkers = -1\n").unwrap_err();
        assert!(e.to_string().contains("workers"), "{e}");
    }

    #[test]
    fn unknown_field_names_file_and_line() {
        let err = Config::parse_file(Path::new("x.toml"), "[server]\nlisten = \"1\"\nbogus = 1\n")
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("x.toml") && text.contains("bogus") && text.contains("line 3"),
            "{text}"
        );
    }

    #[test]
    fn the_shipped_file_holds_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("onejob.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let file = Config::parse_file(&path, &text).unwrap();
        let config =
            Config::resolve(file, PathBuf::from("."), &path, &Overrides::default()).unwrap();
        assert_eq!(
            config.limits,
            crate::domain::limits::LimitsConfig::default()
        );
        assert_eq!(config.header_read_timeout.as_millis(), 10_000);
        assert_eq!(config.body_read_timeout.as_millis(), 30_000);
        assert_eq!(config.engine, EngineConfig::default());
        assert_eq!(config.webhooks, crate::webhooks::WebhooksConfig::default());
        assert_eq!(
            config.routes.get("default"),
            Some(&RouteConfig::builtin_default()),
            "[routes.default] writes every route default"
        );
        // The commented [limits] example is valid once uncommented.
        let uncommented: String = text
            .lines()
            .skip_while(|l| !l.starts_with("# [limits.default]"))
            .map(|l| {
                l.strip_prefix("# ")
                    .unwrap_or(l)
                    .split("  ")
                    .next()
                    .unwrap_or("")
            })
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let limits: crate::domain::limits::LimitsConfig =
            toml::from_str(&uncommented.replace("[limits.", "[")).unwrap();
        assert_eq!(limits.default.tokens_per_day, Some(5_000_000));
        assert_eq!(
            limits.for_owner(&"acme".into()).tokens_per_day,
            Some(20_000_000)
        );
        limits.check().unwrap();
    }

    /// Why the config file `text` is refused.
    fn refusal(text: &str) -> String {
        let file = Config::parse_file(Path::new("x.toml"), text).unwrap();
        Config::resolve(
            file,
            PathBuf::from("."),
            Path::new("x.toml"),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn a_route_names_each_provider_once() {
        for fallbacks in [r#"["b", "b"]"#, r#"["a"]"#, r#"["b", "a"]"#] {
            let err = refusal(&format!(
                "[routes.r]\nprimary = \"a\"\nfallbacks = {fallbacks}\n"
            ));
            assert!(err.contains("named twice"), "{fallbacks}: {err}");
        }
    }

    #[test]
    fn timeout_must_exceed_silence() {
        let err =
            refusal("[routes.r]\nprimary = \"a\"\nsilence_ms = 100\nattempt_timeout_ms = 100\n");
        assert!(err.contains("attempt_timeout_ms"), "{err}");
    }
}
