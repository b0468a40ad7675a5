"""Checkpoint reading (spec 2.1): shard layouts, F4 vs I8 expert storage, dtype conversions,
and errors that name the offending file / tensor."""

import json
import os
import shutil
import struct
import tempfile
import unittest

import numpy as np

import refcase
from v41ref import CheckpointError, ConfigError, load_model, make_tiny_checkpoint, run_prompt
from v41ref import ALT_CONFIG
from v41ref.safetensors_io import Checkpoint, read_header, write_safetensors


class TestLayouts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="v41ref-ckpt-")
        cls.ids = refcase.prompt(9, ALT_CONFIG["vocab_size"], seed=8)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def logits(self, d):
        return run_prompt(load_model(d, dtype="fp32"), self.ids)

    def test_same_logits_for_every_layout(self):
        base = self.logits(refcase.checkpoint("alt"))  # two shards + index, split mid-layer
        variants = {}
        for name, kw in (("single", dict(n_shards=1)), ("three", dict(n_shards=3)),
                         ("f4", dict(n_shards=2, fp4_dtype="F4"))):
            d = os.path.join(self.tmp, name)
            make_tiny_checkpoint(d, ALT_CONFIG, seed=0, **kw)
            variants[name] = d
        noindex = os.path.join(self.tmp, "noindex")
        shutil.copytree(variants["three"], noindex)
        os.remove(os.path.join(noindex, "model.safetensors.index.json"))
        variants["noindex"] = noindex
        self.assertTrue(os.path.exists(os.path.join(variants["single"], "model.safetensors")))
        info = Checkpoint(variants["f4"]).info("layers.0.ffn.experts.0.w1.weight")
        self.assertEqual((info.dtype, info.shape), ("F4", (64, 96)))
        for name, d in variants.items():
            np.testing.assert_array_equal(self.logits(d), base, err_msg=name)

    def test_index_split_mid_layer(self):
        d = refcase.checkpoint("alt")
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            wm = json.load(f)["weight_map"]
        split = [l for l in range(ALT_CONFIG["n_layers"])
                 if len({fn for n, fn in wm.items() if n.startswith(f"layers.{l}.")}) > 1]
        self.assertEqual(len(split), 1)  # one layer has its tensors in both shards

    def test_hf_style_config(self):
        d = os.path.join(self.tmp, "hf")
        shutil.copytree(refcase.checkpoint("alt"), d)
        with open(os.path.join(d, "config.json")) as f:
            flat = json.load(f)
        ren = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "window_size": "sliding_window",
               "n_heads": "num_attention_heads", "norm_eps": "rms_norm_eps", "rope_head_dim": "qk_rope_head_dim",
               "kv_source_layers": "kv_source_layer_ids", "index_source_layers": "index_source_layer_ids",
               "candidate_source_layer": "candidate_source_layer_id", "moe_inter_dim": "moe_intermediate_size",
               "n_activated_experts": "num_experts_per_tok", "route_scale": "routed_scaling_factor",
               "engram_pad_id": "engram_pad_token_id", "score_func": "scoring_func"}
        text = {ren.get(k, k): v for k, v in flat.items()
                if k not in ("dtype", "expert_dtype", "original_seq_len", "rope_factor", "beta_fast", "beta_slow")}
        text["rope_scaling"] = {"type": "yarn", "original_max_position_embeddings": flat["original_seq_len"],
                                "factor": flat["rope_factor"], "beta_fast": flat["beta_fast"],
                                "beta_slow": flat["beta_slow"]}
        hf = {"architectures": ["x"], "text_config": text, "dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                      "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(hf, f)
        np.testing.assert_array_equal(self.logits(d), self.logits(refcase.checkpoint("alt")))


class TestErrors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="v41ref-bad-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_bad_files(self):
        p = os.path.join(self.tmp, "a.safetensors")
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 1000) + b"{}")
        with self.assertRaisesRegex(CheckpointError, "a.safetensors: header length"):
            read_header(p)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 4) + b"{x}\n")
        with self.assertRaisesRegex(CheckpointError, "not valid JSON"):
            read_header(p)
        write_safetensors(p, {"t": ("F32", (3,), np.zeros(2, np.float32))})
        with self.assertRaisesRegex(CheckpointError, "tensor t: 8 bytes do not fit F32"):
            read_header(p)
        write_safetensors(p, {"t": ("Q7", (2,), np.zeros(2, np.float32))})
        with self.assertRaisesRegex(CheckpointError, "unsupported dtype"):
            read_header(p)

    def test_missing_or_mistyped_tensor(self):
        d = os.path.join(self.tmp, "m")
        shutil.copytree(refcase.checkpoint("alt"), d)
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        del idx["weight_map"]["layers.3.attn.indexer.wq_b.scale"]
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f)
        with self.assertRaisesRegex(CheckpointError, "missing tensor layers.3.attn.indexer.wq_b.scale"):
            load_model(d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg["q_lora_rank"] = 64
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        want = r"layers.0.attn.wq_a.weight: shape \[32, 96\], expected \[64, 96\]"
        with self.assertRaisesRegex(CheckpointError, want):
            load_model(d)
        cfg["q_lora_rank"], cfg["compress_ratios"] = 32, [0, 3, 1, 3, 1, 1]
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        with self.assertRaisesRegex(ConfigError, "compress_ratios"):
            load_model(d)
        with self.assertRaisesRegex(ConfigError, "no such model directory"):
            load_model(os.path.join(self.tmp, "nothing"))


if __name__ == "__main__":
    unittest.main()
