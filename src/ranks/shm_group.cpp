#include "ranks/shm_group.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer::ranks {

ShmGroup::ShmGroup(std::shared_ptr<ShmState> state, uint64_t area, int rank, int size)
    : state_(std::move(state)),
      area_ptr_(state_->segment.group(area)),
      area_(area),
      rank_(rank),
      size_(size),
      slot_bytes_(state_->segment.header()->slot_bytes),
      parts_(size_t(size)) {
  DI_CHECK(size >= 1 && size <= state_->world_size && rank >= 0 && rank < size);
}

void ShmGroup::barrier() {
  if (size_ == 1) return;
  shm::GroupArea* a = area_ptr_;
  const uint32_t gen = a->gen.value.load(std::memory_order_acquire);
  if (a->arrived.value.fetch_add(1, std::memory_order_acq_rel) == uint32_t(size_ - 1)) {
    // Last to arrive: reset the count for the next generation before releasing everyone.
    a->arrived.value.store(0, std::memory_order_relaxed);
    shm::notify(a->gen);
    return;
  }
  shm::wait_until(
      a->gen, [&] { return a->gen.value.load(std::memory_order_acquire) != gen; }, state_->alive);
}

void ShmGroup::broadcast(void* data, size_t n_bytes, int root) {
  DI_REQUIRE(root >= 0 && root < size_, "broadcast: root ", root, " is outside the group of ",
             size_);
  if (size_ == 1) return;
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t off = 0; off < n_bytes; off += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, n_bytes - off);
    if (rank_ == root) std::memcpy(slot(root), bytes + off, len);
    meet();
    if (rank_ != root) std::memcpy(bytes + off, slot(root), len);
    next_round();
  }
}

void ShmGroup::all_reduce(float* data, size_t n) {
  if (size_ == 1) return;
  const size_t chunk = slot_bytes_ / sizeof(float);
  for (size_t off = 0; off < n; off += chunk) {
    const size_t len = std::min(chunk, n - off);
    std::memcpy(slot(rank_), data + off, len * sizeof(float));
    meet();
    for (int m = 0; m < size_; ++m) parts_[size_t(m)] = reinterpret_cast<const float*>(slot(m));
    sum_in_rank_order(parts_.data(), size_, len, data + off);
    next_round();
  }
}

void ShmGroup::all_gather(const void* in, size_t n_bytes_each, void* out) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (size_ == 1) {
    if (n_bytes_each && in != out) std::memmove(out, in, n_bytes_each);
    return;
  }
  for (size_t off = 0; off < n_bytes_each; off += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, n_bytes_each - off);
    std::memcpy(slot(rank_), src + off, len);
    meet();
    for (int m = 0; m < size_; ++m) std::memcpy(dst + size_t(m) * n_bytes_each + off, slot(m), len);
    next_round();
  }
}

void ShmGroup::reduce_scatter(const float* in, size_t n_per_rank, float* out) {
  if (size_ == 1) {
    if (n_per_rank && in != out) std::memmove(out, in, n_per_rank * sizeof(float));
    return;
  }
  // Each round carries a slice of every destination's part: [size_, chunk] floats per slot.
  const size_t chunk = slot_bytes_ / sizeof(float) / size_t(size_);
  for (size_t off = 0; off < n_per_rank; off += chunk) {
    const size_t len = std::min(chunk, n_per_rank - off);
    auto* mine = reinterpret_cast<float*>(slot(rank_));
    for (int d = 0; d < size_; ++d)
      std::memcpy(mine + size_t(d) * chunk, in + size_t(d) * n_per_rank + off, len * sizeof(float));
    meet();
    for (int m = 0; m < size_; ++m)
      parts_[size_t(m)] = reinterpret_cast<const float*>(slot(m)) + size_t(rank_) * chunk;
    sum_in_rank_order(parts_.data(), size_, len, out + off);
    next_round();
  }
}

std::vector<std::vector<uint8_t>> ShmGroup::all_gather_v(std::span<const uint8_t> mine) {
  const uint64_t my_len = mine.size();
  std::vector<uint64_t> lens(static_cast<size_t>(size_));
  all_gather(&my_len, sizeof my_len, lens.data());
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size_));
  uint64_t longest = 0;
  for (int m = 0; m < size_; ++m) {
    all[size_t(m)].resize(lens[size_t(m)]);
    longest = std::max(longest, lens[size_t(m)]);
  }
  if (size_ == 1) {
    std::copy(mine.begin(), mine.end(), all[0].begin());
    return all;
  }
  for (uint64_t off = 0; off < longest; off += slot_bytes_) {
    if (off < my_len)
      std::memcpy(slot(rank_), mine.data() + off, std::min(slot_bytes_, my_len - off));
    meet();
    for (int m = 0; m < size_; ++m) {
      const uint64_t len = lens[size_t(m)];
      if (off < len)
        std::memcpy(all[size_t(m)].data() + off, slot(m), std::min(slot_bytes_, len - off));
    }
    next_round();
  }
  return all;
}

std::unique_ptr<Group> ShmGroup::split(int color, int key) {
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> entries(static_cast<size_t>(size_));
  const Entry me{color, key};
  all_gather(&me, sizeof me, entries.data());

  std::vector<int32_t> colors;
  for (const Entry& e : entries)
    if (e.color >= 0) colors.push_back(e.color);
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());

  // Rank 0 takes one fresh area per color for everybody; areas are numbered in color order.
  shm::Header* h = state_->segment.header();
  uint64_t base = 0;
  if (rank_ == 0 && !colors.empty()) {
    base = h->next_group.fetch_add(uint32_t(colors.size()));
    if (base + colors.size() > h->max_groups) base = UINT64_MAX;
  }
  broadcast(&base, sizeof base, 0);
  DI_REQUIRE(base != UINT64_MAX, "split: the shared-memory segment has room for ", h->max_groups,
             " groups (the world included) and they are taken; raise "
             "WorldOptions::shm_max_groups");
  if (color < 0) return nullptr;

  std::vector<int> members;  // ranks here with my color, in new-rank order
  for (int r = 0; r < size_; ++r)
    if (entries[size_t(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return entries[size_t(a)].key < entries[size_t(b)].key; });
  const int new_rank = int(std::find(members.begin(), members.end(), rank_) - members.begin());
  const uint64_t area =
      base + uint64_t(std::lower_bound(colors.begin(), colors.end(), color) - colors.begin());
  return std::make_unique<ShmGroup>(state_, area, new_rank, int(members.size()));
}

}  // namespace deepinfer::ranks
