"""Time to first token through onejob, with the official `openai` Python SDK
(tests/hedging_sdk.rs). `python hedging_ttft.py MODEL N THREADS PREFIX`
streams N completions of route MODEL, THREADS at a time, each with its own
Idempotency-Key, and prints one JSON line: every request's time to its first
content chunk (ms, in order of the keys) and the provider that answered.

Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI


def main():
    model, n, threads, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    # No SDK retries: every request the server sees is one this sent.
    client = OpenAI(
        base_url=os.environ["ONEJOB_BASE_URL"] + "/v1",
        api_key=os.environ["ONEJOB_API_KEY"],
        max_retries=0,
    )

    def one(i):
        started = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": f"{prefix} question {i}"}],
            stream=True,
            extra_headers={"Idempotency-Key": f"{prefix}-{i}"},
        )
        first = None
        text = []
        for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                text.append(chunk.choices[0].delta.content)
        assert first is not None and text, f"request {i} streamed no text"
        return (first - started) * 1000.0, raw.headers.get("x-onejob-provider")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(one, range(n)))
    print(
        json.dumps(
            {
                "ttft_ms": [round(t, 2) for t, _ in results],
                "providers": [p for _, p in results],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
