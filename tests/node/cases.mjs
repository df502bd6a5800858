// Cases run with popular Node clients, pinned in package.json and unchanged
// but for the base URL, against a onejob server in fingerprint mode (no
// Idempotency-Key sent).
//
// `node cases.mjs CASE...` runs them in order and prints each one's
// observations as one JSON line for tests/clients_node.rs to check against
// the job rows and the simulator's ledger. Each client is given a `fetch`
// that records every request it sent and the `x-onejob-job-id` of every
// answer, so the Rust side can count jobs and upstream executions per step.
// A case asserts what the client itself shows; a failed assertion exits
// non-zero with the reason.
//
// Environment: ONEJOB_BASE_URL (http://host:port), ONEJOB_API_KEY.

import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';

const BASE_URL = `${process.env.ONEJOB_BASE_URL}/v1`;
const API_KEY = process.env.ONEJOB_API_KEY;

/** A `fetch` that records what the client sent and what onejob answered. */
function recorder() {
  const seen = { requests: [], job_ids: [], statuses: [] };
  const recording = async (input, init) => {
    const url = typeof input === 'string' ? input : (input.url ?? String(input));
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined));
    assert.ok(!headers.has('idempotency-key'), 'the client sent an Idempotency-Key of its own');
    const body = typeof init?.body === 'string' ? JSON.parse(init.body) : null;
    seen.requests.push({ path: new URL(url).pathname, body });
    const response = await fetch(input, init);
    seen.statuses.push(response.status);
    seen.job_ids.push(response.headers.get('x-onejob-job-id'));
    return response;
  };
  const report = (extra) => ({
    requests: seen.requests.length,
    job_ids: seen.job_ids,
    statuses: seen.statuses,
    ...extra,
  });
  return { seen, fetch: recording, report };
}

const WEATHER_PARAMETERS = {
  type: 'object',
  properties: { city: { type: 'string' } },
  required: ['city'],
  additionalProperties: false,
};

function weatherTool(calls) {
  return tool({
    description: 'The current weather in a city',
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      calls.push(city);
      return { city, temp_c: 18 };
    },
  });
}

/** An AI SDK tool loop: a call of the tool, then the answer with its result. */
async function aiToolLoop(model, rec) {
  const calls = [];
  const result = await generateText({
    model,
    tools: { get_weather: weatherTool(calls) },
    stopWhen: stepCountIs(3),
    prompt: 'What is the weather in Paris?',
  });
  assert.equal(calls.length, 1, `the tool ran once: ${JSON.stringify(calls)}`);
  assert.equal(result.steps.length, 2, 'a tool step, then the answer');
  assert.equal(result.steps[0].finishReason, 'tool-calls');
  assert.equal(result.finishReason, 'stop');
  assert.ok(result.text, 'an answer with text');
  return rec.report({ text: result.text, tool_calls: calls.length, steps: result.steps.length });
}

const CASES = {
  /** openai-node's runTools: it calls the function and sends its result. */
  async openai_run_tools() {
    const rec = recorder();
    const client = new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    const calls = [];
    const runner = client.chat.completions.runTools({
      model: 'default',
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [
        {
          type: 'function',
          function: {
            name: 'get_weather',
            description: 'The current weather in a city',
            function: (args) => {
              calls.push(args.city);
              return { city: args.city, temp_c: 18 };
            },
            parse: JSON.parse,
            parameters: WEATHER_PARAMETERS,
          },
        },
      ],
    });
    const content = await runner.finalContent();
    assert.equal(calls.length, 1, `the tool ran once: ${JSON.stringify(calls)}`);
    assert.ok(content, 'an answer with text');
    assert.equal(rec.seen.requests[1].body.messages.at(-1).role, 'tool');
    return rec.report({ text: content, tool_calls: calls.length });
  },

  /** The AI SDK's generateText tool loop over Chat Completions. */
  async ai_chat_tool_loop() {
    const rec = recorder();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    return aiToolLoop(openai.chat('default'), rec);
  },

  /** The AI SDK's default provider call, `openai(model)`: the Responses API. */
  async ai_responses_tool_loop() {
    const rec = recorder();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    const report = await aiToolLoop(openai('default'), rec);
    assert.ok(rec.seen.requests.every((r) => r.path === '/v1/responses'), JSON.stringify(rec.seen.requests));
    return report;
  },

  /**
   * A conversation's second turn with the AI SDK's default provider: the
   * first answer was stored (the Responses default), so the SDK sends it
   * back as an `item_reference` to its id, as useChat does.
   */
  async ai_responses_conversation() {
    const rec = recorder();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    const messages = [{ role: 'user', content: 'What is two and two?' }];
    const first = await generateText({ model: openai('default'), messages });
    assert.ok(first.text, 'a first answer with text');
    messages.push(...first.response.messages, { role: 'user', content: 'And then?' });
    const second = await generateText({ model: openai('default'), messages });
    assert.ok(second.text, 'a second answer with text');
    const sent = rec.seen.requests[1].body.input;
    assert.ok(
      sent.some((item) => item.type === 'item_reference'),
      `the SDK referred to the stored answer: ${JSON.stringify(sent)}`,
    );
    return rec.report({ first: first.text, text: second.text });
  },

  /** streamText over Chat Completions, with a tool: the call streamed, then the text. */
  async ai_chat_stream() {
    const rec = recorder();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    const calls = [];
    const result = streamText({
      model: openai.chat('default'),
      tools: { get_weather: weatherTool(calls) },
      stopWhen: stepCountIs(3),
      prompt: 'What is the weather in Paris?',
      onError: ({ error }) => {
        throw error;
      },
    });
    let text = '';
    let pieces = 0;
    for await (const delta of result.textStream) {
      text += delta;
      pieces += 1;
    }
    const steps = await result.steps;
    assert.equal(calls.length, 1, `the tool ran once: ${JSON.stringify(calls)}`);
    assert.equal(steps.length, 2, 'a tool step, then the answer');
    assert.equal(steps[0].finishReason, 'tool-calls');
    assert.equal(await result.finishReason, 'stop');
    assert.ok(pieces > 1, 'the answer came in pieces');
    assert.equal(text, await result.text);
    assert.ok(rec.seen.requests.every((r) => r.body.stream === true));
    return rec.report({ text, tool_calls: calls.length, steps: steps.length, pieces });
  },

  /** The AI SDK retries a 5xx whatever `x-should-retry` says (`maxRetries: 2`). */
  async ai_blind_retry() {
    const rec = recorder();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: rec.fetch });
    let error;
    try {
      await generateText({ model: openai.chat('down'), maxRetries: 2, prompt: 'Are you there?' });
    } catch (e) {
      error = e;
    }
    assert.ok(error, 'a route whose provider fails answered');
    const last = error.lastError ?? error;
    return rec.report({ error: { name: error.name, status: last.statusCode ?? null } });
  },
};

for (const name of process.argv.slice(2)) {
  const run = CASES[name];
  if (!run) {
    console.error(`no case ${name}`);
    process.exit(2);
  }
  try {
    const result = await run();
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } catch (e) {
    console.error(`case ${name} failed: ${e?.stack ?? e}`);
    process.exit(1);
  }
}
