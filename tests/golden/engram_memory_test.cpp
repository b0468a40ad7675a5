// The released Engram tables are ~200 GB: they stay memory-mapped and only the rows a token
// hashes to are touched. A checkpoint whose two Engram tables hold 2 x 4.3 GB (sparse files)
// loads, builds the model and runs a prompt while resident memory grows by a small fraction of
// one table.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "io/safetensors.h"
#include "model_harness.h"

namespace deepinfer::testing {
namespace {

namespace fs = std::filesystem;

// Copies the tiny checkpoint, moving the Engram tables into one big sparse shard.
std::string make_big_engram_checkpoint(int64_t rows) {
  const fs::path dir =
      fs::temp_directory_path() / ("deepinfer-bigengram-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string src = preset_dir("tiny");
  auto store = TensorStore::open_dir(src);
  SafetensorsWriter rest;
  std::vector<std::pair<std::string, std::string>> weight_map;
  nlohmann::ordered_json header;
  uint64_t off = 0;
  for (const std::string& name : store->names()) {
    const TensorInfo& t = store->get(name);
    if (name.find(".engram.embed.") == std::string::npos) {
      rest.add(name, t.dtype, t.shape, {t.data, t.data + t.nbytes});
      weight_map.emplace_back(name, "model-rest.safetensors");
      continue;
    }
    const bool scale = name.find(".scale") != std::string::npos;
    const int64_t cols = scale ? t.shape[1] : t.shape[1];
    const uint64_t bytes = uint64_t(rows * cols);
    header[name] = {{"dtype", scale ? "F8_E8M0" : "F8_E4M3"},
                    {"shape", {rows, cols}},
                    {"data_offsets", {off, off + bytes}}};
    off += bytes;
    weight_map.emplace_back(name, "model-engram.safetensors");
  }
  rest.write((dir / "model-rest.safetensors").string());
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');
  {
    std::ofstream f(dir / "model-engram.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), std::streamsize(h.size()));
  }
  // The data section is a hole: zero bytes that take no disk and no memory until touched.
  const int fd = ::open((dir / "model-engram.safetensors").c_str(), O_WRONLY);
  EXPECT_EQ(::ftruncate(fd, off_t(8 + h.size() + off)), 0);
  ::close(fd);
  uint64_t total = 0;
  for (const auto& [n, f] : weight_map) total += store->get(n).nbytes;
  write_safetensors_index(dir.string(), weight_map, total);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fs::path(src) / "config.json"));
  cfg["engram_num_embeddings"] = {rows, rows};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir.string();
}

TEST(EngramMemory, TablesStayMappedAndOnlyHashedRowsAreRead) {
  const int64_t rows = int64_t(128) << 20;  // 128 Mi rows x 33 bytes: 4.3 GB per table
  const std::string dir = make_big_engram_checkpoint(rows);
  const int64_t before = resident_memory_bytes();
  auto ck = Checkpoint::load(dir);
  ASSERT_EQ(ck->layers[1].engram_table.rows(), rows);
  ModelOptions o;
  o.numerics = Numerics::Bf16;
  Model model(*ck, o);
  const int64_t loaded = resident_memory_bytes();
  const auto logits = run_chunks(model, random_tokens(32, ck->config().vocab_size, 1), {32});
  const int64_t ran = resident_memory_bytes();
  const double table = double(rows) * 33;
  std::printf(
      "resident growth: after loading %.1f MiB, after a 32-token prompt %.1f MiB "
      "(one Engram table: %.0f MiB)\n",
      double(loaded - before) / (1 << 20), double(ran - before) / (1 << 20), table / (1 << 20));
  EXPECT_LT(double(loaded - before), 0.05 * table);
  EXPECT_LT(double(ran - before), 0.05 * table);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::testing
