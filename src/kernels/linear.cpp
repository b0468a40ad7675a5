// Linear dispatch: repacking at load, the path for each call (GEMV for a few rows, GEMM for more),
// activation quantization into per-thread scratch, and the split of the outputs over the thread
// pool (each output is computed by exactly one task, in the canonical order, so neither the
// split nor the thread count changes a bit).
#include "kernels/linear.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/huge_alloc.h"
#include "core/thread_pool.h"
#include "kernels/isa.h"
#include "kernels/quant.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {

std::atomic<int> g_path{int(LinearPath::Auto)};
// The choice of products in effect, from DEEPINFER_LINEAR_PRODUCTS=bf16|fp32|int16|amx on first
// use (it forces one way of multiplying: A/B runs of the model).
std::atomic<int>& current_products() {
  static std::atomic<int> p{[] {
    const char* e = std::getenv("DEEPINFER_LINEAR_PRODUCTS");
    const std::string m = e ? e : "";
    const std::string_view names[] = {"", "bf16", "fp32", "int16", "amx"};  // LinearProducts order
    const auto it = std::find(std::begin(names), std::end(names), m);
    DI_REQUIRE(it != std::end(names), "DEEPINFER_LINEAR_PRODUCTS='", m,
               "': expected bf16, fp32, int16 or amx");
    return int(it - std::begin(names));
  }()};
  return p;
}

// Growable 64-byte aligned per-thread buffers: one for the activations a call quantizes, one for
// the GEMM panels of the tasks a thread runs (the caller runs tasks too).
thread_local AlignedScratch t_act, t_task;

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// --- repacking ---

// Byte offset, inside an fp8 tile, of input k of row o: groups of 4 inputs take 64 bytes, in
// which the (even, odd) input pairs of the 16 rows are interleaved in 8-byte runs (the plain
// interleave), each 16-byte lane then in kFp8LaneOrder (isa.h), so that the AVX-512 byte unpacks
// produce vdpbf16ps's chains straight from the tile (kernels/linear_vec.cpp's decode_chains).
int64_t fp8_offset(int64_t k, int64_t o) {
  const int64_t i = 2 * o + (k & 1);  // word index within the pair
  const int64_t plain = 16 * (i / 8) + 8 * ((k / 2) & 1) + (i % 8);
  return (k / 4) * 64 + (plain & ~int64_t(15)) + linear_isa::fp8_lane_of(int(plain & 15));
}

// Byte and nibble of input k of row o inside an fp4 tile: groups of 8 inputs take 64 bytes, as 32
// words; word 2o + (k & 1) of group k/8 holds row o's inputs k/8*8 + 2j + (k & 1) in its nibbles
// j = 0..3, so that a word shift and a 16-entry word table give a vector of bf16 pairs
// (the AVX-512 branch of kernels/linear_vec.cpp).
int64_t fp4_offset(int64_t k, int64_t o) {
  const int64_t j = (k % 8) / 2;
  return (k / 8) * 64 + 2 * (2 * o + (k & 1)) + j / 2;
}

// Tile t of `w` into dst (layouts: kernels/linear.h).
void pack_tile(const Weight& w, int64_t t, uint8_t* dst, uint8_t* scale_dst) {
  const int64_t K = w.cols(), rows = w.rows();
  for (int64_t o = 0; o < 16; ++o) {
    const int64_t r = t * 16 + o;
    if (r >= rows) break;  // padding rows stay zero
    switch (w.format) {
      case WeightFormat::Fp8Block:
        for (int64_t k = 0; k < K; ++k) dst[fp8_offset(k, o)] = w.u8()[r * K + k];
        break;
      case WeightFormat::Fp4Row: {
        const uint8_t* src = w.u8() + r * (K / 2);
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t v = uint8_t((src[k / 2] >> (4 * (k & 1))) & 15);
          dst[fp4_offset(k, o)] |= uint8_t(v << (4 * (((k % 8) / 2) & 1)));  // nibble j's half
        }
        const uint8_t* s = w.scale + r * w.scale_cols;
        for (int64_t b = 0; b < K / 32; ++b) scale_dst[b * 16 + o] = s[b];
        break;
      }
      case WeightFormat::BF16:
        for (int64_t k = 0; k < K; ++k)
          reinterpret_cast<uint16_t*>(dst)[(k / 2) * 32 + 2 * o + (k & 1)] = w.bf16()[r * K + k];
        break;
      case WeightFormat::F32:
        for (int64_t k = 0; k < K; ++k)
          reinterpret_cast<float*>(dst)[k * 16 + o] = w.f32()[r * K + k];
        break;
      case WeightFormat::Fp8Row:
        break;
    }
  }
}

// Whether every bf16 value is 0 or has magnitude in [2^-56, max] (finite).
bool bf16_not_tiny(const uint16_t* v, int64_t n) {
  return std::all_of(v, v + n, [](uint16_t b) {
    const int e = (b >> 7) & 0xff;
    return (b & 0x7fff) == 0 || (e >= 127 - 56 && e != 255);
  });
}

// --- the scalar path ---

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
    case WeightFormat::Fp8Block:  // a scale per 32x32 block
    case WeightFormat::Fp8Row:    // a scale per row and 32 columns
      for (int i = 0; i < 32; ++i) out[i] = e4m3_to_f32(w.u8()[r * K + k0 + i]);
      return e8m0_to_f32(
          w.scale[(w.format == WeightFormat::Fp8Block ? r / 32 : r) * w.scale_cols + b]);
    case WeightFormat::Fp4Row:
      for (int i = 0; i < 32; ++i) out[i] = e2m1_packed_get(w.u8() + r * (K / 2), size_t(k0 + i));
      return e8m0_to_f32(w.scale[r * w.scale_cols + b]);
  }
  return 0;
}

// One output: Σ_b P_b · ws_b in the canonical order over the input values xv[K] (for QLin the
// act_quant QDQ values, whose partials are exactly σx times those over the codes: isa.h's Job).
float dot_row(const Weight& w, int64_t r, const float* xv, bool exact) {
  const int64_t nb = w.cols() / 32;
  float acc = 0, wb[32];
  double acc_d = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const float s = weight_block(w, r, b, wb);  // a power of two (or 1): exact
    if (exact) {
      double p = 0;
      for (int i = 0; i < 32; ++i) p += double(xv[b * 32 + i]) * wb[i];
      acc_d += p * s;
    } else {
      acc = std::fma(linear_block_dot(xv + b * 32, wb), s, acc);  // kernels/reduce.h
    }
  }
  return exact ? float(acc_d) : acc;
}

// --- dispatch ---

// The vector kernels of a non-scalar ISA. The AVX-512 linears also use AVX512_VBMI's byte
// permutes (every AVX512_BF16 CPU but Cooper Lake has them); without, the AVX2 kernels run.
const linear_isa::Kernels& kernels_for(Isa isa) {
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  return isa == Isa::Avx512 && vbmi ? linear_isa::kAvx512 : linear_isa::kAvx2;
}

bool bf16_products_ok() {
  static const bool ok = cpu_best_isa() == Isa::Avx512 && linear_isa::avx512_dpbf16_is_canonical();
  return ok;
}
bool int_products_ok() {
  static const bool ok = cpu_best_isa() == Isa::Avx512 && __builtin_cpu_supports("avx512vnni");
  return ok;
}

// Auto's choices (kernels/linear.h): vdpbf16ps for a call of n rows, integer products for fp4.
bool auto_bf16_products(int64_t n) {
  return n == 1 || dpbf16_speedup() >= 1.0;
}
// The byte products decode 64 fp4 weight bytes with three shuffles where the bf16 pairs take six
// operations, so they are the faster kernel even where VNNI multiplies no faster than the others
// (here: 2x at one row, 1.5x at four, in L2, with product rates read at 1.07-2.0).
bool auto_int_products() {
  return int16_speedup() >= 0.75;
}

// Rows of an AMX GEMV call (isa.h's Job::amx).
constexpr int64_t kAmxGemvRows = 64;
// Quantized calls of up to this many rows join linear_many's pass on AMX tiles, as groups of
// kAmxGemvRows rows over runs of tiles small enough to stay in L2 between the groups (a
// prefill's experts, 15-113 rows each at 512 tokens: a 72-row fp4 call ran 725 GFLOP/s as a GEMM
// of its own, 1,600 so).
constexpr int64_t kAmxManyRows = 4 * kAmxGemvRows;
// Tiles of a run that stays in a core's L2 (256 KiB) while several groups of rows read it.
int64_t l2_run_tiles(int64_t tile_bytes) {
  return std::max<int64_t>(1, (int64_t(256) << 10) / tile_bytes);
}
// fp4 GEMVs of up to this many rows multiply integers even where AMX tiles could serve them:
// streaming from memory (`bench linear`) the integer products reached 0.83-0.94 of the read
// bandwidth at 1 row and 0.68-0.76 at 4, the tiles 0.59-0.70 at 4; at 8 rows 0.45 against
// 0.46-0.61.
constexpr int64_t kIntGemvRows = 4;

// How a call of n rows over `pw` multiplies: on AMX tiles, in integers (fp4 GEMVs with quantized
// inputs, isa.h's Job::xi), with bf16 inputs (quantized codes or dense values, for the tiles or
// vdpbf16ps), else in fp32 FMAs.
struct CallProducts {
  bool amx = false, ints = false, bf16 = false;
};
CallProducts call_products(const linear_isa::Kernels& kern, const PreparedLinear& pw, int64_t n,
                           bool gemv) {
  const Weight& w = pw.weight();
  const LinearProducts p = linear_products();
  const bool auto_or_amx = p == LinearProducts::Auto || p == LinearProducts::Amx;
  const bool bf16_exact = w.quant_input || pw.packed().bf16_products;
  const bool int_gemv = w.quant_input && gemv && kern.int_codes && int_products_ok() &&
                        w.format == WeightFormat::Fp4Row &&
                        (p == LinearProducts::Int16Dot || (auto_or_amx && auto_int_products()));
  // A GEMV of up to 4 rows over bf16 weights (the head) streams fastest in fp32 FMAs on its
  // inputs as they are, where vdpbf16ps multiplies slower than FMAs (Sapphire Rapids, the small
  // model's head a step: 1 row 16.5 ms so, 18.0 on the tiles, 18.5 with vdpbf16ps; 4 rows
  // 17.2-17.5 against 18.2-18.3 on the tiles).
  const bool fma_row =
      gemv && n <= 4 && w.format == WeightFormat::BF16 && !w.quant_input && !auto_bf16_products(2);
  CallProducts c;
  c.amx = auto_or_amx && &kern == &linear_isa::kAvx512 && w.format != WeightFormat::F32 &&
          amx_canonical() && bf16_exact && pw.packed().foldable_scales &&
          !(int_gemv && n <= kIntGemvRows) && !fma_row;
  c.ints = int_gemv && !c.amx;
  // Else vdpbf16ps where chosen (or fp32 FMAs, same bits).
  c.bf16 = !fma_row && kern.to_bf16 && bf16_exact &&
           (c.amx || (!c.ints && bf16_products_ok() && p != LinearProducts::Fp32Fma &&
                      (p == LinearProducts::Bf16Dot || auto_bf16_products(n))));
  return c;
}

// Checks a call and returns its number of outputs.
int64_t check_call(const Weight& w, const LinearArgs& a) {
  const int64_t n_out = a.n_out < 0 ? w.rows() - a.row0 : a.n_out;
  DI_CHECK(w.present(), "linear over an absent weight");
  DI_CHECK(w.cols() % 32 == 0, w.name, ": input dim ", w.cols(), " is not a multiple of 32");
  DI_CHECK(a.row0 >= 0 && n_out >= 0 && a.row0 + n_out <= w.rows(), w.name, ": rows [", a.row0,
           ", ", a.row0 + n_out, ") out of range");
  if (w.quant_input)
    DI_CHECK(w.format == WeightFormat::Fp8Block || w.format == WeightFormat::Fp4Row, w.name,
             ": QLin needs fp8 or fp4 weights");
  else
    DI_CHECK(w.format != WeightFormat::Fp4Row && !a.x_rows, w.name,
             ": a plain linear over fp4 codes, or over input rows by pointer");
  return n_out;
}

// Scratch for n rows of act-quantized inputs: the QDQ values xq [n, K] (but for bf16 products,
// on the tiles or vdpbf16ps, which read the bf16 copy alone: a prefill's experts wrote 25 MB a
// layer for nothing), then the same as bf16 (bf16 products) or as the integer codes of isa.h's
// Job (integer products, which also read xq): bytes xi [n, 2K], corrections xc [n, K/32] and
// scales xs [n, K/32]. The bf16 copy is in the chains' order (isa.h's Job::xb) unless the tiles
// read it.
struct QuantScratch {
  int64_t xqb = 0, xi = 0, xc = 0, xs = 0, bytes = 0;  // offsets (0: absent) and the total
  bool fp32 = true;                                    // xq at offset 0
  bool chain = false;                                  // xqb in the chains' order
  QuantScratch(int64_t n, int64_t K, bool bf16, bool ints, bool tiles)
      : fp32(!bf16 || ints), chain(bf16 && !tiles) {
    bytes = fp32 ? round_up(n * K * 4, 64) : 64;  // (else the offsets after it stay nonzero)
    // (AMX tiles read groups of 16 rows: room for 15 more after the last. They hold whatever
    // the scratch held before, always initialised memory, and their outputs are never read.)
    if (bf16)
      xqb = std::exchange(bytes, bytes + round_up((n + 15) * linear_isa::xb_stride(K) * 2, 64));
    if (ints) {
      xi = std::exchange(bytes, bytes + round_up(n * K * 2, 64));
      xc = std::exchange(bytes, bytes + round_up(n * (K / 32) * 4, 64));
      xs = std::exchange(bytes, bytes + round_up(n * (K / 32) * 4, 64));
    }
  }
};

// Quantizes rows [i0, i1) of a call's input into scratch `s` (laid out as above).
void quantize_rows(const linear_isa::Kernels& kern, const LinearArgs& a, int64_t K,
                   const QuantScratch& l, uint8_t* s, int64_t i0, int64_t i1) {
  float* xq = l.fp32 ? reinterpret_cast<float*>(s) + i0 * K : nullptr;
  const int64_t ldb = linear_isa::xb_stride(K);
  uint16_t* xqb = l.xqb ? reinterpret_cast<uint16_t*>(s + l.xqb) + i0 * ldb : nullptr;
  if (a.x_rows)
    for (int64_t i = i0; i < i1; ++i)
      kern.quantize(a.x_rows[i], K, 1, K, xq ? xq + (i - i0) * K : nullptr,
                    xqb ? xqb + (i - i0) * ldb : nullptr);
  else
    kern.quantize(a.x + i0 * a.ldx, a.ldx, i1 - i0, K, xq, xqb);
  if (l.chain) kern.chain_rows(xqb, i1 - i0, K);
  if (l.xi)
    kern.int_codes(xq, i1 - i0, K, reinterpret_cast<int8_t*>(s + l.xi) + i0 * K * 2,
                   reinterpret_cast<int32_t*>(s + l.xc) + i0 * (K / 32),
                   reinterpret_cast<float*>(s + l.xs) + i0 * (K / 32));
}

// The job of a whole call; quantized inputs (when `q` is set) come from scratch laid out as
// above.
linear_isa::Job call_job(const PreparedLinear& pw, const LinearArgs& a, const uint8_t* q,
                         const QuantScratch& l) {
  const int64_t K = pw.cols(), hi = a.n_out < 0 ? pw.rows() : a.row0 + a.n_out;
  const bool qb = q && l.xqb, qi = q && l.xi;
  return {.w = &pw.packed(),
          .x = !q       ? a.x
               : l.fp32 ? reinterpret_cast<const float*>(q)
                        : nullptr,
          .ldx = q ? K : a.ldx,
          .xb = qb ? reinterpret_cast<const uint16_t*>(q + l.xqb) : nullptr,
          .xi = qi ? reinterpret_cast<const int8_t*>(q + l.xi) : nullptr,
          .xc = qi ? reinterpret_cast<const int32_t*>(q + l.xc) : nullptr,
          .xs = qi ? reinterpret_cast<const float*>(q + l.xs) : nullptr,
          .n = a.n,
          .y = a.y,
          .ldy = a.ldy,
          .lo = a.row0,
          .hi = hi,
          .round_bf16 = a.round_bf16,
          .t0 = a.row0 / 16,
          .t1 = (hi + 15) / 16};
}

// The part of a call's job for its rows [i0, i0 + n) and tiles [t0, t1).
linear_isa::Job sub_job(const linear_isa::Job& base, int64_t i0, int64_t n, int64_t t0,
                        int64_t t1) {
  const int64_t K = base.w->cols;
  linear_isa::Job j = base;
  j.n = n;
  j.x = base.x + i0 * base.ldx;
  if (base.xb) j.xb = base.xb + i0 * linear_isa::xb_stride(K);
  if (base.xi) {
    j.xi = base.xi + i0 * K * 2;
    j.xc = base.xc + i0 * (K / 32);
    j.xs = base.xs + i0 * (K / 32);
  }
  j.y = base.y + i0 * base.ldy;
  j.t0 = t0;
  j.t1 = t1;
  return j;
}

// Rows of one GEMV group: a kernel call runs each weight block against this many rows.
int64_t gemv_group_rows(const linear_isa::Kernels& kern, bool amx) {
  return amx ? kAmxGemvRows : kern.gemv_rows;
}

// The most rows a call takes on the GEMV (run_fast's comment below says why).
int64_t gemv_max_rows(const linear_isa::Kernels& kern, const PreparedLinear& pw, bool amx) {
  const Weight& w = pw.weight();
  return amx                                                ? kAmxGemvRows
         : w.format == WeightFormat::BF16 && !w.quant_input ? 4 * kern.gemv_rows
         : w.format == WeightFormat::Fp8Block               ? 2 * kern.gemv_rows
                                                            : kern.gemv_rows;
}

void run_fast(const PreparedLinear& pw, const LinearArgs& a, Isa isa) {
  const Weight& w = pw.weight();
  const bool quant = w.quant_input;
  const PackedWeight& pk = pw.packed();
  const int64_t K = w.cols(), n = a.n;
  const int64_t n_out = check_call(w, a);
  if (n <= 0 || n_out == 0) return;
  const linear_isa::Kernels& kern = kernels_for(isa);
  const int64_t t_begin = a.row0 / 16, t_end = (a.row0 + n_out + 15) / 16;
  const int64_t n_tiles = t_end - t_begin;
  LinearPath path = linear_path();
  // GEMM for many rows, unless the weight has too few outputs to make panels for the threads
  // (the hyper-connection projections, the router): then GEMV tasks over groups of rows. On AMX
  // tiles a GEMV call streams each weight block once for up to 64 rows (a 64-row expert call:
  // 1,530-1,590 GFLOP/s, the packed GEMM 990-1,120). Else a plain bf16 weight (the head) stays
  // on the GEMV up to four groups of rows, an fp8 one up to two: their two-tile FMAs, each run
  // of tiles read from memory once for all the groups, outrun the GEMM's packing there (2
  // threads, 16 rows: bf16 262 against 185 GFLOP/s, fp8 equal to 1.3x; docs/benchmarks.md).
  const CallProducts gemv_prod = call_products(kern, pw, n, true);
  const int64_t gemv_max = gemv_max_rows(kern, pw, gemv_prod.amx);
  if (path == LinearPath::Auto)
    path = n <= gemv_max || n_tiles <= 2 * linear_isa::kGemmPanelTiles ? LinearPath::Gemv
                                                                       : LinearPath::Gemm;
  const CallProducts prod =
      path == LinearPath::Gemv ? gemv_prod : call_products(kern, pw, n, false);
  ThreadPool& pool = ThreadPool::global();

  // Quantized inputs: the act_quant QDQ of §3.4, once per row for every output.
  const QuantScratch layout(n, K, quant && prod.bf16, quant && prod.ints, prod.amx);
  uint8_t* q = quant ? t_act.bytes(size_t(layout.bytes)) : nullptr;
  if (quant)  // in chunks of 8 rows from 16 rows on, else in one chunk on this thread
    pool.parallel_for(n, n < 16 ? n : 8, [&](int64_t i0, int64_t i1) {
      quantize_rows(kern, a, K, layout, q, i0, i1);
    });
  linear_isa::Job base = call_job(pw, a, q, layout);
  if (!quant && prod.bf16) {
    // Dense inputs that are bf16 values (and not tiny) take the bf16 products too (with room
    // after them for the GEMM's tiles, which read groups of 16 rows).
    uint16_t* xb =
        reinterpret_cast<uint16_t*>(t_act.bytes(size_t((n + 15) * linear_isa::xb_stride(K) * 2)));
    if (kern.to_bf16(a.x, a.ldx, n, K, xb)) {
      base.xb = xb;
      if (!prod.amx) kern.chain_rows(xb, n, K);
    }
  }
  base.amx = prod.amx && base.xb;  // (dense inputs that were not bf16 values: not)

  const int64_t threads = pool.size();
  if (path == LinearPath::Gemv) {
    // Groups of up to gemv_rows rows. A small weight is not split (nor worth waking the pool
    // for, with one group of rows).
    const int64_t gr = gemv_group_rows(kern, base.amx), groups = (n + gr - 1) / gr;
    // A task is a run of tiles for every group of rows in turn: with several groups, a run small
    // enough to stay in this core's cache is read from memory once for all of them. One group
    // takes one run per thread: a run's start costs a window's wait before its stream flows, and
    // two or four runs per thread streamed 4-15 % slower (docs/benchmarks.md).
    const int64_t run = groups > 1 ? l2_run_tiles(pk.tile_bytes)
                        : n_tiles * pk.tile_bytes < (int64_t(64) << 10)
                            ? n_tiles
                            : (n_tiles + threads - 1) / threads;
    const int64_t runs = (n_tiles + run - 1) / run;
    pool.parallel_for(runs, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i0 = 0; i0 < n; i0 += gr)
          kern.gemv(sub_job(base, i0, std::min(gr, n - i0), t_begin + c * run,
                            t_begin + std::min(n_tiles, (c + 1) * run)));
    });
    return;
  }
  // GEMM: tasks are (panel of tiles, range of rows); rows are split only when there are too few
  // panels to keep every thread busy.
  // AMX panels: one a thread when that is at most kAmxPanelTilesMax tiles (512 outputs: the
  // inputs read twice, not 6 times), else of 3 to 6 tiles, the size whose panels spread most
  // evenly over the threads.
  int64_t pt = linear_isa::kGemmPanelTiles;
  if (base.amx && n_tiles <= threads * linear_isa::kAmxPanelTilesMax) {
    pt = std::max<int64_t>(3, (n_tiles + threads - 1) / threads);
  } else if (base.amx) {
    auto most = [&](int64_t p) { return ((n_tiles + p - 1) / p + threads - 1) / threads * p; };
    for (int64_t p = linear_isa::kAmxPanelTiles; p >= 3; --p)
      if (p == linear_isa::kAmxPanelTiles || most(p) < most(pt)) pt = p;
  }
  const int64_t n_panels = (n_tiles + pt - 1) / pt;
  // Rows split in parts where panels alone leave a thread idle at the end: a 512-output weight's
  // 11 panels over 2 threads ran 6 against 5 (each part of 64 rows or more still amortizes the
  // packing of its panel's chunks).
  auto excess = [&](int64_t parts) {
    const int64_t tasks = n_panels * parts;
    return double((tasks + threads - 1) / threads * threads) / double(tasks);
  };
  int64_t row_parts = 1;
  for (int64_t parts = 2; parts <= 4 && n / parts >= 64; ++parts)
    if (excess(parts) < excess(row_parts) - 0.02) row_parts = parts;
  if (n_panels < threads * 2)
    row_parts = std::max(row_parts, std::min((threads * 2 + n_panels - 1) / n_panels, n / 16));
  const int64_t rows_per = (n + row_parts - 1) / row_parts;
  pool.parallel_for(n_panels * row_parts, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t p = c / row_parts, r0 = (c % row_parts) * rows_per;
      const int64_t r1 = std::min(n, r0 + rows_per);
      if (r0 >= r1) continue;
      linear_isa::Job j =
          sub_job(base, r0, r1 - r0, t_begin + p * pt, std::min(t_end, t_begin + (p + 1) * pt));
      j.scratch = t_task.bytes(size_t(kern.gemm_scratch_bytes(j.n, K)));
      kern.gemm(j);
    }
  });
}

// Whether a quantized call of n rows (more than a GEMV's) joins linear_many's pass as GEMM panels
// (vdpbf16ps without AMX tiles: a prefill's experts, each of which else wakes the pool three
// times and quantizes its rows for w1 and again for w3).
bool many_gemm(const linear_isa::Kernels& kern, const PreparedLinear& w, int64_t n) {
  return n > gemv_max_rows(kern, w, false) && n <= kAmxManyRows && w.weight().quant_input &&
         &kern == &linear_isa::kAvx512 && !call_products(kern, w, n, true).amx &&
         call_products(kern, w, n, false).bf16;
}

// Several GEMV calls (n <= gemv_max_rows each, in groups of the ISA's gemv_rows over runs of
// tiles where more: a batch of 16's shared expert, 7.5 -> 5.2 ms a step as GEMM panels before;
// or quantized ones of up to kAmxManyRows on AMX tiles or as vdpbf16ps GEMMs: many_gemm) as one
// parallel loop over all their tiles (a GEMM's in panels): one wake-up of the pool instead of one
// per call, and the work balanced over the threads as one stream. Each output is computed
// exactly as run_fast computes it.
void run_many_gemv(std::span<const LinearCall> calls, Isa isa) {
  const linear_isa::Kernels& kern = kernels_for(isa);
  // Per call: its scratch layout and offset; the call that quantizes for it (a call whose input
  // and layout are its predecessor's, an expert's w1 and w3, shares that quantization); whether
  // its scratch holds its inputs as bf16 (a plain call whose weight takes bf16 products) and
  // whether its products run on AMX tiles, or it runs as GEMM panels; its job, and the work
  // units (tiles, or a GEMM's panels) of the calls before it.
  struct Plan {
    QuantScratch l;
    int64_t at;
    size_t owner;
    bool dense_bf16, amx, gemm;
    linear_isa::Job job;
    int64_t first;
  };
  constexpr int64_t kPanel = linear_isa::kGemmPanelTiles;
  // Reused from call to call (no allocation once large enough). Named through a reference: the
  // pool's workers must see this thread's vector, not their own thread_local copy.
  thread_local std::vector<Plan> t_plans;
  std::vector<Plan>& plans = t_plans;
  plans.clear();
  int64_t bytes = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const LinearArgs& a = calls[c].a;
    const bool quant = calls[c].w->weight().quant_input;
    const int64_t K = calls[c].w->cols();
    const bool gemm = many_gemm(kern, *calls[c].w, a.n);
    const CallProducts prod = call_products(kern, *calls[c].w, a.n, !gemm);
    const QuantScratch l(quant ? a.n : 0, K, quant && prod.bf16, quant && prod.ints, prod.amx);
    const LinearArgs* p = c ? &calls[c - 1].a : nullptr;
    // (Same n and K, both quantized: the layouts agree when they hold the same parts.)
    const bool shared = quant && p && p->x == a.x && p->x_rows == a.x_rows && p->n == a.n &&
                        p->ldx == a.ldx && calls[c - 1].w->weight().quant_input &&
                        calls[c - 1].w->cols() == K && plans[c - 1].l.fp32 == l.fp32 &&
                        plans[c - 1].l.xqb == l.xqb && plans[c - 1].l.xi == l.xi;
    plans.push_back(
        {l, bytes, shared ? plans[c - 1].owner : c, !quant && prod.bf16, prod.amx, gemm});
    bytes += quant       ? (shared ? 0 : l.bytes)
             : prod.bf16 ? round_up(a.n * linear_isa::xb_stride(K) * 2, 64)
                         : 0;
  }
  // Rows read through pointers into the tiles' bf16 alone (a prefill's experts: each token's
  // row goes to several) are quantized once each, into a bank their calls copy them from.
  thread_local std::vector<const float*> t_bank;
  std::vector<const float*>& bank = t_bank;
  bank.clear();
  int64_t bank_K = 0, bank_at = 0;
  bool bank_chain = false;  // the bank's rows in the chains' order (QuantScratch::chain)
  auto banked = [&](size_t c) {
    const Plan& p = plans[c];
    return p.owner == c && calls[c].a.x_rows && p.l.xqb && !p.l.fp32 && !p.l.xi &&
           calls[c].w->cols() == bank_K && p.l.chain == bank_chain;
  };
  for (size_t c = 0; c < calls.size(); ++c) {
    if (!bank_K && calls[c].a.x_rows) {
      bank_K = calls[c].w->cols();
      bank_chain = plans[c].l.chain;
    }
    if (banked(c)) bank.insert(bank.end(), calls[c].a.x_rows, calls[c].a.x_rows + calls[c].a.n);
  }
  const size_t routed = bank.size();
  std::sort(bank.begin(), bank.end());
  bank.erase(std::unique(bank.begin(), bank.end()), bank.end());
  const int64_t ldb = linear_isa::xb_stride(bank_K);
  if (bank.size() < routed) {
    bank_at = bytes;
    bytes += round_up(int64_t(bank.size()) * ldb * 2, 64);
  } else {
    bank_K = 0;  // no row is shared: each call quantizes its own
  }
  uint8_t* s = t_act.bytes(size_t(bytes));
  uint16_t* const bank_rows = reinterpret_cast<uint16_t*>(s + bank_at);
  ThreadPool& pool = ThreadPool::global();
  if (bank_K)
    pool.parallel_for(int64_t(bank.size()), 4, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        kern.quantize(bank[size_t(u)], bank_K, 1, bank_K, nullptr, bank_rows + u * ldb);
        if (bank_chain) kern.chain_rows(bank_rows + u * ldb, 1, bank_K);
      }
    });
  pool.parallel_for(int64_t(calls.size()), 1, [&](int64_t c0, int64_t c1) {
    for (size_t c = size_t(c0); c < size_t(c1); ++c) {
      const LinearArgs& a = calls[c].a;
      Plan& p = plans[c];
      if (p.dense_bf16) {
        uint16_t* xb = reinterpret_cast<uint16_t*>(s + p.at);
        p.dense_bf16 = kern.to_bf16(a.x, a.ldx, a.n, calls[c].w->cols(), xb);
        if (p.dense_bf16 && !p.amx) kern.chain_rows(xb, a.n, calls[c].w->cols());
      } else if (bank_K && banked(c)) {
        uint16_t* xqb = reinterpret_cast<uint16_t*>(s + p.at + p.l.xqb);
        for (int64_t i = 0; i < a.n; ++i) {
          const auto u = std::lower_bound(bank.begin(), bank.end(), a.x_rows[i]) - bank.begin();
          std::memcpy(xqb + i * ldb, bank_rows + u * ldb, size_t(bank_K) * 2);
        }
      } else if (calls[c].w->weight().quant_input && p.owner == c) {
        quantize_rows(kern, a, calls[c].w->cols(), p.l, s + p.at, 0, a.n);
      }
    }
  });
  int64_t total = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    Plan& p = plans[c];
    const bool quant = calls[c].w->weight().quant_input;
    p.job = call_job(*calls[c].w, calls[c].a, quant ? s + plans[p.owner].at : nullptr, p.l);
    if (p.dense_bf16) p.job.xb = reinterpret_cast<const uint16_t*>(s + p.at);
    p.job.amx = p.amx && p.job.xb;
    p.first = total;
    total += p.gemm ? (p.job.t1 - p.job.t0 + kPanel - 1) / kPanel : p.job.t1 - p.job.t0;
  }
  const int64_t grain = std::max<int64_t>(1, total / (pool.size() * 4));
  pool.parallel_for(total, grain, [&](int64_t c0, int64_t c1) {
    auto after = [](int64_t i, const Plan& p) { return i < p.first; };
    size_t c = size_t(std::upper_bound(plans.begin(), plans.end(), c0, after) - plans.begin()) - 1;
    for (int64_t at = c0; at < c1; ++c) {
      const linear_isa::Job& j = plans[c].job;
      const int64_t units = plans[c].gemm ? (j.t1 - j.t0 + kPanel - 1) / kPanel : j.t1 - j.t0;
      const int64_t end = std::min(c1, plans[c].first + units);
      if (end > at && plans[c].gemm) {
        for (int64_t u = at - plans[c].first; u < end - plans[c].first; ++u) {
          linear_isa::Job g =
              sub_job(j, 0, j.n, j.t0 + u * kPanel, std::min(j.t1, j.t0 + (u + 1) * kPanel));
          g.scratch = t_task.bytes(size_t(kern.gemm_scratch_bytes(j.n, j.w->cols)));
          kern.gemm(g);
        }
        at = end;
      } else if (end > at) {
        const int64_t base = j.t0 - plans[c].first;
        const int64_t gr = gemv_group_rows(kern, j.amx);
        if (j.n <= gr) {
          kern.gemv(sub_job(j, 0, j.n, base + at, base + end));
        } else {  // groups of rows over runs of tiles that stay in L2 for all of them
          const int64_t run = l2_run_tiles(j.w->tile_bytes);
          for (int64_t r0 = at; r0 < end; r0 += run)
            for (int64_t i0 = 0; i0 < j.n; i0 += gr)
              kern.gemv(sub_job(j, i0, std::min(gr, j.n - i0), base + r0,
                                base + std::min(end, r0 + run)));
        }
        at = end;
      }
    }
  });
}

// Products per second of fp32 FMAs (16 per instruction), vdpbf16ps (32) and vpdpbusd (32 16-bit
// products: 64 byte products, two per 16-bit one), each
// the best of alternated samples of about 50 us, so that a busy moment shows in none, taken in
// four bursts 2 ms apart: on Sapphire Rapids VNNI runs at about 2x the FMA rate for a few
// tens of microseconds and at 1.1-1.5x once it has run for longer, and a single burst read one or
// the other from process to process.
struct ProductRates {
  double fma = 0, bf16 = 0, int16 = 0;
};
const ProductRates& product_rates() {
  static const ProductRates r = [] {
    using linear_isa::ProductKind;
    ProductRates p;
    if (cpu_best_isa() != Isa::Avx512) return p;
    auto seconds = [](ProductKind k) {
      const auto t0 = std::chrono::steady_clock::now();
      linear_isa::avx512_product_chains(k, 4096);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double t[3] = {1e30, 1e30, 1e30};
    const bool vnni = __builtin_cpu_supports("avx512vnni");
    for (int burst = 0; burst < 4; ++burst) {
      if (burst) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (int rep = 0; rep < 7; ++rep) {
        t[0] = std::min(t[0], seconds(ProductKind::Fp32));
        t[1] = std::min(t[1], seconds(ProductKind::Bf16));
        if (vnni) t[2] = std::min(t[2], seconds(ProductKind::Int16));
      }
    }
    const double n = 16.0 * 16 * 4096;  // lanes x chains x rounds
    p.fma = n / t[0];
    p.bf16 = 2 * n / t[1];
    p.int16 = vnni ? 2 * n / t[2] : 0.0;
    return p;
  }();
  return r;
}

}  // namespace

void linear_ref(const Weight& w, const LinearArgs& a) {
  const int64_t K = w.cols(), n_out = check_call(w, a);
  // Quantized inputs: the act_quant QDQ of §3.4, once per row, in this thread's scratch.
  const float* xv = a.x;
  int64_t ldv = a.ldx;
  if (w.quant_input) {
    uint8_t* s = t_act.bytes(size_t(a.n * K * 4 + K + K / 32));
    float* xq = reinterpret_cast<float*>(s);
    uint8_t *codes = s + a.n * K * 4, *scales = codes + K;
    for (int64_t i = 0; i < a.n; ++i) {
      act_quant(a.x_rows ? a.x_rows[i] : a.x + i * a.ldx, K, codes, scales);
      fp8_dequant(codes, scales, K, xq + i * K);
    }
    xv = xq;
    ldv = K;
  }
  ThreadPool::global().parallel_for(n_out, 64, [&](int64_t o0, int64_t o1) {
    for (int64_t i = 0; i < a.n; ++i)
      for (int64_t o = o0; o < o1; ++o)
        a.y[i * a.ldy + o] = dot_row(w, a.row0 + o, xv + i * ldv, a.exact);
  });
}

void linear(const PreparedLinear& w, const LinearArgs& a) {
  const Isa isa = cpu_isa();
  if (a.exact || isa == Isa::Scalar) {
    linear_ref(w.weight(), a);
    const int64_t n_out = a.n_out < 0 ? w.rows() : a.n_out;
    if (a.round_bf16)
      for (int64_t r = 0; r < a.n; ++r) round_bf16_inplace(a.y + r * a.ldy, n_out);
  } else {
    run_fast(w, a, isa);
  }
}

void linear_many(std::span<const LinearCall> calls) {
  const Isa isa = cpu_isa();
  const bool gemv_ok = isa != Isa::Scalar && linear_path() != LinearPath::Gemm;
  thread_local std::vector<LinearCall> small;  // reused: no allocation once large enough
  small.clear();
  for (const LinearCall& c : calls) {
    const LinearArgs& a = c.a;
    if (a.n <= 0) continue;
    check_call(c.w->weight(), a);
    // (Quantized calls on AMX tiles too: a prefill's experts, each of which else wakes the pool
    // twice and quantizes its rows for w1 and again for w3.)
    const linear_isa::Kernels& kern = kernels_for(isa);
    if (gemv_ok && !a.exact &&
        (a.n <= gemv_max_rows(kern, *c.w, false) ||
         (a.n <= kAmxManyRows && c.w->weight().quant_input &&
          call_products(kern, *c.w, a.n, true).amx) ||
         (linear_path() == LinearPath::Auto && many_gemm(kern, *c.w, a.n))))
      small.push_back(c);
    else
      linear(*c.w, a);
  }
  if (!small.empty()) run_many_gemv(small, isa);
}

PreparedLinear::PreparedLinear(const Weight& w) : w_(w) {
  if (!w.present()) return;
  DI_REQUIRE(w.shape.ndim == 2, w.name, ": a linear weight must be 2-D, got ", w.shape.str());
  DI_REQUIRE(w.format != WeightFormat::Fp8Row, w.name,
             ": fp8 row-scaled weights are tables, not linears");
  const int64_t K = w.cols();
  DI_REQUIRE(K % 32 == 0, w.name, ": input dim ", K, " is not a multiple of 32");
  p_.format = w.format;
  p_.cols = K;
  const int64_t n_tiles = (w.rows() + 15) / 16;
  // 16 rows' values: the checkpoint's bytes per row, 16 times.
  p_.tile_bytes = int64_t(w.value_bytes() * 16 / uint64_t(std::max<int64_t>(w.rows(), 1)));
  const int64_t data_bytes = n_tiles * p_.tile_bytes;
  const int64_t scale_bytes = w.format == WeightFormat::Fp4Row ? n_tiles * (K / 32) * 16 : 0;
  owned_bytes_ = uint64_t(data_bytes + scale_bytes);
  buf_ = huge_alloc(size_t(round_up(data_bytes + scale_bytes, 64)));
  uint8_t* buf = buf_.get();
  uint8_t* scale_dst = buf + data_bytes;
  p_.data = buf;
  const bool coded = w.format == WeightFormat::Fp8Block || w.format == WeightFormat::Fp4Row;
  p_.bf16_products =
      coded || (w.format == WeightFormat::BF16 && bf16_not_tiny(w.bf16(), w.shape.numel()));
  const int64_t n_scales = !coded                             ? 0
                           : w.format == WeightFormat::Fp4Row ? w.rows() * (K / 32)
                                                              : (w.rows() + 31) / 32 * w.scale_cols;
  const int lowest = w.quant_input ? 127 - 86 : 127 - 54;  // (PackedWeight::foldable_scales)
  p_.foldable_scales = std::all_of(w.scale, w.scale + n_scales,
                                   [lowest](uint8_t s) { return s >= lowest && s <= 127 + 100; });
  p_.scale = scale_bytes ? scale_dst : w.scale;  // Fp8Block: the checkpoint's grid
  if (w.format == WeightFormat::Fp8Block) p_.scale_cols = w.scale_cols;
  ThreadPool::global().parallel_for(n_tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint8_t* d = buf + t * p_.tile_bytes;
      std::memset(d, 0, size_t(p_.tile_bytes));
      uint8_t* s = scale_bytes ? scale_dst + t * (K / 32) * 16 : nullptr;
      if (s) std::memset(s, 127, size_t((K / 32) * 16));  // padding rows: scale 1
      pack_tile(w, t, d, s);
    }
  });
}

void weight_row(const Weight& w, int64_t r, float* out) {
  for (int64_t b = 0; b < w.cols() / 32; ++b) {
    const float s = weight_block(w, r, b, out + b * 32);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] *= s;
  }
}

void set_linear_path(LinearPath p) {
  g_path.store(int(p), std::memory_order_relaxed);
}
LinearPath linear_path() {
  return LinearPath(g_path.load(std::memory_order_relaxed));
}

void set_linear_products(LinearProducts p) {
  current_products().store(int(p), std::memory_order_relaxed);
}
LinearProducts linear_products() {
  return LinearProducts(current_products().load(std::memory_order_relaxed));
}
double dpbf16_speedup() {
  // About 2 on Zen 4, where both issue once per cycle, 0.35-0.5 on Sapphire Rapids.
  return bf16_products_ok() ? product_rates().bf16 / product_rates().fma : 0.0;
}

std::string auto_products_summary() {
  if (!bf16_products_ok()) return "fp32 FMAs";
  std::string s = auto_bf16_products(2) ? "vdpbf16ps" : "vdpbf16ps at 1 row, else fp32 FMAs";
  if (int_products_ok() && auto_int_products()) s = "fp4 GEMVs vpdpbusd; other " + s;
  if (amx_canonical())
    s = "AMX tiles (but GEMVs of up to 4 rows: fp4 vpdpbusd, plain bf16 FMAs); other " + s;
  return s;
}

bool amx_canonical() {
  static const bool ok = amx_available() && linear_isa::amx_is_canonical();
  return ok;
}

bool amx_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    // Linux hands the tile state to a process that asks (ARCH_REQ_XCOMP_PERM, XTILEDATA);
    // the permission holds for all its threads.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0 && cpu_best_isa() == Isa::Avx512;
  }();
  return ok;
}

double int16_speedup() {
  // 1.1-1.5 on Sapphire Rapids sustained (vdpbf16ps at half the FMA rate); about 1 where
  // vdpbf16ps and vpdpbusd issue alike (Zen 4).
  if (!int_products_ok()) return 0.0;
  const ProductRates& p = product_rates();
  return p.int16 / std::max(p.fma, bf16_products_ok() ? p.bf16 : 0.0);
}

}  // namespace deepinfer
