#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "io/show_json.h"

namespace deepinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Headers beyond this are not checkpoints (the released files have headers of a few hundred KiB).
constexpr uint64_t kMaxHeaderBytes = uint64_t(256) << 20;

uint64_t get_u64(const json& v, const std::string& label, const std::string& what) {
  DI_REQUIRE(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), label,
             ": ", what, " must be a non-negative integer, got ", show_json(v));
  return v.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const json& e, const std::string& label) {
  const std::string where = label + ": tensor '" + name + "'";
  DI_REQUIRE(e.is_object(), where, ": entry must be an object with dtype, shape, data_offsets");
  TensorInfo t;
  t.name = name;
  auto dt = e.find("dtype");
  DI_REQUIRE(dt != e.end() && dt->is_string(), where, ": missing string field 'dtype'");
  DI_REQUIRE(dtype_from_name(dt->get_ref<const std::string&>(), &t.dtype), where,
             ": unknown dtype '", dt->get_ref<const std::string&>(),
             "' (expected F32, F16, BF16, F8_E4M3, F8_E8M0, F4, I8, U8, I32 or I64)");
  auto sh = e.find("shape");
  DI_REQUIRE(sh != e.end() && sh->is_array(), where, ": missing array field 'shape'");
  DI_REQUIRE(sh->size() <= size_t(kMaxDims), where, ": shape has ", sh->size(), " dims, at most ",
             kMaxDims, " supported");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    const uint64_t n = get_u64(d, where, "every shape entry");
    DI_REQUIRE(n <= uint64_t(std::numeric_limits<int64_t>::max()), where,
               ": shape entry too large");
    // Bound the element count so that its bit count (up to 64 per element) fits in 64 bits.
    DI_REQUIRE(n == 0 || numel <= std::numeric_limits<uint64_t>::max() / 64 / n, where, ": shape ",
               show_json(*sh), " overflows");
    numel *= n;
    t.shape.dim[t.shape.ndim++] = int64_t(n);
  }
  if (t.dtype == DType::E2M1)
    DI_REQUIRE(t.shape.ndim >= 1 && t.shape.dim[t.shape.ndim - 1] % 2 == 0, where,
               ": F4 tensors need an even last dimension (two values per byte), got shape ",
               show_json(*sh));
  auto off = e.find("data_offsets");
  DI_REQUIRE(off != e.end() && off->is_array() && off->size() == 2, where,
             ": missing field 'data_offsets' ([begin, end])");
  const uint64_t b = get_u64((*off)[0], where, "data_offsets[0]");
  const uint64_t en = get_u64((*off)[1], where, "data_offsets[1]");
  DI_REQUIRE(b <= en, where, ": data_offsets [", b, ", ", en, "] end before begin");
  const uint64_t want = dtype_bytes(t.dtype, numel);
  DI_REQUIRE(en - b == want, where, ": data_offsets span ", en - b, " bytes but shape ",
             show_json(*sh), " of ", dtype_name(t.dtype), " needs ", want);
  t.offset = b;
  t.nbytes = want;
  return t;
}

void write_file(const std::string& path,
                const std::vector<std::pair<const void*, uint64_t>>& parts) {
  // Write to a temporary name and rename, so a reader never sees a half-written file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  DI_REQUIRE(f, path, ": cannot create: ", std::strerror(errno));
  bool ok = true;
  for (const auto& [data, size] : parts)
    ok = ok && (size == 0 || std::fwrite(data, 1, size, f) == size);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(str_cat(path, ": write failed (disk full?)"));
  }
  DI_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, path,
             ": rename failed: ", std::strerror(errno));
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, uint64_t file_size,
                                           const std::string& label) {
  DI_REQUIRE(file_size >= 8, label, ": file is ", file_size,
             " bytes, too short for a safetensors header length (8 bytes)");
  uint64_t hlen;  // little-endian, as is the host (stored tensors are read in place)
  std::memcpy(&hlen, bytes, 8);
  DI_REQUIRE(hlen <= file_size - 8, label, ": header length ", hlen, " runs past the end of the ",
             file_size, "-byte file (truncated file?)");
  DI_REQUIRE(hlen <= kMaxHeaderBytes, label, ": header length ", hlen, " exceeds the ",
             kMaxHeaderBytes, "-byte limit");
  // Top-level keys are tensor names: one listed twice is ambiguous.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  const json j = json::parse(bytes + 8, bytes + 8 + hlen, cb, /*allow_exceptions=*/false);
  DI_REQUIRE(!j.is_discarded(), label, ": safetensors header is not valid JSON");
  DI_REQUIRE(duplicate.empty(), label, ": safetensors header lists tensor '", duplicate, "' twice");
  DI_REQUIRE(j.is_object(), label, ": safetensors header must be a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + hlen;
  const uint64_t data_size = file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      DI_REQUIRE(it->is_object(), label, ": __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        DI_REQUIRE(m->is_string(), label, ": __metadata__ value for '", m.key(),
                   "' must be a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo t = parse_entry(it.key(), *it, label);
    DI_REQUIRE(t.offset + t.nbytes <= data_size, label, ": tensor '", t.name, "' data [", t.offset,
               ", ", t.offset + t.nbytes, ") lies outside the ", data_size,
               "-byte data section (truncated file?)");
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  // Each non-empty tensor against the previous non-empty one: comparing neighbours only would let
  // a zero-size tensor sorted in between hide an overlap.
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& c : h.tensors) {
    if (c.nbytes == 0) continue;
    if (prev)
      DI_REQUIRE(c.offset >= prev->offset + prev->nbytes, label, ": tensors '", prev->name, "' [",
                 prev->offset, ", ", prev->offset + prev->nbytes, ") and '", c.name, "' [",
                 c.offset, ", ", c.offset + c.nbytes, ") overlap");
    prev = &c;
  }
  return h;
}

// --- SafetensorsFile ---

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // Non-blocking, so that a named pipe (or a device) is refused below instead of waited on.
  struct Fd {  // closed on every way out (the mapping outlives it)
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  DI_REQUIRE(fd.fd >= 0, path, ": cannot open safetensors file: ", std::strerror(errno));
  struct stat st;
  DI_REQUIRE(::fstat(fd.fd, &st) == 0 && S_ISREG(st.st_mode), path, ": not a regular file");
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = uint64_t(st.st_size);
  if (f->size_ > 0) {
    void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd.fd, 0);
    DI_REQUIRE(map != MAP_FAILED, path, ": mmap failed: ", std::strerror(errno));
    f->map_ = map;
  }
  const uint8_t* base = static_cast<const uint8_t*>(f->map_);  // null for an empty file
  f->header_ = parse_safetensors_header(base, f->size_, path);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) {
    TensorInfo& t = f->header_.tensors[i];
    t.data = base + f->header_.data_start + t.offset;
    t.file = &f->path_;
    f->by_name_[t.name] = i;
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

// --- TensorStore ---

std::unique_ptr<TensorStore> TensorStore::open_dir(const std::string& dir) {
  std::unique_ptr<TensorStore> s(new TensorStore());
  s->dir_ = dir;
  // error_code overloads throughout: the throwing ones report odd paths (too long, no
  // permission) as filesystem_error instead of deepinfer::Error.
  std::error_code ec;
  DI_REQUIRE(fs::is_directory(dir, ec), dir, ": checkpoint directory does not exist",
             ec ? " (" + ec.message() + ")" : "");
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  auto add_file = [&](const fs::path& p) -> SafetensorsFile* {
    s->files_.push_back(SafetensorsFile::open(p.string()));
    SafetensorsFile* f = s->files_.back().get();
    for (const TensorInfo& t : f->tensors()) {
      auto [it, inserted] = s->by_name_.emplace(t.name, &t);
      DI_REQUIRE(inserted, dir, ": tensor '", t.name, "' appears in both ", *it->second->file,
                 " and ", p.string());
    }
    return f;
  };
  if (fs::exists(index, ec)) {
    json j = json::parse(read_file(index, index), nullptr, false);
    DI_REQUIRE(!j.is_discarded() && j.is_object(), index, ": not a JSON object");
    auto wm = j.find("weight_map");
    DI_REQUIRE(wm != j.end() && wm->is_object(), index,
               ": missing object 'weight_map' (tensor name -> shard file)");
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      DI_REQUIRE(it->is_string(), index, ": weight_map['", it.key(), "'] must be a file name");
      const std::string& shard = it->get_ref<const std::string&>();
      DI_REQUIRE(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", index,
                 ": weight_map['", it.key(), "'] = '", shard,
                 "' must be a file name in the checkpoint directory");
      by_shard[shard].push_back(it.key());
    }
    for (const auto& [shard, names] : by_shard) {
      const fs::path p = fs::path(dir) / shard;
      DI_REQUIRE(fs::exists(p, ec), index, ": shard '", shard, "' (holding '", names[0],
                 "') is missing");
      SafetensorsFile* f = add_file(p);
      for (const std::string& n : names)
        DI_REQUIRE(f->find(n), index, ": tensor '", n, "' is mapped to '", shard,
                   "' but that file does not contain it");
      DI_REQUIRE(f->tensors().size() == names.size(), p.string(), ": holds ", f->tensors().size(),
                 " tensors but the index maps ", names.size(), " to it");
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    add_file(fs::path(dir) / "model.safetensors");
  } else {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".safetensors")
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    DI_REQUIRE(!files.empty(), dir,
               ": no model.safetensors.index.json, model.safetensors or *.safetensors found");
    for (const auto& p : files) add_file(p);
  }
  return s;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& TensorStore::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  DI_REQUIRE(t, dir_, ": checkpoint has no tensor '", name, "'");
  return *t;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> v;
  for (const auto& [n, t] : by_name_) v.push_back(n);
  return v;
}

uint64_t TensorStore::total_bytes() const {
  return std::accumulate(by_name_.begin(), by_name_.end(), uint64_t(0),
                         [](uint64_t n, const auto& e) { return n + e.second->nbytes; });
}

// --- SafetensorsWriter ---

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape,
                            std::vector<uint8_t> bytes) {
  DI_CHECK(bytes.size() == dtype_bytes(dtype, uint64_t(shape.numel())), "tensor ", name, " ",
           shape.str(), " ", dtype_name(dtype), " given ", bytes.size(), " bytes");
  DI_CHECK(name != "__metadata__");
  for (const auto& e : entries_) DI_CHECK(e.name != name, "tensor ", name, " added twice");
  entries_.push_back({name, dtype, shape, std::move(bytes)});
}

uint64_t SafetensorsWriter::data_bytes() const {
  return std::accumulate(entries_.begin(), entries_.end(), uint64_t(0),
                         [](uint64_t n, const Entry& e) { return n + e.bytes.size(); });
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> v;
  for (const auto& e : entries_) v.push_back(e.name);
  return v;
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  for (const auto& e : entries_) {
    nlohmann::ordered_json& t = h[e.name];
    t["dtype"] = std::string(dtype_name(e.dtype));
    t["shape"] = std::vector<int64_t>(e.shape.dim, e.shape.dim + e.shape.ndim);
    t["data_offsets"] = {off, off + e.bytes.size()};
    off += e.bytes.size();
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8) header.push_back(' ');
  const uint64_t len = header.size();  // little-endian, as is the host
  std::vector<std::pair<const void*, uint64_t>> parts = {{&len, 8}, {header.data(), header.size()}};
  for (const auto& e : entries_) parts.emplace_back(e.bytes.data(), e.bytes.size());
  write_file(path, parts);
}

void write_safetensors_index(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& weight_map,
                             uint64_t total_size) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  nlohmann::ordered_json& wm = index["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [tensor, file] : weight_map) wm[tensor] = file;
  const std::string text = index.dump(2) + "\n";
  write_file((fs::path(dir) / "model.safetensors.index.json").string(),
             {{text.data(), text.size()}});
}

uint64_t write_safetensors_shards(const std::string& dir, const std::vector<uint64_t>& sizes,
                                  uint64_t max_shard_bytes,
                                  const std::function<void(size_t, SafetensorsWriter&)>& add) {
  // The index of each shard's first group, then sizes.size(); one shard when there are none.
  std::vector<size_t> starts = {0};
  uint64_t cur = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (cur > 0 && cur + sizes[i] > max_shard_bytes) {
      starts.push_back(i);
      cur = 0;
    }
    cur += sizes[i];
  }
  starts.push_back(sizes.size());
  std::error_code ec;
  fs::create_directories(dir, ec);
  DI_REQUIRE(!ec, dir, ": cannot create directory: ", ec.message());
  std::vector<std::pair<std::string, std::string>> wm;
  uint64_t total = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, starts.size() - 1);
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (size_t i = starts[s]; i < starts[s + 1]; ++i) {
      const uint64_t before = w.data_bytes();
      add(i, w);
      DI_CHECK(w.data_bytes() - before == sizes[i], "tensor group ", i, " of ", name);
    }
    for (const std::string& t : w.names()) wm.emplace_back(t, name);
    total += w.data_bytes();
    w.write((fs::path(dir) / name).string());
  }
  write_safetensors_index(dir, wm, total);
  return total;
}

}  // namespace deepinfer
