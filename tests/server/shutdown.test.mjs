// SIGTERM: the server stops accepting connections, lets running requests finish (or cancels them
// after --shutdown-timeout, or at a second signal), and exits with status 0.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { cliArgs, startServer } from './lib.mjs';

const args = cliArgs();

// Streams a completion; resolves with the token count, finish reason and whether [DONE] came.
// `onFirst` runs once the first token chunk has arrived.
async function stream(url, maxTokens, onFirst) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: [3, 4, 5], max_tokens: maxTokens, ignore_eos: true,
                           temperature: 0, stream: true }),
  });
  assert.equal(res.status, 200);
  let raw = '';
  let fired = false;
  for await (const bytes of res.body) {
    raw += new TextDecoder().decode(bytes);
    if (!fired && raw.includes('token_ids')) {
      fired = true;
      onFirst();
    }
  }
  const events = raw.split('\n\n').filter((e) => e).map((e) => e.slice(6));
  let tokens = 0;
  let finish = null;
  for (const e of events.slice(0, -1)) {
    for (const c of JSON.parse(e).choices) {
      tokens += c.token_ids.length;
      finish = c.finish_reason ?? finish;
    }
  }
  return { tokens, finish, done: events.at(-1) === '[DONE]' };
}

async function refused(url) {
  try {
    await fetch(`${url}/health`);
    return false;
  } catch (e) {
    return e.cause?.code === 'ECONNREFUSED';
  }
}

describe('shutdown', () => {
  it('SIGTERM lets a running request finish, refuses new connections, exits 0', async () => {
    // A generous timeout, so that a slow machine still finishes the request.
    const server = await startServer(args.deepinfer, ['--shutdown-timeout', '300']);
    let signalled;
    // Enough tokens to be still running when the probe connects 300 ms after the signal: a
    // request finished by then lets the server exit, and its port can then belong to another
    // test's server.
    const result = await stream(server.url, 2000, () => {
      server.proc.kill('SIGTERM');
      signalled = new Promise((r) => setTimeout(r, 300)).then(() => refused(server.url));
    });
    assert.deepEqual(result, { tokens: 2000, finish: 'length', done: true });
    assert.ok(await signalled, 'a new connection was accepted after SIGTERM');
    const { code } = await server.exited;
    assert.equal(code, 0, server.log());
  });

  it('requests still running after --shutdown-timeout are cancelled', async () => {
    const server = await startServer(args.deepinfer, ['--shutdown-timeout', '0.5']);
    let t0;
    const result = await stream(server.url, 4000, () => {
      t0 = Date.now();
      server.proc.kill('SIGTERM');
    });
    assert.equal(result.finish, 'abort');
    assert.ok(result.done, 'the stream still ends with [DONE]');
    assert.ok(result.tokens < 4000);
    const { code } = await server.exited;
    const secs = (Date.now() - t0) / 1000;
    assert.equal(code, 0, server.log());
    assert.ok(secs < 10, `exit took ${secs} s`);
  });

  it('a second signal cancels at once', async () => {
    const server = await startServer(args.deepinfer);
    const result = await stream(server.url, 4000, () => {
      server.proc.kill('SIGTERM');
      setTimeout(() => server.proc.kill('SIGINT'), 200);
    });
    assert.equal(result.finish, 'abort');
    assert.ok(result.done);
    const { code } = await server.exited;
    assert.equal(code, 0, server.log());
  });
});
