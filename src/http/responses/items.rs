//! A response's input items as OpenAI lists them: each item in its full
//! shape (a message's string content as an `input_text` part), with an id,
//! in a `list` object.

use super::encode::Stored;
use super::error::ResponsesError;
use crate::domain::Job;
use serde::Deserialize;
use serde_json::{json, Value};

/// `?order=asc|desc&limit=N&after=ID`.
#[derive(Debug, Default, Deserialize)]
pub struct Page {
    order: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// The list object of `job`'s input items.
pub(super) fn list(job: &Job, page: &Page) -> Result<Value, ResponsesError> {
    let stored = Stored::of(job);
    let given = stored
        .echo
        .get("input")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let hex = job.id.replace('-', "");
    let mut items: Vec<Value> = given
        .iter()
        .enumerate()
        .map(|(i, item)| full_item(&hex, i, item))
        .collect();
    match page.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(_) => return Err(ResponsesError::invalid("order", "\"asc\" or \"desc\"")),
    }
    if let Some(after) = &page.after {
        let Some(at) = items.iter().position(|item| item["id"] == after.as_str()) else {
            return Err(ResponsesError::invalid(
                "after",
                "not an item of this response",
            ));
        };
        items.drain(..=at);
    }
    let limit = page.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ResponsesError::invalid("limit", "between 1 and 100"));
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let id_at = |i: Option<&Value>| i.map_or(Value::Null, |item| item["id"].clone());
    Ok(json!({
        "object": "list",
        "data": items,
        "first_id": id_at(items.first()),
        "last_id": id_at(items.last()),
        "has_more": has_more,
    }))
}

/// One input item as given, in its full listed shape.
pub(super) fn full_item(hex: &str, index: usize, item: &Value) -> Value {
    let mut full = item.clone();
    if !full.is_object() {
        return full;
    }
    let kind = item["type"].as_str().unwrap_or("message").to_string();
    full["type"] = json!(kind);
    if !full["id"].is_string() {
        let prefix = match kind.as_str() {
            "function_call" => "fc",
            "function_call_output" => "fco",
            _ => "msg",
        };
        full["id"] = json!(format!("{prefix}_{hex}_in{index}"));
    }
    if !full["status"].is_string() {
        full["status"] = json!("completed");
    }
    if kind == "message" {
        if let Value::String(text) = &item["content"] {
            let part = if item["role"] == "assistant" {
                json!({"type": "output_text", "text": text, "annotations": []})
            } else {
                json!({"type": "input_text", "text": text})
            };
            full["content"] = json!([part]);
        }
    }
    full
}
