"""Cases run with popular Python clients, unchanged but for the base URL,
against a onejob server in fingerprint mode (no Idempotency-Key sent).

`python client_cases.py CASE...` runs them in order and prints each one's
observations as one JSON line for tests/clients_python.rs to check against
the job rows and the simulator's ledger. Each client is given an HTTP client
whose event hooks record every request it sent and the `x-onejob-job-id` of
every answer, so the Rust side can count jobs and upstream executions per
step. A case asserts what the client itself shows; a failed assertion exits
non-zero with the reason. Each case imports its client itself: instructor
runs in a venv of its own (tests/python/requirements-instructor.txt).

Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY.
"""

import json
import os
import sys
from typing import Literal

from pydantic import BaseModel, field_validator

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


BASE_URL = os.environ.get("ONEJOB_BASE_URL", "") + "/v1"
API_KEY = os.environ.get("ONEJOB_API_KEY", "")


class Seen:
    """What the client sent and what onejob answered, request by request."""

    def __init__(self):
        self.requests = []
        self.job_ids = []
        self.statuses = []

    def on_request(self, request):
        body = json.loads(request.content) if request.content else None
        self.requests.append({"path": request.url.path, "body": body})
        if "idempotency-key" in request.headers:
            raise AssertionError("the client sent an Idempotency-Key of its own")

    def on_response(self, response):
        self.statuses.append(response.status_code)
        self.job_ids.append(response.headers.get("x-onejob-job-id"))

    async def on_request_async(self, request):
        self.on_request(request)

    async def on_response_async(self, response):
        self.on_response(response)

    def hooks(self):
        return {"request": [self.on_request], "response": [self.on_response]}

    def async_hooks(self):
        return {"request": [self.on_request_async], "response": [self.on_response_async]}

    def report(self, **extra):
        return {
            "requests": len(self.requests),
            "job_ids": self.job_ids,
            "statuses": self.statuses,
            **extra,
        }


class Triage(BaseModel):
    """How to file a support message."""

    label: Literal["bug", "question", "praise"]
    urgent: bool


@case
def langchain_structured():
    """langchain-openai's `with_structured_output(method="function_calling")`:
    a forced tool call, sent with `parallel_tool_calls: false`."""
    import openai
    from langchain_openai import ChatOpenAI

    seen = Seen()
    llm = ChatOpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        model="default",
        http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
    )
    triage = llm.with_structured_output(Triage, method="function_calling").invoke(
        "Triage: the app crashes on start."
    )
    assert isinstance(triage, Triage), triage
    sent = seen.requests[0]["body"]
    assert sent["parallel_tool_calls"] is False, sent
    assert sent["tool_choice"]["function"]["name"] == "Triage", sent
    return seen.report(answer=triage.model_dump())


@case
def langchain_named():
    """A named message (`HumanMessage(name=...)`) goes through as `name`."""
    import openai
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    seen = Seen()
    llm = ChatOpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        model="default",
        http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
    )
    answer = llm.invoke(
        [
            SystemMessage(content="Greet whoever speaks by name."),
            HumanMessage(content="Hello, it is me.", name="ada"),
        ]
    )
    assert isinstance(answer.content, str) and answer.content, answer
    sent = seen.requests[0]["body"]
    assert sent["messages"][1]["name"] == "ada", sent
    return seen.report(content=answer.content)


@case
def langchain_responses():
    """langchain-openai with `use_responses_api=True`: `/v1/responses`."""
    import openai
    from langchain_openai import ChatOpenAI

    seen = Seen()
    llm = ChatOpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        model="default",
        use_responses_api=True,
        http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
    )
    answer = llm.invoke("Say hello.")
    assert answer.text, answer
    assert [r["path"] for r in seen.requests] == ["/v1/responses"], seen.requests
    return seen.report(content=str(answer.text))


@case
def pydantic_ai_tool():
    """A pydantic-ai agent with a function tool: one request to call the
    tool, one to answer with its result."""
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen = Seen()
    client = openai.AsyncOpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        http_client=openai.DefaultAsyncHttpxClient(event_hooks=seen.async_hooks()),
    )
    model = OpenAIChatModel("default", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, instructions="Answer weather questions with the tool.")
    calls = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"18 C and sunny in {city}"

    result = agent.run_sync("What is the weather in Paris?")
    assert len(calls) == 1, calls
    assert isinstance(result.output, str) and result.output, result.output
    assert seen.requests[1]["body"]["messages"][-1]["role"] == "tool", seen.requests[1]
    return seen.report(output=result.output, tool_calls=len(calls))


@case
def instructor_reask():
    """instructor with a validator that refuses the first answer: it asks
    again (the failed call and the validation error appended, the tool
    still forced) and the second answer passes. `max_retries=2`."""
    import instructor
    import openai

    seen = Seen()
    validations = []

    class Ticket(BaseModel):
        title: str
        priority: int

        @field_validator("title")
        @classmethod
        def not_the_first(cls, title):
            validations.append(title)
            if len(validations) == 1:
                raise ValueError("the first title is never right: write it again")
            return title

    client = instructor.from_openai(
        openai.OpenAI(
            base_url=BASE_URL,
            api_key=API_KEY,
            http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
        )
    )
    ticket = client.chat.completions.create(
        model="default",
        response_model=Ticket,
        max_retries=2,
        messages=[{"role": "user", "content": "File a ticket: the app crashes on start."}],
    )
    assert isinstance(ticket, Ticket), ticket
    assert len(validations) == 2, validations
    reask = seen.requests[1]["body"]["messages"]
    assert reask[-1]["role"] == "tool" and reask[-1]["name"] == "Ticket", reask
    return seen.report(answer=ticket.model_dump(), validations=len(validations))


@case
def openai_blind_retry():
    """The official SDK with its own retries on (`max_retries=2`) against a
    route whose only provider fails: however often it asks, the same body
    is the same job."""
    import openai

    seen = Seen()
    client = openai.OpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        max_retries=2,
        http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
    )
    try:
        client.chat.completions.create(
            model="down", messages=[{"role": "user", "content": "Are you there?"}]
        )
        raise AssertionError("a route whose provider fails answered")
    except openai.APIStatusError as e:
        error = {"status": e.status_code, "code": getattr(e, "code", None)}
    return seen.report(error=error)


@case
def openai_timeout_retry():
    """The official SDK gives up on a slow answer (`timeout=1`) and sends the
    same body again (`max_retries=2`), as it does after any lost answer: the
    retry is the same job, answered once it is done."""
    import openai

    seen = Seen()
    client = openai.OpenAI(
        base_url=BASE_URL,
        api_key=API_KEY,
        max_retries=2,
        timeout=1.0,
        http_client=openai.DefaultHttpxClient(event_hooks=seen.hooks()),
    )
    completion = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "Take your time."}]
    )
    content = completion.choices[0].message.content
    assert content, completion
    assert len(seen.requests) >= 2, "the SDK timed out and retried"
    return seen.report(content=content)


if __name__ == "__main__":
    # Several cases run in one process, in order; each prints its JSON line
    # as it finishes.
    for name in sys.argv[1:]:
        try:
            result = CASES[name]()
        except AssertionError as e:
            print(f"case {name} failed: {e!r}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(result), flush=True)
