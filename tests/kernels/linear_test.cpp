// The fast linears against linear_*_ref (bit-exact) over formats, odd shapes and tails, output
// sub-ranges, strides, both paths, every ISA and several thread counts; and the reference
// itself against an independent double-precision evaluation.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <tuple>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "util/quant_qdq.h"

namespace deepinfer::testing {
namespace {

const char* fmt_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Fp8Block:
      return "fp8";
    case WeightFormat::Fp4Row:
      return "fp4";
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::F32:
      return "f32";
    default:
      return "?";
  }
}

struct Case {
  WeightFormat fmt;
  bool quant;
  int64_t rows, cols, n;
  int64_t row0 = 0, n_out = -1;
  int64_t pad_x = 0, pad_y = 0;
};

// Runs one case on every ISA, path and a few thread counts; each must equal the reference.
void check_case(const Case& c, uint64_t seed) {
  KernelEnvGuard guard;
  const OwnedWeight ow = make_weight(c.fmt, c.rows, c.cols, seed, c.quant);
  const PreparedLinear pw(ow.w);
  const int64_t n_out = c.n_out < 0 ? c.rows - c.row0 : c.n_out;
  const int64_t ldx = c.cols + c.pad_x, ldy = n_out + c.pad_y;
  const auto x =
      make_activations(c.n, c.cols, ldx, seed + 1, !c.quant && c.fmt != WeightFormat::F32);
  std::vector<float> want(size_t(c.n * ldy), -7.0f);
  const LinearArgs ref_args{x.data(), c.n, ldx, want.data(), ldy, c.row0, c.n_out};
  linear_ref(ow.w, ref_args);
  for (Isa isa : machine_isas())
    for (LinearProducts products : machine_products())
      for (LinearPath path : {LinearPath::Auto, LinearPath::Gemv, LinearPath::Gemm})
        for (int threads : {1, 2, 3}) {
          set_cpu_isa(isa);
          set_linear_products(products);
          set_linear_path(path);
          if (ThreadPool::global().size() != threads) ThreadPool::set_global_threads(threads);
          std::vector<float> got(size_t(c.n * ldy), -7.0f);  // sentinel in the padding
          const LinearArgs a{x.data(), c.n, ldx, got.data(), ldy, c.row0, c.n_out};
          linear(pw, a);
          const int64_t d = first_diff(want.data(), got.data(), int64_t(want.size()));
          ASSERT_EQ(d, -1) << fmt_name(c.fmt) << (c.quant ? " quant" : " dense") << " " << c.rows
                           << "x" << c.cols << " n=" << c.n << " rows [" << c.row0 << "+" << n_out
                           << "] isa=" << isa_name(isa) << " products=" << int(products)
                           << " path=" << int(path) << " threads=" << threads << ": element " << d
                           << " (row " << d / ldy << ", col " << d % ldy << ") ref "
                           << want[size_t(d)] << " got " << got[size_t(d)];
        }
}

// A batch of calls (the experts of a decode step: mixed formats, shapes, row counts, output
// ranges and strides, GEMV-sized and larger, quantized and plain, some reading the previous
// call's input as an expert's w1 and w3 do) gives each call exactly what linear_ref gives it, on
// every ISA and thread count.
TEST(LinearFast, ManyMatchesEachCall) {
  KernelEnvGuard guard;
  struct Spec {
    WeightFormat fmt;
    int64_t rows, cols, n, row0, n_out, pad_x, pad_y;
    bool quant = true;    // Weight::quant_input: QLin, else the plain linear
    bool same_x = false;  // reads the previous call's input (the same pointer)
    bool bf16_x = false;  // inputs that are bf16 values (plain calls take bf16 products then)
  };
  const std::vector<Spec> specs = {
      {WeightFormat::Fp4Row, 96, 256, 1, 0, -1, 0, 0},
      {WeightFormat::Fp4Row, 96, 256, 1, 0, -1, 32, 3},  // same weight shape, other input
      {WeightFormat::Fp8Block, 70, 160, 3, 5, 50, 0, 1},
      {WeightFormat::BF16, 40, 64, 1, 0, -1, 0, 0, false},  // plain linears among the QLins
      {WeightFormat::Fp4Row, 17, 64, 4, 0, -1, 0, 0},
      {WeightFormat::Fp4Row, 33, 64, 4, 0, -1, 0, 0, true, true},    // shares its quantization
      {WeightFormat::Fp8Block, 20, 64, 4, 0, -1, 0, 0, true, true},  // same input, other layout
      {WeightFormat::Fp8Block, 256, 96, 2, 0, -1, 0, 0},
      {WeightFormat::F32, 20, 96, 2, 3, 10, 0, 2, false},
      {WeightFormat::Fp8Block, 64, 64, 1, 0, -1, 0, 0, false},  // fp8 values, input unquantized
      // More rows: with AMX tiles quantized calls of up to 256 rows join the shared pass (a
      // prefill's experts, w1 and w3 sharing their quantization; beyond 64 rows in groups over
      // runs of tiles), others take the single-call path.
      {WeightFormat::Fp4Row, 48, 128, 9, 0, -1, 0, 0},
      {WeightFormat::Fp4Row, 40, 128, 40, 0, -1, 0, 0},
      {WeightFormat::Fp4Row, 56, 128, 40, 0, -1, 0, 0, true, true},
      {WeightFormat::Fp8Block, 48, 96, 64, 0, -1, 0, 2},
      {WeightFormat::Fp4Row, 32, 64, 70, 0, -1, 0, 0},
      {WeightFormat::Fp4Row, 2100, 1024, 70, 0, -1, 0, 0},  // several runs of tiles a task
      {WeightFormat::Fp4Row, 32, 64, 260, 0, -1, 0, 0},
      {WeightFormat::Fp8Block, 33, 32, 1, 0, -1, 0, 0},
      // fp8 calls of up to two groups of rows and plain bf16 ones of up to four stay on the GEMV
      // in the shared pass, the groups over runs of tiles (a batch's shared expert).
      {WeightFormat::Fp8Block, 600, 1024, 16, 0, -1, 0, 0},
      {WeightFormat::Fp8Block, 48, 96, 13, 0, -1, 0, 1},
      {WeightFormat::BF16, 40, 64, 20, 0, -1, 0, 0, false, false, true},
      // The output projection's groups: plain fp8, bf16 inputs, a range of rows each.
      {WeightFormat::Fp8Block, 64, 256, 1, 0, 32, 0, 0, false, false, true},
      {WeightFormat::Fp8Block, 64, 256, 1, 32, 32, 256, 64, false, false, true},
      {WeightFormat::BF16, 40, 64, 2, 0, -1, 0, 0, false, false, true},
  };
  std::vector<OwnedWeight> ws;
  std::vector<PreparedLinear> pws;
  std::vector<std::vector<float>> xs, want;
  std::vector<int64_t> ldy;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    ws.push_back(make_weight(s.fmt, s.rows, s.cols, 40 + i, s.quant));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    pws.emplace_back(ws[i].w);
    xs.push_back(s.same_x ? xs.back()
                          : make_activations(s.n, s.cols, s.cols + s.pad_x, 90 + i, s.bf16_x));
    const int64_t n_out = s.n_out < 0 ? s.rows - s.row0 : s.n_out;
    ldy.push_back(n_out + s.pad_y);
    want.emplace_back(size_t(s.n * ldy[i]), -7.0f);
    const LinearArgs a{xs[i].data(), s.n,    s.cols + s.pad_x, want[i].data(),
                       ldy[i],       s.row0, s.n_out};  // (a copy of the shared input)
    linear_ref(ws[i].w, a);
  }
  for (Isa isa : machine_isas())
    for (LinearProducts products : machine_products())
      for (int threads : {1, 2, 3}) {
        set_cpu_isa(isa);
        set_linear_products(products);
        if (ThreadPool::global().size() != threads) ThreadPool::set_global_threads(threads);
        std::vector<std::vector<float>> got;
        std::vector<LinearCall> calls;
        for (size_t i = 0; i < specs.size(); ++i) got.emplace_back(want[i].size(), -7.0f);
        for (size_t i = 0; i < specs.size(); ++i) {
          const Spec& s = specs[i];
          size_t src = i;  // the call whose input this one reads
          while (specs[src].same_x) --src;
          calls.push_back(
              {&pws[i],
               {xs[src].data(), s.n, s.cols + s.pad_x, got[i].data(), ldy[i], s.row0, s.n_out}});
        }
        linear_many(calls);
        for (size_t i = 0; i < specs.size(); ++i)
          ASSERT_EQ(first_diff(want[i].data(), got[i].data(), int64_t(want[i].size())), -1)
              << "call " << i << " isa=" << isa_name(isa) << " products=" << int(products)
              << " threads=" << threads;
      }
}

// LinearArgs::round_bf16 rounds exactly what the call wrote, as a pass after it would: on every
// ISA and path (GEMVs of 1 to 64 rows, the GEMM, linear_many's shared pass, the reference), for
// a range of output rows into a strided output whose padding stays untouched.
TEST(LinearFast, RoundedOutputsMatchARoundingPass) {
  KernelEnvGuard guard;
  struct Spec {
    WeightFormat fmt;
    int64_t rows, cols, n, row0, n_out;
    bool quant;
  };
  const std::vector<Spec> specs = {
      {WeightFormat::Fp8Block, 96, 256, 1, 0, -1, true},
      {WeightFormat::Fp4Row, 80, 128, 4, 16, 40, true},
      {WeightFormat::BF16, 64, 96, 16, 0, -1, false},
      {WeightFormat::Fp4Row, 64, 128, 64, 0, -1, true},
      {WeightFormat::Fp8Block, 200, 128, 70, 8, 150, true},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    const OwnedWeight w = make_weight(s.fmt, s.rows, s.cols, 700 + i, s.quant);
    const PreparedLinear pw(w.w);
    const std::vector<float> x = make_activations(s.n, s.cols, s.cols, 800 + i, !s.quant);
    const int64_t n_out = s.n_out < 0 ? s.rows - s.row0 : s.n_out, ldy = n_out + 5;
    for (Isa isa : machine_isas()) {
      set_cpu_isa(isa);
      std::vector<float> want(size_t(s.n * ldy), -7.0f), got = want, many = want;
      linear(pw, {x.data(), s.n, s.cols, want.data(), ldy, s.row0, s.n_out});
      for (int64_t r = 0; r < s.n; ++r) round_bf16_inplace(want.data() + r * ldy, n_out);
      linear(pw, {x.data(), s.n, s.cols, got.data(), ldy, s.row0, s.n_out, false, true});
      ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
          << "spec " << i << " isa " << isa_name(isa);
      // In linear_many, beside a call that does not round.
      std::vector<float> plain(size_t(s.n * ldy), -7.0f), plain_want = plain;
      linear(pw, {x.data(), s.n, s.cols, plain_want.data(), ldy, s.row0, s.n_out});
      const LinearCall calls[] = {
          {&pw, {x.data(), s.n, s.cols, plain.data(), ldy, s.row0, s.n_out}},
          {&pw, {x.data(), s.n, s.cols, many.data(), ldy, s.row0, s.n_out, false, true}}};
      linear_many(calls);
      ASSERT_EQ(first_diff(want.data(), many.data(), int64_t(want.size())), -1)
          << "spec " << i << " isa " << isa_name(isa) << " (linear_many)";
      ASSERT_EQ(first_diff(plain_want.data(), plain.data(), int64_t(plain.size())), -1)
          << "spec " << i << " isa " << isa_name(isa) << " (linear_many, not rounded)";
    }
  }
}

// The rounding as the kernels store their outputs keeps the rounding pass's special values: a
// NaN stays a NaN (quieted, its payload truncated), infinities stay, and a value at the top of
// the fp32 range rounds up to infinity. Fp32 weights (any value) on every ISA and path.
TEST(LinearFast, RoundedSpecialOutputsMatchARoundingPass) {
  KernelEnvGuard guard;
  const int64_t rows = 48, K = 64;
  std::vector<float> wv(size_t(rows * K), 0.0f);
  wv[0] = std::bit_cast<float>(0x7fffffffu);                  // NaN: rounding its bits would carry
  for (int64_t k = 0; k < K; ++k) wv[size_t(K + k)] = 3e38f;  // +inf
  wv[size_t(2 * K)] = std::bit_cast<float>(0x7f7f8000u);      // a tie: up to inf
  wv[size_t(3 * K)] = -std::bit_cast<float>(0x7f7f7fffu);     // rounds down
  wv[size_t(4 * K)] = std::bit_cast<float>(0x00012345u);      // subnormal
  for (int64_t o = 5; o < rows; ++o) wv[size_t(o * K + o % K)] = float(o) * 1.001f;
  Weight w;
  w.name = "special outputs";
  w.shape = Shape{rows, K};
  w.format = WeightFormat::F32;
  w.data = wv.data();
  const PreparedLinear pw(w);
  for (int64_t n : {1, 20}) {
    const std::vector<float> x(size_t(n * K), 1.0f);
    for (Isa isa : machine_isas())
      for (LinearPath path : {LinearPath::Gemv, LinearPath::Gemm}) {
        set_cpu_isa(isa);
        set_linear_path(path);
        std::vector<float> want(size_t(n * rows)), got(want.size());
        linear(pw, {x.data(), n, K, want.data(), rows});
        round_bf16_inplace(want.data(), int64_t(want.size()));
        linear(pw, {x.data(), n, K, got.data(), rows, 0, -1, false, true});
        ASSERT_TRUE(std::isnan(want[0]) && std::isinf(want[1]) && std::isinf(want[2]));
        ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
            << "n=" << n << " isa " << isa_name(isa) << " path " << int(path);
      }
  }
}

// LinearArgs::x_rows (a QLin call's input rows by pointer) gives what the same rows copied into
// one contiguous input give: on every ISA and path, one call and two sharing their quantization
// in linear_many, and the exact reference; a plain weight refuses rows by pointer.
TEST(LinearFast, InputRowsByPointerMatchACopy) {
  KernelEnvGuard guard;
  for (WeightFormat fmt : {WeightFormat::Fp4Row, WeightFormat::Fp8Block})
    for (int64_t n : {1, 4, 16, 70}) {
      const int64_t K = 256, rows = 96;
      const OwnedWeight w = make_weight(fmt, rows, K, 900 + n, true);
      const PreparedLinear pw(w.w);
      const std::vector<float> src = make_activations(3 * n, K, K, 950 + n, false);
      std::vector<const float*> ptr(static_cast<size_t>(n));
      std::vector<float> copy(static_cast<size_t>(n * K));
      for (int64_t i = 0; i < n; ++i) {  // rows of src out of order
        ptr[size_t(i)] = src.data() + ((i * 7) % (3 * n)) * K;
        std::copy_n(ptr[size_t(i)], K, copy.data() + i * K);
      }
      for (Isa isa : machine_isas())
        for (bool exact : {false, true}) {
          set_cpu_isa(isa);
          std::vector<float> want(size_t(n * rows)), got(want.size()), got2(want.size());
          linear(pw, {copy.data(), n, K, want.data(), rows, 0, -1, exact});
          LinearArgs a{nullptr, n, K, got.data(), rows, 0, -1, exact};
          a.x_rows = ptr.data();
          linear(pw, a);
          ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
              << isa_name(isa) << " n=" << n << " exact " << exact;
          std::fill(got.begin(), got.end(), -1.0f);
          LinearArgs b = a;
          b.y = got2.data();
          const LinearCall calls[] = {{&pw, a}, {&pw, b}};
          linear_many(calls);
          ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
              << isa_name(isa) << " n=" << n << " exact " << exact << " (linear_many)";
          ASSERT_EQ(first_diff(want.data(), got2.data(), int64_t(want.size())), -1)
              << isa_name(isa) << " n=" << n << " exact " << exact << " (linear_many, shared)";
        }
    }
  const OwnedWeight plain = make_weight(WeightFormat::BF16, 32, 64, 5, false);
  const PreparedLinear pp(plain.w);
  const std::vector<float> x(64, 1.0f);
  const float* row = x.data();
  std::vector<float> y(32);
  LinearArgs a{nullptr, 1, 64, y.data(), 32};
  a.x_rows = &row;
  EXPECT_ANY_THROW(linear(pp, a));
}

// The experts of a prefill: calls over rows of one source by pointer, each row routed to several
// of them (linear_many quantizes such rows once, into a bank the calls copy from), among calls
// of another input width and a call reading contiguous rows. Each gets what linear gives it
// alone, on every ISA and thread count.
TEST(LinearFast, ManyCallsSharingRowsByPointer) {
  KernelEnvGuard guard;
  const int64_t K = 128, K2 = 96, n_src = 40;
  const std::vector<float> src = make_activations(n_src, K, K, 77, false);
  const std::vector<float> src2 = make_activations(n_src, K2, K2, 78, false);
  struct Spec {
    WeightFormat fmt;
    int64_t rows, k, n, step, first;  // rows i of the call: source row (first + i * step) % n_src
  };
  const std::vector<Spec> specs = {
      {WeightFormat::Fp4Row, 48, K, 30, 3, 0},    {WeightFormat::Fp4Row, 48, K, 30, 3, 0},
      {WeightFormat::Fp8Block, 32, K, 17, 7, 5},  {WeightFormat::Fp4Row, 64, K2, 20, 1, 3},
      {WeightFormat::Fp4Row, 40, K, 70, 11, 2},   {WeightFormat::Fp4Row, 16, K, 1, 1, 9},
      {WeightFormat::Fp8Block, 48, K, -25, 0, 0},  // contiguous rows (n = 25)
  };
  std::vector<OwnedWeight> ws;
  std::vector<PreparedLinear> pws;
  std::vector<std::vector<const float*>> ptrs;
  std::vector<std::vector<float>> want;
  for (size_t c = 0; c < specs.size(); ++c) {
    const Spec& s = specs[c];
    ws.push_back(make_weight(s.fmt, s.rows, s.k, 300 + c, true));
  }
  for (size_t c = 0; c < specs.size(); ++c) {
    const Spec& s = specs[c];
    pws.emplace_back(ws[c].w);
    const float* base = s.k == K ? src.data() : src2.data();
    ptrs.emplace_back();
    for (int64_t i = 0; i < std::abs(s.n); ++i)
      ptrs.back().push_back(base + ((s.first + i * s.step) % n_src) * s.k);
  }
  auto args = [&](size_t c, float* y) {
    const Spec& s = specs[c];
    if (s.n < 0) return LinearArgs{src.data(), -s.n, K, y, s.rows};
    LinearArgs a{nullptr, s.n, s.k, y, s.rows};
    a.x_rows = ptrs[c].data();
    return a;
  };
  for (size_t c = 0; c < specs.size(); ++c) {
    want.emplace_back(size_t(std::abs(specs[c].n) * specs[c].rows));
    linear_ref(ws[c].w, args(c, want.back().data()));
  }
  for (Isa isa : machine_isas())
    for (int threads : {1, 2, 3}) {
      set_cpu_isa(isa);
      if (ThreadPool::global().size() != threads) ThreadPool::set_global_threads(threads);
      std::vector<std::vector<float>> got;
      std::vector<LinearCall> calls;
      for (size_t c = 0; c < specs.size(); ++c) got.emplace_back(want[c].size(), -7.0f);
      for (size_t c = 0; c < specs.size(); ++c) calls.push_back({&pws[c], args(c, got[c].data())});
      linear_many(calls);
      for (size_t c = 0; c < specs.size(); ++c)
        ASSERT_EQ(first_diff(want[c].data(), got[c].data(), int64_t(want[c].size())), -1)
            << "call " << c << " isa=" << isa_name(isa) << " threads=" << threads;
    }
}

TEST(LinearFast, QuantSweepMatchesRef) {
  uint64_t seed = 1;
  for (WeightFormat f : {WeightFormat::Fp8Block, WeightFormat::Fp4Row})
    for (int64_t cols : {32, 64, 96, 160, 288})
      for (int64_t rows : {1, 15, 16, 17, 47, 50, 96})
        for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 17}) check_case({f, true, rows, cols, n}, seed++);
}

TEST(LinearFast, DenseSweepMatchesRef) {
  uint64_t seed = 1000;
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F32, WeightFormat::Fp8Block})
    for (int64_t cols : {32, 96, 256})
      for (int64_t rows : {1, 16, 33, 70})
        for (int64_t n : {1, 3, 4, 6, 13}) check_case({f, false, rows, cols, n}, seed++);
}

TEST(LinearFast, GemvRunsForSeveralRowGroupsMatchRef) {
  // Tiles of 64 KiB: the GEMV's tasks are runs of 4 tiles, each taken for every group of 8 rows
  // in turn (and Auto keeps a plain bf16 weight on the GEMV up to 32 rows, fp8 up to 16).
  uint64_t seed = 3000;
  for (int64_t n : {9, 20, 32, 33}) check_case({WeightFormat::BF16, false, 100, 2048, n}, seed++);
  for (int64_t n : {16, 17}) check_case({WeightFormat::Fp8Block, true, 100, 2048, n}, seed++);
  check_case({WeightFormat::Fp8Block, false, 100, 2048, 16}, seed++);  // wo_a: plain fp8
}

TEST(LinearFast, DenseSweepWithOtherSeedsMatchesRef) {
  // The dense sweep's shapes again with other inputs: among them products below fp32's normal
  // range, which the canonical fused steps keep exactly (a rounded product would not).
  uint64_t seed = 1006;
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F32, WeightFormat::Fp8Block})
    for (int64_t cols : {32, 96, 256})
      for (int64_t rows : {1, 16, 33, 70})
        for (int64_t n : {1, 3, 4, 6, 8, 13}) check_case({f, false, rows, cols, n}, seed++);
}

TEST(LinearFast, EightRowGemvMatchesRef) {
  // Up to 8 rows per GEMV call (a verify step of speculative decoding): every row count, both
  // quantized formats and the dense ones.
  uint64_t seed = 5000;
  for (WeightFormat f : {WeightFormat::Fp8Block, WeightFormat::Fp4Row})
    for (int64_t n = 5; n <= 8; ++n) check_case({f, true, 47, 160, n}, seed++);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::Fp8Block})
    for (int64_t n = 5; n <= 8; ++n) check_case({f, false, 33, 96, n}, seed++);
}

TEST(LinearFast, SubRangesAndStrides) {
  uint64_t seed = 2000;
  for (WeightFormat f : {WeightFormat::Fp8Block, WeightFormat::Fp4Row})
    for (auto [row0, n_out] :
         {std::pair<int64_t, int64_t>{0, 5}, {3, 20}, {17, 31}, {32, 64}, {50, 14}, {63, 1}})
      for (int64_t n : {1, 4, 11}) check_case({f, true, 96, 128, n, row0, n_out, 7, 5}, seed++);
  for (auto [row0, n_out] : {std::pair<int64_t, int64_t>{0, 32}, {32, 32}, {9, 40}})
    check_case({WeightFormat::Fp8Block, false, 96, 64, 5, row0, n_out, 32, 3}, seed++);
}

TEST(LinearFast, LargerShapesMatchRef) {
  // Several K-chunks of the GEMM and many panels, with rows that are not a multiple of the
  // micro-kernel height.
  check_case({WeightFormat::Fp8Block, true, 200, 1056, 37}, 3001);
  check_case({WeightFormat::Fp4Row, true, 150, 800, 29}, 3002);
  check_case({WeightFormat::BF16, false, 130, 544, 21}, 3003);
  // The GEMM on AMX tiles: pairs of row groups against pairs of tiles, a last single group,
  // panels of odd widths.
  check_case({WeightFormat::Fp8Block, true, 200, 1056, 100}, 3008);
  check_case({WeightFormat::Fp4Row, true, 150, 800, 97}, 3009);
  check_case({WeightFormat::Fp8Block, true, 64, 4096, 2}, 3004);
  // One group of rows over a weight split between the threads.
  check_case({WeightFormat::Fp8Block, true, 64, 4096, 1}, 3005);
  check_case({WeightFormat::Fp4Row, true, 96, 4096, 1}, 3006);
  check_case({WeightFormat::Fp4Row, true, 96, 4096, 5}, 3007);
}

TEST(LinearFast, RowsAreIndependentOfBatch) {
  // Batch invariance at the kernel level: a row's outputs are the same alone and among others,
  // whatever the path the batch size selects.
  KernelEnvGuard guard;
  const OwnedWeight ow = make_weight(WeightFormat::Fp4Row, 80, 320, 7, true);
  const PreparedLinear pw(ow.w);
  const int64_t n = 20;
  const auto x = make_activations(n, 320, 320, 8, false);
  for (Isa isa : machine_isas()) {
    set_cpu_isa(isa);
    std::vector<float> all(size_t(n * 80));
    linear(pw, x.data(), n, all.data());
    for (int64_t take : {1, 2, 4, 7}) {
      for (int64_t r0 = 0; r0 + take <= n; r0 += take) {
        std::vector<float> part(size_t(take * 80));
        linear(pw, x.data() + r0 * 320, take, part.data());
        ASSERT_TRUE(bit_equal(part.data(), all.data() + r0 * 80, take * 80))
            << isa_name(isa) << " rows " << r0 << "+" << take;
      }
    }
  }
}

// A QLin fp4 weight over the given codes (two per byte) and e8m0 scales (one per 32 inputs).
Weight fp4_codes(const char* name, int64_t rows, int64_t K, const std::vector<uint8_t>& codes,
                 const std::vector<uint8_t>& scales) {
  Weight w;
  w.name = name;
  w.shape = Shape{rows, K};
  w.format = WeightFormat::Fp4Row;
  w.quant_input = true;
  w.data = codes.data();
  w.scale = scales.data();
  w.scale_cols = K / 32;
  return w;
}

// linear(pw) of the n rows x on every ISA, products choice and given path gives `want`.
void expect_every_path(const PreparedLinear& pw, const std::vector<float>& x, int64_t n,
                       const std::vector<float>& want, std::initializer_list<LinearPath> paths,
                       const std::string& what) {
  std::vector<float> got(want.size());
  for (Isa isa : machine_isas())
    for (LinearProducts products : machine_products())
      for (LinearPath path : paths) {
        set_cpu_isa(isa);
        set_linear_products(products);
        set_linear_path(path);
        std::fill(got.begin(), got.end(), -7.0f);
        linear(pw, x.data(), n, got.data());
        ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
            << what << " " << isa_name(isa) << " products=" << int(products)
            << " path=" << int(path);
      }
}

TEST(LinearFast, RoundingBlocksMatchRefOnEveryProductPath) {
  // Blocks whose partial rounds differently in another order: 30 products 448 x 6 (a sum above
  // 2^16, where the fp32 step is 2^-7), then two of 3·2^-9 x 0.5, each below half a step (lost
  // one at a time in their chains) but not together. Such a block is not integers within 16
  // bits: the integer products leave it to FMAs; a GEMM of 40 rows runs groups of 16 and a tail.
  KernelEnvGuard guard;
  const int64_t n = 40, K = 256, rows = 48;
  std::vector<uint8_t> codes(size_t(rows * K / 2), 0x77), scales(size_t(rows * K / 32), 127);
  for (size_t b = 15; b < codes.size(); b += 16) codes[b] = 0x11;  // inputs 30, 31: 0.5
  const Weight w = fp4_codes("fp4 6 and 0.5", rows, K, codes, scales);
  const PreparedLinear pw(w);
  std::vector<float> x(size_t(n * K));
  for (size_t k = 0; k < x.size(); ++k) x[k] = k % 32 < 30 ? 448.0f : 3 * 0x1p-9f;
  for (int64_t i = 1; i < n; i += 2) x[size_t(i * K + 3)] = 224.0f;  // rows differ
  std::vector<float> want(size_t(n * rows));
  linear_ref(w, {x.data(), n, K, want.data(), rows});
  expect_every_path(pw, x, n, want, {LinearPath::Gemv, LinearPath::Gemm}, "fp4 6 and 0.5");
}

TEST(LinearFast, EveryPathSumsABlockInTwoChains) {
  // Each block: input 0 times weight 0 is large (P), every other product small (q, below half
  // of P's fp32 step). The even chain loses its 15 q's to P, the odd chain keeps its 16: the
  // partial is P + 16q. One chain in the pair order (odd first) gives P, one rounding of the
  // whole sum P + 31q rounds elsewhere again. Formats: fp8 and fp4 weights with quantized
  // inputs, bf16 and f32 weights with dense ones; 1 to 40 rows, so that every GEMV and GEMM
  // path (tiles, vdpbf16ps, FMAs, integers around a non-integer block) runs.
  KernelEnvGuard guard;
  const int64_t K = 64, rows = 48;
  struct Fmt {
    WeightFormat f;
    float big_x, big_w, small_x, small_w, want;
  };
  // fp8: P = 448·448, q = 2^-8: 2·(P + 2^-4). fp4: even products 448·6, odd ones 2^-9·0.5: the
  // even chain is exact (16·2688), the odd chain too, the pair order loses odd products once
  // the sum passes 2^14.
  const Fmt fmts[] = {
      {WeightFormat::Fp8Block, 448.0f, 448.0f, 0x1p-4f, 0x1p-4f, 2 * (200704.0f + 0x1p-4f)},
      {WeightFormat::BF16, 448.0f, 448.0f, 0x1p-4f, 0x1p-4f, 2 * (200704.0f + 0x1p-4f)},
      {WeightFormat::F32, 448.0f, 448.0f, 0x1p-4f, 0x1p-4f, 2 * (200704.0f + 0x1p-4f)},
      {WeightFormat::Fp4Row, 448.0f, 6.0f, 0x1p-9f, 0.5f, 2 * (43008.0f + 0x1p-6f)}};
  for (const Fmt& fm : fmts) {
    const bool fp4 = fm.f == WeightFormat::Fp4Row;
    std::vector<uint8_t> u8(size_t(rows * K)), scales(size_t(rows * K / 32), 127);
    std::vector<uint16_t> b16(size_t(rows * K));
    std::vector<float> f32(size_t(rows * K));
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t k = 0; k < K; ++k) {
        // fp4: every even input is large, every odd one small (a block of 30 large products
        // would leave the integer range, so the pair order shows through the odd inputs).
        const bool big = fp4 ? k % 2 == 0 : k % 32 == 0;
        const float v = big ? fm.big_w : fm.small_w;
        const size_t at = size_t(o * K + k);
        f32[at] = v;
        b16[at] = uint16_t(__builtin_bit_cast(uint32_t, v) >> 16);
        u8[at] = big ? 0x7e : 0x18;                 // e4m3 448 and 2^-4
        if (fp4) u8[size_t(o * K + k) / 2] = 0x17;  // e2m1 6 (even input), 0.5 (odd)
      }
    Weight w;
    w.name = "two chains";
    w.shape = Shape{rows, K};
    w.format = fm.f;
    w.quant_input = fm.f == WeightFormat::Fp8Block || fp4;
    w.data = fm.f == WeightFormat::BF16  ? static_cast<const void*>(b16.data())
             : fm.f == WeightFormat::F32 ? static_cast<const void*>(f32.data())
                                         : static_cast<const void*>(u8.data());
    if (w.quant_input) {
      w.scale = scales.data();
      w.scale_cols = K / 32;
    }
    const PreparedLinear pw(w);
    for (int64_t n : {1, 2, 5, 8, 16, 20, 40}) {
      std::vector<float> x(size_t(n * K));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < K; ++k)
          x[size_t(i * K + k)] = (fp4 ? k % 2 == 0 : k % 32 == 0) ? fm.big_x : fm.small_x;
      std::vector<float> want(size_t(n * rows));
      linear_ref(w, {x.data(), n, K, want.data(), rows});
      ASSERT_EQ(want[0], fm.want) << fmt_name(fm.f);
      expect_every_path(pw, x, n, want, {LinearPath::Auto, LinearPath::Gemv, LinearPath::Gemm},
                        std::string(fmt_name(fm.f)) + " n=" + std::to_string(n));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(LinearFast, BlocksOfTinyAndHugeScalesOnEveryPath) {
  // The AMX kernels pack weights times their block scales, which keeps every value normal for
  // scales 2^-86 .. 2^100; a weight with other scales (2^-107, 2^108 here, among ordinary ones)
  // must stay off the tiles (PackedWeight::foldable_scales). fp8 and fp4 weights; 1, 5 and 40 rows
  // (two groups of 16 and a tail), GEMV and GEMM.
  KernelEnvGuard guard;
  const int64_t rows = 64, K = 256;
  for (WeightFormat f : {WeightFormat::Fp8Block, WeightFormat::Fp4Row}) {
    OwnedWeight ow = make_weight(f, rows, K, 11, true);
    for (size_t i = 0; i < ow.scale.size(); i += 3) ow.scale[i] = i % 2 ? 20 : 235;
    ow.w.scale = ow.scale.data();
    const PreparedLinear pw(ow.w);
    for (int64_t n : {1, 5, 40}) {
      const auto x = make_activations(n, K, K, 12, false);
      std::vector<float> want(size_t(n * rows));
      linear_ref(ow.w, {x.data(), n, K, want.data(), rows});
      expect_every_path(pw, x, n, want, {LinearPath::Gemv, LinearPath::Gemm},
                        std::string(fmt_name(f)) + " n=" + std::to_string(n));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(LinearFast, TinyInputBlocksAgainstTheLeastFoldableScale) {
  // fp4's integer products scale a block's integer sum S by 2^(E-1) · ws in one step, the two
  // powers of two multiplied by adding exponents, which holds while that product is normal: with
  // scales down to 2^-86 (the least a weight of quantized inputs folds), only for blocks with
  // 2^(E-1) >= 2^-40. Input blocks here step down by 2^-6 each (block 0 about 1, block 15 about
  // 2^-90), nearly all of them integers within 16 bits, so that blocks on both sides of that bound
  // meet weights at 2^-86 and at 2^-40; 1 to 8 rows, each row's blocks shifted by one more.
  KernelEnvGuard guard;
  const int64_t rows = 32, K = 512;
  OwnedWeight ow = make_weight(WeightFormat::Fp4Row, rows, K, 31, true);
  for (size_t i = 0; i < ow.scale.size(); ++i) ow.scale[i] = i % 2 ? 127 - 86 : 127 - 40;
  ow.w.scale = ow.scale.data();
  const PreparedLinear pw(ow.w);
  EXPECT_TRUE(pw.packed().foldable_scales);
  for (int64_t n = 1; n <= 8; ++n) {
    std::vector<float> x = make_activations(n, K, K, 32, false);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < K; ++k)
        x[size_t(i * K + k)] = std::ldexp(x[size_t(i * K + k)], -6 * int((k / 32 + i) % 16));
    std::vector<float> want(size_t(n * rows));
    linear_ref(ow.w, {x.data(), n, K, want.data(), rows});
    expect_every_path(pw, x, n, want, {LinearPath::Gemv}, "n=" + std::to_string(n));
    if (HasFatalFailure()) return;
  }
}

TEST(LinearFast, DenseInputsAtTheFloorKeepSmallScalesApart) {
  // Packed times a block scale of 2^-62, e4m3's least code (2^-9) is still a normal bf16, but its
  // product with a dense bf16 input at the bf16 products' floor (2^-56) is 2^-127: subnormal,
  // which vdpbf16ps and the tiles flush. A weight of dense inputs folds its scales only from
  // 2^-54 on (PackedWeight::foldable_scales); the reference keeps the subnormal sums.
  KernelEnvGuard guard;
  const int64_t rows = 64, K = 256;
  OwnedWeight ow = make_weight(WeightFormat::Fp8Block, rows, K, 21, false);
  std::fill(ow.data.begin(), ow.data.end(), uint8_t(0x01));
  std::fill(ow.scale.begin(), ow.scale.end(), uint8_t(127 - 62));
  ow.w.scale = ow.scale.data();
  const PreparedLinear pw(ow.w);
  EXPECT_FALSE(pw.packed().foldable_scales);
  for (int64_t n : {1, 5, 40}) {
    const std::vector<float> x(size_t(n * K), 0x1p-56f);
    std::vector<float> want(size_t(n * rows));
    linear_ref(ow.w, {x.data(), n, K, want.data(), rows});
    ASSERT_EQ(want[0], 0x1p-127f * float(K));
    expect_every_path(pw, x, n, want, {LinearPath::Auto, LinearPath::Gemv, LinearPath::Gemm},
                      "n=" + std::to_string(n));
    if (HasFatalFailure()) return;
  }
}

TEST(LinearFast, PairOrderInANonIntegerBlockAmongIntegerRows) {
  // Rows whose block is not integers within 16 bits take fp32 fused steps in the two chains
  // while the other rows of the call multiply integers: 28 products of 448 x 6, then inputs 28
  // (3·2^-9 x 1) and 29 (-2^-8 x 1), small against the sum's step; the second block has the
  // same pair at its inputs 30 and 31, after 30 large products.
  KernelEnvGuard guard;
  const int64_t K = 64, rows = 32;
  std::vector<uint8_t> codes(size_t(rows * K / 2), 0x77), scales(size_t(rows * K / 32), 127);
  for (int64_t o = 0; o < rows; ++o) {
    codes[size_t(o * K / 2 + 14)] = 0x22;  // inputs 28, 29: weights 1
    codes[size_t(o * K / 2 + 31)] = 0x22;  // inputs 62, 63
  }
  const Weight w = fp4_codes("fp4 6 and 1", rows, K, codes, scales);
  const PreparedLinear pw(w);
  for (int64_t n = 1; n <= 8; ++n) {
    std::vector<float> x(size_t(n * K), 448.0f);
    for (int64_t i = 0; i < n; i += 2)  // even rows: the pairs (odd rows: integers)
      for (int64_t k : {28, 62}) {
        x[size_t(i * K + k)] = 3 * 0x1p-9f;
        x[size_t(i * K + k + 1)] = -0x1p-8f;
      }
    std::vector<float> want(size_t(n * rows)), got(want.size());
    linear_ref(w, {x.data(), n, K, want.data(), rows});
    for (Isa isa : machine_isas())
      for (LinearProducts products : machine_products()) {
        set_cpu_isa(isa);
        set_linear_products(products);
        set_linear_path(LinearPath::Gemv);
        std::fill(got.begin(), got.end(), -7.0f);
        linear(pw, x.data(), n, got.data());
        ASSERT_EQ(first_diff(want.data(), got.data(), int64_t(want.size())), -1)
            << isa_name(isa) << " products=" << int(products) << " n=" << n;
      }
  }
}

// The reference against double precision from the spec's definitions (dequantized weights,
// act_quant QDQ inputs): a few fp32 ulps of the sum of magnitudes.
TEST(LinearRef, MatchesDoublePrecision) {
  for (WeightFormat f : {WeightFormat::Fp8Block, WeightFormat::Fp4Row, WeightFormat::BF16}) {
    const bool quant = f != WeightFormat::BF16;
    const int64_t rows = 40, cols = 256, n = 3;
    const OwnedWeight ow = make_weight(f, rows, cols, 11, quant);
    const auto x = make_activations(n, cols, cols, 12, !quant);
    std::vector<float> y(size_t(n * rows));
    const LinearArgs args{x.data(), n, cols, y.data(), rows};
    linear_ref(ow.w, args);
    std::vector<float> wrow(static_cast<size_t>(cols)), xq(static_cast<size_t>(cols));
    for (int64_t i = 0; i < n; ++i) {
      std::copy(x.begin() + i * cols, x.begin() + (i + 1) * cols, xq.begin());
      if (quant) act_quant_qdq(xq.data(), cols);
      for (int64_t o = 0; o < rows; ++o) {
        weight_row(ow.w, o, wrow.data());
        double s = 0, mag = 0;
        for (int64_t k = 0; k < cols; ++k) {
          s += double(xq[size_t(k)]) * wrow[size_t(k)];
          mag += std::fabs(double(xq[size_t(k)]) * wrow[size_t(k)]);
        }
        EXPECT_NEAR(y[size_t(i * rows + o)], s, mag * 64 * 0x1p-24 + 1e-30)
            << fmt_name(f) << " row " << i << " out " << o;
      }
    }
  }
}

// The vector act_quant QDQ used inside the fast linears equals act_quant_qdq, and its bf16 copy
// is exact.
TEST(LinearFast, ActQuantMatchesRef) {
  const int64_t K = 32 * 64, n = 24;
  const auto x = make_activations(n, K, K, 21, false);
  std::vector<float> want(x);
  for (int64_t i = 0; i < n; ++i) act_quant_qdq(want.data() + i * K, K);
  for (Isa isa : machine_isas()) {
    if (isa == Isa::Scalar) continue;
    const auto& k = isa == Isa::Avx512 ? linear_isa::kAvx512 : linear_isa::kAvx2;
    std::vector<float> q(size_t(n * K));
    const int64_t ldb = linear_isa::xb_stride(K);  // (the bf16 copy's rows, padded)
    std::vector<uint16_t> qb(size_t(n * ldb));
    k.quantize(x.data(), K, n, K, q.data(), qb.data());
    EXPECT_EQ(first_diff(want.data(), q.data(), n * K), -1) << isa_name(isa);
    for (int64_t i = 0; i < n * K; ++i)
      ASSERT_EQ(bf16_to_f32(qb[size_t(i / K * ldb + i % K)]), q[size_t(i)])
          << isa_name(isa) << " bf16 value " << i;
  }
}

// One block's integer codes (linear_isa::Job::xi, xc and xs) in plain arithmetic: x = A·2^E
// with integers |A| <= 32639 (max < 2^(E+15)), else xs 0; a zero block: bytes 0, xs 1.
void int_codes_block_ref(const float* x, int8_t* xi, int32_t* xc, float* xs) {
  constexpr int kOrder8[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // within each group of 8 inputs
  float mx = 0;
  for (int k = 0; k < 32; ++k) mx = std::max(mx, std::fabs(x[k]));
  const int E = int(f32_bits(mx) >> 23) - 127 - 14;
  *xc = 0;
  *xs = mx == 0.0f ? 1.0f : 0.0f;
  int32_t A[32] = {}, sum = 0;
  if (mx != 0.0f && (E < -126 || E > 0)) return;
  for (int k = 0; k < 32 && mx != 0.0f; ++k) {
    const float v = std::ldexp(x[k], -E);
    if (v != std::nearbyint(v) || std::fabs(v) > 32639.0f) return;
    A[k] = int32_t(v);
    sum += A[k];
  }
  for (int g = 0; g < 4; ++g)
    for (int p = 0; p < 8; ++p) {
      const int32_t a = A[8 * g + kOrder8[p]], lo = int8_t(a & 0xff);
      xi[16 * g + p] = int8_t((a - lo) / 256);  // H, then L: A = 256·H + L
      xi[16 * g + 8 + p] = int8_t(lo);
    }
  if (mx == 0.0f) return;
  *xc = -12 * sum;
  *xs = std::ldexp(1.0f, E - 1);  // the weights are stored doubled
}

// The integer codes of the fp4 GEMV, 16 blocks at a time (and a last group padded to 16), equal
// the plain arithmetic of one block: the corrections and scales bit for bit, and the bytes of
// every block that is integers. The activations mix all-zero blocks, blocks below act_quant's
// floor (E out of range) and blocks too fine for 16-bit integers.
TEST(LinearFast, IntCodesMatchOneBlockReference) {
  if (!(cpu_best_isa() == Isa::Avx512 && linear_isa::kAvx512.int_codes))
    GTEST_SKIP() << "no integer products";
  const linear_isa::Kernels& k = linear_isa::kAvx512;
  const int64_t K = 32 * 40, n = 6, nb = K / 32;  // 2 groups of 16 blocks and 8 more a row
  const auto x = make_activations(n, K, K, 33, false);
  std::vector<float> q(size_t(n * K));
  k.quantize(x.data(), K, n, K, q.data(), nullptr);
  std::vector<int8_t> xi(size_t(n * K * 2)), xi1(xi.size());
  std::vector<int32_t> xc(size_t(n * nb)), xc1(xc.size());
  std::vector<float> xs(size_t(n * nb)), xs1(xs.size());
  k.int_codes(q.data(), n, K, xi.data(), xc.data(), xs.data());
  for (int64_t b = 0; b < n * nb; ++b)
    int_codes_block_ref(q.data() + b * 32, xi1.data() + b * 64, &xc1[size_t(b)], &xs1[size_t(b)]);
  int seen[3] = {};  // blocks: not integers, zero, integers
  for (int64_t b = 0; b < n * nb; ++b) {
    ASSERT_EQ(f32_bits(xs[size_t(b)]), f32_bits(xs1[size_t(b)])) << "block " << b;
    ASSERT_EQ(xc[size_t(b)], xc1[size_t(b)]) << "block " << b;
    ++seen[xs1[size_t(b)] == 0.0f ? 0 : xs1[size_t(b)] == 1.0f ? 1 : 2];
    if (xs1[size_t(b)] == 0.0f) continue;
    for (int j = 0; j < 64; ++j)
      ASSERT_EQ(xi[size_t(b * 64 + j)], xi1[size_t(b * 64 + j)]) << "block " << b << " byte " << j;
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], n * nb / 2);
}

TEST(LinearFast, Dpbf16IsCanonicalHere) {
  if (cpu_best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX512_BF16";
  EXPECT_TRUE(linear_isa::avx512_dpbf16_is_canonical());
}

// The tiles of an AMX CPU follow the linears' order (else they would silently go unused, and
// their paths untested).
TEST(LinearFast, AmxIsCanonicalHere) {
  if (!amx_available()) GTEST_SKIP() << "no AMX-BF16 tiles";
  EXPECT_TRUE(linear_isa::amx_is_canonical());
}

// The timing behind LinearProducts::Auto gives a plausible rate (Zen 4 about 2, Sapphire Rapids
// about 0.5) rather than a broken measurement.
TEST(LinearFast, Dpbf16RateIsMeasured) {
  if (cpu_best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX512_BF16";
  EXPECT_GT(dpbf16_speedup(), 0.1);
  EXPECT_LT(dpbf16_speedup(), 10.0);
}

// The same for vpdpwssd (about 1.5-2 on Sapphire Rapids, about 1 on Zen 4): a CPU with
// AVX512_VNNI must measure a rate, or the integer products would silently go untested.
TEST(LinearFast, Int16RateIsMeasured) {
  if (cpu_best_isa() != Isa::Avx512 || !__builtin_cpu_supports("avx512vnni"))
    GTEST_SKIP() << "no AVX512_VNNI";
  EXPECT_GT(int16_speedup(), 0.1);
  EXPECT_LT(int16_speedup(), 10.0);
}

TEST(LinearFast, PreparedSizes) {
  const OwnedWeight a = make_weight(WeightFormat::Fp8Block, 50, 64, 1);
  EXPECT_EQ(PreparedLinear(a.w).packed_bytes(), uint64_t(64 * 64));  // 4 tiles of 16 rows
  const OwnedWeight b = make_weight(WeightFormat::Fp4Row, 32, 64, 1);
  EXPECT_EQ(PreparedLinear(b.w).packed_bytes(), uint64_t(32 * 32 + 32 * 2));
  Weight fp8row = a.w;
  fp8row.format = WeightFormat::Fp8Row;
  EXPECT_THROW(PreparedLinear{fp8row}, Error);
  Weight odd = b.w;
  odd.shape = Shape{32, 48};
  EXPECT_THROW(PreparedLinear{odd}, Error);
}

}  // namespace
}  // namespace deepinfer::testing
