//! Rendering a contract's prompt for a provider's wire format.
//!
//! The system prompt is static text; the template renders the last user turn
//! from the case's (or job's) input, after any few-shot turns. User input is
//! substituted as plain text: never HTML-escaped, never re-rendered.

use super::definition::{Contract, TEMPLATE_NAME};
use crate::domain::request::{Message, Role};
use crate::providers::ChatRequest;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a provider's API places the system prompt and orders turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFormat {
    /// System prompt as the first message with role `system`.
    OpenAi,
    /// System prompt as the top-level `system` field; messages strictly
    /// alternate user/assistant, starting and ending with user.
    Anthropic,
}

/// A prompt laid out for one wire format.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedPrompt {
    /// `Some` for Anthropic, `None` for OpenAI (where it is `messages[0]`).
    pub system: Option<String>,
    pub messages: Vec<Message>,
}

impl RenderedPrompt {
    /// Every text the model will read: the system prompt and each message.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.system
            .as_deref()
            .into_iter()
            .chain(self.messages.iter().map(|m| m.content.as_str()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("undefined variable `{variable}` at template line {line}")]
    UndefinedVariable { variable: String, line: usize },
    #[error("template line {line}: {message}")]
    Template { line: usize, message: String },
    #[error("leftover template syntax {marker:?} in the rendered prompt near {excerpt:?}")]
    LeftoverSyntax { marker: String, excerpt: String },
    #[error("the template rendered to an empty prompt")]
    Empty,
    #[error("{wire:?} wire format broken: {message}")]
    WireShape { wire: WireFormat, message: String },
}

/// Markers that only the template language produces.
const TEMPLATE_MARKERS: [&str; 3] = ["{{", "{%", "{#"];

impl Contract {
    /// Render the prompt for `input` in `wire`'s layout.
    pub fn render(
        &self,
        input: &Map<String, Value>,
        wire: WireFormat,
    ) -> Result<RenderedPrompt, RenderError> {
        let user_turn = self.render_user_turn(input)?;
        if user_turn.trim().is_empty() {
            return Err(RenderError::Empty);
        }
        check_no_leftover_syntax(&self.render_user_turn(&defuse_markers(input))?)?;

        let mut messages = Vec::with_capacity(2 + 2 * self.few_shot.len());
        let system = match wire {
            WireFormat::OpenAi => {
                messages.push(message(Role::System, &self.system));
                None
            }
            WireFormat::Anthropic => Some(self.system.clone()),
        };
        for turn in &self.few_shot {
            messages.push(message(Role::User, &turn.user));
            messages.push(message(Role::Assistant, &turn.assistant));
        }
        messages.push(Message::new(Role::User, user_turn));
        let prompt = RenderedPrompt { system, messages };
        check_wire_shape(&prompt, wire)?;
        Ok(prompt)
    }

    /// The request a contract job (or a contract run) sends: the rendered
    /// prompt, the contract's params and its schema as `response_schema`.
    pub fn chat_request(
        &self,
        input: &Map<String, Value>,
        wire: WireFormat,
        idempotency_key: String,
    ) -> Result<ChatRequest, RenderError> {
        let prompt = self.render(input, wire)?;
        Ok(self.request_for(prompt, idempotency_key))
    }

    /// The request for an already rendered prompt.
    pub fn request_for(&self, prompt: RenderedPrompt, idempotency_key: String) -> ChatRequest {
        ChatRequest {
            system: prompt.system,
            messages: prompt.messages,
            temperature: Some(self.temperature),
            max_tokens: Some(self.max_tokens),
            top_p: None,
            response_schema: Some(self.schema.clone()),
            idempotency_key,
            options: crate::providers::ChatOptions::default(),
        }
    }

    fn render_user_turn(&self, input: &Map<String, Value>) -> Result<String, RenderError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        template
            .render(minijinja::Value::from_serialize(input))
            .map_err(|e| {
                if e.kind() == minijinja::ErrorKind::UndefinedError {
                    if let Some(variable) = missing_variable(&template, input) {
                        return RenderError::UndefinedVariable {
                            variable,
                            line: e.line().unwrap_or(0),
                        };
                    }
                }
                template_error(&e)
            })
    }
}

fn message(role: Role, content: &str) -> Message {
    Message::new(role, content)
}

fn template_error(e: &minijinja::Error) -> RenderError {
    RenderError::Template {
        line: e.line().unwrap_or(0),
        message: e
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| e.kind().to_string()),
    }
}

/// The first variable path the template reads (`customer` or
/// `ticket.body`) that `input` does not hold, in sorted order.
fn missing_variable(
    template: &minijinja::Template<'_, '_>,
    input: &Map<String, Value>,
) -> Option<String> {
    let mut paths: Vec<String> = template.undeclared_variables(true).into_iter().collect();
    paths.sort();
    paths.into_iter().find(|path| {
        let mut parts = path.split('.');
        let Some(first) = parts.next() else {
            return false;
        };
        let mut current = input.get(first);
        for part in parts {
            current = current.and_then(|v| v.get(part));
        }
        current.is_none()
    })
}

/// A copy of `input` whose strings cannot contain template markers, so that
/// markers in the rendered output can only have come from the template.
fn defuse_markers(input: &Map<String, Value>) -> Map<String, Value> {
    fn defuse(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(s.replace('{', "(")),
            Value::Array(items) => Value::Array(items.iter().map(defuse).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), defuse(v))).collect())
            }
            other => other.clone(),
        }
    }
    input.iter().map(|(k, v)| (k.clone(), defuse(v))).collect()
}

fn check_no_leftover_syntax(rendered: &str) -> Result<(), RenderError> {
    for marker in TEMPLATE_MARKERS {
        if let Some(at) = rendered.find(marker) {
            let excerpt: String = rendered[at..].chars().take(40).collect();
            return Err(RenderError::LeftoverSyntax {
                marker: marker.to_string(),
                excerpt,
            });
        }
    }
    Ok(())
}

/// The layout rules of each wire format, checked on the finished prompt.
pub fn check_wire_shape(prompt: &RenderedPrompt, wire: WireFormat) -> Result<(), RenderError> {
    let broken = |message: String| Err(RenderError::WireShape { wire, message });
    match wire {
        WireFormat::OpenAi => {
            if prompt.system.is_some() {
                return broken("the system prompt must be the first message".into());
            }
            if prompt.messages.first().map(|m| m.role) != Some(Role::System) {
                return broken("the first message must have role system".into());
            }
            if let Some(i) = prompt
                .messages
                .iter()
                .skip(1)
                .position(|m| m.role == Role::System)
            {
                return broken(format!("message {} is a second system message", i + 1));
            }
            if prompt.messages.last().map(|m| m.role) != Some(Role::User) {
                return broken("the last message must have role user".into());
            }
        }
        WireFormat::Anthropic => {
            if prompt.system.as_deref().is_none_or(|s| s.trim().is_empty()) {
                return broken("the system prompt must be the top-level system field".into());
            }
            for (i, m) in prompt.messages.iter().enumerate() {
                let expected = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                if m.role != expected {
                    return broken(format!(
                        "message {i} has role {:?}, expected {expected:?} (user/assistant must alternate, starting with user)",
                        m.role
                    ));
                }
            }
            if prompt.messages.last().map(|m| m.role) != Some(Role::User) {
                return broken("the last message must have role user".into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contracts::definition::load_all;
    use std::path::Path;

    fn shipped() -> std::collections::BTreeMap<String, Contract> {
        load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")).unwrap()
    }

    fn triage() -> Contract {
        shipped().remove("ticket-triage").unwrap()
    }

    fn with_template(template: &str) -> Contract {
        let mut contract = triage();
        let mut environment = contract.environment.clone();
        environment
            .add_template_owned(TEMPLATE_NAME, template.to_string())
            .unwrap();
        contract.environment = environment;
        contract
    }

    fn input(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect()
    }

    #[test]
    fn every_shipped_case_renders_for_both_wire_formats() {
        for contract in shipped().values() {
            for case in &contract.cases {
                for wire in [WireFormat::OpenAi, WireFormat::Anthropic] {
                    let prompt = contract.render(&case.input, wire).unwrap_or_else(|e| {
                        panic!("{}/{} {wire:?}: {e}", contract.name, case.name)
                    });
                    check_wire_shape(&prompt, wire).unwrap();
                    assert_eq!(prompt.messages.last().unwrap().role, Role::User);
                }
            }
        }
    }

    #[test]
    fn openai_puts_system_first_and_anthropic_on_top() {
        let contract = triage();
        let case = &contract.cases[0];
        let openai = contract.render(&case.input, WireFormat::OpenAi).unwrap();
        assert_eq!(openai.system, None);
        assert_eq!(openai.messages[0].role, Role::System);
        assert_eq!(openai.messages[0].content, contract.system);

        let anthropic = contract.render(&case.input, WireFormat::Anthropic).unwrap();
        assert_eq!(anthropic.system.as_deref(), Some(contract.system.as_str()));
        assert_eq!(anthropic.messages[0].role, Role::User);
        assert_eq!(anthropic.messages.len() + 1, openai.messages.len());
    }

    #[test]
    fn undefined_variable_is_named_with_its_line() {
        let contract = with_template("Ticket:\n{{ body }}\nFrom: {{ customer_name }}");
        let err = contract
            .render(
                &input(&[("body", "printer is on fire")]),
                WireFormat::OpenAi,
            )
            .unwrap_err();
        assert_eq!(
            err,
            RenderError::UndefinedVariable {
                variable: "customer_name".into(),
                line: 3
            }
        );
        assert!(err.to_string().contains("`customer_name`"), "{err}");
    }

    #[test]
    fn undefined_nested_attribute_is_named_by_path() {
        let contract = with_template("{{ ticket.body }}");
        let mut vars = Map::new();
        vars.insert("ticket".into(), serde_json::json!({"subject": "x"}));
        let err = contract.render(&vars, WireFormat::OpenAi).unwrap_err();
        assert!(err.to_string().contains("`ticket.body`"), "{err}");
    }

    #[test]
    fn leftover_template_syntax_is_detected() {
        let contract = with_template("Body: {{ body }} {% raw %}{{ forgotten }}{% endraw %}");
        let err = contract
            .render(&input(&[("body", "hello")]), WireFormat::OpenAi)
            .unwrap_err();
        assert!(
            matches!(&err, RenderError::LeftoverSyntax { marker, .. } if marker == "{{"),
            "{err}"
        );
    }

    #[test]
    fn braces_in_user_input_are_not_leftover_syntax_and_are_not_rendered() {
        let contract = with_template("Body: {{ body }}");
        let body = "my config has {{ secret }} and {% if %} in it";
        let prompt = contract
            .render(&input(&[("body", body)]), WireFormat::OpenAi)
            .unwrap();
        assert_eq!(
            prompt.messages.last().unwrap().content,
            format!("Body: {body}")
        );
    }

    #[test]
    fn empty_render_is_an_error() {
        let contract = with_template("{{ body }}");
        let err = contract
            .render(&input(&[("body", "  \n")]), WireFormat::Anthropic)
            .unwrap_err();
        assert_eq!(err, RenderError::Empty);
    }

    #[test]
    fn user_input_is_not_html_escaped() {
        let contract = with_template("{{ body }}");
        let prompt = contract
            .render(&input(&[("body", "a < b & \"c\"")]), WireFormat::Anthropic)
            .unwrap();
        assert_eq!(prompt.messages.last().unwrap().content, "a < b & \"c\"");
    }

    #[test]
    fn chat_request_carries_params_schema_and_key() {
        let contract = triage();
        let case = &contract.cases[0];
        let request = contract
            .chat_request(&case.input, WireFormat::OpenAi, "k-1".into())
            .unwrap();
        assert_eq!(request.temperature, Some(contract.temperature));
        assert_eq!(request.max_tokens, Some(contract.max_tokens));
        assert_eq!(request.response_schema.as_ref(), Some(&contract.schema));
        assert_eq!(request.idempotency_key, "k-1");
    }

    #[test]
    fn anthropic_shape_refuses_two_user_turns_in_a_row() {
        let prompt = RenderedPrompt {
            system: Some("s".into()),
            messages: vec![message(Role::User, "a"), message(Role::User, "b")],
        };
        let err = check_wire_shape(&prompt, WireFormat::Anthropic).unwrap_err();
        assert!(err.to_string().contains("message 1"), "{err}");
    }
}
