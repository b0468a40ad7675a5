// Sparse attention: the vector paths against sparse_attention_ref (bit-exact) over head counts
// that do and do not fill a vector, head dims, key counts around the 64-key softmax blocks,
// bf16 and fp32 inputs, keys given as fp32, bf16 or pointers to bf16 rows, ISAs and thread
// counts; the reference against the exact formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/isa.h"

namespace deepinfer::testing {
namespace {

struct AttnInputs {
  std::vector<float> q, keys, sink;
};

AttnInputs make_inputs(int64_t H, int64_t Dh, int64_t nk, bool bf16, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  AttnInputs in;
  in.q.resize(size_t(H * Dh));
  in.keys.resize(size_t(nk * Dh));
  in.sink.resize(static_cast<size_t>(H));
  for (auto& v : in.q) v = nd(rng) * 2.0f;
  for (auto& v : in.keys) v = nd(rng);
  for (auto& v : in.sink) v = nd(rng) * 3.0f;
  if (bf16) {
    for (auto& v : in.q) v = round_bf16(v);
    for (auto& v : in.keys) v = round_bf16(v);
  }
  return in;
}

SparseAttnArgs args_of(const AttnInputs& in, int64_t H, int64_t Dh, int64_t nk, bool bf16_probs,
                       float* out) {
  return {
      in.q.data(), in.keys.data(), nk, in.sink.data(), H, Dh, float(1.0 / std::sqrt(double(Dh))),
      bf16_probs,  false,          out};
}

TEST(AttentionFast, MatchesRef) {
  KernelEnvGuard guard;
  uint64_t seed = 1;
  for (int64_t H : {1, 3, 8, 16, 17, 40})
    for (int64_t Dh : {32, 96, 512})
      for (int64_t nk : {1, 5, 63, 64, 65, 130})
        for (int mode = 0; mode < 5; ++mode) {
          // 0: bf16 inputs and probabilities (bf16 numerics), 1: fp32 inputs with bf16
          // probabilities, 2: fp32 throughout; with bf16 numerics (AMX tiles where the CPU has
          // them), 3: scores spread so wide that some probabilities fall below 2^-56 (those
          // blocks' values off the tiles), 4: a key value below 2^-56 (no tiles).
          const bool bf16_in = mode == 0 || mode >= 3, bf16_probs = mode != 2;
          AttnInputs in = make_inputs(H, Dh, nk, bf16_in, seed++);
          if (mode == 3)
            for (auto& v : in.q) v *= 64.0f;
          if (mode == 4) in.keys[size_t(nk * Dh / 2)] = 0x1p-60f;
          std::vector<float> want(size_t(H * Dh));
          set_cpu_isa(Isa::Scalar);
          sparse_attention_ref(args_of(in, H, Dh, nk, bf16_probs, want.data()));
          for (Isa isa : machine_isas())
            for (int threads : {1, 3}) {
              set_cpu_isa(isa);
              if (ThreadPool::global().size() != threads) ThreadPool::set_global_threads(threads);
              std::vector<float> got(size_t(H * Dh), -1.0f);
              sparse_attention(args_of(in, H, Dh, nk, bf16_probs, got.data()));
              int64_t d = first_diff(want.data(), got.data(), H * Dh);
              if (d == -1 && bf16_in) {  // the same keys given as bf16 bits
                std::vector<uint16_t> k16(in.keys.size());
                for (size_t i = 0; i < k16.size(); ++i)
                  k16[i] = uint16_t(std::bit_cast<uint32_t>(in.keys[i]) >> 16);
                SparseAttnArgs b = args_of(in, H, Dh, nk, bf16_probs, got.data());
                b.keys = nullptr;
                b.keys_bf16 = k16.data();
                std::fill(got.begin(), got.end(), -1.0f);
                sparse_attention(b);
                d = first_diff(want.data(), got.data(), H * Dh);
                // By pointers: the first two thirds one run of rows Dh apart (read in place), the
                // rest scattered backwards after a gap (gathered); the reference takes them too.
                std::vector<uint16_t> rows(size_t(2 * nk * Dh) + 1, 0x7fc0);
                std::vector<const uint16_t*> ptrs(static_cast<size_t>(nk));
                const int64_t run = nk * 2 / 3;
                for (int64_t j = 0; j < nk; ++j) {
                  uint16_t* r = rows.data() + 1 + (j < run ? j : 2 * nk - 1 - (j - run)) * Dh;
                  std::copy_n(k16.data() + j * Dh, Dh, r);
                  ptrs[size_t(j)] = r;
                }
                b.keys_bf16 = nullptr;
                b.key_rows = ptrs.data();
                for (int ref = 0; ref < 2 && d == -1; ++ref) {
                  std::fill(got.begin(), got.end(), -1.0f);
                  (ref ? sparse_attention_ref : sparse_attention)(b);
                  d = first_diff(want.data(), got.data(), H * Dh);
                }
                // With the rows' pairs (both alignments) where the keys are exact for the tiles
                // (not mode 4): whole blocks of the run take them in place.
                if (mode != 4 && d == -1) {
                  const int64_t n_rows = 2 * nk;
                  std::vector<uint16_t> pairs[2];
                  for (int par = 0; par < 2; ++par) {
                    const int64_t np = (n_rows - par) / 2;
                    pairs[par].assign(size_t((np + 2) * 2 * Dh), 0x7fc0);
                    pair_key_rows(rows.data() + 1 + par * Dh, np, Dh, pairs[par].data());
                  }
                  std::vector<const uint16_t*> kp(static_cast<size_t>(nk));
                  for (int64_t j = 0; j < nk; ++j) {
                    const int64_t r = (ptrs[size_t(j)] - rows.data() - 1) / Dh;
                    kp[size_t(j)] = pairs[r & 1].data() + (r >> 1) * 2 * Dh;
                  }
                  b.key_pairs = kp.data();
                  std::fill(got.begin(), got.end(), -1.0f);
                  sparse_attention(b);
                  d = first_diff(want.data(), got.data(), H * Dh);
                }
              }
              ASSERT_EQ(d, -1) << "H=" << H << " Dh=" << Dh << " nk=" << nk << " mode " << mode
                               << " isa=" << isa_name(isa) << " threads=" << threads << ": element "
                               << d << " ref " << want[size_t(d)] << " got " << got[size_t(d)];
            }
        }
}

// The rows' pairs in vectors equal the scalar interleave, on every ISA.
TEST(AttentionFast, PairKeyRowsMatchesRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(21);
  for (int64_t Dh : {32, 96, 512})
    for (int64_t np : {0, 1, 5}) {
      std::vector<uint16_t> rows(size_t(2 * np * Dh + 1));
      for (auto& v : rows) v = uint16_t(rng());
      std::vector<uint16_t> want(size_t(2 * np * Dh + 3), 7), got(want);
      pair_key_rows_ref(rows.data() + 1, np, Dh, want.data() + 1);
      for (Isa isa : machine_isas()) {
        set_cpu_isa(isa);
        std::fill(got.begin(), got.end(), uint16_t(7));
        pair_key_rows(rows.data() + 1, np, Dh, got.data() + 1);
        ASSERT_EQ(got, want) << isa_name(isa) << " Dh=" << Dh << " pairs=" << np;
      }
      for (int64_t p = 0; p < np; ++p)  // and the interleave itself
        for (int64_t d = 0; d < Dh; ++d) {
          ASSERT_EQ(want[size_t(1 + p * 2 * Dh + 2 * d)], rows[size_t(1 + 2 * p * Dh + d)]);
          ASSERT_EQ(want[size_t(1 + p * 2 * Dh + 2 * d + 1)],
                    rows[size_t(1 + (2 * p + 1) * Dh + d)]);
        }
    }
}

TEST(AttentionRef, CloseToExactFormula) {
  const int64_t H = 4, Dh = 64, nk = 150;
  const AttnInputs in = make_inputs(H, Dh, nk, true, 77);
  std::vector<float> ref(size_t(H * Dh)), exact(size_t(H * Dh));
  sparse_attention_ref(args_of(in, H, Dh, nk, false, ref.data()));
  SparseAttnArgs e = args_of(in, H, Dh, nk, false, exact.data());
  e.exact = true;
  sparse_attention_ref(e);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(ref[i], exact[i], 1e-5f * (1.0f + std::fabs(exact[i]))) << i;
}

}  // namespace
}  // namespace deepinfer::testing
