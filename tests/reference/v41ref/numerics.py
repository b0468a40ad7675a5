"""Exact number-format helpers and the three numeric modes of the reference.

Every activation of the reference is held in a float64 array. What a mode changes is where values
are rounded (V41_SPEC.md section 3):

* ``rf`` rounds to fp32 (RNE) the values the spec defines as fp32 results (sums, norms, softmaxes);
* ``ra`` rounds the values the spec stores as activations: bf16(f32(v)) in ``bf16`` mode, f32(v)
  in ``fp32`` mode.

Both are the identity in ``fp64`` mode. Because each rounding is applied to a value computed in
float64, a sum or dot product is the correctly rounded fp32 result of the float64 sum, i.e. it does
not depend on how many tokens a call holds or on a BLAS summation order (to ~1e-16).
"""

import numpy as np

# --- bf16 ------------------------------------------------------------------------------------


def bf16_round_f32(x):
    """RNE of float32 values to bf16, returned as float32 (bit operations on the fp32 encoding).

    Overflow rounds to infinity as IEEE does; NaN stays NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = np.where(nan, (u | 0x00400000) & 0xFFFF0000, r)
    return r.astype(np.uint32).view(np.float32).reshape(x.shape)


def f32(x):
    """RNE of float64 values to fp32, returned as float64."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def bf16(x):
    """bf16(f32(x)) as float64 (the reference rounds an fp32 result to bf16)."""
    return bf16_round_f32(np.asarray(x, dtype=np.float64).astype(np.float32)).astype(np.float64)


def bf16_bits_to_f64(u16):
    """Raw little-endian bf16 words (uint16) to float64 (exact)."""
    u = np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16
    return u.view(np.float32).astype(np.float64)


def f64_to_bf16_bits(x):
    """RNE to bf16 and return the raw uint16 words."""
    return (bf16_round_f32(np.asarray(x, dtype=np.float32)).view(np.uint32) >> 16).astype(np.uint16)


# --- generic RNE into a small binary format ---------------------------------------------------


def _round_small_float(x, mant_bits, min_exp):
    """RNE of float64 values onto a binary grid with `mant_bits` explicit mantissa bits and
    smallest normal exponent `min_exp` (below it the grid is the subnormal one). No saturation."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    _, e = np.frexp(ax)  # ax = m * 2^e, m in [0.5, 1)
    exp = np.maximum(e - 1, min_exp)  # ax in [2^exp, 2^(exp+1)) unless subnormal
    quantum_exp = exp - mant_bits
    r = np.ldexp(np.rint(np.ldexp(ax, -quantum_exp)), quantum_exp)
    return np.copysign(r, x)


E4M3_MAX = 448.0
E2M1_MAX = 6.0


def round_e4m3(x):
    """RNE to float8_e4m3fn, saturating to +-448 (the kernels' satfinite conversion)."""
    return np.clip(_round_small_float(x, 3, -6), -E4M3_MAX, E4M3_MAX)


def round_e2m1(x):
    """RNE to fp4 e2m1 for |x| <= 6; exact midpoints go to the even code (.25->0, .75->1,
    1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). Saturates to +-6."""
    return np.clip(_round_small_float(x, 1, 0), -E2M1_MAX, E2M1_MAX)


def _e4m3_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = 2.0**-6 * m / 8
        else:
            v = 2.0 ** (e - 7) * (1 + m / 8)
        t[b] = -v if s else v
    return t


E4M3_TABLE = _e4m3_table()
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_TABLE = np.concatenate([E2M1_GRID, -E2M1_GRID])


def decode_e4m3(codes):
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def decode_e8m0(codes):
    c = np.asarray(codes, dtype=np.uint8).astype(np.float64)
    return np.where(c == 255, np.nan, np.ldexp(1.0, (c - 127).astype(np.int64)))


def decode_e2m1(nibbles):
    return E2M1_TABLE[np.asarray(nibbles, dtype=np.uint8) & 15]


def encode_e4m3(x):
    """Codes of RNE(x) in e4m3 (saturating); -0 keeps its sign bit."""
    r = round_e4m3(x)
    pos = E4M3_TABLE[:127]  # codes 0..126 are the finite non-negative values, ascending
    mag = np.searchsorted(pos, np.abs(r)).astype(np.uint8)
    return mag | (np.signbit(r).astype(np.uint8) << 7)


def encode_e2m1(x):
    """4-bit codes of RNE(x) in e2m1 (saturating), bit 3 = sign."""
    r = round_e2m1(x)
    mag = np.searchsorted(E2M1_GRID, np.abs(r)).astype(np.uint8)
    return mag | (np.signbit(r).astype(np.uint8) << 3)


def encode_e8m0_pow2(x):
    """Code of an exact power of two in e8m0 (2^(b-127))."""
    _, e = np.frexp(np.asarray(x, dtype=np.float64))
    return (e - 1 + 127).astype(np.uint8)


def unpack_fp4(packed, n_cols):
    """Packed bytes [rows, n_cols/2] -> float64 [rows, n_cols]; low nibble = even element."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = decode_e2m1(b & 15)
    out[..., 1::2] = decode_e2m1(b >> 4)
    return out[..., :n_cols]


def pack_fp4(codes):
    """4-bit codes [rows, n] (n even) -> bytes [rows, n/2], even element in the low nibble."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


# --- weight dequantization --------------------------------------------------------------------


def dequant_fp8_weight(codes, scale_codes, block=32):
    """e4m3 weight [out, in] with e8m0 scales [ceil(out/32), ceil(in/32)] -> float64 (exact)."""
    w = decode_e4m3(codes)
    s = decode_e8m0(scale_codes)
    s = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[: w.shape[0], : w.shape[1]]
    return w * s


def dequant_fp4_weight(packed, scale_codes, n_cols, block=32):
    """Packed e2m1 weight [out, in/2] with e8m0 scales [out, in/32] -> float64 [out, in]."""
    w = unpack_fp4(packed, n_cols)
    return w * np.repeat(decode_e8m0(scale_codes), block, axis=1)[:, :n_cols]


# --- numeric modes -----------------------------------------------------------------------------


class Mode:
    """Rounding policy of one numeric mode ('bf16', 'fp32' or 'fp64')."""

    def __init__(self, name):
        if name not in ("bf16", "fp32", "fp64"):
            raise ValueError(f"dtype: expected bf16, fp32 or fp64, got {name!r}")
        self.name = name
        self.exact = name == "fp64"
        self.out_dtype = np.float64 if self.exact else np.float32

    def rf(self, x):
        """A value the spec defines in fp32."""
        return np.asarray(x, dtype=np.float64) if self.exact else f32(x)

    def ra(self, x):
        """A value the spec stores as a bf16 activation or cache entry."""
        if self.exact:
            return np.asarray(x, dtype=np.float64)
        return bf16(x) if self.name == "bf16" else f32(x)

    def const(self, c):
        """A scalar constant: an fp32 constant except in fp64 mode."""
        return float(c) if self.exact else float(np.float32(c))


# --- scale rounding and fake quantization (spec 3.3-3.5) ---------------------------------------


def pow2ceil(a, c, mode):
    """2^ceil(log2(t)) with t = f32(a*c), taken from t's exponent and mantissa bits (spec 3.3).
    In fp64 mode t = a*c in float64 and the same rule is applied to it."""
    if mode.exact:
        t = np.asarray(a, dtype=np.float64) * c
        m, e = np.frexp(t)
        return np.ldexp(1.0, np.where(m == 0.5, e - 1, e))
    t = (np.asarray(a, dtype=np.float32) * np.float32(c)).astype(np.float32)
    bits = t.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    return np.ldexp(1.0, exp - 127 + (man != 0))


def _blocks(x, block):
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] % block:
        raise ValueError(f"quantization: last dim {x.shape[-1]} is not a multiple of {block}")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))


def act_quant_scales(x, mode, block=32):
    """Per-block power-of-two scales of act_quant (spec 3.4), shape x.shape[:-1] + [n_blocks]."""
    xb = _blocks(x, block)
    a = np.maximum(np.abs(xb).max(axis=-1), 1e-4 if mode.exact else np.float32(1e-4))
    return pow2ceil(a, 1.0 / 448.0, mode)


def act_quant(x, mode, block=32):
    """fp8 e4m3 QDQ over blocks of 32 along the last dim (spec 3.4)."""
    xb = _blocks(x, block)
    s = act_quant_scales(x, mode, block)[..., None]
    q = round_e4m3(np.clip(xb / s, -E4M3_MAX, E4M3_MAX))
    return (q * s).reshape(np.shape(x))


def fp4_quant_i(x, mode, block=32):
    """fp4 Variant I (indexer): blocks of 32, power-of-two (e8m0) scale (spec 3.5)."""
    xb = _blocks(x, block)
    a = np.maximum(np.abs(xb).max(axis=-1), 6 * 2.0**-126)
    s = pow2ceil(a, 1.0 / 6.0, mode)[..., None]
    return (round_e2m1(np.clip(xb / s, -6, 6)) * s).reshape(np.shape(x))


def fp4_quant_c(x, mode, block=16):
    """fp4 Variant C (compressed KV): blocks of 16, e4m3 scale = e4m3(amax/6) (spec 3.5)."""
    xb = _blocks(x, block)
    a = np.maximum(np.abs(xb).max(axis=-1), 6 * 2.0**-9)
    s = mode.rf(round_e4m3(mode.rf(a / 6.0)))[..., None]
    v = np.clip(mode.rf(xb / s), -6, 6)
    return (round_e2m1(v) * s).reshape(np.shape(x))


# --- elementwise functions (evaluated in float64, rounded by the caller) -----------------------


def sigmoid(z):
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def softplus(z):
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0))))


def stable_topk_desc(scores, k):
    """Indices of the k largest entries along the last axis; ties go to the lowest index.
    Returned in order of decreasing score."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), axis=-1, kind="stable")
    return order[..., :k]
