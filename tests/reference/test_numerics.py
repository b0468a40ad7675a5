"""Number formats and quantizers against exhaustive, independently computed expectations
(spec 2.1, 3.3-3.5)."""

import unittest
from fractions import Fraction

import numpy as np

import refcase  # noqa: F401  (puts v41ref on sys.path)
from v41ref import numerics as nx

FP32 = nx.Mode("fp32")


def e4m3_by_fields(b):
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return None
    mag = Fraction(m, 8) * Fraction(1, 64) if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
    return -mag if s else mag


class TestFormats(unittest.TestCase):
    def test_e4m3_decode_every_code(self):
        for b in range(256):
            want = e4m3_by_fields(b)
            got = nx.decode_e4m3(np.uint8(b))
            if want is None:
                self.assertTrue(np.isnan(got), hex(b))
            else:
                self.assertEqual(Fraction(float(got)), want, hex(b))
                self.assertEqual(bool(np.signbit(got)), bool(b >> 7), hex(b))
        self.assertEqual(nx.decode_e4m3(np.uint8(0x7E)), 448.0)
        self.assertEqual(nx.decode_e4m3(np.uint8(0x01)), 2.0**-9)

    def test_e4m3_rounding_every_interval(self):
        vals = sorted({float(e4m3_by_fields(b)) for b in range(127)})  # finite non-negatives
        for lo, hi in zip(vals, vals[1:]):
            mid = (lo + hi) / 2
            code_lo = int(nx.encode_e4m3(lo))
            even = lo if code_lo % 2 == 0 else hi
            self.assertEqual(nx.round_e4m3(mid), even, (lo, hi))
            self.assertEqual(nx.round_e4m3(-mid), -even)
            self.assertEqual(nx.round_e4m3(np.nextafter(mid, 0)), lo)
            self.assertEqual(nx.round_e4m3(np.nextafter(mid, 1e9)), hi)
        for b in range(256):
            v = nx.decode_e4m3(np.uint8(b))
            if not np.isnan(v):
                self.assertEqual(int(nx.encode_e4m3(v)), b)
        self.assertEqual(nx.round_e4m3(460.0), 448.0)  # satfinite, never NaN
        self.assertEqual(nx.round_e4m3(-1e9), -448.0)
        self.assertEqual(nx.round_e4m3(2.0**-10), 0.0)  # tie with 0 -> even code 0
        self.assertEqual(nx.round_e4m3(3 * 2.0**-11), 2.0**-9)

    def test_e8m0_every_code(self):
        for b in range(256):
            got = nx.decode_e8m0(np.uint8(b))
            if b == 255:
                self.assertTrue(np.isnan(got))
            else:
                self.assertEqual(Fraction(float(got)), Fraction(2) ** (b - 127))

    def test_e2m1_codes_and_ties(self):
        mags = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
        for n in range(16):
            want = mags[n & 7] * (-1 if n & 8 else 1)
            self.assertEqual(nx.decode_e2m1(np.uint8(n)), want)
        ties = {0.25: 0, 0.75: 1, 1.25: 1, 1.75: 2, 2.5: 2, 3.5: 4, 5.0: 4}
        for v, want in ties.items():
            self.assertEqual(nx.round_e2m1(v), want, v)
            self.assertEqual(nx.round_e2m1(-v), -want, v)
        for lo, hi in zip(mags, mags[1:]):
            mid = (lo + hi) / 2
            self.assertEqual(nx.round_e2m1(np.nextafter(mid, 0)), lo)
            self.assertEqual(nx.round_e2m1(np.nextafter(mid, 9)), hi)
        self.assertEqual(nx.round_e2m1(7.9), 6.0)
        for n in range(16):
            v = nx.decode_e2m1(np.uint8(n))
            self.assertEqual(int(nx.encode_e2m1(v)), n if n != 8 or np.signbit(v) else 0)

    def test_fp4_packing_low_nibble_even(self):
        packed = np.array([[0x21, 0xF8]], dtype=np.uint8)  # codes 1,2 then 8(-0),15(-6)
        got = nx.unpack_fp4(packed, 4)
        np.testing.assert_array_equal(got, [[0.5, 1.0, -0.0, -6.0]])
        codes = np.array([[1, 2, 8, 15]], dtype=np.uint8)
        np.testing.assert_array_equal(nx.pack_fp4(codes), packed)

    def test_bf16_rne_edge_cases(self):
        cases = {  # fp32 bits -> bf16 bits
            0x3F808000: 0x3F80, 0x3F818000: 0x3F82, 0x3F808001: 0x3F81, 0x3F807FFF: 0x3F80,
            0x7F7F8000: 0x7F80, 0x7F7F7FFF: 0x7F7F, 0x00008000: 0x0000, 0x00018000: 0x0002,
            0x80008000: 0x8000, 0xBF808000: 0xBF80, 0x7F800000: 0x7F80, 0xFF800000: 0xFF80,
        }
        for src, want in cases.items():
            x = np.array([src], dtype=np.uint32).view(np.float32)
            got = nx.bf16_round_f32(x).view(np.uint32)[0] >> 16
            self.assertEqual(int(got), want, hex(src))
        nan = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)
        self.assertTrue(np.isnan(nx.bf16_round_f32(nan))[0])

    def test_bf16_rne_matches_exact_nearest(self):
        rng = np.random.default_rng(3)
        bits = rng.integers(0, 0x7F7F0000, size=20000, dtype=np.uint32)
        bits[:2000] = (bits[:2000] & 0xFFFF0000) | 0x8000  # exact ties
        x = bits.view(np.float32)
        got = nx.bf16_round_f32(x).astype(np.float64)
        lo = (bits & 0xFFFF0000).view(np.float32).astype(np.float64)
        hi = ((bits & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
        xd = x.astype(np.float64)
        lo_even = ((bits >> 16) & 1) == 0
        want = np.where(xd - lo < hi - xd, lo, np.where(xd - lo > hi - xd, hi, np.where(lo_even, lo, hi)))
        np.testing.assert_array_equal(got, want)


class TestScalesAndQuant(unittest.TestCase):
    def test_pow2ceil_on_the_rounded_product(self):
        # 448 * f32(1/448) rounds to exactly 1.0 in fp32: the scale is 1, not 2
        for k in range(-20, 10):
            a = 448.0 * 2.0**k
            self.assertEqual(nx.pow2ceil(np.array([a]), 1 / 448, FP32)[0], 2.0**k, k)
            above = float(np.nextafter(np.float32(a), np.float32(np.inf)))
            self.assertEqual(nx.pow2ceil(np.array([above]), 1 / 448, FP32)[0], 2.0 ** (k + 1), k)
        # 6 * f32(1/6) also rounds to 1.0
        self.assertEqual(nx.pow2ceil(np.array([6.0]), 1 / 6, FP32)[0], 1.0)
        self.assertEqual(nx.pow2ceil(np.array([3.0]), 1 / 6, FP32)[0], 0.5)

    def test_act_quant_scales_and_values(self):
        x = np.zeros((3, 64))
        x[0, :32] = np.linspace(-448, 448, 32)  # amax 448 -> scale 1
        x[0, 32:] = 0.0  # floor 1e-4 -> scale 2^-22
        x[1, :32] = np.linspace(-1, 1.5, 32)  # amax 1.5 -> 1.5/448 -> 2^-8
        x[1, 32:] = 1e-3 * np.arange(32)  # amax 0.031 -> 2^-13
        x[2] = np.random.default_rng(0).standard_normal(64) * 7
        s = nx.act_quant_scales(x, FP32)
        np.testing.assert_array_equal(s[:2], [[1.0, 2.0**-22], [2.0**-8, 2.0**-13]])
        q = nx.act_quant(x, FP32)
        grid = np.array(sorted({abs(float(e4m3_by_fields(b))) for b in range(127)}))
        for r in range(3):
            for b in range(2):
                blk, sc = x[r, 32 * b : 32 * b + 32], s[r, b]
                for v, got in zip(blk, q[r, 32 * b : 32 * b + 32]):
                    cand = grid * sc
                    d = np.abs(cand - abs(v))
                    best = cand[d == d.min()]
                    self.assertIn(abs(got), best)  # nearest grid point (ties checked above)
                    self.assertEqual(np.float32(got), got)  # exactly representable

    def test_fp4_variant_i(self):
        x = np.zeros((1, 32))
        x[0, :4] = [3.0, -1.2, 0.74, 0.0]  # amax 3 -> scale pow2ceil(3/6) = 0.5
        got = nx.fp4_quant_i(x, FP32)
        np.testing.assert_array_equal(got[0, :4], [3.0, -1.0, 0.75, 0.0])
        self.assertEqual(nx.fp4_quant_i(np.zeros((1, 32)), FP32).max(), 0.0)

    def test_fp4_variant_c(self):
        x = np.zeros((1, 16))
        x[0, :3] = [1.0, -0.3, 0.09]
        # scale = e4m3(f32(1/6)) = 11/64; 1/scale = 5.82 -> 6; 0.3/scale = 1.745 -> 1.5; 0.09/s = .52 -> .5
        s = 11 / 64
        got = nx.fp4_quant_c(x, FP32)
        np.testing.assert_array_equal(got[0, :3], [6 * s, -1.5 * s, 0.5 * s])
        z = nx.fp4_quant_c(np.zeros((1, 16)), FP32)  # floor 6*2^-9 keeps the scale non-zero
        self.assertEqual(np.abs(z).max(), 0.0)

    def test_weight_dequant_grids(self):
        rng = np.random.default_rng(5)
        codes = rng.integers(0, 126, size=(40, 64)).astype(np.uint8)
        sc = np.array([[127, 120], [130, 125]], dtype=np.uint8)  # ceil grid for 40 rows
        w = nx.dequant_fp8_weight(codes, sc)
        self.assertEqual(w[39, 63], nx.decode_e4m3(codes[39, 63]) * 2.0**-2)
        self.assertEqual(w[5, 40], nx.decode_e4m3(codes[5, 40]) * 2.0**-7)
        packed = rng.integers(0, 256, size=(3, 32)).astype(np.uint8)
        s4 = np.array([[127, 128], [126, 127], [100, 140]], dtype=np.uint8)
        w4 = nx.dequant_fp4_weight(packed, s4, 64)
        self.assertEqual(w4[2, 33], nx.decode_e2m1(packed[2, 16] >> 4) * 2.0**13)
        self.assertEqual(w4[1, 2], nx.decode_e2m1(packed[1, 1] & 15) * 0.5)


if __name__ == "__main__":
    unittest.main()
