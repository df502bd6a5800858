//! The accept loop: HTTP/1.1 over hyper with the timeouts `axum::serve`
//! lacks. A client must send its request headers within
//! `header_read_timeout` (hyper closes the connection otherwise; this also
//! ends keep-alive connections idle that long), so a slowloris client holds
//! a socket for seconds, not forever. Request bodies are bounded by
//! `body_read_timeout` where they are read (`LimitedBody`), and where they
//! are not (`drain`). On shutdown, connections finish the request in flight
//! and close, as with `axum::serve`.
//!
//! A connection closes with a linger: the write side is shut (the client
//! reads the last answer, then end of stream), and what the client still
//! sends is read and discarded until it closes too, or falls silent for
//! `LINGER_IDLE`, for at most `LINGER_BYTES` and `LINGER_TIME`. Closing a
//! socket with unread bytes in it sends a reset, which can destroy the
//! answer before the client has read it (nginx's `lingering_close`). The
//! bounds keep a client from holding the socket.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long, at most, a closing connection waits for its client to close.
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// How long a closing connection waits for more from a silent client.
pub const LINGER_IDLE: Duration = Duration::from_millis(500);
/// How much, at most, a closing connection reads and discards.
pub const LINGER_BYTES: usize = 1024 * 1024;

pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Dropped to tell connections to finish; each holds a `close` receiver
    // until it has, so `closed()` resolves when the last one is done.
    let (stop_tx, stop_rx) = watch::channel(());
    let (close_tx, close_rx) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let mut stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        let close = close_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            // Lent, not given: the stream is needed after hyper is done with it.
            // (No upgrades: nothing here upgrades a connection.)
            let conn = builder.serve_connection(TokioIo::new(&mut stream), service);
            let mut conn = std::pin::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.changed(), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            linger(&mut stream).await;
            drop(close);
        });
    }
    drop(listener);
    drop(stop_rx);
    drop(stop_tx);
    drop(close_rx);
    close_tx.closed().await;
    Ok(())
}

/// Shut the write side, then read and discard until the client closes or
/// falls silent, for at most `LINGER_BYTES` and `LINGER_TIME`.
async fn linger(stream: &mut TcpStream) {
    // Already shut when hyper closed cleanly; an error here changes nothing.
    let _ = stream.shutdown().await;
    let mut left = LINGER_BYTES;
    let mut buf = vec![0u8; 16 * 1024];
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while left > 0 {
            match tokio::time::timeout(LINGER_IDLE, stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    })
    .await;
}
