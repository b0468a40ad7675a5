// Malformed safetensors files and checkpoint directories: each one must give a deepinfer::Error
// whose message names the file and says what is wrong, never a crash or a silently wrong tensor.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;

std::string entry(const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[)" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

struct BadFile {
  const char* what;
  std::vector<uint8_t> bytes;
  std::vector<std::string> expect;  // parts of the message besides the file name
};

std::vector<BadFile> bad_files() {
  std::vector<uint8_t> past_end = raw_safetensors("{}", 10);
  past_end[0] = 232;  // header length 1000 in a 20-byte file
  past_end[1] = 3;
  std::vector<uint8_t> huge_len = raw_safetensors("{}", 0);
  for (int i = 0; i < 8; ++i) huge_len[size_t(i)] = 0xff;
  const std::string two_pow_58 = "288230376151711744", two_pow_60 = "1152921504606846976";
  return {
      {"empty file", {}, {"0 bytes", "too short"}},
      {"shorter than the length field", {1, 2, 3}, {"3 bytes", "too short"}},
      {"header length past the end", past_end, {"header length 1000", "runs past the end"}},
      {"header length near 2^64", huge_len, {"header length 18446744073709551615", "past the end"}},
      {"header not JSON", raw_safetensors("{not json", 0), {"not valid JSON"}},
      {"header truncated JSON", raw_safetensors(R"({"a":{"dtype":"U8")", 0), {"not valid JSON"}},
      {"header a JSON array", raw_safetensors("[1, 2]", 0), {"must be a JSON object"}},
      {"header a JSON string", raw_safetensors(R"("x")", 0), {"must be a JSON object"}},
      {"entry not an object",
       raw_safetensors(R"({"a":5})", 0),
       {"tensor 'a'", "must be an object"}},
      {"missing dtype",
       raw_safetensors(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1),
       {"tensor 'a'", "'dtype'"}},
      {"dtype not a string",
       raw_safetensors(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
       {"tensor 'a'", "'dtype'"}},
      {"missing shape",
       raw_safetensors(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", 1),
       {"tensor 'a'", "'shape'"}},
      {"shape not an array",
       raw_safetensors(R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1),
       {"tensor 'a'", "'shape'"}},
      {"missing data_offsets",
       raw_safetensors(R"({"a":{"dtype":"U8","shape":[1]}})", 1),
       {"tensor 'a'", "'data_offsets'"}},
      {"data_offsets of three",
       raw_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})", 1),
       {"tensor 'a'", "'data_offsets'"}},
      {"unknown dtype",
       raw_safetensors(R"({"a":)" + entry("F64", "[1]", 0, 8) + "}", 8),
       {"tensor 'a'", "unknown dtype 'F64'"}},
      {"unknown dtype BOOL",
       raw_safetensors(R"({"a":)" + entry("BOOL", "[1]", 0, 1) + "}", 1),
       {"unknown dtype 'BOOL'"}},
      {"negative shape entry",
       raw_safetensors(R"({"a":)" + entry("U8", "[-1]", 0, 0) + "}", 0),
       {"tensor 'a'", "non-negative integer", "-1"}},
      {"float shape entry",
       raw_safetensors(R"({"a":)" + entry("U8", "[2.5]", 0, 2) + "}", 2),
       {"tensor 'a'", "non-negative integer", "2.5"}},
      {"string shape entry",
       raw_safetensors(R"({"a":)" + entry("U8", R"(["2"])", 0, 2) + "}", 2),
       {"tensor 'a'", "non-negative integer"}},
      {"huge shape entry",
       raw_safetensors(R"({"a":)" + entry("U8", "[18446744073709551615]", 0, 0) + "}", 0),
       {"tensor 'a'", "too large"}},
      {"shape with seven dims",
       raw_safetensors(R"({"a":)" + entry("U8", "[1,1,1,1,1,1,1]", 0, 1) + "}", 1),
       {"tensor 'a'", "7 dims", "at most 6"}},
      {"overflowing shape product",
       raw_safetensors(R"({"a":)" + entry("U8", "[4294967296,4294967296]", 0, 0) + "}", 0),
       {"tensor 'a'", "overflows"}},
      // Element counts whose byte count wraps around 2^64 (2^58 x 8 bytes, 2^60 x 4 bytes) must not
      // pass as zero-byte tensors.
      {"byte count wrapping to zero (I64)",
       raw_safetensors(R"({"a":)" + entry("I64", "[" + two_pow_58 + "]", 0, 0) + "}", 0),
       {"tensor 'a'", "overflows"}},
      {"byte count wrapping to zero (F32)",
       raw_safetensors(R"({"a":)" + entry("F32", "[" + two_pow_60 + "]", 0, 0) + "}", 0),
       {"tensor 'a'", "overflows"}},
      {"offsets reversed",
       raw_safetensors(R"({"a":)" + entry("U8", "[0]", 8, 4) + "}", 8),
       {"tensor 'a'", "[8, 4]", "end before begin"}},
      {"negative offset",
       raw_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1),
       {"tensor 'a'", "data_offsets[0]"}},
      {"offsets not matching shape x dtype",
       raw_safetensors(R"({"a":)" + entry("F32", "[2]", 0, 4) + "}", 8),
       {"tensor 'a'", "span 4 bytes", "needs 8"}},
      {"offsets past the data section (truncated file)",
       raw_safetensors(R"({"a":)" + entry("U8", "[16]", 0, 16) + "}", 10),
       {"tensor 'a'", "outside the 10-byte data section"}},
      {"overlapping tensors",
       raw_safetensors(
           R"({"a":)" + entry("U8", "[8]", 0, 8) + R"(,"b":)" + entry("U8", "[8]", 4, 12) + "}",
           12),
       {"'a'", "'b'", "overlap"}},
      {"tensor inside another",
       raw_safetensors(R"({"a":)" + entry("U8", "[100]", 0, 100) + R"(,"b":)" +
                           entry("U8", "[10]", 20, 30) + "}",
                       100),
       {"'a'", "'b'", "overlap"}},
      // A zero-size tensor sorted between two overlapping ones must not hide the overlap.
      {"overlap behind a zero-size tensor",
       raw_safetensors(R"({"a":)" + entry("U8", "[100]", 0, 100) + R"(,"z":)" +
                           entry("U8", "[0]", 50, 50) + R"(,"c":)" + entry("U8", "[10]", 60, 70) +
                           "}",
                       100),
       {"'a'", "'c'", "overlap"}},
      {"duplicate tensor names",
       raw_safetensors(
           R"({"a":)" + entry("U8", "[1]", 0, 1) + R"(,"a":)" + entry("U8", "[1]", 1, 2) + "}", 2),
       {"'a'", "twice"}},
      {"F4 with odd last dim",
       raw_safetensors(R"({"a":)" + entry("F4", "[2,3]", 0, 3) + "}", 3),
       {"tensor 'a'", "even last dimension"}},
      {"F4 scalar",
       raw_safetensors(R"({"a":)" + entry("F4", "[]", 0, 1) + "}", 1),
       {"tensor 'a'", "even last dimension"}},
      {"__metadata__ not an object",
       raw_safetensors(R"({"__metadata__":5})", 0),
       {"__metadata__ must be an object"}},
      {"__metadata__ with a number",
       raw_safetensors(R"({"__metadata__":{"k":1}})", 0),
       {"__metadata__", "'k'", "must be a string"}},
  };
}

TEST(SafetensorsMalformed, EachFileNamesItselfAndTheProblem) {
  ScratchDir dir;
  int i = 0;
  for (const BadFile& c : bad_files()) {
    SCOPED_TRACE(c.what);
    const std::string path = dir / ("bad" + std::to_string(i++) + ".safetensors");
    write_bytes(path, c.bytes);
    const std::string msg = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_TRUE(mentions(msg, {path}));
    for (const std::string& part : c.expect) EXPECT_TRUE(mentions(msg, {part}));
    // The pure parser reports the same problem under the label it is given.
    const uint8_t zero = 0;
    const std::string pure = error_of([&] {
      parse_safetensors_header(c.bytes.empty() ? &zero : c.bytes.data(), c.bytes.size(), "LBL");
    });
    EXPECT_TRUE(mentions(pure, {"LBL"}));
    for (const std::string& part : c.expect) EXPECT_TRUE(mentions(pure, {part}));
  }
}

TEST(SafetensorsMalformed, DeeplyNestedValuesDoNotCrash) {
  // A 2 MB header nesting a million arrays where a shape entry belongs; describing the bad value
  // must not recurse through all of them.
  const std::string depth(1000000, '[');
  const std::string nested = depth + std::string(depth.size(), ']');
  const std::vector<uint8_t> bytes = raw_safetensors(
      R"({"a":{"dtype":"U8","shape":[1,)" + nested + R"(],"data_offsets":[0,1]}})", 1);
  EXPECT_TRUE(mentions(error_of([&] { parse_safetensors_header(bytes.data(), bytes.size(), "x"); }),
                       {"tensor 'a'", "non-negative integer"}));
  const std::vector<uint8_t> meta = raw_safetensors(R"({"__metadata__":{"k":)" + nested + "}}", 0);
  EXPECT_TRUE(mentions(error_of([&] { parse_safetensors_header(meta.data(), meta.size(), "x"); }),
                       {"'k'", "must be a string"}));
}

TEST(SafetensorsMalformed, HeaderOverTheSizeLimit) {
  // A 300 MiB header length in a (sparse) file long enough to hold it.
  ScratchDir dir;
  const std::string path = dir / "big-header.safetensors";
  std::vector<uint8_t> bytes = raw_safetensors("{}", 0);
  const uint64_t hlen = uint64_t(300) << 20;
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = uint8_t(hlen >> (8 * i));
  write_bytes(path, bytes);
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t(8 + hlen)), 0);
  ::close(fd);
  EXPECT_TRUE(mentions(error_of([&] { SafetensorsFile::open(path); }),
                       {path, "header length 314572800", "exceeds"}));
}

TEST(SafetensorsMalformed, NotAFile) {
  ScratchDir dir;
  EXPECT_TRUE(mentions(error_of([&] { SafetensorsFile::open(dir / "absent.safetensors"); }),
                       {dir / "absent.safetensors", "cannot open"}));
  EXPECT_TRUE(mentions(error_of([&] { SafetensorsFile::open(dir.path().string()); }),
                       {dir.path().string(), "not a regular file"}));
  // A named pipe with no writer: refused at once, not waited on (a hang fails by timeout).
  const std::string fifo = dir / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(
      mentions(error_of([&] { SafetensorsFile::open(fifo); }), {fifo, "not a regular file"}));
}

// --- checkpoint directories ---

void write_shard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  const std::vector<uint8_t> b = {1, 2, 3, 4};
  for (const auto& n : names) w.add(n, DType::U8, {4}, b);
  w.write(path);
}

std::string index_text(const std::string& weight_map) {
  return R"({"metadata":{"total_size":8},"weight_map":)" + weight_map + "}";
}

TEST(SafetensorsMalformed, IndexProblemsNameTheIndexOrShard) {
  struct Case {
    const char* what;
    std::string index;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"index not JSON", "{oops", {"not a JSON object"}},
      {"index a JSON array", "[]", {"not a JSON object"}},
      {"no weight_map", R"({"metadata":{}})", {"'weight_map'"}},
      {"weight_map not an object", R"({"weight_map":["a"]})", {"'weight_map'"}},
      {"shard name not a string", index_text(R"({"a":1})"), {"weight_map['a']", "file name"}},
      {"shard missing",
       index_text(R"({"a":"s1.safetensors","b":"gone.safetensors"})"),
       {"'gone.safetensors'", "is missing"}},
      {"tensor mapped to a shard that lacks it",
       index_text(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s1.safetensors"})"),
       {"'c'", "'s1.safetensors'", "does not contain it"}},
      {"shard name with a slash",
       index_text(R"({"a":"sub/s1.safetensors"})"),
       {"'sub/s1.safetensors'", "must be a file name"}},
      {"shard name leaving the directory",
       index_text(R"({"a":"../s1.safetensors"})"),
       {"'../s1.safetensors'", "must be a file name"}},
      {"shard name ..", index_text(R"({"a":".."})"), {"must be a file name"}},
      {"shard name empty", index_text(R"({"a":""})"), {"must be a file name"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ScratchDir dir;
    write_shard(dir / "s1.safetensors", {"a", "b"});
    const std::string index = dir / "model.safetensors.index.json";
    write_text(index, c.index);
    const std::string msg = error_of([&] { TensorStore::open_dir(dir.path().string()); });
    EXPECT_TRUE(mentions(msg, {index}));
    for (const std::string& part : c.expect) EXPECT_TRUE(mentions(msg, {part}));
  }
}

TEST(SafetensorsMalformed, ShardContentsDisagreeWithTheIndex) {
  {
    SCOPED_TRACE("a shard holding a tensor the map does not assign to it");
    ScratchDir dir;
    write_shard(dir / "s1.safetensors", {"a", "b"});
    write_text(dir / "model.safetensors.index.json", index_text(R"({"a":"s1.safetensors"})"));
    EXPECT_TRUE(mentions(error_of([&] { TensorStore::open_dir(dir.path().string()); }),
                         {dir / "s1.safetensors", "holds 2 tensors", "maps 1"}));
  }
  {
    SCOPED_TRACE("a tensor in two shards");
    ScratchDir dir;
    write_shard(dir / "s1.safetensors", {"a"});
    write_shard(dir / "s2.safetensors", {"a", "b"});
    write_text(dir / "model.safetensors.index.json",
               index_text(R"({"a":"s1.safetensors","b":"s2.safetensors"})"));
    EXPECT_TRUE(
        mentions(error_of([&] { TensorStore::open_dir(dir.path().string()); }),
                 {"'a'", "appears in both", dir / "s1.safetensors", dir / "s2.safetensors"}));
  }
  {
    SCOPED_TRACE("a tensor in two files without an index");
    ScratchDir dir;
    write_shard(dir / "x1.safetensors", {"w"});
    write_shard(dir / "x2.safetensors", {"w"});
    EXPECT_TRUE(
        mentions(error_of([&] { TensorStore::open_dir(dir.path().string()); }),
                 {"'w'", "appears in both", dir / "x1.safetensors", dir / "x2.safetensors"}));
  }
  {
    SCOPED_TRACE("a corrupt shard");
    ScratchDir dir;
    write_bytes(dir / "s1.safetensors", raw_safetensors("{bad", 0));
    write_text(dir / "model.safetensors.index.json", index_text(R"({"a":"s1.safetensors"})"));
    EXPECT_TRUE(mentions(error_of([&] { TensorStore::open_dir(dir.path().string()); }),
                         {dir / "s1.safetensors", "not valid JSON"}));
  }
}

TEST(SafetensorsMalformed, DirectoriesWithoutACheckpoint) {
  ScratchDir dir;
  write_text(dir / "README.md", "no weights here");
  EXPECT_TRUE(mentions(error_of([&] { TensorStore::open_dir(dir.path().string()); }),
                       {dir.path().string(), "no model.safetensors.index.json"}));
  EXPECT_TRUE(mentions(error_of([&] { TensorStore::open_dir(dir / "absent"); }),
                       {dir / "absent", "does not exist"}));
  // A path the file system refuses (too long) is a deepinfer::Error too.
  const std::string long_path = "/tmp/" + std::string(5000, 'x');
  EXPECT_TRUE(mentions(error_of([&] { TensorStore::open_dir(long_path); }), {"does not exist"}));
  // Writing shards under a regular file fails with the directory named.
  write_text(dir / "file", "");
  auto none = [](size_t, SafetensorsWriter&) {};
  EXPECT_TRUE(mentions(error_of([&] { write_safetensors_shards(dir / "file/sub", {}, 100, none); }),
                       {dir / "file/sub", "cannot create directory"}));
}

}  // namespace
}  // namespace deepinfer
