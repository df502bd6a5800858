//! A Responses request's input items as the job request's chat turns:
//! messages (text parts joined, images as chat `image_url` parts), the
//! assistant's function calls and their outputs as tool turns.

use super::error::ResponsesError;
use serde_json::{json, Value};

/// Input items as chat turns: messages, the assistant's function calls
/// (consecutive calls are one assistant turn), and their outputs as tool
/// turns.
pub(super) fn turns_of(items: &[Value]) -> Result<Vec<Value>, ResponsesError> {
    let mut turns: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let Some(fields) = item.as_object() else {
            return Err(ResponsesError::invalid(&field, "an object is required"));
        };
        let kind = fields
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let allowed: &[&str] = match kind {
            "message" => &["type", "role", "content", "id", "status", "phase"],
            "function_call" => &["type", "call_id", "name", "arguments", "id", "status"],
            "function_call_output" => &["type", "call_id", "output", "id", "status"],
            other => {
                return Err(ResponsesError::unsupported(
                    &format!("{field}.type"),
                    &format!("input items of type {other:?} are not supported by onejob"),
                ))
            }
        };
        if let Some(key) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ResponsesError::unsupported(
                &format!("{field}.{key}"),
                "not supported by onejob",
            ));
        }
        let text_of = |name: &str| match item.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ResponsesError::invalid(
                &format!("{field}.{name}"),
                "a string is required",
            )),
        };
        match kind {
            "message" => turns.push(message_of(&field, item)?),
            "function_call" => {
                let call = json!({
                    "id": text_of("call_id")?,
                    "type": "function",
                    "function": {"name": text_of("name")?, "arguments": text_of("arguments")?},
                });
                match turns.last_mut() {
                    Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => last["tool_calls"] = json!([call]),
                    },
                    _ => turns
                        .push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            _ => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                            (Some("input_text" | "output_text"), Some(t)) => Ok(t),
                            _ => Err(ResponsesError::unsupported(
                                &format!("{field}.output"),
                                "only text output is supported",
                            )),
                        })
                        .collect::<Result<String, _>>()?,
                    _ => {
                        return Err(ResponsesError::invalid(
                            &format!("{field}.output"),
                            "a string is required",
                        ))
                    }
                };
                turns.push(
                    json!({"role": "tool", "content": output, "tool_call_id": text_of("call_id")?}),
                );
            }
        }
    }
    Ok(turns)
}

/// One message item as a chat turn: text parts joined, images kept as
/// chat `image_url` parts (passed to providers that take images).
fn message_of(field: &str, item: &Value) -> Result<Value, ResponsesError> {
    let role = match item["role"].as_str() {
        Some("developer" | "system") => "system",
        Some(role @ ("user" | "assistant")) => role,
        _ => {
            return Err(ResponsesError::invalid(
                &format!("{field}.role"),
                "one of user, system, developer, assistant",
            ))
        }
    };
    let parts = match &item["content"] {
        Value::String(text) => return Ok(json!({"role": role, "content": text})),
        Value::Array(parts) => parts,
        _ => {
            return Err(ResponsesError::invalid(
                &format!("{field}.content"),
                "a string or a list of content parts is required",
            ))
        }
    };
    let mut text = String::new();
    let mut chat_parts = Vec::new();
    let mut images = false;
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{field}.content[{j}]");
        match (part["type"].as_str(), role) {
            (Some("input_text"), _) | (Some("output_text"), "assistant") => {
                let Some(t) = part["text"].as_str() else {
                    return Err(ResponsesError::invalid(&format!("{at}.text"), "a string is required"));
                };
                text.push_str(t);
                chat_parts.push(json!({"type": "text", "text": t}));
            }
            (Some("input_image"), "user") => {
                let Some(url) = part["image_url"].as_str() else {
                    return Err(ResponsesError::unsupported(
                        &format!("{at}.image_url"),
                        "an image is sent by image_url (a URL or a data: URL); file_id is not supported",
                    ));
                };
                let mut image = json!({"url": url});
                if let Some(detail) = part["detail"].as_str() {
                    image["detail"] = json!(detail);
                }
                chat_parts.push(json!({"type": "image_url", "image_url": image}));
                images = true;
            }
            _ => {
                return Err(ResponsesError::unsupported(
                    &format!("{at}.type"),
                    "only input_text, input_image (user turns) and output_text (assistant turns) parts are supported",
                ))
            }
        }
    }
    let mut turn = json!({"role": role, "content": text});
    if images {
        turn["parts"] = Value::Array(chat_parts);
    }
    Ok(turn)
}
