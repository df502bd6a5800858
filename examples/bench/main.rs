//! End-to-end benchmark: the simulator (zero latency), a onejob server over a
//! fresh database and the HTTP client, all in this one process. It prints
//! numbers next to the DESIGN.md performance budget; it asserts nothing.
//!
//! ```text
//! cargo run --release --example bench -- [--jobs N] [--concurrency C] [--database-url URL]
//! ```
//!
//! The default database is a temporary SQLite file; a `postgres://` URL gets a
//! fresh database created next to it (dropped at the end); any other value is
//! a SQLite file path (e.g. on tmpfs: `/dev/shm/bench.db`, to take the disk out).
//!
//! `--limits-ab ROUNDS` runs only the comparison of the limits' cost: two
//! owners on one server, one without limits and one with every limit set
//! (high enough never to refuse, so every check runs: rate bucket,
//! concurrent jobs and today's tokens read at admission), in alternating
//! rounds of jobs to completion and of replays, CPU time per request each.
//!
//! `--webhooks-ab ROUNDS` runs only the comparison of webhooks' cost: an
//! owner without a webhook endpoint and one whose every job's end is
//! delivered to a receiver in this process, in alternating rounds of jobs
//! to completion (an "on" round ends when its events are delivered), CPU
//! time per job each (`webhooks_ab.rs`).
//!
//! `--server-bin [LABEL=]PATH` (once or twice) runs the servers as their own
//! processes instead, and reads each one's CPU time from /proc: see
//! `processes.rs`. `--soak SECS --rate R` (with `--server-bin`) watches a
//! server's resident set under a steady load.

mod doors;
mod processes;
mod webhooks_ab;

use doors::Door;

use clap::Parser;
use onejob::app::Application;
use onejob::clock::SystemClock;
use onejob::config::{Config, DatabaseUrl, Overrides};
use onejob::domain::OwnerId;
use onejob::sim::SimServer;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Benchmark onejob end to end against a zero-latency simulator")]
struct Args {
    /// Jobs to run to completion in the throughput phase.
    #[arg(long, default_value_t = 5_000)]
    jobs: usize,
    /// Concurrent clients in the throughput and replay phases.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// A PostgreSQL server to create a fresh database on, or a SQLite file
    /// path (e.g. on tmpfs, to take the disk out); a temporary SQLite file
    /// when absent.
    #[arg(long)]
    database_url: Option<String>,
    /// Sequential jobs in the lone-client phase.
    #[arg(long, default_value_t = 500)]
    lone: usize,
    /// Sequential streamed completions in the time-to-first-token phase.
    #[arg(long, default_value_t = 300)]
    ttft: usize,
    /// Jobs per second in the fixed-rate phase.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// Seconds of the fixed-rate phase.
    #[arg(long, default_value_t = 5)]
    rate_secs: u64,
    /// Seconds of the replay phase.
    #[arg(long, default_value_t = 3)]
    replay_secs: u64,
    /// Only compare an owner without limits and one with every limit set,
    /// in this many alternating rounds of --jobs jobs and as many replays.
    #[arg(long, default_value_t = 0)]
    limits_ab: usize,
    /// Only compare an owner without webhooks and one with a webhook
    /// endpoint (every job's end delivered), in this many alternating
    /// rounds of --jobs jobs.
    #[arg(long, default_value_t = 0)]
    webhooks_ab: usize,
    /// Run `onejob serve` from this binary as a process of its own and
    /// measure it from outside (`LABEL=PATH` or a bare path; give it twice,
    /// old then new, to compare two builds in one run).
    #[arg(long)]
    server_bin: Vec<String>,
    /// With --server-bin: alternating rounds of the phases per server.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// With --server-bin: instead of the phases, drive each server at --rate
    /// jobs/s for this many seconds, printing its resident set.
    #[arg(long, default_value_t = 0)]
    soak: u64,
    /// With --soak: seconds between rows.
    #[arg(long, default_value_t = 30)]
    soak_every: u64,
    /// With --server-bin: the doors to drive, each through its own phases
    /// (jobs to completion, a lone client, replays): `jobs`, `chat`,
    /// `chat-stream`, `responses`, `responses-stream`, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "jobs")]
    doors: Vec<Door>,
    /// With --server-bin: fsyncs of a 4 KiB append timed on this disk, for
    /// the latency targets that are stated in fsyncs.
    #[arg(long, default_value_t = 200)]
    fsyncs: usize,
    /// With --server-bin: the database of one server (`LABEL=URL`), over
    /// --database-url: e.g. the same build on PostgreSQL beside SQLite in
    /// one run (`--server-bin sqlite=BIN --server-bin pg=BIN --server-db
    /// pg=postgres://…`).
    #[arg(long)]
    server_db: Vec<String>,
    /// With --server-bin: a gateway to compare with (`LABEL=COMMAND`,
    /// `{port}` in COMMAND replaced by a free port and `{sim}` by the
    /// simulator's address), started by the bench as a process of its own
    /// and driven through its `/v1/chat/completions` against the same
    /// simulator: its CPU per request and requests/s beside onejob's, in one
    /// run. It is not durable and keeps no job. Give it again for another;
    /// the targets' ratios are to the first.
    #[arg(long)]
    peer: Vec<String>,
    /// A header every request to a peer carries (`NAME=VALUE`, `{sim}` in
    /// VALUE replaced as above), e.g. `x-portkey-provider=openai` and
    /// `x-portkey-custom-host={sim}/v1`.
    #[arg(long)]
    peer_header: Vec<String>,
}

/// The prompt every benchmark job sends.
const MESSAGE: &str = "Summarise order 42 in one line.";

struct Bench {
    client: reqwest::Client,
    door: Door,
    /// The door's URL on the server under test.
    url: String,
    key: String,
    body: Arc<Vec<u8>>,
    /// A peer gateway (`--peer`): its headers, and its answers checked as
    /// plain completions (it keeps no job, so nothing is a replay).
    peer: Option<Arc<Vec<(String, String)>>>,
}

impl Bench {
    fn new(client: reqwest::Client, base: &str, door: Door, key: String) -> anyhow::Result<Bench> {
        Ok(Bench {
            client,
            door,
            url: format!("{base}{}", door.path()),
            key,
            body: Arc::new(door.body()?),
            peer: None,
        })
    }

    /// The same door and body for another owner's key.
    fn with_key(&self, key: String) -> Bench {
        Bench {
            client: self.client.clone(),
            door: self.door,
            url: self.url.clone(),
            key,
            body: self.body.clone(),
            peer: self.peer.clone(),
        }
    }
}

/// How one request went: when it finished, how long it took, whether it was right.
struct Sample {
    done: Instant,
    latency: Duration,
    ok: bool,
}

impl Bench {
    /// One request through the door (`/v1/jobs` with `Prefer: wait=30`);
    /// ok when the door's check passes: a new job (`fresh`) answered as
    /// new, or a replay answered as a replay, either with a finished answer.
    async fn submit(&self, key: &str, fresh: bool) -> bool {
        let mut request = self
            .client
            .post(&self.url)
            .bearer_auth(&self.key)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json");
        if self.door == Door::Jobs {
            request = request.header("Prefer", "wait=30");
        }
        for (name, value) in self.peer.iter().flat_map(|h| h.iter()) {
            request = request.header(name, value);
        }
        let Ok(response) = request.body(self.body.as_ref().clone()).send().await else {
            return false;
        };
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let Ok(bytes) = response.bytes().await else {
            return false;
        };
        if self.peer.is_some() {
            return status.is_success() && Door::Chat.answered(&bytes);
        }
        self.door.check(status, replayed, &bytes, fresh)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The same subscriber as `onejob serve`, so span and event costs count.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if !args.server_bin.is_empty() {
        return processes::run(&args).await;
    }

    let sim = SimServer::start("127.0.0.1:0").await?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("providers"))?;
    std::fs::write(
        dir.path().join("providers/primary.toml"),
        sim.provider_toml("healthy"),
    )?;
    let config_path = dir.path().join("onejob.toml");
    std::fs::write(
        &config_path,
        "[routes.default]\nprimary = \"primary\"\nfallbacks = []\n\n\
         [limits.owners.limited]\nrequests_per_second = 1000000\nburst = 1000000\n\
         concurrent_jobs = 1000000\ntokens_per_day = 1000000000000\n",
    )?;
    let fresh_pg = match args.database_url.as_deref().map(DatabaseUrl::parse) {
        Some(Ok(DatabaseUrl::Postgres(url))) => Some(FreshPostgres::create(&url).await?),
        _ => None,
    };
    let database_url = match (&fresh_pg, &args.database_url) {
        (Some(pg), _) => pg.url.clone(),
        (None, Some(path)) => path.clone(),
        (None, None) => dir.path().join("onejob.db").display().to_string(),
    };
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        database_url: Some(database_url),
    };
    let mut config = Config::load(Some(&config_path), &overrides)?;
    if args.webhooks_ab > 0 {
        config.webhooks.allow_private_networks = true;
        config.webhooks.poll_interval_ms = 50;
        config.webhook_key = Some(onejob::webhooks::secrets::SecretKey::from_bytes(
            rand::random(),
        ));
    }
    let webhook_key = config.webhook_key.clone();
    let webhooks_config = config.webhooks.clone();
    let backend = match &config.database {
        DatabaseUrl::Sqlite(_) => "SQLite (WAL, synchronous=FULL)",
        DatabaseUrl::Postgres(_) => "PostgreSQL",
    };
    let store = onejob::store::connect(&config.database).await?;
    store.migrate().await?;
    let app = Application::with_store(config, store.clone(), Arc::new(SystemClock)).await?;
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "bench", false).await?;

    let message = MESSAGE;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4 * args.concurrency)
        .build()?;
    let bench = Arc::new(Bench::new(client, &base, Door::Jobs, key)?);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "onejob bench: {backend}, {cores} cores shared by simulator, server and client (one process)"
    );
    let mut rss = vec![("start", rss_kib())];

    if args.limits_ab > 0 {
        let limited_key =
            onejob::keys::create_key(store.as_ref(), &SystemClock, "limited", false).await?;
        let limited = Arc::new(bench.with_key(limited_key));
        let sides = [
            ("without limits", bench.clone()),
            ("with every limit", limited),
        ];
        // [side][jobs, replays]: (cpu, requests, failed)
        let mut totals = [[(Duration::ZERO, 0usize, 0usize); 2]; 2];
        for round in 0..args.limits_ab {
            // Alternate which side goes first, so drift on the machine falls on both.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let (_, b) = &sides[side];
                for (phase, fresh) in [(0, true), (1, false)] {
                    let run = Arc::new(AtomicUsize::new(0));
                    let n = args.jobs;
                    let cpu = cpu_time();
                    let samples = closed_loop(b, args.concurrency, move || {
                        let i = run.fetch_add(1, Ordering::Relaxed);
                        (i < n).then(|| (format!("ab-{side}-{round}-{i}"), fresh))
                    })
                    .await;
                    let t = &mut totals[side][phase];
                    t.0 += cpu_time().saturating_sub(cpu);
                    t.1 += samples.len();
                    t.2 += samples.iter().filter(|s| !s.ok).count();
                }
            }
        }
        let _ = stop.send(());
        server.await??;
        if let Some(pg) = fresh_pg {
            pg.drop_database().await;
        }
        println!(
            "limits off vs on: {} rounds of {} jobs and {} replays per side, C={}",
            args.limits_ab, args.jobs, args.jobs, args.concurrency
        );
        let per = |(cpu, n, _): (Duration, usize, usize)| cpu.as_secs_f64() * 1e6 / n.max(1) as f64;
        for (phase, name) in [(0, "jobs to completion"), (1, "replays")] {
            let off = per(totals[0][phase]);
            let on = per(totals[1][phase]);
            println!(
                "  {name:<20} cpu µs/request: {} {off:>8.1}   {} {on:>8.1}   on/off {:.3}   failed {} / {}",
                sides[0].0,
                sides[1].0,
                on / off,
                totals[0][phase].2,
                totals[1][phase].2
            );
        }
        return Ok(());
    }

    if args.webhooks_ab > 0 {
        let receiver = webhooks_ab::receiver().await?;
        let hooked_key =
            onejob::keys::create_key(store.as_ref(), &SystemClock, "hooked", false).await?;
        let hooks = onejob::webhooks::endpoints::Webhooks {
            store: store.as_ref(),
            clock: &SystemClock,
            config: &webhooks_config,
            key: webhook_key.as_ref(),
        };
        hooks
            .create(
                onejob::webhooks::endpoints::Actor {
                    owner_id: &OwnerId::from("hooked"),
                    is_admin: false,
                },
                onejob::webhooks::endpoints::NewEndpoint {
                    url: receiver.url.clone(),
                    events: Some(vec!["job.succeeded".to_string()]),
                    ..Default::default()
                },
            )
            .await?;
        let hooked = Arc::new(bench.with_key(hooked_key));
        let totals = webhooks_ab::run(
            args.webhooks_ab,
            args.jobs,
            args.concurrency,
            bench.clone(),
            hooked,
            &receiver,
        )
        .await;
        let delivered = receiver.received.load(Ordering::Relaxed);
        let _ = stop.send(());
        server.await??;
        if let Some(pg) = fresh_pg {
            pg.drop_database().await;
        }
        let per = |(cpu, n, _): (Duration, usize, usize)| cpu.as_secs_f64() * 1e6 / n.max(1) as f64;
        let (off, on) = (per(totals[0]), per(totals[1]));
        println!(
            "webhooks off vs on: {} rounds of {} jobs per side, C={}; {delivered} events delivered",
            args.webhooks_ab, args.jobs, args.concurrency
        );
        println!(
            "  jobs to completion   cpu µs/job: without webhooks {off:>8.1}   with webhooks {on:>8.1}   on/off {:.3}   failed {} / {}",
            on / off,
            totals[0].2,
            totals[1].2
        );
        return Ok(());
    }

    // 1. Jobs to completion, closed loop.
    let run = Arc::new(AtomicUsize::new(0));
    let (started, cpu) = (Instant::now(), cpu_time());
    let samples = closed_loop(&bench, args.concurrency, {
        let run = run.clone();
        let n = args.jobs;
        move || {
            let i = run.fetch_add(1, Ordering::Relaxed);
            (i < n).then(|| (format!("bench-{i}"), true))
        }
    })
    .await;
    let throughput = Phase::new(&samples, started, cpu);
    rss.push(("after jobs to completion", rss_kib()));

    // 2. A lone client: onejob's added latency, and the simulator alone.
    let cpu = cpu_time();
    let mut lone = Vec::with_capacity(args.lone);
    for i in 0..args.lone {
        let t = Instant::now();
        let ok = bench.submit(&format!("lone-{i}"), true).await;
        lone.push(Sample {
            done: Instant::now(),
            latency: t.elapsed(),
            ok,
        });
    }
    let lone = Phase::new(&lone, Instant::now(), cpu);
    let direct_body = serde_json::to_vec(&json!({
        "model": "healthy",
        "messages": [{ "role": "user", "content": message }],
        "temperature": 0,
        "max_tokens": 64,
    }))?;
    let cpu = cpu_time();
    let mut direct = Vec::with_capacity(args.lone);
    for i in 0..args.lone {
        let t = Instant::now();
        let response = bench
            .client
            .post(format!("{}/v1/chat/completions", sim.base_url()))
            .header("Idempotency-Key", format!("direct-{i}"))
            .header("Content-Type", "application/json")
            .body(direct_body.clone())
            .send()
            .await;
        let ok = match response {
            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
            Err(_) => false,
        };
        direct.push(Sample {
            done: Instant::now(),
            latency: t.elapsed(),
            ok,
        });
    }
    let direct = Phase::new(&direct, Instant::now(), cpu);
    rss.push(("after lone client", rss_kib()));

    // 2b. Time to first token, streamed, through each streaming door
    // (Chat Completions, Anthropic Messages, Responses) and from the
    // simulator directly, in one run: each door's added time to first token.
    let streamed = |model: &str| {
        serde_json::to_vec(&json!({
            "model": model,
            "messages": [{ "role": "user", "content": message }],
            "max_tokens": 64,
            "stream": true,
        }))
    };
    let direct_body = streamed("healthy")?;
    let sim_chat_url = format!("{}/v1/chat/completions", sim.base_url());
    let mut ttft_doors = Vec::new();
    for dialect in [Dialect::Chat, Dialect::Messages, Dialect::Responses] {
        let url = format!("{base}{}", dialect.path());
        let body = dialect.streamed_body(message)?;
        let mut samples = Vec::with_capacity(args.ttft);
        let cpu = cpu_time();
        for i in 0..args.ttft {
            let request = bench
                .client
                .post(&url)
                .bearer_auth(&bench.key)
                .header("anthropic-version", "2023-06-01")
                .header("Idempotency-Key", format!("ttft-{}-{i}", dialect.label()))
                .header("Content-Type", "application/json")
                .body(body.clone());
            samples.push(first_token(request, dialect).await);
        }
        ttft_doors.push((dialect, Phase::new(&samples, Instant::now(), cpu)));
    }
    let mut ttft_direct = Vec::with_capacity(args.ttft);
    let cpu = cpu_time();
    for i in 0..args.ttft {
        let request = bench
            .client
            .post(&sim_chat_url)
            .header("Idempotency-Key", format!("ttft-direct-{i}"))
            .header("Content-Type", "application/json")
            .body(direct_body.clone());
        ttft_direct.push(first_token(request, Dialect::Chat).await);
    }
    let ttft_direct = Phase::new(&ttft_direct, Instant::now(), cpu);

    // 3. Fixed rate, open loop: latency counts from the scheduled send time,
    // so a stall delays (and is charged to) every request scheduled behind it.
    let total = (args.rate * args.rate_secs) as usize;
    let gap = Duration::from_secs_f64(1.0 / args.rate as f64);
    let (started, cpu) = (Instant::now(), cpu_time());
    let mut flights = Vec::with_capacity(total);
    for i in 0..total {
        let due = started + gap.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let bench = bench.clone();
        flights.push(tokio::spawn(async move {
            let ok = bench.submit(&format!("rate-{i}"), true).await;
            Sample {
                done: Instant::now(),
                latency: due.elapsed(),
                ok,
            }
        }));
    }
    let mut fixed = Vec::with_capacity(total);
    for flight in flights {
        fixed.push(flight.await?);
    }
    let fixed = Phase::new(&fixed, started, cpu);
    rss.push(("after fixed rate", rss_kib()));

    // 4. Replays of finished jobs (same key, same body), closed loop.
    let replay_until = Instant::now() + Duration::from_secs(args.replay_secs);
    let run = Arc::new(AtomicUsize::new(0));
    let (started, cpu) = (Instant::now(), cpu_time());
    let replayed = args.jobs.max(1);
    let samples = closed_loop(&bench, args.concurrency, move || {
        let i = run.fetch_add(1, Ordering::Relaxed);
        (Instant::now() < replay_until).then(|| (format!("bench-{}", i % replayed), false))
    })
    .await;
    let replays = Phase::new(&samples, started, cpu);
    rss.push(("after replays", rss_kib()));

    let _ = stop.send(());
    server.await??;
    if let Some(pg) = fresh_pg {
        pg.drop_database().await;
    }

    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}  target",
        "phase", "rate/s", "p50 ms", "p99 ms", "max ms", "failed", "cpu µs"
    );
    throughput.row(
        &format!("jobs to completion (C={})", args.concurrency),
        "≥ 6,000 jobs/s",
    );
    lone.row("lone client, through onejob", "");
    direct.row("lone client, simulator directly", "");
    let added_p99 = lone.p99.saturating_sub(direct.p99);
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}  ≤ 1 ms added p99",
        "  onejob's added latency",
        "",
        ms(lone.p50.saturating_sub(direct.p50)),
        ms(added_p99),
        "",
        "",
        ""
    );
    ttft_direct.row("lone TTFT, simulator directly", "");
    for (dialect, phase) in &ttft_doors {
        phase.row(&format!("lone TTFT via {}", dialect.path()), "");
        println!(
            "{:<34} {:>9} {:>9} {:>9}",
            "  onejob's added TTFT",
            "",
            ms(phase.p50.saturating_sub(ttft_direct.p50)),
            ms(phase.p99.saturating_sub(ttft_direct.p99)),
        );
    }
    fixed.row(
        &format!("fixed rate {}/s for {} s", args.rate, args.rate_secs),
        "≤ 2 ms p99",
    );
    replays.row(
        &format!("idempotent replays (C={})", args.concurrency),
        "≥ 20,000 req/s",
    );
    println!();
    println!("cpu µs: this process's CPU time per request (client, server and simulator together)");
    println!("resident memory (VmRSS; the in-process simulator keeps every answer in its ledger):");
    for (when, kib) in rss {
        println!("  {when:<28} {:>8.1} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

/// A streaming door's dialect, as the time-to-first-token phase reads it.
#[derive(Debug, Clone, Copy)]
enum Dialect {
    Chat,
    Messages,
    Responses,
}

impl Dialect {
    fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Messages => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Messages => "messages",
            Dialect::Responses => "responses",
        }
    }

    /// The same prompt and token limit, streamed, in this dialect.
    fn streamed_body(self, message: &str) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&match self {
            Dialect::Chat | Dialect::Messages => json!({
                "model": "default",
                "messages": [{ "role": "user", "content": message }],
                "max_tokens": 64,
                "stream": true,
            }),
            Dialect::Responses => json!({
                "model": "default",
                "input": message,
                "max_output_tokens": 64,
                "stream": true,
            }),
        })
    }

    /// Whether one event's data carries the first piece of text.
    fn is_text(self, event: &serde_json::Value) -> bool {
        let text = match self {
            Dialect::Chat => &event["choices"][0]["delta"]["content"],
            Dialect::Messages => &event["delta"]["text"],
            Dialect::Responses if event["type"] == "response.output_text.delta" => &event["delta"],
            Dialect::Responses => &serde_json::Value::Null,
        };
        text.as_str().is_some_and(|t| !t.is_empty())
    }

    /// Whether the stream read so far has its dialect's end of a whole answer.
    fn ended(self, seen: &str) -> bool {
        match self {
            Dialect::Chat => seen.contains("data: [DONE]"),
            Dialect::Messages => seen.contains("event: message_stop"),
            Dialect::Responses => seen.contains("event: response.completed"),
        }
    }
}

/// Send a streamed request; the sample's latency is the time to the first
/// event carrying text, and it is ok when the stream ends with its
/// dialect's end of a whole answer.
async fn first_token(request: reqwest::RequestBuilder, dialect: Dialect) -> Sample {
    let started = Instant::now();
    let mut first = None;
    let mut seen = String::new();
    let ok = match request.send().await {
        Ok(mut response) if response.status().is_success() => loop {
            match response.chunk().await {
                Ok(Some(bytes)) => {
                    seen.push_str(&String::from_utf8_lossy(&bytes));
                    if first.is_none() {
                        let has_text = seen.split("\n\n").any(|event| {
                            event
                                .lines()
                                .filter_map(|l| l.strip_prefix("data: "))
                                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                                .any(|e| dialect.is_text(&e))
                        });
                        if has_text {
                            first = Some(started.elapsed());
                        }
                    }
                }
                Ok(None) => break dialect.ended(&seen),
                Err(_) => break false,
            }
        },
        _ => false,
    };
    Sample {
        done: Instant::now(),
        latency: first.unwrap_or_else(|| started.elapsed()),
        ok: ok && first.is_some(),
    }
}

/// Run `concurrency` clients, each taking the next (key, whether it is new)
/// from `next` until it says stop; every request is one sample.
async fn closed_loop(
    bench: &Arc<Bench>,
    concurrency: usize,
    next: impl Fn() -> Option<(String, bool)> + Send + Sync + 'static,
) -> Vec<Sample> {
    let next = Arc::new(next);
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let (bench, next) = (bench.clone(), next.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while let Some((key, fresh)) = next() {
                    let t = Instant::now();
                    let ok = bench.submit(&key, fresh).await;
                    samples.push(Sample {
                        done: Instant::now(),
                        latency: t.elapsed(),
                        ok,
                    });
                }
                samples
            })
        })
        .collect();
    let mut all = Vec::new();
    for client in clients {
        if let Ok(samples) = client.await {
            all.extend(samples);
        }
    }
    all
}

/// A phase's numbers: rate over the wall time from its start to its last answer.
struct Phase {
    rate: f64,
    /// This process's CPU time (all threads: client, server, simulator) per request.
    cpu_per_request: Duration,
    p50: Duration,
    p99: Duration,
    max: Duration,
    failed: usize,
    count: usize,
}

impl Phase {
    fn new(samples: &[Sample], started: Instant, cpu_before: Duration) -> Phase {
        let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
        latencies.sort_unstable();
        let pick = |q: f64| {
            let n = latencies.len();
            if n == 0 {
                return Duration::ZERO;
            }
            latencies[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
        };
        let last = samples.iter().map(|s| s.done).max().unwrap_or(started);
        let wall = last.saturating_duration_since(started).as_secs_f64();
        Phase {
            rate: if wall > 0.0 {
                samples.len() as f64 / wall
            } else {
                0.0
            },
            cpu_per_request: cpu_time()
                .saturating_sub(cpu_before)
                .checked_div(samples.len().max(1) as u32)
                .unwrap_or_default(),
            p50: pick(0.50),
            p99: pick(0.99),
            max: latencies.last().copied().unwrap_or_default(),
            failed: samples.iter().filter(|s| !s.ok).count(),
            count: samples.len(),
        }
    }

    fn row(&self, name: &str, target: &str) {
        let rate = if name.starts_with("lone") {
            String::new()
        } else {
            format!("{:.0}", self.rate)
        };
        println!(
            "{:<34} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8.0}  {target}",
            name,
            rate,
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            format!("{}/{}", self.failed, self.count),
            self.cpu_per_request.as_secs_f64() * 1e6,
        );
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// CPU time this process has used (user + system, all threads).
fn cpu_time() -> Duration {
    proc_cpu("self")
}

/// CPU time process `pid` ("self" for this one) has used (user + system,
/// all threads), from /proc/PID/stat in clock ticks (assumed 100 per second,
/// as on Linux).
fn proc_cpu(pid: &str) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name, which is in parentheses.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The machine's CPU time as `/proc/stat` counts it: (idle, all), in ticks;
/// waiting for I/O counts as busy.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    (ticks.get(3).copied().unwrap_or(0), ticks.iter().sum())
}

/// Waits until the machine is quiet (at least 85% idle over 100 ms) or
/// `cap` has passed, and says how long it waited. What one phase leaves
/// running (a checkpoint, autovacuum, the kernel writing back) otherwise
/// lands in the next server's phase: with servers alternating in a fixed
/// order, always the same server's.
async fn quiet(cap: Duration) -> Duration {
    let started = Instant::now();
    let mut before = machine_ticks();
    while started.elapsed() < cap {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = machine_ticks();
        let (idle, all) = (
            now.0.saturating_sub(before.0),
            now.1.saturating_sub(before.1),
        );
        // No /proc/stat (or no tick in 100 ms): nothing to wait for.
        if all == 0 || idle * 100 >= all * 85 {
            break;
        }
        before = now;
    }
    started.elapsed()
}

/// The CPU time of every PostgreSQL server process on this machine (the
/// postmaster, its backends, WAL writer, checkpointer…), summed: what a
/// phase cost the database when the server under test is on PostgreSQL.
/// A backend that exits within the phase takes its time with it, so the
/// figure is a floor; the server's pool keeps its connections open.
fn postgres_cpu() -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().into_string().ok()?;
            pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            stat.contains("(postgres)").then(|| proc_cpu(&pid))
        })
        .sum()
}

/// This process's resident set, in KiB (0 where /proc is not there).
fn rss_kib() -> u64 {
    proc_rss_kib("self")
}

/// Process `pid`'s resident set, in KiB (0 where /proc is not there).
fn proc_rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A database of its own on the given PostgreSQL server.
struct FreshPostgres {
    admin: String,
    name: String,
    url: String,
}

impl FreshPostgres {
    async fn create(admin: &str) -> anyhow::Result<Self> {
        use sqlx::Connection;
        let name = format!("onejob_bench_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        // A generated identifier of [a-z0-9_]; CREATE DATABASE takes no bind parameters.
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        // The database is the URL's last path segment; its query (such
        // as `?host=/var/run/postgresql`, a Unix socket) is kept.
        let (location, query) = match admin.split_once('?') {
            Some((location, query)) => (location, format!("?{query}")),
            None => (admin, String::new()),
        };
        let base = location.rsplit_once('/').map_or(location, |(b, _)| b);
        Ok(FreshPostgres {
            admin: admin.to_string(),
            url: format!("{base}/{name}{query}"),
            name,
        })
    }

    /// A checkpoint now: the pages a phase left dirty in PostgreSQL's
    /// buffers reach the disk before the next server's phase, not during
    /// it (where its fsyncs and CPU would be charged to that server).
    async fn checkpoint(&self) {
        use sqlx::Connection;
        let done = async {
            let mut conn = sqlx::PgConnection::connect(&self.admin).await?;
            sqlx::query("CHECKPOINT").execute(&mut conn).await?;
            conn.close().await
        };
        if let Err(e) = done.await {
            eprintln!("could not checkpoint {}: {e}", self.name);
        }
    }

    async fn drop_database(self) {
        use sqlx::Connection;
        let dropped = async {
            let mut conn = sqlx::PgConnection::connect(&self.admin).await?;
            sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut conn)
            .await?;
            conn.close().await
        };
        if let Err(e) = dropped.await {
            eprintln!("could not drop the benchmark database {}: {e}", self.name);
        }
    }
}
