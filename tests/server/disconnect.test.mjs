// Clients that go away: a streaming client that stops reading, a non-streaming client that
// closes its socket, and a client whose request is still queued. Each cancels its engine request
// and frees its KV, and the server counts the disconnect.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { cliArgs, idle, metrics, replicas, startServer, waitMetrics } from './lib.mjs';

const args = cliArgs();
let server;

before(async () => {
  // Two sequences at a time per replica, so one more request waits.
  server = await startServer(args.deepinfer, ['--max-num-seqs', '2']);
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

const LONG = { prompt: [5, 6, 7, 8], max_tokens: 4000, ignore_eos: true, temperature: 0 };

// Starts a streaming request and resolves once `chunks` events have arrived (0: headers only).
async function openStream(chunks) {
  const ctl = new AbortController();
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', body: JSON.stringify({ ...LONG, stream: true }), signal: ctl.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let seen = 0;
  while (seen < chunks) {
    const { value, done } = await reader.read();
    assert.ok(!done, 'stream ended early');
    seen += new TextDecoder().decode(value).split('\n\n').length - 1;
  }
  return { close: () => ctl.abort(), reader };
}

const disconnects = async () => (await metrics(server.url)).deepinfer_client_disconnects_total;

describe('disconnect', () => {
  it('a streaming client that goes away cancels its request', async () => {
    const before = await disconnects();
    const s = await openStream(3);
    const m = await metrics(server.url);
    assert.equal(m.deepinfer_num_requests_running, 1);
    assert.ok(m.deepinfer_kv_blocks_used > 0);
    const t0 = Date.now();
    s.close();
    const after = await waitMetrics(server.url, idle, 5000);
    console.log(`streaming client: KV freed ${Date.now() - t0} ms after the disconnect`);
    assert.equal(after.deepinfer_client_disconnects_total, before + 1);
    assert.ok(after['deepinfer_requests_finished_total{finish_reason="abort"}'] >= 1);
  });

  it('a non-streaming client that goes away cancels its request', async () => {
    const before = await disconnects();
    const ctl = new AbortController();
    // The status line comes first; the body follows when the request ends.
    const body = fetch(`${server.url}/v1/completions`, {
      method: 'POST', body: JSON.stringify(LONG), signal: ctl.signal,
    }).then((res) => res.text()).catch((e) => e);
    await waitMetrics(server.url, (m) => m.deepinfer_num_requests_running === 1 &&
                      m.deepinfer_generation_tokens_total > 0);
    ctl.abort();
    assert.equal((await body).name, 'AbortError');
    const after = await waitMetrics(server.url, idle, 5000);
    assert.equal(after.deepinfer_client_disconnects_total, before + 1);
  });

  it('a queued request is dropped when its client goes away', async () => {
    const before = await disconnects();
    // Every replica's slots taken, then one more.
    const slots = 2 * replicas();
    const taken = [];
    for (let i = 0; i < slots; ++i) taken.push(await openStream(1));
    const queued = await openStream(0);
    await waitMetrics(server.url, (m) => m.deepinfer_num_requests_waiting === 1);
    queued.close();
    const m = await waitMetrics(server.url, (x) => x.deepinfer_num_requests_waiting === 0, 5000);
    assert.equal(m.deepinfer_num_requests_running, slots, 'the others keep running');
    assert.equal(m.deepinfer_client_disconnects_total, before + 1);
    for (const s of taken) s.close();
    const done = await waitMetrics(server.url, idle, 5000);
    assert.equal(done.deepinfer_client_disconnects_total, before + 1 + slots);
    // The server still serves.
    const r = await fetch(`${server.url}/v1/completions`, {
      method: 'POST', body: JSON.stringify({ prompt: [1, 2], max_tokens: 3 }),
    });
    assert.equal((await r.json()).choices[0].token_ids.length, 3);
  });
});
