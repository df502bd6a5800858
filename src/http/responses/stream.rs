//! A Response streamed: the job's stream events as OpenAI's semantic
//! events, each with its `event:` line and a `sequence_number` —
//! `response.created`, `response.in_progress`, per output item
//! `response.output_item.added`, (for a message) `response.content_part.added`,
//! `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, (for a function call)
//! `response.function_call_arguments.delta`…/`.done`, then
//! `response.output_item.done`, and `response.completed` with the whole
//! Response (`response.incomplete` when the provider stopped at
//! `max_output_tokens`), sent only once the answer is committed. A stream that ends
//! without a whole answer ends with `response.failed`, never with
//! `response.completed` on a truncated output; the job goes on, and a
//! replay with the same key gets its final answer.

use super::encode::{self, Shown, Stored};
use crate::domain::Job;
use crate::engine::stream::StreamEvent;
use crate::http::door::{Refusal, StreamEncoder};
use crate::http::openai_error::refusal_code;
use serde_json::{json, Value};

/// The function call being streamed.
struct Call {
    index: usize,
    call_id: String,
    name: String,
    arguments: String,
}

/// Turns one job's stream events into Responses SSE frames for one client.
pub(super) struct Encoder {
    job: Job,
    stored: Stored,
    model: String,
    sequence: u64,
    /// The last sequence number the client has.
    seen: Option<u64>,
    started: bool,
    /// Finished output items, in order.
    output: Vec<Value>,
    /// The message being streamed: its text so far.
    message: Option<String>,
    call: Option<Call>,
}

impl Encoder {
    /// For the client of `job`; `model` is shown until an attempt names
    /// the one that answers.
    pub(super) fn new(job: &Job, model: String) -> Self {
        Encoder {
            job: job.clone(),
            stored: Stored::of(job),
            model,
            sequence: 0,
            seen: None,
            started: false,
            output: Vec::new(),
            message: None,
            call: None,
        }
    }

    /// Skip the events a client has (`starting_after`, a retrieve's).
    pub(super) fn starting_after(mut self, seen: Option<u64>) -> Self {
        self.seen = seen;
        self
    }

    fn frame(&mut self, out: &mut String, kind: &str, mut data: Value) {
        let number = self.sequence;
        self.sequence += 1;
        if self.seen.is_some_and(|seen| number <= seen) {
            return;
        }
        data["type"] = json!(kind);
        data["sequence_number"] = json!(number);
        out.push_str("event: ");
        out.push_str(kind);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    fn snapshot(&self, status: &'static str) -> Value {
        let mut shown = Shown::without_answer(&self.job, self.model.clone(), Value::Null);
        shown.status = status;
        encode::response_with(&self.job, &self.stored, shown)
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let created = self.snapshot("in_progress");
        self.frame(out, "response.created", json!({"response": created}));
        let progress = self.snapshot("in_progress");
        self.frame(out, "response.in_progress", json!({"response": progress}));
    }

    fn output_index(&self) -> usize {
        self.output.len()
    }

    fn open_message(&mut self, out: &mut String) {
        if self.message.is_some() {
            return;
        }
        self.close_call(out);
        let index = self.output_index();
        let item = encode::message_item(&self.job, "", "in_progress");
        self.frame(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let item_id = encode::message_item_id(&self.job);
        self.frame(
            out,
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": encode::output_text("")}),
        );
        self.message = Some(String::new());
    }

    fn close_message(&mut self, out: &mut String) {
        let Some(text) = self.message.take() else {
            return;
        };
        let index = self.output_index();
        let item_id = encode::message_item_id(&self.job);
        self.frame(
            out,
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "text": text, "logprobs": []}),
        );
        self.frame(
            out,
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": encode::output_text(&text)}),
        );
        let item = encode::message_item(&self.job, &text, "completed");
        self.frame(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    fn close_call(&mut self, out: &mut String) {
        let Some(call) = self.call.take() else {
            return;
        };
        let index = self.output_index();
        let item_id = encode::call_item_id(&self.job, call.index);
        self.frame(
            out,
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "name": call.name,
                   "arguments": call.arguments}),
        );
        let item = encode::call_item(
            &self.job,
            call.index,
            &call.call_id,
            &call.name,
            &call.arguments,
            "completed",
        );
        self.frame(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// One OpenAI-shaped `delta.tool_calls` entry: a new call opens its
    /// item, argument fragments are its deltas.
    fn call_piece(&mut self, out: &mut String, piece: &Value) {
        let index = piece["index"].as_u64().unwrap_or(0) as usize;
        if self.call.as_ref().map(|c| c.index) != Some(index) {
            self.close_message(out);
            self.close_call(out);
            let call = Call {
                index,
                call_id: piece["id"].as_str().unwrap_or_default().to_string(),
                name: piece["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                arguments: String::new(),
            };
            let item = encode::call_item(
                &self.job,
                index,
                &call.call_id,
                &call.name,
                "",
                "in_progress",
            );
            let output_index = self.output_index();
            self.frame(
                out,
                "response.output_item.added",
                json!({"output_index": output_index, "item": item}),
            );
            self.call = Some(call);
        }
        let fragment = piece["function"]["arguments"].as_str().unwrap_or_default();
        if fragment.is_empty() {
            return;
        }
        let output_index = self.output_index();
        let item_id = encode::call_item_id(&self.job, index);
        if let Some(call) = self.call.as_mut() {
            call.arguments.push_str(fragment);
        }
        self.frame(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": output_index, "delta": fragment}),
        );
    }
}

impl StreamEncoder for Encoder {
    fn encode(&mut self, event: &StreamEvent) -> String {
        let mut out = String::new();
        match event {
            StreamEvent::Start { model, .. } => {
                self.model = model.clone();
                self.start(&mut out);
            }
            StreamEvent::Piece { model, delta } => {
                self.model = model.clone();
                self.start(&mut out);
                if !delta.content.is_empty() {
                    self.open_message(&mut out);
                    let index = self.output_index();
                    let item_id = encode::message_item_id(&self.job);
                    if let Some(text) = self.message.as_mut() {
                        text.push_str(&delta.content);
                    }
                    self.frame(
                        &mut out,
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "delta": delta.content, "logprobs": []}),
                    );
                }
                for piece in &delta.tool_calls {
                    self.call_piece(&mut out, piece);
                }
            }
            StreamEvent::Finish {
                model,
                usage,
                finish_reason,
            } => {
                self.model = model.clone();
                self.start(&mut out);
                self.close_message(&mut out);
                self.close_call(&mut out);
                let shown = Shown {
                    status: "completed",
                    output: self.output.clone(),
                    usage: Some(usage.unwrap_or_default()),
                    model: self.model.clone(),
                    error: Value::Null,
                    incomplete: finish_reason.responses_incomplete(),
                };
                let response = encode::response_with(&self.job, &self.stored, shown);
                // The provider stopped at the token limit: the answer is
                // whole, and OpenAI calls it incomplete.
                let kind = if response["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.frame(&mut out, kind, json!({"response": response}));
            }
            StreamEvent::Error { code, message, .. } if code == "job_pending" => {
                // Not final yet (driven elsewhere, past the wait): the
                // response has not failed; the same request picks it up.
                self.start(&mut out);
                self.frame(
                    &mut out,
                    "error",
                    json!({"code": code, "message": message, "param": null}),
                );
            }
            StreamEvent::Error { code, message, .. } => {
                self.start(&mut out);
                // What was streamed stays with the client; the failed
                // Response shows none of it as an answer.
                // A provider's refusal keeps OpenAI's code for it.
                let why = Refusal::of_stream_code(code);
                let shown_code = match why {
                    Refusal::ContentPolicy
                    | Refusal::ContextLengthExceeded
                    | Refusal::RateLimited => refusal_code(&why).1,
                    _ => "server_error",
                };
                let error = json!({"code": shown_code, "message": format!("{code}: {message}")});
                let shown = Shown::without_answer(&self.job, self.model.clone(), error);
                let mut response = encode::response_with(&self.job, &self.stored, shown);
                response["status"] = json!("failed");
                self.frame(&mut out, "response.failed", json!({"response": response}));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::job::NewJob;
    use crate::providers::stream::Delta;
    use crate::providers::Usage;

    fn job() -> Job {
        NewJob {
            id: "0192f0c4-0000-7000-8000-000000000001".into(),
            owner_id: "alice".into(),
            idempotency_key: "k".into(),
            fingerprint: String::new(),
            request: r#"{"messages":[],"route":"default","door":{"responses":{"input":[]}}}"#
                .into(),
            route: "default".into(),
            created_at: 1_000,
            lease: None,
            key_id: None,
            primary: None,
        }
        .into_job()
    }

    /// The events written for `events`, as (event line, data).
    fn frames(events: &[StreamEvent]) -> Vec<(String, Value)> {
        let mut encoder = Encoder::new(&job(), "m-0".into());
        let text: String = events.iter().map(|e| encoder.encode(e)).collect();
        text.split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (event, data) = f.split_once('\n').unwrap();
                let event = event.strip_prefix("event: ").unwrap().to_string();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(
                    data["type"],
                    event.as_str(),
                    "the event line names the data's type"
                );
                (event, data)
            })
            .collect()
    }

    fn start() -> StreamEvent {
        StreamEvent::Start {
            model: "m-1".into(),
            provider: "p".into(),
            attempt_id: "a".into(),
        }
    }

    fn piece(delta: Delta) -> StreamEvent {
        StreamEvent::Piece {
            model: "m-1".into(),
            delta,
        }
    }

    fn finish(reason: &str) -> StreamEvent {
        StreamEvent::Finish {
            model: "m-1".into(),
            finish_reason: crate::domain::FinishReason::of_openai(reason),
            usage: Some(Usage::new(3, 2)),
        }
    }

    #[test]
    fn text_then_a_call_are_two_items_in_openai_order() {
        let call = |v: Value| Delta {
            content: String::new(),
            tool_calls: vec![v],
        };
        let frames = frames(&[
            start(),
            piece(Delta::text("Hel")),
            piece(Delta::text("lo")),
            piece(call(json!({"index": 0, "id": "call_1", "type": "function",
                              "function": {"name": "f", "arguments": "{\"a\""}}))),
            piece(call(json!({"index": 0, "function": {"arguments": ":1}"}}))),
            finish("tool_calls"),
        ]);
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = frames
            .iter()
            .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..frames.len() as u64).collect::<Vec<_>>());
        assert_eq!(frames[6].1["text"], "Hello");
        assert_eq!(frames[9].1["output_index"], 1);
        assert_eq!(frames[9].1["item"]["call_id"], "call_1");
        assert_eq!(frames[12].1["arguments"], "{\"a\":1}");
        let done = &frames[14].1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["model"], "m-1", "the model that answered");
        assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
        assert_eq!(done["output"][1]["id"], frames[9].1["item"]["id"]);
        assert_eq!(done["usage"]["total_tokens"], 5);
        assert_eq!(frames[0].1["response"]["id"], done["id"]);
    }

    #[test]
    fn a_job_not_final_yet_is_an_error_event_not_a_failed_response() {
        let frames = frames(&[StreamEvent::Error {
            code: "job_pending".into(),
            message: "still running".into(),
            last_failure: None,
        }]);
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["response.created", "response.in_progress", "error"]);
        assert_eq!(frames[2].1["code"], "job_pending");
    }

    #[test]
    fn starting_after_skips_what_the_client_has_and_keeps_the_numbers() {
        let events = [start(), piece(Delta::text("Hi")), finish("stop")];
        let mut encoder = Encoder::new(&job(), "m-0".into()).starting_after(Some(4));
        let text: String = events.iter().map(|e| encoder.encode(e)).collect();
        let numbers: Vec<u64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| {
                serde_json::from_str::<Value>(d).unwrap()["sequence_number"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(numbers, [5, 6, 7, 8]);
        assert_eq!(frames(&events).len(), 9);
    }

    #[test]
    fn a_stop_at_the_token_limit_is_incomplete() {
        let frames = frames(&[start(), piece(Delta::text("Hi")), finish("length")]);
        let (kind, last) = frames.last().unwrap();
        assert_eq!(kind, "response.incomplete");
        assert_eq!(last["response"]["status"], "incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }

    #[test]
    fn a_stream_without_a_whole_answer_fails_and_never_completes() {
        let frames = frames(&[
            start(),
            piece(Delta::text("Half an ans")),
            StreamEvent::Error {
                code: "stream_cut".into(),
                message: "cut after 2 tokens".into(),
                last_failure: None,
            },
        ]);
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert!(!kinds.contains(&"response.completed"), "{kinds:?}");
        let (kind, last) = frames.last().unwrap();
        assert_eq!(kind, "response.failed");
        assert_eq!(last["response"]["status"], "failed");
        assert_eq!(last["response"]["output"], json!([]));
        assert!(last["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_cut"));
        // An error before any attempt began still opens the response first.
        let frames = self::frames(&[StreamEvent::Error {
            code: "job_failed".into(),
            message: "no".into(),
            last_failure: None,
        }]);
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.failed"
            ]
        );
    }
}
