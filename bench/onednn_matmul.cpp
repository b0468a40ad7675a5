#include "onednn_matmul.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <dnnl.hpp>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace deepinfer::bench {

using dnnl::memory;

struct OnednnMatmul::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  int64_t M, K, N;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory src, dst;
  std::vector<memory> weights;
};

OnednnMatmul::OnednnMatmul(int64_t M, int64_t K, int64_t N) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.M = M;
  m.K = K;
  m.N = N;
  const memory::desc a({M, K}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc b({K, N}, memory::data_type::bf16, memory::format_tag::any);
  const memory::desc c({M, N}, memory::data_type::f32, memory::format_tag::ab);
  m.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), m.eng);
  m.prim = dnnl::matmul(m.pd);
  m.src = memory(a, m.eng);
  m.dst = memory(c, m.eng);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  uint16_t* s = static_cast<uint16_t*>(m.src.get_data_handle());
  for (int64_t i = 0; i < M * K; ++i) s[i] = f32_to_bf16(nd(rng));
}

OnednnMatmul::~OnednnMatmul() = default;

int OnednnMatmul::add_weight(const float* w_nk) {
  Impl& m = *impl_;
  // [K, N] with N-major strides is exactly our [N, K] row-major layout.
  const memory::desc plain({m.K, m.N}, memory::data_type::bf16, memory::format_tag::ba);
  memory w(plain, m.eng);
  uint16_t* p = static_cast<uint16_t*>(w.get_data_handle());
  for (int64_t i = 0; i < m.K * m.N; ++i) p[i] = f32_to_bf16(w_nk[i]);
  memory packed(m.pd.weights_desc(), m.eng);
  dnnl::reorder(w, packed).execute(m.strm, w, packed);
  m.strm.wait();
  m.weights.push_back(packed);
  return int(m.weights.size()) - 1;
}

void OnednnMatmul::run(int weight) {
  Impl& m = *impl_;
  m.prim.execute(m.strm, {{DNNL_ARG_SRC, m.src},
                          {DNNL_ARG_WEIGHTS, m.weights[size_t(weight)]},
                          {DNNL_ARG_DST, m.dst}});
  m.strm.wait();
}

const float* OnednnMatmul::output() const {
  return static_cast<const float*>(impl_->dst.get_data_handle());
}

bool onednn_available() {
  return true;
}

void onednn_set_threads(int n) {
  omp_set_num_threads(n);
}

double onednn_peak_gflops(int threads) {
  onednn_set_threads(threads);
  const int64_t M = 512, K = 4096, N = 4096;
  OnednnMatmul mm(M, K, N);
  std::vector<float> w(size_t(K * N));
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (auto& v : w) v = nd(rng);
  mm.add_weight(w.data());
  mm.run(0);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    mm.run(0);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(M) * double(K) * double(N) / best / 1e9;
}

}  // namespace deepinfer::bench
