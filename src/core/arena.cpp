#include "core/arena.h"

#include <cstdlib>
#include <new>
#include <numeric>

namespace deepinfer {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}
}  // namespace

Arena::~Arena() {
  for (const Chunk& c : chunks_) std::free(c.data);
}

size_t Arena::capacity() const {
  return std::accumulate(chunks_.begin(), chunks_.end(), size_t(0),
                         [](size_t n, const Chunk& c) { return n + c.size; });
}

void Arena::add_chunk(size_t at_least) {
  const size_t size = round_up(std::max(at_least, std::max<size_t>(capacity(), 1 << 16)), kAlign);
  void* p = std::aligned_alloc(kAlign, size);
  if (!p) throw std::bad_alloc();
  chunks_.push_back({static_cast<uint8_t*>(p), size});
}

void Arena::reset() {
  if (chunks_.size() > 1) {
    const size_t total = capacity();
    for (const Chunk& c : chunks_) std::free(c.data);
    chunks_.clear();
    add_chunk(total);
  }
  at_ = {};
}

void* Arena::do_allocate(size_t bytes, size_t align) {
  const size_t a = std::max(align, kAlign);
  // The current chunk, else a later one kept from an earlier release, else a new one.
  for (;; at_ = {at_.chunk + 1, 0}) {
    if (at_.chunk == chunks_.size()) add_chunk(bytes + a);
    const size_t off = round_up(at_.used, a);
    if (off + bytes <= chunks_[at_.chunk].size) {
      at_.used = off + bytes;
      return chunks_[at_.chunk].data + off;
    }
  }
}

void Arena::do_deallocate(void* p, size_t bytes, size_t) {
  // The latest allocation gives its bytes back; any other waits for its scope.
  if (at_.chunk < chunks_.size() &&
      static_cast<uint8_t*>(p) + bytes == chunks_[at_.chunk].data + at_.used)
    at_.used = size_t(static_cast<uint8_t*>(p) - chunks_[at_.chunk].data);
}

}  // namespace deepinfer
