#include "core/huge_alloc.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace deepinfer {

namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kChunk = size_t(32) << 20;

std::shared_ptr<uint8_t> fresh(size_t bytes) {
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  uint8_t* p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, size));
  DI_REQUIRE(p, "cannot allocate ", size, " bytes");
  madvise(p, size, MADV_HUGEPAGE);  // advice only: without it the pages are ordinary
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
}

}  // namespace

std::shared_ptr<uint8_t> huge_alloc(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  if (bytes > kChunk / 4) return fresh(bytes);
  static std::mutex mu;
  static std::shared_ptr<uint8_t> chunk;
  static size_t used = kChunk;
  std::lock_guard<std::mutex> lock(mu);
  if (used + bytes > kChunk) {
    chunk = fresh(kChunk);
    used = 0;
  }
  std::shared_ptr<uint8_t> out(chunk, chunk.get() + used);  // shares the chunk's lifetime
  used += bytes;
  return out;
}

}  // namespace deepinfer
