//! `--webhooks-ab ROUNDS`: what signed webhooks add to a durable job's CPU.
//! Two owners on one server: "off" has no endpoint, "on" has one endpoint
//! subscribed to `job.succeeded`, pointing at a receiver in this process
//! that answers 200. Rounds of `--jobs` jobs to completion alternate
//! between them; an "on" round ends only when every one of its events has
//! been delivered (claimed, signed, sent, recorded), so the whole cost of
//! a delivery is inside its round's CPU time. The receiver's own CPU (a
//! bare hyper answer) counts on the "on" side too, as the simulator's and
//! the client's count on both.

use super::{closed_loop, cpu_time, Bench};
use axum::routing::post;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Receiver {
    pub url: String,
    pub received: Arc<AtomicUsize>,
}

/// A receiver on a real socket that counts what arrives and answers 200.
pub async fn receiver() -> anyhow::Result<Receiver> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Receiver { url, received })
}

/// Per side: (cpu, jobs, failed jobs).
pub async fn run(
    rounds: usize,
    jobs: usize,
    concurrency: usize,
    off: Arc<Bench>,
    on: Arc<Bench>,
    receiver: &Receiver,
) -> [(Duration, usize, usize); 2] {
    let sides = [off, on];
    let mut totals = [(Duration::ZERO, 0usize, 0usize); 2];
    let mut delivered_before = receiver.received.load(Ordering::Relaxed);
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let run = Arc::new(AtomicUsize::new(0));
            let cpu = cpu_time();
            let samples = closed_loop(&sides[side], concurrency, move || {
                let i = run.fetch_add(1, Ordering::Relaxed);
                (i < jobs).then(|| (format!("wh-ab-{side}-{round}-{i}"), true))
            })
            .await;
            if side == 1 {
                // The round's events, every one delivered (a generous bound;
                // the wait is part of the round, idle time costs no CPU).
                let deadline = Instant::now() + Duration::from_secs(120);
                let want = delivered_before + samples.iter().filter(|s| s.ok).count();
                while receiver.received.load(Ordering::Relaxed) < want && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                delivered_before = receiver.received.load(Ordering::Relaxed);
            }
            let t = &mut totals[side];
            t.0 += cpu_time().saturating_sub(cpu);
            t.1 += samples.len();
            t.2 += samples.iter().filter(|s| !s.ok).count();
        }
    }
    totals
}
