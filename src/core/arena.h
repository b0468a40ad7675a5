// A step arena: the memory of a forward step's temporary buffers, reused from step to step.
//
// Sublayers allocate their buffers as `std::pmr::vector`s on the arena (bump allocation, 64-byte
// aligned); an ArenaScope at the top of a sublayer gives everything allocated after it back when
// the sublayer returns, so the arena's high-water mark is the largest sublayer of the step, not
// their sum. Freeing the most recent allocation also gives its bytes back (a vector that grows by
// push_back reuses its old block's place). When a step needs more than the arena holds, a new
// chunk is added; `reset()` between steps merges the chunks into one, so a step of a shape seen
// before allocates nothing from the heap. Single-threaded: the thread that runs the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <type_traits>
#include <vector>

namespace deepinfer {

class Arena final : public std::pmr::memory_resource {
 public:
  struct Mark {
    size_t chunk = 0, used = 0;  // chunk index, bytes used in it
  };
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() override;

  Mark mark() const { return at_; }
  void release(Mark m) { at_ = m; }
  // Between steps, when nothing allocated from the arena is alive.
  void reset();
  size_t capacity() const;  // bytes held

 private:
  void* do_allocate(size_t bytes, size_t align) override;
  void do_deallocate(void* p, size_t bytes, size_t align) override;
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }
  void add_chunk(size_t at_least);

  struct Chunk {
    uint8_t* data;
    size_t size;
  };
  std::vector<Chunk> chunks_;
  Mark at_;  // the allocation point
};

// Gives back everything allocated on `a` after its construction when it goes out of scope. Declare
// it before the buffers it covers.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : a_(a), m_(a.mark()) {}
  ~ArenaScope() { a_.release(m_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& a_;
  Arena::Mark m_;
};

template <class T>
using ArenaVec = std::pmr::vector<T>;

// n uninitialized Ts on `a` (trivial types only), for buffers written in full before they are
// read: an ArenaVec of that size would first fill them with zeros.
template <class T>
T* arena_array(Arena& a, size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  return static_cast<T*>(a.allocate(n * sizeof(T), 64));
}

}  // namespace deepinfer
