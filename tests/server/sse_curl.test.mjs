// The raw server-sent-event framing as curl sees it: headers, the chunked transfer encoding, one
// "data: {json}" line plus a blank line per event, usage before the final "data: [DONE]".
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, it } from 'node:test';

import { assertSseFraming, cliArgs, startServer } from './lib.mjs';

const args = cliArgs();
if (!args['tok-model']) throw new Error('--tok-model DIR is required');
let server;

before(async () => {
  server = await startServer(args.deepinfer, ['--model', args['tok-model']]);
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

// curl -i: returns {status, headers (lower-case names), body}.
function curl(path, body, extra = []) {
  const r = spawnSync('curl', ['-sS', '-N', '-i', '-X', 'POST', '-H', 'Content-Type: application/json',
                               '--data-binary', JSON.stringify(body), ...extra, `${server.url}${path}`],
                      { encoding: 'latin1', maxBuffer: 64 << 20 });
  assert.equal(r.status, 0, `curl failed: ${r.stderr}`);
  const at = r.stdout.indexOf('\r\n\r\n');
  const head = r.stdout.slice(0, at).split('\r\n');
  const headers = {};
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    headers[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim();
  }
  return { status: Number(head[0].split(' ')[1]), headers,
           body: Buffer.from(r.stdout.slice(at + 4), 'latin1').toString('utf8') };
}

const events = (body) => body.split('\n\n').filter((e) => e).map((e) => e.slice('data: '.length));

describe('SSE framing with curl', () => {
  it('completions: chunked event stream, usage, [DONE]', async () => {
    const req = { prompt: 'Hello', max_tokens: 8, temperature: 0 };
    const whole = curl('/v1/completions', req);
    assert.equal(whole.status, 200);
    assert.match(whole.headers['content-type'], /^application\/json/);
    const text = JSON.parse(whole.body).choices[0].text;

    const r = curl('/v1/completions', { ...req, stream: true, stream_options: { include_usage: true } });
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-type'], 'text/event-stream');
    assert.equal(r.headers['transfer-encoding'], 'chunked');
    assert.equal(r.headers['cache-control'], 'no-cache');
    assertSseFraming(r.body);
    const ev = events(r.body);
    assert.equal(ev.at(-1), '[DONE]');
    const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
    const usage = chunks.at(-1);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 8);
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'length');
    for (const c of chunks) {
      assert.equal(c.object, 'text_completion');
      assert.equal(c.id, chunks[0].id);
    }
    assert.equal(chunks.slice(0, -1).map((c) => c.choices[0].text).join(''), text);
  });

  it('chat: the role first, then deltas', async () => {
    const r = curl('/v1/chat/completions', {
      messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, temperature: 0, stream: true,
    });
    assert.equal(r.status, 200);
    assertSseFraming(r.body);
    const chunks = events(r.body).slice(0, -1).map((e) => JSON.parse(e));
    assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  });

  it('each HTTP chunk carries whole events', async () => {
    const r = curl('/v1/completions', { prompt: 'Hello', max_tokens: 6, stream: true }, ['--raw']);
    let rest = Buffer.from(r.body, 'utf8');
    let chunks = 0;
    for (;;) {
      const eol = rest.indexOf('\r\n');
      const size = parseInt(rest.subarray(0, eol).toString(), 16);
      assert.ok(Number.isInteger(size), `bad chunk size line: ${rest.subarray(0, eol)}`);
      const data = rest.subarray(eol + 2, eol + 2 + size).toString();
      assert.equal(rest.subarray(eol + 2 + size, eol + 4 + size).toString(), '\r\n');
      rest = rest.subarray(eol + 4 + size);
      if (size === 0) break;
      ++chunks;
      assert.match(data, /^(data: [^\n]+\n\n)+$/, `chunk with a partial event: ${JSON.stringify(data)}`);
    }
    assert.equal(rest.length, 0);
    assert.ok(chunks >= 2);
  });

  it('compression applies to JSON bodies, never to event streams', async () => {
    const req = { prompt: 'Hello', max_tokens: 4, temperature: 0 };
    const plain = curl('/v1/completions', req);
    const packed = curl('/v1/completions', req, ['--compressed']);
    assert.match(packed.headers['content-encoding'] ?? '', /^(br|gzip)$/);
    assert.equal(JSON.parse(packed.body).choices[0].text, JSON.parse(plain.body).choices[0].text);
    const s = curl('/v1/completions', { ...req, stream: true }, ['--compressed']);
    assert.equal(s.headers['content-encoding'], undefined);
    assertSseFraming(s.body);
  });
});
