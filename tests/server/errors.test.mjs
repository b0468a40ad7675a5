// Every refusal the server makes: its HTTP status and OpenAI-shaped body
// ({"error": {"message", "type", "param", "code"}}), and the server still serving afterwards.
// Runs against the built-in tiny model (no tokenizer) with an API key, --max-model-len 64 and a
// 1 MiB body limit.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cliArgs, startServer } from './lib.mjs';

const args = cliArgs();
const KEY = 'secret-key';
let server;

before(async () => {
  server = await startServer(args.deepinfer, ['--api-key', KEY, '--max-model-len', '64',
                                              '--max-body-mib', '1']);
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

async function call(path, body, { key = KEY, method = 'POST', headers = {}, raw = false } = {}) {
  const h = { ...headers };
  if (key) h.Authorization = `Bearer ${key}`;
  const init = { method, headers: h };
  if (body !== undefined) {
    init.body = raw ? body : JSON.stringify(body);
    if (typeof ReadableStream !== 'undefined' && body instanceof ReadableStream) init.duplex = 'half';
  }
  const res = await fetch(`${server.url}${path}`, init);
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by the caller */ }
  return { status: res.status, json, text, type: res.headers.get('content-type') };
}

function expectError(r, status, { type = 'invalid_request_error', param = null, code }) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json, `not JSON: ${r.text}`);
  assert.match(r.type, /^application\/json/);
  assert.deepEqual(Object.keys(r.json), ['error']);
  const e = r.json.error;
  assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 10, e.message);
  assert.equal(e.type, type, e.message);
  assert.equal(e.param, param, e.message);
  assert.equal(e.code, code, e.message);
}

const CMPL = '/v1/completions';
const ids = (n, from = 1) => Array.from({ length: n }, (_, i) => from + i);

describe('errors', () => {
  it('malformed JSON and non-object bodies', async () => {
    expectError(await call(CMPL, '{"prompt": [1, 2', { raw: true }), 400, { code: 'invalid_json' });
    expectError(await call(CMPL, '', { raw: true }), 400, { code: 'invalid_json' });
    expectError(await call(CMPL, [1, 2]), 400, { code: 'invalid_json' });
    const deep = `{"prompt": ${'['.repeat(5000)}${']'.repeat(5000)}}`;
    expectError(await call(CMPL, deep, { raw: true }), 400, { code: 'invalid_json' });
  });

  it('wrong types name the field', async () => {
    expectError(await call(CMPL, { prompt: [1], max_tokens: '10' }), 400,
                { param: 'max_tokens', code: 'invalid_type' });
    expectError(await call(CMPL, { prompt: [1], temperature: 'hot' }), 400,
                { param: 'temperature', code: 'invalid_type' });
    expectError(await call(CMPL, { prompt: [1], stream: 1 }), 400,
                { param: 'stream', code: 'invalid_type' });
    expectError(await call(CMPL, { prompt: { text: 'x' } }), 400,
                { param: 'prompt', code: 'invalid_type' });
    expectError(await call(CMPL, { prompt: [1, 'two'] }), 400,
                { param: 'prompt[1]', code: 'invalid_type' });
    expectError(await call(CMPL, { prompt: [1], top_p: 7 }), 400,
                { param: 'top_p', code: 'invalid_value' });
    // A streaming request refused up front is a plain JSON error, not an event stream.
    const r = await call(CMPL, { prompt: [1], stream: true, n: 'two' });
    expectError(r, 400, { param: 'n', code: 'invalid_type' });
  });

  it('unknown model', async () => {
    expectError(await call(CMPL, { model: 'gpt-4o', prompt: [1] }), 404,
                { param: 'model', code: 'model_not_found' });
  });

  it('prompt too long for --max-model-len', async () => {
    expectError(await call(CMPL, { prompt: ids(64) }), 400,
                { param: 'prompt', code: 'context_length_exceeded' });
    expectError(await call(CMPL, { prompt: ids(60), max_tokens: 5 }), 400,
                { param: 'max_tokens', code: 'context_length_exceeded' });
    const ok = await call(CMPL, { prompt: ids(60), max_tokens: 4, temperature: 0 });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.choices[0].token_ids.length, 4);
  });

  it('out-of-vocab token ids', async () => {
    expectError(await call(CMPL, { prompt: [1, 129280] }), 400,
                { param: 'prompt[1]', code: 'invalid_value' });
    expectError(await call(CMPL, { prompt: [[5], [-3]] }), 400,
                { param: 'prompt[1][0]', code: 'invalid_value' });
    expectError(await call(CMPL, { prompt: [5], stop_token_ids: [1e9] }), 400,
                { param: 'stop_token_ids[0]', code: 'invalid_value' });
  });

  it('features this model or server cannot serve', async () => {
    expectError(await call(CMPL, { prompt: 'hello' }), 400, { param: 'prompt', code: 'no_tokenizer' });
    expectError(await call(CMPL, { prompt: [1], stop: ['x'] }), 400,
                { param: 'stop', code: 'no_tokenizer' });
    expectError(await call('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }),
                400, { param: 'messages', code: 'no_tokenizer' });
    expectError(await call(CMPL, { prompt: [1], echo: true }), 400,
                { param: 'echo', code: 'unsupported_value' });
  });

  it('bodies over the size limit get 413', async () => {
    const big = JSON.stringify({ prompt: [1], pad: 'x'.repeat(1536 * 1024) });
    expectError(await call(CMPL, big, { raw: true }), 413, { code: 'request_too_large' });
    // The same without a Content-Length (chunked upload).
    const chunk = new TextEncoder().encode('x'.repeat(64 * 1024));
    let sent = 0;
    const stream = new ReadableStream({
      pull(controller) {
        if (sent === 0) controller.enqueue(new TextEncoder().encode('{"pad": "'));
        if (sent++ < 32) controller.enqueue(chunk);
        else { controller.enqueue(new TextEncoder().encode('"}')); controller.close(); }
      },
    });
    expectError(await call(CMPL, stream, { raw: true }), 413, { code: 'request_too_large' });
  });

  it('API key', async () => {
    expectError(await call(CMPL, { prompt: [1] }, { key: null }), 401,
                { type: 'authentication_error', code: 'invalid_api_key' });
    expectError(await call(CMPL, { prompt: [1] }, { key: 'wrong' }), 401,
                { type: 'authentication_error', code: 'invalid_api_key' });
    expectError(await call('/v1/models', undefined, { method: 'GET', key: 'secret-kez' }), 401,
                { type: 'authentication_error', code: 'invalid_api_key' });
    // Health and metrics stay open for probes.
    assert.equal((await call('/health', undefined, { method: 'GET', key: null })).status, 200);
    assert.equal((await call('/metrics', undefined, { method: 'GET', key: null })).status, 200);
    // The scheme is case-insensitive.
    for (const scheme of ['bearer', 'BEARER', 'Bearer']) {
      const r = await call('/v1/models', undefined,
                           { method: 'GET', key: null, headers: { Authorization: `${scheme} ${KEY}` } });
      assert.equal(r.status, 200, `${scheme}: ${r.text}`);
    }
  });

  it('an empty key is refused; the key may come from a file or the environment', async () => {
    const run = (extra, env = {}) => spawnSync(args.deepinfer, ['serve', '--port', '0', ...extra],
                                               { encoding: 'utf8', env: { ...process.env, ...env },
                                                 timeout: 60000 });
    const empty = run(['--api-key', '']);
    assert.notEqual(empty.status, 0);
    assert.match(empty.stderr, /--api-key .*is empty/);
    const dir = mkdtempSync(join(tmpdir(), 'deepinfer-key-'));
    try {
      writeFileSync(join(dir, 'blank'), '\n');
      const blank = run(['--api-key-file', join(dir, 'blank')]);
      assert.notEqual(blank.status, 0);
      assert.match(blank.stderr, /--api-key-file .*empty/);
      const missing = run(['--api-key-file', join(dir, 'nope')]);
      assert.notEqual(missing.status, 0);
      assert.match(missing.stderr, /cannot read/);
      writeFileSync(join(dir, 'key'), 'from-file\n');
      for (const [extra, env, key] of [[['--api-key-file', join(dir, 'key')], {}, 'from-file'],
                                       [[], { DEEPINFER_API_KEY: 'from-env' }, 'from-env']]) {
        const s = await startServer(args.deepinfer, extra, { env });
        try {
          const get = (k) => fetch(`${s.url}/v1/models`, { headers: { Authorization: `Bearer ${k}` } });
          assert.equal((await get(key)).status, 200);
          assert.equal((await get('other')).status, 401);
        } finally {
          await s.stop();
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a second server on a port in use fails to start', async () => {
    const second = spawnSync(args.deepinfer, ['serve', '--port', String(server.port)],
                             { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(second.status, 0, second.stderr);
    assert.match(second.stderr, /cannot listen on .*:\d+/);
    // The first one still answers.
    assert.equal((await call('/health', undefined, { method: 'GET', key: null })).status, 200);
  });

  it('unknown endpoints and methods', async () => {
    expectError(await call('/v1/embeddings', { input: 'x' }), 404, { code: 'not_found' });
    expectError(await call(CMPL, undefined, { method: 'GET' }), 405, { code: 'method_not_allowed' });
    expectError(await call(CMPL, 'a=b', { raw: true,
      headers: { 'Content-Type': 'multipart/form-data; boundary=xyz' } }), 415,
    { code: 'unsupported_media_type' });
  });

  it('a garbage request line gets a JSON 400 and the server lives on', async () => {
    const reply = await new Promise((resolve, reject) => {
      const s = net.connect(server.port, '127.0.0.1', () => s.write('NONSENSE\r\n\r\n'));
      let data = '';
      s.on('data', (d) => {
        data += d;
        if (data.endsWith('}')) { s.destroy(); resolve(data); }
      });
      s.on('end', () => resolve(data));
      s.on('error', reject);
    });
    assert.match(reply, /^HTTP\/1\.1 400 /);
    assert.match(reply, /"error":\{"message":/);
    const ok = await call(CMPL, { prompt: [1, 2, 3], max_tokens: 2 });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(server.proc.exitCode, null);
  });

  it('a Content-Length that is no byte count is answered at once', async () => {
    const raw = (head) => new Promise((resolve, reject) => {
      const started = Date.now();
      const s = net.connect(server.port, '127.0.0.1', () => s.write(head));
      let data = '';
      s.on('data', (d) => {
        data += d;
        if (data.endsWith('}')) { s.destroy(); resolve({ data, ms: Date.now() - started }); }
      });
      s.on('error', reject);
    });
    for (const [len, status, code] of [['-5', 400, 'invalid_content_length'],
                                       ['99999999999999999999', 400, 'invalid_content_length'],
                                       ['+12', 400, 'invalid_content_length'],
                                       ['999999999', 413, 'request_too_large']]) {
      const { data, ms } = await raw(`POST ${CMPL} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n`
                                     + `Content-Length: ${len}\r\n\r\n`);
      assert.match(data, new RegExp(`^HTTP/1\\.1 ${status} `), len);
      assert.match(data, new RegExp(`"code":"${code}"`), len);
      assert.ok(ms < 2000, `${len}: answered after ${ms} ms`);
    }
  });
});
