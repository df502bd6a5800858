//! Gemini's bodies: the answer, the stream's events and the error, written
//! from the simulator's [`Answer`]. The shared wire (`super::super::wire`)
//! calls these; nothing here reads a request.

use crate::sim::ledger::Answer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// The `google.rpc.Code` name Gemini gives an HTTP status.
pub(crate) fn rpc_status(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 | 529 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// An error in Gemini's shape; 529 (Anthropic's overload) is Google's 503.
pub(crate) fn error_body(status: u16, message: &str, retry_delay_s: Option<u64>) -> Response {
    let status = if status == 529 { 503 } else { status };
    let mut error = json!({"code": status, "message": message, "status": rpc_status(status)});
    if let Some(delay) = retry_delay_s {
        error["details"] = json!([{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                   "retryDelay": format!("{delay}s")}]);
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(json!({ "error": error }))).into_response()
}

/// An answer as a `GenerateContentResponse`.
pub(crate) fn response(a: &Answer) -> Value {
    let mut parts = Vec::new();
    if !a.output.is_empty() || a.tool_calls.is_empty() {
        parts.push(json!({"text": a.output}));
    }
    for call in &a.tool_calls {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        let args: Value = serde_json::from_str(arguments).unwrap_or(json!({}));
        parts.push(
            json!({"functionCall": {"id": call["id"], "name": call["function"]["name"],
                                           "args": args}}),
        );
    }
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts},
                        "finishReason": if a.truncated { "MAX_TOKENS" } else { "STOP" },
                        "index": 0}],
        "usageMetadata": usage(a),
        "modelVersion": a.model,
        "responseId": a.id,
    })
}

fn usage(a: &Answer) -> Value {
    json!({"promptTokenCount": a.usage.prompt_tokens,
           "candidatesTokenCount": a.usage.completion_tokens,
           "totalTokenCount": a.usage.total()})
}

/// The stream's events: a piece of text each, the last with the finish
/// reason and the usage. Gemini sends no end marker.
pub(crate) fn frames(a: &Answer) -> Vec<String> {
    let chars: Vec<char> = a.output.chars().collect();
    let mut frames: Vec<String> = chars
        .chunks(16)
        .map(|c| {
            let text: String = c.iter().collect();
            let chunk = json!({"candidates": [{"content": {"role": "model",
                "parts": [{"text": text}]}, "index": 0}], "modelVersion": a.model,
                "responseId": a.id});
            format!("data: {chunk}\r\n\r\n")
        })
        .collect();
    // The last event carries the calls whole (or an empty text), the
    // finish reason and the usage.
    let mut last = response(a);
    let calls: Vec<Value> = last["candidates"][0]["content"]["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|part| part.get("functionCall").is_some())
        .cloned()
        .collect();
    last["candidates"][0]["content"]["parts"] = if calls.is_empty() {
        json!([{"text": ""}])
    } else {
        json!(calls)
    };
    frames.push(format!("data: {last}\r\n\r\n"));
    frames
}
