// Structured outputs through the clients people use: the `openai` client's response_format
// (JSON schema, JSON object, streamed) and tool_choice, the Vercel AI SDK's generateObject and
// LangChain's withStructuredOutput (JSON schema and function calling), plus the offline runner.
// The model is tiny and random, so every output that parses and validates against its schema
// does so because the grammar allowed nothing else. Strings carry maxLength so that a random
// model's strings end (a free string only ends when the model picks a quote).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cliArgs, generate, requireOpenAiPackage, startServer } from './lib.mjs';

requireOpenAiPackage();
const { default: OpenAI } = await import('openai');
const { z } = await import('zod');
const { generateObject } = await import('ai');
const { createOpenAI } = await import('@ai-sdk/openai');
const { ChatOpenAI } = await import('@langchain/openai');
const args = cliArgs();
if (!args['tok-model']) throw new Error('--tok-model DIR is required');

const KEY = 'sk-structured';
const MAX = 600;

// What the tests ask for: enums, bounded integers and numbers, booleans, bounded strings and
// arrays, a nested object, an optional field.
const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  role: z.enum(['admin', 'user', 'guest']),
  score: z.number().min(-5).max(5),
  active: z.boolean(),
  tags: z.array(z.enum(['a', 'b', 'c'])).max(3),
  address: z.object({ city: z.string().max(10), zip: z.number().int().min(10000).max(99999) }),
  nickname: z.string().max(6).optional(),
});
const personSchema = z.toJSONSchema(Person);

let server, client, dir;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'deepinfer-structured-'));
  server = await startServer(args.deepinfer, ['--model', args['tok-model'], '--api-key', KEY,
                                              '--served-model-name', 'tiny-tok']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function checkPerson(text) {
  const parsed = Person.safeParse(JSON.parse(text));
  assert.ok(parsed.success, `${text}\n${JSON.stringify(parsed.error?.issues)}`);
  return parsed.data;
}

describe('structured outputs', () => {
  it('response_format json_schema: every sampled choice parses and validates', async () => {
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'Describe a person.' }],
      max_tokens: MAX, temperature: 1.0, seed: 3, n: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema, strict: true } },
    });
    assert.equal(r.choices.length, 4);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'stop', c.message.content);
      checkPerson(c.message.content);
    }
  });

  it('streamed, the deltas join into a valid object', async () => {
    const stream = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'A person, streamed.' }],
      max_tokens: MAX, temperature: 0.9, seed: 11, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema } },
    });
    let text = '', finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'stop');
    checkPerson(text);
  });

  it('thinking mode: free reasoning, then the object', async () => {
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'Think, then answer.' }],
      max_tokens: 2000, temperature: 0.8, seed: 5, reasoning_effort: 'high',
      response_format: { type: 'json_schema', json_schema: { name: 'r', schema: {
        type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 9 } },
        required: ['ok', 'n'], additionalProperties: false } } },
    });
    const c = r.choices[0];
    // The random model reasons until it happens to close the block; only then does the
    // grammar's object begin.
    if (c.finish_reason === 'stop') {
      const v = JSON.parse(c.message.content);
      assert.equal(typeof v.ok, 'boolean');
      assert.ok(Number.isInteger(v.n) && v.n >= 1 && v.n <= 9, c.message.content);
    } else {
      assert.equal(c.finish_reason, 'length');
      assert.equal(c.message.content ?? '', '');
    }
  });

  it('response_format json_object: the reply is a JSON object', async () => {
    // A free object's strings end only when the model picks a quote: some choices may run out
    // of tokens, but every choice that stopped holds an object, and some stop.
    const r = await client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'Any JSON object.' }],
      max_tokens: MAX, temperature: 1.0, seed: 1, n: 6, response_format: { type: 'json_object' },
    });
    let stopped = 0;
    for (const c of r.choices) {
      if (c.finish_reason !== 'stop') continue;
      ++stopped;
      const v = JSON.parse(c.message.content);
      assert.ok(v && typeof v === 'object' && !Array.isArray(v), c.message.content);
    }
    assert.ok(stopped > 0, JSON.stringify(r.choices.map((c) => c.finish_reason)));
  });

  it('tool_choice required and named: calls with schema-valid arguments', async () => {
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'Weather',
        parameters: { type: 'object', properties: {
          city: { type: 'string', maxLength: 10 }, unit: { type: 'string', enum: ['C', 'F'] },
          days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'unit'] } } },
      { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {
        zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } } },
    ];
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
      const r = await client.chat.completions.create({
        model: 'tiny-tok', messages: [{ role: 'user', content: 'Weather in Paris?' }],
        max_tokens: MAX, temperature: 1.0, seed: 2, tools, tool_choice, parallel_tool_calls: false,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
      assert.equal(c.message.tool_calls.length, 1);
      const call = c.message.tool_calls[0].function;
      const a = JSON.parse(call.arguments);
      if (typeof tool_choice === 'object') assert.equal(call.name, 'get_time');
      if (call.name === 'get_weather') {
        assert.ok(typeof a.city === 'string' && a.city.length <= 10, call.arguments);
        assert.ok(['C', 'F'].includes(a.unit), call.arguments);
        if ('days' in a) assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7);
      } else {
        assert.equal(call.name, 'get_time');
        assert.ok(['UTC', 'CET'].includes(a.zone), call.arguments);
      }
    }
  });

  it("the Vercel AI SDK's generateObject", async () => {
    const openai = createOpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY });
    const { object, finishReason } = await generateObject({
      model: openai.chat('tiny-tok'), schema: Person, prompt: 'A person, please.',
      maxOutputTokens: MAX, temperature: 0.7, seed: 4, maxRetries: 0,
    });
    assert.equal(finishReason, 'stop');
    Person.parse(object);
  });

  it("LangChain's withStructuredOutput, JSON schema and function calling", async () => {
    const llm = new ChatOpenAI({ model: 'tiny-tok', apiKey: KEY, configuration: { baseURL: `${server.url}/v1` },
                                 temperature: 0.7, maxTokens: MAX, maxRetries: 0 });
    const viaSchema = await llm.withStructuredOutput(Person).invoke('A person.');
    Person.parse(viaSchema);
    const viaTool = await llm.withStructuredOutput(Person, { method: 'functionCalling', name: 'person' })
      .invoke('A person, as a call.');
    Person.parse(viaTool);
  });

  it('the offline runner enforces json_schema and matches the server token for token', async () => {
    const schema = personSchema;
    const file = join(dir, 'in.jsonl');
    writeFileSync(file, JSON.stringify({ prompt: 'A person:', max_tokens: MAX, temperature: 0, json_schema: schema })
      + '\n' + JSON.stringify({ prompt: 'Free:', max_tokens: MAX, temperature: 0,
                                response_format: { type: 'json_schema', json_schema: { schema } } }) + '\n');
    const out = await generate(args.deepinfer, ['--model', args['tok-model'], '--prompts', file]);
    for (const o of out) {
      assert.equal(o.finish_reason, 'stop');
      checkPerson(o.text);
    }
    const r = await client.completions.create({
      model: 'tiny-tok', prompt: 'A person:', max_tokens: MAX, temperature: 0,
      response_format: { type: 'json_schema', json_schema: { name: 'p', schema } },
    });
    assert.equal(r.choices[0].text, out[0].text);
  });

  it('schemas that cannot be enforced get a 400 naming the place', async () => {
    await assert.rejects(client.chat.completions.create({
      model: 'tiny-tok', messages: [{ role: 'user', content: 'x' }], max_tokens: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
        type: 'object', properties: { id: { type: 'string', pattern: '^[a-z]+$' } } } } },
    }), (e) => e.status === 400 && e.param === 'response_format.json_schema.schema'
              && /properties\.id\.pattern/.test(e.message));
  });
});
