//! Real `onejob serve` processes with their engine running, over one shared
//! database: a config file written for the test, start, SIGKILL, and SQL
//! read-outs of the whole database (the `Store` trait reads one job at a time).

use super::TestDb;
use onejob::config::DatabaseUrl;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `[routes.default]` and `[engine]` values a process test runs with.
pub struct ServeConfig<'a> {
    pub providers_dir: &'a Path,
    pub primary: &'a str,
    pub fallbacks: &'a [&'a str],
    pub silence_ms: u64,
    pub attempt_timeout_ms: u64,
    pub max_attempts: u32,
    /// `None`: the built-in default.
    pub max_concurrent_jobs: Option<usize>,
    /// `None`: the built-in default (5 s). How long a killed process's jobs
    /// wait, past silence and attempt timeout, before another takes them.
    pub lease_margin_ms: Option<u64>,
}

impl ServeConfig<'_> {
    /// Write `onejob.toml` into `dir`; its path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let fallbacks: Vec<String> = self.fallbacks.iter().map(|f| format!("{f:?}")).collect();
        let mut text = format!(
            "[server]\nproviders_dir = {providers:?}\ncontracts_dir = {contracts:?}\n\n\
             [engine]\npoll_interval_ms = 50\nreconcile_interval_ms = 50\nreconcile_min_age_ms = 0\n",
            providers = self.providers_dir.display().to_string(),
            contracts = dir.join("contracts").display().to_string(),
        );
        if let Some(n) = self.max_concurrent_jobs {
            text.push_str(&format!("max_concurrent_jobs = {n}\n"));
        }
        if let Some(ms) = self.lease_margin_ms {
            text.push_str(&format!("lease_margin_ms = {ms}\n"));
        }
        text.push_str(&format!(
            "\n[routes.default]\nprimary = {primary:?}\nfallbacks = [{fallbacks}]\n\
             silence_ms = {silence}\nattempt_timeout_ms = {timeout}\nmax_hedges = 1\n\
             max_attempts = {attempts}\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n\
             unknown_deadline_ms = 60000\n",
            primary = self.primary,
            fallbacks = fallbacks.join(", "),
            silence = self.silence_ms,
            timeout = self.attempt_timeout_ms,
            attempts = self.max_attempts,
        ));
        let path = dir.join("onejob.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A `onejob` child process that printed `PREFIX http://ADDR` as its first
/// line (`serve`, `sim`); killed (SIGKILL) when dropped.
pub struct Process {
    child: Child,
    pub address: String,
}

impl Process {
    /// Run `onejob ARGS` and wait for its address line. Logs go to stderr at
    /// `ONEJOB_TEST_SERVER_LOG` (default `error`).
    pub fn start(args: &[&str], prefix: &str) -> Process {
        Self::start_with_env(args, prefix, &[])
    }

    /// [`Process::start`] with these variables set for the child.
    pub fn start_with_env(args: &[&str], prefix: &str, envs: &[(&str, &str)]) -> Process {
        let log = std::env::var("ONEJOB_TEST_SERVER_LOG").unwrap_or_else(|_| "error".into());
        let mut child = Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(args)
            .envs(envs.iter().copied())
            .env_remove("ONEJOB_CONFIG")
            .env_remove("ONEJOB_DATABASE_URL")
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let address = line
            .trim()
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
            .to_string();
        // Keep reading so a later line never meets a closed pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Process { child, address }
    }

    /// `onejob serve` on port 0 over the test's database, with `config` or
    /// the built-in defaults.
    pub fn serve(db: &TestDb, config: Option<&Path>) -> Process {
        Self::serve_with_env(db, config, &[])
    }

    /// [`Process::serve`] with these variables set for the child.
    pub fn serve_with_env(db: &TestDb, config: Option<&Path>, envs: &[(&str, &str)]) -> Process {
        let url = db.url_string();
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--database-url", &url];
        let config = config.map(|c| c.display().to_string());
        if let Some(c) = &config {
            args.extend(["--config", c]);
        }
        Process::start_with_env(&args, "onejob listening on ", envs)
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown hook runs, nothing is flushed or released.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rows of `sql` (two columns: a text and a count) over the test's database.
pub async fn count_rows(db: &TestDb, sql: &str) -> BTreeMap<String, i64> {
    use sqlx::Connection;
    let rows: Vec<(String, i64)> = match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query_as(sql).fetch_all(&mut conn).await.unwrap()
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query_as(sql).fetch_all(&mut conn).await.unwrap()
        }
    };
    rows.into_iter().collect()
}

/// Jobs per state.
pub async fn jobs_by_state(db: &TestDb) -> BTreeMap<String, i64> {
    count_rows(db, "SELECT state, COUNT(*) FROM jobs GROUP BY state").await
}

/// Attempts per state.
pub async fn attempts_by_state(db: &TestDb) -> BTreeMap<String, i64> {
    count_rows(db, "SELECT state, COUNT(*) FROM attempts GROUP BY state").await
}

/// Poll `check` over the jobs per state every 100 ms until it holds; panics
/// with the last counts after `limit`.
pub async fn until_jobs(
    db: &TestDb,
    limit: Duration,
    what: &str,
    check: impl Fn(&BTreeMap<String, i64>, &BTreeMap<String, i64>) -> bool,
) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let jobs = jobs_by_state(db).await;
        let attempts = attempts_by_state(db).await;
        if check(&jobs, &attempts) {
            return (jobs, attempts);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not reached within {limit:?}; jobs {jobs:?}, attempts {attempts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn count(map: &BTreeMap<String, i64>, key: &str) -> i64 {
    map.get(key).copied().unwrap_or(0)
}
