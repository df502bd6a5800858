//! The floor of a gateway built on onejob's own stack: `POST
//! /v1/chat/completions` forwarded to an upstream and its answer returned as
//! it came. No job, no database, no parse, no replay: only the HTTP that any
//! gateway does, on the runtime shape `onejob serve` has (`[server] workers`
//! async threads, by default one per core but one; axum and hyper with
//! `TCP_NODELAY`; reqwest with a pool of kept connections to the upstream).
//!
//! The bench runs it as a peer beside onejob, so that one run shows how much
//! of a durable job's cost and latency is the HTTP in and out, which no
//! gateway avoids, and how much is what onejob adds for the job:
//!
//! ```sh
//! bench --server-bin new=target/release/onejob --doors jobs,chat \
//!   --peer 'bare=target/release/examples/bare_proxy --port={port} --upstream={sim}'
//! ```

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::Router;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// The port to listen on, on 127.0.0.1.
    #[arg(long)]
    port: u16,
    /// The upstream's base URL; requests go to `{upstream}/v1/chat/completions`.
    #[arg(long)]
    upstream: String,
    /// Async threads, as `[server] workers` (default: one per core but one).
    #[arg(long)]
    workers: Option<usize>,
}

struct Upstream {
    client: reqwest::Client,
    url: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workers = args.workers.unwrap_or_else(onejob::config::default_workers);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let upstream = std::sync::Arc::new(Upstream {
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?,
        url: format!(
            "{}/v1/chat/completions",
            args.upstream.trim_end_matches('/')
        ),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(upstream);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    axum::serve(listener, app).await?;
    Ok(())
}

/// The request's body and its `Authorization` sent on; the upstream's
/// status and body sent back. An upstream that cannot be reached is a 502.
async fn forward(
    State(upstream): State<std::sync::Arc<Upstream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut request = upstream
        .client
        .post(&upstream.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        request = request.header(header::AUTHORIZATION, auth);
    }
    let answer = async {
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok::<_, reqwest::Error>((status, response.bytes().await?))
    };
    match answer.await {
        Ok((status, bytes)) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
