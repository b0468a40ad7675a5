// Loading a make-tiny checkpoint: every tensor of the schema is bound, zero-copy, in the right
// slot with the right format and shape; the tiny preset exercises every layer role; the weights
// are quantized the way the release stores them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/tiny.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;

// The preset `tiny` with seed 0, written once for the tests of this file.
const std::string& tiny_dir() {
  static ScratchDir dir;
  static const std::string path = [] {
    const std::string p = dir / "tiny";
    TinyWriteOptions opt;
    write_tiny_checkpoint(p, preset_with_engram_rows("tiny"), opt);
    return p;
  }();
  return path;
}

// Each slot of a layer and the tensor name (after "layers.<l>.") it must hold.
const std::vector<std::pair<Weight LayerWeights::*, const char*>>& layer_slots() {
  static const std::vector<std::pair<Weight LayerWeights::*, const char*>> slots = {
      {&LayerWeights::attn_norm, "attn_norm.weight"},
      {&LayerWeights::ffn_norm, "ffn_norm.weight"},
      {&LayerWeights::hc_attn_fn, "hc_attn_fn"},
      {&LayerWeights::hc_attn_base, "hc_attn_base"},
      {&LayerWeights::hc_attn_scale, "hc_attn_scale"},
      {&LayerWeights::hc_ffn_fn, "hc_ffn_fn"},
      {&LayerWeights::hc_ffn_base, "hc_ffn_base"},
      {&LayerWeights::hc_ffn_scale, "hc_ffn_scale"},
      {&LayerWeights::wq_a, "attn.wq_a.weight"},
      {&LayerWeights::q_norm, "attn.q_norm.weight"},
      {&LayerWeights::wq_b, "attn.wq_b.weight"},
      {&LayerWeights::wkv, "attn.wkv.weight"},
      {&LayerWeights::kv_norm, "attn.kv_norm.weight"},
      {&LayerWeights::attn_sink, "attn.attn_sink"},
      {&LayerWeights::wo_a, "attn.wo_a.weight"},
      {&LayerWeights::wo_b, "attn.wo_b.weight"},
      {&LayerWeights::cmp_wkv, "attn.compressor.wkv.weight"},
      {&LayerWeights::cmp_wgate, "attn.compressor.wgate.weight"},
      {&LayerWeights::cmp_norm, "attn.compressor.norm.weight"},
      {&LayerWeights::idx_wq_b, "attn.indexer.wq_b.weight"},
      {&LayerWeights::idx_weights_proj, "attn.indexer.weights_proj.weight"},
      {&LayerWeights::idx_wk, "attn.indexer.wk.weight"},
      {&LayerWeights::idx_k_norm, "attn.indexer.k_norm.weight"},
      {&LayerWeights::gate, "ffn.gate.weight"},
      {&LayerWeights::gate_bias, "ffn.gate.bias"},
      {&LayerWeights::engram_table, "engram.embed.weight"},
      {&LayerWeights::engram_wkv, "engram.wkv.weight"},
      {&LayerWeights::engram_q, "engram.q_weight"},
      {&LayerWeights::engram_k, "engram.k_weight"},
  };
  return slots;
}

// Every bound weight of a checkpoint with the name its slot says it must have.
std::vector<std::pair<const Weight*, std::string>> bound_weights(const Checkpoint& ck) {
  std::vector<std::pair<const Weight*, std::string>> v = {
      {&ck.embed, "embed.weight"}, {&ck.norm, "norm.weight"}, {&ck.head, "head.weight"}};
  auto add_layer = [&](const LayerWeights& L, const std::string& p, int expert_begin) {
    for (const auto& [slot, name] : layer_slots()) v.push_back({&(L.*slot), p + name});
    auto add_expert = [&](const ExpertWeights& e, const std::string& prefix) {
      v.push_back({&e.w1, prefix + "w1.weight"});
      v.push_back({&e.w2, prefix + "w2.weight"});
      v.push_back({&e.w3, prefix + "w3.weight"});
    };
    for (size_t i = 0; i < L.experts.size(); ++i)
      add_expert(L.experts[i], p + "ffn.experts." + std::to_string(expert_begin + int(i)) + ".");
    add_expert(L.shared, p + "ffn.shared_experts.");
  };
  for (size_t l = 0; l < ck.layers.size(); ++l)
    add_layer(ck.layers[l], "layers." + std::to_string(l) + ".", ck.expert_begin);
  // The draft head: every stage with all its experts, the heads in the first and last stages.
  const DsparkWeights& d = ck.dspark;
  for (size_t k = 0; k < d.stages.size(); ++k)
    add_layer(d.stages[k], "mtp." + std::to_string(k) + ".", 0);
  if (!d.stages.empty()) {
    const std::string last = "mtp." + std::to_string(d.stages.size() - 1) + ".";
    for (const auto& [w, name] : {std::pair{&d.main_proj, "mtp.0.main_proj.weight"},
                                  {&d.main_norm, "mtp.0.main_norm.weight"}})
      v.push_back({w, name});
    for (const auto& [w, name] : {std::pair{&d.norm, "norm.weight"},
                                  {&d.markov_embed, "markov_head.embed.weight"},
                                  {&d.markov_head, "markov_head.head.weight"},
                                  {&d.confidence, "confidence_head.proj.weight"}})
      v.push_back({w, last + name});
  }
  return v;
}

int64_t ceil32(int64_t x) {
  return (x + 31) / 32;
}

// A checkpoint stored without the draft head's tensors loads without it, and a model asked to
// run it says so; the backbone is bound as usual.
TEST(Checkpoint, DraftHeadIsOptional) {
  ScratchDir dir;
  const ModelConfig c = micro_config();
  TinyWriteOptions o;
  o.dspark = false;
  write_tiny_checkpoint(dir / "plain", c, o);
  auto ck = Checkpoint::load(dir / "plain");
  EXPECT_FALSE(ck->has_dspark);
  EXPECT_TRUE(ck->dspark.stages.empty());
  EXPECT_EQ(ck->layers.size(), size_t(c.n_layers));
  o.dspark = true;
  write_tiny_checkpoint(dir / "draft", c, o);
  auto with = Checkpoint::load(dir / "draft");
  EXPECT_TRUE(with->has_dspark);
  EXPECT_EQ(with->dspark.stages.size(), size_t(c.n_mtp_layers));
  EXPECT_GT(with->bound_bytes, ck->bound_bytes);
}

TEST(Checkpoint, TinyBindsEverySchemaTensorZeroCopy) {
  auto ck = Checkpoint::load(tiny_dir());
  const ModelConfig& c = ck->config();
  EXPECT_EQ(ck->dir(), tiny_dir());
  EXPECT_EQ(ck->expert_begin, 0);
  EXPECT_EQ(ck->expert_end, c.n_routed_experts);
  EXPECT_TRUE(ck->skipped_tensors.empty());
  EXPECT_EQ(ck->converted_bytes, 0u);  // make-tiny stores every tensor in its native format
  ASSERT_EQ(ck->layers.size(), size_t(c.n_layers));

  std::map<std::string, const Weight*> bound;
  for (const auto& [w, name] : bound_weights(*ck)) {
    if (!w->present()) continue;
    EXPECT_EQ(w->name, name) << "weight in the wrong slot";
    EXPECT_TRUE(bound.emplace(name, w).second) << name;
  }
  const std::vector<TensorSpec> schema = checkpoint_schema(c);
  EXPECT_EQ(bound.size(), schema.size());
  size_t quantized = 0;
  for (const TensorSpec& s : schema) {
    SCOPED_TRACE(s.name);
    auto it = bound.find(s.name);
    ASSERT_NE(it, bound.end());
    const Weight& w = *it->second;
    EXPECT_EQ(w.format, s.format);
    EXPECT_EQ(w.shape, s.shape);
    const TensorInfo& t = ck->store().get(s.name);
    EXPECT_EQ(w.data, t.data);  // mapped, not copied
    switch (s.format) {
      case WeightFormat::F32:
        EXPECT_EQ(t.dtype, DType::F32);
        EXPECT_EQ(w.scale, nullptr);
        break;
      case WeightFormat::BF16:
        EXPECT_EQ(t.dtype, DType::BF16);
        EXPECT_EQ(w.scale, nullptr);
        break;
      case WeightFormat::Fp8Block:
      case WeightFormat::Fp8Row:
      case WeightFormat::Fp4Row: {
        ++quantized;
        const TensorInfo& st = ck->store().get(scale_name(s.name));
        EXPECT_EQ(st.dtype, DType::E8M0);
        EXPECT_EQ(w.scale, st.data);
        const int64_t rows = s.shape[0], cols = s.shape[1];
        const Shape want_scale = s.format == WeightFormat::Fp8Block
                                     ? Shape{ceil32(rows), ceil32(cols)}
                                     : Shape{rows, cols / 32};
        EXPECT_EQ(st.shape, want_scale);
        EXPECT_EQ(w.scale_cols, want_scale[1]);
        // fp4 is stored as the release does: I8 bytes [rows, cols / 2].
        EXPECT_EQ(t.dtype, s.format == WeightFormat::Fp4Row ? DType::I8 : DType::E4M3);
        if (s.format == WeightFormat::Fp4Row) {
          EXPECT_EQ(t.shape, (Shape{rows, cols / 2}));
        }
        EXPECT_EQ(w.nbytes(), t.nbytes + st.nbytes);
        break;
      }
    }
  }
  EXPECT_EQ(ck->store().size(), schema.size() + quantized);  // nothing else in the files
}

TEST(Checkpoint, TinyExercisesEveryLayerRole) {
  auto ck = Checkpoint::load(tiny_dir());
  const ModelConfig& c = ck->config();
  const auto roles = layer_roles(c);
  std::set<int> ratio_of_kv_sources, engram;
  bool consumer = false, non_owner_index = false, candidate_source = false,
       candidate_consumer = false, window_only = false;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerRole& r = roles[size_t(l)];
    const LayerWeights& L = ck->layers[size_t(l)];
    SCOPED_TRACE("layer " + std::to_string(l));
    window_only |= r.ratio == 0;
    if (r.kv_source) ratio_of_kv_sources.insert(r.ratio);
    consumer |= r.ratio > 0 && !r.kv_source && !r.index_source;
    non_owner_index |= r.index_source && !r.key_owner;
    candidate_source |= r.candidate_source;
    candidate_consumer |= r.candidate_consumer;
    if (c.is_engram_layer(l)) engram.insert(l);
    // Tensors exist exactly where the role needs them.
    EXPECT_EQ(L.cmp_wkv.present(), r.kv_source);
    EXPECT_EQ(L.cmp_norm.present(), r.kv_source);
    EXPECT_EQ(L.cmp_wgate.present(), r.kv_source && r.ratio > 1);
    EXPECT_EQ(L.idx_wq_b.present(), r.index_source);
    EXPECT_EQ(L.idx_weights_proj.present(), r.index_source);
    EXPECT_EQ(L.idx_wk.present(), r.key_owner);
    EXPECT_EQ(L.idx_k_norm.present(), r.key_owner);
    EXPECT_EQ(L.engram_table.present(), c.is_engram_layer(l));
    if (c.is_engram_layer(l)) {
      EXPECT_EQ(L.engram_table.rows(), c.engram_num_embeddings[size_t(c.engram_index(l))]);
    }
  }
  EXPECT_TRUE(window_only);
  EXPECT_EQ(ratio_of_kv_sources, (std::set<int>{1, 2}));
  EXPECT_TRUE(consumer);
  EXPECT_TRUE(non_owner_index);
  EXPECT_TRUE(candidate_source);
  EXPECT_TRUE(candidate_consumer);
  EXPECT_GE(engram.size(), 2u);
  // The Engram tables hold at least the rows the hash can address.
  const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
  check_engram_num_embeddings(
      make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size,
                         c.engram_compressed_vocab_size),
      c.engram_num_embeddings);
}

// The quantized weights follow the release's recipe: each block's scale is the smallest power
// of two that fits its largest magnitude, so the largest code of a block lies in the top octave
// of the format (e4m3: (224, 448], e2m1: {3, 4, 6} after rounding) and no code is NaN.
TEST(Checkpoint, TinyWeightsAreQuantizedLikeTheRelease) {
  auto ck = Checkpoint::load(tiny_dir());
  for (const TensorSpec& s : checkpoint_schema(ck->config())) {
    const TensorInfo& t = ck->store().get(s.name);
    if (s.format == WeightFormat::F32 || s.format == WeightFormat::BF16) {
      // Norm weights are drawn around 1, everything else around 0.
      double sum = 0;
      const int64_t n = s.shape.numel();
      for (int64_t i = 0; i < n; ++i) {
        float v;
        if (t.dtype == DType::F32) {
          std::memcpy(&v, t.data + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, t.data + 2 * i, 2);
          v = bf16_to_f32(h);
        }
        ASSERT_TRUE(std::isfinite(v)) << s.name;
        sum += v;
      }
      const bool norm = s.name.size() > 11 && s.name.rfind("norm.weight") == s.name.size() - 11;
      if (norm) {
        EXPECT_NEAR(sum / double(n), 1.0, 0.1) << s.name;
      }
      continue;
    }
    const TensorInfo& st = ck->store().get(scale_name(s.name));
    const int64_t rows = s.shape[0], cols = s.shape[1];
    const bool block = s.format == WeightFormat::Fp8Block, fp4 = s.format == WeightFormat::Fp4Row;
    const int64_t br = block ? ceil32(rows) : rows, bc = ceil32(cols);
    std::vector<float> amax(size_t(br * bc), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const size_t i = size_t(r * cols + k);
        const float v = fp4 ? e2m1_packed_get(t.data, i) : e4m3_to_f32(t.data[i]);
        ASSERT_FALSE(std::isnan(v)) << s.name;
        float& m = amax[size_t((block ? r / 32 : r) * bc + k / 32)];
        m = std::max(m, std::fabs(v));
      }
    for (size_t b = 0; b < amax.size(); ++b) {
      ASSERT_NE(st.data[b], 255) << s.name << " scale " << b;
      if (fp4)
        ASSERT_GE(amax[b], 3.0f) << s.name << " block " << b;
      else
        ASSERT_GE(amax[b], 224.0f) << s.name << " block " << b;
    }
  }
}

TEST(Checkpoint, ExpertRangesBindOnlyTheirExperts) {
  auto ck = Checkpoint::load(tiny_dir(), 2, 5);
  EXPECT_EQ(ck->expert_begin, 2);
  EXPECT_EQ(ck->expert_end, 5);
  for (size_t l = 0; l < ck->layers.size(); ++l) {
    const LayerWeights& L = ck->layers[l];
    ASSERT_EQ(L.experts.size(), 3u);
    for (int e = 0; e < 3; ++e) {
      const std::string p = "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e + 2);
      EXPECT_EQ(L.experts[size_t(e)].w1.name, p + ".w1.weight");
      EXPECT_EQ(L.experts[size_t(e)].w2.name, p + ".w2.weight");
      EXPECT_EQ(L.experts[size_t(e)].w3.data, ck->store().get(p + ".w3.weight").data);
    }
    EXPECT_TRUE(L.shared.w1.present());  // every rank holds the shared expert
  }
  // The schema of a range lists only those experts.
  size_t n_expert_tensors = 0;
  for (const TensorSpec& s : checkpoint_schema(ck->config(), 2, 5, /*dspark=*/false))
    if (s.name.find(".ffn.experts.") != std::string::npos) {
      ++n_expert_tensors;
      const int e = std::stoi(s.name.substr(s.name.find(".experts.") + 9));
      EXPECT_TRUE(e >= 2 && e < 5) << s.name;
    }
  EXPECT_EQ(n_expert_tensors, size_t(ck->config().n_layers) * 3 * 3);
  // The draft stages' experts are not split: the rank that drafts holds all of them.
  auto ranged = Checkpoint::load(tiny_dir(), 2, 5);
  ASSERT_TRUE(ranged->has_dspark);
  for (const LayerWeights& st : ranged->dspark.stages)
    EXPECT_EQ(st.experts.size(), size_t(ranged->config().dspark_experts()));
  // An empty range is allowed (a rank with no experts); ranges outside [0, E) are not.
  EXPECT_TRUE(Checkpoint::load(tiny_dir(), 8, 8)->layers[0].experts.empty());
  for (auto [b, e] : {std::pair{5, 2}, std::pair{-1, 3}, std::pair{0, 9}}) {
    EXPECT_TRUE(mentions(error_of([&] { Checkpoint::load(tiny_dir(), b, e); }),
                         {tiny_dir(), "expert range"}));
  }
}

// A weight whose values were copied leaves the resident set when released, and still reads the
// same bytes afterwards (the mapping is read-only; the pages come back from the file).
TEST(Checkpoint, ReleasedWeightsLeaveTheResidentSetAndReadTheSame) {
  auto ck = Checkpoint::load(tiny_dir());
  const Weight& head = ck->head;  // the largest tensor of tiny (bf16 [vocab, dim])
  const uint64_t bytes = head.value_bytes();
  ASSERT_GE(bytes, uint64_t(8) << 20);
  auto rss_kib = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    return -1LL;
  };
  auto checksum = [&] {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < bytes; ++i) sum = sum * 31 + head.u8()[i];
    return sum;
  };
  const uint64_t before = checksum();  // every page of the values is now resident
  const long long touched = rss_kib();
  ck->release_resident(head);
  const long long released = rss_kib();
  EXPECT_GT(touched - released, (long long)(bytes / 1024 / 2))
      << "RSS " << touched << " -> " << released << " KiB for " << bytes / 1024 << " KiB of values";
  EXPECT_EQ(checksum(), before);
}

}  // namespace
}  // namespace deepinfer
