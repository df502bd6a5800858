//! A job as a Response object: its id (derived from the job id, so every
//! replay of a key has the same one), its status, output items and usage,
//! and what the request asked for, shown back as OpenAI does.

use super::error::ResponsesError;
use crate::domain::{Job, JobId, JobState};
use crate::http::door::{Answer, Refusal, Refused};
use crate::providers::Usage;
use serde_json::{json, Map, Value};

/// `resp_` and the job id without its dashes.
pub(super) fn response_id(job_id: &JobId) -> String {
    format!("resp_{}", job_id.replace('-', ""))
}

/// The job id a response id names, when it is one onejob made.
pub(super) fn job_id_of(response_id: &str) -> Option<JobId> {
    let hex = response_id.strip_prefix("resp_")?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(JobId::from(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )))
}

fn hex_of(job: &Job) -> String {
    job.id.replace('-', "")
}

/// The id of a job's output message.
pub(super) fn message_item_id(job: &Job) -> String {
    format!("msg_{}", hex_of(job))
}

/// The id of a job's `index`th function call item.
pub(super) fn call_item_id(job: &Job, index: usize) -> String {
    format!("fc_{}_{index}", hex_of(job))
}

/// Which item of a response an item id names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ItemOf {
    /// One of its output items (`msg_HEX`, `fc_HEX_N`).
    Output,
    /// Its `n`th input item (`msg_HEX_inN`, `fc_HEX_inN`, `fco_HEX_inN`).
    Input(usize),
}

/// The response (as the hex of its job id) and the item an item id onejob
/// made names; `None` for any other id.
pub(super) fn item_id_parts(id: &str) -> Option<(&str, ItemOf)> {
    let (prefix, rest) = id.split_once('_')?;
    if !matches!(prefix, "msg" | "fc" | "fco") {
        return None;
    }
    let hex = rest.get(..32)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let index = |n: &str| {
        n.parse::<usize>()
            .ok()
            .filter(|_| n.bytes().all(|b| b.is_ascii_digit()))
    };
    let which = match (prefix, &rest[32..]) {
        ("msg", "") => ItemOf::Output,
        ("fc", tail) if tail.starts_with('_') && !tail.starts_with("_in") => {
            index(&tail[1..])?;
            ItemOf::Output
        }
        (_, tail) => ItemOf::Input(index(tail.strip_prefix("_in")?)?),
    };
    Some((hex, which))
}

/// The job's request as stored, and what the Responses door kept of it.
pub(super) struct Stored {
    pub request: Value,
    pub echo: Map<String, Value>,
}

impl Stored {
    pub(super) fn of(job: &Job) -> Stored {
        let request: Value = serde_json::from_str(&job.request).unwrap_or(Value::Null);
        let echo = request
            .pointer("/door/responses")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        Stored { request, echo }
    }

    /// Made through this door and stored (`store` not false).
    pub(super) fn is_shown(&self) -> bool {
        self.request.pointer("/door/responses").is_some()
            && self.echo.get("store") != Some(&json!(false))
    }

    fn echoed(&self, name: &str) -> Value {
        self.echo.get(name).cloned().unwrap_or(Value::Null)
    }

    fn param(&self, name: &str) -> Value {
        self.request["params"][name].clone()
    }
}

/// What a Response shows of its job now.
pub(super) struct Shown {
    pub status: &'static str,
    pub output: Vec<Value>,
    pub usage: Option<Usage>,
    pub model: String,
    pub error: Value,
    /// Why a whole answer is `incomplete` (`max_output_tokens`: the
    /// provider stopped at the token limit; `content_filter`), if it is.
    pub incomplete: Option<&'static str>,
}

impl Shown {
    /// A job with no answer (yet): its status, no output.
    pub(super) fn without_answer(job: &Job, model: String, error: Value) -> Shown {
        Shown {
            status: status_of(job),
            output: Vec::new(),
            usage: None,
            model,
            error,
            incomplete: None,
        }
    }

    pub(super) fn answered(job: &Job, answer: Answer) -> Shown {
        Shown {
            status: "completed",
            output: output_items(job, &answer),
            usage: Some(answer.usage),
            incomplete: answer.finish.responses_incomplete(),
            model: answer.model,
            error: Value::Null,
        }
    }
}

/// A job's state as a Response's status: `queued` until its first
/// attempt (a job waiting out a retry's backoff is `in_progress`).
pub(super) fn status_of(job: &Job) -> &'static str {
    match job.state {
        JobState::Pending if job.attempt_count == 0 => "queued",
        JobState::Pending => "in_progress",
        JobState::Running => "in_progress",
        JobState::Succeeded => "completed",
        JobState::Cancelled => "cancelled",
        JobState::Failed | JobState::NeedsReview => "failed",
    }
}

/// The answer as output items: a `message` with its `output_text`, then a
/// `function_call` per tool call.
pub(super) fn output_items(job: &Job, answer: &Answer) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(text) = answer.text.as_deref().filter(|t| !t.is_empty()) {
        items.push(message_item(job, text, "completed"));
    }
    for (index, call) in answer.tool_calls.iter().enumerate() {
        items.push(call_item(
            job,
            index,
            call["id"].as_str().unwrap_or_default(),
            call["function"]["name"].as_str().unwrap_or_default(),
            call["function"]["arguments"].as_str().unwrap_or_default(),
            "completed",
        ));
    }
    items
}

pub(super) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

pub(super) fn message_item(job: &Job, text: &str, status: &str) -> Value {
    let content = if text.is_empty() && status == "in_progress" {
        json!([])
    } else {
        json!([output_text(text)])
    };
    json!({"id": message_item_id(job), "type": "message", "role": "assistant",
           "status": status, "content": content})
}

pub(super) fn call_item(
    job: &Job,
    index: usize,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"id": call_item_id(job, index), "type": "function_call", "status": status,
           "call_id": call_id, "name": name, "arguments": arguments})
}

pub(super) fn usage(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                 "cache_write_tokens": usage.cache_creation_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total(),
    })
}

/// The Response object of `job` as `shown`.
pub(super) fn response(job: &Job, shown: Shown) -> Value {
    response_with(job, &Stored::of(job), shown)
}

/// [`response`] with the job's request read already (a stream shows its
/// Response several times).
pub(super) fn response_with(job: &Job, stored: &Stored, shown: Shown) -> Value {
    let created_at = job.created_at / 1000;
    // An answer the provider cut (at the token limit, by its filter) is
    // whole, and OpenAI calls it incomplete, with no completion time.
    let (status, incomplete_details) = match shown.incomplete {
        Some(reason) if shown.status == "completed" => ("incomplete", json!({ "reason": reason })),
        _ => (shown.status, Value::Null),
    };
    let final_at = (status == "completed").then_some(job.updated_at / 1000);
    let metadata = match stored.echoed("metadata") {
        Value::Null => json!({}),
        m => m,
    };
    let tools = match stored.echoed("tools") {
        Value::Null => json!([]),
        t => t,
    };
    let tool_choice = match stored.echoed("tool_choice") {
        Value::Null => json!("auto"),
        c => c,
    };
    let text = match stored.echoed("text") {
        Value::Null => json!({"format": {"type": "text"}}),
        t => t,
    };
    json!({
        "id": response_id(&job.id),
        "object": "response",
        "created_at": created_at,
        "completed_at": final_at,
        "status": status,
        "background": stored.echo.get("background").cloned().unwrap_or(json!(false)),
        "error": shown.error,
        "incomplete_details": incomplete_details,
        "instructions": stored.echoed("instructions"),
        "max_output_tokens": stored.param("max_tokens"),
        "metadata": metadata,
        "model": shown.model,
        "output": shown.output,
        "parallel_tool_calls": stored.request["params"]["parallel_tool_calls"] != false,
        "previous_response_id": stored.echoed("previous_response_id"),
        "reasoning": {"effort": null, "summary": null},
        "store": stored.echo.get("store").cloned().unwrap_or(json!(true)),
        "temperature": stored.param("temperature"),
        "text": text,
        "tool_choice": tool_choice,
        "tools": tools,
        "top_p": stored.param("top_p"),
        "truncation": "disabled",
        "usage": shown.usage.map(usage),
        "user": null,
    })
}

/// A Response's `error` for a job that ended without an answer (its code
/// one of those the Response object has).
pub(super) fn failure(refused: &Refused) -> Value {
    let code = match &refused.why {
        Refusal::RateLimited => "rate_limit_exceeded",
        Refusal::ContextLengthExceeded | Refusal::ContentPolicy | Refusal::BadRequest(_) => {
            "invalid_prompt"
        }
        _ => "server_error",
    };
    json!({"code": code, "message": refused.message})
}

/// A job that did not succeed, answered to a create that waited for it: the
/// provider's code kept, a status the SDKs raise the right exception for
/// (`param` the request's `input` or `text.format`).
pub(super) fn refusal(refused: Refused) -> ResponsesError {
    crate::http::openai_error::refusal(refused, "input", "text.format")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_ids_name_their_response_and_item() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            item_id_parts(&format!("msg_{hex}")),
            Some((hex, ItemOf::Output))
        );
        assert_eq!(
            item_id_parts(&format!("fc_{hex}_2")),
            Some((hex, ItemOf::Output))
        );
        assert_eq!(
            item_id_parts(&format!("msg_{hex}_in0")),
            Some((hex, ItemOf::Input(0)))
        );
        assert_eq!(
            item_id_parts(&format!("fco_{hex}_in12")),
            Some((hex, ItemOf::Input(12)))
        );
        for other in [
            "msg_x".to_string(),
            format!("rs_{hex}"),
            format!("fc_{hex}"),
            format!("msg_{hex}_1"),
            format!("fco_{hex}"),
            format!("fc_{hex}_+1"),
            format!("msg_{hex}_in"),
            format!("msg_{}", &hex[..31]),
        ] {
            assert_eq!(item_id_parts(&other), None, "{other}");
        }
    }
}
