"""RoPE frequency table (spec 4.1) and application to a vector's tail (spec 4.3)."""

import math

import numpy as np


def yarn_bounds(rot_dim, theta, original_seq_len, beta_fast, beta_slow):
    """(lo, hi) of the YaRN ramp, computed in double precision as in spec 4.1."""

    def corrected_dim(rotations):
        return rot_dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(corrected_dim(beta_fast)), 0)
    hi = min(math.ceil(corrected_dim(beta_slow)), rot_dim - 1)
    return lo, hi


def inv_freqs(rot_dim, theta, original_seq_len, factor, beta_fast, beta_slow, mode):
    """omega_i for i in [0, rot_dim/2), with the fp32 rounding points of spec 4.1 (mode.rf)."""
    rf = mode.rf
    i = np.arange(rot_dim // 2, dtype=np.float64)
    e = rf(rf(2 * i) / rf(rot_dim))
    b = rf(np.power(float(theta), e))  # the power is rounded once, before the reciprocal
    w = rf(1.0 / b)
    if original_seq_len > 0:
        lo, hi = yarn_bounds(rot_dim, theta, original_seq_len, beta_fast, beta_slow)
        ramp = np.clip(rf(rf(i - lo) / rf(max(hi - lo, 0.001))), 0.0, 1.0)
        smooth = rf(1.0 - ramp)
        f = rf(factor)
        w = rf(rf(rf(w / f) * rf(1.0 - smooth)) + rf(w * smooth))
    return w


class RopeTable:
    """cos/sin of phi_{t,i} = f32(f32(t) * omega_i) for any position t."""

    def __init__(self, rot_dim, theta, original_seq_len, factor, beta_fast, beta_slow, mode):
        self.mode = mode
        self.rot_dim = rot_dim
        self.omega = inv_freqs(rot_dim, theta, original_seq_len, factor, beta_fast, beta_slow, mode)

    def cos_sin(self, positions):
        rf = self.mode.rf
        phi = rf(rf(np.asarray(positions, dtype=np.float64))[:, None] * self.omega[None, :])
        return rf(np.cos(phi)), rf(np.sin(phi))  # [n, rot_dim/2] each

    def apply(self, x, positions, inverse=False):
        """Rotate the last rot_dim elements of x ([n, ..., d], one position per leading row) in
        adjacent pairs (2i, 2i+1). Returns the new tail values in float64 (caller rounds)."""
        c, s = self.cos_sin(positions)
        shape = (c.shape[0],) + (1,) * (x.ndim - 2) + (c.shape[1],)
        c, s = c.reshape(shape), s.reshape(shape)
        if inverse:
            s = -s
        out = np.array(x, dtype=np.float64, copy=True)
        a = out[..., -self.rot_dim :: 2].copy()
        b = out[..., -self.rot_dim + 1 :: 2].copy()
        out[..., -self.rot_dim :: 2] = a * c - b * s
        out[..., -self.rot_dim + 1 :: 2] = a * s + b * c
        return out


def rope_for_layer(cfg, layer, mode):
    """Compressed layers (ratio > 0): compress_rope_theta with YaRN; window-only: rope_theta, no
    YaRN (spec 4.2)."""
    if cfg.compress_ratios[layer] > 0:
        return RopeTable(cfg.rope_head_dim, cfg.compress_rope_theta, cfg.original_seq_len, cfg.rope_factor,
                         cfg.beta_fast, cfg.beta_slow, mode)
    return RopeTable(cfg.rope_head_dim, cfg.rope_theta, 0, cfg.rope_factor, cfg.beta_fast, cfg.beta_slow, mode)
