"""Engram multipliers / primes / hash ids and the RoPE table against spec Appendix A, plus the
released configuration's layer roles (spec 1.2)."""

import json
import os
import unittest

import numpy as np

import refcase
from v41ref import numerics as nx
from v41ref.config import Config
from v41ref.engram import EngramHasher, engram_primes, hash_multipliers, multiplier_bound
from v41ref.rope import inv_freqs, yarn_bounds

M32, M64, M128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1
PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341


class SpecRng:
    """numpy's default_rng(seed).integers(0, bound, dtype=int64) written from the text of spec 9.2
    (SeedSequence -> PCG64 XSL-RR -> 64-bit Lemire), to check that text against numpy."""

    def __init__(self, seed):
        entropy = [0] if seed == 0 else []
        while seed:
            entropy.append(seed & M32)
            seed >>= 32
        self.hc = 0x43B0D7E5
        pool = [self._hashmix(entropy[i] if i < len(entropy) else 0) for i in range(4)]
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    pool[dst] = self._mix(pool[dst], self._hashmix(pool[src]))
        for w in entropy[4:]:
            for dst in range(4):
                pool[dst] = self._mix(pool[dst], self._hashmix(w))
        self.pool = pool
        hc, w32 = 0x8B51F9DD, []
        for i in range(8):
            v = pool[i % 4] ^ hc
            hc = (hc * 0x58F38DED) & M32
            v = (v * hc) & M32
            w32.append(v ^ (v >> 16))
        self.s64 = [w32[2 * k] | (w32[2 * k + 1] << 32) for k in range(4)]
        initstate = (self.s64[0] << 64) | self.s64[1]
        initseq = (self.s64[2] << 64) | self.s64[3]
        self.inc = ((initseq << 1) | 1) & M128
        self.state = 0
        self._step()
        self.state = (self.state + initstate) & M128
        self._step()

    def _hashmix(self, v):
        v ^= self.hc
        self.hc = (self.hc * 0x931E8875) & M32
        v = (v * self.hc) & M32
        return v ^ (v >> 16)

    @staticmethod
    def _mix(x, y):
        t = (0xCA01F9DD * x - 0x4973F715 * y) & M32
        return t ^ (t >> 16)

    def _step(self):
        self.state = (self.state * PCG_MULT + self.inc) & M128

    def next64(self):
        self._step()
        x = ((self.state >> 64) ^ self.state) & M64
        rot = self.state >> 122
        return ((x >> rot) | (x << (64 - rot))) & M64 if rot else x

    def integers(self, bound, n):
        rng, out = bound - 1, []
        assert (1 << 32) <= rng < M64
        e = rng + 1
        for _ in range(n):
            m = self.next64() * e
            lo = m & M64
            if lo < e:
                thr = (M64 - rng) % e
                while lo < thr:
                    m = self.next64() * e
                    lo = m & M64
            out.append(m >> 64)
        return out


class TestEngramTables(unittest.TestCase):
    def test_a1_rng_internals(self):
        r = SpecRng(10007)
        self.assertEqual(r.pool, [0xF1A1018D, 0xA7C60C02, 0xFD15D50A, 0x03B81232])
        self.assertEqual(r.s64, [0x77D32A348AD70D07, 0x993ED609B84A4FA5, 0xD5F972DEC8698E49, 0x7D79EBAEBCF148DE])
        self.assertEqual(r.state, 0x3B34AF7676E8DDD5556A026C98A77D27)
        self.assertEqual(r.inc, 0xABF2E5BD90D31C92FAF3D75D79E291BD)
        self.assertEqual([r.next64() for _ in range(3)], [0xD2C3F84026661E33, 0x0D4FB6969EB57435, 0x62E6E1C58C3BD72B])
        r14 = SpecRng(140098)
        self.assertEqual(r14.pool, [0x7097F09F, 0xC71373B7, 0x148492AF, 0x9681C6C4])
        self.assertEqual(r14.next64(), 0xBA3ECC29CF07C111)
        self.assertEqual(SpecRng(0).pool, [0xFE40EB07, 0x4F363A36, 0x4EB2009D, 0xC89A7AA7])
        # numpy agrees with the same internals
        ss = np.random.SeedSequence(10007)
        self.assertEqual([int(v) for v in ss.pool], r.pool)
        self.assertEqual([int(v) for v in ss.generate_state(4, np.uint64)], r.s64)
        st = np.random.PCG64(10007).state["state"]
        self.assertEqual((st["state"], st["inc"]), (SpecRng(10007).state, r.inc))

    def test_a1_multipliers(self):
        bound = multiplier_bound(99092)
        self.assertEqual(bound, 46539438283891)
        mu = hash_multipliers([1, 14], 4, 99092)
        self.assertEqual(mu[0], [76632096046245, 4839876093313, 35959672319349, 73987337458391])
        self.assertEqual(mu[1], [67716810739261, 51510806800915, 30921347202721, 82619226485591])
        for layer, row in zip([1, 14], mu):
            v = np.random.default_rng(10007 * layer).integers(0, bound, size=4, dtype=np.int64)
            self.assertEqual(row, [2 * int(x) + 1 for x in v])
            self.assertEqual(row, [2 * x + 1 for x in SpecRng(10007 * layer).integers(bound, 4)])
        tiny = hash_multipliers([0, 1], 4, 256)
        self.assertEqual(tiny[0], [22948963341361471, 9720090748611819, 1476226777048821, 595470825660793])
        self.assertEqual(tiny[1], [29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817])
        for seed in (1, 7, 10007 * 3, 2**40 + 5, 2**70 + 11):  # several entropy words too
            want = np.random.default_rng(seed).integers(0, bound, size=6, dtype=np.int64).tolist()
            self.assertEqual(SpecRng(seed).integers(bound, 6), want, seed)

    def test_a2_released_primes(self):
        p = engram_primes(2, 4, 8, 16000000)
        self.assertEqual(p[0][0], [16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183])
        self.assertEqual(p[0][2], [16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463])
        self.assertEqual(p[1][1], [16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769])
        self.assertEqual(p[1][2], [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889])
        sums = [sum(x for g in layer for x in g) for layer in p]
        self.assertEqual(sums, [384006168, 384016682])
        if os.path.exists(refcase.RELEASED_CONFIG):
            with open(refcase.RELEASED_CONFIG) as f:
                self.assertEqual(sums, json.load(f)["engram_num_embeddings"])

    def test_a3_tiny_hash_example(self):
        def hasher():
            return EngramHasher([1], 3, 2, 100, 512, 2)

        h = hasher()
        self.assertEqual(h.primes, [[[101, 103], [107, 109]]])
        self.assertEqual(h.offsets.tolist(), [[0, 101, 204, 311]])
        self.assertEqual(h.multipliers.tolist(), [[14831304026200453, 936705081716061, 6959601268494069]])
        want = [[67, 142, 214, 321], [76, 196, 224, 313], [10, 201, 216, 327], [76, 199, 270, 404]]
        self.assertEqual(h.step([5, 300, 7, 511], 0)[:, 0].tolist(), want)
        h = hasher()
        got = np.concatenate([h.step([5, 300], 0), h.step([7, 511], 2)])
        self.assertEqual(got[:, 0].tolist(), want)
        h = hasher()
        got = np.concatenate([h.step([t], p) for p, t in enumerate([5, 300, 7, 511])])
        self.assertEqual(got[:, 0].tolist(), want)

    def test_dead_tokens_block_longer_ngrams(self):
        h = EngramHasher([1], 3, 2, 100, 512, 2)
        ids = h.ids_from_compressed([5, -1, 7, 9], 0, [])
        ref = EngramHasher([1], 3, 2, 100, 512, 2)
        # position 2: shift 1 is DEAD, so the 2- and 3-grams read (7, pad, pad)
        self.assertEqual(ids[2].tolist(), ref.ids_from_compressed([2, 2, 7], 0, [])[2].tolist())
        # position 3 reads (9, 7, DEAD): the 3-gram falls back to the pad id, the 2-gram does not
        self.assertEqual(ids[3].tolist(), ref.ids_from_compressed([2, 7, 9], 0, [])[2].tolist())
        self.assertNotEqual(ids[3].tolist(), ref.ids_from_compressed([3, 7, 9], 0, [])[2].tolist())


class TestRope(unittest.TestCase):
    def test_a4_compressed_table_bits(self):
        self.assertEqual(yarn_bounds(64, 160000, 65536, 32, 1), (15, 25))
        w = inv_freqs(64, 160000, 65536, 16, 32, 1, nx.Mode("fp32"))
        bits = w.astype(np.float32).view(np.uint32)
        want = {0: 0x3F800000, 1: 0x3F300A3A, 15: 0x3B6E4237, 16: 0x3B147AE1, 20: 0x399BB3AF,
                24: 0x37A3D70C, 25: 0x36B443D0, 31: 0x35187C4D}
        for i, b in want.items():
            self.assertEqual(int(bits[i]), b, i)

    def test_a4_window_table(self):
        w = inv_freqs(64, 10000, 0, 16, 32, 1, nx.Mode("fp32"))
        self.assertEqual(w[1], 0.7498942017555237)
        self.assertEqual(w[31], 1.333521504420787e-4)


class TestReleasedConfig(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(refcase.RELEASED_CONFIG):
            self.skipTest("released config not available")
        with open(refcase.RELEASED_CONFIG) as f:
            self.cfg = Config(json.load(f), source=refcase.RELEASED_CONFIG)

    def test_roles(self):
        c = self.cfg
        for l in range(2, 20):
            self.assertEqual(c.kv_src[l], 2 + 6 * ((l - 2) // 6))
            self.assertEqual(c.idx_src[l], c.kv_src[l])
        for l in range(20, 40):
            self.assertEqual(c.kv_src[l], 20)
            self.assertEqual(c.idx_src[l], 20 if l < 24 else 4 * (l // 4))
        self.assertEqual({l: c.key_owner[l] for l in (24, 28, 32, 36, 8)}, {24: 20, 28: 20, 32: 20, 36: 20, 8: 8})
        self.assertEqual([l for l in range(40) if c.is_candidate_consumer(l)], [24, 28, 32, 36])
        self.assertEqual([l for l in range(40) if c.owns_index_keys(l)], [2, 8, 14, 20])

    def test_hf_style_config_maps_to_the_same_values(self):
        with open(refcase.RELEASED_CONFIG) as f:
            flat = json.load(f)
        inv = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "window_size": "sliding_window",
               "kv_source_layers": "kv_source_layer_ids", "index_source_layers": "index_source_layer_ids",
               "candidate_source_layer": "candidate_source_layer_id", "norm_eps": "rms_norm_eps",
               "n_activated_experts": "num_experts_per_tok", "rope_head_dim": "qk_rope_head_dim",
               "n_heads": "num_attention_heads", "moe_inter_dim": "moe_intermediate_size",
               "route_scale": "routed_scaling_factor", "engram_pad_id": "engram_pad_token_id"}
        text = {inv.get(k, k): v for k, v in flat.items() if k not in ("dtype", "expert_dtype", "original_seq_len",
                                                                       "rope_factor", "beta_fast", "beta_slow")}
        text["rope_scaling"] = {"original_max_position_embeddings": 65536, "factor": 16, "beta_fast": 32,
                                "beta_slow": 1, "type": "yarn"}
        hf = {"text_config": text, "dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32], "expert_dtype": "fp4"}}
        c = Config(hf, source="hf")
        for k in flat:
            if k in ("dtype", "expert_dtype") or k.startswith(("vision", "dspark")):
                continue
            self.assertEqual(getattr(c, k), getattr(self.cfg, k), k)
        self.assertEqual((c.dtype, c.expert_dtype), ("fp8", "fp4"))


if __name__ == "__main__":
    unittest.main()
