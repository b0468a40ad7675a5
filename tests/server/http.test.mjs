// The HTTP/1.1 layer seen through raw sockets: slow and idle clients cannot stall the server,
// the connection cap, pipelined requests answered in order, malformed framing refused at once
// with its status, chunked request bodies, Expect: 100-continue and HTTP/1.0 clients.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { cliArgs, idle, metrics, startServer, waitMetrics } from './lib.mjs';

const args = cliArgs();
if (!args['tok-model']) throw new Error('--tok-model DIR is required');
const REQUEST_TIMEOUT = 3;
const IDLE_TIMEOUT = 1;
let server;

before(async () => {
  // One worker thread, short deadlines, a 1 MiB body limit.
  server = await startServer(args.deepinfer, [
    '--model', args['tok-model'], '--http-threads', '1', '--request-timeout', String(REQUEST_TIMEOUT),
    '--idle-timeout', String(IDLE_TIMEOUT), '--max-body-mib', '1', '--max-num-seqs', '4']);
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, server.log());
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Parses HTTP/1.1 responses off the front of `buf`; returns them and how many bytes they took.
// `closed`: the connection has ended, so a response without a length ends with it.
function parseResponses(buf, closed) {
  const out = [];
  let at = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', at);
    if (end < 0) break;
    const lines = buf.subarray(at, end).toString('latin1').split('\r\n');
    const m = /^HTTP\/1\.1 (\d{3}) /.exec(lines[0]);
    assert.ok(m, `bad status line: ${lines[0]}`);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
    }
    const status = Number(m[1]);
    let pos = end + 4;
    let body;
    if (status === 100) {
      body = Buffer.alloc(0);
    } else if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (buf.length < pos + n) break;
      body = buf.subarray(pos, pos + n);
      pos += n;
    } else if (headers['transfer-encoding'] === 'chunked') {
      const parts = [];
      let done = false;
      for (;;) {
        const eol = buf.indexOf('\r\n', pos);
        if (eol < 0) break;
        const size = parseInt(buf.subarray(pos, eol).toString(), 16);
        if (buf.length < eol + 2 + size + 2) break;
        parts.push(buf.subarray(eol + 2, eol + 2 + size));
        pos = eol + 2 + size + 2;
        if (size === 0) { done = true; break; }
      }
      if (!done) break;
      body = Buffer.concat(parts);
    } else {
      if (!closed) break;
      body = buf.subarray(pos);
      pos = buf.length;
    }
    out.push({ status, headers, text: body.toString('utf8') });
    at = pos;
  }
  return { responses: out, used: at };
}

// A raw connection: write bytes, collect responses, see when the server closes it.
class Raw {
  static open(port = server.port) {
    return new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => resolve(new Raw(s)));
      s.once('error', reject);
    });
  }

  constructor(sock) {
    this.sock = sock;
    this.buf = Buffer.alloc(0);
    this.closedAt = null;
    this.opened = Date.now();
    this.waiters = [];
    sock.on('data', (d) => { this.buf = Buffer.concat([this.buf, d]); this.wake(); });
    sock.on('error', () => {});
    sock.on('close', () => { this.closedAt = Date.now(); this.wake(); });
  }

  wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  write(bytes) {
    this.sock.write(bytes);
  }

  responses() {
    return parseResponses(this.buf, this.closedAt !== null).responses.filter((r) => r.status !== 100);
  }

  // Resolves once `pred(this)` holds; rejects after `ms`.
  async until(pred, ms, what) {
    const deadline = Date.now() + ms;
    while (!pred(this)) {
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(`timed out waiting for ${what}; got: ${this.buf.toString('latin1').slice(0, 500)}`);
      }
      await new Promise((r) => {
        const t = setTimeout(r, left);
        this.waiters.push(() => { clearTimeout(t); r(); });
      });
    }
  }

  async response(n = 1, ms = 5000) {
    await this.until((c) => c.responses().length >= n || c.closedAt !== null, ms, `${n} responses`);
    const rs = this.responses();
    assert.ok(rs.length >= n, `connection closed after ${rs.length} responses: ${this.buf.toString('latin1')}`);
    return n === 1 ? rs[0] : rs;
  }

  async closed(ms = 5000) {
    await this.until((c) => c.closedAt !== null, ms, 'the server to close the connection');
    return this.closedAt;
  }

  destroy() {
    this.sock.destroy();
  }
}

// The whole exchange of one raw request on a fresh connection.
async function once(bytes, { ms = 5000 } = {}) {
  const c = await Raw.open();
  const t0 = Date.now();
  c.write(bytes);
  const r = await c.response(1, ms);
  r.ms = Date.now() - t0;
  r.conn = c;
  return r;
}

function expectError(r, status, code) {
  assert.equal(r.status, status, r.text);
  assert.match(r.headers['content-type'], /^application\/json/);
  const e = JSON.parse(r.text).error;
  assert.equal(e.code, code, r.text);
  assert.equal(typeof e.message, 'string');
}

// /health on a fresh connection (as a load balancer probes), in milliseconds.
async function healthMs() {
  const r = await once('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n',
                       { ms: 30000 });
  assert.equal(r.status, 200, r.text);
  r.conn.destroy();
  return r.ms;
}

const GET_HEALTH = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
const completion = (body, extra = '') => {
  const b = JSON.stringify(body);
  return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${extra}` +
    `Content-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`;
};

describe('http', () => {
  it('slow clients do not stall /health, and get 408 at the request deadline', async () => {
    // A long generation keeps the engine busy meanwhile.
    const ctl = new AbortController();
    const busy = fetch(`${server.url}/v1/completions`, {
      method: 'POST', signal: ctl.signal,
      body: JSON.stringify({ prompt: [5, 6, 7], max_tokens: 4000, ignore_eos: true, stream: true }),
    }).then((r) => r.text()).catch(() => null);
    await waitMetrics(server.url, (m) => m.deepinfer_num_requests_running === 1);

    // More slow clients than worker threads, each sending a byte of its header every 2 s.
    const slow = await Promise.all(Array.from({ length: 8 }, () => Raw.open()));
    const text = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n';
    let sent = 0;
    const dribble = setInterval(() => {
      for (const c of slow) if (c.closedAt === null) c.write(text[sent % text.length]);
      ++sent;
    }, 2000);
    for (const c of slow) c.write(text[0]);
    const started = Date.now();
    try {
      const times = [];
      while (Date.now() - started < (REQUEST_TIMEOUT + 1) * 1000) {
        times.push(await healthMs());
        await sleep(200);
      }
      assert.ok(Math.max(...times) < 1000, `/health took ${Math.max(...times)} ms`);
      for (const c of slow) {
        const r = await c.response(1, 4000);
        expectError(r, 408, 'request_timeout');
        const at = await c.closed(4000);
        const secs = (at - started) / 1000;
        assert.ok(secs >= REQUEST_TIMEOUT - 0.5 && secs < REQUEST_TIMEOUT + 3, `408 after ${secs} s`);
      }
    } finally {
      clearInterval(dribble);
      for (const c of slow) c.destroy();
      ctl.abort();
      await busy;
    }
    await waitMetrics(server.url, idle);
  });

  it('an idle kept-alive connection is closed after the idle timeout', async () => {
    const c = await Raw.open();
    c.write(GET_HEALTH);
    const r = await c.response();
    assert.equal(r.status, 200);
    assert.equal(r.headers.connection, 'keep-alive');
    assert.equal(r.headers['keep-alive'], `timeout=${IDLE_TIMEOUT}`);
    const answered = Date.now();
    const at = await c.closed(IDLE_TIMEOUT * 1000 + 3000);
    const secs = (at - answered) / 1000;
    assert.ok(secs >= IDLE_TIMEOUT - 0.3, `closed after ${secs} s`);
    // One that never sends anything is closed too (at the request deadline), without a word.
    const quiet = await Raw.open();
    await quiet.closed(REQUEST_TIMEOUT * 1000 + 3000);
    assert.equal(quiet.buf.length, 0);
    // Requests on a kept-alive connection within the timeout keep it open.
    const k = await Raw.open();
    for (let i = 0; i < 3; ++i) {
      k.write(GET_HEALTH);
      await k.response(i + 1);
      await sleep(IDLE_TIMEOUT * 500);
    }
    assert.equal(k.closedAt, null);
    k.destroy();
  });

  it('pipelined requests are answered in order', async () => {
    const c = await Raw.open();
    // One write: generation (worker and engine), a cheap route, tokenization (worker), a
    // refusal, and the last one asking to close.
    const tok = (text) => {
      const b = JSON.stringify({ prompt: text });
      return `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`;
    };
    c.write(completion({ prompt: [1, 2, 3], max_tokens: 5, temperature: 0, return_token_ids: true }) +
            'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n' + tok('Hello world') + tok('Bye') +
            'GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n' +
            'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const rs = await c.response(6);
    assert.deepEqual(rs.map((r) => r.status), [200, 200, 200, 200, 404, 200]);
    assert.equal(JSON.parse(rs[0].text).choices[0].token_ids.length, 5);
    assert.equal(JSON.parse(rs[1].text).object, 'list');
    const hello = JSON.parse(rs[2].text);
    const bye = JSON.parse(rs[3].text);
    assert.ok(hello.count >= 2 && bye.count >= 1);
    assert.notDeepEqual(hello.tokens, bye.tokens);
    assert.equal(rs[5].headers.connection, 'close');
    await c.closed();

    // Two in one write, on an HTTP/1.1 connection that stays open.
    const d = await Raw.open();
    d.write(GET_HEALTH + GET_HEALTH);
    const two = await d.response(2);
    assert.deepEqual(two.map((r) => r.text), ['{"status":"ok"}', '{"status":"ok"}']);
    assert.equal(d.closedAt, null);
    d.destroy();
  });

  it('malformed framing is refused at once with its status', async () => {
    const post = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n';
    const cases = [
      ['NONSENSE\r\n\r\n', 400, 'invalid_request_line'],
      ['GET /health HTTP/1.1\r\nBad Header: x\r\n\r\n', 400, 'invalid_header'],
      ['GET /health HTTP/1.1\r\nNo colon\r\n\r\n', 400, 'invalid_header'],
      ['GET /health HTTP/1.1\r\nA: b\r\n folded\r\n\r\n', 400, 'invalid_header'],
      [`GET /health HTTP/1.1\r\nX-Big: ${'v'.repeat(70000)}\r\n\r\n`, 431, 'header_too_large'],
      [`GET /${'p'.repeat(20000)} HTTP/1.1\r\n\r\n`, 414, 'uri_too_long'],
      ['GET /health HTTP/2.0\r\n\r\n', 505, 'http_version_not_supported'],
      [`${post}Content-Length: 5\r\nContent-Length: 6\r\n\r\n`, 400, 'invalid_content_length'],
      [`${post}Content-Length: 5, 7\r\n\r\n`, 400, 'invalid_content_length'],
      [`${post}Content-Length: -1\r\n\r\n`, 400, 'invalid_content_length'],
      [`${post}Content-Length: 99999999999\r\n\r\n`, 413, 'request_too_large'],
      [`${post}Transfer-Encoding: gzip\r\n\r\n`, 501, 'unsupported_transfer_encoding'],
      [`${post}Transfer-Encoding: gzip, chunked\r\n\r\n`, 501, 'unsupported_transfer_encoding'],
      [`${post}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n`, 400, 'invalid_content_length'],
      [`${post}Transfer-Encoding: chunked\r\n\r\nzz\r\n`, 400, 'invalid_chunked_body'],
      [`${post}Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX`, 400, 'invalid_chunked_body'],
      [`${post}Transfer-Encoding: chunked\r\n\r\n2;=bad\r\n{}\r\n0\r\n\r\n`, 400, 'invalid_chunked_body'],
      [`${post}Transfer-Encoding: chunked\r\n\r\nffffffffff\r\n`, 413, 'request_too_large'],
      [`${post}Expect: something\r\nContent-Length: 2\r\n\r\n`, 417, 'expectation_failed'],
    ];
    for (const [bytes, status, code] of cases) {
      const r = await once(bytes);
      expectError(r, status, code);
      assert.ok(r.ms < 2000, `${status} ${code}: answered after ${r.ms} ms`);
      assert.equal(r.headers.connection, 'close', code);
      await r.conn.closed(4000);
    }
    // The server serves on.
    assert.ok(await healthMs() < 1000);
  });

  it('chunked request bodies, with extensions and trailers', async () => {
    const body = JSON.stringify({ prompt: [1, 2, 3], max_tokens: 4, temperature: 0,
                                  return_token_ids: true });
    const parts = [body.slice(0, 5), body.slice(5, 17), body.slice(17)];
    const chunked = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `${parts[0].length.toString(16)};name=value\r\n${parts[0]}\r\n` +
      `${parts[1].length.toString(16).toUpperCase()} ; q="a b"\r\n${parts[1]}\r\n` +
      `${parts[2].length.toString(16)}\r\n${parts[2]}\r\n0\r\nX-Checksum: none\r\n\r\n`;
    const raw = await once(chunked);
    assert.equal(raw.status, 200, raw.text);
    const ids = JSON.parse(raw.text).choices[0].token_ids;
    assert.equal(ids.length, 4);
    raw.conn.destroy();
    // The same body from fetch, which streams a ReadableStream chunked.
    const enc = new TextEncoder();
    const stream = new ReadableStream({
      start(controller) {
        for (const p of parts) controller.enqueue(enc.encode(p));
        controller.close();
      },
    });
    const res = await fetch(`${server.url}/v1/completions`, { method: 'POST', body: stream, duplex: 'half' });
    assert.equal(res.status, 200);
    assert.deepEqual((await res.json()).choices[0].token_ids, ids);
  });

  it('Expect: 100-continue', async () => {
    const c = await Raw.open();
    const body = JSON.stringify({ prompt: 'Hi' });
    c.write(`POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n`);
    await c.until((x) => x.buf.toString().startsWith('HTTP/1.1 100 Continue\r\n\r\n'), 3000, '100 Continue');
    c.write(body);
    const r = await c.response();
    assert.equal(r.status, 200, r.text);
    assert.ok(JSON.parse(r.text).count >= 1);
    c.destroy();
    // A body over the limit is refused before it is sent.
    const big = await once('POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n' +
                           `Content-Length: ${2 << 20}\r\n\r\n`);
    expectError(big, 413, 'request_too_large');
    assert.ok(!big.conn.buf.toString('latin1').includes('100 Continue'));
    await big.conn.closed();
  });

  it('HTTP/1.0 clients: one request per connection, streams end with the connection', async () => {
    const h = await once('GET /health HTTP/1.0\r\n\r\n');
    assert.equal(h.status, 200);
    assert.equal(h.headers.connection, 'close');
    await h.conn.closed();
    const b = JSON.stringify({ prompt: [4, 5], max_tokens: 3, stream: true });
    const c = await Raw.open();
    c.write(`POST /v1/completions HTTP/1.0\r\nContent-Length: ${b.length}\r\n\r\n${b}`);
    await c.closed();
    const [r] = c.responses();
    assert.equal(r.status, 200);
    assert.equal(r.headers['transfer-encoding'], undefined);
    assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text);
  });

  it('a client that half-closes during generation cancels it', async () => {
    const before = (await metrics(server.url)).deepinfer_client_disconnects_total;
    const c = await Raw.open();
    c.write(completion({ prompt: [9, 8, 7], max_tokens: 4000, ignore_eos: true, stream: true }));
    await c.until((x) => x.buf.includes('data: '), 5000, 'the first event');
    c.sock.end();
    await c.closed();
    const m = await waitMetrics(server.url, idle, 5000);
    assert.equal(m.deepinfer_client_disconnects_total, before + 1);
  });
});

describe('connection cap', () => {
  let capped;
  before(async () => {
    capped = await startServer(args.deepinfer, ['--max-connections', '3', '--request-timeout', '30',
                                                '--idle-timeout', '30']);
  });
  after(async () => {
    if (!capped) return;
    const { code } = await capped.stop();
    assert.equal(code, 0, capped.log());
  });

  it('beyond --max-connections a busy server answers 503; idle connections make room', async () => {
    // Three connections in the middle of a request fill the server.
    const busy = await Promise.all([0, 1, 2].map(() => Raw.open(capped.port)));
    for (const c of busy) c.write('GET /hea');
    await sleep(200);
    const extra = await Raw.open(capped.port);
    extra.write(GET_HEALTH);
    const r = await extra.response();
    expectError(r, 503, 'too_many_connections');
    assert.equal(r.headers['retry-after'], '1');
    await extra.closed();
    // The busy ones are still served.
    busy[0].write('lth HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.equal((await busy[0].response()).status, 200);
    // busy[0] is now idle: a new connection takes its place.
    const next = await Raw.open(capped.port);
    next.write(GET_HEALTH);
    assert.equal((await next.response()).status, 200);
    await busy[0].closed(2000);
    for (const c of [...busy, next]) c.destroy();
    await sleep(200);
    // With the cap free again, several kept-alive connections in turn: the oldest idle one goes.
    const kept = [];
    for (let i = 0; i < 5; ++i) {
      const c = await Raw.open(capped.port);
      c.write(GET_HEALTH);
      assert.equal((await c.response()).status, 200, `connection ${i}`);
      kept.push(c);
    }
    await kept[0].closed(2000);
    await kept[1].closed(2000);
    assert.equal(kept[4].closedAt, null);
    for (const c of kept) c.destroy();
    const m = await metrics(capped.url);
    assert.ok(m['deepinfer_http_responses_total{status="503"}'] >= 1);
  });
});
