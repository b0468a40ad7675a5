"""Independent numpy reference of the DeepSeek-V4.1 text forward pass (V41_SPEC.md)."""

from .config import Config, ConfigError, load_config
from .model import Model, load_model
from .numerics import Mode
from .safetensors_io import Checkpoint, CheckpointError
from .tiny import ALT_CONFIG, TINY_CONFIG, fill_engram_sizes, make_tiny_checkpoint


def run_prompt(model, ids, chunks=None, stepwise=False, dump_dir=None, image=None):
    """Feed ids from position 0 (model is reset) as one call, as `chunks` sizes, or one token at a
    time; returns logits [len(ids), vocab] stacked from all calls. `image`: None or (mask [n],
    embeds [n, dim]) over the whole prompt (Model.forward)."""
    import numpy as np

    model.reset()
    ids = list(ids)
    if stepwise:
        chunks = [1] * len(ids)
    if chunks is None:
        chunks = [len(ids)]
    if sum(chunks) != len(ids) or min(chunks) <= 0:
        raise ValueError(f"chunks {chunks} do not split a prompt of {len(ids)} tokens")
    out, at = [], 0
    for n in chunks:
        part = None if image is None else (image[0][at : at + n], image[1][at : at + n])
        out.append(model.forward(ids[at : at + n], dump_dir=dump_dir, image=part))
        at += n
    return np.concatenate(out)


__all__ = [
    "ALT_CONFIG", "Checkpoint", "CheckpointError", "Config", "ConfigError", "Mode", "Model", "TINY_CONFIG",
    "fill_engram_sizes", "load_config", "load_model", "make_tiny_checkpoint", "run_prompt",
]
