//! The `onejob` command: parse flags, dispatch to the library.

use clap::{Parser, Subcommand};
use onejob::cli::{self, DbArgs};
use std::path::PathBuf;
use std::process::ExitCode;

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
        job_id: String,
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
        attempt_id: String,
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
    },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// A job with its state, version and result.
    Show {
        #[command(flatten)]
        db: DbArgs,
        id: String,
    },
    /// A job's attempts, oldest first.
    Attempts {
        #[command(flatten)]
        db: DbArgs,
        id: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` sets up logging from its config's [telemetry]; the other
    // commands log as text to stderr.
    let _telemetry = if matches!(cli.command, Command::Serve { .. }) {
        None
    } else {
        onejob::telemetry::init(&Default::default()).ok()
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve {
                db,
                listen,
                validate,
                check_reachable,
            } => cli::serve(&db, listen, validate, check_reachable).await,
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
            Command::Keys {
                command: KeysCommand::Create { db, owner, admin },
            } => cli::create_key(&db, &owner, admin).await,
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
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
