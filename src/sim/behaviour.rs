//! Behaviour specs: the request's `model` names how the simulator behaves,
//! e.g. `healthy`, `healthy:latency=20`, `healthy:latency=10..50`, `fail:503`,
//! `slow_first_byte:ms=500`, `rate_limit:retry_after=2`, and for streamed
//! requests `stream_cut:tokens=3`, `stream_stall:tokens=3`,
//! `stream_malformed:tokens=3`, `stream_no_done` (the whole answer, its
//! finish reason and usage, but no end marker), `stream_no_finish` (the
//! text, then a clean close: no finish reason, no end marker),
//! `stream_no_close` (the whole answer, its finish reason and usage, then
//! silence without the end marker or a close) (a piece is 16 characters).
//! `max_tokens` honours the request's token limit (`max_tokens`,
//! `max_completion_tokens`, Gemini's `maxOutputTokens`, Bedrock's
//! `maxTokens`): an answer longer than it is cut there and stops for its
//! length. `no_prefill` refuses a trailing assistant turn; every other behaviour
//! continues it (the answer's remainder, when the turn is its beginning).
//!
//! Grammar: `NAME[:PARAM(,PARAM)*]`, a PARAM being `KEY=VALUE` or a bare
//! status code. `latency` applies to every behaviour that answers (for a
//! stream it is the time to its first token). `tail=P%:MS` makes the
//! latency heavy-tailed: P percent of requests (e.g. `4%`, `0.5%`, spread
//! evenly over the requests) wait MS milliseconds more (`healthy:latency=20..60,tail=4%:1500`). `gap=MS`
//! paces a stream: MS between two of its events. `variant=N` (N > 0) gives
//! another answer to the same prompt (a model that does not repeat itself). `times=N`
//! makes the fault transient: the first N requests for that model name meet
//! it, later ones are answered healthily (`rate_limit:retry_after=1,times=1`
//! is one 429, then service).

use rand::Rng;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A valid answer (JSON matching the request's schema, or prose).
    Healthy,
    /// Never answers; nothing is executed.
    Hang,
    /// Executes and records in the ledger, then drops the connection.
    DropResponse,
    /// 400 invalid request.
    Reject,
    /// An error status (500 unless given).
    Fail(u16),
    /// 429 with `Retry-After` seconds.
    RateLimit {
        retry_after_s: u64,
    },
    /// 529 overloaded (Anthropic's).
    Overloaded,
    /// Executes, then waits this long before sending headers.
    SlowFirstByte(Duration),
    /// Valid output plus an invented top-level key.
    HallucinateKey,
    /// Prose instead of the JSON the schema asks for.
    IgnoreSystem,
    /// Prompt tokens as another tokenizer would count them (x1.5).
    WrongUsage,
    /// `stream: true`: some chunks, then the connection is cut.
    StreamCut,
    /// `stream: true`: some chunks, then silence forever.
    StreamStall,
    /// 400 `context_length_exceeded`, as OpenAI says a prompt does not fit.
    ContextLength,
    /// 400 `content_policy_violation`: the request is refused by policy.
    ContentFilter,
    /// Executes and records, then answers 200 with a body that is not JSON.
    MalformedBody,
    /// `stream: true`: some chunks, then one that is not JSON, then the end.
    StreamMalformed,
    /// `stream: true`: every piece of text, then the connection closes
    /// cleanly without the finish reason and end marker.
    StreamNoDone,
    StreamNoFinish,
    /// `stream: true`: the whole answer, its finish reason and usage, then
    /// silence: no end marker, and the connection held open.
    StreamNoClose,
    /// Refuses (400) a request whose last turn is the assistant's (prefill);
    /// otherwise healthy.
    NoPrefill,
    /// Healthy, but an answer longer than the request's token limit is cut
    /// there and stops for its length.
    MaxTokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    Fixed(u64),
    /// Uniform in `lo..=hi` milliseconds.
    Uniform(u64, u64),
}

impl Latency {
    pub fn parse(text: &str) -> Result<Self, String> {
        let ms = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("latency {text:?}: expected MS or LO..HI"))
        };
        match text.split_once("..") {
            Some((lo, hi)) => {
                let (lo, hi) = (ms(lo)?, ms(hi)?);
                if lo > hi {
                    return Err(format!("latency {text:?}: LO must not exceed HI"));
                }
                Ok(Latency::Uniform(lo, hi))
            }
            None => Ok(Latency::Fixed(ms(text)?)),
        }
    }

    pub fn sample(&self) -> Duration {
        match *self {
            Latency::Fixed(ms) => Duration::from_millis(ms),
            Latency::Uniform(lo, hi) => {
                Duration::from_millis(rand::thread_rng().gen_range(lo..=hi))
            }
        }
    }
}

/// A heavy tail on top of a latency: `per_mille` of the requests wait `ms` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    pub per_mille: u32,
    pub ms: u64,
}

impl Tail {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("tail {text:?}: expected P%:MS, e.g. 4%:1500");
        let (p, ms) = text.split_once(':').ok_or_else(bad)?;
        let p: f64 = p
            .trim()
            .strip_suffix('%')
            .ok_or_else(bad)?
            .parse()
            .map_err(|_| bad())?;
        let ms: u64 = ms.trim().parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("tail {text:?}: P must be between 0% and 100%"));
        }
        Ok(Tail {
            per_mille: (p * 10.0).round() as u32,
            ms,
        })
    }

    /// The extra wait of request number `n` (counted from 0 by the
    /// simulator that serves it): `ms` for `per_mille` of them, else none.
    /// Exactly `per_mille` of every 1,000 requests in a row, spread evenly,
    /// not drawn at random: a test that reads a p95 or p99 off a few
    /// hundred answers gets the share it asked for (drawn, 3% of 250 was 13
    /// answers in one run and 2 in the next).
    pub fn wait_of(&self, n: u64) -> Duration {
        let per_mille = u64::from(self.per_mille);
        if (n + 1) * per_mille / 1000 > n * per_mille / 1000 {
            Duration::from_millis(self.ms)
        } else {
            Duration::ZERO
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviour {
    pub fault: Fault,
    pub latency: Option<Latency>,
    /// The fault applies to this many requests for the model name, then
    /// the simulator answers healthily; `None`: always.
    pub times: Option<u64>,
    /// Stream faults: pieces of text sent before the fault (`tokens=N`);
    /// unset, half the stream.
    pub after_pieces: Option<u32>,
    /// Added to the latency of some requests (`tail=P%:MS`).
    pub tail: Option<Tail>,
    /// `stream: true`: the pause between two events of the stream
    /// (`gap=MS`), for a generation that takes a while.
    pub gap: Option<Duration>,
    /// Another answer to the same prompt (`variant=N`, N > 0), as a model
    /// that does not repeat itself gives: the text is drawn from another seed.
    pub variant: u64,
}

impl Behaviour {
    /// A healthy answer at once, as a replay of a recorded one is sent.
    pub fn healthy() -> Self {
        Behaviour {
            fault: Fault::Healthy,
            latency: None,
            times: None,
            after_pieces: None,
            tail: None,
            gap: None,
            variant: 0,
        }
    }

    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
        let mut latency = None;
        let mut status = None;
        let mut ms = None;
        let mut retry_after_s = None;
        let mut times = None;
        let mut after_pieces = None;
        let mut tail = None;
        let mut gap = None;
        let mut variant = 0;
        for param in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let number = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{spec:?}: {param:?} needs a whole number"))
            };
            match param.split_once('=') {
                Some(("latency", v)) => latency = Some(Latency::parse(v)?),
                Some(("tail", v)) => tail = Some(Tail::parse(v)?),
                Some(("ms", v)) => ms = Some(number(v)?),
                Some(("retry_after", v)) => retry_after_s = Some(number(v)?),
                Some(("times", v)) => times = Some(number(v)?),
                Some(("variant", v)) => variant = number(v)?,
                Some(("gap", v)) => gap = Some(Duration::from_millis(number(v)?)),
                Some(("tokens", v)) => {
                    after_pieces = Some(u32::try_from(number(v)?).unwrap_or(u32::MAX))
                }
                Some((key, _)) => return Err(format!("{spec:?}: unknown parameter {key:?}")),
                None => status = Some(number(param)?),
            }
        }
        let fault = match name.trim() {
            "healthy" => Fault::Healthy,
            "hang" => Fault::Hang,
            "drop_response" => Fault::DropResponse,
            "reject" => Fault::Reject,
            "fail" => {
                let code = status.unwrap_or(500);
                if !(400..=599).contains(&code) {
                    return Err(format!("{spec:?}: status must be 400..599"));
                }
                Fault::Fail(code as u16)
            }
            "rate_limit" => Fault::RateLimit {
                retry_after_s: retry_after_s.unwrap_or(1),
            },
            "overloaded" => Fault::Overloaded,
            "slow_first_byte" => Fault::SlowFirstByte(Duration::from_millis(ms.unwrap_or(5_000))),
            "hallucinate_key" => Fault::HallucinateKey,
            "ignore_system" => Fault::IgnoreSystem,
            "wrong_usage" => Fault::WrongUsage,
            "stream_cut" => Fault::StreamCut,
            "stream_stall" => Fault::StreamStall,
            "context_length" => Fault::ContextLength,
            "content_filter" => Fault::ContentFilter,
            "malformed_body" => Fault::MalformedBody,
            "stream_malformed" => Fault::StreamMalformed,
            "stream_no_done" => Fault::StreamNoDone,
            "stream_no_finish" => Fault::StreamNoFinish,
            "stream_no_close" => Fault::StreamNoClose,
            "no_prefill" => Fault::NoPrefill,
            "max_tokens" => Fault::MaxTokens,
            other => return Err(format!("unknown behaviour {other:?}")),
        };
        Ok(Behaviour {
            fault,
            latency,
            times,
            after_pieces,
            tail,
            gap,
            variant,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tail_is_exactly_its_share_of_any_thousand_requests_in_a_row() {
        let tail = Tail::parse("3%:3000").unwrap();
        for first in [0, 7, 1_000_003] {
            let waited = (first..first + 1000)
                .filter(|n| tail.wait_of(*n) == Duration::from_millis(3000))
                .count();
            assert_eq!(waited, 30, "from request {first}");
        }
        assert_eq!(Tail::parse("0%:3000").unwrap().wait_of(5), Duration::ZERO);
    }

    use super::*;

    #[test]
    fn specs_parse() {
        let b = Behaviour::parse("healthy:latency=10..50").unwrap();
        assert_eq!(b.latency, Some(Latency::Uniform(10, 50)));
        assert_eq!(
            Behaviour::parse("fail:503").unwrap().fault,
            Fault::Fail(503)
        );
        assert_eq!(
            Behaviour::parse("slow_first_byte:ms=250").unwrap().fault,
            Fault::SlowFirstByte(Duration::from_millis(250))
        );
        let once = Behaviour::parse("rate_limit:retry_after=1,times=1").unwrap();
        assert_eq!(
            (once.fault, once.times),
            (Fault::RateLimit { retry_after_s: 1 }, Some(1))
        );
        assert_eq!(
            Behaviour::parse("context_length").unwrap().fault,
            Fault::ContextLength
        );
        assert_eq!(
            Behaviour::parse("stream_cut:tokens=3")
                .unwrap()
                .after_pieces,
            Some(3)
        );
        let tailed = Behaviour::parse("healthy:latency=20..60,tail=4%:1500").unwrap();
        assert_eq!(
            tailed.tail,
            Some(Tail {
                per_mille: 40,
                ms: 1500
            })
        );
        assert_eq!(Tail::parse("0.5%:10").unwrap().per_mille, 5);
        assert!(Behaviour::parse("healthy:tail=4:1500").is_err());
        assert!(Behaviour::parse("healthy:tail=140%:1").is_err());
        assert_eq!(Behaviour::parse("no_prefill:variant=1").unwrap().variant, 1);
        assert!(Behaviour::parse("gpt-4o").is_err());
        assert!(Behaviour::parse("healthy:speed=3").is_err());
    }
}
