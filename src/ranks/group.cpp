#include "ranks/group.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer::ranks {

void sum_in_rank_order(const float* const* parts, int n_parts, size_t n, float* out) {
  DI_CHECK(n_parts >= 1);
  // Blocks keep the running sums in registers or L1 while each part streams through once, and
  // reading a whole block before writing it lets `out` be one of the parts.
  constexpr size_t kBlock = 256;
  float acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    std::memcpy(acc, parts[0] + b, m * sizeof(float));
    for (int r = 1; r < n_parts; ++r) {
      const float* p = parts[r] + b;
      for (size_t j = 0; j < m; ++j) acc[j] += p[j];
    }
    std::memcpy(out + b, acc, m * sizeof(float));
  }
}

void Group::check_root(int root) const {
  DI_REQUIRE(root >= 0 && root < size(), "broadcast: root ", root, " is outside the group of ",
             size());
}

std::vector<std::vector<uint8_t>> Group::all_gather_v(std::span<const uint8_t> mine) {
  const uint64_t my_len = mine.size();
  std::vector<uint64_t> lens(static_cast<size_t>(size()));
  all_gather(&my_len, sizeof my_len, lens.data());
  // Every message padded to the longest, so that one all_gather moves them all.
  const uint64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<uint8_t> padded(longest), flat(size_t(size()) * longest);
  std::copy(mine.begin(), mine.end(), padded.begin());
  all_gather(padded.data(), longest, flat.data());
  std::vector<std::vector<uint8_t>> all;
  for (int r = 0; r < size(); ++r) {
    const uint8_t* p = flat.data() + size_t(r) * longest;
    all.emplace_back(p, p + lens[size_t(r)]);
  }
  return all;
}

namespace {

class SingleGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void broadcast(void*, size_t, int root) override { check_root(root); }
  void all_reduce(float*, size_t) override {}
  void all_gather(const void* in, size_t n_bytes_each, void* out) override {
    if (n_bytes_each && in != out) std::memmove(out, in, n_bytes_each);
  }
  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override {
    all_gather(in, n_per_rank * sizeof(float), out);
  }
  void barrier() override {}
  std::unique_ptr<Group> split(int color, int) override {
    return color < 0 ? nullptr : make_single_group();
  }
};

}  // namespace

std::unique_ptr<Group> make_single_group() {
  return std::make_unique<SingleGroup>();
}

}  // namespace deepinfer::ranks
