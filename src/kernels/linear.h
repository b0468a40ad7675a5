// Linear layers y = x Wᵀ over the checkpoint's weight formats (V41_SPEC.md §3.6).
//
//   QLin   (Weight::quant_input) each input row is act-quantized (e4m3, one e8m0 scale per 32);
//          per 32-wide input block b the partial P_b = Σ q_k w_k runs over the codes and the
//          total accumulates P_b · (σx_b · σw_b) block by block. W: Fp8Block or Fp4Row.
//   plain  the input is used as it is (bf16 or fp32 values); W: BF16, F32, or Fp8Block
//          (wo_a: exact dequantized values, no activation quantization).
// Both follow the canonical order of kernels/reduce.h, so an output row depends only on its
// input row: batching, threading and the code path (GEMV for a few rows, blocked GEMM for more,
// AVX-512 / AVX2 / scalar) never change a bit. Outputs are fp32; callers round to bf16 where the
// model stores bf16.
//
// The fast paths read a PreparedLinear: the weight repacked once, at model construction, into
// tiles of 16 output rows stored k-major (tile t, input k: the 16 values of rows 16t..16t+15),
// in the checkpoint's own encoding, so a tile streams contiguously while the kernel broadcasts
// x_k and accumulates 16 outputs per vector:
//   Fp8Block  [tiles][K/4][64] e4m3 bytes: in group g (inputs 4g..4g+3) the rows' (even, odd)
//             input pairs interleaved in 8-byte runs, each 16-byte lane in kFp8LaneOrder
//             (isa.h); scales read from the checkpoint's 32x32 grid
//   Fp4Row    [tiles][K/8][32] 16-bit words: in group g (inputs 8g..8g+7) word 2o + s holds row
//             o's inputs 8g + 2j + s in nibbles j = 0..3 (nibble 0 lowest);
//             + [tiles][K/32][16] e8m0 scales
//   BF16      [tiles][K][16] bf16;  F32  [tiles][K][16] fp32
// Rows past the weight's last row are zero. The repacked copy has the checkpoint's size (plus
// the padding of the last tile); everything else stays mapped.
//
// linear_ref is the scalar oracle over the checkpoint layout; linear dispatches to the fastest
// path for core/cpu.h's cpu_isa().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/weight.h"

namespace deepinfer {

// Rows [row0, row0 + n_out) of W applied to x.
//   x: [n, ldx] (the first W.cols() columns are read), y: [n, ldy] (n_out columns written)
struct LinearArgs {
  const float* x;
  int64_t n;
  int64_t ldx;
  float* y;
  int64_t ldy;
  int64_t row0 = 0;
  int64_t n_out = -1;  // -1: all rows of W
  // Sum in double and round once (the model's fp32 numerics, which match a correctly rounded
  // reference). Always served by linear_ref; the fast paths serve exact = false.
  bool exact = false;
  // Round the outputs to bf16 (as a pass over y after the call would), each as the kernel
  // stores it.
  bool round_bf16 = false;
  // QLin weights only: row i of the input is x_rows[i] (x and ldx unused), so that rows spread
  // over a larger input (the experts' tokens) need no gathering copy.
  const float* const* x_rows = nullptr;
};

// The tile layout the fast kernels read (see the header comment). Non-owning.
struct PackedWeight {
  WeightFormat format = WeightFormat::F32;
  int64_t cols = 0;                // of the weight (K)
  int64_t tile_bytes = 0;          // values of one tile
  const uint8_t* data = nullptr;   // [tiles = ceil(rows / 16), tile_bytes]
  const uint8_t* scale = nullptr;  // Fp8Block: the checkpoint grid; Fp4Row: [tiles, K/32, 16]
  int64_t scale_cols = 0;          // Fp8Block: row length of the grid
  // Every value is a bf16 value whose magnitude is 0 or >= 2^-56 (codes always; bf16 weights
  // when checked so): with inputs alike, no product or partial sum can be subnormal, so the
  // bf16 dot-product instruction gives exactly the canonical fused steps.
  bool bf16_products = false;
  // Every block scale lies in [2^-86, 2^100] for act-quantized inputs, [2^-54, 2^100] for dense
  // ones (or there are none): the AMX tiles and the vdpbf16ps GEMM may pack the values times
  // their scale, all staying normal and finite bf16 values (e4m3 from 2^-9 to 448, e2m1 from 0.5
  // to 6), and every product and partial too, whose last bit is at least 2^-126: act_quant's
  // values have their last bit from 2^-31, e4m3's from 2^-9 (2^-31 · 2^-9 · 2^-86), dense bf16
  // inputs (the bf16 products' floor 2^-56) from 2^-63 (2^-63 · 2^-9 · 2^-54). Weights with
  // other scales stay off the tiles and keep their scales apart.
  bool foldable_scales = false;
};

class PreparedLinear {
 public:
  PreparedLinear() = default;
  // Repacks a 2-D weight with cols % 32 == 0 (any format but Fp8Row). An absent weight gives an
  // absent PreparedLinear.
  explicit PreparedLinear(const Weight& w);
  PreparedLinear(PreparedLinear&&) noexcept = default;
  PreparedLinear& operator=(PreparedLinear&&) noexcept = default;

  bool present() const { return w_.present(); }
  const Weight& weight() const { return w_; }  // the checkpoint's layout (scalar path)
  const PackedWeight& packed() const { return p_; }
  int64_t rows() const { return w_.rows(); }
  int64_t cols() const { return w_.cols(); }
  // Bytes this object owns (repacked values and scales).
  uint64_t packed_bytes() const { return owned_bytes_; }
  // Those bytes (benchmarks stream them to measure the read limit of the same memory).
  std::span<const uint8_t> packed_span() const { return {buf_.get(), size_t(owned_bytes_)}; }

 private:
  Weight w_;
  PackedWeight p_;
  std::shared_ptr<uint8_t> buf_;  // core/huge_alloc.h
  uint64_t owned_bytes_ = 0;
};

// The model's entry point, as the reference's `linear()`: the weight's stored form decides the
// computation (Weight::quant_input: QLin, else the plain linear).
void linear(const PreparedLinear& w, const LinearArgs& a);
// Several independent calls, each giving exactly what `linear` gives it. Calls of at most a few
// rows (decode), and quantized ones of up to 256 rows on AMX tiles (a prefill's experts), share
// one pass of the thread pool over all their weights, which saves a pool wake-up per call and
// balances many small weights (the experts of a step, the output projection's groups) as one
// stream.
struct LinearCall {
  const PreparedLinear* w;
  LinearArgs a;
};
void linear_many(std::span<const LinearCall> calls);
// The scalar path over an unprepared weight (what exact calls and the scalar ISA run).
void linear_ref(const Weight& w, const LinearArgs& a);

// Convenience: full W, contiguous x [n, W.cols()] and y [n, W.rows()].
inline void linear(const PreparedLinear& w, const float* x, int64_t n, float* y, bool exact = false,
                   bool round_bf16 = false) {
  linear(w, {x, n, w.cols(), y, w.rows(), 0, -1, exact, round_bf16});
}

// Row `r` of W decoded to float (exact): out[W.cols()].
void weight_row(const Weight& w, int64_t r, float* out);

// Which kernel a call with `n` rows takes (benchmarks and tests force one to compare them).
enum class LinearPath { Auto, Gemv, Gemm };
void set_linear_path(LinearPath p);  // process-wide; Auto by default
LinearPath linear_path();

// How the AVX-512 kernels multiply bf16-exact operands (quantized codes, bf16 inputs): vdpbf16ps
// or fp32 FMAs. Both give the canonical result bit for bit. Auto takes vdpbf16ps where it
// multiplies faster than FMAs (timed once: Zen 4), else FMAs for every call of more than one row
// (Sapphire/Emerald Rapids: a one-row GEMV is bound by its decode, where vdpbf16ps is shorter).
// Int16Dot: GEMVs over fp4 weights with quantized inputs multiply integers (vpdpbusd over the
// bytes of the 16-bit inputs, AVX512_VNNI) wherever an input block is integers times a power of two
// within 16 bits (nearly always: the block maximum maps near 448, and the block is exact unless it
// also holds a value below about 1/4000 of it with low bits set); such a block's partial is an
// exact integer sum, which is the canonical partial (no fp32 addition of the canonical order rounds
// there). Other blocks take FMAs. Auto takes it unless VNNI multiplies at less than 0.75x the rate
// of both other ways (its decode is half theirs; Sapphire Rapids: 1.1-2x the rate; the fp4 GEMVs
// then stream at 0.87-0.98 of the read bandwidth on the V4.1-Flash shapes, 0.78 on the smallest).
// Amx (and Auto, where the CPU has AMX-BF16, the kernel lets the process use its tiles and they
// follow the canonical order): every GEMM and GEMV of bf16-exact products (quantized inputs, or
// bf16 inputs against bf16-exact weights) runs on AMX tiles (TDPBF16PS, whose order per block is
// the canonical one: reduce.h), except GEMVs of up to 4 rows over fp4 weights (the integer
// products) and over bf16 weights with dense inputs (fp32 FMAs, where those outrun vdpbf16ps).
enum class LinearProducts { Auto, Bf16Dot, Fp32Fma, Int16Dot, Amx };
void set_linear_products(LinearProducts p);  // process-wide; Auto by default
LinearProducts linear_products();
// Products per second of vdpbf16ps over fp32 FMAs on this CPU (0 without AVX512_BF16).
double dpbf16_speedup();
// Products per second of VNNI (vpdpbusd, two per 16-bit product) over the faster of the other two
// (0 without AVX512_VNNI).
double int16_speedup();
// Whether this CPU and kernel let fp4 GEMMs use AMX tiles (see Amx above).
bool amx_available();
// amx_available() and the tiles follow the canonical order (checked once): the linears and the
// sparse attention may use them where the products setting allows (Auto or Amx).
bool amx_canonical();
// What Auto multiplies with on this CPU, in words (benchmarks print it next to the rates).
std::string auto_products_summary();

}  // namespace deepinfer
