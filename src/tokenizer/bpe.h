// Byte-level BPE model: the merge table and the merge loop over one pre-token.
//
// A pre-token is a byte string; its initial symbols are the vocabulary ids of the byte-level
// characters of its bytes (bytes whose character is not in the vocabulary are dropped, as the
// reference does when there is no unknown token). Merges are applied lowest rank first, the
// leftmost occurrence first among equal ranks, through a binary heap of candidate pairs with
// lazy invalidation, so a word of n bytes costs O(n log n). Results are cached per pre-token.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tokenizer_internal {

// Open-addressing map from a symbol pair to (rank, merged id); built once, read-only after.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;  // (left << 32) | right; kEmpty marks a free slot
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  // Room for `n` pairs: the slots are sized once, at most half full.
  explicit MergeTable(size_t n);
  // Later insertions of the same pair replace earlier ones (the reference builds a hash map
  // from the merge list, so the last duplicate wins). At most `n` distinct pairs.
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  const Entry* find(int32_t left, int32_t right) const {
    const Entry& e = slots_[probe(pack(left, right))];
    return e.key == kEmpty ? nullptr : &e;
  }

 private:
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  // The slot holding `key`, or the free slot where it would go (linear probing).
  size_t probe(uint64_t key) const {
    size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> shift_);
    while (slots_[i].key != key && slots_[i].key != kEmpty) i = (i + 1) & mask_;
    return i;
  }

  std::vector<Entry> slots_;  // [capacity], capacity a power of two
  size_t mask_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // byte_ids[b] = vocabulary id of the byte-level character of byte b, or -1 if absent.
  // `whole_words` (raw bytes -> id) is non-empty only for models with `ignore_merges`, where a
  // pre-token that is itself a vocabulary entry skips the merge loop.
  BpeModel(MergeTable merges, std::vector<int32_t> byte_ids,
           std::unordered_map<std::string, int32_t> whole_words);

  // Appends the ids of one pre-token (raw bytes) to `out`.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const;

  MergeTable merges_;
  std::vector<int32_t> byte_ids_;  // [256]
  std::unordered_map<std::string, int32_t> whole_words_;

  // Repeated pre-tokens (common words, whitespace runs) dominate text; caching their ids makes
  // the merge loop rare. Bounded: cleared when full.
  static constexpr size_t kCacheMaxEntries = 1 << 18;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace deepinfer::tokenizer_internal
