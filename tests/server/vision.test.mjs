// Images in chat messages (docs/vision.md) through `deepinfer serve` on a tiny model with a vision
// tower and the real tokenizer, in fp32 numerics: an image_url part (a data: URL) becomes the image
// token of the prompt (/tokenize shows where), and a greedy reply equals the offline runner's on
// those ids and that image (which, in fp32, tests/e2e/cli_test.sh checks against the numpy
// reference: Pillow preprocessing, its own tower; the reference has no Engram token map of this
// tokenizer, so it is not run here); bad images get a 400 naming the part.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';

import { cliArgs, generate, startServer } from './lib.mjs';

const args = cliArgs();
if (!args['tok-model']) throw new Error('--tok-model DIR is required');
const config = JSON.parse(readFileSync(join(args['tok-model'], 'config.json'), 'utf8'));
const IMAGE = config.image_token_id;
const here = dirname(fileURLToPath(import.meta.url));
const png = readFileSync(join(here, '..', '..', 'fuzz', 'seeds', 'image', 'rgb.png'));
const URL = `data:image/png;base64,${png.toString('base64')}`;
const messages = (url) => [{ role: 'user', content: [
  { type: 'text', text: 'What is in this picture?' },
  { type: 'image_url', image_url: { url } },
] }];

let server, dir;

async function post(path, body) {
  const r = await fetch(`${server.url}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

before(async () => {
  assert.ok(config.vision_n_layers > 0, 'the test model needs a vision tower (make-tiny --vision)');
  dir = mkdtempSync(join(tmpdir(), 'deepinfer-vision-'));
  server = await startServer(args.deepinfer, ['--model', args['tok-model'], '--dtype', 'fp32']);
});

after(async () => {
  if (server) {
    const { code } = await server.stop();
    assert.equal(code, 0, `server exit status\n${server.log()}`);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('images in chat', () => {
  it('answers as the offline runner does on the same ids and image', async () => {
    const tok = await post('/tokenize', { messages: messages(URL) });
    assert.equal(tok.status, 200, JSON.stringify(tok.body));
    const ids = tok.body.tokens;
    assert.equal(ids.filter((t) => t === IMAGE).length, 1, `one image token in ${ids}`);
    const file = join(dir, 'in.jsonl');
    writeFileSync(file, JSON.stringify({ prompt_ids: ids, images: [URL], max_tokens: 8, temperature: 0 }) + '\n');
    const [offline] = await generate(args.deepinfer, ['--model', args['tok-model'], '--dtype', 'fp32',
                                                      '--prompts', file]);
    const r = await post('/v1/chat/completions', {
      messages: messages(URL), max_tokens: 8, temperature: 0, return_token_ids: true,
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(r.body.choices[0].token_ids, offline.output_ids);
    assert.equal(r.body.usage.prompt_tokens, offline.prompt_ids.length, 'the span counts as prompt tokens');
  });

  it('refuses what it cannot use, naming the part', async () => {
    for (const [url, code] of [['data:image/png;base64,iVBORw0KGgo=', 'invalid_image'],
                               ['https://example.com/cat.png', 'invalid_image']]) {
      const r = await post('/v1/chat/completions', { messages: messages(url), max_tokens: 2 });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error.param, 'messages[0].content[1].image_url.url');
      assert.equal(r.body.error.code, code);
    }
  });
});
