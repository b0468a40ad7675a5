// The official `openai` npm client against `deepinfer serve` on a tiny random model with the real
// DeepSeek-V3 tokenizer: completions and chat, streaming and not. Greedy outputs must equal the
// offline runner's (`deepinfer generate`) for the same prompts; the model's text is gibberish, so
// the offline runner is the only expectation that means anything.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cliArgs, generate, requireOpenAiPackage, startServer } from './lib.mjs';

requireOpenAiPackage();
const { default: OpenAI } = await import('openai');
const args = cliArgs();
if (!args['tok-model']) throw new Error('--tok-model DIR is required');

const KEY = 'sk-test-123';
const PROMPTS = ['The capital of France is', 'Once upon a time', 'def fibonacci(n):'];
const CHATS = ['Hello there', 'What is 2+2?'];
const MAX = 12;

let server, client, dir, offline;

function offlineRun(lines, flags = []) {
  const file = join(dir, `in-${Math.random().toString(36).slice(2)}.jsonl`);
  writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  return generate(args.deepinfer, ['--model', args['tok-model'], '--prompts', file, ...flags]);
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'deepinfer-openai-'));
  server = await startServer(args.deepinfer, ['--model', args['tok-model'], '--api-key', KEY,
                                              '--served-model-name', 'tiny-tok']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const greedy = { max_tokens: MAX, temperature: 0 };
  const seeded = { prompt: PROMPTS[2], max_tokens: MAX, temperature: 0.8, seed: 7 };
  const completions = await offlineRun([...PROMPTS.map((p) => ({ prompt: p, ...greedy })), seeded]);
  offline = {
    completions: completions.slice(0, PROMPTS.length),
    seeded: completions[PROMPTS.length],
    chat: await offlineRun(CHATS.map((p) => ({ prompt: p, ...greedy })), ['--chat']),
    thinking: await offlineRun(CHATS.map((p) => ({ prompt: p, ...greedy })), ['--chat', '--thinking']),
  };
});

after(async () => {
  if (server) {
    const { code } = await server.stop();
    assert.equal(code, 0, `server exit status\n${server.log()}`);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('openai client', () => {
  it('lists the served model', async () => {
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ['tiny-tok']);
  });

  it('completions equal the offline runner (greedy)', async () => {
    for (let i = 0; i < PROMPTS.length; ++i) {
      const r = await client.completions.create({
        model: 'tiny-tok', prompt: PROMPTS[i], max_tokens: MAX, temperature: 0,
        return_token_ids: true,
      });
      const want = offline.completions[i];
      assert.equal(r.object, 'text_completion');
      assert.equal(r.choices.length, 1);
      assert.equal(r.choices[0].text, want.text);
      assert.equal(r.choices[0].finish_reason, want.finish_reason);
      assert.deepEqual(r.choices[0].token_ids, want.output_ids);
      assert.deepEqual(r.choices[0].prompt_token_ids, want.prompt_ids);
      assert.deepEqual(r.usage, {
        prompt_tokens: want.prompt_ids.length,
        completion_tokens: want.output_ids.length,
        total_tokens: want.prompt_ids.length + want.output_ids.length,
      });
    }
  });

  it('streamed completions concatenate to the same text, with usage last', async () => {
    const want = offline.completions[0];
    const stream = await client.completions.create({
      model: 'tiny-tok', prompt: PROMPTS[0], max_tokens: MAX, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let usage = null;
    let chunks = 0;
    for await (const chunk of stream) {
      ++chunks;
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(chunks > 2, 'tokens arrive in several chunks');
    assert.equal(text, want.text);
    assert.equal(finish, want.finish_reason);
    assert.equal(usage.completion_tokens, want.output_ids.length);
    assert.equal(usage.prompt_tokens, want.prompt_ids.length);
  });

  it('several prompts with n choices each, numbered prompt-major', async () => {
    const r = await client.completions.create({
      model: 'tiny-tok', prompt: PROMPTS.slice(0, 2), n: 2, max_tokens: MAX, temperature: 0,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    for (const c of r.choices) assert.equal(c.text, offline.completions[Math.floor(c.index / 2)].text);
    assert.equal(r.usage.prompt_tokens,
                 offline.completions[0].prompt_ids.length + offline.completions[1].prompt_ids.length);
  });

  it('stop strings end the text where the offline runner ends it', async () => {
    const full = offline.completions[1].text;
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    assert.ok(stop.trim().length > 0, `stop string from ${JSON.stringify(full)}`);
    const [want] = await offlineRun([{ prompt: PROMPTS[1], max_tokens: MAX, temperature: 0, stop: [stop] }]);
    assert.equal(want.finish_reason, 'stop');
    const r = await client.completions.create({
      model: 'tiny-tok', prompt: PROMPTS[1], max_tokens: MAX, temperature: 0, stop: [stop],
    });
    assert.equal(r.choices[0].text, want.text);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(!r.choices[0].text.includes(stop));
    const stream = await client.completions.create({
      model: 'tiny-tok', prompt: PROMPTS[1], max_tokens: MAX, temperature: 0, stop: stop, stream: true,
    });
    let text = '';
    for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
    assert.equal(text, want.text);
  });

  it('a seed reproduces the offline runner; n choices get distinct seeds', async () => {
    const want = offline.seeded;
    const r = await client.completions.create({
      model: 'tiny-tok', prompt: PROMPTS[2], max_tokens: MAX, temperature: 0.8, seed: 7, n: 2,
    });
    assert.equal(r.choices[0].text, want.text);
    assert.notEqual(r.choices[1].text, r.choices[0].text);
  });

  it('chat equals the offline runner, streaming and not', async () => {
    for (let i = 0; i < CHATS.length; ++i) {
      const want = offline.chat[i];
      const messages = [{ role: 'user', content: CHATS[i] }];
      const r = await client.chat.completions.create({
        model: 'tiny-tok', messages, max_tokens: MAX, temperature: 0,
      });
      assert.equal(r.object, 'chat.completion');
      assert.equal(r.choices[0].message.role, 'assistant');
      assert.equal(r.choices[0].message.content, want.content);
      assert.equal(r.choices[0].finish_reason, want.finish_reason);
      assert.equal(r.usage.prompt_tokens, want.prompt_ids.length);

      const stream = await client.chat.completions.create({
        model: 'tiny-tok', messages, max_tokens: MAX, temperature: 0, stream: true,
      });
      let content = '';
      let first = null;
      let finish = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        first ??= c.delta;
        content += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(first.role, 'assistant');
      assert.equal(content, want.content);
      assert.equal(finish, want.finish_reason);
    }
  });

  it('thinking mode reports reasoning_content separately', async () => {
    const want = offline.thinking[0];
    const messages = [{ role: 'user', content: CHATS[0] }];
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages, max_tokens: MAX, temperature: 0, thinking: { type: 'enabled' },
    });
    assert.equal(r.choices[0].message.reasoning_content, want.reasoning_content);
    assert.equal(r.choices[0].message.content, want.content);
    assert.equal(r.usage.prompt_tokens, want.prompt_ids.length);
    const stream = await client.chat.completions.create({
      model: 'tiny-tok', messages, max_tokens: MAX, temperature: 0, stream: true,
      chat_template_kwargs: { thinking: true },
    });
    let reasoning = '';
    let content = '';
    for await (const chunk of stream) {
      reasoning += chunk.choices[0]?.delta.reasoning_content ?? '';
      content += chunk.choices[0]?.delta.content ?? '';
    }
    assert.equal(reasoning, want.reasoning_content);
    assert.equal(content, want.content);
  });

  it('logprobs: the greedy token is the top alternative', async () => {
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: CHATS[1] }], max_tokens: 5,
      temperature: 0, logprobs: true, top_logprobs: 3,
    });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
      assert.equal(t.top_logprobs.length, 3);
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
      assert.ok(t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
      assert.equal(t.logprob, t.top_logprobs[0].logprob);
      assert.equal(t.token, t.top_logprobs[0].token);
      assert.ok(t.logprob <= 0);
    }
  });

  it('tools and tool results are encoded into the prompt', async () => {
    const tools = [{
      type: 'function',
      function: {
        name: 'get_weather', description: 'Current weather of a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    }];
    const tokenize = async (body) => {
      const res = await fetch(`${server.url}/tokenize`, {
        method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      });
      assert.equal(res.status, 200);
      return (await res.json()).count;
    };
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    const withTools = await client.chat.completions.create({
      model: 'tiny-tok', messages, tools, max_tokens: 4, temperature: 0,
    });
    const without = await client.chat.completions.create({
      model: 'tiny-tok', messages, max_tokens: 4, temperature: 0,
    });
    assert.equal(withTools.usage.prompt_tokens, await tokenize({ messages, tools }));
    assert.ok(withTools.usage.prompt_tokens > without.usage.prompt_tokens + 20);
    const turn = [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18C and sunny' },
    ];
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: turn, tools, max_tokens: 4, temperature: 0,
    });
    assert.equal(r.usage.prompt_tokens, await tokenize({ messages: turn, tools }));
    assert.ok(r.usage.prompt_tokens > withTools.usage.prompt_tokens);
  });

  it('renders content parts, response formats and big integers as the encoder does', async () => {
    // Raw bodies: JSON.stringify cannot carry an integer beyond 2^53.
    const render = async (body) => {
      const post = async (path, text) => {
        const res = await fetch(`${server.url}${path}`, {
          method: 'POST', headers: { Authorization: `Bearer ${KEY}` }, body: text,
        });
        assert.equal(res.status, 200, await res.clone().text());
        return res.json();
      };
      const t = await post('/tokenize', body);
      return (await post('/detokenize', JSON.stringify({ tokens: t.tokens }))).prompt;
    };
    const text = await render(`{"messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema":
        {"type": "object", "properties": {"n": {"type": "integer",
          "maximum": 123456789012345678901234567890}}}}}}`);
    assert.ok(text.includes('<｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the '
                            + 'following schema to reply:\n{"type": "object", "properties": {"n": '
                            + '{"type": "integer", "maximum": 123456789012345678901234567890}}}'),
              text);
    assert.ok(text.includes('<｜User｜>first\n\nsecond<｜Assistant｜>'), text);
    // The official client's structured-output request is accepted.
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'Give JSON.' }], max_tokens: 4,
      temperature: 0,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } },
    });
    assert.equal(r.choices.length, 1);
  });

  it('every golden chat case renders identically through /tokenize', async () => {
    const fixture = JSON.parse(readFileSync(new URL('../data/tokenizer/chat_cases.json', import.meta.url)));
    let checked = 0;
    for (const c of fixture.cases) {
      const o = c.options;
      // Engine-only options with no request field, and integers a JS number cannot hold.
      if (o.add_bos === false || c.name.startsWith('big_numbers')) continue;
      const body = {
        messages: c.messages.map((m) => {
          const out = { ...m };
          if (m.tool_calls) {
            out.tool_calls = m.tool_calls.map((t) => ({
              ...(t.id ? { id: t.id } : {}), type: 'function',
              function: { name: t.name, arguments: t.arguments },
            }));
          }
          return out;
        }),
      };
      if (o.thinking !== undefined) body.thinking = o.thinking;
      if (o.reasoning_effort !== undefined) body.reasoning_effort = o.reasoning_effort;
      if (o.tools) body.tools = o.tools;
      if (o.drop_thinking !== undefined) body.chat_template_kwargs = { drop_thinking: o.drop_thinking };
      if (o.add_generation_prompt !== undefined) body.add_generation_prompt = o.add_generation_prompt;
      if (o.continue_final_message !== undefined) body.continue_final_message = o.continue_final_message;
      if (o.response_format) {
        body.response_format = { type: 'json_schema', json_schema: { name: 'r', schema: o.response_format } };
      }
      const post = async (path, b) => {
        const res = await fetch(`${server.url}${path}`, {
          method: 'POST', headers: { Authorization: `Bearer ${KEY}` }, body: JSON.stringify(b),
        });
        assert.equal(res.status, 200, `${c.name}: ${await res.clone().text()}`);
        return res.json();
      };
      const t = await post('/tokenize', body);
      const text = (await post('/detokenize', { tokens: t.tokens })).prompt;
      // /detokenize leaves special tokens out (the tokenizer's BOS among them).
      const want = c.expected.replace(/^<｜begin▁of▁sentence｜>/, '');
      assert.equal(text.replace(/^<｜begin▁of▁sentence｜>/, ''), want, c.name);
      ++checked;
    }
    assert.ok(checked >= 25, `only ${checked} cases checked`);
  });

  it('tokenize and detokenize round-trip', async () => {
    const post = async (path, body) => {
      const res = await fetch(`${server.url}${path}`, {
        method: 'POST', headers: { Authorization: `Bearer ${KEY}` }, body: JSON.stringify(body),
      });
      assert.equal(res.status, 200);
      return res.json();
    };
    const t = await post('/tokenize', { prompt: PROMPTS[0] });
    assert.deepEqual(t.tokens, offline.completions[0].prompt_ids);
    const d = await post('/detokenize', { tokens: t.tokens });
    assert.equal(d.prompt, PROMPTS[0]);
  });

  it('errors arrive as the client library\'s typed errors', async () => {
    await assert.rejects(
      client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
    const wrongKey = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(wrongKey.models.list(),
                         (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
    await assert.rejects(
      client.chat.completions.create({ model: 'tiny-tok', messages: [], max_tokens: 1 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
  });
});
