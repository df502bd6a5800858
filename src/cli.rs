//! What the `onejob` commands do; `main.rs` only parses and dispatches here.

use crate::app::{shutdown_signal, Application};
use crate::clock::SystemClock;
use crate::config::{Config, Overrides};
use crate::domain::JobId;
use crate::http::views::{AttemptView, JobView};
use crate::store::{self, Store};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

pub mod providers;
pub mod review;
pub mod sim;
pub mod tenants;
pub mod validate;
pub mod webhooks;

/// The flags every command that talks to the database takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DbArgs {
    /// Config file [default: ./onejob.toml]
    #[arg(long, env = "ONEJOB_CONFIG")]
    pub config: Option<PathBuf>,
    /// postgres://… or a SQLite file path, relative to the working directory [default: onejob.db beside the config]
    #[arg(long, env = "ONEJOB_DATABASE_URL")]
    pub database_url: Option<String>,
}

impl DbArgs {
    pub fn load(&self, listen: Option<String>) -> anyhow::Result<Config> {
        let overrides = Overrides {
            listen,
            database_url: self.database_url.clone(),
        };
        Ok(Config::load(self.config.as_deref(), &overrides)?)
    }
}

/// Open and migrate the configured store.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store = store::connect(&config.database)
        .await
        .with_context(|| format!("cannot open database {}", config.database))?;
    store
        .migrate()
        .await
        .with_context(|| format!("cannot migrate database {}", config.database))?;
    Ok(store)
}

/// Open and migrate the configured store, which must exist already: for
/// the commands that only read, or that act on something named by its id
/// (which a new database cannot hold). A SQLite path with no file there (a
/// mistyped `--database-url`) is refused, and no empty file is made.
pub async fn open_existing_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    if let store::DatabaseUrl::Sqlite(path) = &config.database {
        if !path.exists() {
            anyhow::bail!(
                "database {}: no such SQLite file; check --database-url (ONEJOB_DATABASE_URL) \
                 or the config's database_url (`onejob migrate` creates a new database)",
                config.database
            );
        }
    }
    open_store(config).await
}

/// `onejob serve`, on a configuration loaded before the runtime started
/// (its `[server] workers` sizes the runtime: see [`serve_runtime`]).
pub async fn serve(config: Config, validate: bool, check_reachable: bool) -> anyhow::Result<()> {
    let _telemetry = crate::telemetry::init(&config.telemetry)?;
    if validate {
        return validate::validate(&config, check_reachable).await;
    }
    let app = Application::build(config.clone()).await?;
    let stop = shutdown_signal();
    tracing::info!(
        address = %app.local_addr(),
        database = %config.database,
        workers = config.workers,
        "onejob serving"
    );
    // Scripts (and tests started on port 0) read the address from here.
    println!("onejob listening on http://{}", app.local_addr());
    app.run_until_stopped(stop).await?;
    tracing::info!("stopped");
    Ok(())
}

/// The runtime `onejob serve` runs on: `[server] workers` async threads
/// (the SQLite writer and the blocking readers have threads of their own).
pub fn serve_runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.workers)
        .enable_all()
        .build()
}

pub async fn migrate(db: &DbArgs) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_store(&config).await?;
    store.close().await;
    println!("migrated {}", config.database);
    Ok(())
}

pub async fn show_job(db: &DbArgs, id: &JobId, attempts: bool) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let result = show_job_in(store.as_ref(), id, attempts).await;
    store.close().await;
    result
}

async fn show_job_in(store: &dyn Store, id: &JobId, attempts: bool) -> anyhow::Result<()> {
    let job = store
        .get_job(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("job {id} not found"))?;
    let text = if attempts {
        let list = store.list_attempts(id).await?;
        let views: Vec<AttemptView> = list.into_iter().map(Into::into).collect();
        serde_json::to_string_pretty(&views)?
    } else {
        serde_json::to_string_pretty(&JobView::new(job))?
    };
    println!("{text}");
    Ok(())
}

/// An error and its causes on one line, as `{:#}` writes them, but each
/// cause only once: many errors already end with their source's message
/// (an I/O error wrapped with its path), and printing the chain as well said
/// "No such file or directory (os error 2): No such file or directory (os
/// error 2)".
pub fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// What `onejob contracts run` writes besides the table on stdout.
#[derive(Debug, Clone, Default)]
pub struct ContractRunOutputs {
    pub junit: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

/// `onejob contracts run`: run the selected contracts against the selected
/// providers, store every run, print the provider × check table, write the
/// JUnit XML / JSON files asked for. Any failed run is an error, so the
/// process exits non-zero (after the table and files are written).
///
/// Everything that can refuse the command is checked before anything is
/// written: the names asked for, the credentials of the providers that will
/// be called (only those: qualifying one provider needs none of the
/// others' secrets), the report paths; only then is the database opened
/// (and, when new, created).
pub async fn run_contracts(
    db: &DbArgs,
    provider: Option<&str>,
    contract: Option<&str>,
    outputs: &ContractRunOutputs,
) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let mut configs = if config.providers_dir.exists() {
        crate::providers::config::load_dir(&config.providers_dir)?
    } else {
        Default::default()
    };
    let contracts = crate::contracts::load_all(&config.contracts_dir)?;
    crate::contracts::check_selection(
        configs.keys().map(String::as_str),
        contracts.keys().map(String::as_str),
        provider,
        contract,
    )?;
    if let Some(name) = provider {
        configs.retain(|n, _| n == name);
    }
    if configs.is_empty() || contracts.is_empty() {
        anyhow::bail!(
            "nothing to run: no providers in {} or no contracts in {}",
            config.providers_dir.display(),
            config.contracts_dir.display()
        );
    }
    // Only the providers this run calls are built, so only their
    // credentials must be set.
    let catalog =
        crate::providers::catalog::Catalog::from_configs(configs, config.sim_base_url.as_deref())?;
    // The report files are opened before any provider is called: a path
    // that cannot be written stops the command before a run is stored.
    // Opened, not truncated: a report from an earlier run stays whole
    // until this run's replaces it (the other path may be the bad one).
    // A file this command made is removed again when the other path
    // refuses it.
    let create = |path: &PathBuf, what: &str| {
        let existed = path.exists();
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(|file| (file, existed))
            .with_context(|| format!("cannot write {what} to {}; nothing was run", path.display()))
    };
    let junit_file = outputs
        .junit
        .as_ref()
        .map(|p| create(p, "JUnit XML"))
        .transpose()?;
    let json_file = outputs.json.as_ref().map(|p| create(p, "JSON")).transpose();
    // A refusal from here on removes the report files this command made.
    let made = |file: &Option<(std::fs::File, bool)>, path: &Option<PathBuf>| {
        file.as_ref()
            .zip(path.as_ref())
            .filter(|((_, existed), _)| !existed)
            .map(|(_, path)| path.clone())
    };
    let discard = |paths: &[Option<PathBuf>]| {
        for path in paths.iter().flatten() {
            let _ = std::fs::remove_file(path);
        }
    };
    let json_file = match json_file {
        Ok(file) => file,
        Err(e) => {
            discard(&[made(&junit_file, &outputs.junit)]);
            return Err(e);
        }
    };
    let store = match open_store(&config).await {
        Ok(store) => store,
        Err(e) => {
            discard(&[
                made(&junit_file, &outputs.junit),
                made(&json_file, &outputs.json),
            ]);
            return Err(e);
        }
    };
    let (junit_file, json_file) = (junit_file.map(|f| f.0), json_file.map(|f| f.0));
    let reports = crate::contracts::run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        provider,
        contract,
        "cli",
    )
    .await;
    store.close().await;
    let reports = reports?;
    print!("{}", crate::contracts::render_table(&reports));
    let passed = reports.iter().all(|r| r.passed);
    use std::io::Write as _;
    let replace = |file: std::fs::File, text: &[u8]| {
        let mut file = file;
        file.set_len(0)?;
        file.write_all(text)
    };
    if let (Some(file), Some(path)) = (junit_file, &outputs.junit) {
        replace(
            file,
            crate::contracts::reports_to_junit_xml(&reports).as_bytes(),
        )
        .with_context(|| format!("cannot write JUnit XML to {}", path.display()))?;
    }
    if let (Some(file), Some(path)) = (json_file, &outputs.json) {
        let json = serde_json::json!({ "passed": passed, "reports": reports });
        replace(file, serde_json::to_string_pretty(&json)?.as_bytes())
            .with_context(|| format!("cannot write JSON to {}", path.display()))?;
    }
    let failed = reports.iter().filter(|r| !r.passed).count();
    if failed > 0 {
        anyhow::bail!("{failed} of {} contract runs failed", reports.len());
    }
    Ok(())
}

#[cfg(test)]
mod error_line_tests {
    use super::error_line;
    use anyhow::Context;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = io.to_string();
        // A cause whose text the line already holds is not said again.
        let error = anyhow::Error::new(io).context(format!("config onejob.toml: {said}"));
        assert_eq!(error_line(&error), format!("config onejob.toml: {said}"));
        // Causes that add something are kept, in order.
        let error: anyhow::Result<()> = Err(anyhow::anyhow!("connection refused"));
        let error = error.context("cannot open the database").unwrap_err();
        assert_eq!(
            error_line(&error),
            "cannot open the database: connection refused"
        );
    }
}
