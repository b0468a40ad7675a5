// The scalar kernels against values computed independently: the spec's RoPE table (Appendix
// A.4), the power-of-two scale rule (§3.3), the three fake quantizations (§3.4, §3.5) in their
// QDQ and packed forms, Sinkhorn, and the router (§8.1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/hyper.h"
#include "kernels/moe_routing.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "util/quant_qdq.h"

namespace deepinfer {
namespace {

TEST(Rope, ReleasedCompressedTableBits) {
  const RopeTable t = make_rope_table(64, 160000, 65536, 16, 32, 1);
  const std::pair<int, uint32_t> want[] = {{0, 0x3f800000},  {1, 0x3f300a3a},  {15, 0x3b6e4237},
                                           {16, 0x3b147ae1}, {20, 0x399bb3af}, {24, 0x37a3d70c},
                                           {25, 0x36b443d0}, {31, 0x35187c4d}};
  for (auto [i, bits] : want) EXPECT_EQ(f32_bits(t.omega[size_t(i)]), bits) << "i=" << i;
  const RopeTable w = make_rope_table(64, 10000, 0, 1, 32, 1);  // window layers: no YaRN
  EXPECT_EQ(w.omega[1], float(0.7498942017555237));
  EXPECT_EQ(w.omega[31], float(1.333521504420787e-4));
}

TEST(Rope, RotationIsAdjacentPairsAndInvertible) {
  const RopeTable t = make_rope_table(4, 10000, 0, 1, 32, 1);
  float cs[4];
  rope_angles(t, 3, cs);
  float v[4] = {1, 0, 0, 1};
  rope_rotate(v, cs, 4, false);
  EXPECT_FLOAT_EQ(v[0], cs[0]);  // (1, 0) -> (cos, sin)
  EXPECT_FLOAT_EQ(v[1], cs[1]);
  rope_rotate(v, cs, 4, true);
  EXPECT_NEAR(v[0], 1, 1e-6);
  EXPECT_NEAR(v[3], 1, 1e-6);
}

TEST(Quant, Pow2CeilUsesTheRoundedProduct) {
  // a * (1/448) exactly 2^-3: no rounding up; one ulp above: the next power.
  EXPECT_EQ(pow2ceil_e8m0(56.0f, 1.0f / 448.0f), 127 - 3);
  EXPECT_EQ(pow2ceil_e8m0(std::nextafter(56.0f, 100.0f), 1.0f / 448.0f), 127 - 2);
  EXPECT_EQ(pow2ceil_e8m0(1.0f, 1.0f), 127);
  EXPECT_EQ(pow2ceil_e8m0(1.5f, 1.0f), 128);
}

TEST(Quant, ActQuantScalesAndQdqAgreeWithThePackedForm) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 3);
  std::vector<float> x(64);
  for (auto& v : x) v = round_bf16(nd(rng));
  x[0] = 448 * 4;                            // block 0's amax: exactly 448 * 2^2, scale 2^2
  std::fill(x.begin() + 32, x.end(), 0.0f);  // block 1: zeros, scale from the 1e-4 floor
  std::vector<uint8_t> codes(64), scales(2);
  act_quant(x.data(), 64, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 127 + 2);
  EXPECT_EQ(scales[1], pow2ceil_e8m0(1e-4f, 1.0f / 448.0f));
  EXPECT_EQ(codes[0], 0x7e);  // 448
  std::vector<float> deq(64), qdq = x;
  fp8_dequant(codes.data(), scales.data(), 64, deq.data());
  act_quant_qdq(qdq.data(), 64);
  EXPECT_EQ(std::memcmp(deq.data(), qdq.data(), 64 * 4), 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(round_bf16(qdq[size_t(i)]), qdq[size_t(i)]);  // bf16-exact
}

TEST(Quant, Fp4VariantsQdqEqualsPackedAndTiesGoEven) {
  // Variant I, one block whose scale is 1 (amax 6): the spec's ties.
  std::vector<float> x(32, 0.0f);
  const float in[] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -5, -0.25f};
  const float want[] = {6, 0, 1, 1, 2, 2, 4, 4, -4, -0.0f};
  std::copy(std::begin(in), std::end(in), x.begin());
  std::vector<float> q = x;
  fp4i_qdq(q.data(), 32);
  for (size_t i = 0; i < std::size(want); ++i) EXPECT_EQ(q[i], want[i]) << in[i];
  std::vector<uint8_t> packed(16), sc(1);
  fp4i_quant(x.data(), 32, packed.data(), sc.data());
  EXPECT_EQ(packed[0] & 0xf, 7);  // element 0 (6.0) in the low nibble
  std::vector<float> deq(32);
  fp4i_dequant(packed.data(), sc.data(), 32, deq.data());
  EXPECT_EQ(std::memcmp(deq.data(), q.data(), 32 * 4), 0);
  // Variant C: e4m3 scale amax/6 per 16; QDQ equals the packed form; huge values saturate
  // the scale at 448 rather than becoming NaN.
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0, 2);
  std::vector<float> y(64);
  for (auto& v : y) v = round_bf16(nd(rng));
  y[17] = 1e6f;
  std::vector<float> yq = y, yd(64);
  fp4c_qdq(yq.data(), 64);
  std::vector<uint8_t> py(32), sy(4);
  fp4c_quant(y.data(), 64, py.data(), sy.data());
  fp4c_dequant(py.data(), sy.data(), 64, yd.data());
  EXPECT_EQ(std::memcmp(yd.data(), yq.data(), 64 * 4), 0);
  EXPECT_EQ(sy[1], 0x7e);
  EXPECT_EQ(yq[17], 6 * 448.0f);
}

TEST(Hyper, SinkhornEndsOnColumnNormalisation) {
  float c[16];
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : c) v = nd(rng);
  sinkhorn(c, 4, 20, 1e-6f);
  for (int k = 0; k < 4; ++k) {
    float col = 0, row = 0;
    for (int j = 0; j < 4; ++j) col += c[j * 4 + k], row += c[k * 4 + j];
    EXPECT_NEAR(col, 1.0f, 1e-5);
    EXPECT_NEAR(row, 1.0f, 1e-3);  // only approximately
  }
}

// hc_pre and hc_post run vectorised over D; each output is a sum in double over the copies in
// order, rounded once, so they must equal the plain loop bit for bit at every width and tail.
// Values over a wide range of exponents, so that the sums in double round (a product rounded
// differently would show).
TEST(Hyper, MixesEqualThePlainSumsInDouble) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-70, 70);
  auto fill = [&](std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 ? nd(rng) : std::ldexp(nd(rng), ex(rng));
  };
  for (const int64_t M : {1, 4}) {
    for (const int64_t D : {1, 7, 8, 17, 63, 64, 100, 1000, 4100}) {
      std::vector<float> x(static_cast<size_t>(M * D)), y(static_cast<size_t>(D)),
          pi(static_cast<size_t>(M)), post(static_cast<size_t>(M)),
          comb(static_cast<size_t>(M * M)), out(static_cast<size_t>(M * D));
      fill(x), fill(y), fill(pi), fill(post), fill(comb);
      hc_pre(x.data(), pi.data(), M, D, out.data());
      for (int64_t d = 0; d < D; ++d) {
        double s = 0;
        for (int64_t c = 0; c < M; ++c) s += double(pi[size_t(c)]) * x[size_t(c * D + d)];
        ASSERT_EQ(out[size_t(d)], float(s)) << "pre M=" << M << " D=" << D << " d=" << d;
      }
      hc_post(y.data(), x.data(), post.data(), comb.data(), M, D, out.data());
      for (int64_t k = 0; k < M; ++k)
        for (int64_t d = 0; d < D; ++d) {
          double s = double(post[size_t(k)]) * y[size_t(d)];
          for (int64_t j = 0; j < M; ++j)
            s += double(comb[size_t(j * M + k)]) * x[size_t(j * D + d)];
          ASSERT_EQ(out[size_t(k * D + d)], float(s)) << "post M=" << M << " D=" << D;
        }
    }
  }
}

TEST(Router, BiasSteersSelectionButNotWeights) {
  const float logits[4] = {0.0f, 1.0f, 2.0f, 30.0f};  // softplus is linear above 20
  const float bias[4] = {10.0f, 0.0f, 0.0f, 0.0f};    // pushes expert 0 in
  int32_t ids[2];
  float w[2];
  RouteArgs a{logits, bias, 4, 2, 1.0f, 1.5f, true, ids, w};
  route_sqrtsoftplus(a);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 3);
  const double s0 = std::sqrt(std::log1p(std::exp(0.0))), s3 = std::sqrt(30.0);
  EXPECT_NEAR(w[0], 1.5 * s0 / (s0 + s3), 1e-6);
  EXPECT_NEAR(w[1], 1.5 * s3 / (s0 + s3), 1e-6);
}

}  // namespace
}  // namespace deepinfer
