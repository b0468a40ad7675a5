// Load: 64 concurrent streaming clients on the built-in tiny model, three rounds. Every response
// must be complete and token-for-token the offline runner's greedy output for its prompt, no
// request may be lost, the KV pool must return to empty after each round and resident memory
// must stay flat. Prints requests/s and client-side TTFT / inter-token latency percentiles.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import {
  assertSseFraming, cliArgs, generate, idle, metrics, percentile, rssBytes, startServer, waitMetrics,
} from './lib.mjs';

const args = cliArgs();
const CLIENTS = Number(args.clients ?? 64);
const ROUNDS = 3;
let server, dir, requests, expected;

// A small deterministic generator, so prompts are the same in every run.
function lcg(seed) {
  let s = BigInt(seed);
  return () => {
    s = (s * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
    return Number(s >> 33n);
  };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'deepinfer-load-'));
  const rnd = lcg(2024);
  requests = Array.from({ length: CLIENTS }, () => {
    const len = 4 + (rnd() % 32);
    return {
      prompt: Array.from({ length: len }, () => 2 + (rnd() % 129000)),
      max_tokens: 8 + (rnd() % 17),
      temperature: 0,
    };
  });
  const file = join(dir, 'prompts.jsonl');
  writeFileSync(file, requests.map((r) => JSON.stringify({
    prompt_ids: r.prompt, max_tokens: r.max_tokens, temperature: 0,
  })).join('\n') + '\n');
  expected = await generate(args.deepinfer, ['--prompts', file]);
  server = await startServer(args.deepinfer, ['--max-num-seqs', '32']);
});

after(async () => {
  if (server) {
    const { code } = await server.stop();
    assert.equal(code, 0, server.log());
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// One streaming client: returns its token ids, finish reason and timings.
async function client(req) {
  const t0 = performance.now();
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...req, stream: true, stream_options: { include_usage: true } }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  const decoder = new TextDecoder();
  let raw = '';
  let buffered = '';
  const ids = [];
  const stamps = [];
  let finish = null;
  let usage = null;
  for await (const bytes of res.body) {
    const text = decoder.decode(bytes, { stream: true });
    raw += text;
    buffered += text;
    const events = buffered.split('\n\n');
    buffered = events.pop();
    const now = performance.now();
    for (const e of events) {
      const data = e.slice('data: '.length);
      if (data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        for (const id of c.token_ids ?? []) {
          ids.push(id);
          stamps.push(now);
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
  }
  assertSseFraming(raw);
  return { ids, finish, usage, ttft: stamps[0] - t0, gaps: stamps.slice(1).map((s, i) => s - stamps[i]) };
}

describe('load', () => {
  it(`${CLIENTS} concurrent streaming clients x ${ROUNDS} rounds`, async () => {
    const rss = [];
    const ttft = [];
    const itl = [];
    let finishedBefore = 0;
    for (let round = 0; round < ROUNDS; ++round) {
      const t0 = performance.now();
      const results = await Promise.all(requests.map((r) => client(r)));
      const secs = (performance.now() - t0) / 1000;
      assert.equal(results.length, CLIENTS);
      let tokens = 0;
      results.forEach((r, i) => {
        assert.deepEqual(r.ids, expected[i].output_ids, `round ${round}, client ${i}`);
        assert.equal(r.finish, expected[i].finish_reason, `round ${round}, client ${i}`);
        assert.equal(r.usage.completion_tokens, r.ids.length);
        assert.equal(r.usage.prompt_tokens, requests[i].prompt.length);
        tokens += r.ids.length;
        ttft.push(r.ttft);
        itl.push(...r.gaps);
      });
      const m = await waitMetrics(server.url, idle);
      const finished = m['deepinfer_requests_finished_total{finish_reason="length"}'] +
                       m['deepinfer_requests_finished_total{finish_reason="stop"}'];
      assert.equal(finished - finishedBefore, CLIENTS, 'every request finished in the engine');
      assert.equal(m['deepinfer_requests_finished_total{finish_reason="abort"}'], 0);
      finishedBefore = finished;
      rss.push(rssBytes(server.proc.pid));
      console.log(`round ${round + 1}: ${CLIENTS} requests in ${secs.toFixed(2)} s = ` +
                  `${(CLIENTS / secs).toFixed(1)} req/s, ${(tokens / secs).toFixed(0)} tok/s, ` +
                  `RSS ${(rss[round] / 2 ** 20).toFixed(1)} MiB`);
    }
    const ms = (v) => `${v.toFixed(1)} ms`;
    console.log(`TTFT p50 ${ms(percentile(ttft, 50))} p90 ${ms(percentile(ttft, 90))} ` +
                `p99 ${ms(percentile(ttft, 99))}; ITL p50 ${ms(percentile(itl, 50))} ` +
                `p90 ${ms(percentile(itl, 90))} p99 ${ms(percentile(itl, 99))}`);
    // Memory settles after the first round (allocator pools, thread stacks); later rounds must
    // not keep growing it.
    const growth = (rss[ROUNDS - 1] - rss[1]) / 2 ** 20;
    assert.ok(growth < 8, `RSS grew by ${growth.toFixed(1)} MiB between rounds 2 and ${ROUNDS}`);
    const m = await metrics(server.url);
    assert.equal(m.deepinfer_kv_blocks_used, 0);
    assert.equal(m.deepinfer_client_disconnects_total, 0);
    assert.ok(m.deepinfer_time_to_first_token_seconds_count >= CLIENTS * ROUNDS);
  });
});
