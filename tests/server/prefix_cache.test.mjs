// Prefix caching through the server: a conversation's next turn and an agent's second request
// with the same long system prompt resume from the cached prefix, give the tokens and logprobs
// of a server without the cache (fp32), and /metrics counts the queries, hits and hit tokens.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { cliArgs, idle, metrics, replicas, startServer, waitMetrics } from './lib.mjs';

const args = cliArgs();
const common = ['--dtype', 'fp32', '--block-size', '16'];
let hot, cold;

before(async () => {
  [hot, cold] = await Promise.all([
    startServer(args.deepinfer, common),
    startServer(args.deepinfer, [...common, '--no-prefix-caching']),
  ]);
});

after(async () => {
  for (const s of [hot, cold]) {
    if (!s) continue;
    const { code } = await s.stop();
    assert.equal(code, 0, s.log());
  }
});

const ids = (n, seed) => Array.from({ length: n }, (_, i) => 3 + ((seed * 7919 + i * 104729) % 129000));

async function complete(server, prompt) {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt, max_tokens: 6, temperature: 0, logprobs: 2 }),
  });
  assert.equal(res.status, 200);
  const c = (await res.json()).choices[0];
  return { ids: c.token_ids, logprobs: c.logprobs };
}

describe('prefix caching', () => {
  it('later requests sharing a prefix hit the cache and answer as without it', async () => {
    const system = ids(150, 1);
    const first = [...system, ...ids(9, 2)];
    const a = await complete(hot, first);
    // The next turn resends the first, its answer and more; another request shares the system
    // prompt only.
    const turn = [...first, ...a.ids, ...ids(5, 3)];
    const other = [...system, ...ids(12, 4)];
    const before = await metrics(hot.url);
    for (const prompt of [turn, other]) {
      assert.deepEqual(await complete(hot, prompt), await complete(cold, prompt));
    }
    const m = await waitMetrics(hot.url, idle);
    assert.equal(m.deepinfer_prefix_cache_queries_total - before.deepinfer_prefix_cache_queries_total, 2);
    assert.equal(m.deepinfer_prefix_cache_hits_total - before.deepinfer_prefix_cache_hits_total, 2);
    // Whole blocks of 16: the turn resumes at 160 (of 170), the other request at 144.
    assert.equal(m.deepinfer_prefix_cache_hit_tokens_total -
                 before.deepinfer_prefix_cache_hit_tokens_total, 160 + 144);
    const c = await metrics(cold.url);
    assert.equal(c.deepinfer_prefix_cache_hits_total, 0);
  });

  it('with replicas, a prompt goes where its prefix is cached', { skip: replicas() < 2 }, async () => {
    const shared = ids(150, 7);
    await complete(hot, [...shared, ...ids(5, 8)]);  // both replicas idle: replica 0
    // A long request keeps replica 0 busy, so replica 1 is the less loaded one ...
    const long = fetch(`${hot.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: ids(20, 9), max_tokens: 400, temperature: 0, ignore_eos: true }),
    });
    await waitMetrics(hot.url, (m) => m['deepinfer_replica_num_requests_running{replica="0"}'] === 1);
    // ... but the next prompt sharing the prefix goes to replica 0, which holds it.
    const before = await metrics(hot.url);
    const prompt = [...shared, ...ids(6, 10)];
    assert.deepEqual(await complete(hot, prompt), await complete(cold, prompt));
    const m = await metrics(hot.url);
    assert.equal(m.deepinfer_prefix_cache_hits_total - before.deepinfer_prefix_cache_hits_total, 1);
    assert.equal(m.deepinfer_prefix_cache_hit_tokens_total -
                 before.deepinfer_prefix_cache_hit_tokens_total, 144);
    assert.equal((await long).status, 200);
  });
});
