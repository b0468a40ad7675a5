// A group of ranks and the collectives the model needs. Model code holds a `Group&` and never
// learns whether the ranks are one process, processes on one host (shm) or hosts (MPI).
//
// Every collective is called by every member of the group, in the same order, with the same
// sizes, by one thread at a time; the buffers are contiguous and owned by the caller. Sums are
// deterministic: element j of a sum is ((x_0[j] + x_1[j]) + x_2[j]) + ... in fp32, in rank order,
// computed once and copied or computed identically everywhere, so every rank holds the same bits
// whatever the backend and whatever the timing. A rank that dies makes the waiting ranks throw
// deepinfer::Error naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace deepinfer::ranks {

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Copies `n_bytes` from `root` into `data` on every other rank.
  virtual void broadcast(void* data, size_t n_bytes, int root) = 0;

  // data[j] = sum over ranks r in order 0..size-1 of data_r[j], on every rank.
  virtual void all_reduce(float* data /* [n] */, size_t n) = 0;

  // out = [in_0, in_1, ..., in_{size-1}], each block `n_bytes_each` long.
  virtual void all_gather(const void* in /* [n_bytes_each] */, size_t n_bytes_each,
                          void* out /* [size, n_bytes_each] */) = 0;

  // out[j] = sum over ranks r in order of in_r[rank * n_per_rank + j].
  virtual void reduce_scatter(const float* in /* [size, n_per_rank] */, size_t n_per_rank,
                              float* out /* [n_per_rank] */) = 0;

  virtual void barrier() = 0;

  // Each rank contributes a message of any length; every rank gets all of them, by rank.
  std::vector<std::vector<uint8_t>> all_gather_v(std::span<const uint8_t> mine);

  // Partitions the group like MPI_Comm_split: members passing the same non-negative `color`
  // form one new group, ordered by (key, rank here). A negative color joins no group and gets
  // nullptr. Called by every member. The new group must not outlive the world it came from.
  virtual std::unique_ptr<Group> split(int color, int key) = 0;

 protected:
  // Throws unless `root` is a rank of this group.
  void check_root(int root) const;
};

// A group of one: every collective copies its input to its output or does nothing.
std::unique_ptr<Group> make_single_group();

// The fixed-order sum every backend uses: out[j] = ((parts[0][j] + parts[1][j]) + ...) in fp32.
// `out` may be one of the parts.
void sum_in_rank_order(const float* const* parts /* [n_parts][n] */, int n_parts, size_t n,
                       float* out /* [n] */);

}  // namespace deepinfer::ranks
