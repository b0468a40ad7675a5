"""Hand-checked cases of the tricky pieces (spec 5-7, 12): Sinkhorn, the hc off-by-one schedule,
compressor carry across calls, visibility, candidate blocks, top-k padding, and attention
recomputed directly from the dumped q / keys / lists of a token-by-token run."""

import tempfile
import types
import unittest

import numpy as np

import refcase
from refcase import load_dump
from v41ref import load_model, run_prompt
from v41ref import numerics as nx
from v41ref.attention import candidate_mask, compress, rmsnorm, sparse_attention_row, topk_list
from v41ref.blocks import engram_update, hc_mixes, hc_pre, route, sinkhorn
from v41ref.rope import RopeTable
from v41ref.weights import Lin

F64 = nx.Mode("fp64")


def sinkhorn_by_hand(c, iters, eps):
    """Scalar loops following the words of spec 7.1 step 4."""
    M = len(c)
    c = [[float(v) for v in row] for row in c]
    for j in range(M):
        mx = max(c[j])
        e = [np.exp(v - mx) for v in c[j]]
        c[j] = [v / sum(e) + eps for v in e]

    def cols():
        s = [sum(c[j][k] for j in range(M)) for k in range(M)]
        for j in range(M):
            c[j] = [c[j][k] / (s[k] + eps) for k in range(M)]

    cols()
    for _ in range(iters - 1):
        for j in range(M):
            s = sum(c[j])
            c[j] = [v / (s + eps) for v in c[j]]
        cols()
    return np.array(c)


class TestSinkhorn(unittest.TestCase):
    def test_zero_logits_closed_form(self):
        eps = 1e-6
        got = sinkhorn(np.zeros((1, 2, 2)), 1, eps, F64)[0]
        np.testing.assert_allclose(got, np.full((2, 2), (0.5 + eps) / (1 + 3 * eps)), rtol=1e-15)

    def test_against_scalar_loops(self):
        rng = np.random.default_rng(0)
        c = rng.standard_normal((3, 4, 4)) * 2
        got = sinkhorn(c, 20, 1e-6, F64)
        for t in range(3):
            np.testing.assert_allclose(got[t], sinkhorn_by_hand(c[t], 20, 1e-6), rtol=1e-13)
        np.testing.assert_allclose(got.sum(axis=-2), 1.0, atol=1e-5)  # ends on a column normalisation
        self.assertGreater(np.abs(got.sum(axis=-1) - 1).max(), 1e-9)  # rows only roughly


class TestHcSchedule(unittest.TestCase):
    """The FFN collapses with the attention's pre, the attention with the previous FFN's pre."""

    def test_off_by_one_from_dumps(self):
        m = load_model(refcase.checkpoint("tiny"), dtype="fp64")
        cfg = m.cfg
        with tempfile.TemporaryDirectory() as d:
            run_prompt(m, refcase.prompt(10, cfg.vocab_size), dump_dir=d)
            get = lambda n: load_dump(d, 1, n)  # noqa: E731
            eps = cfg.norm_eps
            for l in range(1, cfg.n_layers):
                lw, prev = m.layers[l], m.layers[l - 1]
                x_in = get(f"L{l}.engram.x") if l in cfg.engram_layer_ids else get(f"L{l - 1}.hc.x2")
                x1, x1_prev = get(f"L{l}.hc.x1"), get(f"L{l - 1}.hc.x1")
                pre_a = hc_mixes(x_in, lw.hc_attn_fn, lw.hc_attn_scale, lw.hc_attn_base, cfg, F64)[0]
                pre_f = hc_mixes(x1, lw.hc_ffn_fn, lw.hc_ffn_scale, lw.hc_ffn_base, cfg, F64)[0]
                pre_f_prev = hc_mixes(x1_prev, prev.hc_ffn_fn, prev.hc_ffn_scale, prev.hc_ffn_base, cfg, F64)[0]
                v = rmsnorm(hc_pre(x1, pre_a, F64), lw.ffn_norm, F64, eps)
                u = rmsnorm(hc_pre(x_in, pre_f_prev, F64), lw.attn_norm, F64, eps)
                np.testing.assert_allclose(get(f"L{l}.ffn.v"), v, rtol=0, atol=1e-12)
                np.testing.assert_allclose(get(f"L{l}.attn.u"), u, rtol=0, atol=1e-12)
                wrong = rmsnorm(hc_pre(x1, pre_f, F64), lw.ffn_norm, F64, eps)
                self.assertGreater(np.abs(get(f"L{l}.ffn.v") - wrong).max(), 1e-3)
            emb = m.embed.lookup(refcase.prompt(10, cfg.vocab_size))  # block 0: one-hot pre, copy 0
            np.testing.assert_allclose(get("L0.attn.u"), rmsnorm(emb, m.layers[0].attn_norm, F64, eps), atol=1e-12)


class TestCompressorCarry(unittest.TestCase):
    def test_pooling_across_calls(self):
        """r = 2, identity projections: k = u, g = u + bias. Group 0 = positions 0 and 1."""
        Dh = 32
        cfg = types.SimpleNamespace(compress_ratios=[2], head_dim=Dh, norm_eps=1e-20)
        lw = types.SimpleNamespace(cmp_wkv=Lin(np.eye(Dh), "f32"), cmp_wgate=Lin(np.eye(Dh), "f32"),
                                   cmp_norm=np.ones(Dh))
        st = types.SimpleNamespace(carry={0: (np.zeros((0, Dh)), np.zeros((0, Dh)))})
        u = np.zeros((3, Dh))
        u[0, 0], u[1, 0], u[2, 0] = 0.0, np.log(3.0), 5.0  # channel 0 gate softmax = (1/4, 3/4)
        u[0, 1], u[1, 1] = 2.0, 2.0  # channel 1: equal gates -> mean
        lat, first = compress(lw, cfg, F64, st, 0, u[:1], 0)  # group incomplete: carried
        self.assertEqual((lat.shape[0], first), (0, 0))
        self.assertEqual(st.carry[0][0].shape[0], 1)
        lat, first = compress(lw, cfg, F64, st, 0, u[1:], 1)  # completes group 0, carries pos 2
        self.assertEqual((lat.shape[0], first), (1, 0))
        pooled = np.zeros(Dh)
        pooled[0] = 0.25 * 0.0 + 0.75 * np.log(3.0)
        pooled[1] = 2.0
        np.testing.assert_allclose(lat[0], rmsnorm(pooled, np.ones(Dh), F64, 1e-20), rtol=1e-14)
        np.testing.assert_array_equal(st.carry[0][0], u[2:])
        single = types.SimpleNamespace(carry={0: (np.zeros((0, Dh)), np.zeros((0, Dh)))})
        np.testing.assert_array_equal(compress(lw, cfg, F64, single, 0, u, 0)[0], lat)


class TestSelection(unittest.TestCase):
    def test_candidate_blocks(self):
        # 7 rows, blocks of 2 -> [0,1] [2,3] [4,5] [6,pad]; keep 2 blocks
        s = np.array([[5.0, 1.0, 9.0, 0.0, 2.0, 3.0, -np.inf],   # 6 visible: forced block 2, best other: 1
                      [5.0, 1.0, 2.0, 0.0, 9.0, 3.0, 4.0],       # 7 visible: forced block 3, then block 2
                      [-np.inf] * 7,                              # nothing visible
                      [1.0, 1.0, 1.0, 1.0, -np.inf, -np.inf, -np.inf]])  # tie of blocks 0/1 -> 0
        vis = np.array([6, 7, 0, 4])
        got = candidate_mask(s, vis, 2, 2)
        want = [[0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1], [0] * 7, [1, 1, 1, 1, 0, 0, 0]]
        np.testing.assert_array_equal(got, np.array(want, dtype=bool))
        # forced block 1 for row 3 (vis 4 -> (4-1)//2 = 1), and block 0 wins the finite tie
        got3 = candidate_mask(s[3:], np.array([4]), 1, 2)
        np.testing.assert_array_equal(got3[0], [0, 0, 1, 1, 0, 0, 0])
        # fewer finite blocks than requested: -inf blocks are dropped
        got4 = candidate_mask(np.array([[1.0, 2.0, -np.inf, -np.inf]]), np.array([2]), 2, 2)
        np.testing.assert_array_equal(got4[0], [1, 1, 0, 0])

    def test_topk_list_padding_and_ties(self):
        s = np.array([[0.0, 3.0, 0.0, -np.inf, -np.inf],   # 3 visible of 5, K = 4
                      [1.0, 1.0, 1.0, 1.0, 1.0],           # all tied: lowest rows
                      [-np.inf] * 5])
        got = topk_list(s, np.array([3, 5, 0]), 4)
        np.testing.assert_array_equal(got, [[0, 1, 2, -1], [0, 1, 2, 3], [-1, -1, -1, -1]])
        self.assertEqual(got.dtype, np.int32)
        self.assertEqual(topk_list(s[:, :2], np.array([1, 2, 0]), 4).shape, (3, 2))  # width min(K, N)


class TestAttentionFromDumps(unittest.TestCase):
    """Token-by-token fp64 run: recompute every layer's attention output from the dumped queries,
    window keys of the last W positions, published compressed rows and top-k lists, with a plain
    softmax over the union plus the sink; check visibility and the list layout on the way."""

    def test_recompute(self):
        m = load_model(refcase.checkpoint("alt"), dtype="fp64")
        cfg, n = m.cfg, 24
        W, tau = cfg.window_size, cfg.head_dim**-0.5
        with tempfile.TemporaryDirectory() as d:
            run_prompt(m, refcase.prompt(n, cfg.vocab_size, seed=5), stepwise=True, dump_dir=d)
            for l in range(cfg.n_layers):
                r = cfg.compress_ratios[l]
                kv = load_dump(d, n, f"L{l}.attn.kv")
                cmp = load_dump(d, n, f"L{cfg.kv_src[l]}.attn.cmp") if r else None
                for p in range(n):
                    q = np.load(f"{d}/call{p}/L{l}.attn.q.npy")[0]
                    keys = kv[max(0, p - W + 1) : p + 1]
                    if r:
                        lst = np.load(f"{d}/call{p}/L{cfg.idx_src[l]}.attn.topk.npy")[0]
                        vis = (p + 1) // r
                        self.assertEqual(len(lst), min(cfg.index_topk, vis))
                        valid = lst[lst >= 0]
                        self.assertTrue((valid < vis).all() and (np.diff(valid) > 0).all())
                        self.assertEqual(len(valid), min(cfg.index_topk, vis))
                        self.assertEqual(cmp.shape[0] >= vis, True)
                        keys = np.concatenate([keys, cmp[valid]])
                    z = (q @ keys.T) * tau
                    mx = np.maximum(z.max(axis=1), m.layers[l].attn_sink)
                    e = np.exp(z - mx[:, None])
                    den = e.sum(axis=1) + np.exp(m.layers[l].attn_sink - mx)
                    o = (e @ keys) / den[:, None]
                    got = np.load(f"{d}/call{p}/L{l}.attn.o.npy")[0]
                    np.testing.assert_allclose(got, o, rtol=0, atol=1e-12, err_msg=f"layer {l} pos {p}")

    def test_kernel_blocks_match_plain_softmax(self):
        rng = np.random.default_rng(7)
        q, keys, sink = rng.standard_normal((3, 64)), rng.standard_normal((150, 64)), rng.standard_normal(3)
        got = sparse_attention_row(q, keys, sink, 0.125, F64)
        z = q @ keys.T * 0.125
        mx = z.max(axis=1, keepdims=True)
        e = np.exp(z - mx)
        want = e @ keys / (e.sum(axis=1) + np.exp(sink - mx[:, 0]))[:, None]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        b = sparse_attention_row(nx.bf16(q), nx.bf16(keys), sink, 0.125, nx.Mode("bf16"))
        np.testing.assert_array_equal(b, nx.bf16(b))
        np.testing.assert_allclose(b, want, atol=2e-2)


class TestSmallPieces(unittest.TestCase):
    def test_rope_adjacent_pairs_on_the_tail(self):
        tab = RopeTable(4, 100.0, 0, 1, 32, 1, F64)  # omega = [1, 1/10]
        np.testing.assert_allclose(tab.omega, [1.0, 0.1], rtol=1e-15)
        x = np.arange(8.0)[None]  # tail = elements 4..7, pairs (4, 5) and (6, 7)
        got = tab.apply(x, np.array([3]))
        c0, s0, c1, s1 = np.cos(3.0), np.sin(3.0), np.cos(0.3), np.sin(0.3)
        want = [0, 1, 2, 3, 4 * c0 - 5 * s0, 4 * s0 + 5 * c0, 6 * c1 - 7 * s1, 6 * s1 + 7 * c1]
        np.testing.assert_allclose(got[0], want, rtol=1e-14)
        np.testing.assert_allclose(tab.apply(got, np.array([3]), inverse=True), x, atol=1e-14)

    def test_router_bias_selects_unbiased_weights(self):
        cfg = types.SimpleNamespace(score_func="sqrtsoftplus", gate_temp=1.0, n_activated_experts=2,
                                    norm_topk_prob=True, route_scale=1.5, source="t")
        lw = types.SimpleNamespace(gate_w=np.eye(5), gate_bias=np.array([0.0, 0.0, 10.0, 0.0, 0.0]))
        v = np.array([[1.0, 3.0, -2.0, 3.0, 25.0], [1.0, 3.0, -2.0, 3.0, 0.0]])
        ids, w = route(v, lw, cfg, F64)
        sp = lambda z: np.sqrt(np.log1p(np.exp(z)))  # noqa: E731
        # row 0: bias picks 2 first, then 4 (softplus linear above 20: sqrt(25) = 5)
        self.assertEqual(ids.tolist(), [[2, 4], [2, 1]])  # row 1: 1 and 3 tie -> lower id
        np.testing.assert_allclose(w[0], 1.5 * np.array([sp(-2), 5.0]) / (sp(-2) + 5.0), rtol=1e-14)
        np.testing.assert_allclose(w[1], 1.5 * np.array([sp(-2), sp(3)]) / (sp(-2) + sp(3)), rtol=1e-14)

    def test_engram_gate_per_copy(self):
        M, D, Dm = 2, 4, 32
        cfg = types.SimpleNamespace(hc_mult=M, dim=D, norm_eps=1e-20)
        target = np.array([1, 2, 3, 4, 1, -1, 1, -1, 0.5, 0, -0.5, 1.0])  # K0, K1, V
        lw = types.SimpleNamespace(eng_table=types.SimpleNamespace(lookup=lambda i: np.ones(i.shape + (Dm,))),
                                   eng_wkv=Lin(np.repeat(target[:, None] / Dm, Dm, axis=1), "bf16"),
                                   eng_q=np.ones((M, D)), eng_k=np.ones((M, D)))
        x = np.array([[[1.0, 1, 1, 1], [2.0, 0, 0, 0]]])
        got = engram_update(x, np.zeros((1, 1), dtype=np.int64), lw, cfg, F64)
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
        d0 = 10 * 1 / np.sqrt(7.5) / 2  # sum h*K / rms(h) / rms(K0) / sqrt(D)
        d1 = 2 / 1 / 1 / 2
        V = target[8:]
        np.testing.assert_allclose(got[0, 0], x[0, 0] + sig(np.sqrt(d0)) * V, rtol=1e-14)
        np.testing.assert_allclose(got[0, 1], x[0, 1] + sig(np.sqrt(d1)) * V, rtol=1e-14)
        lw.eng_q = np.zeros((M, D))  # dot = +0 -> gate sigmoid(+sqrt(1e-6))
        got = engram_update(x, np.zeros((1, 1), dtype=np.int64), lw, cfg, F64)
        np.testing.assert_allclose(got[0, 1], x[0, 1] + sig(1e-3) * V, rtol=1e-14)


if __name__ == "__main__":
    unittest.main()
