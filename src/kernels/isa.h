// Internal to the kernels: what each dispatcher (linear.cpp, attention.cpp, quant.cpp,
// elementwise.cpp: checks, scratch, threading) hands the vector code compiled per ISA (the
// *_vec.cpp files, compiled once per ISA, and the *_avx512.cpp files). Plain structs and function
// pointers only, so the ISA objects share no inline code with the rest of the program;
// AlignedScratch (below) is for the dispatchers alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/indexer.h"
#include "kernels/linear.h"

namespace deepinfer {

// A growable, 64-byte aligned scratch buffer; kernels keep one per thread (thread_local), so a
// call allocates only when it needs more than any call on that thread did before.
class AlignedScratch {
 public:
  uint8_t* bytes(size_t n) {
    if (buf_.size() < n + 64) buf_.resize(n + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf_.data());
    return buf_.data() + ((64 - (p & 63)) & 63);
  }
  float* floats(int64_t n) { return reinterpret_cast<float*>(bytes(size_t(n) * sizeof(float))); }

 private:
  std::vector<uint8_t> buf_;
};

}  // namespace deepinfer

namespace deepinfer::linear_isa {

// The in-lane byte order of an fp8 tile's groups: byte i of each 16-byte lane holds the byte
// that the plain interleave (linear.cpp's fp8_offset: the (even, odd) input pairs of the rows in
// 8-byte runs) puts at kFp8LaneOrder[i]. That is the order in which AVX-512's byte unpacks give
// vdpbf16ps's chains, (input 2, input 0) and (input 3, input 1) of each row, straight from the
// tile; the plain pairs take one in-lane shuffle (linear_vec.cpp's decode_pairs).
constexpr uint8_t kFp8LaneOrder[16] = {8, 0, 10, 2, 12, 4, 14, 6, 9, 1, 11, 3, 13, 5, 15, 7};
// Where byte q of the plain interleave lies within its lane (the inverse of kFp8LaneOrder).
constexpr int fp8_lane_of(int q) {
  for (int i = 0; i < 16; ++i)
    if (kFp8LaneOrder[i] == q) return i;
  return -1;
}

// Tiles of 16 outputs per GEMM task: each task packs this many tiles of W once and runs every
// row against them.
constexpr int64_t kGemmPanelTiles = 3;
// With AMX tiles (Job::amx): 6 (up to 16 when the weight has few outputs: one panel a thread),
// run 3 at a time against each block of inputs, so that the inputs are read once per 96 outputs
// or more (at 48, a 5120 x 1280 GEMM of 512 rows read them from memory at the rate its tiles
// multiplied).
constexpr int64_t kAmxPanelTiles = 6, kAmxPanelTilesMax = 16;

// The row stride (elements) of the bf16 inputs Job::xb for K inputs: K, or K + 32 where K is a
// multiple of 1024, so that the 16 rows an AMX tile reads (64 bytes of each) do not all fall in
// the same L1 sets (K = 2048: rows 4 KiB apart; a 48-row fp4 GEMV ran 10 % faster padded).
// (static: each file its own copy, so the ISA objects share no inline code.)
static constexpr int64_t xb_stride(int64_t K) {
  return K % 1024 == 0 ? K + 32 : K;
}

// One call over tiles [t0, t1) of a packed weight for `n` rows.
struct Job {
  const PackedWeight* w = nullptr;
  // [n, ldx] fp32 inputs: the values themselves (dense) or their act_quant QDQ values
  // x̃ = q·σ (quantized). Since σ is a power of two, a block's partial over x̃ is exactly σ times
  // the partial over the codes q, so every path scales partials by the weight scale only.
  const float* x = nullptr;
  int64_t ldx = 0;
  // The rows below are K = w->cols apart (K / 32 for xs; xb_stride(K) for xb).
  // [n, K] the same x̃ as bf16 (exact), or null: for the AMX tiles in order, for vdpbf16ps each
  // block of 32 in the chains' order (simd.h's chain_order_words: one 32-bit word per step).
  const uint16_t* xb = nullptr;
  // Integer products (fp4 weights, AVX-512 GEMV), or null: per row and 32-block, x̃_k = A_k · 2^E
  // with integers |A_k| < 2^15, as the bytes H and L of A = 256·H + L in xi [n, K/32][4 groups]
  // [H, L][8] (the order within a group: linear_vec.cpp's int_codes), xc [n, K/32] = -12·Σ A_k,
  // and xs [n, K/32] = 2^(E-1) (the fp4 weights enter as twice their values), or 0 where the
  // block is not so (it runs in fp32 FMAs).
  const int8_t* xi = nullptr;
  const int32_t* xc = nullptr;
  const float* xs = nullptr;
  // Products on AMX tiles (fp8, fp4 or bf16 weights with PackedWeight::foldable_scales, xb set; a
  // GEMV of n <= 64).
  bool amx = false;
  int64_t n = 0;
  float* y = nullptr;  // [n, ldy]: output row o goes to column o - lo
  int64_t ldy = 0;
  int64_t lo = 0, hi = 0;   // outputs [lo, hi) are written, nothing else
  bool round_bf16 = false;  // written rounded to bf16 (LinearArgs::round_bf16)
  int64_t t0 = 0, t1 = 0;
  uint8_t* scratch = nullptr;  // GEMM: gemm_scratch_bytes(n, K) bytes, 64-byte aligned
};

struct Kernels {
  // act_quant QDQ of n rows (V41_SPEC.md §3.4): xq[n, K] the values q·σ, xqb[n, K] the same as
  // bf16 (each when non-null).
  void (*quantize)(const float* x, int64_t ldx, int64_t n, int64_t K, float* xq, uint16_t* xqb);
  // Converts n rows of fp32 inputs to bf16 (xb[n, K]) and returns whether every value is a bf16
  // value with magnitude 0 or in [2^-56, max] (see PackedWeight::bf16_products); null when the
  // ISA has no bf16 products (vdpbf16ps), for quantized rows' bf16 codes too.
  bool (*to_bf16)(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* xb);
  // Rows of bf16 inputs xb[n, K] (xb_stride(K) apart) in place into the chains' order of
  // vdpbf16ps (Job::xb; null where to_bf16 is).
  void (*chain_rows)(uint16_t* xb, int64_t n, int64_t K);
  // Job::xi, xc and xs of n rows of QDQ values xq[n, K] (null when the ISA has no integer
  // products).
  void (*int_codes)(const float* xq, int64_t n, int64_t K, int8_t* xi, int32_t* xc, float* xs);
  void (*gemv)(const Job& j);  // n <= gemv_rows (on AMX tiles, Job::amx: n <= 64)
  void (*gemm)(const Job& j);  // any n; bf16 products when j.xb is set
  int64_t (*gemm_scratch_bytes)(int64_t n, int64_t K);
  // Rows one GEMV call runs against each weight block as it streams: 8 with AVX-512's 32 vector
  // registers (a verify step of speculative decoding, a token and 4 drafts, reads each weight
  // once), 4 with AVX2's 16.
  int64_t gemv_rows;
};

// The tables of each ISA (linear_vec.cpp compiled for it).
extern const Kernels kAvx2, kAvx512;

// Whether vdpbf16ps computes a lane as acc + odd product, rounded, + even product, rounded (the
// order the linears' chains rely on: reduce.h) on a set of adversarial operands; checked once
// before the bf16 products are trusted.
bool avx512_dpbf16_is_canonical();
// Whether TDPBF16PS computes each output of a block in the linears' canonical order (reduce.h:
// the even products' chain and the odd products', each fused and from +0, then their sum, then
// added to the tile) on adversarial operands. Call only once the process may use the tiles
// (amx_available).
bool amx_is_canonical();
// Configures the AMX tiles (AVX-512 builds): 0, 1, 4, 5 with `rows` rows, 2, 3, 6, 7 with 16;
// 64 bytes a row. The caller releases them (_tile_release) when its task ends.
void amx_configure(int rows);
// n rounds of 16 independent in-register chains of vfmadd231ps, vdpbf16ps or vpdpbusd, for
// linear.cpp to time (sums of 1 x 1).
enum class ProductKind { Fp32, Bf16, Int16 };
void avx512_product_chains(ProductKind kind, int64_t n);

}  // namespace deepinfer::linear_isa

// Sparse attention and the indexer scores (attention_vec.cpp): one lane per head.
namespace deepinfer::attention_isa {

// One group of consecutive heads (16 for AVX-512, 8 for AVX2) of one query.
struct Job {
  const SparseAttnArgs* a = nullptr;
  int64_t h0 = 0, nh = 0;  // heads [h0, h0 + nh)
  // On AMX tiles (AVX-512): q is bf16 values, none nonzero below 2^-56, the keys are given as
  // bf16 (SparseAttnArgs::keys_bf16) and the probabilities are rounded to bf16
  // (attention_vec.cpp's run_group_amx; it checks the keys).
  bool amx = false;
  // The same operands on vdpbf16ps (AVX512_BF16, no tiles: run_group_dp).
  bool dp = false;
  // scratch_floats(Dh, nk, amx || dp) floats, 64-byte aligned.
  float* scratch = nullptr;
  // x[i] = f32(exp(double(x[i]))): the reference's exp, out of line so the ISA files do not
  // instantiate it.
  void (*exp_n)(float* x, int64_t n) = nullptr;
};

struct IndexerJob {
  const IndexerScoreArgs* a = nullptr;
  int64_t t0 = 0, t1 = 0;    // visible rows to score
  bool fma = false;          // q·k products are exact (bf16 values): fused multiply-adds agree
  float* scratch = nullptr;  // qT [Di][lanes], w [lanes], terms [4][lanes]; 64-byte aligned
};

// Largest head count the vector indexer takes (more runs the reference).
constexpr int64_t kIndexerMaxHeads = 64;

struct Kernels {
  void (*group)(const Job& j);
  void (*indexer_scores)(const IndexerJob& j);
  // Whether every element of x[n] is a bf16 value (low 16 bits zero).
  bool (*all_bf16)(const float* x, int64_t n);
  // Whether every element of x[n] is a bf16 value whose magnitude is 0 or at least 2^-56.
  bool (*all_bf16_floored)(const float* x, int64_t n);
  // out = the bf16 bits of x when all_bf16_floored(x, n) (returned).
  bool (*to_bf16_floored)(const float* x, int64_t n, uint16_t* out);
  // kernels/attention.h's pair_key_rows (Dh a multiple of 32).
  void (*pair_rows)(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out);
  int64_t lanes;  // heads per group
};

// Floats of a Job's scratch: qT [Dh][16], scores [nk][16], probabilities [64][16], a few vectors;
// on bf16 operands (the tiles or vdpbf16ps) also the query's steps, a block's keys as bf16 rows
// and as pairs, and the tiles' staging or the probabilities' steps.
inline int64_t attention_scratch_floats(int64_t Dh, int64_t nk, bool bf16_ops) {
  return Dh * 16 + nk * 16 + 64 * 16 + 4 * 16 + 64 +
         (bf16_ops ? Dh * 8 + 128 * Dh + 4 * 256 + 512 : 0);
}
// The tables of each ISA (attention_vec.cpp compiled for it).
extern const Kernels kAvx2, kAvx512;

}  // namespace deepinfer::attention_isa

// The AVX-512 versions of the activation/cache conversions of kernels/quant.h
// (quant_avx512.cpp), exact twins of the scalar code in quant.cpp.
namespace deepinfer::quant_isa {

void round_bf16_avx512(float* x, int64_t n);
void act_quant_avx512(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);
void fp8_dequant_avx512(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);
void fp4i_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);
void fp4c_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);
void fp4i_qdq_avx512(float* x, int64_t n);
}  // namespace deepinfer::quant_isa

// The AVX-512 versions of kernels/elementwise.h's exp, RMS and SwiGLU (elementwise_avx512.cpp), the
// same floats as the scalar code.
namespace deepinfer::elementwise_isa {

void exp_f_n_avx512(float* x, int64_t n);
void swiglu_avx512(float* g, const float* u, int64_t n, float limit, float weight);
void rms_inv_rows_avx512(const float* x, int64_t n, int64_t ld, int64_t d, float eps, float* out);
void rmsnorm_avx512(float* x, int64_t n, int64_t d, const uint16_t* w, float eps);

}  // namespace deepinfer::elementwise_isa
