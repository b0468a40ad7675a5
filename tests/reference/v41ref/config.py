"""Model configuration: flat reference keys, or Hugging Face style (text model under
`text_config`, renamed keys, spec 1.1), plus the derived layer roles of spec 1.2."""

import json
import os

# Hugging Face text_config key -> reference key (spec 1.1). rope_scaling is handled separately.
HF_KEYS = {
    "hidden_size": "dim",
    "moe_intermediate_size": "moe_inter_dim",
    "num_hidden_layers": "n_layers",
    "num_nextn_predict_layers": "n_mtp_layers",
    "num_attention_heads": "n_heads",
    "num_experts_per_tok": "n_activated_experts",
    "scoring_func": "score_func",
    "routed_scaling_factor": "route_scale",
    "qk_rope_head_dim": "rope_head_dim",
    "rms_norm_eps": "norm_eps",
    "sliding_window": "window_size",
    "kv_source_layer_ids": "kv_source_layers",
    "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer",
    "engram_pad_token_id": "engram_pad_id",
    "dspark_num_experts_per_tok": "dspark_n_activated_experts",
}

DEFAULTS = {
    "n_mtp_layers": 0,
    "n_shared_experts": 1,
    "score_func": "sqrtsoftplus",
    "gate_temp": 1.0,
    "norm_topk_prob": True,
    "route_scale": 1.0,
    "swiglu_limit": 0.0,
    "norm_eps": 1e-20,
    "original_seq_len": 0,
    "rope_theta": 10000.0,
    "compress_rope_theta": 40000.0,
    "rope_factor": 40.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "candidate_source_layer": -1,
    "candidate_topk_blocks": 0,
    "candidate_block_size": 0,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [],
    "engram_num_embeddings": [],
    "engram_max_ngram_size": 1,
    "engram_vocab_size": 0,
    "engram_n_heads": 0,
    "engram_head_dim": 0,
    "engram_pad_id": 2,
    "engram_compressed_vocab_size": 0,
    "kv_source_layers": [],
    "index_source_layers": [],
    "dtype": "fp8",
    "expert_dtype": "fp4",
    "dspark_block_size": 0,
    "dspark_noise_token_id": 0,
    "dspark_target_layer_ids": [],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 0,
    "dspark_n_activated_experts": 0,
}

REQUIRED = [
    "vocab_size", "dim", "moe_inter_dim", "n_layers", "n_heads", "n_routed_experts",
    "n_activated_experts", "q_lora_rank", "head_dim", "rope_head_dim", "o_groups", "o_lora_rank",
    "window_size", "compress_ratios", "hc_mult",
]


class ConfigError(Exception):
    """Bad config input; the message names the file and field."""


def _from_hf(cfg):
    text = dict(cfg.get("text_config", cfg))
    out = {}
    for k, v in text.items():
        out[HF_KEYS.get(k, k)] = v
    rs = text.get("rope_scaling") or {}
    for src, dst in (("original_max_position_embeddings", "original_seq_len"), ("factor", "rope_factor"),
                     ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
        if src in rs:
            out[dst] = rs[src]
    # Linear storage comes from quantization_config (HF 'dtype'/'torch_dtype' is the bf16 default)
    q = cfg.get("quantization_config") or text.get("quantization_config")
    if q and q.get("quant_method") == "fp8":
        out["dtype"] = "fp8"
        out["expert_dtype"] = q.get("expert_dtype")
    else:
        out["dtype"], out["expert_dtype"] = "bf16", None
    return out


class Config:
    """Attribute access to the reference keys, plus derived roles."""

    def __init__(self, raw, source="config"):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        if "text_config" in raw or "hidden_size" in raw:
            raw = _from_hf(raw)
        d = dict(DEFAULTS)
        d.update({k: v for k, v in raw.items() if v is not None or k == "expert_dtype"})
        for k in REQUIRED:
            if k not in d:
                raise ConfigError(f"{source}: missing field {k}")
        self.__dict__.update(d)
        self.source = source
        self.compress_ratios = [int(r) for r in self.compress_ratios]
        self.kv_source_layers = [int(x) for x in self.kv_source_layers]
        self.index_source_layers = [int(x) for x in self.index_source_layers]
        self.engram_layer_ids = [int(x) for x in self.engram_layer_ids]
        self.engram_num_embeddings = list(self.engram_num_embeddings)
        self._derive()

    def err(self, field, msg):
        raise ConfigError(f"{self.source}: {field}: {msg}")

    def _derive(self):
        L = self.n_layers
        if len(self.compress_ratios) < L:
            self.err("compress_ratios", f"expected at least n_layers={L} entries")
        if self.n_shared_experts != 1:
            self.err("n_shared_experts", "must be 1")
        if (self.n_heads * self.head_dim) % self.o_groups:
            self.err("o_groups", "must divide n_heads*head_dim")
        if self.rope_head_dim % 2 or self.rope_head_dim > self.head_dim:
            self.err("rope_head_dim", "must be even and <= head_dim")
        # activation blocks of 32 where the reference quantizes a linear's input; wo_b's input is
        # the groups side by side, so only o_groups * o_lora_rank must be a multiple (not o_lora_rank)
        for f in ("dim", "q_lora_rank", "head_dim", "moe_inter_dim"):
            if getattr(self, f) % 32:
                self.err(f, "must be a multiple of 32")
        if (self.o_groups * self.o_lora_rank) % 32:
            self.err("o_lora_rank", "o_groups * o_lora_rank must be a multiple of 32")
        if self.head_dim % 16:
            self.err("head_dim", "must be a multiple of 16")
        r = self.compress_ratios
        self.kv_src, self.idx_src, self.key_owner = {}, {}, {}
        for l in range(L):
            if r[l] <= 0:
                continue
            kv = [s for s in self.kv_source_layers if s <= l and r[s] > 0]
            ix = [s for s in self.index_source_layers if s <= l]
            if not kv:
                self.err("kv_source_layers", f"layer {l} (ratio {r[l]}) has no KV source at or before it")
            if not ix:
                self.err("index_source_layers", f"layer {l} (ratio {r[l]}) has no index source at or before it")
            self.kv_src[l], self.idx_src[l] = kv[-1], ix[-1]
            if r[kv[-1]] != r[l]:
                self.err("compress_ratios", f"layer {l} reads KV of layer {kv[-1]} with another ratio")
            if r[ix[-1]] != r[l]:
                self.err("compress_ratios", f"layer {l} reads top-k of layer {ix[-1]} with another ratio")
        for l in self.index_source_layers:
            if l >= L:
                continue
            if r[l] <= 0:
                self.err("index_source_layers", f"layer {l} has compress ratio 0")
            if self.index_head_dim % 32 or self.index_head_dim < self.rope_head_dim:
                self.err("index_head_dim", "must be a multiple of 32 and >= rope_head_dim")
            owners = [s for s in self.index_source_layers if s <= l and s in self.kv_source_layers]
            if not owners:
                self.err("index_source_layers", f"index source {l} has no index-key owner at or before it")
            if r[owners[-1]] != r[l]:
                self.err("compress_ratios", f"index source {l} reads index keys of layer {owners[-1]} "
                         "with another ratio")
            self.key_owner[l] = owners[-1]
        for l in self.kv_source_layers:
            if l < L and r[l] <= 0:
                self.err("kv_source_layers", f"layer {l} has compress ratio 0")
        self.candidates_on = self.candidate_source_layer >= 0
        if self.candidates_on:
            c = self.candidate_source_layer
            if c not in self.index_source_layers:
                self.err("candidate_source_layer", f"layer {c} is not an index source")
            if self.candidate_block_size <= 0 or self.candidate_topk_blocks <= 0:
                self.err("candidate_block_size", "candidate blocks need positive size and count")
            for l in self.index_source_layers:
                if c < l < L and r[l] != r[c]:
                    self.err("compress_ratios", f"candidate consumer {l} has another ratio than {c}")
        E = self.engram_layer_ids
        if E:
            if self.engram_max_ngram_size < 2:
                self.err("engram_max_ngram_size", "must be >= 2")
            if len(self.engram_num_embeddings) != len(E):
                self.err("engram_num_embeddings", "expected one entry per Engram layer")
            if self.engram_head_dim % 32 or self.engram_n_heads <= 0:
                self.err("engram_head_dim", "must be a multiple of 32 with engram_n_heads > 0")
            if self.engram_compressed_vocab_size <= 0:
                self.err("engram_compressed_vocab_size", "must be positive")

    # --- roles (spec 1.2) ---
    def ratio(self, l):
        return self.compress_ratios[l]

    def is_kv_source(self, l):
        return self.compress_ratios[l] > 0 and l in self.kv_source_layers

    def is_index_source(self, l):
        return self.compress_ratios[l] > 0 and l in self.index_source_layers

    def owns_index_keys(self, l):
        return self.is_index_source(l) and self.is_kv_source(l)

    def is_candidate_consumer(self, l):
        return self.candidates_on and self.is_index_source(l) and l > self.candidate_source_layer


def load_config(model_dir_or_file):
    path = model_dir_or_file
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    elif not os.path.exists(path):
        raise ConfigError(f"{path}: no such model directory or config file")
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return Config(raw, source=path)
