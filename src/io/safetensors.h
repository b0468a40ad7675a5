// Safetensors checkpoints: memory-mapped, validated, lazy.
//
// A file is `u64 header_len (LE) | header JSON | data`. The header maps tensor names to
// {dtype, shape, data_offsets: [begin, end)} relative to the start of the data section, plus an
// optional "__metadata__" object of string values. Opening a file maps it and validates the
// header; no tensor byte is read until a caller touches it (opening a 10 GiB file costs the
// header only). Every malformed input throws deepinfer::Error naming the file and the problem:
// truncated file, header length past the end, bad JSON, unknown dtype, negative/overflowing
// shapes, offsets out of range, overlapping, or not matching shape x dtype.
//
// Dtypes: F32 F16 BF16 F8_E4M3 F8_E8M0 I8 U8 I32 I64 F4. For F4 the shape counts logical fp4
// elements (two per byte, even element in the low nibble), so a [N, K] F4 tensor has
// N * K / 2 bytes (the last dimension must be even).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace deepinfer {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // within the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;      // mapped bytes (valid while the owning file lives)
  const std::string* file = nullptr;  // path of the file holding it
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in data-offset order; `data` and `file` unset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // byte offset of the data section in the file
};

// Parses and validates the header of a safetensors file held in `bytes` (the whole file, or at
// least its first `file_size` bytes as far as the header goes). `label` names the file in errors.
// Pure: no I/O. This is the function the fuzz target drives.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, uint64_t file_size,
                                           const std::string& label);

// One mapped safetensors file.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;  // its tensors with `data` and `file` set
  std::map<std::string, size_t> by_name_;
};

// All tensors of a checkpoint directory: `model.safetensors.index.json` (its "weight_map" names
// the shard of every tensor; every listed shard must exist and hold exactly the tensors the map
// assigns to it), else a single `model.safetensors`, else every `*.safetensors` in the directory.
// A tensor name appearing in two shards is an error.
class TensorStore {
 public:
  static std::unique_ptr<TensorStore> open_dir(const std::string& dir);

  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& get(const std::string& name) const;   // throws Error naming the checkpoint
  std::vector<std::string> names() const;                 // sorted
  size_t size() const { return by_name_.size(); }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
};

// Writes `model.safetensors.index.json` into `dir`: `weight_map` pairs tensor names with shard
// file names; `total_size` is the sum of tensor bytes.
void write_safetensors_index(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& weight_map,
                             uint64_t total_size);

// Writes safetensors files (used by make-tiny and tests). Tensors are written in the order
// added, each aligned to 8 bytes; the header is padded with spaces to a multiple of 8.
class SafetensorsWriter {
 public:
  // `bytes` must hold dtype_bytes(dtype, shape.numel()) bytes.
  void add(const std::string& name, DType dtype, const Shape& shape, std::vector<uint8_t> bytes);
  uint64_t data_bytes() const;
  std::vector<std::string> names() const;  // in the order added
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes one file; throws Error on I/O failure.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes a sharded checkpoint into `dir` (created): groups of tensors of these byte sizes, in
// order, split into shards of at most `max_shard_bytes` at group boundaries (a group larger than
// the limit gets its own shard), as `model-0000i-of-0000n.safetensors` files with the metadata
// {"format": "pt"}, and `model.safetensors.index.json`. `add(i, shard)` adds group i's tensors
// (sizes[i] bytes in all), one group at a time in order, so that only one shard is held at once.
// Returns the total tensor bytes.
uint64_t write_safetensors_shards(const std::string& dir, const std::vector<uint64_t>& sizes,
                                  uint64_t max_shard_bytes,
                                  const std::function<void(size_t, SafetensorsWriter&)>& add);

}  // namespace deepinfer
