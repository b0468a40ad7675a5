"""The vision tower (docs/vision.md): ViT blocks and the aligner over one image's patches, written
from the description of the public reference, independently of the C++ code.

Values are float64 arrays rounded by the mode: `ra` where the reference holds a bf16 activation,
`rf` after each fp32 operation; sums (matrix products, softmax denominators) run in float64 and
round once. A single float64 operation on fp32 values rounded to fp32 equals the fp32 operation
(53 >= 2 * 24 + 2), so this is the fp32 arithmetic the spec describes."""

import json
import math
import os

import numpy as np

from . import numerics as nx
from .attention import rmsnorm
from .weights import WeightReader

EPS = 1e-6


def plan(width, height, p, r, n, min_pixels):
    """The reference's resize plan: (best_w, best_h, vit_h, vit_w, llm_h, llm_w)."""
    if 0 < width * height < min_pixels:
        s = (min_pixels / (width * height)) ** 0.5
        width, height = int(width * s), int(height * s)
    bw, bh = math.ceil(width / p) * p, math.ceil(height / p) * p

    def grid(bh, bw):
        return math.ceil((bh // p) / r), math.ceil((bw // p) / r)

    lh, lw = grid(bh, bw)
    if lh * (lw + 1) + 2 > n:
        q = height / width
        mw = math.sqrt((n - 2) / q + 0.25) - 0.5
        mh = mw * q
        cell = p * r
        if mw < 1.0:
            bh, bw = (n - 2) // 2 * cell, cell
        elif mh < 1.0:
            bh, bw = cell, (n - 3) * cell
        else:
            beta = min(math.floor(mw) * cell / width, math.floor(mh) * cell / height)
            bh, bw = math.floor(height * beta / p) * p, math.floor(width * beta / p) * p
        lh, lw = grid(bh, bw)
        assert lh * (lw + 1) + 2 <= n
    return bw, bh, bh // p, bw // p, lh, lw


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


LUT = bf16_bits((np.arange(256, dtype=np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5))


def pixels(path, p, r, n, min_pixels):
    """An image file through Pillow as the reference preprocesses it: (decoded RGB, padded RGB,
    patch bf16 bits [vit_h * vit_w, 3 p^2], (vit_h, vit_w, llm_h, llm_w))."""
    from PIL import Image, ImageOps

    with Image.open(path) as src:
        img = src.convert("RGB")
    bw, bh, vh, vw, lh, lw = plan(img.width, img.height, p, r, n, min_pixels)
    padded = np.asarray(ImageOps.pad(img, (bw, bh), color=(127, 127, 127)), dtype=np.uint8)
    patches = LUT[padded].transpose(2, 0, 1).reshape(3, vh, p, vw, p).transpose(1, 3, 0, 2, 4)
    return np.asarray(img, dtype=np.uint8), padded, patches.reshape(vh * vw, -1), (vh, vw, lh, lw)


class VisionTower:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        c = c.get("text_config", c) | {k: v for k, v in c.items() if k.startswith("vision")}
        self.layers, self.dv, self.heads = c["vision_n_layers"], c["vision_dim"], c["vision_n_heads"]
        self.inter, self.p = c["vision_inter_dim"], c["vision_patch_size"]
        self.r, self.theta, self.dim = c["vision_downsample_ratio"], c.get("vision_rope_theta", 1e4), c["dim"]
        if self.layers <= 0:
            raise ValueError(f"{model_dir}: the config has no vision tower")
        rd = WeightReader(model_dir)
        bf = lambda name, shape: rd.floats(name, shape, eff="bf16")
        dv, f, p, r, d = self.dv, self.inter, self.p, self.r, self.dim
        self.pe = (bf("vision.patch_embed.proj.weight", (dv, 3 * p * p)), bf("vision.patch_embed.proj.bias", (dv,)))
        self.blocks = []
        for i in range(self.layers):
            b = f"vision.blocks.{i}."
            self.blocks.append({
                "norm1": bf(b + "norm1.weight", (dv,)), "norm2": bf(b + "norm2.weight", (dv,)),
                "qkv": (bf(b + "attn.wqkv.weight", (3 * dv, dv)), bf(b + "attn.wqkv.bias", (3 * dv,))),
                "wo": (bf(b + "attn.wo.weight", (dv, dv)), bf(b + "attn.wo.bias", (dv,))),
                "w1": (bf(b + "mlp.w1.weight", (2 * f, dv)), None), "w2": (bf(b + "mlp.w2.weight", (dv, f)), None),
            })
        self.norm = bf("vision.norm.weight", (dv,))
        self.a1 = (bf("aligner.w1.weight", (d, dv * r * r)), bf("aligner.w1.bias", (d,)))
        self.a2 = (bf("aligner.w2.weight", (d, d)), bf("aligner.w2.bias", (d,)))

    def prompt(self, model_dir, ids, image_token, paths, mode):
        """ids with each image token replaced by its image's span (the files in `paths`, in
        order): (ids, mask [T], embeds [T, dim]) for Model.forward's `image`."""
        rd = WeightReader(model_dir)
        delim = {t: rd.floats(name, (self.dim,), eff="bf16")
                 for t, name in ((0, "image_start"), (2, "image_newline"), (3, "image_end"))}
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        out, mask, rows = [], [], []
        images = iter(paths)
        for t in ids:
            if t != image_token:
                out.append(t)
                mask.append(False)
                rows.append(np.zeros(self.dim))
                continue
            _, _, bits, (vh, vw, lh, lw) = pixels(next(images), self.p, self.r, c["vision_max_n_token"],
                                                   c.get("vision_min_pixels", 0))
            feats = self.encode(nx.bf16_bits_to_f64(bits), vh, vw, mode)
            span = [delim[0]]
            for y in range(lh):
                span += [feats[y * lw + x] for x in range(lw)] + [delim[2]]
            span.append(delim[3])
            out += [image_token] * len(span)
            mask += [True] * len(span)
            rows += span
        return out, np.array(mask), np.stack(rows)

    def encode(self, patches, vit_h, vit_w, mode):
        """patches: float64 [vit_h * vit_w, 3 p^2] (bf16 values) -> [ceil(h/r) * ceil(w/r), dim]."""
        mode = nx.Mode(mode) if isinstance(mode, str) else mode
        n, dv, hd = vit_h * vit_w, self.dv, self.dv // self.heads
        half, quarter = hd // 2, hd // 4

        def lin(x, wb):
            y = mode.rf(x @ wb[0].T)
            if wb[1] is not None:
                y = mode.rf(y + wb[1])
            return mode.ra(y)

        # 2D rotary tables: pairs (j, j + half); the first quarter turn by the row, the rest by the
        # column; inv_freq = 1 / theta^(2j / half) with fp32 steps and the power in float64.
        e = nx.f32(np.arange(quarter) * 2.0 / half)
        inv = nx.f32(1.0 / nx.f32(np.power(float(self.theta), e)))
        rows, cols = np.arange(n) // vit_w, np.arange(n) % vit_w
        ang = np.concatenate([nx.f32(rows[:, None] * inv[None]), nx.f32(cols[:, None] * inv[None])], axis=1)
        cos, sin = nx.f32(np.cos(ang)), nx.f32(np.sin(ang))  # [n, half]

        def rotate(v):  # [n, heads, hd]
            a, b = v[..., :half], v[..., half:]
            c, s = cos[:, None, :], sin[:, None, :]
            return np.concatenate([nx.f32(nx.f32(a * c) - nx.f32(b * s)), nx.f32(nx.f32(b * c) + nx.f32(a * s))], axis=-1)

        h = lin(patches, self.pe)
        for blk in self.blocks:
            qkv = lin(rmsnorm(h, blk["norm1"], mode, mode.const(EPS)), blk["qkv"])
            q, k, v = (qkv[:, i * dv:(i + 1) * dv].reshape(n, self.heads, hd) for i in range(3))
            q, k = mode.ra(rotate(q)), mode.ra(rotate(k))
            o = np.zeros((n, self.heads, hd))
            for hh in range(self.heads):
                s = mode.rf(mode.rf(q[:, hh] @ k[:, hh].T) * 0.125)
                ex = mode.rf(np.exp(mode.rf(s - s.max(axis=1, keepdims=True))))
                pr = mode.ra(mode.rf(ex / mode.rf(ex.sum(axis=1, keepdims=True))))
                o[:, hh] = mode.ra(pr @ v[:, hh])
            h = mode.ra(mode.rf(h + lin(o.reshape(n, dv), blk["wo"])))
            g = lin(rmsnorm(h, blk["norm2"], mode, mode.const(EPS)), blk["w1"])
            gate, up = g[:, :self.inter], g[:, self.inter:]
            a = mode.ra(mode.rf(gate / (1.0 + np.exp(-gate))))
            h = mode.ra(mode.rf(h + lin(mode.ra(mode.rf(a * up)), blk["w2"])))
        h = rmsnorm(h, self.norm, mode, mode.const(EPS))

        # Aligner: r x r blocks of the zero-padded grid, features ordered (channel, row, column).
        r = self.r
        bh, bw = -(-vit_h // r), -(-vit_w // r)
        grid = np.zeros((bh * r, bw * r, dv))
        grid[:vit_h, :vit_w] = h.reshape(vit_h, vit_w, dv)
        z = grid.reshape(bh, r, bw, r, dv).transpose(0, 2, 4, 1, 3).reshape(bh * bw, dv * r * r)
        a = lin(z, self.a1)
        erf = np.vectorize(math.erf)
        a = mode.ra(mode.rf(0.5 * a * (1.0 + erf(a / math.sqrt(2.0)))))
        return lin(a, self.a2)


def main(argv=None):  # python3 -m v41ref.vision (from tests/reference)
    import argparse

    ap = argparse.ArgumentParser(description="The vision tower over one image's patches")
    ap.add_argument("--model", required=True)
    ap.add_argument("--patches", required=True, help=".npy float [vit_h * vit_w, 3 p^2] (bf16 values)")
    ap.add_argument("--grid", required=True, type=int, nargs=2, metavar=("VIT_H", "VIT_W"))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--out", required=True, help=".npy float32 [tokens, dim]")
    a = ap.parse_args(argv)
    x = np.load(a.patches).astype(np.float64)
    out = VisionTower(a.model).encode(x, a.grid[0], a.grid[1], a.dtype)
    np.save(a.out, out.astype(np.float32))


if __name__ == "__main__":
    main()
