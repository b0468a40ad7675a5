// The vision tower (docs/vision.md): ViT blocks and the aligner over one image's patches. Its
// roundings follow the model's numerics: every value the reference holds in bf16 is rounded to
// the activation dtype (bf16, or fp32 in fp32 numerics), each fp32 operation of the reference
// (rotary products and sums, softmax steps, bias adds) is one fp32 rounding, and sums run in
// double and round once (the linears: in fp32 numerics; in bf16 the kernels' canonical order, as
// the text model's); tests/reference/v41ref/vision.py computes the same.
#include <cmath>

#include "kernels/elementwise.h"
#include "model/model_impl.h"

namespace deepinfer {

namespace {

// The prepared linears in order: per block wqkv, wo, w1, w2, then the aligner's two (the patch
// embedding's 3 p^2 inputs are no multiple of the kernels' blocks of 32: it sums directly).
constexpr int kPerBlock = 4;

}  // namespace

bool Model::has_vision() const {
  return impl_->ck.has_vision;
}

const float* Model::image_delimiter(int type) const {
  DI_REQUIRE(impl_->ck.has_vision, "this checkpoint has no vision tower");
  DI_REQUIRE(type == 0 || type == 2 || type == 3, "image_delimiter: type ", type,
             " is no delimiter (0 start, 2 new line, 3 end)");
  return &impl_->image_delims[size_t((type == 0 ? 0 : type == 2 ? 1 : 2) * impl_->c.dim)];
}

// One image's progress through the tower: the stage next to run (0: the patch embedding,
// 1..layers: the blocks, then the final norm and the aligner), the stream and the rotary table.
struct ImageJob {
  ImageJob(const uint16_t* p, int64_t rows, int64_t cols) : patches(p), vit_h(rows), vit_w(cols) {}
  const uint16_t* patches;
  int64_t vit_h, vit_w;
  size_t stage = 0;
  std::vector<float> h, cs, sn;
};

std::shared_ptr<ImageJob> Model::begin_image(const uint16_t* patches, int64_t vit_h,
                                             int64_t vit_w) {
  DI_REQUIRE(impl_->ck.has_vision,
             "this checkpoint has no vision tower (vision_n_layers = ", impl_->c.vision_n_layers,
             ", or no vision.* tensors)");
  DI_REQUIRE(vit_h > 0 && vit_w > 0, "encode_image: an empty patch grid");
  return std::make_shared<ImageJob>(patches, vit_h, vit_w);
}

void Model::encode_image(const uint16_t* patches, int64_t vit_h, int64_t vit_w,
                         std::vector<float>& out) {
  const std::shared_ptr<ImageJob> j = begin_image(patches, vit_h, vit_w);
  while (!advance_image(*j, out)) {
  }
}

bool Model::advance_image(ImageJob& job, std::vector<float>& out) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const int64_t vit_h = job.vit_h, vit_w = job.vit_w;
  std::vector<float>&h = job.h, &cs = job.cs, &sn = job.sn;
  const VisionWeights& V = m.ck.vision;
  const int64_t n = vit_h * vit_w, Dv = c.vision_dim, H = c.vision_n_heads, hd = Dv / H;
  const int64_t F = c.vision_inter_dim, p = c.vision_patch_size, r = c.vision_downsample_ratio;
  const int64_t D = c.dim, half = hd / 2, quarter = half / 2;
  if (m.vision_lin.empty()) {
    for (const VisionBlockWeights& b : V.blocks)
      for (const Weight* w : {&b.wqkv, &b.wo, &b.w1, &b.w2}) m.vision_lin.emplace_back(*w);
    for (const Weight* w : {&V.aligner_w1, &V.aligner_w2}) m.vision_lin.emplace_back(*w);
    m.vision_patch_w.resize(size_t(V.patch_embed.shape.numel()));
    for (size_t i = 0; i < m.vision_patch_w.size(); ++i)
      m.vision_patch_w[i] = bf16_to_f32(V.patch_embed.bf16()[i]);
  }
  // y [rows, out] = x W^T (+ b), each step rounded as the reference rounds it.
  auto lin = [&](const PreparedLinear& w, const Weight* b, const float* x, int64_t rows,
                 std::vector<float>& y) {
    y.resize(size_t(rows * w.rows()));
    linear(w, x, rows, y.data(), m.exact);
    if (b)
      for (size_t i = 0; i < y.size(); ++i) y[i] += bf16_to_f32(b->bf16()[i % size_t(w.rows())]);
    m.round(y.data(), int64_t(y.size()));
  };
  // x [n, Dv] normed with `w`, rounded.
  auto norm = [&](std::vector<float> x, const Weight& w) {
    rmsnorm(x.data(), n, Dv, w.bf16(), 1e-6f);
    m.round(x.data(), n * Dv);
    return x;
  };

  std::vector<float> u, qkv, o, t;
  if (job.stage == 0) {
    const int64_t K = 3 * p * p;
    std::vector<float> x(size_t(n * K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(job.patches[i]);
    h.resize(size_t(n * Dv));
    for_rows(n, [&](int64_t i) {
      for (int64_t d = 0; d < Dv; ++d)
        h[size_t(i * Dv + d)] = dot_f64(&x[size_t(i * K)], &m.vision_patch_w[size_t(d * K)], K) +
                                bf16_to_f32(V.patch_embed_bias.bf16()[d]);
    });
    m.round(h.data(), int64_t(h.size()));
    // 2D rotary angles: the first quarter of a head's pairs by the patch row, the second by its
    // column, frequency f_j = 1 / theta^(2j / half) (fp32 steps, the power in double).
    cs.resize(size_t(n * half));
    sn.resize(size_t(n * half));
    std::vector<float> inv(static_cast<size_t>(quarter));
    for (int64_t j = 0; j < quarter; ++j) {
      const float e = float(2 * j) / float(half);
      inv[size_t(j)] = 1.0f / f32(std::pow(c.vision_rope_theta, double(e)));
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < half; ++j) {
        const float pos = float(j < quarter ? i / vit_w : i % vit_w);
        const float a = pos * inv[size_t(j % quarter)];
        cs[size_t(i * half + j)] = f32(std::cos(double(a)));
        sn[size_t(i * half + j)] = f32(std::sin(double(a)));
      }
    ++job.stage;
    return false;
  }
  if (job.stage <= V.blocks.size()) {  // one block
    const size_t l = job.stage++ - 1;
    const VisionBlockWeights& B = V.blocks[l];
    const PreparedLinear* L = &m.vision_lin[l * kPerBlock];
    // Attention: q, k, v are the thirds of wqkv's output, heads of hd; full, bidirectional.
    u = norm(h, B.norm1);
    lin(L[0], &B.wqkv_bias, u.data(), n, qkv);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t hh = 0; hh < 2 * H; ++hh) {  // the heads of q, then those of k
        float* v = &qkv[size_t(i * 3 * Dv + hh * hd)];
        for (int64_t j = 0; j < half; ++j) {
          const float a = v[j], b = v[j + half], cj = cs[size_t(i * half + j)],
                      sj = sn[size_t(i * half + j)];
          v[j] = (a * cj) - (b * sj);
          v[j + half] = (b * cj) + (a * sj);
        }
      }
    m.round(qkv.data(), int64_t(qkv.size()));
    o.assign(size_t(n * Dv), 0.0f);
    for_rows(n * H, [&](int64_t ih) {
      const int64_t i = ih / H, hh = ih % H;
      const float* q = &qkv[size_t(i * 3 * Dv + hh * hd)];
      std::vector<float> s(static_cast<size_t>(n));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        s[size_t(j)] = dot_f64(q, &qkv[size_t(j * 3 * Dv + Dv + hh * hd)], hd) * 0.125f;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (float& v : s) sum += v = exp_f(v - mx);
      const float total = f32(sum);
      for (float& v : s) v = m.bf16 ? round_bf16(v / total) : v / total;
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j)
          acc += double(s[size_t(j)]) * double(qkv[size_t(j * 3 * Dv + 2 * Dv + hh * hd + d)]);
        o[size_t(i * Dv + hh * hd + d)] = f32(acc);
      }
    });
    m.round(o.data(), int64_t(o.size()));
    lin(L[1], &B.wo_bias, o.data(), n, t);
    for (size_t i = 0; i < h.size(); ++i) h[i] += t[i];
    m.round(h.data(), int64_t(h.size()));
    // SwiGLU: w1's first F outputs are the gate, the next F the up projection.
    u = norm(h, B.norm2);
    lin(L[2], nullptr, u.data(), n, t);
    o.resize(size_t(n * F));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t f = 0; f < F; ++f) {
        const double g = t[size_t(i * 2 * F + f)];
        float a = f32(g / (1.0 + std::exp(-g)));
        if (m.bf16) a = round_bf16(a);
        o[size_t(i * F + f)] = a * t[size_t(i * 2 * F + F + f)];
      }
    m.round(o.data(), int64_t(o.size()));
    lin(L[3], nullptr, o.data(), n, t);
    for (size_t i = 0; i < h.size(); ++i) h[i] += t[i];
    m.round(h.data(), int64_t(h.size()));
    return false;
  }
  h = norm(std::move(h), V.norm);

  // Aligner: r x r blocks of the grid (zero-padded at the right and bottom), each block's
  // features ordered channel, then row, then column within the block.
  const int64_t bh = (vit_h + r - 1) / r, bw = (vit_w + r - 1) / r, L = bh * bw, Z = Dv * r * r;
  std::vector<float> z(size_t(L * Z), 0.0f);
  for (int64_t y = 0; y < vit_h; ++y)
    for (int64_t xx = 0; xx < vit_w; ++xx) {  // patch (y, xx): channel 0 of its place in its block
      float* zb = &z[size_t(((y / r) * bw + xx / r) * Z + (y % r) * r + xx % r)];
      for (int64_t ch = 0; ch < Dv; ++ch) zb[ch * r * r] = h[size_t((y * vit_w + xx) * Dv + ch)];
    }
  const PreparedLinear* A = &m.vision_lin[m.vision_lin.size() - 2];
  lin(A[0], &V.aligner_b1, z.data(), L, t);
  for (float& v : t) v = f32(0.5 * double(v) * (1.0 + std::erf(double(v) / std::sqrt(2.0))));
  m.round(t.data(), int64_t(t.size()));
  lin(A[1], &V.aligner_b2, t.data(), L, out);
  DI_CHECK(int64_t(out.size()) == L * D);
  return true;
}

}  // namespace deepinfer
