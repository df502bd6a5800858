//! A webhook receiver on a real socket: it records every request it gets
//! (headers, body bytes), answers each with the next scripted status (then
//! 200), and reports each on a channel, so tests wait on what arrived
//! instead of sleeping. It also counts requests of one `webhook-id` that
//! overlap in time (a duplicate delivery in flight).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: String,
    /// `type` and `data.id` of the body.
    pub event_type: String,
    pub job_id: String,
}

#[derive(Default)]
struct Shared {
    script: VecDeque<u16>,
    log: Vec<Received>,
    in_flight: HashSet<String>,
    /// Requests that arrived while another of the same id was in flight.
    overlaps: usize,
    concurrent: usize,
    max_concurrent: usize,
}

#[derive(Clone)]
struct Ctx {
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Received>,
    delay: Duration,
    /// When set, each request waits for a permit before it answers.
    gate: Option<Arc<Semaphore>>,
}

pub struct Receiver {
    pub url: String,
    pub port: u16,
    rx: mpsc::UnboundedReceiver<Received>,
    shared: Arc<Mutex<Shared>>,
    gate: Option<Arc<Semaphore>>,
    task: tokio::task::JoinHandle<()>,
}

/// How a receiver behaves.
#[derive(Default, Clone)]
pub struct Behaviour {
    /// Statuses of the first requests, in order; 200 after them.
    pub statuses: Vec<u16>,
    /// How long each request takes to answer.
    pub delay: Duration,
    /// Hold every answer until [`Receiver::release`].
    pub gated: bool,
}

impl Receiver {
    pub async fn start(behaviour: Behaviour) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, behaviour)
    }

    /// On a given port (a receiver that comes up where one was down).
    pub async fn start_on(port: u16, behaviour: Behaviour) -> Receiver {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("port {port} not free yet ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot bind port {port}: {e}"),
            }
        };
        Self::serve(listener, behaviour)
    }

    fn serve(listener: tokio::net::TcpListener, behaviour: Behaviour) -> Receiver {
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Mutex::new(Shared {
            script: behaviour.statuses.into(),
            ..Shared::default()
        }));
        let gate = behaviour.gated.then(|| Arc::new(Semaphore::new(0)));
        let ctx = Ctx {
            shared: shared.clone(),
            tx,
            delay: behaviour.delay,
            gate: gate.clone(),
        };
        let app = Router::new().route("/hook", post(hook)).with_state(ctx);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            rx,
            shared,
            gate,
            task,
        }
    }

    /// The next request, waiting at most 20 s for it.
    pub async fn next(&mut self) -> Received {
        tokio::time::timeout(Duration::from_secs(20), self.rx.recv())
            .await
            .expect("no webhook arrived within 20 s")
            .unwrap()
    }

    /// A request that arrived already, without waiting.
    pub fn try_next(&mut self) -> Option<Received> {
        self.rx.try_recv().ok()
    }

    /// Let `n` held answers go.
    pub fn release(&self, n: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(n);
        }
    }

    /// Every request so far, in arrival order.
    pub fn all(&self) -> Vec<Received> {
        self.shared.lock().unwrap().log.clone()
    }

    /// Requests that arrived while one with the same id was in flight.
    pub fn overlaps(&self) -> usize {
        self.shared.lock().unwrap().overlaps
    }

    /// The most requests in flight at once.
    pub fn max_concurrent(&self) -> usize {
        self.shared.lock().unwrap().max_concurrent
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

async fn hook(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let received = Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: text,
        event_type: parsed["type"].as_str().unwrap_or_default().to_string(),
        job_id: parsed["data"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    let status = {
        let mut s = ctx.shared.lock().unwrap();
        if !s.in_flight.insert(received.id.clone()) {
            s.overlaps += 1;
        }
        s.concurrent += 1;
        s.max_concurrent = s.max_concurrent.max(s.concurrent);
        s.log.push(received.clone());
        s.script.pop_front().unwrap_or(200)
    };
    let _ = ctx.tx.send(received.clone());
    if let Some(gate) = &ctx.gate {
        let _ = gate.acquire().await.map(|p| p.forget());
    }
    if !ctx.delay.is_zero() {
        tokio::time::sleep(ctx.delay).await;
    }
    let mut s = ctx.shared.lock().unwrap();
    s.in_flight.remove(&received.id);
    s.concurrent -= 1;
    StatusCode::from_u16(status).unwrap()
}

/// Verify `deliveries` with the `standardwebhooks` Python library
/// (`tests/python/verify_webhook.py`); one `{"verified", "type"|"error"}`
/// per delivery.
pub async fn verify_with_python(
    python: &std::path::Path,
    secret: &str,
    deliveries: &[Received],
) -> Vec<serde_json::Value> {
    use tokio::io::AsyncWriteExt;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/verify_webhook.py"
    );
    let request = serde_json::json!({
        "secret": secret,
        "deliveries": deliveries.iter().map(|d| serde_json::json!({
            "body": d.body,
            "headers": {
                "webhook-id": d.id,
                "webhook-timestamp": d.timestamp,
                "webhook-signature": d.signature,
            },
        })).collect::<Vec<_>>(),
    });
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(request.to_string().as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "verify_webhook.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
