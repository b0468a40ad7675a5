// `deepinfer serve --cp 2 --ep 2`: the leader serves HTTP and schedules; a follower rank replays
// its steps. Concurrent requests (streaming and not) return the single-rank offline runner's
// tokens (fp32 numerics, where ranks are bit-identical to one rank), a follower ignores the
// SIGTERM a service manager sends to every process, and SIGTERM to the leader ends both.
// `serve --dp 2 --ep 2`: two replicas, each scheduling its own requests, give the same tokens,
// and the death of a replica fails its calls as the death of a follower does.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cliArgs, generate, idle, sseData, startServer, waitMetrics } from './lib.mjs';

const args = cliArgs();
let server, dir, expected;
const requests = Array.from({ length: 10 }, (_, i) => ({
  prompt: Array.from({ length: 3 + 7 * i }, (_, j) => 2 + ((i * 7919 + j * 104729) % 129000)),
  max_tokens: 4 + (i % 5) * 3,
  temperature: 0,
}));

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'deepinfer-ranks-'));
  const file = join(dir, 'prompts.jsonl');
  writeFileSync(file, requests.map((r) => JSON.stringify({
    prompt_ids: r.prompt, max_tokens: r.max_tokens, temperature: 0,
  })).join('\n') + '\n');
  expected = await generate(args.deepinfer, ['--dtype', 'fp32', '--prompts', file]);
  server = await startServer(args.deepinfer,
                             ['--cp', '2', '--ep', '2', '--dtype', 'fp32', '--max-num-seqs', '4']);
});

after(() => {
  if (server) server.proc.kill('SIGKILL');
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const children = (pid) => readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8')
  .trim().split(/\s+/).filter(Boolean).map(Number);

async function complete(req, stream, url = server.url) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST', body: JSON.stringify({ ...req, stream }),
  });
  assert.equal(res.status, 200);
  if (!stream) return (await res.json()).choices[0].token_ids;
  const ids = [];
  for (const d of await sseData(res)) {
    if (d === '[DONE]') continue;
    for (const c of JSON.parse(d).choices) ids.push(...(c.token_ids ?? []));
  }
  return ids;
}

describe('serve with context and expert parallel ranks', () => {
  it('concurrent requests give the single-rank tokens', async () => {
    const got = await Promise.all(requests.map((r, i) => complete(r, i % 2 === 0)));
    got.forEach((ids, i) => assert.deepEqual(ids, expected[i].output_ids, `request ${i}`));
    await waitMetrics(server.url, idle);
  });

  it('a follower ignores SIGTERM; SIGTERM to the leader ends every rank', async () => {
    const followers = children(server.proc.pid);
    assert.equal(followers.length, 1, 'one follower process');
    process.kill(followers[0], 'SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(existsSync(`/proc/${followers[0]}`), 'the follower lives on');
    assert.deepEqual(await complete(requests[3], true), expected[3].output_ids);
    const { code } = await server.stop();
    assert.equal(code, 0, server.log());
    assert.ok(!existsSync(`/proc/${followers[0]}/status`) ||
              /State:\s+Z/.test(readFileSync(`/proc/${followers[0]}/status`, 'utf8')),
              'the follower exited');
  });

  it('a dead rank fails the calls in flight with 503s and stops the server non-zero', async () => {
    const srv = await startServer(args.deepinfer, ['--cp', '2', '--max-num-seqs', '4']);
    try {
      const followers = children(srv.proc.pid);
      assert.equal(followers.length, 1);
      const long = { prompt: [5, 6, 7], max_tokens: 2000, temperature: 0, ignore_eos: true };
      const post = (body) => fetch(`${srv.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body) });
      const whole = post(long);
      const stream = await post({ ...long, stream: true });
      assert.equal(stream.status, 200);
      await new Promise((r) => setTimeout(r, 500));  // both are generating
      const killed = Date.now();
      process.kill(followers[0], 'SIGKILL');
      // Non-streaming: the status is only sent with the result, so the failure is a 503.
      const w = await whole;
      assert.equal(w.status, 503);
      const body = await w.json();
      assert.equal(body.error.code, 'engine_failed');
      assert.equal(body.error.type, 'server_error');
      assert.match(body.error.message, /rank 1 .*SIGKILL/);
      // Streaming: an error event, then [DONE].
      const events = await sseData(stream);
      assert.equal(events.at(-1), '[DONE]');
      assert.equal(JSON.parse(events.at(-2)).error.code, 'engine_failed');
      const { code } = await srv.exited;
      assert.notEqual(code, 0, srv.log());
      assert.ok(Date.now() - killed < 5000, `exited ${Date.now() - killed} ms after the kill`);
      assert.match(srv.log(), /engine failed/);
    } finally {
      srv.proc.kill('SIGKILL');
    }
  });

  it('an idle server notices a dead rank within a second', async () => {
    const srv = await startServer(args.deepinfer, ['--cp', '2']);
    try {
      const [follower] = children(srv.proc.pid);
      const killed = Date.now();
      process.kill(follower, 'SIGKILL');
      const { code } = await srv.exited;
      assert.notEqual(code, 0);
      assert.ok(Date.now() - killed < 1500, `noticed ${Date.now() - killed} ms after the kill`);
    } finally {
      srv.proc.kill('SIGKILL');
    }
  });

});

describe('serve with data-parallel replicas', () => {
  let dp;
  before(async () => {
    dp = await startServer(args.deepinfer, ['--dp', '2', '--ep', '2', '--dtype', 'fp32',
                                            '--max-num-seqs', '4']);
  });
  after(() => dp?.proc.kill('SIGKILL'));

  it('concurrent requests give the single-rank tokens, and both replicas serve', async () => {
    const got = await Promise.all(requests.map((r, i) => complete(r, i % 2 === 1, dp.url)));
    got.forEach((ids, i) => assert.deepEqual(ids, expected[i].output_ids, `request ${i}`));
    const m = await waitMetrics(dp.url, idle);
    for (const r of [0, 1])
      assert.ok(m[`deepinfer_replica_generation_tokens_total{replica="${r}"}`] > 0, `replica ${r}`);
    assert.equal(m['deepinfer_replica_generation_tokens_total{replica="0"}'] +
                 m['deepinfer_replica_generation_tokens_total{replica="1"}'],
                 m.deepinfer_generation_tokens_total);
  });

  it('SIGTERM to the leader ends both replicas', async () => {
    const [replica] = children(dp.proc.pid);
    process.kill(replica, 'SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(await complete(requests[5], false, dp.url), expected[5].output_ids);
    const { code } = await dp.stop();
    assert.equal(code, 0, dp.log());
    assert.ok(!existsSync(`/proc/${replica}/status`) ||
              /State:\s+Z/.test(readFileSync(`/proc/${replica}/status`, 'utf8')),
              'the replica exited');
  });

  it('a dead replica fails the calls in flight with 503s and stops the server non-zero', async () => {
    const srv = await startServer(args.deepinfer, ['--dp', '2', '--max-num-seqs', '4']);
    try {
      const [replica] = children(srv.proc.pid);
      const long = { prompt: [5, 6, 7], max_tokens: 3000, temperature: 0, ignore_eos: true };
      const calls = [0, 1, 2, 3].map(() => fetch(`${srv.url}/v1/completions`,
                                                 { method: 'POST', body: JSON.stringify(long) }));
      await waitMetrics(srv.url, (m) => m['deepinfer_replica_num_requests_running{replica="1"}'] > 0 &&
                        m['deepinfer_replica_generation_tokens_total{replica="1"}'] > 0);
      process.kill(replica, 'SIGKILL');
      for (const c of calls) {
        const res = await c;
        assert.equal(res.status, 503);
        assert.equal((await res.json()).error.code, 'engine_failed');
      }
      const { code } = await srv.exited;
      assert.notEqual(code, 0, srv.log());
    } finally {
      srv.proc.kill('SIGKILL');
    }
  });
});
