// make-tiny: deterministic output (same seed and any thread count give the same bytes, another
// seed other weights), sharding through the index, and every preset loading back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/tiny.h"
#include "io_test_util.h"
#include "kernels/engram_hash.h"

namespace deepinfer {
namespace {

using namespace testing_io;

// File name -> bytes of every file in a directory.
std::map<std::string, std::vector<uint8_t>> files_of(const std::string& dir) {
  std::map<std::string, std::vector<uint8_t>> m;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().filename().string()] = read_bytes(e.path().string());
  return m;
}

TEST(MakeTiny, SameSeedGivesTheSameBytesAtAnyThreadCount) {
  const int threads = ThreadPool::global().size();
  const ModelConfig c = preset_with_engram_rows("tiny");
  ScratchDir dir;
  TinyWriteOptions opt;
  opt.seed = 7;
  ThreadPool::set_global_threads(1);
  const uint64_t bytes = write_tiny_checkpoint(dir / "one", c, opt);
  ThreadPool::set_global_threads(3);
  write_tiny_checkpoint(dir / "three", c, opt);
  ThreadPool::set_global_threads(threads);
  write_tiny_checkpoint(dir / "default", c, opt);

  const auto one = files_of(dir / "one");
  EXPECT_GE(one.size(), 4u);  // config, index and several shards
  EXPECT_TRUE(one.count("config.json"));
  EXPECT_TRUE(one.count("model.safetensors.index.json"));
  EXPECT_TRUE(one == files_of(dir / "three")) << "1 vs 3 threads";
  EXPECT_TRUE(one == files_of(dir / "default")) << "1 vs " << threads << " threads";

  // Writing over an existing checkpoint replaces it with the same bytes.
  write_tiny_checkpoint(dir / "one", c, opt);
  EXPECT_TRUE(one == files_of(dir / "one"));

  // The returned size, the index's total_size, the tensors in the files and the footprint of
  // the schema agree.
  auto store = TensorStore::open_dir(dir / "one");
  EXPECT_EQ(store->total_bytes(), bytes);
  EXPECT_EQ(weight_footprint(c).total, bytes);
  const auto index = nlohmann::json::parse(read_text(dir / "one/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), bytes);
  // Shards stay under the limit unless one weight (with its scale) is larger on its own.
  for (const auto& [name, data] : one) {
    if (name.rfind("model-", 0) != 0) continue;
    auto f = SafetensorsFile::open(dir / ("one/" + name));
    uint64_t n = 0;
    for (const TensorInfo& t : f->tensors()) n += t.nbytes;
    EXPECT_TRUE(n <= opt.max_shard_bytes || f->tensors().size() <= 2) << name;
    EXPECT_EQ(f->metadata().at("format"), "pt");
  }
  // config.json is the config.
  const ModelConfig back = ModelConfig::load(dir / "one");
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.engram_num_embeddings, c.engram_num_embeddings);
}

TEST(MakeTiny, AnotherSeedGivesOtherWeights) {
  const ModelConfig c = preset_with_engram_rows("tiny-c");
  ScratchDir dir;
  TinyWriteOptions a, b;
  b.seed = 1;
  write_tiny_checkpoint(dir / "a", c, a);
  write_tiny_checkpoint(dir / "b", c, b);
  EXPECT_EQ(read_text(dir / "a/config.json"), read_text(dir / "b/config.json"));
  EXPECT_EQ(read_text(dir / "a/model.safetensors.index.json"),
            read_text(dir / "b/model.safetensors.index.json"));
  auto sa = TensorStore::open_dir(dir / "a");
  auto sb = TensorStore::open_dir(dir / "b");
  ASSERT_EQ(sa->names(), sb->names());
  for (const std::string& name : sa->names()) {
    const TensorInfo &ta = sa->get(name), &tb = sb->get(name);
    ASSERT_EQ(ta.nbytes, tb.nbytes);
    // Scales of small grids may coincide; every weight tensor must differ.
    if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0) continue;
    EXPECT_NE(std::memcmp(ta.data, tb.data, ta.nbytes), 0) << name;
  }
}

TEST(MakeTiny, EveryPresetValidatesAndTheSmallOnesLoad) {
  for (const std::string& name : tiny_preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = preset_with_engram_rows(name);
    c.validate(name);
    EXPECT_FALSE(c.engram_layer_ids.empty());
    EXPECT_NO_THROW(layer_roles(c));
    if (name == "small") {
      // V4.1-shaped: a few GB, too big to write in a unit test.
      EXPECT_EQ(c.head_dim, 512);
      EXPECT_GT(weight_footprint(c).total, uint64_t(1) << 30);
      continue;
    }
    ScratchDir dir;
    TinyWriteOptions opt;
    opt.max_shard_bytes = 1 << 20;
    write_tiny_checkpoint(dir / "ck", c, opt);
    auto ck = Checkpoint::load(dir / "ck");
    EXPECT_EQ(ck->layers.size(), size_t(c.n_layers));
    EXPECT_TRUE(ck->layers[size_t(c.engram_layer_ids[0])].engram_table.present());
  }
  // A preset without its Engram rows filled in is rejected before anything is written, naming
  // where the config came from.
  ScratchDir dir;
  TinyWriteOptions labelled;
  labelled.label = "preset tiny";
  EXPECT_TRUE(mentions(
      error_of([&] { write_tiny_checkpoint(dir / "x", tiny_preset_config("tiny"), labelled); }),
      {"preset tiny", "engram_num_embeddings"}));
  EXPECT_FALSE(fs::exists(dir / "x/config.json"));
  // An output path under a regular file.
  write_text(dir / "file", "");
  EXPECT_TRUE(mentions(error_of([&] {
                         write_tiny_checkpoint(dir / "file/ck", preset_with_engram_rows("tiny-c"),
                                               {});
                       }),
                       {dir / "file/ck", "cannot create directory"}));
}

// Random configs stay inside the config rules, and over a few hundred seeds they reach every shape
// the generator promises (tiny.h).
TEST(MakeTiny, RandomConfigsAreValidAndCoverTheRules) {
  bool ro_not_32 = false, bf16 = false, null_experts = false, gap = false, odd_experts = false,
       candidates = false, consumer = false;
  std::set<int> ngrams;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    ModelConfig c = random_tiny_config(seed);
    const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
    c.engram_num_embeddings =
        make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size,
                           c.engram_compressed_vocab_size)
            .rows;
    ASSERT_NO_THROW(c.validate("seed " + std::to_string(seed))) << seed;
    EXPECT_EQ(random_tiny_config(seed).to_json(), random_tiny_config(seed).to_json());
    ro_not_32 |= c.o_lora_rank % 32 != 0;
    bf16 |= c.dtype == "bf16";
    null_experts |= c.expert_dtype.empty();
    odd_experts |= c.n_routed_experts % 2 == 1 && c.n_activated_experts % 2 == 1;
    candidates |= c.candidate_source_layer >= 0;
    ngrams.insert(c.engram_max_ngram_size);
    const auto& r = c.compress_ratios;
    for (int l = 1; l + 1 < c.n_layers; ++l)
      gap |= r[size_t(l)] == 0 &&
             std::any_of(r.begin(), r.begin() + l, [](int x) { return x > 0; }) &&
             std::any_of(r.begin() + l + 1, r.begin() + c.n_layers, [](int x) { return x > 0; });
    for (const LayerRole& role : layer_roles(c))
      consumer |= role.ratio > 0 && !role.kv_source && !role.index_source;
  }
  EXPECT_TRUE(ro_not_32 && bf16 && null_experts && gap && odd_experts && candidates && consumer);
  EXPECT_EQ(ngrams, (std::set<int>{2, 3, 4}));
}

// The runtime layout stores what the reference holds after loading, and it loads into the forms
// the table in checkpoint.h gives.
TEST(MakeTiny, RuntimeLayoutLoadsInTheReferenceForms) {
  const ModelConfig c = preset_with_engram_rows("tiny");
  ScratchDir dir;
  TinyWriteOptions opt;
  opt.layout = TinyLayout::Runtime;
  write_tiny_checkpoint(dir / "rt", c, opt);
  auto store = TensorStore::open_dir(dir / "rt");
  EXPECT_EQ(store->get("layers.0.attn.wo_a.weight").dtype, DType::BF16);
  EXPECT_FALSE(store->find("layers.0.attn.wo_a.scale"));
  EXPECT_EQ(store->get("layers.2.attn.compressor.wgate.weight").dtype, DType::F32);
  EXPECT_EQ(store->get("layers.4.attn.compressor.wkv.weight").dtype, DType::BF16);  // ratio 1
  EXPECT_EQ(store->get("layers.0.attn_norm.weight").dtype, DType::F32);
  EXPECT_EQ(store->get("layers.0.ffn.gate.weight").dtype, DType::F32);
  EXPECT_EQ(store->get("head.weight").dtype, DType::BF16);
  EXPECT_EQ(store->get("layers.0.attn.wq_a.weight").dtype, DType::E4M3);
  auto ck = Checkpoint::load(dir / "rt");
  const LayerWeights& L2 = ck->layers[2];
  EXPECT_EQ(L2.cmp_wgate.format, WeightFormat::F32);
  int not_bf16 = 0;  // compressor values are genuinely fp32
  for (int64_t i = 0; i < 64; ++i)
    not_bf16 += bf16_to_f32(f32_to_bf16(L2.cmp_wgate.f32()[i])) != L2.cmp_wgate.f32()[i];
  EXPECT_GT(not_bf16, 50);
  EXPECT_EQ(L2.attn_norm.format, WeightFormat::BF16);  // rounded on load
  EXPECT_EQ(L2.wo_a.format, WeightFormat::BF16);
  EXPECT_FALSE(L2.wo_a.quant_input);
  EXPECT_TRUE(L2.wq_a.quant_input);
  bool saw_wo_a = false;
  for (const auto& [name, form] : ck->forms)
    if (name == "layers.0.attn.wo_a.weight") {
      saw_wo_a = true;
      EXPECT_EQ(form, "BF16 -> bf16 -> plain bf16 linear");
    }
  EXPECT_TRUE(saw_wo_a);
}

}  // namespace
}  // namespace deepinfer
