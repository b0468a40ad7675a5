"""Shared fixtures of the reference self-tests: generated tiny checkpoints (one per process)."""

import atexit
import functools
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import v41ref  # noqa: E402

RELEASED_CONFIG = "/work/shared/data/v41-flash/inference_config.json"


@functools.lru_cache(maxsize=None)
def checkpoint(name="tiny", seed=0, fp4_dtype="I8", n_shards=2):
    """Directory of a generated checkpoint ('tiny' = TINY_CONFIG, 'alt' = ALT_CONFIG)."""
    d = tempfile.mkdtemp(prefix=f"v41ref-{name}-")
    atexit.register(shutil.rmtree, d, True)
    cfg = {"tiny": v41ref.TINY_CONFIG, "alt": v41ref.ALT_CONFIG}[name]
    v41ref.make_tiny_checkpoint(d, cfg, seed=seed, n_shards=n_shards, fp4_dtype=fp4_dtype)
    return d


def prompt(n, vocab, seed=1):
    return [int(v) for v in np.random.default_rng(seed).integers(0, vocab, size=n)]


def load_dump(root, n_calls, name):
    """Concatenate <root>/call<k>/<name>.npy over calls along the first axis."""
    parts = [np.load(os.path.join(root, f"call{k}", name + ".npy")) for k in range(n_calls)]
    return np.concatenate(parts)


def bf16_ulp(x):
    """Spacing of bf16 numbers at |x| (for normal values): 2^(floor(log2|x|) - 7)."""
    ax = np.maximum(np.abs(np.asarray(x, dtype=np.float64)), 2.0**-126)
    return np.ldexp(1.0, np.floor(np.log2(ax)).astype(np.int64) - 7)
