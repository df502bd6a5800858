//! Answers given before the request body was read. Many refusals come
//! before the body is read to its end (401 without a key, 413 once the
//! limit is passed, 408 for a body too slow). hyper then reads the
//! rest of the body only if it is already in its buffer; otherwise it ends
//! keep-alive *after* the answer went out without `Connection: close`, and
//! closes the socket with the unread bytes in it: the kernel sends a reset,
//! a client that reuses the pooled connection gets no answer at all, and one
//! still writing its body may lose the answer it was sent.
//!
//! So every request's body is wrapped; when the handler has answered and let
//! go of a body it did not read to the end, the rest is read and discarded
//! before the answer is sent, so the connection stays usable. That is bounded
//! like reading a body is: at most `max_body_bytes` more, and no later than
//! `body_read_timeout` after the request came in. Past either bound the
//! answer says `Connection: close`, and the accept loop (`serve`) closes
//! with a bounded linger so the answer is not destroyed by a reset.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How much of an unread body is read and discarded before answering.
#[derive(Debug, Clone, Copy)]
pub struct DrainLimits {
    pub max_bytes: usize,
    /// From when the request came in, as for a body that is read.
    pub max_time: Duration,
}

/// The middleware every request passes: it refuses a URL that names
/// nothing ([`super::url_guard`]) before any route reads it, and reads to
/// its end the body the answer left unread.
pub async fn drain_unread_body(limits: DrainLimits, request: Request, next: Next) -> Response {
    let deadline = Instant::now() + limits.max_time;
    let (parts, body) = request.into_parts();
    let (give_back, mut given_back) = oneshot::channel();
    let body = Body::new(Watched {
        inner: Some(body),
        ended: false,
        give_back: Some(give_back),
    });
    let mut response = match super::url_guard::refusal(&parts) {
        Some(refused) => refused,
        None => next.run(Request::from_parts(parts, body)).await,
    };
    // The handler's future has completed, so a body it dropped is back here;
    // one still held (a task reading it) is left to its reader.
    if let Ok(rest) = given_back.try_recv() {
        if !discard(rest, limits.max_bytes, deadline).await {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
    }
    response
}

/// Read and drop `body` to its end; false when it did not end within
/// `max_bytes` and `deadline` (or failed).
async fn discard(mut body: Body, max_bytes: usize, deadline: Instant) -> bool {
    if body.size_hint().lower() > max_bytes as u64 {
        return false;
    }
    let mut left = max_bytes;
    let read = tokio::time::timeout_at(deadline, async {
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    let len = frame.data_ref().map_or(0, Bytes::len);
                    if len > left {
                        return false;
                    }
                    left -= len;
                }
            }
        }
    });
    read.await.unwrap_or(false)
}

/// The request body a handler sees: the real one, handed back when dropped
/// before its end.
struct Watched {
    inner: Option<Body>,
    ended: bool,
    give_back: Option<oneshot::Sender<Body>>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.is_end_stream() {
            return;
        }
        if let (Some(inner), Some(give_back)) = (self.inner.take(), self.give_back.take()) {
            let _ = give_back.send(inner);
        }
    }
}
