//! Chat Completions answers its errors in OpenAI's shape
//! ([`crate::http::openai_error`], shared with the Responses door).

pub use crate::http::openai_error::OpenAiError as CompatError;
