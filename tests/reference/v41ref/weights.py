"""Checkpoint tensors -> dequantized float64 weights (spec 2.1-2.3).

Every weight is held as its exact value in float64. Tensors the reference keeps in a bf16 module
parameter are rounded to bf16 on load whatever the file dtype (spec 2.2 note 1); fp32 ones to fp32.
"""

import numpy as np

from . import numerics as nx
from .safetensors_io import Checkpoint, CheckpointError

FLOAT_DTYPES = ("BF16", "F32", "F16", "F64")
FP4_DTYPES = ("I8", "U8", "F4")


class Lin:
    """A linear layer y = x W^T. kind: 'fp8' / 'fp4' (activation act_quant first, output stored as
    an activation), 'plain' (no act quant, output stored as an activation), 'f32' (fp32 output)."""

    def __init__(self, w, kind):
        self.w, self.kind = w, kind  # w: float64 [out, in]

    def __call__(self, x, mode):
        if self.kind in ("fp8", "fp4"):
            return mode.ra(nx.act_quant(x, mode) @ self.w.T)
        if self.kind == "plain":
            return mode.ra(x @ self.w.T)
        return mode.rf(x @ self.w.T)


class WeightReader:
    def __init__(self, model_dir):
        self.ckpt = Checkpoint(model_dir)

    def has(self, name):
        return name in self.ckpt

    def _check_shape(self, name, got, want):
        if tuple(got) != tuple(want):
            raise CheckpointError(f"{self.ckpt.dir}: tensor {name}: shape {list(got)}, expected {list(want)}")

    def floats(self, name, shape, eff="bf16"):
        """A float tensor rounded to its effective dtype ('bf16', 'f32' or 'f64' = as stored)."""
        info = self.ckpt.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{self.ckpt.dir}: tensor {name}: dtype {info.dtype}, expected a float dtype")
        self._check_shape(name, info.shape, shape)
        v = to_f64(self.ckpt.raw(name), info.dtype)
        return nx.bf16(v) if eff == "bf16" else nx.f32(v) if eff == "f32" else v

    def _scale(self, name, want_shape):
        info = self.ckpt.info(name)
        self._check_shape(name, info.shape, want_shape)
        raw = self.ckpt.raw(name)
        if info.dtype == "F8_E8M0":
            return nx.decode_e8m0(raw)
        if info.dtype in FLOAT_DTYPES:
            return to_f64(raw, info.dtype)
        raise CheckpointError(f"{self.ckpt.dir}: tensor {name}: dtype {info.dtype}, expected F8_E8M0")

    def fp8(self, name, out_dim, in_dim):
        """e4m3 weight with 32x32 block scales (ceil grid) -> exact float64 [out, in]."""
        info = self.ckpt.info(name + ".weight")
        if info.dtype != "F8_E4M3":
            raise CheckpointError(f"{self.ckpt.dir}: tensor {name}.weight: dtype {info.dtype}, expected F8_E4M3")
        self._check_shape(name + ".weight", info.shape, (out_dim, in_dim))
        s = self._scale(name + ".scale", (-(-out_dim // 32), -(-in_dim // 32)))
        w = nx.decode_e4m3(self.ckpt.raw(name + ".weight"))
        s = np.repeat(np.repeat(s, 32, axis=0), 32, axis=1)[:out_dim, :in_dim]
        return w * s

    def fp4(self, name, out_dim, in_dim):
        """Packed e2m1 weight (I8 [out, in/2], or F4 [out, in]) with e8m0 scales [out, in/32]."""
        info = self.ckpt.info(name + ".weight")
        if info.dtype not in FP4_DTYPES:
            raise CheckpointError(f"{self.ckpt.dir}: tensor {name}.weight: dtype {info.dtype}, expected I8 (fp4)")
        raw = self.ckpt.raw(name + ".weight")
        self._check_shape(name + ".weight", raw.shape, (out_dim, in_dim // 2))
        s = self._scale(name + ".scale", (out_dim, in_dim // 32))
        return nx.unpack_fp4(raw, in_dim) * np.repeat(s, 32, axis=1)

    # The stored dtype decides the computation, as in the reference's linear() (spec 2.3.6).

    def _float_weight(self, name, out_dim, in_dim, eff):
        """A float weight with no scale next to it (a scale only ever goes with fp8/fp4)."""
        info = self.ckpt.info(name + ".weight")
        if info.dtype in FLOAT_DTYPES and self.has(name + ".scale"):
            raise CheckpointError(f"{self.ckpt.dir}: tensor {name}.scale scales a {info.dtype} weight")
        return self.floats(name + ".weight", (out_dim, in_dim), eff=eff)

    def qlinear(self, name, out_dim, in_dim):
        """A linear of the model's default dtype: fp8 or fp4 + scale -> act_quant + quantized GEMM;
        a float weight -> plain linear on its stored values."""
        dtype = self.ckpt.info(name + ".weight").dtype
        if dtype == "F8_E4M3":
            return Lin(self.fp8(name, out_dim, in_dim), "fp8")
        if dtype in FP4_DTYPES:
            return Lin(self.fp4(name, out_dim, in_dim), "fp4")
        return Lin(self._float_weight(name, out_dim, in_dim, "f64"), "plain")

    def bf16_linear(self, name, out_dim, in_dim):
        """A bf16 parameter linear (wo_a, compressor r = 1, indexer wk / weights_proj): float values
        rounded to bf16; an fp8 weight (the release's wo_a) dequantized exactly (spec 2.3.1)."""
        if self.ckpt.info(name + ".weight").dtype == "F8_E4M3":
            return Lin(nx.bf16(self.fp8(name, out_dim, in_dim)), "plain")
        return Lin(self._float_weight(name, out_dim, in_dim, "bf16"), "plain")

    def f32_linear(self, name, out_dim, in_dim):
        """An fp32 parameter linear (compressor wkv/wgate at r > 1): fp32 output."""
        return Lin(self._float_weight(name, out_dim, in_dim, "f32"), "f32")


def to_f64(raw, dtype):
    if dtype == "BF16":
        return nx.bf16_bits_to_f64(raw)
    return np.asarray(raw).astype(np.float64)


class RowTable:
    """Embedding-like table read lazily by rows: bf16/float rows, or e4m3 rows with e8m0 scales per
    32 columns (the Engram table). Rows outside [0, n_valid) read as zeros (spec 9.5)."""

    def __init__(self, reader, name, rows, cols, quantized):
        self.quantized, self.rows, self.cols = quantized, rows, cols
        info = reader.ckpt.info(name + ".weight")
        reader._check_shape(name + ".weight", info.shape, (rows, cols))
        self.dtype = info.dtype
        self.data = reader.ckpt.raw(name + ".weight")
        if quantized:
            if info.dtype != "F8_E4M3":
                raise CheckpointError(f"{reader.ckpt.dir}: tensor {name}.weight: dtype {info.dtype}, expected F8_E4M3")
            sinfo = reader.ckpt.info(name + ".scale")
            reader._check_shape(name + ".scale", sinfo.shape, (rows, cols // 32))
            self.scale, self.scale_dtype = reader.ckpt.raw(name + ".scale"), sinfo.dtype
        elif info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{reader.ckpt.dir}: tensor {name}.weight: dtype {info.dtype}, expected BF16")

    def lookup(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        valid = (ids >= 0) & (ids < self.rows)
        safe = np.where(valid, ids, 0).reshape(-1)
        if self.quantized:
            v = nx.decode_e4m3(self.data[safe])
            sraw = self.scale[safe]
            s = nx.decode_e8m0(sraw) if self.scale_dtype == "F8_E8M0" else to_f64(sraw, self.scale_dtype)
            v = nx.bf16(v * np.repeat(s, 32, axis=1))
        else:
            v = nx.bf16(to_f64(self.data[safe], self.dtype))
        v = v.reshape(ids.shape + (self.cols,))
        return np.where(valid[..., None], v, 0.0)
