"""Cases run with the official `openai` Python SDK's `client.responses`
against a onejob server.

Each case is a function; `python responses_cases.py CASE...` runs them in
order and prints each one's observations as one JSON line for the Rust test
(tests/responses_sdk.rs) to check against the database and the simulator's
ledger. A case asserts what the SDK itself shows; a failed assertion exits
non-zero with the reason.

Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY; some cases
read ONEJOB_OTHER_API_KEY (another owner's key) or ONEJOB_RESPONSE_ID.
"""

import json
import os
import sys
import time

import openai
import pydantic
from openai import OpenAI

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def client(api_key=None):
    # No SDK retries: every request the server sees is one the case sent.
    return OpenAI(
        base_url=os.environ["ONEJOB_BASE_URL"] + "/v1",
        api_key=api_key or os.environ["ONEJOB_API_KEY"],
        max_retries=0,
    )


def create(key, **kwargs):
    """A response with an Idempotency-Key; the parsed Response and headers."""
    raw = client().responses.with_raw_response.create(
        extra_headers={"Idempotency-Key": key}, **kwargs
    )
    return raw.parse(), raw.headers


def job_of(headers):
    return headers["x-onejob-job-id"]


def until(check, what, seconds=30):
    """Poll `check` until it returns something true, at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {seconds} s"
        time.sleep(0.05)


@case
def plain():
    response, headers = create(
        "r-plain",
        model="default",
        instructions="Be brief.",
        input="Say hello.",
        temperature=0,
        max_output_tokens=64,
        metadata={"order": "42"},
    )
    assert response.object == "response", response
    assert response.status == "completed", response
    assert response.output[0].type == "message", response.output
    assert response.output[0].content[0].type == "output_text"
    assert response.output_text, "an answer with text"
    assert response.instructions == "Be brief.", response.instructions
    assert response.metadata == {"order": "42"}, response.metadata
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0, response.usage
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    again = client().responses.retrieve(response.id)
    assert again.id == response.id and again.status == "completed", again
    assert again.output_text == response.output_text, (again.output_text, response.output_text)
    return {
        "job_id": job_of(headers),
        "provider": headers["x-onejob-provider"],
        "attempt": headers["x-onejob-attempt"],
        "id": response.id,
        "model": response.model,
        "text": response.output_text,
        "usage": [response.usage.input_tokens, response.usage.output_tokens],
    }


@case
def same_key_twice():
    body = dict(model="default", input="Once only.")
    first, h1 = create("r-twice", **body)
    second, h2 = create("r-twice", **body)
    assert job_of(h1) == job_of(h2), (h1, h2)
    assert second.id == first.id, (first.id, second.id)
    assert second.output_text == first.output_text
    assert h2.get("idempotent-replayed") == "true"
    # The same key with another body: a conflict the SDK does not retry.
    try:
        create("r-twice", model="default", input="Something else.")
        raise AssertionError("a reused key was accepted")
    except openai.ConflictError as e:
        assert e.status_code == 409 and e.response.headers["x-should-retry"] == "false"
        assert e.body["type"] == "conflict_error", e.body
    return {"job_id": job_of(h1), "id": first.id}


@case
def stream_helper():
    texts = []
    kinds = []
    with client().responses.stream(
        extra_headers={"Idempotency-Key": "r-stream"},
        model="default",
        instructions="Be thorough.",
        input="Explain tides",
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                texts.append(event.delta)
        final = stream.get_final_response()
    text = "".join(texts)
    assert text, "streamed text"
    assert final.output_text == text, (final.output_text, text)
    assert final.status == "completed", final
    assert final.usage.output_tokens > 0, final.usage
    return {
        "id": final.id,
        "model": final.model,
        "text": text,
        "kinds": dedupe(kinds),
        "usage": [final.usage.input_tokens, final.usage.output_tokens],
    }


def dedupe(kinds):
    out = []
    for kind in kinds:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


@case
def stream_events():
    """The raw events of `create(stream=True)`, in order."""
    stream = client().responses.create(
        extra_headers={"Idempotency-Key": "r-events"},
        model="default",
        input="Count to three.",
        stream=True,
    )
    kinds = []
    numbers = []
    ids = set()
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if hasattr(event, "response"):
            ids.add(event.response.id)
    assert numbers == list(range(len(numbers))), numbers
    assert len(ids) == 1, ids
    return {
        "kinds": dedupe(kinds),
        "job_id": stream.response.headers["x-onejob-job-id"],
        "id": ids.pop(),
    }


WEATHER = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


@case
def function_round_trip():
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked, h1 = create("r-tool-1", model="default", input=ask, tools=WEATHER)
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) == 1, asked.output
    call = calls[0]
    assert call.name == "get_weather", call
    assert isinstance(json.loads(call.arguments)["city"], str), call.arguments
    # The streamed replay of the same call: the same function call, its
    # arguments assembled by the helper from the argument deltas.
    kinds = []
    with client().responses.stream(
        extra_headers={"Idempotency-Key": "r-tool-1"}, model="default", input=ask, tools=WEATHER
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        replayed = stream.get_final_response()
    replayed_call = next(item for item in replayed.output if item.type == "function_call")
    assert replayed_call.call_id == call.call_id, (replayed_call, call)
    assert replayed_call.arguments == call.arguments, (replayed_call, call)
    assert replayed.id == asked.id
    # The output goes back with the call's output: the model answers in text.
    follow = ask + [item.model_dump(exclude_none=True) for item in asked.output]
    follow.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 18}'}
    )
    answered, h2 = create("r-tool-2", model="default", input=follow, tools=WEATHER)
    assert answered.status == "completed", answered
    assert answered.output_text, answered.output
    # The same answer, sent as OpenAI's docs send it: only the output, on
    # top of the response that asked for it.
    continued, h3 = create(
        "r-tool-3",
        model="default",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 18}'}],
        tools=WEATHER,
    )
    assert continued.status == "completed", continued
    assert continued.output_text, continued.output
    return {
        "job_ids": [job_of(h1), job_of(h2), job_of(h3)],
        "call_id": call.call_id,
        "kinds": dedupe(kinds),
    }


class Weather(pydantic.BaseModel):
    city: str
    temp_c: int


@case
def json_schema():
    parsed = client().responses.parse(
        extra_headers={"Idempotency-Key": "r-schema"},
        model="default",
        input="The weather in Paris, as JSON.",
        text_format=Weather,
    )
    assert parsed.status == "completed", parsed
    assert isinstance(parsed.output_parsed, Weather), parsed.output_parsed
    return {"id": parsed.id, "text": parsed.output_text, "format": parsed.text.format.type}


@case
def previous_response():
    first, h1 = create(
        "r-prev-1", model="default", instructions="Answer in French.", input="My name is Ada."
    )
    second, h2 = create(
        "r-prev-2", model="default", previous_response_id=first.id, input="What is my name?"
    )
    assert second.previous_response_id == first.id, second
    assert second.instructions is None, second.instructions
    other = client(os.environ["ONEJOB_OTHER_API_KEY"])
    try:
        other.responses.create(
            extra_headers={"Idempotency-Key": "r-prev-other"},
            model="default",
            previous_response_id=first.id,
            input="Whose is this?",
        )
        raise AssertionError("another owner continued the response")
    except openai.NotFoundError as e:
        assert e.body["param"] == "previous_response_id", e.body
        other_create = e.body
    try:
        other.responses.retrieve(first.id)
        raise AssertionError("another owner retrieved the response")
    except openai.NotFoundError as e:
        other_retrieve = e.body
    try:
        client().responses.retrieve("resp_" + "0" * 32)
        raise AssertionError("an unknown id was found")
    except openai.NotFoundError as e:
        unknown = e.body
    return {
        "job_ids": [job_of(h1), job_of(h2)],
        "other_create": other_create,
        "other_retrieve": other_retrieve,
        "unknown": unknown,
    }


@case
def background():
    response, headers = create("r-background", model="default", input="Take your time.", background=True)
    assert response.status in ("queued", "in_progress"), response.status
    assert response.background is True
    done = until(
        lambda: (r := client().responses.retrieve(response.id)).status == "completed" and r,
        "completed",
    )
    assert done.output_text, done
    return {
        "job_id": job_of(headers),
        "id": response.id,
        "first": response.status,
        "first_model": response.model,
        "model": done.model,
        "text": done.output_text,
    }


@case
def background_streamed_by_id():
    """A background response read as a stream by id, then resumed past an event."""
    response, headers = create("r-bg-stream", model="default", input="Stream me later.", background=True)
    kinds, text, numbers = [], [], []
    for event in client().responses.retrieve(response.id, stream=True):
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert numbers == list(range(len(numbers))), numbers
    assert final.id == response.id and final.status == "completed", final
    resumed = [
        (event.type, event.sequence_number)
        for event in client().responses.retrieve(response.id, stream=True, starting_after=4)
    ]
    assert [n for _, n in resumed] == numbers[5:], (resumed, numbers)
    return {
        "job_id": job_of(headers),
        "kinds": dedupe(kinds),
        "text": "".join(text),
        "all": kinds,
        "resumed": [kind for kind, _ in resumed],
    }


@case
def background_start():
    """A background response on a slow provider; its id (for a later case)."""
    response, headers = create("r-survivor", model="default", input="Survive a crash.", background=True)
    assert response.status in ("queued", "in_progress"), response.status
    return {"job_id": job_of(headers), "id": response.id, "status": response.status}


@case
def background_finish():
    """The response of ONEJOB_RESPONSE_ID, polled until it is final."""
    response_id = os.environ["ONEJOB_RESPONSE_ID"]
    done = until(
        lambda: (r := client().responses.retrieve(response_id)).status
        not in ("queued", "in_progress")
        and r,
        "a final status",
        seconds=60,
    )
    return {"id": done.id, "status": done.status, "text": done.output_text}


@case
def cancel():
    response, headers = create("r-cancel", model="slow", input="Never mind.", background=True)
    assert response.status in ("queued", "in_progress"), response.status
    cancelled = client().responses.cancel(response.id)
    assert cancelled.status == "cancelled", cancelled
    again = client().responses.retrieve(response.id)
    assert again.status == "cancelled", again
    return {"job_id": job_of(headers), "id": response.id, "status": again.status}


@case
def items_and_delete():
    response, headers = create(
        "r-items",
        model="default",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi there."}]},
        ],
    )
    listed = client().responses.input_items.list(response.id, order="asc")
    kinds = [(item.type, item.role, item.content[0].text) for item in listed.data]
    client().responses.delete(response.id)
    try:
        client().responses.retrieve(response.id)
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass
    return {"job_id": job_of(headers), "items": kinds}


@case
def refusals():
    seen = {}
    try:
        create("r-web", model="default", input="Search.", tools=[{"type": "web_search"}])
    except openai.UnprocessableEntityError as e:
        seen["web_search"] = [e.status_code, e.body["param"], "web_search" in e.body["message"]]
    try:
        client().responses.create(model="default", input="No key.")
    except openai.BadRequestError as e:
        seen["no_key"] = [e.status_code, e.body["code"]]
    try:
        client("not-a-key").responses.create(model="default", input="Hi.")
    except openai.AuthenticationError as e:
        seen["bad_credentials"] = [e.status_code, e.body["type"]]
    return seen


@case
def stream_refused():
    """A streamed refusal through the helper: response.failed, and no final response."""
    kinds = []
    with client().responses.stream(
        extra_headers={"Idempotency-Key": "r-refused"}, model="filter", input="Something filtered."
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        try:
            stream.get_final_response()
            raise AssertionError("a refused stream had a final response")
        except RuntimeError as e:
            assert "response.completed" in str(e), e
    return {"kinds": dedupe(kinds)}


@case
def cut_with_prefill_fallback():
    """A stream cut mid-answer, continued on a fallback: one whole answer."""
    text = []
    with client().responses.stream(
        extra_headers={"Idempotency-Key": "r-cut-continued"}, model="cut", input="Explain tides"
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        final = stream.get_final_response()
    assert final.output_text == "".join(text), (final.output_text, text)
    return {"id": final.id, "text": final.output_text, "model": final.model}


@case
def cut_without_prefill_fallback():
    """A stream cut mid-answer with no fallback that continues it: whole,
    or response.failed — never response.completed on a truncated text."""
    kinds, text = [], []
    final = error = response_id = None
    with client().responses.stream(
        extra_headers={"Idempotency-Key": "r-cut"}, model="cut-no-prefill", input="Explain tides"
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.created":
                response_id = event.response.id
            elif event.type == "response.output_text.delta":
                text.append(event.delta)
            elif event.type == "response.failed":
                error = event.response.error.message
            elif event.type == "response.completed":
                final = event.response.output_text
    return {"kinds": dedupe(kinds), "text": "".join(text), "final": final, "error": error, "id": response_id}


def main():
    for name in sys.argv[1:]:
        print(json.dumps(CASES[name]()), flush=True)


if __name__ == "__main__":
    main()
