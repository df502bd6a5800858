//! Console benchmark: bulk-loads N jobs (default 100,000) with their
//! attempts into a database, starts a onejob server over it (engine off, so
//! nothing moves while we measure), logs in to the console and times each
//! page over real HTTP. Prints numbers; asserts nothing.
//!
//! ```text
//! cargo run --release --example console_bench -- [--jobs N] [--rounds R] [--database-url URL]
//! ```
//!
//! The default database is a temporary SQLite file; `--database-url` takes a
//! SQLite path or the URL of an EMPTY PostgreSQL database (it is migrated
//! and filled).

use clap::Parser;
use onejob::app::Application;
use onejob::clock::SystemClock;
use onejob::config::{Config, DatabaseUrl, Overrides};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Time the ops console's pages over a database of many jobs")]
struct Args {
    /// Jobs to load (each with one or two attempts).
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Timed requests per page (after 3 warm-up requests).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// A SQLite path, or an empty PostgreSQL database; a temporary SQLite
    /// file when absent.
    #[arg(long)]
    database_url: Option<String>,
}

const NOW_SLACK_MS: i64 = 60_000;
const SPREAD_MS: i64 = 7 * 24 * 3_600_000;
const STATES: [&str; 5] = [
    "succeeded",
    "failed",
    "needs_review",
    "cancelled",
    "running",
];
const OWNERS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];

/// One job's rows, made up deterministically from its number.
struct Row {
    id: String,
    owner: &'static str,
    key: String,
    route: &'static str,
    state: &'static str,
    created_at: i64,
    hedged: bool,
}

fn row(i: usize, n: usize, now: i64) -> Row {
    // Spread over the last week, newest last; a mix of outcomes.
    let created_at = now - NOW_SLACK_MS - SPREAD_MS + (i as i64 * SPREAD_MS / n as i64);
    let state = match i % 100 {
        0..=84 => STATES[0],
        85..=89 => STATES[1],
        90..=92 => STATES[2],
        93..=94 => STATES[3],
        _ => STATES[4],
    };
    Row {
        id: format!("{created_at:013}-{i:08}"),
        owner: OWNERS[i % OWNERS.len()],
        key: format!("order-{i}"),
        route: if i.is_multiple_of(3) {
            "batch"
        } else {
            "default"
        },
        state,
        created_at,
        hedged: i.is_multiple_of(5),
    }
}

const USAGE: &str = r#"{"prompt_tokens":40,"completion_tokens":60}"#;

/// Multi-row inserts of jobs and attempts, in one transaction per chunk.
macro_rules! load {
    ($db:ty, $conn:expr, $n:expr, $now:expr) => {{
        let conn = $conn;
        let n = $n;
        let mut i = 0;
        while i < n {
            let end = (i + 400).min(n);
            let rows: Vec<Row> = (i..end).map(|k| row(k, n, $now)).collect();
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let mut jobs = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
                 version, result, completed_by, last_error, attempt_count, created_at, updated_at) ",
            );
            jobs.push_values(&rows, |mut b, r| {
                let winner = format!("{}-{}", r.id, if r.hedged { 2 } else { 1 });
                let done = r.state == "succeeded";
                b.push_bind(&r.id)
                    .push_bind(r.owner)
                    .push_bind(&r.key)
                    .push_bind("f")
                    .push_bind(r#"{"messages":[{"role":"user","content":"x"}]}"#)
                    .push_bind(r.route)
                    .push_bind(r.state)
                    .push_bind(i64::from(done))
                    .push_bind(done.then_some("\"ok\""))
                    .push_bind(done.then_some(winner))
                    .push_bind((r.state == "failed" || r.state == "needs_review").then_some("sim: server_error: simulated failure"))
                    .push_bind(if r.hedged { 2i64 } else { 1 })
                    .push_bind(r.created_at)
                    .push_bind(r.created_at + 900);
            });
            jobs.build().execute(&mut *tx).await?;
            let mut attempts = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, \
                 started_at, finished_at, usage) ",
            );
            let mut list = Vec::new();
            for r in &rows {
                let first_state = match (r.state, r.hedged) {
                    ("succeeded", true) => "discarded",
                    ("succeeded", false) => "succeeded",
                    ("running", _) => "unknown",
                    ("cancelled", _) => "cancelled",
                    _ => "failed",
                };
                list.push((format!("{}-1", r.id), r.id.clone(), 1i64, "sim", "primary", first_state, r.created_at + 5, r.created_at + 150 + (r.created_at % 700)));
                if r.hedged {
                    let second = if r.state == "succeeded" { "succeeded" } else { "failed" };
                    list.push((format!("{}-2", r.id), r.id.clone(), 2, "sim-backup", "hedge", second, r.created_at + 105, r.created_at + 140 + (r.created_at % 90)));
                }
            }
            attempts.push_values(&list, |mut b, a| {
                b.push_bind(&a.0)
                    .push_bind(&a.1)
                    .push_bind(a.2)
                    .push_bind(a.3)
                    .push_bind(a.4)
                    .push_bind(a.5)
                    .push_bind(0i64)
                    .push_bind(a.6)
                    .push_bind(a.7)
                    .push_bind(USAGE);
            });
            attempts.build().execute(&mut *tx).await?;
            tx.commit().await?;
            i = end;
        }
    }};
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| dir.path().join("console.db").display().to_string());
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        database_url: Some(database_url),
    };
    let config_path = dir.path().join("onejob.toml");
    std::fs::write(
        &config_path,
        "[engine]\nenabled = false\n\n[routes.default]\nprimary = \"sim\"\nfallbacks = [\"sim-backup\"]\n\n\
         [routes.batch]\nprimary = \"sim\"\nfallbacks = []\n",
    )?;
    let mut config = Config::load(Some(&config_path), &overrides)?;
    config.providers_dir = std::env::current_dir()?.join("providers");
    config.contracts_dir = std::env::current_dir()?.join("contracts");
    let store = onejob::store::connect(&config.database).await?;
    store.migrate().await?;
    let now = onejob::clock::Clock::now_ms(&SystemClock);

    let loading = Instant::now();
    let backend = match &config.database {
        DatabaseUrl::Sqlite(path) => {
            use sqlx::ConnectOptions;
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .connect()
                .await?;
            load!(sqlx::Sqlite, &mut conn, args.jobs, now);
            "SQLite"
        }
        DatabaseUrl::Postgres(url) => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(url).await?;
            load!(sqlx::Postgres, &mut conn, args.jobs, now);
            // What autovacuum does within a minute of a bulk load (its insert
            // threshold): statistics, and the visibility map that lets the
            // console's counts be index-only scans.
            sqlx::query("VACUUM ANALYZE").execute(&mut conn).await?;
            "PostgreSQL"
        }
    };
    println!(
        "console bench: {backend}, {} jobs loaded in {:.1} s",
        store.count_jobs().await?,
        loading.elapsed().as_secs_f64()
    );

    let app = Application::with_store(config, store.clone(), Arc::new(SystemClock)).await?;
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "ops", true).await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let session = log_in(&http, &base, &key).await?;

    let middle = row(args.jobs / 2, args.jobs, now);
    let cursor = format!("{}:{}", middle.created_at, middle.id);
    let pages = [
        ("overview, last 1 h", "/ui/overview?window=1h".to_string()),
        ("overview, last 24 h", "/ui/overview?window=24h".to_string()),
        ("overview, last 7 d", "/ui/overview?window=7d".to_string()),
        ("jobs, newest 50", "/ui/jobs".to_string()),
        (
            "jobs, a page deep in the middle",
            format!("/ui/jobs?before={cursor}"),
        ),
        (
            "jobs, state = needs_review",
            "/ui/jobs?state=needs_review".to_string(),
        ),
        (
            "jobs, provider = sim-backup",
            "/ui/jobs?provider=sim-backup".to_string(),
        ),
        (
            "jobs, owner + route",
            "/ui/jobs?owner=globex&route=batch".to_string(),
        ),
        (
            "jobs, key = \"order-4242\" (a whole key)",
            "/ui/jobs?key=order-4242".to_string(),
        ),
        (
            "jobs, key starts \"order-42\" (1,111)",
            "/ui/jobs?key=order-42".to_string(),
        ),
        (
            "jobs, key starts \"order-\" (every job)",
            "/ui/jobs?key=order-".to_string(),
        ),
        (
            "jobs, a day's range",
            "/ui/jobs?from=2026-01-01T00:00&to=2099-01-01T00:00&state=failed".to_string(),
        ),
        (
            "one job (hedged)",
            format!("/ui/jobs/{}", row(0, args.jobs, now).id),
        ),
        ("review queue", "/ui/review".to_string()),
        ("providers", "/ui/providers".to_string()),
    ];
    println!(
        "{:<36} {:>9} {:>9} {:>9}",
        "page", "p50 ms", "max ms", "bytes"
    );
    for (name, path) in pages {
        let url = format!("{base}{path}");
        let mut times = Vec::with_capacity(args.rounds);
        let mut bytes = 0;
        for round in 0..args.rounds + 3 {
            let started = Instant::now();
            let response = http.get(&url).header("cookie", &session).send().await?;
            let status = response.status();
            let body = response.bytes().await?;
            let took = started.elapsed();
            anyhow::ensure!(status == 200, "{path}: {status}");
            bytes = body.len();
            if round >= 3 {
                times.push(took);
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{name:<36} {:>9.1} {:>9.1} {bytes:>9}",
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1])
        );
    }
    let _ = stop.send(());
    let _ = server.await;
    Ok(())
}

/// The console's login, as a browser does it; the session cookie.
async fn log_in(http: &reqwest::Client, base: &str, key: &str) -> anyhow::Result<String> {
    let form = http.get(format!("{base}/ui/login")).send().await?;
    let login_cookie = form
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("onejob_login_csrf="))
        .and_then(|v| v.split(';').next())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no login cookie"))?;
    let html = form.text().await?;
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .ok_or_else(|| anyhow::anyhow!("no CSRF field"))?
        .to_string();
    let answer = http
        .post(format!("{base}/ui/login"))
        .header("cookie", login_cookie)
        .form(&[("key", key), ("csrf", csrf.as_str())])
        .send()
        .await?;
    answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("onejob_session="))
        .and_then(|v| v.split(';').next())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("login refused: {}", answer.status()))
}
