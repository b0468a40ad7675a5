// libFuzzer target: the safetensors header parser on arbitrary bytes (the whole input is the
// file). Bad input must end in deepinfer::Error. Anything else is a finding: another exception,
// a crash or sanitizer report, or an accepted header whose tensors break what readers rely on
// (byte counts that match shape x dtype, data inside the file, no two tensors sharing bytes).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& tensor) {
  std::fprintf(stderr, "accepted header breaks an invariant: %s (tensor '%s')\n", what,
               tensor.c_str());
  std::abort();
}

void check(const deepinfer::SafetensorsHeader& h, const uint8_t* data, size_t size) {
  using deepinfer::TensorInfo;
  if (h.data_start < 8 || h.data_start > size) finding("data section start outside the file", "");
  const unsigned __int128 data_size = size - h.data_start;
  std::set<std::string> names;
  const TensorInfo* prev = nullptr;
  volatile uint8_t sink = 0;
  for (const TensorInfo& t : h.tensors) {
    if (!names.insert(t.name).second) finding("duplicate name", t.name);
    if (t.name == "__metadata__") finding("metadata taken for a tensor", t.name);
    if (t.shape.ndim < 0 || t.shape.ndim > deepinfer::kMaxDims) finding("dims", t.name);
    // Element and byte counts in 128 bits, so nothing can wrap.
    unsigned __int128 numel = 1;
    for (int d = 0; d < t.shape.ndim; ++d) {
      if (t.shape.dim[d] < 0) finding("negative dim", t.name);
      numel *= uint64_t(t.shape.dim[d]);
      if (numel >> 64) finding("element count past 64 bits", t.name);
    }
    const unsigned __int128 bytes = (numel * deepinfer::dtype_bits(t.dtype) + 7) / 8;
    if (bytes != t.nbytes) finding("byte count does not match shape x dtype", t.name);
    if (t.dtype == deepinfer::DType::E2M1 &&
        (t.shape.ndim == 0 || t.shape.dim[t.shape.ndim - 1] % 2 != 0))
      finding("F4 with an odd last dim", t.name);
    if ((unsigned __int128)t.offset + t.nbytes > data_size) finding("data past the end", t.name);
    if (prev && t.offset < prev->offset) finding("not sorted by offset", t.name);
    if (t.nbytes > 0) {
      if (prev && t.offset < prev->offset + prev->nbytes) finding("overlap", t.name);
      prev = &t;
      // Touch both ends, so AddressSanitizer reports bytes outside the input.
      sink = sink ^ data[h.data_start + t.offset] ^ data[h.data_start + t.offset + t.nbytes - 1];
    }
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deepinfer::SafetensorsHeader h;
  try {
    h = deepinfer::parse_safetensors_header(data, size, "fuzz input");
  } catch (const deepinfer::Error&) {
    return 0;
  }
  check(h, data, size);
  return 0;
}
