#!/usr/bin/python3
"""Writes the seed inputs of the fuzz targets (fuzz/): small valid safetensors files and the
released config in both of its forms. Run from anywhere; files land next to this script.
The make-tiny preset configs (config/preset-*.json) come from `deepinfer make-tiny`."""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, data bytes); offsets follow in order."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def pattern(n):
    return bytes((i * 37 + 11) & 0xFF for i in range(n))


seeds = {
    "all-dtypes.safetensors": safetensors(
        [("f32", "F32", [2, 3], pattern(24)), ("f16", "F16", [3], pattern(6)),
         ("bf16", "BF16", [2, 2], pattern(8)), ("e4m3", "F8_E4M3", [5], pattern(5)),
         ("e8m0", "F8_E8M0", [2, 3], pattern(6)), ("i8", "I8", [7], pattern(7)),
         ("u8", "U8", [1, 1, 3], pattern(3)), ("i32", "I32", [2], pattern(8)),
         ("i64", "I64", [3], pattern(24)), ("f4", "F4", [4, 6], pattern(12))],
        {"format": "pt"}),
    "empty.safetensors": safetensors([]),
    "zero-size.safetensors": safetensors(
        [("a", "F32", [0, 5], b""), ("scalar", "F32", [], pattern(4)),
         ("b", "BF16", [3, 0], b""), ("six", "U8", [1, 2, 1, 2, 1, 2], pattern(8))]),
    "expert.safetensors": safetensors(
        [("layers.0.ffn.experts.0.w1.weight", "I8", [4, 16], pattern(64)),
         ("layers.0.ffn.experts.0.w1.scale", "F8_E8M0", [4, 1], pattern(4)),
         ("layers.0.ffn.experts.1.w1.weight", "F4", [4, 32], pattern(64)),
         ("layers.0.attn_norm.weight", "BF16", [32], pattern(64))],
        {"format": "pt", "note": "fp4 as I8 and as F4"}),
}
os.makedirs(os.path.join(here, "safetensors"), exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(here, "safetensors", name), "wb") as f:
        f.write(data)

# The released config, flat and in the Hugging Face form (V41_SPEC.md §1.1 names).
flat = json.load(open(os.path.join(here, "..", "v41_flash_inference_config.json")))
renames = {"dim": "hidden_size", "moe_inter_dim": "moe_intermediate_size",
           "n_layers": "num_hidden_layers", "n_mtp_layers": "num_nextn_predict_layers",
           "n_heads": "num_attention_heads", "n_activated_experts": "num_experts_per_tok",
           "score_func": "scoring_func", "route_scale": "routed_scaling_factor",
           "rope_head_dim": "qk_rope_head_dim", "norm_eps": "rms_norm_eps",
           "window_size": "sliding_window", "kv_source_layers": "kv_source_layer_ids",
           "index_source_layers": "index_source_layer_ids",
           "candidate_source_layer": "candidate_source_layer_id",
           "engram_pad_id": "engram_pad_token_id",
           "dspark_n_activated_experts": "dspark_num_experts_per_tok"}
text, vision, top = {}, {}, {}
for k, v in flat.items():
    if k in ("dtype", "expert_dtype"):
        continue
    if k in ("original_seq_len", "rope_factor", "beta_fast", "beta_slow"):
        key = {"original_seq_len": "original_max_position_embeddings",
               "rope_factor": "factor"}.get(k, k)
        text.setdefault("rope_scaling", {"type": "yarn"})[key] = v
    elif k.startswith("vision_"):
        vision[{"vision_n_layers": "num_hidden_layers", "vision_dim": "hidden_size",
                "vision_n_heads": "num_attention_heads",
                "vision_inter_dim": "intermediate_size"}.get(k, k[len("vision_"):])] = v
    elif k == "image_token_id":
        top[k] = v
    else:
        text[renames.get(k, k)] = v
hf = {"model_type": "deepseek_v41", "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
      **top, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                     "expert_dtype": "fp4"},
      "vision_config": vision, "text_config": text}
os.makedirs(os.path.join(here, "config"), exist_ok=True)
for name, obj in (("released-flat.json", flat), ("released-hf.json", hf)):
    with open(os.path.join(here, "config", name), "w") as f:
        f.write(json.dumps(obj, separators=(",", ":")))
