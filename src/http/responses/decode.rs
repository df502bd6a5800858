//! A Responses request decoded into the domain's job request (the same one
//! Chat Completions decodes into). What onejob cannot honour is refused with
//! 422 naming the field, never dropped; built-in tools are refused by name.
//!
//! What the job request has no field for but a Response shows back (the
//! instructions, metadata, the tools and input items as given, `store`,
//! `background`, `previous_response_id`) is kept in the request's `door`
//! object under `"responses"`: stored and fingerprinted with the job,
//! never sent to a provider.

use super::error::ResponsesError;
use super::input;
use crate::domain::{JobRequest, RequestError};
use axum::http::StatusCode;
use serde_json::{json, Map, Value};

/// The top-level fields onejob reads. Any other field is refused.
const ACCEPTED: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "store",
    "metadata",
    "previous_response_id",
    "background",
    "stream",
    "stream_options",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "include",
    "truncation",
    "reasoning",
    "service_tier",
];

/// A create request, decoded: the job request without the turns of a
/// previous response (those need the store), and how to answer it.
pub(super) struct Decoded {
    route: String,
    instructions: Option<String>,
    messages: Vec<Value>,
    params: Map<String, Value>,
    echo: Map<String, Value>,
    pub stream: bool,
    pub background: bool,
    pub previous_response_id: Option<String>,
    /// The input items as given, while some are `item_reference`s that
    /// need the store to be read.
    references: Option<Vec<Value>>,
}

impl Decoded {
    /// The job request: the instructions (never those of a previous
    /// response), the previous response's turns, then this input. The tree
    /// built is read as the request (nothing is written out to be parsed
    /// again).
    pub(super) fn request(&self, history: Vec<Value>) -> Result<JobRequest, RequestError> {
        JobRequest::from_value(self.body(history))
    }

    /// The input items as given, when some are references to resolve.
    pub(super) fn references(&self) -> Option<&[Value]> {
        self.references.as_deref()
    }

    /// The input with its references resolved: its turns, and the items
    /// shown back as resolved (as `input_items` lists them).
    pub(super) fn resolved(&mut self, items: Vec<Value>) -> Result<(), ResponsesError> {
        self.messages = input::turns_of(&items)?;
        self.echo.insert("input".into(), Value::Array(items));
        self.references = None;
        Ok(())
    }

    /// The job request as JSON, in `POST /v1/jobs`'s shape.
    fn body(&self, history: Vec<Value>) -> Value {
        let mut messages = Vec::new();
        if let Some(text) = &self.instructions {
            messages.push(json!({"role": "system", "content": text}));
        }
        messages.extend(history);
        messages.extend(self.messages.iter().cloned());
        json!({
            "messages": messages,
            "params": self.params,
            "route": self.route,
            "door": {"responses": self.echo},
        })
    }
}

fn bad_json(e: serde_json::Error) -> ResponsesError {
    ResponsesError::new(
        StatusCode::BAD_REQUEST,
        "malformed_json",
        format!("body is not a JSON object: {e}"),
    )
}

/// Decode `POST /v1/responses`. `stream` and `stream_options` never enter
/// the job request, so a streamed replay of an unstreamed call is the same
/// job.
pub(super) fn decode(raw: &[u8]) -> Result<Decoded, ResponsesError> {
    let request: Map<String, Value> = serde_json::from_slice(raw).map_err(bad_json)?;
    if let Some(field) = request.keys().find(|k| !ACCEPTED.contains(&k.as_str())) {
        return Err(ResponsesError::unsupported(
            field,
            "not supported by onejob",
        ));
    }
    let given = |name: &str| request.get(name).filter(|v| !v.is_null());
    let route = match given("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(ResponsesError::invalid(
                "model",
                "the name of a route is required (GET /v1/models lists them)",
            ))
        }
    };
    let flag = |name: &str, default: bool| match given(name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ResponsesError::invalid(name, "true or false")),
    };
    let stream = flag("stream", false)?;
    let background = flag("background", false)?;
    let store = flag("store", true)?;
    if background && !store {
        return Err(ResponsesError::invalid(
            "background",
            "a background response must be stored (store: true), or it could never be retrieved",
        ));
    }
    refuse_unless(&request, "include", |v| {
        v.as_array().is_some_and(Vec::is_empty)
    })?;
    refuse_unless(&request, "truncation", |v| v == "disabled")?;
    refuse_unless(&request, "reasoning", |v| {
        v.as_object()
            .is_some_and(|o| o.values().all(Value::is_null))
    })?;
    refuse_unless(&request, "service_tier", |v| v == "auto" || v == "default")?;
    let instructions = match given("instructions") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ResponsesError::unsupported(
                "instructions",
                "only a string is supported",
            ))
        }
    };
    let items = match given("input") {
        Some(Value::String(text)) => {
            vec![json!({"type": "message", "role": "user", "content": text})]
        }
        Some(Value::Array(items)) => items.clone(),
        _ => {
            return Err(ResponsesError::invalid(
                "input",
                "a string or a list of input items is required",
            ))
        }
    };
    let references = items.iter().any(|i| i["type"] == "item_reference");
    let messages = if references {
        Vec::new()
    } else {
        input::turns_of(&items)?
    };
    let previous_response_id = match given("previous_response_id") {
        None => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return Err(ResponsesError::invalid("previous_response_id", "a string")),
    };
    let mut params = Map::new();
    for (name, value) in [
        ("temperature", given("temperature")),
        ("top_p", given("top_p")),
        ("max_tokens", given("max_output_tokens")),
        ("user", given("safety_identifier").or_else(|| given("user"))),
    ] {
        if let Some(v) = value {
            params.insert(name.into(), v.clone());
        }
    }
    // As Chat Completions' field: carried to every provider (the Anthropic
    // wire sends `false` as `disable_parallel_tool_use`).
    if given("parallel_tool_calls").is_some() {
        let parallel = flag("parallel_tool_calls", true)?;
        params.insert("parallel_tool_calls".into(), json!(parallel));
    }
    let tools = match given("tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(_) => return Err(ResponsesError::invalid("tools", "a list of tools")),
    };
    if !tools.is_empty() {
        let chat_tools = tools
            .iter()
            .enumerate()
            .map(|(i, t)| function_tool(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        params.insert("tools".into(), Value::Array(chat_tools));
    }
    if let Some(choice) = given("tool_choice") {
        params.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(format) = text_format(given("text"))? {
        params.insert("response_format".into(), format);
    }
    let metadata = match given("metadata") {
        None => Map::new(),
        Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => m.clone(),
        Some(_) => {
            return Err(ResponsesError::invalid(
                "metadata",
                "an object of at most 16 string values",
            ))
        }
    };
    let references = references.then(|| items.clone());
    let mut echo = Map::new();
    echo.insert("input".into(), Value::Array(items));
    for (name, value) in [
        ("instructions", instructions.clone().map(Value::String)),
        ("metadata", Some(Value::Object(metadata))),
        ("tools", Some(Value::Array(tools))),
        ("tool_choice", given("tool_choice").cloned()),
        ("text", given("text").cloned()),
        (
            "previous_response_id",
            previous_response_id.clone().map(Value::String),
        ),
        ("store", Some(Value::Bool(store))),
        ("background", Some(Value::Bool(background))),
    ] {
        if let Some(v) = value {
            echo.insert(name.into(), v);
        }
    }
    Ok(Decoded {
        route,
        instructions,
        messages,
        params,
        echo,
        stream,
        background,
        previous_response_id,
        references,
    })
}

/// A field accepted only with a value that changes nothing.
fn refuse_unless(
    request: &Map<String, Value>,
    field: &str,
    harmless: impl Fn(&Value) -> bool,
) -> Result<(), ResponsesError> {
    match request.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(v) if harmless(v) => Ok(()),
        Some(_) => Err(ResponsesError::unsupported(
            field,
            "not supported by onejob",
        )),
    }
}

/// A Responses function tool (flat: `name`, `description`, `parameters`,
/// `strict`) in the chat shape the job request takes. A built-in tool is
/// refused by name: no provider behind onejob runs it.
fn function_tool(i: usize, tool: &Value) -> Result<Value, ResponsesError> {
    let field = format!("tools[{i}]");
    match tool["type"].as_str() {
        Some("function") => {}
        Some(other) => {
            return Err(ResponsesError::unsupported(
                &format!("{field}.type"),
                &format!(
                "the built-in tool {other:?} is not supported by onejob; only function tools are"
            ),
            ))
        }
        None => {
            return Err(ResponsesError::invalid(
                &format!("{field}.type"),
                "required",
            ))
        }
    }
    let Some(fields) = tool.as_object() else {
        return Err(ResponsesError::invalid(&field, "an object is required"));
    };
    let mut function = Map::new();
    for (key, value) in fields {
        match key.as_str() {
            "type" => {}
            "name" | "description" | "parameters" | "strict" => {
                if !value.is_null() {
                    function.insert(key.clone(), value.clone());
                }
            }
            _ => {
                return Err(ResponsesError::unsupported(
                    &format!("{field}.{key}"),
                    "not supported by onejob",
                ))
            }
        }
    }
    if !function.get("name").is_some_and(Value::is_string) {
        return Err(ResponsesError::invalid(
            &format!("{field}.name"),
            "a string is required",
        ));
    }
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice`: `none`, `auto`, `required`, or `{"type": "function",
/// "name"}`; any other (a built-in tool, `allowed_tools`) is refused.
fn tool_choice(choice: &Value) -> Result<Value, ResponsesError> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "none" | "auto" | "required") => Ok(choice.clone()),
        Value::Object(o) if o.get("type") == Some(&json!("function")) => match o.get("name") {
            Some(Value::String(name)) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(ResponsesError::invalid("tool_choice.name", "a string is required")),
        },
        _ => Err(ResponsesError::unsupported(
            "tool_choice",
            "only \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\"} are supported",
        )),
    }
}

/// `text.format` as the job's `response_format` (`None` for plain text).
fn text_format(text: Option<&Value>) -> Result<Option<Value>, ResponsesError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let Some(fields) = text.as_object() else {
        return Err(ResponsesError::invalid("text", "an object is required"));
    };
    for (key, value) in fields {
        match key.as_str() {
            "format" => {}
            "verbosity" if value.is_null() || value == "medium" => {}
            _ => {
                return Err(ResponsesError::unsupported(
                    &format!("text.{key}"),
                    "not supported by onejob",
                ))
            }
        }
    }
    let format = &text["format"];
    match format["type"].as_str() {
        None if format.is_null() => Ok(None),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let Some(schema) = format.get("schema").filter(|s| s.is_object()) else {
                return Err(ResponsesError::invalid(
                    "text.format.schema",
                    "a JSON Schema object is required",
                ));
            };
            let name = format["name"].as_str().unwrap_or("output");
            let mut json_schema = json!({"name": name, "schema": schema});
            for key in ["strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    json_schema[key] = v.clone();
                }
            }
            Ok(Some(
                json!({"type": "json_schema", "json_schema": json_schema}),
            ))
        }
        _ => Err(ResponsesError::invalid(
            "text.format.type",
            "\"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_request(body: Value) -> Value {
        let decoded = decode(body.to_string().as_bytes()).unwrap();
        decoded.body(Vec::new())
    }

    fn refused(body: Value) -> ResponsesError {
        match decode(body.to_string().as_bytes()) {
            Ok(_) => panic!("accepted {body}"),
            Err(e) => e,
        }
    }

    #[test]
    fn input_items_become_the_chat_turns() {
        let request = job_request(json!({
            "model": "default",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use metric units."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather here? "},
                    {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                ]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "call_2", "name": "clock", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "noon"}]},
            ],
        }));
        let turns = request["messages"].as_array().unwrap();
        assert_eq!(turns[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            turns[1],
            json!({"role": "system", "content": "Use metric units."})
        );
        assert_eq!(turns[2]["content"], "Weather here? ");
        assert_eq!(
            turns[2]["parts"][1],
            json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}})
        );
        assert_eq!(turns[3]["role"], "assistant");
        assert_eq!(turns[3]["content"], "Let me look.");
        let calls = turns[3]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "consecutive calls are one assistant turn");
        assert_eq!(calls[1]["function"]["name"], "clock");
        assert_eq!(
            turns[4],
            json!({"role": "tool", "content": "18 C", "tool_call_id": "call_1"})
        );
        assert_eq!(turns[5]["content"], "noon");
        assert_eq!(turns.len(), 6);
        assert_eq!(request["door"]["responses"]["instructions"], "Be brief.");
        assert_eq!(
            request["door"]["responses"]["input"]
                .as_array()
                .unwrap()
                .len(),
            7
        );
    }

    #[test]
    fn flat_function_tools_choices_and_formats_take_the_chat_shape() {
        let request = job_request(json!({
            "model": "default",
            "input": "Hi",
            "tools": [{"type": "function", "name": "f", "description": "d",
                       "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "out", "strict": true,
                                "schema": {"type": "object"}}},
            "max_output_tokens": 50,
            "stream": true,
        }));
        let params = &request["params"];
        assert_eq!(
            params["tools"],
            json!([{"type": "function", "function": {"name": "f", "description": "d",
                    "parameters": {"type": "object"}, "strict": true}}])
        );
        assert_eq!(
            params["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(
            params["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(params["max_tokens"], 50);
        assert!(
            request.get("stream").is_none(),
            "stream is not part of the job"
        );
        let plain = job_request(
            json!({"model": "default", "input": "Hi", "text": {"format": {"type": "text"}}}),
        );
        assert!(plain["params"].get("response_format").is_none());
    }

    #[test]
    fn parallel_tool_calls_is_carried_as_chat_carries_it() {
        let off =
            job_request(json!({"model": "default", "input": "Hi", "parallel_tool_calls": false}));
        assert_eq!(off["params"]["parallel_tool_calls"], json!(false));
        let unsaid = job_request(json!({"model": "default", "input": "Hi"}));
        assert!(unsaid["params"].get("parallel_tool_calls").is_none());
        let err = refused(json!({"model": "default", "input": "Hi", "parallel_tool_calls": 0}));
        assert_eq!(err.param.as_deref(), Some("parallel_tool_calls"));
    }

    #[test]
    fn references_wait_for_the_store() {
        let body = json!({"model": "default", "input": [
            {"role": "user", "content": "Hi"},
            {"type": "item_reference", "id": "msg_x"},
        ]});
        let decoded = decode(body.to_string().as_bytes()).unwrap();
        assert_eq!(decoded.references().map(<[Value]>::len), Some(2));
        let plain = decode(br#"{"model": "default", "input": "Hi"}"#).unwrap();
        assert!(plain.references().is_none());
    }

    #[test]
    fn what_no_provider_can_honour_is_refused_by_name() {
        for (body, param) in [
            (
                json!({"model": "default", "input": "Hi", "tools": [{"type": "file_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "default", "input": "Hi", "tool_choice": {"type": "mcp"}}),
                "tool_choice",
            ),
            (
                json!({"model": "default", "input": "Hi", "prompt": {"id": "p"}}),
                "prompt",
            ),
            (
                json!({"model": "default", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"model": "default", "input": "Hi", "text": {"verbosity": "low"}}),
                "text.verbosity",
            ),
        ] {
            let error = refused(body);
            assert_eq!(error.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(error.param.as_deref(), Some(param));
        }
        let error = refused(
            json!({"model": "default", "input": "Hi", "tools": [{"type": "web_search_preview"}]}),
        );
        assert!(
            error.message.contains("\"web_search_preview\""),
            "{}",
            error.message
        );
    }
}
