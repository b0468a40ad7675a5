// Shared pieces of the io tests: scratch directories, raw file writing and error matching.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/tiny.h"
#include "kernels/engram_hash.h"

namespace deepinfer::testing_io {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "deepinfer-io-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The tiny preset with a 512-token vocabulary (every feature, a few hundred KiB of tensors).
inline ModelConfig micro_config() {
  ModelConfig c = tiny_preset_config("tiny");
  c.vocab_size = c.engram_compressed_vocab_size = 512;
  c.dspark_noise_token_id = 500;
  const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
  c.engram_num_embeddings =
      make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size, 512)
          .rows;
  return c;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

inline std::string read_text(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path);
  return std::string(b.begin(), b.end());
}

// A safetensors file built by hand: little-endian u64 header length, the header text as given
// (no padding), then `data_bytes` bytes of a counting pattern.
inline std::vector<uint8_t> raw_safetensors(const std::string& header, uint64_t data_bytes) {
  std::vector<uint8_t> v(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) v[size_t(i)] = uint8_t(n >> (8 * i));
  std::copy(header.begin(), header.end(), v.begin() + 8);
  for (uint64_t i = 0; i < data_bytes; ++i) v[8 + header.size() + i] = uint8_t(i * 7 + 1);
  return v;
}

// The message of the deepinfer::Error `fn` throws; fails the test (returning "") when it throws
// nothing or another type.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected deepinfer::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected deepinfer::Error, nothing was thrown";
  return "";
}

// Checks that `message` contains every one of `parts`.
inline ::testing::AssertionResult mentions(const std::string& message,
                                           std::initializer_list<std::string> parts) {
  for (const std::string& p : parts)
    if (message.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << p << "\"";
  return ::testing::AssertionSuccess();
}

// A make-tiny preset with its Engram table sizes filled in (the sums of the layers' primes).
inline ModelConfig preset_with_engram_rows(const std::string& name) {
  ModelConfig c = tiny_preset_config(name);
  const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
  c.engram_num_embeddings = make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads,
                                               c.engram_vocab_size, c.engram_compressed_vocab_size)
                                .rows;
  return c;
}

}  // namespace deepinfer::testing_io
