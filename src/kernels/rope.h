// Rotary embedding tables and application (V41_SPEC.md §4): adjacent pairs (2i, 2i+1) of the
// last R elements of a vector, angles f32(f32(t) · ω_i) in fp32, optional YaRN blending of the
// inverse frequencies. No attention-temperature correction.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer {

struct RopeTable {
  std::vector<float> omega;  // [R/2] inverse frequencies (R: the rotary width)
};

// original_seq_len = 0 disables YaRN.
RopeTable make_rope_table(int64_t rope_dim, double theta, int64_t original_seq_len, double factor,
                          double beta_fast, double beta_slow);

// cos/sin of position `pos`: cs[2*i] = cos φ_i, cs[2*i+1] = sin φ_i, i < R/2.
void rope_angles(const RopeTable& t, int64_t pos, float* cs);
// Rotates the R-element `tail` (in place) by the angles of rope_angles(); inverse rotates back.
void rope_rotate(float* tail, const float* cs, int64_t rope_dim, bool inverse);

}  // namespace deepinfer
