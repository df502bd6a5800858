//! Process mode (`--server-bin`): every server under test is an `onejob
//! serve` process of its own — a binary given by path, so it can be a build
//! of another commit — driven over HTTP from this process, which holds the
//! simulator and the load. Each server's CPU time is read from
//! `/proc/<pid>/stat` before and after each phase, and its resident set from
//! `/proc/<pid>/status`, so those numbers are the server's alone, whatever
//! else the machine runs.
//!
//! With two binaries (old and new) both servers run side by side and the
//! phases alternate between them round by round (old first, then new first),
//! so drift on a shared machine falls on both columns. Before each phase
//! the machine is left to go quiet, and a server on PostgreSQL checkpoints
//! after each of its own, so no phase inherits another's deferred work.
//!
//! `--doors jobs,chat,chat-stream` drives each server through each of those
//! front doors in turn (jobs to completion, a lone client, replays; the
//! doors' order reversed every other round, as the servers' is), and
//! prints each door's figures as ratios measured in the same run: a durable
//! job's server CPU beside a replay's through the same door, and the lone
//! client's added latency beside this disk's fsync p50/p99 (`--fsyncs`).
//! Beside a durable job's CPU it prints the store's commits per job (each a
//! sync of the disk on SQLite), read off the server's `/metrics`, and with
//! the fsync's wait the CPU an append and its fsync take here.
//!
//! `--soak SECS` instead drives each server in turn at `--rate` jobs/s for
//! SECS seconds and prints the server's resident set every `--soak-every`
//! seconds.

use super::{
    closed_loop, ms, postgres_cpu, proc_cpu, proc_rss_kib, quiet, Args, Bench, FreshPostgres,
    Sample,
};
use onejob::config::DatabaseUrl;
use serde_json::json;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// One `onejob serve` process under test and what the load knows of it.
struct Server {
    label: String,
    bin: PathBuf,
    child: Child,
    pid: String,
    /// One load per door of `--doors`, in that order.
    benches: Vec<Arc<Bench>>,
    database: String,
    /// `GET /metrics`, and the client to read it with.
    metrics_url: String,
    client: reqwest::Client,
    /// Kept open: the server may print more than its address.
    _stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    _dir: tempfile::TempDir,
    pg: Option<FreshPostgres>,
}

impl Server {
    async fn start(
        label: &str,
        bin: PathBuf,
        sim_toml: &str,
        database_url: Option<&str>,
        args: &Args,
    ) -> anyhow::Result<Server> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("providers"))?;
        std::fs::write(dir.path().join("providers/primary.toml"), sim_toml)?;
        let config = dir.path().join("onejob.toml");
        std::fs::write(
            &config,
            "[routes.default]\nprimary = \"primary\"\nfallbacks = []\n",
        )?;
        let pg = match database_url.map(DatabaseUrl::parse) {
            Some(Ok(DatabaseUrl::Postgres(url))) => Some(FreshPostgres::create(&url).await?),
            _ => None,
        };
        let database = match (&pg, database_url) {
            (Some(pg), _) => pg.url.clone(),
            // One file per server beside the one named, e.g. /dev/shm/bench-new.db.
            (None, Some(path)) => {
                let path = PathBuf::from(path);
                let stem = path
                    .file_stem()
                    .map_or("bench".into(), |s| s.to_string_lossy());
                let name = format!("{stem}-{label}.db");
                path.with_file_name(name).display().to_string()
            }
            (None, None) => dir.path().join("onejob.db").display().to_string(),
        };
        let config = config.display().to_string();
        let db_flags = ["--config", &config, "--database-url", &database];

        let created = Command::new(&bin)
            .args(["keys", "create", "--owner", "bench"])
            .args(db_flags)
            .stderr(Stdio::inherit())
            .output()
            .await?;
        anyhow::ensure!(
            created.status.success(),
            "{} keys create failed",
            bin.display()
        );
        let key = String::from_utf8(created.stdout)?
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .ok_or_else(|| anyhow::anyhow!("{} keys create printed no key", bin.display()))?;

        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let mut child = Command::new(&bin)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(db_flags)
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the server exited at once"))?
            .to_string();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let address = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(address) = line.strip_prefix("onejob listening on ") {
                    return Ok(address.trim().to_string());
                }
            }
            anyhow::bail!("the server ended before it listened")
        })
        .await
        .map_err(|_| anyhow::anyhow!("the server did not listen within 60 s"))??;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(4 * args.concurrency)
            .build()?;
        let benches = args
            .doors
            .iter()
            .map(|&door| Bench::new(client.clone(), &address, door, key.clone()).map(Arc::new))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Server {
            label: label.to_string(),
            bin,
            child,
            pid,
            benches,
            database,
            metrics_url: format!("{address}/metrics"),
            client,
            _stdout: lines,
            _dir: dir,
            pg,
        })
    }

    fn cpu(&self) -> Duration {
        proc_cpu(&self.pid)
    }

    /// The database server's CPU so far: PostgreSQL's processes, or zero
    /// for SQLite (which runs inside the server and is in `cpu`).
    fn db_cpu(&self) -> Duration {
        if self.pg.is_some() {
            postgres_cpu()
        } else {
            Duration::ZERO
        }
    }

    /// The store's group commits so far and the writes they carried, from
    /// its `/metrics`; `None` from a build that does not count them.
    async fn commits(&self) -> Option<(u64, u64)> {
        let text = self
            .client
            .get(&self.metrics_url)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let read = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map(|v| v as u64)
        };
        Some((
            read("onejob_store_commits_total")?,
            read("onejob_store_commit_writes_total")?,
        ))
    }

    fn rss_mib(&self) -> f64 {
        proc_rss_kib(&self.pid) as f64 / 1024.0
    }

    /// SIGTERM (the server drains and closes its store), SIGKILL after 10 s.
    async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid])
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        if let Some(pg) = self.pg.take() {
            pg.drop_database().await;
        }
    }
}

/// The longest wait for a quiet machine before one phase.
const QUIET_CAP: Duration = Duration::from_secs(5);

/// What a phase added up to over the rounds, for one server.
#[derive(Default)]
struct Tally {
    server_cpu: Duration,
    /// PostgreSQL's own processes over the phase (zero on SQLite).
    db_cpu: Duration,
    /// This process (the load and the simulator) over the phase.
    bench_cpu: Duration,
    wall: f64,
    latencies: Vec<Duration>,
    failed: usize,
    /// The store's group commits over the phase and the writes they
    /// carried, when the server counts them.
    commits: Option<(u64, u64)>,
    /// Each round's server CPU per request (µs) and requests/s: how far
    /// apart the rounds of one server were, beside how far apart the
    /// servers are. A machine's speed drifts over tens of seconds, so a
    /// difference between two servers smaller than their rounds' spread
    /// is not one.
    rounds: Vec<(f64, f64)>,
}

impl Tally {
    fn add(&mut self, samples: &[Sample], started: Instant, server_cpu: Duration) {
        self.server_cpu += server_cpu;
        let last = samples.iter().map(|s| s.done).max().unwrap_or(started);
        let wall = last.saturating_duration_since(started).as_secs_f64();
        self.wall += wall;
        self.latencies.extend(samples.iter().map(|s| s.latency));
        self.failed += samples.iter().filter(|s| !s.ok).count();
        let n = samples.len().max(1) as f64;
        let rate = if wall > 0.0 {
            samples.len() as f64 / wall
        } else {
            0.0
        };
        self.rounds.push((server_cpu.as_secs_f64() * 1e6 / n, rate));
    }

    /// The least and the most of one per-round figure, as `min–max`.
    fn spread(&self, figure: impl Fn(&(f64, f64)) -> f64, unit: &str) -> String {
        let values: Vec<f64> = self.rounds.iter().map(figure).collect();
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if values.is_empty() {
            String::new()
        } else {
            format!("{min:.0}–{max:.0}{unit}")
        }
    }

    fn count(&self) -> usize {
        self.latencies.len()
    }

    fn rate(&self) -> f64 {
        if self.wall > 0.0 {
            self.count() as f64 / self.wall
        } else {
            0.0
        }
    }

    fn cpu_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.count().max(1) as f64
    }

    fn db_cpu_us(&self) -> f64 {
        self.db_cpu.as_secs_f64() * 1e6 / self.count().max(1) as f64
    }

    /// Commits per request, and writes per commit.
    fn commits(&self) -> String {
        match self.commits {
            Some((commits, writes)) if commits > 0 => format!(
                "{:.2} ({:.1})",
                commits as f64 / self.count().max(1) as f64,
                writes as f64 / commits as f64
            ),
            _ => "–".to_string(),
        }
    }

    fn bench_cpu_us(&self) -> f64 {
        self.bench_cpu.as_secs_f64() * 1e6 / self.count().max(1) as f64
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let n = sorted.len();
        if n == 0 {
            return Duration::ZERO;
        }
        sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
    }
}

/// One door's phases, for one server.
#[derive(Default)]
struct DoorTallies {
    jobs: Tally,
    lone: Tally,
    replays: Tally,
}

#[derive(Default)]
struct Tallies {
    /// Per door of `--doors`, in that order.
    doors: Vec<DoorTallies>,
    rss_start: f64,
    rss_end: f64,
}

/// `label=path` or a bare path (labelled by its position: old, new, or #n).
fn parse_bins(specs: &[String]) -> Vec<(String, PathBuf)> {
    let default_label = |i: usize| match (specs.len(), i) {
        (2, 0) => "old".to_string(),
        (2, 1) => "new".to_string(),
        (1, _) => "server".to_string(),
        _ => format!("#{}", i + 1),
    };
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| match spec.split_once('=') {
            Some((label, path)) if !label.contains('/') => (label.to_string(), path.into()),
            _ => (default_label(i), spec.into()),
        })
        .collect()
}

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await?;
    let sim_toml = sim.provider_toml("healthy");
    let mut servers = Vec::new();
    let server_dbs = labelled(&args.server_db)?;
    for (label, bin) in parse_bins(&args.server_bin) {
        let database_url = server_dbs
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, url)| url.as_str())
            .or(args.database_url.as_deref());
        servers.push(Server::start(&label, bin, &sim_toml, database_url, args).await?);
    }
    let mut peers = Vec::with_capacity(args.peer.len());
    for spec in &args.peer {
        peers.push(Peer::start(spec, &args.peer_header, &sim.base_url(), args).await?);
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "onejob bench, process mode: each server its own process, the load and the simulator in \
         this one; {cores} cores"
    );
    for s in &servers {
        let backend = match DatabaseUrl::parse(&s.database) {
            Ok(DatabaseUrl::Postgres(_)) => "PostgreSQL",
            _ => "SQLite (WAL, synchronous=FULL)",
        };
        println!(
            "  {:<8} {} (pid {}, {backend}: {})",
            s.label,
            s.bin.display(),
            s.pid,
            s.database
        );
    }
    for p in &peers {
        println!(
            "  {:<8} {} (pid {}, a gateway that keeps no job)",
            p.label, p.command, p.pid
        );
    }
    if args.soak > 0 {
        for server in servers {
            soak(&server, args).await;
            server.stop().await;
        }
        return Ok(());
    }

    // Warm up each server through each door (tokenizer built on first
    // use, pools filled), then take its resident set as the start.
    let mut tallies: Vec<Tallies> = servers.iter().map(|_| Tallies::default()).collect();
    for (server, tally) in servers.iter().zip(&mut tallies) {
        for (d, bench) in server.benches.iter().enumerate() {
            jobs_phase(bench, &format!("warm-{d}"), 300, args.concurrency).await;
            tally.doors.push(DoorTallies::default());
        }
        tally.rss_start = server.rss_mib();
    }
    let fsync = fsync_probe(servers[0]._dir.path(), args.fsyncs)?;

    let client = reqwest::Client::new();
    let direct_body = serde_json::to_vec(&json!({
        "model": "healthy",
        "messages": [{ "role": "user", "content": super::MESSAGE }],
        "temperature": 0,
        "max_tokens": 64,
    }))?;
    let mut direct = Tally::default();
    let mut peer_tallies: Vec<DoorTallies> = peers.iter().map(|_| DoorTallies::default()).collect();
    for p in &peers {
        jobs_phase(&p.bench, "warm-peer", 300, args.concurrency).await;
    }
    // Before each phase, the machine goes quiet (or QUIET_CAP passes), and
    // a server on PostgreSQL checkpoints after each of its phases.
    let mut settled = Duration::ZERO;
    for round in 0..args.rounds.max(1) {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for &i in &order {
            let (server, tally) = (&servers[i], &mut tallies[i]);
            // The doors alternate too: each door's jobs go into a database
            // the other doors' earlier jobs made larger, so no door always
            // meets the larger one.
            let mut doors: Vec<usize> = (0..server.benches.len()).collect();
            if round % 2 == 1 {
                doors.reverse();
            }
            for d in doors {
                let bench = &server.benches[d];
                settled += quiet(QUIET_CAP).await;
                door_round(
                    server,
                    bench,
                    &mut tally.doors[d],
                    &format!("r{round}-d{d}"),
                    args,
                )
                .await;
                // The checkpoint's work is the phase's own: PostgreSQL's
                // CPU while it runs counts toward the phase's jobs (its
                // wall time does not: a server checkpoints every few
                // minutes, not after each few thousand jobs).
                if let Some(pg) = &server.pg {
                    let db_cpu = server.db_cpu();
                    pg.checkpoint().await;
                    tally.doors[d].jobs.db_cpu += server.db_cpu().saturating_sub(db_cpu);
                }
            }
        }
        for (p, tally) in peers.iter().zip(&mut peer_tallies) {
            settled += quiet(QUIET_CAP).await;
            peer_round(p, tally, &format!("r{round}"), args).await;
        }
        // The upstream alone, for the added latency.
        let started = Instant::now();
        let mut lone = Vec::with_capacity(args.lone);
        for j in 0..args.lone {
            let t = Instant::now();
            let response = client
                .post(format!("{}/v1/chat/completions", sim.base_url()))
                .header("Idempotency-Key", format!("direct-{round}-{j}"))
                .header("Content-Type", "application/json")
                .body(direct_body.clone())
                .send()
                .await;
            let ok = match response {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            };
            lone.push(Sample {
                done: Instant::now(),
                latency: t.elapsed(),
                ok,
            });
        }
        direct.add(&lone, started, Duration::ZERO);
    }
    for (server, tally) in servers.iter().zip(&mut tallies) {
        tally.rss_end = server.rss_mib();
    }
    for server in servers.iter() {
        println!(
            "  {}: server log {}",
            server.label,
            server._dir.path().join("serve.log").display()
        );
    }
    let labels: Vec<String> = servers.iter().map(|s| s.label.clone()).collect();
    // The PostgreSQL target is printed only where it is measured: a first
    // server on SQLite beside one on PostgreSQL.
    let on_postgres: Vec<bool> = servers
        .iter()
        .map(|s| {
            matches!(
                DatabaseUrl::parse(&s.database),
                Ok(DatabaseUrl::Postgres(_))
            )
        })
        .collect();
    // Each server on PostgreSQL beside the same binary on SQLite, when the
    // run has one: the PostgreSQL target compares a build with itself.
    let same_build_on_sqlite: Vec<Option<usize>> = servers
        .iter()
        .zip(&on_postgres)
        .map(|(server, pg)| {
            pg.then(|| {
                servers
                    .iter()
                    .zip(&on_postgres)
                    .position(|(other, other_pg)| !other_pg && other.bin == server.bin)
            })
            .flatten()
        })
        .collect();
    let beside_target = if !on_postgres[0]
        && on_postgres.iter().any(|pg| *pg)
        && same_build_on_sqlite.iter().all(Option::is_none)
    {
        "PostgreSQL beside SQLite: ≥ 75%, ≤ 100%"
    } else {
        ""
    };
    for server in servers {
        server.stop().await;
    }
    let peer_labels: Vec<String> = peers.iter().map(|p| p.label.clone()).collect();
    drop(peers);

    let (d50, d99) = (direct.quantile(0.5), direct.quantile(0.99));
    println!();
    println!(
        "{} round(s), alternating; per server, door and round: {} jobs to completion at C={}, \
         {} lone jobs, {} s of replays at C={}",
        args.rounds.max(1),
        args.jobs,
        args.concurrency,
        args.lone,
        args.replay_secs,
        args.concurrency
    );
    println!(
        "between phases: waited {:.1} s in all for the machine to go quiet (85% idle over 100 ms, \
         at most {} s each){}",
        settled.as_secs_f64(),
        QUIET_CAP.as_secs(),
        if on_postgres.iter().any(|pg| *pg) {
            "; PostgreSQL checkpointed after each of its phases (its CPU counted)"
        } else {
            ""
        }
    );
    println!(
        "this disk: fsync of a 4 KiB append p50 {} / p99 {} ms, {} of CPU for an append and its \
         fsync ({} fsyncs); the simulator alone, one client: p50 {} / p99 {} ms",
        ms(fsync.p50),
        ms(fsync.p99),
        fsync.cpu.map_or("–".to_string(), |cpu| format!(
            "{:.0} µs",
            cpu.as_secs_f64() * 1e6
        )),
        args.fsyncs,
        ms(d50),
        ms(d99),
    );
    print!("{:<46}", "measure");
    for label in &labels {
        print!(" {label:>16}");
    }
    println!("  target");
    let row = |name: &str, cells: Vec<String>, target: &str| {
        print!("{name:<46}");
        for cell in cells {
            print!(" {cell:>16}");
        }
        println!("  {target}");
    };
    let c = args.concurrency;
    let p50_target = 2.0 * fsync.p50.as_secs_f64() * 1e3 + 0.3;
    let p99_target = 2.0 + 2.0 * fsync.p99.as_secs_f64() * 1e3;
    for (d, door) in args.doors.iter().enumerate() {
        let per_door = |f: &dyn Fn(&DoorTallies) -> String| {
            tallies.iter().map(|t| f(&t.doors[d])).collect::<Vec<_>>()
        };
        println!("{}", door.label());
        row(
            &format!("  server CPU per durable job (C={c})"),
            per_door(&|t| format!("{:.0} µs", t.jobs.cpu_us())),
            "",
        );
        if args.rounds > 1 {
            row(
                "    each round's, least–most",
                per_door(&|t| t.jobs.spread(|r| r.0, " µs")),
                "",
            );
        }
        if on_postgres.iter().any(|pg| *pg) {
            row(
                "  PostgreSQL's own CPU per durable job",
                tallies
                    .iter()
                    .zip(&on_postgres)
                    .map(|(t, pg)| match pg {
                        true => format!("{:.0} µs", t.doors[d].jobs.db_cpu_us()),
                        false => "(in server)".to_string(),
                    })
                    .collect(),
                "",
            );
        }
        row(
            "  store commits per durable job (writes per commit)",
            per_door(&|t| t.jobs.commits()),
            "",
        );
        row(
            "  the bench's own CPU per job",
            per_door(&|t| format!("{:.0} µs", t.jobs.bench_cpu_us())),
            "",
        );
        row(
            "  server CPU per replay",
            per_door(&|t| format!("{:.0} µs", t.replays.cpu_us())),
            "",
        );
        row(
            "  durable job ÷ replay, server CPU",
            per_door(&|t| format!("{:.1}×", t.jobs.cpu_us() / t.replays.cpu_us().max(0.001))),
            "≤ 6×",
        );
        row(
            &format!("  durable jobs/s to completion (C={c})"),
            per_door(&|t| format!("{:.0}", t.jobs.rate())),
            "",
        );
        if args.rounds > 1 {
            row(
                "    each round's, least–most",
                per_door(&|t| t.jobs.spread(|r| r.1, "")),
                "",
            );
        }
        row(
            "    p50 / p99 ms",
            tallies
                .iter()
                .map(|t| {
                    let jobs = &t.doors[d].jobs;
                    format!("{} / {}", ms(jobs.quantile(0.5)), ms(jobs.quantile(0.99)))
                })
                .collect(),
            "",
        );
        row(
            "  added latency at one client, p50 / p99 ms",
            tallies
                .iter()
                .map(|t| {
                    let lone = &t.doors[d].lone;
                    let (p50, p99) = (lone.quantile(0.5), lone.quantile(0.99));
                    format!(
                        "{} / {}",
                        ms(p50.saturating_sub(d50)),
                        ms(p99.saturating_sub(d99))
                    )
                })
                .collect(),
            &format!("≤ {p50_target:.2} / ≤ {p99_target:.2} (2 fsyncs + 0.3 / 2 + 2 fsync p99s)"),
        );
        row(
            "    server CPU per lone job",
            per_door(&|t| format!("{:.0} µs", t.lone.cpu_us())),
            "",
        );
        row(
            &format!("  idempotent replays/s (C={c})"),
            per_door(&|t| format!("{:.0}", t.replays.rate())),
            "",
        );
        if labels.len() > 1 {
            let first = &tallies[0].doors[d].jobs;
            row(
                &format!("  durable jobs/s, CPU per job ÷ {}'s", labels[0]),
                per_door(&|t| {
                    format!(
                        "{:.0}%, {:.0}%",
                        100.0 * t.jobs.rate() / first.rate().max(0.001),
                        100.0 * t.jobs.cpu_us() / first.cpu_us().max(0.001)
                    )
                }),
                beside_target,
            );
        }
        if same_build_on_sqlite.iter().any(Option::is_some) {
            row(
                "  on PostgreSQL ÷ the same build on SQLite",
                same_build_on_sqlite
                    .iter()
                    .zip(&tallies)
                    .map(|(sqlite, t)| match sqlite {
                        Some(i) => {
                            let (pg, lite) = (&t.doors[d].jobs, &tallies[*i].doors[d].jobs);
                            format!(
                                "{:.0}%, {:.0}%",
                                100.0 * pg.rate() / lite.rate().max(0.001),
                                100.0 * pg.cpu_us() / lite.cpu_us().max(0.001)
                            )
                        }
                        None => String::new(),
                    })
                    .collect(),
                "jobs/s ≥ 75%, CPU ≤ 100%",
            );
        }
        if let (Some(peer), Some(p)) = (peer_labels.first(), peer_tallies.first()) {
            row(
                &format!("  durable job CPU ÷ {peer}'s per request"),
                per_door(&|t| format!("1/{:.1}", p.jobs.cpu_us() / t.jobs.cpu_us().max(0.001))),
                "≤ 1/8",
            );
            row(
                &format!("  durable jobs/s ÷ {peer}'s requests/s"),
                per_door(&|t| format!("{:.1}×", t.jobs.rate() / p.jobs.rate().max(0.001))),
                "≥ 4×",
            );
        }
        // The other peers are floors (a bare proxy: HTTP in and out, nothing
        // kept): how many of their requests a durable job costs.
        for (peer, p) in peer_labels.iter().zip(&peer_tallies).skip(1) {
            row(
                &format!("  durable job CPU ÷ {peer}'s per request"),
                per_door(&|t| format!("{:.1}×", t.jobs.cpu_us() / p.jobs.cpu_us().max(0.001))),
                "",
            );
        }
        row(
            "  failed (jobs, lone, replays)",
            per_door(&|t| format!("{}/{}/{}", t.jobs.failed, t.lone.failed, t.replays.failed)),
            "0",
        );
    }
    for (peer, p) in peer_labels.iter().zip(&peer_tallies) {
        println!("{peer}, /v1/chat/completions (not durable: no job, no replay)");
        row(
            &format!("  server CPU per request (C={c})"),
            vec![format!("{:.0} µs", p.jobs.cpu_us())],
            "",
        );
        if args.rounds > 1 {
            row(
                "    each round's, least–most",
                vec![p.jobs.spread(|r| r.0, " µs")],
                "",
            );
        }
        row(
            &format!("  requests/s (C={c})"),
            vec![format!("{:.0}", p.jobs.rate())],
            "",
        );
        row(
            "  added latency at one client, p50 / p99 ms",
            vec![format!(
                "{} / {}",
                ms(p.lone.quantile(0.5).saturating_sub(d50)),
                ms(p.lone.quantile(0.99).saturating_sub(d99))
            )],
            "",
        );
        row(
            "    server CPU per lone request",
            vec![format!("{:.0} µs", p.lone.cpu_us())],
            "",
        );
        row(
            "  failed (requests, lone)",
            vec![format!("{}/{}", p.jobs.failed, p.lone.failed)],
            "0",
        );
    }
    row(
        "server resident set, after warm-up → end",
        tallies
            .iter()
            .map(|t| format!("{:.0} → {:.0} MiB", t.rss_start, t.rss_end))
            .collect(),
        "plateau (see --soak)",
    );
    Ok(())
}

/// One round of one door on one server: jobs to completion, a lone client,
/// then replays of the jobs just made, each with the server's CPU time.
async fn door_round(
    server: &Server,
    bench: &Arc<Bench>,
    tally: &mut DoorTallies,
    prefix: &str,
    args: &Args,
) {
    // Read outside the phase's CPU time.
    let commits = server.commits().await;
    let (started, cpu, db_cpu) = (Instant::now(), server.cpu(), server.db_cpu());
    let own = proc_cpu("self");
    let samples = jobs_phase(bench, prefix, args.jobs, args.concurrency).await;
    tally
        .jobs
        .add(&samples, started, server.cpu().saturating_sub(cpu));
    tally.jobs.db_cpu += server.db_cpu().saturating_sub(db_cpu);
    tally.jobs.bench_cpu += proc_cpu("self").saturating_sub(own);
    if let (Some((c0, w0)), Some((c1, w1))) = (commits, server.commits().await) {
        let (c, w) = tally.jobs.commits.unwrap_or_default();
        tally.jobs.commits = Some((c + c1.saturating_sub(c0), w + w1.saturating_sub(w0)));
    }

    let (started, cpu) = (Instant::now(), server.cpu());
    let lone = lone_phase(bench, prefix, args.lone).await;
    tally
        .lone
        .add(&lone, started, server.cpu().saturating_sub(cpu));

    let (started, cpu) = (Instant::now(), server.cpu());
    let until = started + Duration::from_secs(args.replay_secs);
    let run = Arc::new(AtomicUsize::new(0));
    let (jobs, replay_prefix) = (args.jobs.max(1), prefix.to_string());
    let samples = closed_loop(bench, args.concurrency, move || {
        let j = run.fetch_add(1, Ordering::Relaxed);
        (Instant::now() < until).then(|| (format!("{replay_prefix}-{}", j % jobs), false))
    })
    .await;
    tally
        .replays
        .add(&samples, started, server.cpu().saturating_sub(cpu));
}

/// `LABEL=VALUE` pairs.
fn labelled(specs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    specs
        .iter()
        .map(|spec| {
            spec.split_once('=')
                .map(|(l, v)| (l.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("{spec:?}: LABEL=VALUE expected"))
        })
        .collect()
}

/// A gateway to compare with (`--peer`), a process of its own.
struct Peer {
    label: String,
    command: String,
    pid: String,
    bench: Arc<Bench>,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl Peer {
    async fn start(spec: &str, headers: &[String], sim: &str, args: &Args) -> anyhow::Result<Peer> {
        let (label, command) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--peer {spec:?}: LABEL=COMMAND expected"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let command = command
            .replace("{port}", &port.to_string())
            .replace("{sim}", sim);
        let mut words = command.split_whitespace();
        let program = words
            .next()
            .ok_or_else(|| anyhow::anyhow!("--peer {spec:?}: no command"))?;
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("peer.log"))?;
        let child = Command::new(program)
            .args(words)
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the peer exited at once"))?
            .to_string();
        let address = format!("127.0.0.1:{port}");
        let listening = tokio::time::timeout(Duration::from_secs(60), async {
            while tokio::net::TcpStream::connect(&address).await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        listening
            .await
            .map_err(|_| anyhow::anyhow!("the peer did not listen on {address} within 60 s"))?;
        let headers = labelled(headers)?
            .into_iter()
            .map(|(name, value)| (name, value.replace("{sim}", sim)))
            .collect();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(4 * args.concurrency)
            .build()?;
        let mut bench = Bench::new(
            client,
            &format!("http://{address}"),
            super::Door::Chat,
            "sk-bench".into(),
        )?;
        bench.body = Arc::new(serde_json::to_vec(&json!({
            "model": "healthy",
            "messages": [{ "role": "user", "content": super::MESSAGE }],
            "temperature": 0,
            "max_tokens": 64,
        }))?);
        bench.peer = Some(Arc::new(headers));
        Ok(Peer {
            label: label.to_string(),
            command,
            pid,
            bench: Arc::new(bench),
            _child: child,
            _dir: dir,
        })
    }
}

/// One round of the peer: requests at --concurrency, then a lone client.
async fn peer_round(peer: &Peer, tally: &mut DoorTallies, prefix: &str, args: &Args) {
    let (started, cpu) = (Instant::now(), proc_cpu(&peer.pid));
    let samples = jobs_phase(&peer.bench, prefix, args.jobs, args.concurrency).await;
    tally
        .jobs
        .add(&samples, started, proc_cpu(&peer.pid).saturating_sub(cpu));
    let (started, cpu) = (Instant::now(), proc_cpu(&peer.pid));
    let lone = lone_phase(&peer.bench, prefix, args.lone).await;
    tally
        .lone
        .add(&lone, started, proc_cpu(&peer.pid).saturating_sub(cpu));
}

/// What `n` fsyncs of a 4 KiB append to a file in `dir` (the servers' own
/// disk) take: p50 and p99 of the wait, the unit the latency targets are
/// stated in, since a durable job waits for its commit's fsync; and the CPU
/// time of an append and its fsync, which a commit spends too (on a
/// virtual machine, where the disk's doorbell is an exit to the host, it
/// is a part of a job's CPU to reckon with). The CPU is `None` where
/// `/proc/thread-self/schedstat` is not there to read.
struct FsyncProbe {
    p50: Duration,
    p99: Duration,
    cpu: Option<Duration>,
}

fn fsync_probe(dir: &std::path::Path, n: usize) -> anyhow::Result<FsyncProbe> {
    use std::io::Write;
    // Nanoseconds this thread has run: the probe below runs on it alone.
    let thread_cpu = || {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()?
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
    };
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let page = [0x5au8; 4096];
    let n = n.max(1);
    let mut times = Vec::with_capacity(n);
    let cpu_before = thread_cpu();
    for _ in 0..n {
        file.write_all(&page)?;
        let t = Instant::now();
        file.sync_data()?;
        times.push(t.elapsed());
    }
    let cpu = match (cpu_before, thread_cpu()) {
        (Some(before), Some(after)) => Some(Duration::from_nanos(
            after.saturating_sub(before) / n as u64,
        )),
        _ => None,
    };
    drop(file);
    std::fs::remove_file(&path)?;
    times.sort_unstable();
    let at = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    Ok(FsyncProbe {
        p50: at(0.5),
        p99: at(0.99),
        cpu,
    })
}

/// `n` new jobs one after another (one client), keys `{prefix}-lone-{j}`.
async fn lone_phase(bench: &Bench, prefix: &str, n: usize) -> Vec<Sample> {
    let mut lone = Vec::with_capacity(n);
    for j in 0..n {
        let t = Instant::now();
        let ok = bench.submit(&format!("{prefix}-lone-{j}"), true).await;
        lone.push(Sample {
            done: Instant::now(),
            latency: t.elapsed(),
            ok,
        });
    }
    lone
}

/// `n` new jobs to completion at `concurrency`, keys `{prefix}-{i}`.
async fn jobs_phase(bench: &Arc<Bench>, prefix: &str, n: usize, concurrency: usize) -> Vec<Sample> {
    let run = Arc::new(AtomicUsize::new(0));
    let prefix = prefix.to_string();
    closed_loop(bench, concurrency, move || {
        let i = run.fetch_add(1, Ordering::Relaxed);
        (i < n).then(|| (format!("{prefix}-{i}"), true))
    })
    .await
}

/// Most soak jobs in flight at once; past it the load generator skips jobs.
const MAX_IN_FLIGHT: usize = 2_000;

/// Fixed rate, open loop, for `--soak` seconds: a row every `--soak-every`
/// seconds with the server's resident set and its CPU per job meanwhile.
async fn soak(server: &Server, args: &Args) {
    println!();
    println!(
        "soak: {} at {} jobs/s for {} s (a new job each, through {})",
        server.label,
        args.rate,
        args.soak,
        server.benches[0].door.label()
    );
    println!(
        "{:>6} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
        "t s", "jobs", "rate/s", "RSS MiB", "cpu µs", "p99 ms", "failed", "skipped"
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let gap = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let every = Duration::from_secs(args.soak_every.max(1));
    let started = Instant::now();
    let end = started + Duration::from_secs(args.soak);
    let (mut next_report, mut cpu, mut done, mut window_start) =
        (started + every, server.cpu(), 0usize, started);
    let mut rss = vec![(0.0, server.rss_mib())];
    let skipped = Arc::new(AtomicUsize::new(0));
    let mut report = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Sample>, now: Instant| {
        let mut window = Vec::new();
        while let Ok(sample) = rx.try_recv() {
            window.push(sample);
        }
        let mut tally = Tally::default();
        let now_cpu = server.cpu();
        tally.add(&window, window_start, now_cpu.saturating_sub(cpu));
        tally.wall = now.saturating_duration_since(window_start).as_secs_f64();
        done += tally.count();
        let t = now.saturating_duration_since(started).as_secs_f64();
        let mib = server.rss_mib();
        rss.push((t, mib));
        println!(
            "{:>6.0} {:>9} {:>9.0} {:>10.1} {:>9.0} {:>9} {:>8} {:>8}",
            t,
            done,
            tally.rate(),
            mib,
            tally.cpu_us(),
            ms(tally.quantile(0.99)),
            tally.failed,
            skipped.load(Ordering::Relaxed)
        );
        cpu = now_cpu;
        window_start = now;
    };
    let answered = Arc::new(AtomicUsize::new(0));
    let mut i = 0u64;
    loop {
        let due = started + gap.mul_f64(i as f64);
        if due >= end {
            break;
        }
        if due >= next_report {
            report(&mut rx, Instant::now());
            next_report += every;
        }
        tokio::time::sleep_until(due.into()).await;
        i += 1;
        // A server that falls behind must not make the load generator run
        // out of sockets: past the bound a job is not sent, and counted.
        if (i as usize - 1).saturating_sub(answered.load(Ordering::Relaxed)) >= MAX_IN_FLIGHT {
            skipped.fetch_add(1, Ordering::Relaxed);
            answered.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let (bench, tx, answered) = (server.benches[0].clone(), tx.clone(), answered.clone());
        tokio::spawn(async move {
            let ok = bench.submit(&format!("soak-{i}"), true).await;
            answered.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(Sample {
                done: Instant::now(),
                latency: due.elapsed(),
                ok,
            });
        });
    }
    drop(tx);
    // The last answers, then the last row.
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.load(Ordering::Relaxed) < i as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report(&mut rx, Instant::now());
    let half = args.soak as f64 / 2.0;
    let second_half: Vec<f64> = rss
        .iter()
        .filter(|(t, _)| *t >= half)
        .map(|(_, m)| *m)
        .collect();
    if let (Some(first), Some(last)) = (second_half.first(), second_half.last()) {
        println!(
            "{}: resident set over the second half: {first:.1} → {last:.1} MiB ({:+.1} MiB)",
            server.label,
            last - first
        );
    }
}
