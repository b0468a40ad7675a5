"""Safetensors reading (lazy, numpy memmap) and writing.

File layout: u64 little-endian header length N, N bytes of JSON header
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data block
that the offsets index. Raw arrays are returned with these numpy dtypes: F32 <f4, F16 <f2,
F64 <f8, BF16 <u2 (raw words), F8_E4M3 / F8_E8M0 / U8 / F4 u1, I8 i1, I32 <i4, I64 <i8.
F4 holds two 4-bit elements per byte; its header shape counts 4-bit elements.
"""

import json
import os
import struct

import numpy as np

RAW_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F4": np.dtype("u1"),
}


class CheckpointError(Exception):
    """Malformed or inconsistent checkpoint input; the message names the file/tensor."""


class TensorInfo:
    def __init__(self, path, name, dtype, shape, begin, end):
        self.path, self.name, self.dtype = path, name, dtype
        self.shape, self.begin, self.end = tuple(shape), begin, end

    def __repr__(self):
        return f"TensorInfo({self.name}, {self.dtype}, {list(self.shape)})"


def read_header(path):
    """Parse one safetensors file header -> {name: TensorInfo}."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > (1 << 30):
            raise CheckpointError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name}: expected dtype, shape, data_offsets") from None
        if dtype not in RAW_DTYPES:
            raise CheckpointError(f"{path}: tensor {name}: unsupported dtype {dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"{path}: tensor {name}: bad shape {shape}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_len):
            raise CheckpointError(f"{path}: tensor {name}: data_offsets {[begin, end]} outside the data")
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = end - begin
        if dtype == "F4":
            ok = nbytes in ((numel + 1) // 2, numel)  # logical shape, or a packed-byte shape
        else:
            ok = nbytes == numel * RAW_DTYPES[dtype].itemsize
        if not ok:
            raise CheckpointError(f"{path}: tensor {name}: {nbytes} bytes do not fit {dtype} {shape}")
        out[name] = TensorInfo(path, name, dtype, shape, data_start + begin, data_start + end)
    return out


def load_raw(info):
    """Memory-map one tensor. F4 comes back as packed bytes [..., last/2] (or as stored when the
    header shape already counts bytes)."""
    dt = RAW_DTYPES[info.dtype]
    shape = info.shape
    if info.dtype == "F4":
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if info.end - info.begin != numel and shape:  # logical shape: two elements per byte
            if shape[-1] % 2:
                raise CheckpointError(f"{info.path}: tensor {info.name}: F4 last dim {shape[-1]} is odd")
            shape = tuple(shape[:-1]) + (shape[-1] // 2,)
    if info.end == info.begin:
        return np.zeros(shape, dtype=dt)
    return np.memmap(info.path, dtype=dt, mode="r", offset=info.begin, shape=shape)


class Checkpoint:
    """Tensor name -> TensorInfo over all shards of a checkpoint directory: follows
    model.safetensors.index.json when present, else model.safetensors, else every *.safetensors."""

    def __init__(self, model_dir):
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        self.tensors = {}
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: expected a JSON object with weight_map ({e})") from None
            headers = {}
            for name, fname in weight_map.items():
                path = os.path.join(model_dir, fname)
                if path not in headers:
                    if not os.path.exists(path):
                        raise CheckpointError(f"{index}: shard {fname} (for {name}) does not exist")
                    headers[path] = read_header(path)
                if name not in headers[path]:
                    raise CheckpointError(f"{index}: tensor {name} is not in shard {fname}")
                self.tensors[name] = headers[path][name]
        else:
            single = os.path.join(model_dir, "model.safetensors")
            if os.path.exists(single):
                files = [single]
            else:
                files = sorted(
                    os.path.join(model_dir, f) for f in os.listdir(model_dir) if f.endswith(".safetensors")
                )
            if not files:
                raise CheckpointError(f"{model_dir}: no *.safetensors files")
            for path in files:
                for name, info in read_header(path).items():
                    if name in self.tensors:
                        raise CheckpointError(f"{path}: tensor {name} also in {self.tensors[name].path}")
                    self.tensors[name] = info

    def __contains__(self, name):
        return name in self.tensors

    def info(self, name):
        if name not in self.tensors:
            raise CheckpointError(f"{self.dir}: missing tensor {name}")
        return self.tensors[name]

    def raw(self, name):
        return load_raw(self.info(name))


# --- writing ------------------------------------------------------------------------------------


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype_name, shape, raw numpy array whose bytes are the payload)}."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # data block 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
