"""The V4.1 text model: weights, per-sequence state, and the forward pass of one chunk (spec 10, 12).

    model = load_model(dir, dtype="bf16")
    logits = model.forward([tokens...])     # positions [model.pos, model.pos + n), all logits
    model.reset()                           # start a new sequence
"""

import os
import types

import numpy as np

from . import numerics as nx
from .attention import attention_half, rmsnorm
from .blocks import engram_update, final_hidden, hc_mixes, hc_post, hc_pre, moe
from .config import load_config
from .dspark import DraftHead
from .engram import EngramHasher
from .rope import rope_for_layer
from .weights import RowTable, WeightReader


def _load_layer(rd, cfg, l, prefix=None, n_experts=None):
    """Backbone layer l, or (prefix "mtp.<k>.", n_experts) the draft stage with layer id l."""
    D, H, Dh, Q = cfg.dim, cfg.n_heads, cfg.head_dim, cfg.q_lora_rank
    M, F = cfg.hc_mult, cfg.moe_inter_dim
    p = prefix or f"layers.{l}."
    lw = types.SimpleNamespace()
    lw.attn_norm = rd.floats(p + "attn_norm.weight", (D,))
    lw.ffn_norm = rd.floats(p + "ffn_norm.weight", (D,))
    mix = (2 + M) * M
    for k in ("attn", "ffn"):
        setattr(lw, f"hc_{k}_fn", rd.floats(p + f"hc_{k}_fn", (mix, M * D), eff="f32"))
        setattr(lw, f"hc_{k}_base", rd.floats(p + f"hc_{k}_base", (mix,), eff="f32"))
        setattr(lw, f"hc_{k}_scale", rd.floats(p + f"hc_{k}_scale", (3,), eff="f32"))
    a = p + "attn."
    lw.wq_a = rd.qlinear(a + "wq_a", Q, D)
    lw.q_norm = rd.floats(a + "q_norm.weight", (Q,))
    lw.wq_b = rd.qlinear(a + "wq_b", H * Dh, Q)
    lw.wkv = rd.qlinear(a + "wkv", Dh, D)
    lw.kv_norm = rd.floats(a + "kv_norm.weight", (Dh,))
    lw.attn_sink = rd.floats(a + "attn_sink", (H,), eff="f32")
    lw.wo_a = rd.bf16_linear(a + "wo_a", cfg.o_groups * cfg.o_lora_rank, H * Dh // cfg.o_groups)
    lw.wo_b = rd.qlinear(a + "wo_b", D, cfg.o_groups * cfg.o_lora_rank)
    r = cfg.compress_ratios[l]
    if cfg.is_kv_source(l):
        c = a + "compressor."
        lw.cmp_wkv = (rd.bf16_linear if r == 1 else rd.f32_linear)(c + "wkv", Dh, D)
        if r > 1:
            lw.cmp_wgate = rd.f32_linear(c + "wgate", Dh, D)
        lw.cmp_norm = rd.floats(c + "norm.weight", (Dh,))
    if cfg.is_index_source(l):
        i = a + "indexer."
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        lw.idx_wq_b = rd.qlinear(i + "wq_b", Hi * Di, Q)
        lw.idx_weights_proj = rd.bf16_linear(i + "weights_proj", Hi, D)
        if cfg.owns_index_keys(l):
            lw.idx_wk = rd.bf16_linear(i + "wk", Di, Dh)
            lw.idx_k_norm = rd.floats(i + "k_norm.weight", (Di,))
    f = p + "ffn."
    E = n_experts or cfg.n_routed_experts
    lw.gate_w = rd.floats(f + "gate.weight", (E, D))  # bf16 parameter used as fp32
    lw.gate_bias = rd.floats(f + "gate.bias", (E,), eff="f32")
    if rd.has(f + "gate.bias_vl") and not p.startswith("mtp."):  # image rows' selection bias
        lw.gate_bias_vl = rd.floats(f + "gate.bias_vl", (E,), eff="f32")
    lw.experts = [
        (rd.qlinear(f"{f}experts.{e}.w1", F, D), rd.qlinear(f"{f}experts.{e}.w2", D, F),
         rd.qlinear(f"{f}experts.{e}.w3", F, D))
        for e in range(E)
    ]
    lw.shared = (rd.qlinear(f + "shared_experts.w1", F, D), rd.qlinear(f + "shared_experts.w2", D, F),
                 rd.qlinear(f + "shared_experts.w3", F, D))
    if l in cfg.engram_layer_ids:
        z = cfg.engram_layer_ids.index(l)
        e = p + "engram."
        Dm, NC = cfg.engram_head_dim, (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
        lw.eng_table = RowTable(rd, e + "embed", int(cfg.engram_num_embeddings[z]), Dm, quantized=True)
        lw.eng_wkv = rd.qlinear(e + "wkv", (M + 1) * D, NC * Dm)
        lw.eng_q = rd.floats(e + "q_weight", (M, D))
        lw.eng_k = rd.floats(e + "k_weight", (M, D))
    return lw


class SeqState:
    """Everything that persists between calls for one sequence (spec 12.1)."""

    def __init__(self, cfg):
        Dh, W = cfg.head_dim, cfg.window_size
        self.pos = 0
        self.ring = [np.zeros((W, Dh)) for _ in range(cfg.n_layers)]
        self.carry = {l: (np.zeros((0, Dh)), np.zeros((0, Dh))) for l in range(cfg.n_layers) if cfg.is_kv_source(l)}
        self.ckv = {l: np.zeros((0, Dh)) for l in range(cfg.n_layers) if cfg.is_kv_source(l)}
        self.idxk = {l: np.zeros((0, cfg.index_head_dim)) for l in range(cfg.n_layers) if cfg.owns_index_keys(l)}
        self.key_pointer = None  # last index-key owner that published keys (spec 6.8 only)


class Call:
    """Per-call context: positions, artefacts shared down the layers, the activation dump."""

    def __init__(self, start, n, dump_dir, out_dtype):
        self.start, self.n = start, n
        self.positions = np.arange(start, start + n)
        self.is_decode = start > 0 and n == 1
        self.topk, self.candidates = {}, None
        self.dump_dir, self.out_dtype = dump_dir, out_dtype

    def dump(self, name, arr):
        if self.dump_dir is None:
            return
        a = np.asarray(arr)
        a = a.astype(np.int32) if np.issubdtype(a.dtype, np.integer) else a.astype(self.out_dtype)
        np.save(os.path.join(self.dump_dir, name + ".npy"), a)


class Model:
    def __init__(self, model_dir, dtype="bf16", token_map=None, demo_decode_defect=False):
        self.cfg = cfg = load_config(model_dir)
        self.mode = nx.Mode(dtype)
        self.demo_decode_defect = bool(demo_decode_defect)
        rd = WeightReader(model_dir)
        self.embed = RowTable(rd, "embed", cfg.vocab_size, cfg.dim, quantized=False)
        self.norm = rd.floats("norm.weight", (cfg.dim,))
        self.head = rd.floats("head.weight", (cfg.vocab_size, cfg.dim), eff="f32")
        self.layers = [_load_layer(rd, cfg, l) for l in range(cfg.n_layers)]
        self.rope = [rope_for_layer(cfg, l, self.mode) for l in range(cfg.n_layers)]
        self.draft_head = None
        if cfg.dspark_block_size > 0 and cfg.n_mtp_layers > 0 and rd.has("mtp.0.attn_norm.weight"):
            self.draft_head = DraftHead(self, rd, _load_layer)
        self.hasher = None
        if cfg.engram_layer_ids:
            self.hasher = EngramHasher(cfg.engram_layer_ids, cfg.engram_max_ngram_size, cfg.engram_n_heads,
                                       cfg.engram_vocab_size, cfg.engram_compressed_vocab_size, cfg.engram_pad_id,
                                       token_map)
            for z, l in enumerate(cfg.engram_layer_ids):
                if int(cfg.engram_num_embeddings[z]) < self.hasher.table_rows[z]:
                    raise ValueError(f"{cfg.source}: engram_num_embeddings[{z}] = {cfg.engram_num_embeddings[z]} "
                                     f"< {self.hasher.table_rows[z]} (sum of the layer's primes)")
        self.reset()

    @property
    def pos(self):
        return self.state.pos

    def reset(self):
        """Start a new sequence at position 0; dump call numbering restarts at call0."""
        self.state = SeqState(self.cfg)
        self.calls = 0
        if self.hasher is not None:
            self.hasher.reset()
        if self.draft_head is not None:
            self.draft_head.reset()

    def forward(self, tokens, dump_dir=None, image=None):
        """Process tokens at positions [pos, pos+n); returns logits [n, vocab] (fp32, or float64 in
        fp64 mode). With dump_dir, writes <dump_dir>/call<k>/<name>.npy for this call. `image`:
        None, or (mask [n] bool, embeds [n, dim]): the image-span rows (docs/vision.md) take their
        embedding from `embeds`, select experts with bias_vl and are dead to Engram."""
        cfg, mode = self.cfg, self.mode
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward: empty chunk")
        if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
            raise ValueError(f"forward: token id outside [0, {cfg.vocab_size})")
        call_dir = None
        if dump_dir is not None:
            call_dir = os.path.join(dump_dir, f"call{self.calls}")
            os.makedirs(call_dir, exist_ok=True)
        self.calls += 1
        s, T, M = self.state.pos, tokens.size, cfg.hc_mult
        call = Call(s, T, call_dir, mode.out_dtype)
        mask = np.zeros(T, dtype=bool) if image is None else np.asarray(image[0], dtype=bool)
        ids = self.hasher.step(tokens, s, dead=mask) if self.hasher is not None else None

        e = self.embed.lookup(tokens)
        if image is not None:
            e = np.where(mask[:, None], np.asarray(image[1], dtype=np.float64), e)
        x = np.repeat(e[:, None, :], M, axis=1)  # [T, M, D], replicated
        pi = np.zeros((T, M))
        pi[:, 0] = 1.0
        taps = []
        for l in range(cfg.n_layers):
            lw = self.layers[l]
            if l in cfg.engram_layer_ids:
                x = engram_update(x, ids[:, cfg.engram_layer_ids.index(l)], lw, cfg, mode, mask)
                call.dump(f"L{l}.engram.x", x)
            if l in cfg.dspark_target_layer_ids:
                taps.append(mode.ra(np.mean(x, axis=1)))  # the draft head's tap (spec 10.4)
            x, pi = self._block(l, x, pi, call, image_mask=mask)
        h = final_hidden(x, pi, self.norm, cfg, mode)
        call.dump("final.h", h)
        logits = mode.rf(h @ self.head.T)
        call.dump("logits", logits)
        if self.draft_head is not None:  # every row is kept: the reference never speculates
            self.draft_head.keep(np.concatenate(taps, axis=1), call.positions)
        self.state.pos += T
        return logits.astype(mode.out_dtype)

    def draft(self, token):
        """DSpark drafts from the last position fed, with `token` sampled there (dspark.py)."""
        if self.draft_head is None:
            raise ValueError(f"{self.cfg.source}: the checkpoint has no DSpark draft head")
        return self.draft_head.draft(token, self.state.pos - 1)

    def _block(self, l, x, pi_in, call, lw=None, attention=None, image_mask=None):
        """One block with the single-pass hc schedule (spec 7.3); a draft stage brings its weights
        and its attention (u -> output)."""
        cfg, mode = self.cfg, self.mode
        lw = lw or self.layers[l]
        call = call or Call(0, x.shape[0], None, mode.out_dtype)
        attention = attention or (lambda u: attention_half(self, l, u, call))
        eps = mode.const(cfg.norm_eps)
        pre_a, post_a, comb_a = hc_mixes(x, lw.hc_attn_fn, lw.hc_attn_scale, lw.hc_attn_base, cfg, mode)
        u = rmsnorm(hc_pre(x, pi_in, mode), lw.attn_norm, mode, eps)
        call.dump(f"L{l}.attn.u", u)
        x1 = hc_post(attention(u), x, post_a, comb_a, mode)
        call.dump(f"L{l}.hc.x1", x1)
        pre_f, post_f, comb_f = hc_mixes(x1, lw.hc_ffn_fn, lw.hc_ffn_scale, lw.hc_ffn_base, cfg, mode)
        v = rmsnorm(hc_pre(x1, pre_a, mode), lw.ffn_norm, mode, eps)  # the attention's pre
        call.dump(f"L{l}.ffn.v", v)
        y = moe(v, lw, cfg, mode, image_mask)
        call.dump(f"L{l}.ffn.out", y)
        x2 = hc_post(y, x1, post_f, comb_f, mode)
        call.dump(f"L{l}.hc.x2", x2)
        return x2, pre_f


def load_model(model_dir, dtype="bf16", token_map=None, demo_decode_defect=False):
    """token_map: None (identity), an int array, or a path to a .npy file (raw id -> compressed id)."""
    if isinstance(token_map, str):
        token_map = np.load(token_map)
    return Model(model_dir, dtype=dtype, token_map=token_map, demo_decode_defect=demo_decode_defect)
