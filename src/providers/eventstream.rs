//! AWS's binary event-stream framing (`application/vnd.amazon.eventstream`),
//! in which Bedrock's ConverseStream answers.
//!
//! A message is a prelude — total length and headers length (u32, big
//! endian) and the prelude's CRC32 — then the headers, the payload, and the
//! CRC32 of everything before it. A header is a name (u8 length), a value
//! type (u8) and the value; Bedrock's are strings (type 7, u16 length):
//! `:message-type` (`event` or `exception`), `:event-type` or
//! `:exception-type`, `:content-type`.
//!
//! CRC32 is the IEEE polynomial (as zlib's), from a 1 KiB table built at
//! compile time: twenty lines, where a crate would be one more dependency
//! to vet for the same function.

use super::stream::{Framed, Framing, SseEvent};

/// Reflected IEEE 802.3 polynomial.
const POLYNOMIAL: u32 = 0xEDB8_8320;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLYNOMIAL
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC32 (IEEE) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc = TABLE[usize::from((crc as u8) ^ byte)] ^ (crc >> 8);
    }
    !crc
}

/// Prelude (12 bytes) plus the message CRC (4).
const OVERHEAD: usize = 16;
/// AWS's limit on one message (16 MiB), past which a length is corrupt.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One decoded message: its string headers and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One message in the framing: string headers, then `payload`.
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut encoded_headers = Vec::new();
    for (name, value) in headers {
        encoded_headers.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        encoded_headers.extend_from_slice(name.as_bytes());
        encoded_headers.push(7);
        encoded_headers.extend_from_slice(&u16::try_from(value.len()).unwrap_or(0).to_be_bytes());
        encoded_headers.extend_from_slice(value.as_bytes());
    }
    let total = OVERHEAD + encoded_headers.len() + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(encoded_headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    let prelude_crc = crc32(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&encoded_headers);
    out.extend_from_slice(payload);
    let message_crc = crc32(&out);
    out.extend_from_slice(&message_crc.to_be_bytes());
    out
}

fn be32(bytes: &[u8], at: usize) -> Result<u32, String> {
    bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| "message shorter than its prelude".to_string())
}

/// The headers block of a message. Values that are not strings are
/// skipped by their type's length; an unknown type is corruption.
fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    let short = || "header block ends mid-header".to_string();
    while !bytes.is_empty() {
        let name_len = usize::from(*bytes.first().ok_or_else(short)?);
        let name = bytes.get(1..1 + name_len).ok_or_else(short)?;
        let name = String::from_utf8_lossy(name).into_owned();
        let kind = *bytes.get(1 + name_len).ok_or_else(short)?;
        let rest = &bytes[2 + name_len..];
        let fixed = match kind {
            0 | 1 => Some(0),
            2 => Some(1),
            3 => Some(2),
            4 => Some(4),
            5 | 8 => Some(8),
            9 => Some(16),
            6 | 7 => None,
            other => return Err(format!("header {name:?} has unknown value type {other}")),
        };
        let used = match fixed {
            Some(n) => n,
            None => {
                let len = rest.get(..2).ok_or_else(short)?;
                let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                let value = rest.get(2..2 + len).ok_or_else(short)?;
                if kind == 7 {
                    headers.push((name, String::from_utf8_lossy(value).into_owned()));
                }
                2 + len
            }
        };
        bytes = rest.get(used..).ok_or_else(short)?;
    }
    Ok(headers)
}

/// Splits a byte stream into messages, across chunk boundaries, checking
/// both CRCs of each.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: Vec<u8>,
}

impl Decoder {
    /// Feed bytes; the messages they complete, and (after those) why the
    /// next one cannot be read, if it cannot: nothing after a corrupt
    /// message can be trusted, so the stream ends at the last good one.
    pub fn push(&mut self, bytes: &[u8]) -> (Vec<Message>, Option<String>) {
        self.buffer.extend_from_slice(bytes);
        let mut messages = Vec::new();
        loop {
            match self.next_message() {
                Ok(Some(message)) => messages.push(message),
                Ok(None) => return (messages, None),
                Err(e) => return (messages, Some(e)),
            }
        }
    }

    /// Bytes of a message begun and not finished.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    fn next_message(&mut self) -> Result<Option<Message>, String> {
        if self.buffer.len() < 12 {
            return Ok(None);
        }
        let total = be32(&self.buffer, 0)? as usize;
        let headers_len = be32(&self.buffer, 4)? as usize;
        let prelude_crc = be32(&self.buffer, 8)?;
        if crc32(&self.buffer[..8]) != prelude_crc {
            return Err("event-stream prelude CRC mismatch".into());
        }
        if total < OVERHEAD + headers_len || total > MAX_MESSAGE {
            return Err(format!(
                "event-stream message length {total} cannot hold {headers_len} bytes of headers"
            ));
        }
        if self.buffer.len() < total {
            return Ok(None);
        }
        let message: Vec<u8> = self.buffer.drain(..total).collect();
        let message_crc = be32(&message, total - 4)?;
        if crc32(&message[..total - 4]) != message_crc {
            return Err("event-stream message CRC mismatch".into());
        }
        let headers = decode_headers(&message[12..12 + headers_len])?;
        Ok(Some(Message {
            headers,
            payload: message[12 + headers_len..total - 4].to_vec(),
        }))
    }
}

/// The event stream as the shared stream runner reads it: each event as
/// an [`SseEvent`] named by its `:event-type`; an exception (or error)
/// message named `exception:{type}`, its payload kept. A corrupt message is
/// a cut after the last good one (kind `stream_cut`).
#[derive(Debug, Default)]
pub(crate) struct EventStreamFraming {
    decoder: Decoder,
}

impl Framing for EventStreamFraming {
    fn frame(&mut self, bytes: &[u8]) -> Framed {
        let (messages, broken) = self.decoder.push(bytes);
        Framed {
            events: messages.iter().map(event_of).collect(),
            broken: broken.map(|e| {
                (
                    crate::domain::ErrorKind::StreamCut,
                    format!("stream cut after the last good event-stream message: {e}"),
                )
            }),
        }
    }
}

fn event_of(message: &Message) -> SseEvent {
    let data = String::from_utf8_lossy(&message.payload).into_owned();
    match message.header(":message-type") {
        Some("exception") => SseEvent {
            event: Some(format!(
                "exception:{}",
                message.header(":exception-type").unwrap_or("unknown")
            )),
            data,
        },
        Some("error") => SseEvent {
            event: Some(format!(
                "exception:{}",
                message.header(":error-code").unwrap_or("unknown")
            )),
            data: serde_json::json!({"message": message.header(":error-message")}).to_string(),
        },
        _ => SseEvent {
            event: message.header(":event-type").map(str::to_string),
            data,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_ieee() {
        // The check value of CRC-32/ISO-HDLC (zlib's crc32).
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn messages_round_trip_across_any_split() {
        let mut bytes = encode(
            &[(":message-type", "event"), (":event-type", "messageStart")],
            br#"{"role":"assistant"}"#,
        );
        bytes.extend(encode(&[(":event-type", "metadata")], b"{}"));
        for split in 0..bytes.len() {
            let mut decoder = Decoder::default();
            let (mut first, broken) = decoder.push(&bytes[..split]);
            assert!(broken.is_none());
            let (rest, broken) = decoder.push(&bytes[split..]);
            assert!(broken.is_none());
            first.extend(rest);
            assert_eq!(first.len(), 2, "split at {split}");
            assert_eq!(first[0].header(":event-type"), Some("messageStart"));
            assert_eq!(first[0].payload, br#"{"role":"assistant"}"#);
            assert_eq!(first[1].header(":event-type"), Some("metadata"));
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn a_bad_crc_ends_the_stream_after_the_good_messages() {
        let good = encode(&[(":event-type", "messageStart")], b"{}");
        let mut bad = encode(&[(":event-type", "contentBlockDelta")], b"{\"x\":1}");
        let n = bad.len();
        bad[n - 6] ^= 0x01; // a payload byte: the message CRC no longer holds
        let mut decoder = Decoder::default();
        let (messages, broken) = decoder.push(&[good.clone(), bad].concat());
        assert_eq!(messages.len(), 1);
        assert!(broken.unwrap().contains("message CRC"));

        let mut bad_prelude = good;
        bad_prelude[3] ^= 0x01;
        let (messages, broken) = Decoder::default().push(&bad_prelude);
        assert!(messages.is_empty());
        assert!(broken.unwrap().contains("prelude CRC"));
    }
}
