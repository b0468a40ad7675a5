"""The DSpark draft head (spec 10.4; the computation is written down in docs/numerics.md).

The backbone records, for every row of a forward call, its taps: the mean over the hc copies of the
stream entering each target layer (after Engram), concatenated in layer order. Every row the
sequence keeps goes into each stage's window ring: main_x = main_norm(main_proj(taps)), then the
stage's own window key of main_x at the row's position. A draft from position p (the last kept row)
with the token t sampled there runs B slots [t, noise, ..., noise] at positions p+1 .. p+B through
the window-only stages; each slot attends to the ring's slots 0 .. min(W, p+1)-1 in slot order and
then to all B slots of the block. The last stage's norm and the backbone head give B rows of
logits; slot i adds the Markov bias of the token before it and drafts the argmax."""

import numpy as np

from . import numerics as nx
from .attention import rmsnorm, sparse_attention_row
from .blocks import hc_pre
from .rope import rope_for_layer
from .weights import RowTable


class DraftHead:
    def __init__(self, model, rd, load_layer):
        cfg, mode = model.cfg, model.mode
        self.model, self.cfg, self.mode = model, cfg, mode
        L, S, D = cfg.n_layers, cfg.n_mtp_layers, cfg.dim
        E = cfg.dspark_n_routed_experts or cfg.n_routed_experts
        k = cfg.dspark_n_activated_experts or cfg.n_activated_experts
        self.stages = []
        for s in range(S):
            lw = load_layer(rd, cfg, L + s, prefix=f"mtp.{s}.", n_experts=E)
            lw.topk = k
            self.stages.append(lw)
        nT, R, V = len(cfg.dspark_target_layer_ids), cfg.dspark_markov_rank, cfg.vocab_size
        self.main_proj = rd.qlinear("mtp.0.main_proj", D, nT * D)
        self.main_norm = rd.floats("mtp.0.main_norm.weight", (D,))
        last = f"mtp.{S - 1}."
        self.norm = rd.floats(last + "norm.weight", (D,))
        self.markov_embed = RowTable(rd, last + "markov_head.embed", V, R, quantized=False)
        self.markov_head = rd.floats(last + "markov_head.head.weight", (V, R), eff="f32")
        self.confidence = rd.floats(last + "confidence_head.proj.weight", (1, D + R), eff="f32")
        self.rope = [rope_for_layer(cfg, L + s, mode) for s in range(S)]
        self.reset()

    def reset(self):
        W, Dh = self.cfg.window_size, self.cfg.head_dim
        self.rings = [np.zeros((W, Dh)) for _ in self.stages]

    def keep(self, taps, positions):
        """Rows with these taps [n, nT*D] at these positions enter every stage's ring."""
        cfg, mode = self.cfg, self.mode
        eps = mode.const(cfg.norm_eps)
        main_x = rmsnorm(self.main_proj(taps, mode), self.main_norm, mode, eps)
        positions = np.asarray(positions)
        for s, lw in enumerate(self.stages):
            kv = rmsnorm(lw.wkv(main_x, mode), lw.kv_norm, mode, eps)
            kv = nx.act_quant(mode.ra(self.rope[s].apply(kv, positions)), mode)
            for i, p in enumerate(positions):  # in order: a later position overwrites its slot
                self.rings[s][p % cfg.window_size] = kv[i]

    def draft(self, token, p):
        """Drafts from position p (the last kept row) with `token` sampled there. Returns the B draft
        ids, the B rows of logits (Markov bias in) and the B confidence logits."""
        cfg, mode, m = self.cfg, self.mode, self.model
        B, M, V = cfg.dspark_block_size, cfg.hc_mult, cfg.vocab_size
        ids = [int(token)] + [int(cfg.dspark_noise_token_id)] * (B - 1)
        pos = p + 1 + np.arange(B)
        x = np.repeat(m.embed.lookup(ids)[:, None, :], M, axis=1)
        pi = np.zeros((B, M))
        pi[:, 0] = 1.0
        for s, lw in enumerate(self.stages):
            x, pi = m._block(cfg.n_layers + s, x, pi, None, lw=lw,
                             attention=lambda u, s=s, lw=lw: self._attention(s, lw, u, p, pos))
        hid = hc_pre(x, pi, mode)
        h = rmsnorm(hid, self.norm, mode, mode.const(cfg.norm_eps))
        logits = mode.rf(h @ m.head.T)
        out, embs, prev = [], [], int(token)
        for i in range(B):
            e = self.markov_embed.lookup([prev])[0]
            embs.append(e)
            logits[i] = mode.rf(logits[i] + mode.rf(self.markov_head @ e))
            prev = int(np.argmax(logits[i]))  # lowest id among equal maxima
            out.append(prev)
        conf = mode.rf(np.concatenate([hid, np.stack(embs)], axis=1) @ self.confidence.T)[:, 0]
        return np.array(out, dtype=np.int64), logits.astype(mode.out_dtype), conf.astype(mode.out_dtype)

    def _attention(self, s, lw, u, p, pos):
        cfg, mode = self.cfg, self.mode
        B, H, Dh, W = u.shape[0], cfg.n_heads, cfg.head_dim, cfg.window_size
        eps = mode.const(cfg.norm_eps)
        rope = self.rope[s]
        qr = rmsnorm(lw.wq_a(u, mode), lw.q_norm, mode, eps)
        q = mode.ra(rope.apply(lw.wq_b(qr, mode).reshape(B, H, Dh), pos))
        kv = rmsnorm(lw.wkv(u, mode), lw.kv_norm, mode, eps)
        kv = nx.act_quant(mode.ra(rope.apply(kv, pos)), mode)
        keys = np.concatenate([self.rings[s][: min(W, p + 1)], kv])
        tau = mode.const(Dh**-0.5)
        o = np.stack([sparse_attention_row(q[t], keys, lw.attn_sink, tau, mode) for t in range(B)])
        o = mode.ra(rope.apply(o, pos, inverse=True))
        G = cfg.o_groups
        wo_a = lw.wo_a.w.reshape(G, cfg.o_lora_rank, -1)
        a = mode.ra(np.einsum("tgd,grd->tgr", o.reshape(B, G, -1), wo_a)).reshape(B, -1)
        return lw.wo_b(a, mode)
