// Helpers of the server tests: start `deepinfer serve` on a free port (and make sure it dies with
// the test), run the offline runner for reference outputs, read server-sent events and metrics.
//
// Every test script takes `--deepinfer PATH` (the binary) and optionally `--tok-model DIR` (a
// checkpoint with a tokenizer, made by `deepinfer make-tiny --tokenizer`).
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';

export function cliArgs() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  if (!out.deepinfer) throw new Error('usage: node <test>.mjs --deepinfer PATH [--tok-model DIR]');
  return out;
}

// Servers still running when the test process ends (however it ends) are killed.
const running = new Set();
process.on('exit', () => {
  for (const p of running) {
    try { p.kill('SIGKILL'); } catch { /* already gone */ }
  }
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => process.exit(128));

// Arguments every server of a test script gets besides its own: DEEPINFER_TEST_SERVE_ARGS (the
// same suite then runs over data-parallel replicas, say).
const extraServeArgs = (process.env.DEEPINFER_TEST_SERVE_ARGS ?? '').split(/\s+/).filter(Boolean);

// How many data-parallel replicas the servers of this run have (each with its own sequence slots).
export function replicas() {
  const i = extraServeArgs.indexOf('--dp');
  return i >= 0 ? Number(extraServeArgs[i + 1]) : 1;
}

// Starts `deepinfer serve --port 0 ...args` and resolves once it listens.
export async function startServer(bin, args = [], { env = {} } = {}) {
  const proc = spawn(bin, ['serve', '--port', '0', ...args, ...extraServeArgs], {
    stdio: ['ignore', 'inherit', 'pipe'],
    env: { ...process.env, ...env },
  });
  running.add(proc);
  let log = '';
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      running.delete(proc);
      resolve({ code, signal });
    });
  });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not listen within 90 s:\n${log}`)),
                             90000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /serving '.*' on http:\/\/[^\s:]+:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code ?? signal}) before listening:\n${log}`));
    });
  });
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    proc,
    exited,
    log: () => log,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

// The offline runner on a JSONL file of requests: one result per line, in order. Asynchronous, so
// that the event loop keeps running meanwhile: a client's idle keep-alive sockets that the server
// closes are noticed as closed instead of being reused after a long blocking call.
export function generate(bin, args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['generate', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    proc.stdout.setEncoding('utf8').on('data', (d) => { out += d; });
    proc.stderr.setEncoding('utf8').on('data', (d) => { err += d; });
    proc.on('error', reject);
    proc.on('close', (code) => {
      if (code !== 0) reject(new Error(`deepinfer generate ${args.join(' ')} failed:\n${err}`));
      else resolve(out.trim().split('\n').map((l) => JSON.parse(l)));
    });
  });
}

// The payloads of a server-sent-event stream (the text after "data: "), in order.
export async function sseData(response) {
  const text = await response.text();
  assertSseFraming(text);
  return text.split('\n\n').filter((e) => e.length).map((e) => e.slice('data: '.length));
}

// Every event is one "data: ..." line followed by a blank line, and [DONE] ends the stream.
export function assertSseFraming(text) {
  if (!text.endsWith('data: [DONE]\n\n')) throw new Error(`stream does not end with [DONE]:\n${text.slice(-300)}`);
  const events = text.split('\n\n');
  if (events.pop() !== '') throw new Error('stream does not end with a blank line');
  for (const e of events) {
    if (!e.startsWith('data: ') || e.includes('\n')) throw new Error(`malformed event: ${JSON.stringify(e)}`);
  }
  if (events.indexOf('data: [DONE]') !== events.length - 1) throw new Error('[DONE] is not last');
}

// Prometheus text -> {"name{labels}": value}.
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return out;
}

// Polls until `pred(metrics)` holds; returns the last metrics (throws after `ms`).
export async function waitMetrics(url, pred, ms = 10000) {
  const until = Date.now() + ms;
  let m;
  while (Date.now() < until) {
    m = await metrics(url);
    if (pred(m)) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`metrics did not reach the expected state: ${JSON.stringify(m)}`);
}

export const idle = (m) => m.deepinfer_num_requests_running === 0 &&
  m.deepinfer_num_requests_waiting === 0 && m.deepinfer_kv_blocks_used === 0;

export function rssBytes(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)[1]) * 1024;
}

export function requireOpenAiPackage() {
  const dir = new URL('./node_modules/openai', import.meta.url);
  if (!existsSync(dir)) {
    throw new Error('the openai npm package is missing: run `npm ci --prefix tests/server` in the ' +
                    'repository root');
  }
}

export function percentile(values, p) {
  if (!values.length) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}
