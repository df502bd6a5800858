//! The doors a client comes through, as the benchmark drives them: each
//! builds its request body once and checks its answer the way that door's
//! client would (a job that succeeded, a completion with a choice, a stream
//! that ended with `[DONE]`, a Response `completed`), and a replay must say it is one.

use reqwest::StatusCode;
use serde_json::json;

/// One front door of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Door {
    /// `POST /v1/jobs` with `Prefer: wait=30`.
    Jobs,
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/chat/completions` with `stream: true`, read to its end.
    ChatStream,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/responses` with `stream: true`, read to its end.
    ResponsesStream,
}

impl Door {
    pub fn path(self) -> &'static str {
        match self {
            Door::Jobs => "/v1/jobs",
            Door::Chat | Door::ChatStream => "/v1/chat/completions",
            Door::Responses | Door::ResponsesStream => "/v1/responses",
        }
    }

    /// How the door is named in the tables.
    pub fn label(self) -> &'static str {
        match self {
            Door::Jobs => "/v1/jobs + Prefer: wait",
            Door::Chat => "/v1/chat/completions",
            Door::ChatStream => "/v1/chat/completions, stream",
            Door::Responses => "/v1/responses",
            Door::ResponsesStream => "/v1/responses, stream",
        }
    }

    /// The body every request through this door sends: the same prompt and
    /// parameters on every door, so the doors differ only in their dialect.
    pub fn body(self) -> serde_json::Result<Vec<u8>> {
        let messages = json!([{ "role": "user", "content": super::MESSAGE }]);
        serde_json::to_vec(&match self {
            Door::Jobs => json!({
                "messages": messages,
                "params": { "temperature": 0, "max_tokens": 64 },
                "route": "default",
            }),
            Door::Chat => json!({
                "model": "default",
                "messages": messages,
                "temperature": 0,
                "max_tokens": 64,
            }),
            Door::ChatStream => json!({
                "model": "default",
                "messages": messages,
                "temperature": 0,
                "max_tokens": 64,
                "stream": true,
            }),
            Door::Responses => json!({
                "model": "default",
                "input": messages,
                "temperature": 0,
                "max_output_tokens": 64,
            }),
            Door::ResponsesStream => json!({
                "model": "default",
                "input": messages,
                "temperature": 0,
                "max_output_tokens": 64,
                "stream": true,
            }),
        })
    }

    /// The status a new job answers with (a replay answers 200 on every door).
    fn created(self) -> StatusCode {
        match self {
            Door::Jobs => StatusCode::CREATED,
            Door::Chat | Door::ChatStream | Door::Responses | Door::ResponsesStream => {
                StatusCode::OK
            }
        }
    }

    /// Whether an answer is right: the status a new job (`fresh`) or a
    /// replay gets, the replay header exactly on replays, and a body that
    /// holds a finished answer.
    pub fn check(self, status: StatusCode, replayed: bool, body: &[u8], fresh: bool) -> bool {
        let status_ok = status
            == if fresh {
                self.created()
            } else {
                StatusCode::OK
            };
        status_ok && self.answered(body) && replayed != fresh
    }

    /// Whether a body holds a finished answer of this door.
    pub fn answered(self, body: &[u8]) -> bool {
        match self {
            Door::Jobs => serde_json::from_slice::<serde_json::Value>(body)
                .is_ok_and(|job| job["state"] == "succeeded"),
            Door::Chat => serde_json::from_slice::<serde_json::Value>(body)
                .is_ok_and(|c| c["choices"][0]["message"]["content"].is_string()),
            Door::ChatStream => {
                let text = String::from_utf8_lossy(body);
                text.contains("\"chat.completion.chunk\"") && text.contains("data: [DONE]")
            }
            Door::Responses => serde_json::from_slice::<serde_json::Value>(body)
                .is_ok_and(|r| r["status"] == "completed" && r["output"][0]["type"] == "message"),
            Door::ResponsesStream => {
                String::from_utf8_lossy(body).contains("event: response.completed\n")
            }
        }
    }
}
