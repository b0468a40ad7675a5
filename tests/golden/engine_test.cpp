// The engine end to end on the tiny model: outputs (greedy tokens and logprobs) bit-identical
// across batch sizes, chunk budgets, buckets and prompt-as-decode; preemption under a small pool
// loses nothing and leaks nothing; seeded sampling does not depend on the batch; bad requests are
// rejected one by one.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "model_harness.h"
#include "util/grammar_matches.h"

namespace deepinfer::testing {
namespace {

struct Result {
  std::vector<int32_t> ids;
  std::vector<TopLogprobs> logprobs;
  FinishReason finish;
  bool operator==(const Result& o) const {
    return ids == o.ids && logprobs == o.logprobs && finish == o.finish;
  }
};

std::vector<Request> mixed_requests(int n, int64_t vocab, uint64_t seed, float temperature) {
  std::mt19937_64 rng(seed);
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = RequestId(i);
    const int64_t len = 1 + int64_t(rng() % 45);
    for (int64_t t = 0; t < len; ++t) r.prompt_ids.push_back(int32_t(rng() % uint64_t(vocab)));
    r.params.max_tokens = 1 + int64_t(rng() % 12);
    r.params.temperature = temperature;
    r.params.top_p = 0.9f;
    r.params.logprobs = 3;
    r.params.seed = 1000 + uint64_t(i);
    reqs.push_back(r);
  }
  return reqs;
}

// Queues `reqs` on `e` and steps it until every request finished.
std::map<RequestId, Result> run_on(Engine& e, const std::vector<Request>& reqs) {
  for (const auto& r : reqs) EXPECT_EQ(e.add_request(r), "") << "request " << r.id;
  std::map<RequestId, Result> out;
  for (int guard = 0; e.has_unfinished() && guard < 100000; ++guard) {
    e.step();
    for (auto& o : e.take_finished()) out[o.id] = {o.output_ids, o.logprobs, o.finish};
  }
  EXPECT_FALSE(e.has_unfinished());
  return out;
}

std::map<RequestId, Result> run(Model& m, const EngineConfig& cfg, const std::vector<Request>& reqs,
                                int32_t* leaked = nullptr) {
  Engine e(m, cfg);
  std::map<RequestId, Result> out = run_on(e, reqs);
  if (leaked) *leaked = e.kv_blocks_used();
  return out;
}

EngineConfig config(int32_t seqs, int64_t prompt_rows, int64_t bucket, bool as_decode) {
  EngineConfig c;
  c.sched.max_num_seqs = seqs;
  c.sched.max_num_prefill_tokens = prompt_rows;
  c.sched.max_num_batched_tokens = std::max<int64_t>(prompt_rows, bucket) + seqs;
  c.sched.prefill_bucket = bucket;
  c.sched.prompt_as_decode = as_decode;
  c.sched.block_tokens = 16;
  return c;
}

TEST(Engine, OutputsIdenticalAcrossSchedulingModes) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  const auto reqs = mixed_requests(24, m.model->config().vocab_size, 5, 0.0f);
  const auto base = run(*m.model, config(16, 2048, 0, false), reqs);
  ASSERT_EQ(base.size(), reqs.size());
  struct Mode {
    int32_t seqs;
    int64_t prompt_rows, bucket;
    bool as_decode;
  };
  for (const Mode& mode : {Mode{1, 2048, 0, false}, Mode{4, 2048, 0, false}, Mode{16, 7, 0, false},
                           Mode{4, 64, 0, false}, Mode{16, 16, 16, false}, Mode{4, 8, 8, false},
                           Mode{16, 2048, 0, true}, Mode{1, 2048, 0, true}}) {
    const auto got =
        run(*m.model, config(mode.seqs, mode.prompt_rows, mode.bucket, mode.as_decode), reqs);
    EXPECT_TRUE(got == base) << "max_num_seqs " << mode.seqs << ", prefill tokens "
                             << mode.prompt_rows << ", bucket " << mode.bucket
                             << ", prompt-as-decode " << mode.as_decode;
  }
}

// Prefix caching: requests that share prefixes with earlier ones (ending mid-block, mid
// compression group, inside the window, at block ends, the whole prompt, an earlier request's
// prompt and output) give exactly the cold run's tokens and logprobs in fp32, one at a time,
// side by side with chunked prefill, and under a pool and a snapshot budget so small that
// blocks and snapshots are evicted and sequences preempted.
TEST(Engine, PrefixCacheHitsAreBitIdenticalToColdRuns) {
  for (const char* preset : {"tiny", "tiny-c"}) {
    SCOPED_TRACE(preset);
    LoadedModel m = load_model(preset, Numerics::Fp32);
    const int64_t V = m.model->config().vocab_size;
    std::mt19937_64 rng(7);
    auto random_tokens = [&](int64_t n) {
      std::vector<int32_t> t;
      for (int64_t i = 0; i < n; ++i) t.push_back(int32_t(rng() % uint64_t(V)));
      return t;
    };
    const std::vector<int32_t> base = random_tokens(70);
    std::vector<Request> reqs;
    auto add = [&](std::vector<int32_t> prompt) {
      Request r;
      r.id = RequestId(reqs.size());
      r.prompt_ids = std::move(prompt);
      r.params.max_tokens = 6;
      r.params.temperature = 0;
      r.params.logprobs = 2;
      reqs.push_back(std::move(r));
    };
    add(base);
    add(base);  // the whole prompt cached: its last block is computed again
    // Blocks of 8 tokens, windows of 8 (tiny) and 16 (tiny-c), compression groups of 2 and 4.
    for (int64_t shared : {64, 63, 57, 50, 49, 33, 31, 17, 16, 15, 9, 8, 7, 3}) {
      std::vector<int32_t> p(base.begin(), base.begin() + shared);
      const std::vector<int32_t> tail = random_tokens(1 + int64_t(rng() % 9));
      p.insert(p.end(), tail.begin(), tail.end());
      add(std::move(p));
    }
    EngineConfig cold = config(4, 64, 0, false);
    cold.sched.block_tokens = 8;
    cold.prefix_caching = false;
    std::map<RequestId, Result> want = run(*m.model, cold, reqs);
    // A next turn: the first request's prompt and output, then more.
    std::vector<int32_t> turn = base;
    turn.insert(turn.end(), want[0].ids.begin(), want[0].ids.end());
    const std::vector<int32_t> more = random_tokens(5);
    turn.insert(turn.end(), more.begin(), more.end());
    add(turn);
    want = run(*m.model, cold, reqs);

    struct Mode {
      const char* name;
      int32_t seqs;
      int64_t prompt_rows;
      int32_t blocks;
      uint64_t snapshot_memory;
    };
    for (const Mode& mode :
         {Mode{"one at a time", 1, 64, 0, 0}, Mode{"side by side", 3, 5, 0, 0},
          Mode{"small pool", 3, 64, 13, 0}, Mode{"two snapshots", 1, 64, 0, 1}}) {
      SCOPED_TRACE(mode.name);
      EngineConfig hot = config(mode.seqs, mode.prompt_rows, 0, false);
      hot.sched.block_tokens = 8;
      hot.num_kv_blocks = mode.blocks;
      if (mode.snapshot_memory)  // room for two snapshots
        hot.prefix_cache_memory = uint64_t(2 * kv_footprint(m.model->config()).snapshot_bytes());
      Engine e(*m.model, hot);
      std::map<RequestId, Result> got = run_on(e, reqs);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [id, r] : want) EXPECT_TRUE(got[id] == r) << "request " << id;
      const EngineStats st = e.stats();
      EXPECT_GT(st.prefix_hits, 0);
      EXPECT_GT(st.prefix_hit_tokens, 8 * st.prefix_hits - 1);
      EXPECT_EQ(e.kv_blocks_used(), 0);
      if (mode.blocks) {
        EXPECT_GT(st.preemptions, 0);
      }
    }
  }
}

// Speculative decoding verifies drafts exactly: in fp32, greedy and seeded sampled requests
// (with penalties and logprobs) give the tokens and logprobs of plain decoding whether every
// draft is accepted (drafts from the plain run's output), drafts are rejected at many offsets
// (a corrupted copy: the slot state is rolled back and the accepted tokens computed again) or
// drafts come from the n-gram lookup; one at a time, side by side, with chunked prefill, under a
// small pool (preemption) and with or without the prefix cache, for several draft counts.
TEST(Engine, SpeculativeDecodingGivesPlainDecodingsOutputs) {
  for (const char* preset : {"tiny", "tiny-c"}) {
    SCOPED_TRACE(preset);
    LoadedModel m = load_model(preset, Numerics::Fp32);
    const int64_t V = m.model->config().vocab_size;
    std::vector<Request> reqs = mixed_requests(8, V, 21, 0.0f);
    for (size_t i = 0; i < reqs.size(); ++i) {
      Request& r = reqs[i];
      r.params.max_tokens = 20 + int64_t(i);
      r.params.ignore_eos = true;
      if (i % 2) {
        r.params.temperature = 0.8f;
        r.params.repetition_penalty = 1.2f;
        r.params.frequency_penalty = 0.3f;
      }
      // A repeated phrase for the n-gram lookup to find.
      for (int k = 0; k < 3; ++k) r.prompt_ids.insert(r.prompt_ids.end(), {5, 6, 7, 8});
    }
    EngineConfig plain = config(4, 64, 0, false);
    plain.sched.block_tokens = 8;
    const std::map<RequestId, Result> want = run(*m.model, plain, reqs);
    struct Mode {
      const char* name;
      int drafts;  // 0: the exact earlier output; 1: corrupted every 5th token; 2: n-gram only
      int32_t k, seqs;
      int64_t prompt_rows;
      int32_t blocks;
      bool prefix_caching;
    };
    for (const Mode& mode : {Mode{"all accepted, K 4", 0, 4, 1, 64, 0, true},
                             Mode{"all accepted, K 7, batch", 0, 7, 4, 64, 0, true},
                             Mode{"rejections, K 3", 1, 3, 1, 64, 0, true},
                             Mode{"rejections, batch, chunks", 1, 5, 4, 5, 0, false},
                             Mode{"rejections, small pool", 1, 4, 4, 64, 12, true},
                             Mode{"n-gram, K 2", 2, 2, 4, 64, 0, true}}) {
      SCOPED_TRACE(mode.name);
      std::vector<Request> spec = reqs;
      for (Request& r : spec) {
        if (mode.drafts == 2) continue;
        r.params.draft_reference = want.at(r.id).ids;
        if (mode.drafts == 1)
          for (size_t j = 2 + r.id % 3; j < r.params.draft_reference.size(); j += 5)
            r.params.draft_reference[j] = int32_t((r.params.draft_reference[j] + 1) % V);
      }
      EngineConfig cfg = config(mode.seqs, mode.prompt_rows, 0, false);
      cfg.sched.block_tokens = 8;
      cfg.sched.num_speculative_tokens = mode.k;
      cfg.num_kv_blocks = mode.blocks;
      cfg.prefix_caching = mode.prefix_caching;
      Engine e(*m.model, cfg);
      std::map<RequestId, Result> got = run_on(e, spec);
      for (const auto& [id, r] : want) EXPECT_TRUE(got[id] == r) << "request " << id;
      const EngineStats st = e.stats();
      // A random model of a large vocabulary rarely repeats itself: the n-gram lookup finds
      // drafts on tiny-c (2,048 tokens) only.
      if (mode.drafts != 2 || std::string(preset) == "tiny-c") {
        EXPECT_GT(st.spec_drafted, 0);
      }
      if (mode.drafts == 0) {
        EXPECT_EQ(st.spec_accepted, st.spec_drafted);
      }
      if (mode.drafts == 1) {
        EXPECT_GT(st.spec_accepted, 0);
      }
      if (mode.drafts == 1) {
        EXPECT_LT(st.spec_accepted, st.spec_drafted);
      }
      if (mode.blocks) {
        EXPECT_GT(st.preemptions, 0);
      }
      EXPECT_EQ(e.kv_blocks_used(), 0);
    }
  }
}

// The DSpark draft head in the engine, fp32: outputs are plain decoding's whatever the drafts
// (the head's own, mostly rejected on a random model; a reference output's, then the head's once
// a corrupted token parts them), and every block the head drafts equals the one a lone session
// (every row fed once, nothing rolled back) drafts at the same point: the draft rings see the
// kept rows only, through rejections (slot rollback), chunked prefill, batching, preemption and
// prefix-cache hits (their snapshots carry the rings).
TEST(Engine, DsparkDraftsMatchALoneSessionAndKeepOutputs) {
  for (const char* preset : {"tiny", "tiny-c"}) {
    SCOPED_TRACE(preset);
    LoadedModel m = load_model(preset, Numerics::Fp32, false, /*dspark=*/true);
    const ModelConfig& c = m.model->config();
    const int64_t V = c.vocab_size, B = c.dspark_block_size;
    std::vector<Request> reqs = mixed_requests(6, V, 23, 0.0f);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].params.max_tokens = 14 + int64_t(i);
      reqs[i].params.ignore_eos = true;
      if (i % 2) reqs[i].params.temperature = 0.7f;
      // Requests 3.. repeat request 0's prompt start: prefix-cache hits.
      if (i >= 3)
        reqs[i].prompt_ids.insert(reqs[i].prompt_ids.begin(), reqs[0].prompt_ids.begin(),
                                  reqs[0].prompt_ids.end());
    }
    EngineConfig plain = config(4, 64, 0, false);
    plain.sched.block_tokens = 8;
    const std::map<RequestId, Result> want = run(*m.model, plain, reqs);
    // What a lone session drafts after each prefix of every request's tokens.
    std::map<std::pair<RequestId, int64_t>, std::vector<int32_t>> lone;
    for (const Request& r : reqs) {
      std::vector<int32_t> all = r.prompt_ids;
      all.insert(all.end(), want.at(r.id).ids.begin(), want.at(r.id).ids.end());
      Session sess(*m.model, int64_t(all.size()) + 1);
      DraftOutput d;
      sess.feed({all.begin(), all.begin() + long(r.prompt_ids.size()) - 1});
      for (size_t n = r.prompt_ids.size(); n <= all.size(); ++n) {
        sess.draft(all[n - 1], d);
        lone[{r.id, int64_t(n)}] = d.tokens;
        if (n < all.size()) sess.feed({all[n - 1]});
      }
    }
    struct Mode {
      const char* name;
      bool reference;  // drafts from a corrupted copy of the output first
      int32_t k, seqs;
      int64_t prompt_rows;
      int32_t blocks;
      int64_t bucket = 0;  // padded prompt chunks
      bool as_decode = false;
    };
    for (const Mode& mode : {Mode{"head, K B-1, batch, chunks", false, 0, 4, 5, 0},
                             Mode{"head, K 1, one at a time", false, 1, 1, 64, 0},
                             Mode{"reference then head, K B", true, 0, 4, 64, 0},
                             Mode{"head, small pool", false, 0, 4, 64, 14},
                             Mode{"head, prefill buckets", false, 0, 3, 64, 0, 6},
                             Mode{"head, prompt as decode", false, 0, 3, 64, 0, 0, true}}) {
      SCOPED_TRACE(mode.name);
      std::vector<Request> spec = reqs;
      if (mode.reference)
        for (Request& r : spec) {
          r.params.draft_reference = want.at(r.id).ids;
          r.params.draft_reference[5] = int32_t((r.params.draft_reference[5] + 1) % V);
        }
      EngineConfig cfg = config(mode.seqs, mode.prompt_rows, mode.bucket, mode.as_decode);
      cfg.sched.block_tokens = 8;
      cfg.sched.dspark = true;
      cfg.sched.num_speculative_tokens =
          mode.k ? mode.k : int32_t(mode.reference ? B : std::max<int64_t>(1, B - 1));
      cfg.num_kv_blocks = mode.blocks;
      Engine e(*m.model, cfg);
      int64_t blocks = 0;
      e.set_draft_observer([&](RequestId id, int64_t n, std::span<const int32_t> d) {
        ++blocks;
        const auto it = lone.find({id, n});
        ASSERT_NE(it, lone.end()) << "request " << id << " at " << n;
        // The engine asks for its K drafts: the first K of the block.
        ASSERT_LE(d.size(), it->second.size());
        EXPECT_TRUE(std::equal(d.begin(), d.end(), it->second.begin()))
            << "request " << id << " drafts after " << n << " tokens";
      });
      std::map<RequestId, Result> got = run_on(e, spec);
      for (const auto& [id, r] : want) EXPECT_TRUE(got[id] == r) << "request " << id;
      const EngineStats st = e.stats();
      EXPECT_GT(blocks, 0);
      EXPECT_GT(st.spec_drafted, 0);
      if (mode.reference) {
        EXPECT_GT(st.spec_accepted, 0);
      }
      // The random head's drafts keep missing: drafting pauses (4 misses, then 1, 2, 4, ...
      // steps), so most tokens come from steps without drafts.
      if (!mode.reference) {
        EXPECT_LT(2 * st.spec_steps, st.generated_tokens);
      }
      if (mode.blocks) {
        EXPECT_GT(st.preemptions, 0);
      }
      if (!mode.blocks) {
        EXPECT_GT(st.prefix_hits, 0);
      }
      EXPECT_EQ(e.kv_blocks_used(), 0);
    }
  }
}

TEST(Engine, PreemptionUnderASmallPoolLosesNothing) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  const auto reqs = mixed_requests(200, m.model->config().vocab_size, 9, 0.0f);
  EngineConfig big = config(16, 256, 0, false);
  const auto want = run(*m.model, big, reqs);
  EngineConfig small = big;
  small.num_kv_blocks = 5;  // 80 tokens of context for up to 16 sequences of up to 56 tokens
  int32_t leaked = -1;
  const auto got = run(*m.model, small, reqs, &leaked);
  EXPECT_EQ(got.size(), reqs.size());
  EXPECT_TRUE(got == want);
  EXPECT_EQ(leaked, 0);
}

TEST(Engine, PreemptionHappensAndIsCounted) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  EngineConfig small = config(16, 256, 0, false);
  small.num_kv_blocks = 5;
  Engine e(*m.model, small);
  for (const auto& r : mixed_requests(40, m.model->config().vocab_size, 9, 0.0f)) e.add_request(r);
  while (e.has_unfinished()) e.step();
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_EQ(e.kv_blocks_used(), 0);
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  const auto reqs = mixed_requests(12, m.model->config().vocab_size, 3, 1.0f);
  const auto together = run(*m.model, config(16, 2048, 0, false), reqs);
  for (const auto& r : {reqs[0], reqs[5], reqs[11]}) {
    const auto alone = run(*m.model, config(1, 2048, 0, false), {r});
    EXPECT_TRUE(alone.at(r.id) == together.at(r.id)) << "request " << r.id;
  }
  // And a different seed gives (here) a different continuation.
  Request other = reqs[5];
  other.params.seed = 424242;
  other.params.max_tokens = 12;
  Request same = reqs[5];
  same.params.max_tokens = 12;
  EXPECT_FALSE(run(*m.model, config(1, 2048, 0, false), {other}).at(other.id) ==
               run(*m.model, config(1, 2048, 0, false), {same}).at(same.id));
}

// A vocabulary for the tiny model, which has no tokenizer: ids below 256 are single bytes, the
// rest short strings drawn from JSON's alphabet; id 1 ends the sequence.
std::shared_ptr<const grammar::TokenVocab> synthetic_vocab(int64_t vocab, int32_t eos) {
  std::mt19937_64 rng(5);
  const std::string alphabet = "{}[]\":, \n0123456789-.eEtrufalsn\\abcxyz";
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    if (i < 256) {
      bytes[size_t(i)] = std::string(1, char(i));
      continue;
    }
    const size_t len = 1 + rng() % 6;
    for (size_t k = 0; k < len; ++k) bytes[size_t(i)] += alphabet[rng() % alphabet.size()];
  }
  bytes[size_t(eos)].clear();
  return std::make_shared<grammar::TokenVocab>(std::move(bytes), eos);
}

// Constrained requests: every output is a sentence of its grammar (ended by the grammar or by
// EOS), and a constrained row's tokens do not depend on what else shares its steps.
TEST(Engine, GrammarConstrainedOutputsAreValidAndBatchInvariant) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  const ModelConfig& c = m.model->config();
  const auto vocab = synthetic_vocab(c.vocab_size, int32_t(c.eos_token_id));
  auto g = grammar::Grammar::compile(
      grammar::JsonSchema(R"({"type":"object","properties":{"a":{"type":"integer","minimum":-9,
          "maximum":99},"b":{"enum":["x","yz"]},"c":{"type":"array","items":{"type":"boolean"},
          "maxItems":3}},"required":["a","b","c"]})")
          .value(),
      vocab);
  auto reqs = mixed_requests(10, c.vocab_size, 9, 1.0f);
  for (size_t i = 0; i < reqs.size(); i += 2) {
    reqs[i].params.grammar = g;
    reqs[i].params.max_tokens = 400;
    if (i == 4) reqs[i].params.temperature = 0;
    if (i == 6) reqs[i].params.ignore_eos = true;  // the grammar's end still ends it
  }
  const auto together = run(*m.model, config(16, 2048, 0, false), reqs);
  for (size_t i = 0; i < reqs.size(); i += 2) {
    const Result& r = together.at(reqs[i].id);
    std::string text;
    for (int32_t t : r.ids)
      if (t != c.eos_token_id) text += vocab->bytes(t);
    EXPECT_EQ(r.finish, FinishReason::Stop) << text;
    EXPECT_TRUE(matches(g, text)) << "request " << i << ": " << text;
    const auto alone = run(*m.model, config(1, 2048, 0, false), {reqs[i]});
    EXPECT_TRUE(alone.at(reqs[i].id) == r) << "request " << i;
  }
  // Speculative decoding keeps the grammar's state row by row: drafts from the output above
  // (every one right, or every fourth wrong, some of those outside the grammar) change nothing.
  for (const bool corrupt : {false, true}) {
    auto spec = reqs;
    for (Request& r : spec) {
      r.params.draft_reference = together.at(r.id).ids;
      for (size_t j = 3; corrupt && j < r.params.draft_reference.size(); j += 4)
        r.params.draft_reference[j] = int32_t((r.params.draft_reference[j] + 1) % c.vocab_size);
    }
    EngineConfig cfg = config(16, 2048, 0, false);
    cfg.sched.num_speculative_tokens = 4;
    const auto got = run(*m.model, cfg, spec);
    for (const auto& [id, r] : together) EXPECT_TRUE(got.at(id) == r) << "request " << id;
  }
  // A grammar compiled for another vocabulary is refused.
  Engine e(*m.model, config(2, 2048, 0, false));
  Request bad = reqs[0];
  bad.params.grammar = grammar::Grammar::compile(grammar::lit("x"), synthetic_vocab(300, 1));
  EXPECT_NE(e.add_request(bad).find("vocabulary"), std::string::npos);
}

TEST(Engine, BadRequestsAreRejectedAndOthersComplete) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  Engine e(*m.model, config(4, 2048, 0, false));
  const int64_t V = m.model->config().vocab_size;
  Request ok;
  ok.id = 1;
  ok.prompt_ids = {1, 2, 3};
  ok.params.max_tokens = 3;
  Request empty = ok, oov = ok, negative = ok, too_long = ok, badp = ok, stop_text = ok;
  empty.id = 2;
  empty.prompt_ids.clear();
  oov.id = 3;
  oov.prompt_ids = {1, int32_t(V)};
  negative.id = 4;
  negative.params.max_tokens = -1;
  too_long.id = 5;
  too_long.params.max_tokens = 1 << 30;
  badp.id = 6;
  badp.params.top_p = 0;
  stop_text.id = 7;
  stop_text.params.stop = {"x"};  // no tokenizer in the tiny model
  EXPECT_NE(e.add_request(empty).find("empty"), std::string::npos);
  EXPECT_NE(e.add_request(oov).find("vocabulary"), std::string::npos);
  EXPECT_NE(e.add_request(negative).find("max_tokens"), std::string::npos);
  EXPECT_NE(e.add_request(too_long).find("max_model_len"), std::string::npos);
  EXPECT_NE(e.add_request(badp).find("top_p"), std::string::npos);
  EXPECT_NE(e.add_request(stop_text).find("tokenizer"), std::string::npos);
  // check_request says the same without queueing anything.
  for (const Request* r : {&empty, &oov, &negative, &too_long, &badp, &stop_text})
    EXPECT_EQ(e.check_request(*r), e.add_request(*r)) << "request " << r->id;
  EXPECT_EQ(e.check_request(ok), "");
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.add_request(ok), "");
  EXPECT_NE(e.check_request(ok).find("in use"), std::string::npos);
  while (e.has_unfinished()) e.step();
  const auto done = e.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].output_ids.size(), 3u);
}

TEST(Engine, StopTokenIdsAndAbort) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  EngineConfig cfg = config(4, 2048, 0, false);
  Request r;
  r.id = 1;
  r.prompt_ids = {1, 2, 3};
  r.params.max_tokens = 10;
  r.params.temperature = 0;
  const auto free_run = run(*m.model, cfg, {r}).at(1);
  ASSERT_EQ(free_run.ids.size(), 10u);
  r.params.stop_token_ids = {free_run.ids[4]};
  const auto stopped = run(*m.model, cfg, {r}).at(1);
  EXPECT_EQ(stopped.finish, FinishReason::Stop);
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(free_run.ids.begin(), free_run.ids.begin() + 5));
  Engine e(*m.model, cfg);
  e.add_request(r);
  e.step();
  EXPECT_TRUE(e.abort(1));
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.kv_blocks_used(), 0);
  EXPECT_EQ(e.take_finished().at(0).finish, FinishReason::Abort);
}

// Stop strings are found where they first complete, however long the output already is (the
// engine decodes only a suffix of it): with a decoder that spells each token as one byte or as a
// three-byte character (so the suffix window holds fewer tokens than the stop string has bytes), a
// stop string taken from late in a free run ends the request exactly at the token that completes
// its first occurrence.
TEST(Engine, StopStringsFoundLateInLongOutputs) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  EngineConfig cfg = config(4, 2048, 0, false);
  for (const bool wide : {false, true}) {
    auto spell = [wide](int32_t t) {
      return wide ? std::string("\xe2\x82") + char(0x80 + t % 6)  // U+2080..U+2085
                  : std::string(1, char('a' + t % 6));
    };
    int64_t decoded = 0;  // tokens passed to the decoder by the stop check
    TextDecoder decoder = [&](std::span<const int32_t> ids) {
      decoded += int64_t(ids.size());
      std::string out;
      for (int32_t t : ids) out += spell(t);
      return out;
    };
    Request r;
    r.id = 1;
    r.prompt_ids = {5, 6, 7};
    r.params.max_tokens = 300;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    Engine free_engine(*m.model, cfg, nullptr);
    ASSERT_EQ(free_engine.add_request(r), "");
    while (free_engine.has_unfinished()) free_engine.step();
    const std::vector<int32_t> ids = free_engine.take_finished().at(0).output_ids;
    ASSERT_EQ(ids.size(), 300u);
    std::vector<std::string> chars;
    for (int32_t t : ids) chars.push_back(spell(t));
    std::string stop;
    for (int i = 250; i < 254; ++i) stop += chars[size_t(i)];
    // Where the text first contains the stop string, in tokens.
    std::string text;
    size_t want = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      text += chars[i];
      if (text.find(stop) != std::string::npos) {
        want = i + 1;
        break;
      }
    }
    r.params.stop = {stop, "\x01never"};
    Engine e(*m.model, cfg, decoder);
    ASSERT_EQ(e.add_request(r), "");
    while (e.has_unfinished()) e.step();
    const RequestOutput out = e.take_finished().at(0);
    EXPECT_EQ(out.finish, FinishReason::Stop) << "wide " << wide;
    EXPECT_EQ(out.stop_text, stop);
    EXPECT_EQ(out.output_ids.size(), want) << "wide " << wide;
    // Constant work per token: a bounded suffix each step, not the whole output (which would be
    // over 30,000 tokens decoded for 250 steps).
    EXPECT_LE(decoded, int64_t(want) * 32) << "wide " << wide;
  }
}

}  // namespace
}  // namespace deepinfer::testing
