// oneDNN's bf16 matmul as the yardstick for our GEMMs (linked into the benchmarks only): y[M, N] =
// x[M, K] · Wᵀ with W given as fp32 [N, K] (our weight layout, dequantized exactly to bf16), the
// weights reordered once into the layout oneDNN prefers, fp32 output.
#pragma once

#include <cstdint>
#include <memory>

namespace deepinfer::bench {

class OnednnMatmul {
 public:
  OnednnMatmul(int64_t M, int64_t K, int64_t N);
  ~OnednnMatmul();
  // Adds a weight (fp32 [N, K], values exact in bf16); returns its index.
  int add_weight(const float* w_nk);
  void run(int weight);
  const float* output() const;  // [M, N]

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this build has oneDNN.
bool onednn_available();
// Sets oneDNN's (OpenMP) thread count.
void onednn_set_threads(int n);

// The machine's matmul FLOP ceiling as a tuned library reaches it: oneDNN's bf16 matmul on a
// large shape (M = 512, K = N = 4096) with `threads` threads, GFLOP/s, best of a few runs.
double onednn_peak_gflops(int threads);

}  // namespace deepinfer::bench
