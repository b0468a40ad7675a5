// Safetensors writing and reading: round trips over every dtype, sharded checkpoints with an
// index, the directory fallbacks, and lazy opening of a file far larger than what gets read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;
using json = nlohmann::json;

struct Sample {
  std::string name;
  const char* dtype_name;  // as safetensors spells it
  DType dtype;
  Shape shape;
  uint64_t nbytes;  // stated by hand from the shape, not computed by the library
};

// One tensor of every dtype (F4 counts logical elements: [4, 6] is 24 values in 12 bytes), plus
// zero-size tensors, a scalar and a tensor with the most dims.
std::vector<Sample> samples() {
  return {
      {"f32", "F32", DType::F32, {2, 3}, 24},
      {"f16", "F16", DType::F16, {3}, 6},
      {"bf16", "BF16", DType::BF16, {2, 2}, 8},
      {"e4m3", "F8_E4M3", DType::E4M3, {5}, 5},
      {"e8m0", "F8_E8M0", DType::E8M0, {2, 3}, 6},
      {"i8", "I8", DType::I8, {7}, 7},
      {"u8", "U8", DType::U8, {1, 1, 3}, 3},
      {"i32", "I32", DType::I32, {2}, 8},
      {"i64", "I64", DType::I64, {3}, 24},
      {"f4", "F4", DType::E2M1, {4, 6}, 12},
      {"empty.f32", "F32", DType::F32, {0, 5}, 0},
      {"empty.bf16", "BF16", DType::BF16, {3, 0}, 0},
      {"empty.f4", "F4", DType::E2M1, {2, 0}, 0},
      {"scalar", "F32", DType::F32, {}, 4},
      {"six.dims", "U8", DType::U8, {1, 2, 1, 2, 1, 2}, 8},
  };
}

std::vector<uint8_t> pattern(uint64_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = uint8_t(i * 31 + salt);
  return v;
}

TEST(Safetensors, DtypeNamesMatchTheFormat) {
  for (const Sample& s : samples()) {
    EXPECT_EQ(dtype_name(s.dtype), s.dtype_name);
    DType parsed;
    ASSERT_TRUE(dtype_from_name(s.dtype_name, &parsed)) << s.dtype_name;
    EXPECT_EQ(parsed, s.dtype);
  }
}

TEST(Safetensors, RoundTripEveryDtype) {
  ScratchDir dir;
  const std::string path = dir / "all.safetensors";
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> data;
  uint8_t salt = 0;
  for (const Sample& s : samples()) {
    data[s.name] = pattern(s.nbytes, salt++);
    w.add(s.name, s.dtype, s.shape, data[s.name]);
  }
  w.set_metadata("format", "pt");
  w.set_metadata("note", "round trip \"quoted\"");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp" + std::to_string(::getpid())));

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"},
                                                               {"note", "round trip \"quoted\""}}));
  ASSERT_EQ(f->tensors().size(), samples().size());
  uint64_t expect_offset = 0;  // tensors follow each other in the order added
  for (const Sample& s : samples()) {
    SCOPED_TRACE(s.name);
    const TensorInfo* t = f->find(s.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, s.name);
    EXPECT_EQ(t->dtype, s.dtype);
    EXPECT_EQ(t->shape, s.shape);
    EXPECT_EQ(t->nbytes, s.nbytes);
    EXPECT_EQ(t->offset, expect_offset);
    EXPECT_EQ(t->file, &f->path());
    expect_offset += s.nbytes;
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), data[s.name]);
    EXPECT_EQ(dtype_bytes(t->dtype, uint64_t(t->shape.numel())), s.nbytes);
  }
  EXPECT_EQ(f->find("absent"), nullptr);

  // The file itself: the header is padded to 8 bytes and the data section ends the file.
  const std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[size_t(i)];
  EXPECT_EQ((8 + hlen) % 8, 0u);
  EXPECT_EQ(8 + hlen + expect_offset, bytes.size());
  const json h = json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(hlen));
  EXPECT_EQ(h["f4"]["dtype"], "F4");
  EXPECT_EQ(h["f4"]["shape"], json::array({4, 6}));  // logical elements, not bytes
  const uint64_t b = h["f4"]["data_offsets"][0], e = h["f4"]["data_offsets"][1];
  EXPECT_EQ(e - b, 12u);
  EXPECT_EQ(h["scalar"]["shape"], json::array());
  EXPECT_EQ(h["__metadata__"]["format"], "pt");

  // The pure parser sees the same thing in the raw bytes.
  const SafetensorsHeader ph = parse_safetensors_header(bytes.data(), bytes.size(), "label");
  EXPECT_EQ(ph.data_start, 8 + hlen);
  EXPECT_EQ(ph.tensors.size(), samples().size());
  EXPECT_EQ(ph.metadata.at("note"), "round trip \"quoted\"");
}

TEST(Safetensors, EmptyFileOfTensorsAndWriterChecks) {
  ScratchDir dir;
  SafetensorsWriter w;
  EXPECT_TRUE(w.names().empty());
  w.write(dir / "none.safetensors");
  auto f = SafetensorsFile::open(dir / "none.safetensors");
  EXPECT_TRUE(f->tensors().empty());

  const std::vector<uint8_t> four(4);
  w.add("x", DType::F32, {1}, four);
  EXPECT_FALSE(error_of([&] { w.add("x", DType::F32, {1}, four); }).empty());
  EXPECT_FALSE(error_of([&] { w.add("y", DType::F32, {2}, four); }).empty());
  EXPECT_FALSE(error_of([&] { w.add("__metadata__", DType::U8, {4}, four); }).empty());
  EXPECT_TRUE(mentions(error_of([&] { w.write(dir / "no/such/dir/x.safetensors"); }),
                       {"no/such/dir/x.safetensors", "cannot create"}));
  EXPECT_EQ(w.names(), std::vector<std::string>{"x"});
  EXPECT_EQ(w.data_bytes(), 4u);
}

TEST(Safetensors, ShardedWriteAndIndexRead) {
  ScratchDir dir;
  std::map<std::string, std::vector<uint8_t>> data;
  const std::vector<std::pair<std::string, uint64_t>> tensors = {
      {"t0", 100}, {"t1", 100}, {"t2", 100}, {"big", 1000},
      {"t3", 100}, {"t4", 100}, {"t5", 100}, {"t6", 100}};
  std::vector<uint64_t> sizes;
  uint8_t salt = 1;
  for (const auto& [name, n] : tensors) {
    data[name] = pattern(n, salt++);
    sizes.push_back(n);
  }
  const std::string out = dir / "ck";
  const uint64_t total =
      write_safetensors_shards(out, sizes, 350, [&](size_t i, SafetensorsWriter& w) {
        const std::string& name = tensors[i].first;
        w.add(name, DType::U8, {int64_t(tensors[i].second)}, data[name]);
      });
  EXPECT_EQ(total, 1700u);

  // At most 350 bytes per shard, split at tensor boundaries; the big tensor stands alone.
  const std::map<std::string, std::string> want_shard = {
      {"t0", "model-00001-of-00004.safetensors"}, {"t1", "model-00001-of-00004.safetensors"},
      {"t2", "model-00001-of-00004.safetensors"}, {"big", "model-00002-of-00004.safetensors"},
      {"t3", "model-00003-of-00004.safetensors"}, {"t4", "model-00003-of-00004.safetensors"},
      {"t5", "model-00003-of-00004.safetensors"}, {"t6", "model-00004-of-00004.safetensors"}};
  const json index = json::parse(read_text(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 1700);
  ASSERT_EQ(index["weight_map"].size(), want_shard.size());
  for (const auto& [name, shard] : want_shard) EXPECT_EQ(index["weight_map"][name], shard) << name;

  auto store = TensorStore::open_dir(out);
  EXPECT_TRUE(mentions(error_of([&] { store->get("absent"); }), {out, "absent"}));
  EXPECT_EQ(store->size(), 8u);
  EXPECT_EQ(store->total_bytes(), 1700u);
  EXPECT_EQ(store->names(),
            (std::vector<std::string>{"big", "t0", "t1", "t2", "t3", "t4", "t5", "t6"}));
  for (const auto& [name, shard] : want_shard) {
    const TensorInfo& t = store->get(name);
    EXPECT_EQ(*t.file, out + "/" + shard);
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), data[name]) << name;
  }
  EXPECT_EQ(store->find("t7"), nullptr);
  EXPECT_TRUE(mentions(error_of([&] { store->get("t7"); }), {out, "no tensor 't7'"}));
  // Every shard carries the metadata.
  EXPECT_EQ(
      SafetensorsFile::open(out + "/model-00004-of-00004.safetensors")->metadata().at("format"),
      "pt");
}

TEST(Safetensors, DirectoryFallbacks) {
  ScratchDir dir;
  const std::vector<uint8_t> one = {1}, two = {2, 2};
  // Without an index, model.safetensors wins over other files.
  {
    SafetensorsWriter w;
    w.add("a", DType::U8, {1}, one);
    w.write(dir / "model.safetensors");
    SafetensorsWriter other;
    other.add("stray", DType::U8, {2}, two);
    other.write(dir / "other.safetensors");
    auto s = TensorStore::open_dir(dir.path().string());
    EXPECT_EQ(s->names(), std::vector<std::string>{"a"});
  }
  // Without either, every *.safetensors file.
  fs::remove(dir / "model.safetensors");
  {
    SafetensorsWriter w;
    w.add("b", DType::U8, {2}, two);
    w.write(dir / "part-b.safetensors");
    write_text(dir / "notes.txt", "not a checkpoint");
    auto s = TensorStore::open_dir(dir.path().string());
    EXPECT_EQ(s->names(), (std::vector<std::string>{"b", "stray"}));
    EXPECT_EQ(s->get("b").data[1], 2);
  }
}

// Resident pages of this process.
int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST(Safetensors, OpeningIsLazy) {
  ScratchDir dir;
  const std::string path = dir / "huge.safetensors";
  const uint64_t n = uint64_t(10) << 30;  // 10 GiB of tensor data that is never written
  const std::string header = R"({"__metadata__":{"format":"pt"},"big":{"dtype":"BF16","shape":[)" +
                             std::to_string(n / 2) + R"(],"data_offsets":[0,)" + std::to_string(n) +
                             "]}}";
  write_bytes(path, raw_safetensors(header, 0));
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t(8 + header.size() + n)), 0);  // sparse: no blocks allocated
  ::close(fd);

  const int64_t before = resident_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  auto f = SafetensorsFile::open(path);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t grown = resident_bytes() - before;
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].nbytes, n);
  EXPECT_EQ(fs::file_size(path), 8 + header.size() + n);
  EXPECT_LT(grown, int64_t(16) << 20) << "opening read tensor bytes";
  EXPECT_LT(seconds, 1.0);
  // The bytes are there when touched (a hole reads as zeros).
  EXPECT_EQ(f->tensors()[0].data[n - 1], 0);

  // The same through a checkpoint directory.
  fs::rename(path, dir / "model.safetensors");
  const int64_t before_store = resident_bytes();
  auto store = TensorStore::open_dir(dir.path().string());
  EXPECT_EQ(store->total_bytes(), n);
  EXPECT_LT(resident_bytes() - before_store, int64_t(16) << 20);
}

// The fuzz seeds are valid files, so the fuzzer starts from inputs that reach deep.
TEST(Safetensors, FuzzSeedsAreValid) {
  const fs::path seeds = fs::path(DEEPINFER_SOURCE_DIR) / "tests/data/io/fuzz-corpus/safetensors";
  int n = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    auto f = SafetensorsFile::open(e.path().string());
    EXPECT_LE(fs::file_size(e.path()), 4096u) << e.path();  // within the fuzzer's -max_len
    ++n;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
}  // namespace deepinfer
