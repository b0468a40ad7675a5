#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/reduce.h"

namespace deepinfer {

namespace {
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Higher value first, then lower id: the order every selection here uses.
struct ByValueThenId {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

// A uniform draw in [0, 1) for (seed, index): counter-based, no state.
double sample_uniform(uint64_t seed, uint64_t index) {
  const uint64_t r = mix64(mix64(seed) ^ mix64(index + 0x632be59bd9b4e019ull));
  return double(r >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace

int32_t Sampler::sample(const SampleInput& in, TopLogprobs* top) {
  const SamplingParams& p = *in.params;
  const int64_t V = vocab_;
  const float* raw = in.logits;
  float lse = 0;
  const bool want = p.logprobs > 0 && top;
  if (want) {
    const float mx = *std::max_element(raw, raw + V);
    const float sum = canonical_sum(raw, V, [mx](float v) { return std::exp(v - mx); });
    lse = mx + std::log(sum);
    ids_.resize(size_t(V));
    std::iota(ids_.begin(), ids_.end(), 0);
    const int64_t k = std::min<int64_t>(p.logprobs, V);
    std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), ByValueThenId{raw});
    top->clear();
    for (int64_t i = 0; i < k; ++i) top->emplace_back(ids_[size_t(i)], raw[ids_[size_t(i)]] - lse);
  }
  const int32_t t = choose(in);
  // The chosen token's own logprob, from the same softmax, follows the top-K when it is not
  // among them (as vLLM reports it).
  if (want && std::none_of(top->begin(), top->end(), [t](const auto& e) { return e.first == t; }))
    top->emplace_back(t, raw[t] - lse);
  return t;
}

int32_t Sampler::choose(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int64_t V = vocab_;
  const float* raw = in.logits;
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1;
  if (greedy && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
      p.frequency_penalty == 0.0f && !in.allowed)
    return int32_t(argmax(raw, V));  // nothing to change in the logits: no copy
  work_.assign(raw, raw + V);
  float* l = work_.data();
  const auto& toks = *in.tokens;
  // Penalties: repetition over prompt and output, presence/frequency over output. `count_` is
  // all zero between calls: only the entries of this history's tokens are touched, then reset.
  if (p.repetition_penalty != 1.0f) {
    count_.resize(size_t(V));
    for (int32_t t : toks)
      if (!count_[size_t(t)]++)
        l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    for (int32_t t : toks) count_[size_t(t)] = 0;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    count_.resize(size_t(V));
    for (size_t i = size_t(in.num_prompt); i < toks.size(); ++i) ++count_[size_t(toks[i])];
    for (size_t i = size_t(in.num_prompt); i < toks.size(); ++i) {
      const int32_t t = toks[i];
      if (const int32_t n = count_[size_t(t)]) {
        l[t] -= p.frequency_penalty * float(n) + p.presence_penalty;
        count_[size_t(t)] = 0;
      }
    }
  }
  if (in.allowed) {
    const uint64_t* a = in.allowed;
    for (int64_t i = 0; i < V; ++i)
      if (!((a[i / 64] >> (i % 64)) & 1)) l[i] = -std::numeric_limits<float>::infinity();
  }
  if (greedy) return int32_t(argmax(l, V));
  for (int64_t i = 0; i < V; ++i) l[i] /= p.temperature;
  // Candidates: the top-k tokens, or all. The top-p and min-p cuts walk them in (value desc,
  // id asc) order; without those cuts id order serves as well and the vocabulary is not sorted.
  ids_.resize(size_t(V));
  std::iota(ids_.begin(), ids_.end(), 0);
  int64_t n = V;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), ByValueThenId{l});
  } else if (p.top_p < 1.0f || p.min_p > 0.0f) {
    std::sort(ids_.begin(), ids_.end(), ByValueThenId{l});
  }
  // Probabilities of the candidates (softmax over them), then top-p and min-p cuts.
  float mx = l[ids_[0]];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, l[ids_[size_t(i)]]);
  prob_.resize(size_t(n));
  std::vector<double>& prob = prob_;
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += (prob[size_t(i)] = std::exp(double(l[ids_[size_t(i)]] - mx)));
  int64_t keep = n;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < n; ++i) {
      cum += prob[size_t(i)] / total;
      if (cum >= double(p.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * prob[0];
    int64_t m = 1;
    while (m < keep && prob[size_t(m)] >= floor) ++m;
    keep = m;
  }
  const double kept = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  const double u = sample_uniform(in.seed, uint64_t(toks.size() - size_t(in.num_prompt))) * kept;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[size_t(i)];
    if (u < cum) return ids_[size_t(i)];
  }
  int64_t last = keep - 1;  // rounding left u at the very top: the last candidate with mass
  while (last > 0 && prob[size_t(last)] == 0) --last;
  return ids_[size_t(last)];
}

}  // namespace deepinfer
