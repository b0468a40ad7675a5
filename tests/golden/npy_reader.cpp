#include "npy_reader.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace deepinfer::testing {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DI_REQUIRE(f, path, ": cannot read");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t le16(const uint8_t* p) {
  return uint16_t(p[0] | p[1] << 8);
}

NpyArray npy_parse(const uint8_t* b, uint64_t size, const std::string& label) {
  DI_REQUIRE(size >= 10 && b[0] == 0x93 && std::memcmp(b + 1, "NUMPY", 5) == 0, label,
             ": not a .npy file");
  const int major = b[6];
  uint64_t hl, off;
  if (major == 1) {
    hl = le16(b + 8);
    off = 10;
  } else {
    DI_REQUIRE(size >= 12, label, ": truncated");
    hl = le32(b + 8);
    off = 12;
  }
  DI_REQUIRE(off + hl <= size, label, ": truncated header");
  const std::string h(reinterpret_cast<const char*>(b + off), hl);
  NpyArray a;
  const size_t d = h.find("'descr':");
  DI_REQUIRE(d != std::string::npos, label, ": no descr");
  const size_t q1 = h.find('\'', d + 8), q2 = h.find('\'', q1 + 1);
  const std::string descr = h.substr(q1 + 1, q2 - q1 - 1);
  DI_REQUIRE(descr == "<f4" || descr == "<f8" || descr == "<i4" || descr == "<i8", label,
             ": unsupported dtype ", descr, " (expected <f4, <f8, <i4 or <i8)");
  a.dtype = descr.substr(1);
  DI_REQUIRE(h.find("'fortran_order': False") != std::string::npos, label, ": Fortran order");
  const size_t s = h.find("'shape':"), p1 = h.find('(', s), p2 = h.find(')', p1);
  std::stringstream ss(h.substr(p1 + 1, p2 - p1 - 1));
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (tok.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(tok));
  const uint64_t nbytes = uint64_t(a.numel()) * (a.dtype[1] == '4' ? 4 : 8);
  DI_REQUIRE(off + hl + nbytes <= size, label, ": truncated data");
  a.bytes.assign(b + off + hl, b + off + hl + nbytes);
  return a;
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

template <typename T>
std::vector<T> NpyArray::as() const {
  std::vector<T> out(static_cast<size_t>(numel()));
  auto from = [&]<typename S>(S) {
    for (size_t i = 0; i < out.size(); ++i) {
      S v;
      std::memcpy(&v, bytes.data() + sizeof(S) * i, sizeof(S));
      out[i] = T(v);
    }
  };
  if (dtype == "f4")
    from(float());
  else if (dtype == "f8")
    from(double());
  else if (dtype == "i4")
    from(int32_t());
  else
    from(int64_t());
  return out;
}
template std::vector<double> NpyArray::as() const;
template std::vector<int64_t> NpyArray::as() const;

NpyArray npy_read(const std::string& path) {
  const std::string s = read_file(path);
  return npy_parse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), path);
}

std::map<std::string, NpyArray> npz_read(const std::string& path) {
  const std::string s = read_file(path);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(s.data());
  std::map<std::string, NpyArray> out;
  // Walk the local file headers; numpy.savez stores entries uncompressed. Sizes may be in a ZIP64
  // extra field (numpy forces ZIP64), so take them from the central directory instead.
  size_t eocd = s.size() >= 22 ? s.size() - 22 : 0;
  while (eocd > 0 && le32(b + eocd) != 0x06054b50) --eocd;
  DI_REQUIRE(le32(b + eocd) == 0x06054b50, path, ": not a zip archive");
  const uint16_t n_entries = le16(b + eocd + 10);
  size_t cd = le32(b + eocd + 16);
  for (uint16_t e = 0; e < n_entries; ++e) {
    DI_REQUIRE(cd + 46 <= s.size() && le32(b + cd) == 0x02014b50, path, ": bad central directory");
    const uint16_t method = le16(b + cd + 10);
    uint64_t csize = le32(b + cd + 20);
    const uint16_t nlen = le16(b + cd + 28), xlen = le16(b + cd + 30), clen = le16(b + cd + 32);
    uint64_t local = le32(b + cd + 42);
    const std::string name(reinterpret_cast<const char*>(b + cd + 46), nlen);
    // ZIP64 extra: sizes/offset replaced by 0xffffffff are in the extra field in order.
    const uint8_t* x = b + cd + 46 + nlen;
    uint64_t usize = le32(b + cd + 24);
    for (size_t xo = 0; xo + 4 <= xlen;) {
      const uint16_t id = le16(x + xo), sz = le16(x + xo + 2);
      size_t q = xo + 4;
      for (uint64_t* field : {&usize, &csize, &local}) {
        if (id != 1 || *field != 0xffffffffu) continue;
        *field = uint64_t(le32(x + q)) | uint64_t(le32(x + q + 4)) << 32;
        q += 8;
      }
      xo += 4 + sz;
    }
    DI_REQUIRE(method == 0, path, ": entry ", name,
               " is compressed (use numpy.savez, not savez_compressed)");
    DI_REQUIRE(local + 30 <= s.size(), path, ": bad local header");
    const size_t data = local + 30 + le16(b + local + 26) + le16(b + local + 28);
    DI_REQUIRE(data + csize <= s.size(), path, ": truncated entry ", name);
    std::string key = name;
    if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
    out[key] = npy_parse(b + data, csize, path + ":" + name);
    cd += 46 + nlen + xlen + clen;
  }
  return out;
}

}  // namespace deepinfer::testing
