//! `onejob sim`: the simulated provider as a process of its own.

use crate::app::shutdown_signal;
use crate::sim::{self, ledger::Ledger, SimConfig};
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpListener;

pub const DEFAULT_SIM_LISTEN: &str = "127.0.0.1:8090";

/// Serve the simulator until Ctrl-C or SIGTERM; in-flight requests finish
/// and hanging ones are released first.
pub async fn run(listen: Option<&str>, config: Option<&Path>) -> anyhow::Result<()> {
    let config = match config {
        Some(path) => SimConfig::load(path)?,
        None => SimConfig::default(),
    };
    let listen = listen.unwrap_or(DEFAULT_SIM_LISTEN);
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let stop = shutdown_signal();
    // Scripts (and tests started on port 0) read the address from here.
    println!("onejob sim listening on http://{addr}");
    sim::serve_with_shutdown(
        listener,
        config,
        Arc::new(Ledger::default()),
        Arc::new(sim::Models::default()),
        stop,
    )
    .await?;
    tracing::info!("simulator stopped");
    Ok(())
}
