//! The `onejob` command: parse flags, dispatch to the library.

use clap::{Parser, Subcommand};
use onejob::cli::{self, DbArgs};
use onejob::domain::{AttemptId, JobId, OwnerId};
use std::path::PathBuf;
use std::process::ExitCode;

/// jemalloc, not the system allocator: it gives memory back after a burst,
/// so a long-running server's resident set levels off (see Cargo.toml).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "onejob",
    version,
    about = "Durable, idempotent, hedged LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server (migrates the database first).
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on [default: 127.0.0.1:8080]
        #[arg(long, env = "ONEJOB_LISTEN")]
        listen: Option<String>,
        /// Check the configuration, provider files, API key variables and
        /// contracts, then exit.
        #[arg(long)]
        validate: bool,
        /// With --validate: also open a TCP connection to each provider.
        #[arg(long, requires = "validate")]
        check_reachable: bool,
    },
    /// Run the simulated provider.
    Sim {
        /// Address to listen on [default: 127.0.0.1:8090]
        #[arg(long)]
        listen: Option<String>,
        /// Behaviour overrides (default_latency, default_behaviour)
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List providers, switch them on or off.
    Providers {
        #[command(subcommand)]
        command: ProvidersCommand,
    },
    /// Play the scenarios against a throwaway server on a temporary SQLite file.
    Demo,
    /// Apply database migrations.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Per-owner limits: request rate, concurrent jobs, tokens per day.
    Limits {
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// Tokens and jobs by owner, day, route, provider and attempt kind.
    Usage {
        #[command(flatten)]
        db: DbArgs,
        /// Only this owner [default: every owner]
        #[arg(long, value_parser = OwnerId::parse_name)]
        owner: Option<OwnerId>,
        /// Days back, today included (1-366)
        #[arg(long, default_value_t = 7,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(onejob::tenants::usage::MAX_DAYS)))]
        days: u32,
    },
    /// Inspect jobs.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// The review queue: jobs waiting for a human.
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// Contract tests: which providers may take a contract's jobs.
    Contracts {
        #[command(subcommand)]
        command: ContractsCommand,
    },
    /// Signed webhook endpoints of every owner, and their deliveries.
    Webhooks {
        #[command(subcommand)]
        command: WebhooksCommand,
    },
}

#[derive(Subcommand)]
enum WebhooksCommand {
    /// Print a fresh key for $ONEJOB_WEBHOOK_KEY (secrets are encrypted with it).
    Keygen,
    /// Register an endpoint; its secret is printed once, alone on the last line.
    Create {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_parser = OwnerId::parse_name)]
        owner: OwnerId,
        /// https://… (http and private addresses only with allow_private_networks)
        #[arg(long)]
        url: String,
        /// An event type to send, repeatable [default: every job.* type]
        #[arg(long = "event")]
        events: Vec<String>,
        #[arg(long)]
        description: Option<String>,
    },
    /// Endpoints with owner, id, state, events and URL (never a secret).
    List {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_parser = OwnerId::parse_name)]
        owner: Option<OwnerId>,
    },
    /// Delete an endpoint and its deliveries.
    Delete {
        #[command(flatten)]
        db: DbArgs,
        id: String,
    },
    /// A new secret (printed once); the old one signs too for the grace period.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        id: String,
    },
    /// An endpoint's deliveries, newest first, with their last try.
    Deliveries {
        #[command(flatten)]
        db: DbArgs,
        id: String,
        /// How many (1-500)
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=500))]
        limit: i64,
    },
    /// Send a delivered or failed delivery again, with the same webhook-id.
    Redeliver {
        #[command(flatten)]
        db: DbArgs,
        endpoint_id: String,
        delivery_id: String,
    },
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// Jobs in review: business key, last error, attempts, last attempt time.
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Decide a job: complete (with --result JSON), retry, or close.
    Resolve {
        #[command(flatten)]
        db: DbArgs,
        job_id: JobId,
        #[arg(long, value_parser = ["complete", "retry", "close"])]
        action: String,
        #[arg(long)]
        result: Option<String>,
        #[arg(long)]
        reason: String,
    },
    /// Settle an unknown attempt: executed (with --result JSON) or not_executed.
    ResolveAttempt {
        #[command(flatten)]
        db: DbArgs,
        attempt_id: AttemptId,
        #[arg(long, value_parser = ["executed", "not_executed"])]
        outcome: String,
        #[arg(long)]
        result: Option<String>,
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum ContractsCommand {
    /// Run contracts against providers, store the runs, print the table;
    /// exits non-zero when any check fails.
    Run {
        #[command(flatten)]
        db: DbArgs,
        /// Only this provider [default: every provider]
        #[arg(long)]
        provider: Option<String>,
        /// Only this contract [default: every contract]
        #[arg(long)]
        contract: Option<String>,
        /// Also write the results as JUnit XML here.
        #[arg(long)]
        junit: Option<std::path::PathBuf>,
        /// Also write the reports as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum ProvidersCommand {
    /// Configured providers with their switch (enabled, by whom, why).
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Let a provider take new attempts again.
    Enable {
        #[command(flatten)]
        db: DbArgs,
        name: String,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: String,
    },
    /// Stop giving a provider new attempts.
    Disable {
        #[command(flatten)]
        db: DbArgs,
        name: String,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: String,
    },
}

/// A key's own limits, in addition to its owner's (both must pass).
#[derive(clap::Args)]
struct KeyLimitFlags {
    /// Sustained job requests per second with this key
    #[arg(long, alias = "rps")]
    requests_per_second: Option<f64>,
    /// Requests at once above the rate [default: the rate]
    #[arg(long)]
    burst: Option<u32>,
    /// Jobs pending or running at once, made with this key
    #[arg(long)]
    concurrent_jobs: Option<u32>,
    /// Prompt + completion tokens per UTC day of this key's jobs
    #[arg(long)]
    tokens_per_day: Option<u64>,
}

impl KeyLimitFlags {
    fn limits(&self) -> onejob::tenants::limits::Limits {
        onejob::tenants::limits::Limits {
            requests_per_second: self.requests_per_second,
            burst: self.burst,
            concurrent_jobs: self.concurrent_jobs,
            tokens_per_day: self.tokens_per_day,
        }
    }
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key; it is printed once, alone on the last line.
    Create {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        owner: String,
        #[arg(long)]
        admin: bool,
        /// Refuse the key after this long, e.g. 90d [default: never]
        #[arg(long)]
        expires_in: Option<String>,
        #[command(flatten)]
        limits: KeyLimitFlags,
    },
    /// Replace a key's own limits (none given: it has none of its own but
    /// its owner's still apply); audited, kept across rotations.
    Limits {
        #[command(flatten)]
        db: DbArgs,
        id: String,
        #[command(flatten)]
        limits: KeyLimitFlags,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: String,
    },
    /// Keys with owner, id, prefix, state, created, last used, expiry, revocation.
    List {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_parser = OwnerId::parse_name)]
        owner: Option<OwnerId>,
    },
    /// Refuse a key from now on (every running server within a second).
    Revoke {
        #[command(flatten)]
        db: DbArgs,
        id: String,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// A new secret for a key; the old one works for --grace, then is refused.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        id: String,
        /// How long the old secret keeps working, e.g. 1h
        #[arg(long, default_value = "24h")]
        grace: String,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
enum LimitsCommand {
    /// The config file's limits and the changes made at run time.
    Show {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Replace an owner's run-time limits (fields not given fall back to the
    /// config file's); audited.
    Set {
        #[command(flatten)]
        db: DbArgs,
        #[arg(value_parser = OwnerId::parse_name)]
        owner: OwnerId,
        #[arg(long, alias = "rps")]
        requests_per_second: Option<f64>,
        #[arg(long)]
        burst: Option<u32>,
        #[arg(long)]
        concurrent_jobs: Option<u32>,
        #[arg(long)]
        tokens_per_day: Option<u64>,
        /// Why (1-500 characters); kept in the audit trail.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// A job with its state, version and result.
    Show {
        #[command(flatten)]
        db: DbArgs,
        id: JobId,
    },
    /// A job's attempts, oldest first.
    Attempts {
        #[command(flatten)]
        db: DbArgs,
        id: JobId,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Serve {
            db,
            listen,
            validate,
            check_reachable,
        } => return serve(&db, listen, validate, check_reachable),
        other => other,
    };
    // The other commands log as text to stderr (`serve` sets up logging
    // from its config's [telemetry]).
    let _telemetry = onejob::telemetry::init(&Default::default()).ok();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            // Returned above: `serve` builds a runtime of its own.
            Command::Serve { .. } => unreachable!("serve runs on its own runtime"),
            Command::Sim { listen, config } => {
                cli::sim::run(listen.as_deref(), config.as_deref()).await
            }
            Command::Providers { command } => match command {
                ProvidersCommand::List { db } => cli::providers::list(&db).await,
                ProvidersCommand::Enable { db, name, reason } => {
                    cli::providers::switch(&db, &name, true, &reason).await
                }
                ProvidersCommand::Disable { db, name, reason } => {
                    cli::providers::switch(&db, &name, false, &reason).await
                }
            },
            Command::Migrate { db } => cli::migrate(&db).await,
            Command::Review { command } => match command {
                ReviewCommand::List { db } => cli::review::list(&db).await,
                ReviewCommand::Resolve {
                    db,
                    job_id,
                    action,
                    result,
                    reason,
                } => {
                    cli::review::resolve_job(&db, &job_id, &action, result.as_deref(), &reason)
                        .await
                }
                ReviewCommand::ResolveAttempt {
                    db,
                    attempt_id,
                    outcome,
                    result,
                    reason,
                } => {
                    cli::review::resolve_attempt(
                        &db,
                        &attempt_id,
                        &outcome,
                        result.as_deref(),
                        &reason,
                    )
                    .await
                }
            },
            Command::Demo => onejob::demo::run().await,
            Command::Webhooks { command } => match command {
                WebhooksCommand::Keygen => cli::webhooks::keygen(),
                WebhooksCommand::Create {
                    db,
                    owner,
                    url,
                    events,
                    description,
                } => cli::webhooks::create(&db, &owner, &url, events, description).await,
                WebhooksCommand::List { db, owner } => {
                    cli::webhooks::list(&db, owner.as_ref()).await
                }
                WebhooksCommand::Delete { db, id } => cli::webhooks::delete(&db, &id).await,
                WebhooksCommand::Rotate { db, id } => cli::webhooks::rotate(&db, &id).await,
                WebhooksCommand::Deliveries { db, id, limit } => {
                    cli::webhooks::deliveries(&db, &id, limit).await
                }
                WebhooksCommand::Redeliver {
                    db,
                    endpoint_id,
                    delivery_id,
                } => cli::webhooks::redeliver(&db, &endpoint_id, &delivery_id).await,
            },
            Command::Keys { command } => match command {
                KeysCommand::Create {
                    db,
                    owner,
                    admin,
                    expires_in,
                    limits,
                } => {
                    cli::tenants::create(&db, &owner, admin, expires_in.as_deref(), limits.limits())
                        .await
                }
                KeysCommand::Limits {
                    db,
                    id,
                    limits,
                    reason,
                } => cli::tenants::set_key_limits(&db, &id, limits.limits(), &reason).await,
                KeysCommand::List { db, owner } => cli::tenants::list(&db, owner.as_ref()).await,
                KeysCommand::Revoke { db, id, reason } => {
                    cli::tenants::revoke(&db, &id, reason.as_deref()).await
                }
                KeysCommand::Rotate {
                    db,
                    id,
                    grace,
                    reason,
                } => cli::tenants::rotate(&db, &id, &grace, reason.as_deref()).await,
            },
            Command::Limits { command } => match command {
                LimitsCommand::Show { db } => cli::tenants::show_limits(&db).await,
                LimitsCommand::Set {
                    db,
                    owner,
                    requests_per_second,
                    burst,
                    concurrent_jobs,
                    tokens_per_day,
                    reason,
                } => {
                    let limits = onejob::tenants::limits::Limits {
                        requests_per_second,
                        burst,
                        concurrent_jobs,
                        tokens_per_day,
                    };
                    cli::tenants::set_limits(&db, &owner, limits, &reason).await
                }
            },
            Command::Usage { db, owner, days } => {
                cli::tenants::usage(&db, owner.as_ref(), days).await
            }
            Command::Jobs {
                command: JobsCommand::Show { db, id },
            } => cli::show_job(&db, &id, false).await,
            Command::Jobs {
                command: JobsCommand::Attempts { db, id },
            } => cli::show_job(&db, &id, true).await,
            Command::Contracts {
                command:
                    ContractsCommand::Run {
                        db,
                        provider,
                        contract,
                        junit,
                        json,
                    },
            } => {
                let outputs = cli::ContractRunOutputs { junit, json };
                cli::run_contracts(&db, provider.as_deref(), contract.as_deref(), &outputs).await
            }
        }
    });
    exit_code(result)
}

/// `onejob serve`: the configuration is read first, because its `[server]
/// workers` sizes the runtime the server runs on. Logging is set up from
/// its `[telemetry]` inside.
fn serve(db: &DbArgs, listen: Option<String>, validate: bool, check_reachable: bool) -> ExitCode {
    let result = db.load(listen).and_then(|config| {
        let runtime = cli::serve_runtime(&config)
            .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
        runtime.block_on(cli::serve(config, validate, check_reachable))
    });
    exit_code(result)
}

fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::error_line(&e));
            ExitCode::FAILURE
        }
    }
}
