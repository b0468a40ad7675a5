#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

RopeTable make_rope_table(int64_t rope_dim, double theta, int64_t original_seq_len, double factor,
                          double beta_fast, double beta_slow) {
  RopeTable t;
  const int64_t half = rope_dim / 2;
  t.omega.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rope_dim);
    const float b = float(std::pow(theta, double(e)));  // the power rounded once to fp32
    t.omega[size_t(i)] = 1.0f / b;
  }
  if (original_seq_len > 0) {
    const double pi = 3.14159265358979323846;
    auto c = [&](double rho) {
      return double(rope_dim) * std::log(double(original_seq_len) / (2 * pi * rho)) /
             (2 * std::log(theta));
    };
    const double lo = std::max(std::floor(c(beta_fast)), 0.0);
    const double hi = std::min(std::ceil(c(beta_slow)), double(rope_dim - 1));
    const float denom = float(std::max(hi - lo, 0.001));
    for (int64_t i = 0; i < half; ++i) {
      const float sm = 1.0f - std::clamp((float(i) - float(lo)) / denom, 0.0f, 1.0f);
      const float w = t.omega[size_t(i)];
      t.omega[size_t(i)] = (w / float(factor)) * (1.0f - sm) + w * sm;  // fp32 at every step
    }
  }
  return t;
}

void rope_angles(const RopeTable& t, int64_t pos, float* cs) {
  const float tp = float(pos);
  for (size_t i = 0; i < t.omega.size(); ++i) {
    const float phi = tp * t.omega[i];
    cs[2 * i] = float(std::cos(double(phi)));
    cs[2 * i + 1] = float(std::sin(double(phi)));
  }
}

void rope_rotate(float* tail, const float* cs, int64_t rope_dim, bool inverse) {
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    const float a = tail[2 * i], b = tail[2 * i + 1];
    const float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
    // Each output in double from the fp32 operands, rounded once.
    tail[2 * i] = float(double(a) * c - double(b) * s);
    tail[2 * i + 1] = float(double(a) * s + double(b) * c);
  }
}

}  // namespace deepinfer
