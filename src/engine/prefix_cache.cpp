#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(int64_t block_tokens, int32_t n_pools, int32_t blocks_per_pool,
                         int32_t num_snapshots)
    : block_tokens_(block_tokens),
      n_pools_(n_pools),
      blocks_per_pool_(blocks_per_pool),
      key_of_(size_t(n_pools) * size_t(blocks_per_pool)),
      keyed_(key_of_.size(), 0),
      snap_owner_(size_t(num_snapshots)),
      snap_owned_(size_t(num_snapshots), 0),
      snap_used_(size_t(num_snapshots), 0) {}

void PrefixCache::extend_hashes(std::span<const int32_t> tokens,
                                std::vector<uint64_t>* hashes) const {
  const size_t B = size_t(block_tokens_);
  for (size_t i = hashes->size(); (i + 1) * B <= tokens.size(); ++i) {
    uint64_t h = mix((i ? (*hashes)[i - 1] : uint64_t(block_tokens_)) + 0x9e3779b97f4a7c15ull);
    for (size_t t = i * B; t < (i + 1) * B; ++t) h = mix(h ^ uint32_t(tokens[t]));
    hashes->push_back(h);
  }
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens,
                                     std::span<const uint64_t> hashes, int64_t max_blocks) {
  Hit hit;
  if (!enabled()) return hit;
  const size_t B = size_t(block_tokens_);
  size_t usable = 0;  // blocks up to the deepest with a snapshot
  for (size_t i = 0; i < hashes.size() && int64_t(i) < max_blocks; ++i) {
    const auto it = entries_.find(hashes[i]);
    if (it == entries_.end()) break;
    const Entry& e = it->second;
    if (e.parent != (i ? hashes[i - 1] : 0) ||
        !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin() + long(i * B)))
      break;
    hit.blocks.push_back(e.block);
    if (e.snapshot >= 0) {
      usable = i + 1;
      hit.snapshot = e.snapshot;
    }
  }
  hit.blocks.resize(usable);
  if (usable) snap_used_[size_t(hit.snapshot)] = ++tick_;
  return hit;
}

int32_t PrefixCache::take_snapshot() {
  const auto it = std::min_element(snap_used_.begin(), snap_used_.end());
  const auto snap = int32_t(it - snap_used_.begin());
  drop_snapshot(snap);
  *it = ++tick_;
  return snap;
}

bool PrefixCache::publish(std::span<const uint64_t> hashes, size_t index,
                          std::span<const int32_t> tokens, int32_t block, int32_t snapshot) {
  const uint64_t key = hashes[index];
  const int32_t pool = int32_t(index % size_t(n_pools_));
  const size_t slot = size_t(pool) * size_t(blocks_per_pool_) + size_t(block);
  if (entries_.count(key) || keyed_[slot]) {
    if (snapshot >= 0) snap_used_[size_t(snapshot)] = 0;  // first to go
    return false;
  }
  Entry& e = entries_[key];
  e.parent = index ? hashes[index - 1] : 0;
  e.tokens.assign(tokens.begin() + long(index * size_t(block_tokens_)),
                  tokens.begin() + long((index + 1) * size_t(block_tokens_)));
  e.pool = pool;
  e.block = block;
  e.snapshot = snapshot;
  key_of_[slot] = key;
  keyed_[slot] = 1;
  if (snapshot >= 0) {
    snap_owner_[size_t(snapshot)] = key;
    snap_owned_[size_t(snapshot)] = 1;
  }
  return true;
}

void PrefixCache::evict(int32_t pool, int32_t block) {
  const size_t slot = size_t(pool) * size_t(blocks_per_pool_) + size_t(block);
  if (!enabled() || !keyed_[slot]) return;
  keyed_[slot] = 0;
  const auto it = entries_.find(key_of_[slot]);
  DI_CHECK(it != entries_.end(), "prefix cache: block ", block, " keyed but not entered");
  if (it->second.snapshot >= 0) {
    snap_owned_[size_t(it->second.snapshot)] = 0;
    snap_used_[size_t(it->second.snapshot)] = 0;
  }
  entries_.erase(it);
}

void PrefixCache::drop_snapshot(int32_t snap) {
  if (!snap_owned_[size_t(snap)]) return;
  snap_owned_[size_t(snap)] = 0;
  const auto it = entries_.find(snap_owner_[size_t(snap)]);
  if (it != entries_.end()) it->second.snapshot = -1;
}

}  // namespace deepinfer
