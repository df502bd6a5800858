"""Cases run with the official `openai` Python SDK against a onejob server.

Each case is a function; `python sdk_cases.py CASE...` runs them in order and
prints each one's observations as one JSON line for the Rust test (tests/openai_sdk.rs) to
check against the database and the simulator's ledger. A case asserts what
the SDK itself shows; a failed assertion exits non-zero with the reason.

Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY.
"""

import json
import os
import sys

import openai
from openai import OpenAI

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def client():
    # No SDK retries: every request the server sees is one the case sent.
    return OpenAI(
        base_url=os.environ["ONEJOB_BASE_URL"] + "/v1",
        api_key=os.environ["ONEJOB_API_KEY"],
        max_retries=0,
    )


def create(key, **kwargs):
    """A completion with an Idempotency-Key; the parsed answer and headers."""
    raw = client().chat.completions.with_raw_response.create(
        extra_headers={"Idempotency-Key": key}, **kwargs
    )
    return raw.parse(), raw.headers


@case
def plain():
    completion, headers = create(
        "sdk-plain",
        model="default",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Say hello."},
        ],
        temperature=0,
        max_completion_tokens=64,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert choice.message.role == "assistant"
    assert choice.message.content, "an answer with text"
    assert completion.usage.total_tokens > 0, completion.usage
    return {
        "job_id": headers["x-onejob-job-id"],
        "provider": headers["x-onejob-provider"],
        "model": completion.model,
        "content": choice.message.content,
    }


@case
def same_key_twice():
    body = dict(model="default", messages=[{"role": "user", "content": "Once only."}])
    first, h1 = create("sdk-twice", **body)
    second, h2 = create("sdk-twice", **body)
    assert h1["x-onejob-job-id"] == h2["x-onejob-job-id"], (h1, h2)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.id == first.id
    assert h2.get("idempotent-replayed") == "true"
    return {"job_id": h1["x-onejob-job-id"], "content": first.choices[0].message.content}


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


@case
def tool_round_trip():
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked, h1 = create("sdk-tool-1", model="default", messages=messages, tools=WEATHER)
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str), arguments
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'})
    answered, h2 = create("sdk-tool-2", model="default", messages=messages, tools=WEATHER)
    final = answered.choices[0]
    assert final.finish_reason == "stop", final
    assert final.message.content
    return {
        "job_ids": [h1["x-onejob-job-id"], h2["x-onejob-job-id"]],
        "tool": call.function.name,
        "arguments": arguments,
    }


TRIAGE = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["bug", "question", "praise"]},
        "urgent": {"type": "boolean"},
    },
    "required": ["label", "urgent"],
    "additionalProperties": False,
}


@case
def json_schema():
    completion, headers = create(
        "sdk-schema",
        model="default",
        messages=[{"role": "user", "content": "Triage: the app crashes on start."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "triage", "schema": TRIAGE, "strict": True},
        },
    )
    answer = json.loads(completion.choices[0].message.content)
    assert answer["label"] in ("bug", "question", "praise"), answer
    assert isinstance(answer["urgent"], bool), answer
    assert set(answer) == {"label", "urgent"}, answer
    return {"job_id": headers["x-onejob-job-id"], "answer": answer}


@case
def refusals_raise():
    """Provider refusals reach the SDK as the exceptions it defines."""
    seen = {}
    try:
        create("sdk-too-long", model="too-long", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("context_length_exceeded did not raise")
    except openai.BadRequestError as e:
        seen["too-long"] = [e.status_code, e.code, e.type]
    try:
        client().chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], n=2,
            extra_headers={"Idempotency-Key": "sdk-n2"},
        )
        raise AssertionError("n=2 did not raise")
    except openai.UnprocessableEntityError as e:
        seen["n"] = [e.status_code, e.param]
    return seen


def stream(key, **kwargs):
    """A streamed completion: the chunks the SDK yields, and the headers."""
    raw = client().chat.completions.with_raw_response.create(
        extra_headers={"Idempotency-Key": key}, stream=True, **kwargs
    )
    return raw.parse(), raw.headers


@case
def streamed():
    body = dict(
        model="default",
        messages=[{"role": "user", "content": "Stream me a story."}],
        stream_options={"include_usage": True},
    )
    chunks, headers = stream("sdk-stream", **body)
    chunks = list(chunks)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert len(pieces) > 1, "the answer comes in pieces"
    assert finishes == ["stop"], finishes
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens > 0, chunks[-1]
    text = "".join(pieces)
    # The same key again, streamed: the same text; and not streamed: the same.
    again, h2 = stream("sdk-stream", **body)
    again_text = "".join(c.choices[0].delta.content or "" for c in again if c.choices)
    assert again_text == text, (again_text, text)
    assert h2["x-onejob-job-id"] == headers["x-onejob-job-id"]
    plain, _ = create("sdk-stream", model="default", messages=body["messages"])
    assert plain.choices[0].message.content == text
    return {
        "job_id": headers["x-onejob-job-id"],
        "content": text,
        "models": sorted({c.model for c in chunks}),
    }


@case
def stream_cut_raises():
    """A stream cut with no continuation raises; the truncated text is never
    handed back as a finished answer."""
    pieces, finishes = [], []
    chunks, headers = stream(
        "sdk-stream-cut", model="cut", messages=[{"role": "user", "content": "Explain tides."}]
    )
    try:
        for c in chunks:
            if c.choices:
                pieces.append(c.choices[0].delta.content or "")
                if c.choices[0].finish_reason:
                    finishes.append(c.choices[0].finish_reason)
        raise AssertionError("the cut stream ended without an error")
    except openai.APIError as e:
        error = {"message": e.message, "code": getattr(e, "code", None)}
    assert finishes == [], finishes
    return {"job_id": headers["x-onejob-job-id"], "partial": "".join(pieces), "error": error}


if __name__ == "__main__":
    # Several cases run in one process, in order (importing the SDK costs
    # more than a case); each prints its JSON line as it finishes.
    for name in sys.argv[1:]:
        try:
            result = CASES[name]()
        except AssertionError as e:
            print(f"case {name} failed: {e!r}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(result), flush=True)
