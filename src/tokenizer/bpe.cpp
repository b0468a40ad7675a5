#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace deepinfer::tokenizer_internal {

// --- merge table ---

MergeTable::MergeTable(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  const uint64_t key = pack(left, right);
  slots_[probe(key)] = Entry{key, rank, merged};
}

// --- BPE over one word ---

BpeModel::BpeModel(MergeTable merges, std::vector<int32_t> byte_ids,
                   std::unordered_map<std::string, int32_t> whole_words)
    : merges_(std::move(merges)),
      byte_ids_(std::move(byte_ids)),
      whole_words_(std::move(whole_words)) {
  DI_CHECK(byte_ids_.size() == 256);
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool live;
};

struct Candidate {
  uint32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t merged;
  // std::priority_queue is a max-heap: "less" means lower priority, i.e. a higher rank or,
  // for equal ranks, a position further right.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;  // [n_bytes] at most
  sym.reserve(bytes.size());
  for (const char c : bytes) {
    const int32_t id = byte_ids_[uint8_t(c)];
    if (id < 0) continue;
    const int32_t i = int32_t(sym.size());
    sym.push_back({id, i - 1, -1, true});
    if (i > 0) sym[i - 1].next = i;
  }
  if (sym.size() > 1) {
    std::vector<Candidate> storage;
    storage.reserve(sym.size());
    std::priority_queue<Candidate> heap(std::less<Candidate>(), std::move(storage));
    const auto push_pair = [&](int32_t left) {
      const int32_t right = sym[left].next;
      if (right < 0) return;
      if (const MergeTable::Entry* e = merges_.find(sym[left].id, sym[right].id)) {
        heap.push({e->rank, left, e->merged});
      }
    };
    for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) push_pair(i);

    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      Symbol& left = sym[top.pos];
      if (!left.live || left.next < 0) continue;
      // The pair may have changed since this candidate was queued; it is still valid only if
      // the current pair merges into the same id.
      const MergeTable::Entry* e = merges_.find(left.id, sym[left.next].id);
      if (e == nullptr || e->merged != top.merged) continue;
      Symbol& right = sym[left.next];
      left.id = top.merged;
      right.live = false;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (!whole_words_.empty()) {
    const auto it = whole_words_.find(std::string(bytes));
    if (it != whole_words_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (bytes.size() == 1) {
    if (const int32_t id = byte_ids_[uint8_t(bytes[0])]; id >= 0) out.push_back(id);
    return;
  }
  const bool cacheable = bytes.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(bytes);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(bytes, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + first, out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace deepinfer::tokenizer_internal
