"""Random tiny checkpoints in the official format (spec 2.1-2.2): safetensors shards + index,
flat config.json; fp8 weights with 32x32 e8m0 block scales, fp4 experts packed as I8 with e8m0
scales per row per 32, bf16 / fp32 tensors as released. Weights are scaled so that activations
stay O(1)."""

import copy
import json
import os

import numpy as np

from . import numerics as nx
from .engram import engram_primes
from .safetensors_io import write_safetensors

TINY_CONFIG = {
    "vocab_size": 129280, "dim": 64, "moe_inter_dim": 32, "n_layers": 8, "n_mtp_layers": 0,
    "n_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "n_activated_experts": 2,
    "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0,
    "q_lora_rank": 64, "head_dim": 64, "rope_head_dim": 16, "norm_eps": 1e-20,
    "o_groups": 2, "o_lora_rank": 32, "window_size": 8,
    "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1],
    "kv_source_layers": [2, 4], "index_source_layers": [2, 4, 6],
    "original_seq_len": 256, "rope_theta": 10000, "rope_factor": 4, "beta_fast": 32, "beta_slow": 1,
    "compress_rope_theta": 160000,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 4,
    "candidate_source_layer": 4, "candidate_topk_blocks": 3, "candidate_block_size": 2,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "engram_layer_ids": [1, 4], "engram_vocab_size": 1000,
    "engram_num_embeddings": None,  # filled with the prime sums
    "engram_max_ngram_size": 3, "engram_pad_id": 2, "engram_compressed_vocab_size": 129280,
    "engram_n_heads": 2, "engram_head_dim": 32,
    "dtype": "fp8", "expert_dtype": "fp4",
}

# A second shape: ratio 3 (two-row carry), r = 3 index source without keys, a consumer between,
# window 5, three hc copies, 4-grams over three heads, an Engram layer at 0, YaRN on a short base.
ALT_CONFIG = {
    "vocab_size": 3000, "dim": 96, "moe_inter_dim": 64, "n_layers": 6, "n_mtp_layers": 0,
    "n_heads": 2, "n_routed_experts": 6, "n_shared_experts": 1, "n_activated_experts": 3,
    "score_func": "sqrtsoftplus", "route_scale": 2.0, "swiglu_limit": 7.0,
    "q_lora_rank": 32, "head_dim": 96, "rope_head_dim": 32, "norm_eps": 1e-20,
    "o_groups": 2, "o_lora_rank": 64, "window_size": 5,
    "compress_ratios": [0, 3, 3, 3, 1, 1],
    "kv_source_layers": [1, 4], "index_source_layers": [1, 3, 4, 5],
    "original_seq_len": 64, "rope_theta": 5000, "rope_factor": 8, "beta_fast": 16, "beta_slow": 2,
    "compress_rope_theta": 40000,
    "index_n_heads": 3, "index_head_dim": 64, "index_topk": 3,
    "candidate_source_layer": 4, "candidate_topk_blocks": 2, "candidate_block_size": 3,
    "hc_mult": 3, "hc_sinkhorn_iters": 10, "hc_eps": 1e-6,
    "engram_layer_ids": [0, 3], "engram_vocab_size": 500, "engram_num_embeddings": None,
    "engram_max_ngram_size": 4, "engram_pad_id": 5, "engram_compressed_vocab_size": 3000,
    "engram_n_heads": 3, "engram_head_dim": 64,
    "dtype": "fp8", "expert_dtype": "fp4",
}


def fill_engram_sizes(config):
    """Return a copy of config with engram_num_embeddings = the per-layer prime sums (spec 9.3)."""
    cfg = copy.deepcopy(config)
    ids = cfg.get("engram_layer_ids") or []
    if ids:
        primes = engram_primes(len(ids), cfg["engram_max_ngram_size"], cfg["engram_n_heads"], cfg["engram_vocab_size"])
        cfg["engram_num_embeddings"] = [int(sum(p for g in layer for p in g)) for layer in primes]
    return cfg


def _pow2_scale(amax, qmax):
    return np.ldexp(1.0, np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax)).astype(np.int64))


class _Writer:
    def __init__(self, rng):
        self.rng, self.t = rng, {}

    def normal(self, shape, std):
        return self.rng.standard_normal(shape) * std

    def bf16(self, name, v):
        self.t[name] = ("BF16", v.shape, nx.f64_to_bf16_bits(v))

    def f32(self, name, v):
        self.t[name] = ("F32", v.shape, np.asarray(v, dtype=np.float32))

    def fp8(self, name, w):
        """e4m3 codes with one power-of-two e8m0 scale per 32x32 tile (ceil grid)."""
        o, i = w.shape
        po, pi = -(-o // 32) * 32, -(-i // 32) * 32
        pad = np.zeros((po, pi))
        pad[:o, :i] = np.abs(w)
        s = _pow2_scale(pad.reshape(po // 32, 32, pi // 32, 32).max(axis=(1, 3)), 448.0)
        full = np.repeat(np.repeat(s, 32, axis=0), 32, axis=1)[:o, :i]
        self.t[name + ".weight"] = ("F8_E4M3", w.shape, nx.encode_e4m3(w / full))
        self.t[name + ".scale"] = ("F8_E8M0", s.shape, nx.encode_e8m0_pow2(s))

    def fp4(self, name, w, dtype="I8"):
        """e2m1 codes packed two per byte (low nibble = even element), e8m0 scale per row per 32."""
        o, i = w.shape
        s = _pow2_scale(np.abs(w).reshape(o, i // 32, 32).max(axis=-1), 6.0)
        packed = nx.pack_fp4(nx.encode_e2m1(w / np.repeat(s, 32, axis=1)))
        shape = (o, i) if dtype == "F4" else (o, i // 2)
        self.t[name + ".weight"] = (dtype, shape, packed.view(np.int8) if dtype == "I8" else packed)
        self.t[name + ".scale"] = ("F8_E8M0", s.shape, nx.encode_e8m0_pow2(s))

    def fp8_rows(self, name, w):
        """Engram table: e4m3 rows with an e8m0 scale per row per 32 columns."""
        r, c = w.shape
        s = _pow2_scale(np.abs(w).reshape(r, c // 32, 32).max(axis=-1), 448.0)
        self.t[name + ".weight"] = ("F8_E4M3", w.shape, nx.encode_e4m3(w / np.repeat(s, 32, axis=1)))
        self.t[name + ".scale"] = ("F8_E8M0", s.shape, nx.encode_e8m0_pow2(s))


def _layer(wr, c, l, fp4_dtype):
    D, H, Dh, Q, M, F = c["dim"], c["n_heads"], c["head_dim"], c["q_lora_rank"], c["hc_mult"], c["moe_inter_dim"]
    G, Ro, E = c["o_groups"], c["o_lora_rank"], c["n_routed_experts"]
    r = c["compress_ratios"][l]
    n, p = wr.normal, f"layers.{l}."
    norm = lambda k: 1.0 + 0.1 * n((k,), 1.0)  # noqa: E731
    wr.bf16(p + "attn_norm.weight", norm(D))
    wr.bf16(p + "ffn_norm.weight", norm(D))
    mix = (2 + M) * M
    for k in ("attn", "ffn"):
        wr.f32(p + f"hc_{k}_fn", n((mix, M * D), 1.0 / np.sqrt(M * D)))
        wr.f32(p + f"hc_{k}_base", n((mix,), 0.5))
        wr.f32(p + f"hc_{k}_scale", 1.0 + 0.2 * n((3,), 1.0))
    a = p + "attn."
    wr.fp8(a + "wq_a", n((Q, D), D**-0.5))
    wr.bf16(a + "q_norm.weight", norm(Q))
    wr.fp8(a + "wq_b", n((H * Dh, Q), Q**-0.5))
    wr.fp8(a + "wkv", n((Dh, D), D**-0.5))
    wr.bf16(a + "kv_norm.weight", norm(Dh))
    wr.f32(a + "attn_sink", n((H,), 1.0))
    wr.fp8(a + "wo_a", n((G * Ro, H * Dh // G), (H * Dh // G) ** -0.5))
    wr.fp8(a + "wo_b", n((D, G * Ro), (G * Ro) ** -0.5))
    if r > 0 and l in c["kv_source_layers"]:
        wr.bf16(a + "compressor.wkv.weight", n((Dh, D), D**-0.5))
        if r > 1:
            wr.bf16(a + "compressor.wgate.weight", n((Dh, D), D**-0.5))
        wr.bf16(a + "compressor.norm.weight", norm(Dh))
    if r > 0 and l in c["index_source_layers"]:
        Hi, Di = c["index_n_heads"], c["index_head_dim"]
        wr.fp8(a + "indexer.wq_b", n((Hi * Di, Q), Q**-0.5))
        wr.bf16(a + "indexer.weights_proj.weight", n((Hi, D), D**-0.5))
        if l in c["kv_source_layers"]:
            wr.bf16(a + "indexer.wk.weight", n((Di, Dh), Dh**-0.5))
            wr.bf16(a + "indexer.k_norm.weight", norm(Di))
    f = p + "ffn."
    wr.bf16(f + "gate.weight", n((E, D), D**-0.5))
    wr.f32(f + "gate.bias", n((E,), 0.1))
    for e in range(E):
        wr.fp4(f"{f}experts.{e}.w1", n((F, D), D**-0.5), fp4_dtype)
        wr.fp4(f"{f}experts.{e}.w2", n((D, F), F**-0.5), fp4_dtype)
        wr.fp4(f"{f}experts.{e}.w3", n((F, D), D**-0.5), fp4_dtype)
    wr.fp8(f + "shared_experts.w1", n((F, D), D**-0.5))
    wr.fp8(f + "shared_experts.w2", n((D, F), F**-0.5))
    wr.fp8(f + "shared_experts.w3", n((F, D), D**-0.5))
    if l in c["engram_layer_ids"]:
        z = c["engram_layer_ids"].index(l)
        Dm, NC = c["engram_head_dim"], (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
        e = p + "engram."
        wr.fp8_rows(e + "embed", n((int(c["engram_num_embeddings"][z]), Dm), 1.0))
        wr.fp8(e + "wkv", n(((M + 1) * D, NC * Dm), (NC * Dm) ** -0.5))
        wr.bf16(e + "q_weight", norm(M * D).reshape(M, D))
        wr.bf16(e + "k_weight", norm(M * D).reshape(M, D))


def make_tiny_checkpoint(out_dir, config=None, seed=0, n_shards=2, fp4_dtype="I8"):
    """Write config.json + model-0000k-of-0000n.safetensors (+ index when n_shards > 1).
    Returns the config dict that was written."""
    c = fill_engram_sizes(config or TINY_CONFIG)
    os.makedirs(out_dir, exist_ok=True)
    wr = _Writer(np.random.default_rng(seed))
    V, D = c["vocab_size"], c["dim"]
    wr.bf16("embed.weight", wr.normal((V, D), 1.0))
    for l in range(c["n_layers"]):
        _layer(wr, c, l, fp4_dtype)
    wr.bf16("norm.weight", 1.0 + 0.1 * wr.normal((D,), 1.0))
    wr.bf16("head.weight", wr.normal((V, D), D**-0.5))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    names = list(wr.t)
    if n_shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), wr.t)
        return c
    # split at tensor boundaries in the middle of layers (a loader must follow the weight map)
    cuts = np.array_split(np.arange(len(names)), n_shards)
    weight_map = {}
    for k, idx in enumerate(cuts):
        fname = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {names[i]: wr.t[names[i]] for i in idx}
        write_safetensors(os.path.join(out_dir, fname), part)
        weight_map.update({nm: fname for nm in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    return c
