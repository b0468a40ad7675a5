#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {

// Decodes the raw codes (not scaled) of W row r, block b (32 columns) into out[32], and returns
// the block's weight scale (1 for unscaled formats, whose values are decoded in full).
float weight_block(const Weight& w, int64_t r, int64_t b, float* out) {
  const int64_t K = w.cols(), k0 = b * 32;
  switch (w.format) {
    case WeightFormat::F32:
      for (int i = 0; i < 32; ++i) out[i] = w.f32()[r * K + k0 + i];
      return 1.0f;
    case WeightFormat::BF16:
      for (int i = 0; i < 32; ++i) out[i] = bf16_to_f32(w.bf16()[r * K + k0 + i]);
      return 1.0f;
    case WeightFormat::Fp8Block:
      for (int i = 0; i < 32; ++i) out[i] = e4m3_to_f32(w.u8()[r * K + k0 + i]);
      return e8m0_to_f32(w.scale[(r / 32) * w.scale_cols + b]);
    case WeightFormat::Fp8Row:
      for (int i = 0; i < 32; ++i) out[i] = e4m3_to_f32(w.u8()[r * K + k0 + i]);
      return e8m0_to_f32(w.scale[r * w.scale_cols + b]);
    case WeightFormat::Fp4Row:
      for (int i = 0; i < 32; ++i) out[i] = e2m1_packed_get(w.u8() + r * (K / 2), size_t(k0 + i));
      return e8m0_to_f32(w.scale[r * w.scale_cols + b]);
  }
  return 0;
}

// One output: Σ_b P_b · xs_b · ws_b in the canonical order.
//   xv: [K] input values (codes when xs != nullptr), xs: [K/32] input scales or nullptr
float dot_row(const Weight& w, int64_t r, const float* xv, const float* xs, bool exact) {
  const int64_t nb = w.cols() / 32;
  float acc = 0, wb[32];
  double acc_d = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const float ws = weight_block(w, r, b, wb);
    const float s = xs ? xs[b] * ws : ws;  // a power of two (or 1): exact
    if (exact) {
      double p = 0;
      for (int i = 0; i < 32; ++i) p += double(xv[b * 32 + i]) * wb[i];
      acc_d += p * s;
    } else {
      acc = std::fma(block_dot(xv + b * 32, wb, 32), s, acc);  // kernels/reduce.h
    }
  }
  return exact ? float(acc_d) : acc;
}

void run(const Weight& w, const LinearArgs& a, bool quant) {
  const int64_t K = w.cols();
  const int64_t n_out = a.n_out < 0 ? w.rows() - a.row0 : a.n_out;
  DI_CHECK(K % 32 == 0, w.name, ": input dim ", K, " is not a multiple of 32");
  DI_CHECK(a.row0 >= 0 && a.row0 + n_out <= w.rows(), w.name, ": rows out of range");
  if (quant)
    DI_CHECK(w.format == WeightFormat::Fp8Block || w.format == WeightFormat::Fp4Row, w.name,
             ": QLin needs fp8 or fp4 weights");
  // Quantized inputs: codes and scales per row, computed once.
  std::vector<float> qv, qs;
  const float* xv = a.x;
  int64_t ldv = a.ldx;
  if (quant) {
    qv.resize(size_t(a.n * K));
    qs.resize(size_t(a.n * K / 32));
    std::vector<uint8_t> codes(static_cast<size_t>(K)), sc(static_cast<size_t>(K / 32));
    for (int64_t i = 0; i < a.n; ++i) {
      act_quant(a.x + i * a.ldx, K, codes.data(), sc.data());
      for (int64_t k = 0; k < K; ++k) qv[size_t(i * K + k)] = e4m3_to_f32(codes[size_t(k)]);
      for (int64_t b = 0; b < K / 32; ++b)
        qs[size_t(i * (K / 32) + b)] = e8m0_to_f32(sc[size_t(b)]);
    }
    xv = qv.data();
    ldv = K;
  }
  ThreadPool::global().parallel_for(n_out, 64, [&](int64_t o0, int64_t o1) {
    for (int64_t i = 0; i < a.n; ++i)
      for (int64_t o = o0; o < o1; ++o)
        a.y[i * a.ldy + o] = dot_row(w, a.row0 + o, xv + i * ldv,
                                     quant ? qs.data() + i * (K / 32) : nullptr, a.exact);
  });
}

}  // namespace

void linear_quant_ref(const Weight& w, const LinearArgs& a) {
  run(w, a, true);
}
void linear_dense_ref(const Weight& w, const LinearArgs& a) {
  run(w, a, false);
}

void weight_row(const Weight& w, int64_t r, float* out) {
  for (int64_t b = 0; b < w.cols() / 32; ++b) {
    const float s = weight_block(w, r, b, out + b * 32);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] *= s;
  }
}

}  // namespace deepinfer
