//! Why a provider stopped answering: one vocabulary for every provider's
//! (OpenAI's `finish_reason`, Anthropic's and Bedrock's `stop_reason`,
//! Gemini's `finishReason`), kept on the winning attempt and told by each
//! door in its own (chat `finish_reason`, Messages `stop_reason`,
//! Responses `status`/`incomplete_details`).

/// Why the answer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn.
    Stop,
    /// The token limit cut the answer: it is whole as an answer, but
    /// truncated.
    Length,
    /// The turn ends with tool calls.
    ToolCalls,
    /// One of the request's stop sequences ended it (the sequence, when the
    /// provider says which).
    StopSequence(Option<String>),
    /// The provider's content filter ended it.
    ContentFilter,
}

impl FinishReason {
    /// As an attempt's row stores it (`attempts.finish_reason`):
    /// `stop`, `length`, `tool_calls`, `content_filter`, `stop_sequence`,
    /// or `stop_sequence:` and the sequence.
    pub fn stored(&self) -> String {
        match self {
            FinishReason::StopSequence(Some(sequence)) => format!("stop_sequence:{sequence}"),
            other => other.name().to_string(),
        }
    }

    /// A stored value read back; `None` for one this build does not know.
    pub fn parse_stored(text: &str) -> Option<FinishReason> {
        if let Some(sequence) = text.strip_prefix("stop_sequence:") {
            return Some(FinishReason::StopSequence(Some(sequence.to_string())));
        }
        Some(match text {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" => FinishReason::ToolCalls,
            "stop_sequence" => FinishReason::StopSequence(None),
            "content_filter" => FinishReason::ContentFilter,
            _ => return None,
        })
    }

    /// The canonical name (what `GET /v1/jobs/{id}` shows).
    pub fn name(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::StopSequence(_) => "stop_sequence",
            FinishReason::ContentFilter => "content_filter",
        }
    }

    /// OpenAI Chat Completions' `finish_reason` (a stop sequence is `stop`).
    pub fn openai(&self) -> &'static str {
        match self {
            FinishReason::StopSequence(_) => "stop",
            other => other.name(),
        }
    }

    /// Anthropic's `stop_reason`, and its `stop_sequence`.
    pub fn anthropic(&self) -> (&'static str, Option<&str>) {
        match self {
            FinishReason::Stop => ("end_turn", None),
            FinishReason::Length => ("max_tokens", None),
            FinishReason::ToolCalls => ("tool_use", None),
            FinishReason::StopSequence(sequence) => ("stop_sequence", sequence.as_deref()),
            FinishReason::ContentFilter => ("refusal", None),
        }
    }

    /// The Responses API's `incomplete_details.reason` for an answer that
    /// is `incomplete`; `None` for a complete one.
    pub fn responses_incomplete(&self) -> Option<&'static str> {
        match self {
            FinishReason::Length => Some("max_output_tokens"),
            FinishReason::ContentFilter => Some("content_filter"),
            _ => None,
        }
    }

    /// OpenAI's `finish_reason` (Chat Completions, and the servers that
    /// speak its wire): anything unknown is a stop.
    pub fn of_openai(reason: &str) -> FinishReason {
        match reason {
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            _ => FinishReason::Stop,
        }
    }

    /// Anthropic's `stop_reason` (and Bedrock Converse's `stopReason`,
    /// the same words), with the `stop_sequence` it names, if any.
    pub fn of_anthropic(reason: &str, sequence: Option<&str>) -> FinishReason {
        match reason {
            "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
            "tool_use" => FinishReason::ToolCalls,
            "stop_sequence" => FinishReason::StopSequence(sequence.map(str::to_string)),
            "refusal" | "guardrail_intervened" | "content_filtered" => FinishReason::ContentFilter,
            _ => FinishReason::Stop,
        }
    }

    /// Gemini's `finishReason`.
    pub fn of_gemini(reason: &str) -> FinishReason {
        match reason {
            "MAX_TOKENS" => FinishReason::Length,
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII"
            | "IMAGE_SAFETY" => FinishReason::ContentFilter,
            _ => FinishReason::Stop,
        }
    }

    /// The reason an answer is told with: the provider's (a turn with tool
    /// calls that says it stopped is a tool-call turn, as Gemini's `STOP`
    /// with a function call is), or, when none is known (an attempt
    /// recorded before this was kept, an admin's answer), what the answer
    /// shows: tool calls or a stop.
    pub fn told(reason: Option<&FinishReason>, has_tool_calls: bool) -> FinishReason {
        match reason {
            Some(FinishReason::Stop) | None if has_tool_calls => FinishReason::ToolCalls,
            Some(FinishReason::ToolCalls) | None => {
                if has_tool_calls {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                }
            }
            Some(reason) => reason.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_reads_back() {
        for reason in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::ToolCalls,
            FinishReason::StopSequence(None),
            FinishReason::StopSequence(Some("END:1".into())),
            FinishReason::ContentFilter,
        ] {
            assert_eq!(
                FinishReason::parse_stored(&reason.stored()),
                Some(reason.clone())
            );
        }
        assert_eq!(FinishReason::parse_stored("something_new"), None);
    }

    #[test]
    fn told_keeps_the_providers_reason_and_falls_back_to_the_answer() {
        assert_eq!(FinishReason::told(None, false), FinishReason::Stop);
        assert_eq!(FinishReason::told(None, true), FinishReason::ToolCalls);
        assert_eq!(
            FinishReason::told(Some(&FinishReason::Stop), true),
            FinishReason::ToolCalls
        );
        assert_eq!(
            FinishReason::told(Some(&FinishReason::ToolCalls), false),
            FinishReason::Stop
        );
        assert_eq!(
            FinishReason::told(Some(&FinishReason::Length), true),
            FinishReason::Length
        );
    }
}
