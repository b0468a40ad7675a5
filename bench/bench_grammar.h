// `deepinfer bench grammar`: the cost of constrained decoding's token mask per step on a real
// vocabulary. Random walks through a JSON schema (each step: the mask, then a token drawn from
// it), timed cold (a grammar compiled afresh: every new automaton state walks the vocabulary
// trie) and warm (the same grammar again: masks come from the cache).
#pragma once

#include <string>

#include "bench_util.h"

namespace deepinfer::bench {

struct GrammarBenchOptions {
  std::string tokenizer;    // tokenizer.json or a directory holding it
  std::string schema_file;  // a JSON schema; empty: a built-in one (nested object, arrays, enums)
  int walks = 8;            // random walks per phase
  int max_steps = 400;      // tokens per walk at most
};

void bench_grammar(Reporter& rep, const GrammarBenchOptions& opt);

}  // namespace deepinfer::bench
