//! One HTTP exchange under the provider's three timeouts.
//!
//! The connect timeout lives in the reqwest client (a connect that times out
//! provably sent nothing). The first-byte timeout bounds the wait for the
//! response headers and the total timeout the whole exchange, body included;
//! both fire after the request may have been sent, so both are `unknown`.

use super::classify::{classify_body_error, classify_send_error, unknown};
use super::config::Timeouts;
use super::AttemptOutcome;
use crate::domain::ErrorKind;
use axum::body::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, StatusCode};
use std::time::{Duration, Instant};

/// A complete answer: status, headers and the whole body.
#[derive(Debug)]
pub struct RawResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub latency: Duration,
}

/// A client for one provider: connect timeout set, redirects not followed
/// (a redirected POST was not executed, and following it would resend it).
pub fn http_client(timeouts: &Timeouts) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(timeouts.connect())
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// Send `request` and read the whole body, or say how it ended otherwise.
pub async fn exchange(
    request: RequestBuilder,
    timeouts: &Timeouts,
) -> Result<RawResponse, AttemptOutcome> {
    let request = crate::telemetry::with_trace_context(request);
    let started = Instant::now();
    let first_byte = timeouts.first_byte();
    let whole = async {
        let response = match tokio::time::timeout(first_byte, request.send()).await {
            Err(_) => {
                return Err(unknown(
                    ErrorKind::Timeout,
                    format!("no response headers within {} ms", first_byte.as_millis()),
                ))
            }
            Ok(Err(e)) => return Err(classify_send_error(&e)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| classify_body_error(status, &e))?;
        Ok(RawResponse {
            status,
            headers,
            body,
            latency: started.elapsed(),
        })
    };
    match tokio::time::timeout(timeouts.total(), whole).await {
        Ok(result) => result,
        Err(_) => Err(unknown(
            ErrorKind::Timeout,
            format!("exchange not complete within {} ms", timeouts.total_ms),
        )),
    }
}
