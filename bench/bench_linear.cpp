#include "bench_linear.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "onednn_matmul.h"

namespace deepinfer::bench {

namespace {

// A checkpoint-format weight with valid random codes (no e4m3 NaN) and realistic scales.
struct SynthWeight {
  std::vector<uint8_t> data, scale;
  Weight w;
};

SynthWeight synth_weight(const std::string& fmt, int64_t out, int64_t in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  SynthWeight s;
  Weight& w = s.w;
  w.name = fmt + "[" + std::to_string(out) + "x" + std::to_string(in) + "]";
  w.shape = Shape{out, in};
  w.quant_input = true;  // QLin weights
  if (fmt == "fp8") {
    w.format = WeightFormat::Fp8Block;
    s.data.resize(size_t(out * in));
    for (auto& b : s.data) {
      b = uint8_t(rng());
      if ((b & 0x7f) == 0x7f) b ^= 1;
    }
    w.scale_cols = (in + 31) / 32;
    s.scale.resize(size_t((out + 31) / 32 * w.scale_cols));
  } else if (fmt == "fp4") {
    w.format = WeightFormat::Fp4Row;
    s.data.resize(size_t(out * in / 2));
    for (auto& b : s.data) b = uint8_t(rng());
    w.scale_cols = in / 32;
    s.scale.resize(size_t(out * w.scale_cols));
  } else if (fmt == "bf16") {  // a plain bf16 weight, as the head's: inputs not quantized
    w.format = WeightFormat::BF16;
    w.quant_input = false;
    s.data.resize(size_t(out * in * 2));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (size_t i = 0; i < s.data.size(); i += 2) {
      const uint16_t h = f32_to_bf16(nd(rng));
      std::memcpy(&s.data[i], &h, 2);
    }
  } else {
    throw Error(str_cat("bench linear: unknown format '", fmt, "' (expected fp8, fp4 or bf16)"));
  }
  for (auto& b : s.scale) b = uint8_t(118 + rng() % 6);
  w.data = s.data.data();
  w.scale = s.scale.empty() ? nullptr : s.scale.data();
  return s;
}

std::vector<float> random_rows(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(n * k));
  for (auto& v : x) v = round_bf16(nd(rng));
  return x;
}

// Best time of `reps` passes of fn over `calls` calls.
template <typename F>
double best_time(int reps, int64_t calls, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    for (int64_t c = 0; c < calls; ++c) fn(c);
    best = std::min(best, now_s() - t0);
  }
  return best;
}

void settle() {  // lets the other library's spinning threads go to sleep
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

std::vector<LinearShape> flash_shapes() {
  return {{5120, 1280, "wq_a"},    {1280, 32768, "wq_b"}, {8192, 5120, "wo_b"},
          {5120, 2304, "w1/w3"},   {2304, 5120, "w2"},    {5120, 512, "wkv"},
          {1280, 4096, "idx.wq_b"}};
}

void bench_bandwidth(Reporter& rep, uint64_t bytes, int reps) {
  const double bw = read_bandwidth_gbs(bytes, reps);
  rep.print(Row("bandwidth")
                .add("threads", ThreadPool::global().size())
                .add("buffer", human_bytes(double(bytes)))
                .add("read_gbs", bw, 2));
}

void bench_pool(Reporter& rep, int calls) {
  ThreadPool& pool = ThreadPool::global();
  const int64_t n = pool.size();
  std::vector<int64_t> sink(static_cast<size_t>(n));
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++sink[size_t(i)];
  };
  pool.parallel_for(n, 1, body);
  const double t = best_time(3, calls, [&](int64_t) { pool.parallel_for(n, 1, body); });
  rep.print(Row("pool")
                .add("threads", pool.size())
                .add("calls", int64_t(calls))
                .add("us_per_parallel_for", t / calls * 1e6, 3));
}

void bench_linear(Reporter& rep, const LinearBenchOptions& opt) {
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  const std::vector<LinearShape> shapes = opt.shapes.empty() ? flash_shapes() : opt.shapes;
  rep.note(str_cat("isa ", isa_name(cpu_isa()), ", ", threads, " threads; working set >= ",
                   human_bytes(double(opt.working_set)), " of weights per measurement"));
  if (const double sp = dpbf16_speedup(); sp > 0)  // how exact products are multiplied
    rep.print(Row("linear_products")
                  .add("dpbf16_vs_fma_rate", sp, 2)
                  .add("int16_vs_best_rate", int16_speedup(), 2)
                  .add("products", auto_products_summary()));
  const bool use_dnn = opt.onednn && onednn_available();
  const double peak = use_dnn ? onednn_peak_gflops(threads) : 0;
  settle();
  for (const std::string& fmt : opt.formats)
    for (const LinearShape& sh : shapes) {
      const SynthWeight sw = synth_weight(fmt, sh.out, sh.in, uint64_t(sh.in * 31 + sh.out));
      const uint64_t bytes = sw.w.nbytes();
      const int64_t copies = std::max<int64_t>(2, int64_t(opt.working_set / bytes) + 1);
      std::vector<PreparedLinear> ws;
      ws.reserve(size_t(copies));
      for (int64_t c = 0; c < copies; ++c) ws.emplace_back(sw.w);
      int64_t max_rows = 1;
      for (int64_t n : opt.gemv_rows) max_rows = std::max(max_rows, n);
      for (int64_t n : opt.gemm_rows) max_rows = std::max(max_rows, n);
      std::vector<float> y(size_t(max_rows * sh.out));
      // --- GEMV, a few rows: the decode (and verify) case. Pairs of (limit: a plain read of the
      // same copies, kernel: one GEMV over each copy), alternated.
      std::vector<std::span<const uint8_t>> spans;
      for (const PreparedLinear& p : ws) spans.push_back(p.packed_span());
      uint64_t packed = 0;
      for (const auto& sp : spans) packed += sp.size();
      for (int64_t n : opt.gemv_rows) {
        const auto xn = random_rows(n, sh.in, 1);
        auto gemv_pass = [&] {
          const double t0 = now_s();
          for (int64_t c = 0; c < copies; ++c) linear(ws[size_t(c)], xn.data(), n, y.data());
          return now_s() - t0;
        };
        gemv_pass();
        PairStats gp;
        for (int r = 0; r < opt.pairs; ++r) {
          const double tl = sweep_seconds(spans), tk = gemv_pass();
          gp.add(double(packed) / tk / 1e9, double(packed) / tl / 1e9);
        }
        Row grow("linear_gemv");
        grow.add("format", fmt)
            .add("shape", str_cat(sh.in, "->", sh.out))
            .add("layer", sh.name)
            .add("rows", n)
            .add("working_set", human_bytes(double(packed)))
            .add("us_per_call", double(packed) / median(gp.figure) / 1e3 / double(copies), 1);
        add_pairs(grow, gp, "gbs", "limit_gbs");
        rep.print(grow);
      }
      // --- GEMM: prefill and batched decode, alternated with oneDNN's bf16 matmul ---
      std::unique_ptr<OnednnMatmul> dn;
      std::vector<float> deq;
      for (int64_t M : opt.gemm_rows) {
        const auto x = random_rows(M, sh.in, 2);
        const double flops = 2.0 * double(M) * double(sh.in) * double(sh.out);
        // Enough calls for ~0.15 s per sample, cycling through the copies.
        const double t_one =
            best_time(1, 1, [&](int64_t) { linear(ws[0], x.data(), M, y.data()); });
        const int64_t calls = std::max<int64_t>(copies, int64_t(0.15 / std::max(t_one, 1e-6)));
        auto ours = [&] {
          return flops * double(calls) /
                 best_time(
                     1, calls,
                     [&](int64_t c) { linear(ws[size_t(c % copies)], x.data(), M, y.data()); }) /
                 1e9;
        };
        Row row("linear_gemm");
        row.add("format", fmt)
            .add("shape", str_cat(sh.in, "->", sh.out))
            .add("layer", sh.name)
            .add("rows", M);
        if (!use_dnn) {
          std::vector<double> g;
          for (int r = 0; r < opt.pairs; ++r) g.push_back(ours());
          row.add("gflops", median(g), 1);
          rep.print(row);
          continue;
        }
        dn = std::make_unique<OnednnMatmul>(M, sh.in, sh.out);
        if (deq.empty()) {
          deq.resize(size_t(sh.out * sh.in));
          for (int64_t r = 0; r < sh.out; ++r) weight_row(sw.w, r, deq.data() + r * sh.in);
        }
        const int64_t dcopies =
            std::max<int64_t>(2, int64_t(opt.working_set / uint64_t(sh.in * sh.out * 2)) + 1);
        for (int64_t c = 0; c < dcopies; ++c) dn->add_weight(deq.data());
        onednn_set_threads(threads);
        dn->run(0);
        const double td1 = best_time(1, 1, [&](int64_t) { dn->run(0); });
        const int64_t dcalls = std::max<int64_t>(dcopies, int64_t(0.15 / std::max(td1, 1e-6)));
        PairStats mp;
        for (int r = 0; r < opt.pairs; ++r) {
          settle();
          const double g = ours();
          onednn_set_threads(threads);
          const double td = best_time(1, dcalls, [&](int64_t c) { dn->run(int(c % dcopies)); });
          settle();
          mp.add(g, flops * double(dcalls) / td / 1e9);
        }
        dn.reset();
        add_pairs(row, mp, "gflops", "onednn_bf16_gflops", 1);
        // What batch invariance costs: oneDNN's time over ours, minus one (negative: we are
        // faster).
        row.add("invariance_cost", 1.0 / median(mp.ratio) - 1.0, 3);
        if (peak > 0) row.add("peak_gflops", peak, 1);
        rep.print(row);
      }
    }
}

}  // namespace deepinfer::bench
