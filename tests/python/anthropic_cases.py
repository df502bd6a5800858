"""Cases run with the official `anthropic` Python SDK against a onejob server.

Each case is a function; `python anthropic_cases.py CASE...` runs them in
order and prints each one's observations as one JSON line for the Rust test
(tests/anthropic_sdk.rs) to check against the database and the simulator's
ledger. A case asserts what the SDK itself shows; a failed assertion exits
non-zero with the reason.

Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY.
"""

import json
import os
import sys

import anthropic
from anthropic import Anthropic

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def client(api_key=None):
    # No SDK retries: every request the server sees is one the case sent.
    # The key goes as `x-api-key`, the SDK's default.
    return Anthropic(
        base_url=os.environ["ONEJOB_BASE_URL"],
        api_key=api_key or os.environ["ONEJOB_API_KEY"],
        max_retries=0,
    )


def create(key, **kwargs):
    """A message with an Idempotency-Key; the parsed Message and headers."""
    raw = client().messages.with_raw_response.create(
        extra_headers={"Idempotency-Key": key}, **kwargs
    )
    return raw.parse(), raw.headers


def streamed(key, **kwargs):
    """The `messages.stream()` helper: the text as it arrived, the final
    message it assembled, and the headers."""
    with client().messages.stream(extra_headers={"Idempotency-Key": key}, **kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        headers = stream.response.headers
    return text, final, headers


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


@case
def plain():
    message, headers = create(
        "a-plain",
        model="default",
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
        metadata={"user_id": "user-7"},
        # This SDK version has no sampling keywords; the API still takes them.
        extra_body={"temperature": 0},
    )
    assert message.type == "message", message
    assert message.role == "assistant"
    assert message.stop_reason == "end_turn", message
    assert message.content[0].type == "text"
    assert text_of(message), "an answer with text"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0, message.usage
    return {
        "job_id": headers["x-onejob-job-id"],
        "provider": headers["x-onejob-provider"],
        "attempt": headers["x-onejob-attempt"],
        "id": message.id,
        "model": message.model,
        "text": text_of(message),
    }


@case
def system_blocks():
    message, headers = create(
        "a-system",
        model="default",
        max_tokens=64,
        system=[{"type": "text", "text": "Answer in one word."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Colour of the sky?"}]}],
    )
    assert message.stop_reason == "end_turn", message
    return {"job_id": headers["x-onejob-job-id"], "text": text_of(message)}


@case
def same_key_twice():
    body = dict(
        model="default", max_tokens=64, messages=[{"role": "user", "content": "Once only."}]
    )
    first, h1 = create("a-twice", **body)
    second, h2 = create("a-twice", **body)
    assert h1["x-onejob-job-id"] == h2["x-onejob-job-id"], (h1, h2)
    assert second.id == first.id, (first.id, second.id)
    assert text_of(second) == text_of(first)
    assert h2.get("idempotent-replayed") == "true"
    return {"job_id": h1["x-onejob-job-id"], "id": first.id}


@case
def stream_helper():
    text, final, headers = streamed(
        "a-stream",
        model="default",
        max_tokens=256,
        system="Be thorough.",
        messages=[{"role": "user", "content": "Explain tides"}],
    )
    assert text, "streamed text"
    assert text_of(final) == text, (text, final)
    assert final.stop_reason == "end_turn", final
    assert final.usage.output_tokens > 0, final.usage
    return {
        "job_id": headers["x-onejob-job-id"],
        "provider": headers["x-onejob-provider"],
        "id": final.id,
        "model": final.model,
        "text": text,
        "usage": [final.usage.input_tokens, final.usage.output_tokens],
    }


@case
def stream_events():
    """The raw events of `create(stream=True)`, in order."""
    stream = client().messages.create(
        extra_headers={"Idempotency-Key": "a-events"},
        model="default",
        max_tokens=64,
        messages=[{"role": "user", "content": "Count to three."}],
        stream=True,
    )
    kinds = []
    for event in stream:
        if not kinds or kinds[-1] != event.type:
            kinds.append(event.type)
    return {"kinds": kinds, "job_id": stream.response.headers["x-onejob-job-id"]}


WEATHER = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


@case
def tool_round_trip():
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked, h1 = create(
        "a-tool-1", model="default", max_tokens=256, messages=messages, tools=WEATHER
    )
    assert asked.stop_reason == "tool_use", asked
    use = next(b for b in asked.content if b.type == "tool_use")
    assert use.name == "get_weather"
    assert isinstance(use.input["city"], str), use.input
    # The streamed replay of the same call: the same tool_use, assembled by
    # the helper from input_json_delta events.
    _, replayed, h_replay = streamed(
        "a-tool-1", model="default", max_tokens=256, messages=messages, tools=WEATHER
    )
    assert h_replay["x-onejob-job-id"] == h1["x-onejob-job-id"]
    replayed_use = next(b for b in replayed.content if b.type == "tool_use")
    assert replayed_use.input == use.input and replayed_use.id == use.id, (replayed_use, use)
    assert replayed.stop_reason == "tool_use"
    messages.append({"role": "assistant", "content": [b.model_dump() for b in asked.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": '{"temp_c": 18}'}],
        }
    )
    answered, h2 = create(
        "a-tool-2", model="default", max_tokens=256, messages=messages, tools=WEATHER
    )
    assert answered.stop_reason == "end_turn", answered
    assert text_of(answered)
    # The tool raised instead (what pydantic-ai sends for a ModelRetry): the
    # same turn as an error result is taken, as another request.
    messages[-1] = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": use.id,
                "content": "ValueError: the weather service is down",
                "is_error": True,
            }
        ],
    }
    failed, h3 = create(
        "a-tool-3", model="default", max_tokens=256, messages=messages, tools=WEATHER
    )
    assert text_of(failed) or failed.stop_reason == "tool_use", failed
    return {
        "job_ids": [h1["x-onejob-job-id"], h2["x-onejob-job-id"], h3["x-onejob-job-id"]],
        "tool": use.name,
        "input": use.input,
    }


@case
def count_tokens():
    # No Idempotency-Key: counting makes no job.
    counted = client().messages.count_tokens(
        model="default",
        system="Be brief.",
        messages=[{"role": "user", "content": "How many tokens is this?"}],
    )
    assert counted.input_tokens > 0, counted
    return {"input_tokens": counted.input_tokens, "tokenizer": getattr(counted, "tokenizer", None)}


def absorbed(route, key):
    text, final, headers = streamed(
        key,
        model=route,
        max_tokens=256,
        messages=[{"role": "user", "content": "Explain tides"}],
    )
    assert final.stop_reason == "end_turn", final
    assert text_of(final) == text
    return {"job_id": headers["x-onejob-job-id"], "provider": headers["x-onejob-provider"], "text": text, "model": final.model}


@case
def reset_before_headers():
    return absorbed("reset", "a-reset")


@case
def unavailable_503():
    return absorbed("unavailable", "a-503")


@case
def slow_first_token():
    return absorbed("slow", "a-slow")


@case
def cut_with_prefill_fallback():
    return absorbed("cut", "a-cut")


@case
def cut_without_prefill_fallback():
    """Ends whole or with an error event; never `end_turn` on a truncated text."""
    seen = {"text": "", "stop_reason": None, "error": None, "job_id": None}
    try:
        with client().messages.stream(
            extra_headers={"Idempotency-Key": "a-cut-np"},
            model="cut-no-prefill",
            max_tokens=256,
            messages=[{"role": "user", "content": "Explain tides"}],
        ) as stream:
            seen["job_id"] = stream.response.headers["x-onejob-job-id"]
            for event in stream:
                if event.type == "text":
                    seen["text"] += event.text
                if event.type == "message_delta":
                    seen["stop_reason"] = event.delta.stop_reason
    except anthropic.APIStatusError as e:
        seen["error"] = e.body["error"]["type"] if isinstance(e.body, dict) else str(e.body)
        seen["message"] = e.body["error"]["message"] if isinstance(e.body, dict) else ""
    return seen


@case
def models():
    """The Models API as the SDK reads it: the list (also walked one route
    a page, by the SDK's own `after_id` paging), one model, an unknown one."""
    c = client()
    listed = [
        [m.type, m.id, m.display_name, m.created_at.isoformat(), m.lifecycle]
        for m in c.models.list()
    ]
    walked = [m.id for m in c.models.list(limit=1)]
    first = c.models.list(limit=1)
    one = c.models.retrieve("filter")
    try:
        c.models.retrieve("nope")
        raise AssertionError("an unknown model was found")
    except anthropic.NotFoundError as e:
        missing = [e.status_code, e.body["error"]["type"]]
    return {
        "listed": listed,
        "walked": walked,
        "first_page": [[m.id for m in first.data], first.has_more, first.last_id],
        "one": [one.type, one.id, one.display_name],
        "missing": missing,
    }


def refused(route, key, api_key=None):
    try:
        client(api_key).messages.create(
            extra_headers={"Idempotency-Key": key},
            model=route,
            max_tokens=64,
            messages=[{"role": "user", "content": "Hello"}],
        )
    except anthropic.APIStatusError as e:
        return [e.status_code, type(e).__name__, e.body["error"]["type"]]
    raise AssertionError(f"{route} was answered")


def refused_streamed(route, key):
    """The error a stream ends with, as the SDK raises it: its type and
    message (what clients such as pydantic-ai classify by)."""
    try:
        with client().messages.stream(
            extra_headers={"Idempotency-Key": key},
            model=route,
            max_tokens=64,
            messages=[{"role": "user", "content": "Hello, streamed"}],
        ) as stream:
            for _ in stream:
                pass
    except anthropic.APIStatusError as e:
        return [e.body["error"]["type"], e.body["error"]["message"]]
    raise AssertionError(f"{route} was streamed")


@case
def refusals():
    return {
        "filter": refused("filter", "a-filter"),
        "too-long": refused("too-long", "a-long"),
        "too-long-streamed": refused_streamed("too-long", "a-long-streamed"),
        "no-credentials": refused("default", "a-auth", api_key="oj_not-a-key"),
    }


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(json.dumps(CASES[name]()), flush=True)
