// make-tiny: deterministic output (same seed and any thread count give the same bytes, another
// seed other weights), sharding through the index, and every preset loading back.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/tiny.h"
#include "io_test_util.h"

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
  // A preset without its Engram rows filled in is rejected before anything is written.
  ScratchDir dir;
  EXPECT_TRUE(
      mentions(error_of([&] { write_tiny_checkpoint(dir / "x", tiny_preset_config("tiny"), {}); }),
               {"engram_num_embeddings"}));
  EXPECT_FALSE(fs::exists(dir / "x/config.json"));
  // An output path under a regular file.
  write_text(dir / "file", "");
  EXPECT_TRUE(mentions(error_of([&] {
                         write_tiny_checkpoint(dir / "file/ck", preset_with_engram_rows("tiny-c"),
                                               {});
                       }),
                       {dir / "file/ck", "cannot create directory"}));
}

}  // namespace
}  // namespace deepinfer
