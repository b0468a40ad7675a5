#include "model_harness.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "runtime/builtin.h"

namespace deepinfer::testing {

namespace fs = std::filesystem;

std::string preset_dir(const std::string& model, uint64_t seed) {
  const fs::path dir =
      fs::path(cache_dir()) / "test-models" / (model + "-seed" + std::to_string(seed));
  if (!fs::exists(dir / "config.json")) {
    fs::create_directories(dir.parent_path());
    TinyCheckpoint t;
    std::string name = model;
    if (const size_t at = name.find("+vision"); at != std::string::npos) {
      t.vision = true;
      name.erase(at, 7);
    }
    if (const size_t at = name.find('@'); at != std::string::npos) {
      t.layout = parse_tiny_layout(name.substr(at + 1));
      name.resize(at);
    }
    if (name.rfind("random-", 0) == 0) {
      t.random = true;
      t.config_seed = std::stoull(name.substr(7));
    } else {
      t.preset = name;
    }
    t.seed = seed;
    make_tiny_checkpoint(dir.string(), t, /*keep_existing=*/true);
  }
  return dir.string();
}

LoadedModel load_model(const std::string& preset, Numerics numerics, bool defect, bool dspark) {
  LoadedModel m;
  m.ck = Checkpoint::load(preset_dir(preset));
  ModelOptions o;
  o.numerics = numerics;
  o.demo_decode_defect = defect;
  o.dspark = dspark;
  m.model = std::make_unique<Model>(*m.ck, o);
  return m;
}

namespace {
KvCache make_cache(const ModelConfig& c, int64_t tokens, int32_t seqs, std::vector<int32_t>* blocks,
                   int64_t* per_seq) {
  KvCacheOptions o;
  o.block_tokens = 16;
  o.max_seqs = seqs;
  *per_seq = (tokens + o.block_tokens - 1) / o.block_tokens + 1;
  o.num_blocks = int32_t(*per_seq * seqs);
  o.draft_layers = c.n_mtp_layers;  // rings for a draft head, if the model runs one
  blocks->resize(size_t(o.num_blocks));
  // Interleave the blocks of different sequences so that paging is exercised.
  for (int32_t i = 0; i < o.num_blocks; ++i)
    (*blocks)[size_t(i)] = int32_t((i % *per_seq) * seqs + i / *per_seq);
  return KvCache(c, o);
}
}  // namespace

std::vector<float> run_chunks(Model& m, const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& chunks,
                              const std::vector<const float*>& image_embeds) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> blocks;
  int64_t per_seq;
  KvCache kv = make_cache(m.config(), int64_t(tokens.size()), 1, &blocks, &per_seq);
  std::vector<float> out(tokens.size() * size_t(V));
  int64_t pos = 0;
  for (int64_t n : chunks) {
    ForwardBatch b;
    b.tokens.assign(tokens.begin() + pos, tokens.begin() + pos + n);
    if (!image_embeds.empty())
      b.image_embeds.assign(image_embeds.begin() + pos, image_embeds.begin() + pos + n);
    ForwardSeq s;
    s.start_pos = pos;
    s.n_tokens = n;
    s.kv = {0, blocks.data(), per_seq};
    s.logits_from = 0;
    b.seqs.push_back(s);
    m.forward(b, kv, out.data() + pos * V);
    pos += n;
  }
  DI_CHECK(pos == int64_t(tokens.size()), "chunks do not cover the tokens");
  return out;
}

std::vector<std::vector<float>> run_batched(Model& m, const std::vector<std::vector<int32_t>>& seqs,
                                            const std::vector<int64_t>& prefix_lens) {
  const int64_t V = m.config().vocab_size;
  int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max<int64_t>(longest, int64_t(s.size()));
  std::vector<int32_t> blocks;
  int64_t per_seq;
  KvCache kv = make_cache(m.config(), longest, int32_t(seqs.size()), &blocks, &per_seq);
  std::vector<float> scratch;
  // Prefixes alone, one sequence per step.
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (prefix_lens[i] == 0) continue;
    ForwardBatch b;
    b.tokens.assign(seqs[i].begin(), seqs[i].begin() + prefix_lens[i]);
    ForwardSeq s;
    s.n_tokens = prefix_lens[i];
    s.kv = {int32_t(i), blocks.data() + i * size_t(per_seq), per_seq};
    s.logits_from = prefix_lens[i];
    b.seqs.push_back(s);
    m.forward(b, kv, scratch.data());
  }
  // The rest of every sequence in one step.
  ForwardBatch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    ForwardSeq s;
    s.start_pos = prefix_lens[i];
    s.n_tokens = int64_t(seqs[i].size()) - prefix_lens[i];
    s.kv = {int32_t(i), blocks.data() + i * size_t(per_seq), per_seq};
    s.logits_from = 0;
    b.tokens.insert(b.tokens.end(), seqs[i].begin() + prefix_lens[i], seqs[i].end());
    b.seqs.push_back(s);
  }
  std::vector<float> all(size_t(b.n_logit_rows() * V));
  m.forward(b, kv, all.data());
  std::vector<std::vector<float>> out;
  size_t off = 0;
  for (const auto& s : b.seqs) {
    const size_t n = size_t(s.n_tokens * V);
    out.emplace_back(all.begin() + long(off), all.begin() + long(off + n));
    off += n;
  }
  return out;
}

Session::Session(Model& m, int64_t max_tokens) : m_(m) {
  kv_ = std::make_unique<KvCache>(make_cache(m.config(), max_tokens, 1, &blocks_, &per_seq_));
}

std::vector<float> Session::feed(const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size());
  std::vector<float> out(size_t(n * m_.config().vocab_size));
  ForwardBatch b;
  b.tokens = tokens;
  ForwardSeq s;
  s.start_pos = pos_;
  s.n_tokens = n;
  s.kv = {0, blocks_.data(), per_seq_};
  b.seqs.push_back(s);
  m_.forward(b, *kv_, out.data());
  pos_ += n;
  last_n_ = n;
  if (m_.has_draft_head()) {
    DraftOutput none;
    const DraftSeq keep{0, n, -1};
    m_.draft({&keep, 1}, *kv_, none);
  }
  return out;
}

void Session::draft(int32_t token, DraftOutput& out) {
  // The rows of the last call enter the rings again (the same entries) before the draft.
  const DraftSeq d{0, last_n_, token};
  m_.draft({&d, 1}, *kv_, out);
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  DI_REQUIRE(p, "cannot run: ", cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  DI_REQUIRE(rc == 0, "command failed (", rc, "): ", cmd, "\n", out);
  return out;
}

}  // namespace deepinfer::testing
