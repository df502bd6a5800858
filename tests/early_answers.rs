//! Answers given before the request body was read (401 without a key, 413
//! past the size limit): the client gets the whole answer, with its code,
//! and the connection either stays usable or the answer says
//! `Connection: close`; never a reset instead of the answer, never a
//! connection closed under a client told it could reuse it (the fuzz test
//! failed with `IncompleteMessage` on the request after such an answer).
//!
//! Raw sockets, so the test sees exactly what the server sends and when it
//! closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_app, Backend, TestApp};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one read may wait: a bound on a broken server, not a pause.
const READ_LIMIT: Duration = Duration::from_secs(20);

struct Answer {
    status: u16,
    /// Header lines, names lowercased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    fn code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// One answer (with a `Content-Length`) from `stream`; `pending` holds bytes
/// read past it. An error names what broke: a reset, or the end of stream.
async fn read_answer(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Result<Answer, String> {
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match tokio::time::timeout(READ_LIMIT, stream.read(&mut buf)).await {
            Err(_) => return Err("no answer in time".into()),
            Ok(Err(e)) => return Err(format!("reading the head: {e}")),
            Ok(Ok(0)) => return Err(format!("closed before an answer; got {pending:?}")),
            Ok(Ok(n)) => pending.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {head:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| format!("no content-length in {head:?}"))?;
    while pending.len() < head_end + length {
        match tokio::time::timeout(READ_LIMIT, stream.read(&mut buf)).await {
            Err(_) => return Err("no whole body in time".into()),
            Ok(Err(e)) => return Err(format!("reading the body: {e}")),
            Ok(Ok(0)) => return Err("closed inside the body".into()),
            Ok(Ok(n)) => pending.extend_from_slice(&buf[..n]),
        }
    }
    let body = pending[head_end..head_end + length].to_vec();
    pending.drain(..head_end + length);
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn post_jobs(app: &TestApp, key: Option<&str>, body_len: usize) -> Vec<u8> {
    let auth = key.map_or_else(String::new, |k| format!("Authorization: Bearer {k}\r\n"));
    let mut request = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {}\r\n{auth}Idempotency-Key: early\r\n\
         Content-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n",
        app.address.trim_start_matches("http://")
    )
    .into_bytes();
    request.resize(request.len() + body_len, b' ');
    request
}

/// Send `request` whole, read its answer, then, unless the answer said
/// `Connection: close`, ask `/healthz` on the same connection.
async fn answered_and_reusable(app: &TestApp, request: &[u8]) -> Result<Answer, String> {
    let mut stream = TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    // A server that answers and closes early makes this write fail; the
    // answer may still be readable, so read it before judging.
    let wrote = stream.write_all(request).await;
    let mut pending = Vec::new();
    let answer = read_answer(&mut stream, &mut pending)
        .await
        .map_err(|e| format!("{e} (write: {wrote:?})"))?;
    if answer.closes() {
        return Ok(answer);
    }
    wrote.map_err(|e| format!("kept alive, yet the body was refused: {e}"))?;
    let health = format!(
        "GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n",
        app.address.trim_start_matches("http://")
    );
    stream
        .write_all(health.as_bytes())
        .await
        .map_err(|e| format!("kept alive, but the next request cannot be sent: {e}"))?;
    let next = read_answer(&mut stream, &mut pending)
        .await
        .map_err(|e| format!("kept alive, but the next request got no answer: {e}"))?;
    if next.status != 200 {
        return Err(format!("/healthz on the same connection: {}", next.status));
    }
    Ok(answer)
}

/// Half a megabyte refused unread (no key): hyper would read the part it had
/// buffered and close on the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_refused_unread_still_gets_its_answer() {
    let app = spawn_app(Backend::Sqlite).await;
    let request = post_jobs(&app, None, 512 * 1024);
    for i in 0..20 {
        let answer = answered_and_reusable(&app, &request)
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(answer.status, 401, "request {i}");
        assert_eq!(answer.code(), "unauthorized", "request {i}");
        assert!(
            !answer.closes(),
            "request {i}: the body was small enough to read"
        );
    }
    app.stop().await;
}

/// Just past the size limit: the answer is a 413 with its code, and the rest
/// of the body is read, so the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_limit_gets_its_413() {
    let app = spawn_app(Backend::Sqlite).await;
    let request = post_jobs(&app, Some(&app.key), 1024 * 1024 + 512 * 1024);
    for i in 0..10 {
        let answer = answered_and_reusable(&app, &request)
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(answer.status, 413, "request {i}");
        assert_eq!(answer.code(), "payload_too_large", "request {i}");
    }
    app.stop().await;
}

/// A body too large to read and discard: the answer arrives and says
/// `Connection: close`, so no client reuses the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_to_discard_gets_its_answer_and_a_close() {
    let app = spawn_app(Backend::Sqlite).await;
    for i in 0..5 {
        let mut stream = TcpStream::connect(app.address.trim_start_matches("http://"))
            .await
            .unwrap();
        let request = post_jobs(&app, None, 8 * 1024 * 1024);
        let (mut read, mut write) = stream.split();
        // The client writes its body while it reads, as HTTP clients do; the
        // server stops reading at some point, so this write ends in an error.
        let writing = async move {
            let _ = write.write_all(&request).await;
        };
        let reading = async {
            let mut pending = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                if pending.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
                match tokio::time::timeout(READ_LIMIT, read.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => pending.extend_from_slice(&buf[..n]),
                    other => panic!("request {i}: no answer: {other:?}, got {pending:?}"),
                }
            }
            String::from_utf8_lossy(&pending).to_ascii_lowercase()
        };
        let ((), head) = tokio::join!(writing, reading);
        assert!(head.starts_with("http/1.1 401"), "request {i}: {head}");
        assert!(head.contains("connection: close"), "request {i}: {head}");
    }
    app.stop().await;
}
