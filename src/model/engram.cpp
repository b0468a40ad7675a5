// Engram (V41_SPEC.md §9.5): before its block, each Engram layer looks up the table rows its
// n-gram hashes name, projects them into per-copy keys and one value, and adds the value to each
// copy of the stream through that copy's own gate.
#include <cmath>
#include <vector>

#include "core/region_timer.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::engram_layer(int l, Step& st, float* x) {
  ArenaScope scope(arena);
  const LayerWeights& W = ck.layers[size_t(l)];
  const int z = c.engram_index(l);
  const int64_t N = st.N, M = c.hc_mult, D = c.dim, Dm = c.engram_head_dim;
  const int64_t NC = engram.n_cols, LE = engram.n_layers, rows = W.engram_table.rows();
  const float eps = float(c.norm_eps);

  // Table rows (exact bf16 values); ids past the table read as zero. Sharded over a group,
  // each rank reads only the rows of its slice and the sum over the group (one non-zero term
  // per row) completes every lookup exactly.
  ranks::Group* shard = opt.parallel.engram;
  const int64_t lo = shard ? rows * shard->rank() / shard->size() : 0;
  const int64_t hi = shard ? rows * (shard->rank() + 1) / shard->size() : rows;
  ArenaVec<float> ev(size_t(N * NC * Dm), &arena);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t col = 0; col < NC; ++col) {
      const int64_t id = st.engram_ids[size_t((i * LE + z) * NC + col)];
      float* dst = &ev[size_t((i * NC + col) * Dm)];
      if (id < lo || id >= hi)
        std::fill(dst, dst + Dm, 0.0f);
      else
        weight_row(W.engram_table, id, dst);
    }
  if (shard) {
    DI_REGION("comm.engram_lookup");
    shard->all_reduce(ev.data(), ev.size());
  }
  ArenaVec<float> kv(size_t(N * (M + 1) * D), &arena);
  project(lin[size_t(l)].engram_wkv, ev.data(), N, kv.data());

  const float inv_sqrt_d = float(std::pow(double(D), -0.5));
  const std::vector<float>& omega = engram_omega[size_t(z)];
  for (int64_t i = 0; i < N; ++i) {
    const float* V = &kv[size_t((i * (M + 1) + M) * D)];
    for (int64_t cpy = 0; cpy < M; ++cpy) {
      float* h = x + (i * M + cpy) * D;
      const float* Kc = &kv[size_t((i * (M + 1) + cpy) * D)];
      const float* om = &omega[size_t(cpy * D)];
      const float rc = rms_inv(h, D, eps) * rms_inv(Kc, D, eps);
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(h[d]) * om[d] * Kc[d];
      const float delta = (f32(dot) * rc) * inv_sqrt_d;
      const float mag = f32(std::sqrt(std::max(double(std::fabs(delta)), double(1e-6f))));
      const float gate = f32(sigmoid_d(std::copysign(mag, delta)));  // the sign of ±0 is kept
      for (int64_t d = 0; d < D; ++d) h[d] = f32(double(h[d]) + double(gate) * V[d]);
      round(h, D);
    }
  }
}

}  // namespace deepinfer
