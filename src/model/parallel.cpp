#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/region_timer.h"
#include "kernels/attention.h"
#include "ranks/serial.h"

namespace deepinfer {

ExpertExchange::Rows ExpertExchange::dispatch(const Rows& mine, int64_t k, int64_t dim) {
  if (!dispatch_) return mine;
  ranks::Writer w;
  w.put_vector(std::span<const float>(mine.x, size_t(mine.n * dim)));
  w.put_vector(std::span<const int32_t>(mine.ids, size_t(mine.n * k)));
  w.put_vector(std::span<const float>(mine.weights, size_t(mine.n * k)));
  std::vector<std::vector<uint8_t>> parts;
  {
    DI_REGION("comm.moe_dispatch");
    parts = g_->all_gather_v(w.take());
  }
  xs_.clear();
  ids_.clear();
  ws_.clear();
  count_.clear();
  auto append = [](auto& dst, const auto& v) {
    dst.insert(dst.end(), v.begin(), v.end());
    return int64_t(v.size());
  };
  for (const auto& part : parts) {
    ranks::Reader r(part, "expert dispatch message");
    append(xs_, r.get_vector<float>());
    count_.push_back(append(ids_, r.get_vector<int32_t>()) / k);
    append(ws_, r.get_vector<float>());
    r.expect_end();
  }
  slots_.assign(ids_.size() * size_t(dim), 0.0f);
  return {xs_.data(), ids_.data(), ws_.data(), int64_t(ids_.size()) / k, slots_.data()};
}

void ExpertExchange::combine(const Rows& mine, int64_t k, int64_t dim) {
  if (!g_) return;
  if (!dispatch_) {
    // Each member fills the slots of its experts; the sum (one term per slot non-zero) gives
    // every rank the single-rank slots exactly.
    DI_REGION("comm.moe_all_reduce");
    g_->all_reduce(mine.slots, size_t(mine.n * k * dim));
    return;
  }
  // Each member's rows, padded to the longest, go back with a reduce-scatter.
  const int64_t n_max = *std::max_element(count_.begin(), count_.end()), row = k * dim;
  std::vector<float> padded(count_.size() * size_t(n_max * row), 0.0f), back(size_t(n_max * row));
  int64_t at = 0;
  for (size_t pr = 0; pr < count_.size(); ++pr) {
    std::copy_n(&slots_[size_t(at * row)], count_[pr] * row, &padded[pr * size_t(n_max * row)]);
    at += count_[pr];
  }
  {
    DI_REGION("comm.moe_combine");
    g_->reduce_scatter(padded.data(), size_t(n_max * row), back.data());
  }
  std::copy_n(back.data(), mine.n * row, mine.slots);
}

void ContextShard::all_gather(const void* mine, size_t bytes, void* all) {
  if (!g_) {
    std::memcpy(all, mine, bytes);
    return;
  }
  DI_REGION("comm.indexer_gather");
  g_->all_gather(mine, bytes, all);
}

void ContextShard::begin_attention(int64_t rows, int64_t heads, int64_t dim) {
  if (!g_) return;
  rows_ = rows;
  heads_ = heads;
  dim_ = dim;
  psize_ = attention_partial_size(heads, dim);
  partial_.resize(size_t(rows * psize_));
}

void ContextShard::attend(int64_t row, const SparseAttnArgs& a) {
  if (g_)
    sparse_attention_partial(a, &partial_[size_t(row * psize_)]);
  else
    sparse_attention(a);
}

void ContextShard::end_attention(const float* sink, bool exact, float* out) {
  if (!g_) return;
  DI_REGION("comm.attn_partials");
  const int n = g_->size();
  all_.resize(size_t(n) * partial_.size());
  g_->all_gather(partial_.data(), partial_.size() * sizeof(double), all_.data());
  // Row i of rank r's partials lies r * rows * psize doubles after row i of rank 0's.
  for (int64_t i = 0; i < rows_; ++i)
    merge_attention_partials(&all_[size_t(i * psize_)], n, rows_ * psize_, sink, heads_, dim_,
                             exact, out + i * heads_ * dim_);
}

}  // namespace deepinfer
