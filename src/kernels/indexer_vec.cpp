// Vector indexer scores (V41_SPEC.md §6.3) in the order of indexer_scores_ref, lane = head:
// every key element is broadcast against the transposed query (several keys at a time), each
// head's dot product is the canonical blocked sum, then bf16(relu(bf16(dot))·w_h) per head, and
// the head sum runs over the heads in order (scalar, per key).
#include <cstring>
#include <utility>

#include "kernels/isa.h"
#include "kernels/simd.h"

namespace deepinfer::indexer_isa {

namespace {

using namespace simd::DI_SIMD_NS;

inline float round_bf16_1(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// HV vectors of heads, KN keys [t, t + KN).
template <bool FM, int HV, int KN>
inline void score_keys(const IndexerScoreArgs& a, const float* qT, const float* w, int64_t t,
                       float* terms) {
  const int64_t Di = a.Di;
  const float* k[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) k[c] = a.keys + (t + c) * Di;
  F acc[KN][HV];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
    for (int v = 0; v < HV; ++v) acc[c][v] = zero();
  for (int64_t b = 0; b < Di; b += 32) {
    F p[KN][HV];
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
      for (int v = 0; v < HV; ++v) p[c][v] = zero();
#pragma GCC unroll 2
    for (int i = 0; i < 32; i += 2) {
#pragma GCC unroll 2
      for (int odd = 1; odd >= 0; --odd) {
        const int64_t d = b + i + odd;
        F q[HV];
#pragma GCC unroll 8
        for (int v = 0; v < HV; ++v) q[v] = load(qT + (d * HV + v) * kLanes);
#pragma GCC unroll 4
        for (int c = 0; c < KN; ++c) {
          const F kv = set1(k[c][d]);
#pragma GCC unroll 8
          for (int v = 0; v < HV; ++v) p[c][v] = madd<FM>(kv, q[v], p[c][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
      for (int v = 0; v < HV; ++v) acc[c][v] = add(acc[c][v], p[c][v]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
    for (int v = 0; v < HV; ++v) {
      F d = acc[c][v];
      if (a.bf16) d = round_bf16(d);
      F term = mul(max(zero(), d), load(w + v * kLanes));
      if (a.bf16) term = round_bf16(term);
      store(terms + (c * HV + v) * kLanes, term);
    }
}

template <bool FM, int HV>
void run(const Job& j) {
  const IndexerScoreArgs& a = *j.a;
  const int64_t Di = a.Di, Hi = a.Hi;
  float* qT = j.scratch;             // [Di][HV*kLanes]
  float* w = qT + Di * HV * kLanes;  // [HV*kLanes]
  float* terms = w + HV * kLanes;    // [4][HV*kLanes]
  for (int64_t d = 0; d < Di; ++d)
    for (int64_t h = 0; h < HV * kLanes; ++h)
      qT[d * HV * kLanes + h] = h < Hi ? a.qi[h * Di + d] : 0;
  for (int64_t h = 0; h < HV * kLanes; ++h) w[h] = h < Hi ? a.w[h] : 0;
  constexpr int KN = HV <= 2 ? 4 : HV <= 4 ? 2 : 1;  // keys in flight, within the registers
  auto finish = [&](int64_t t, int kn) {
    for (int c = 0; c < kn; ++c) {
      float s = 0;
      for (int64_t h = 0; h < Hi; ++h) s += terms[c * HV * kLanes + h];
      a.scores[t + c] = a.bf16 ? round_bf16_1(s) : s;
    }
  };
  int64_t t = j.t0;
  for (; t + KN <= j.t1; t += KN) {
    score_keys<FM, HV, KN>(a, qT, w, t, terms);
    finish(t, KN);
  }
  for (; t < j.t1; ++t) {
    score_keys<FM, HV, 1>(a, qT, w, t, terms);
    finish(t, 1);
  }
}

constexpr int kMaxHv = int(kMaxHeads / kLanes);

template <bool FM, int... H>
void run_hv(const Job& j, std::integer_sequence<int, H...>) {
  static constexpr void (*kRun[])(const Job&) = {run<FM, H + 1>...};
  const int64_t hv = (j.a->Hi + kLanes - 1) / kLanes;
  kRun[(hv < kMaxHv ? hv : kMaxHv) - 1](j);
}

void scores(const Job& j) {
  if (j.fma)
    run_hv<true>(j, std::make_integer_sequence<int, kMaxHv>());
  else
    run_hv<false>(j, std::make_integer_sequence<int, kMaxHv>());
}

}  // namespace

template <>
Fn kernel<simd::DI_SIMD_NS::kIsa>() {
  return scores;
}

}  // namespace deepinfer::indexer_isa
