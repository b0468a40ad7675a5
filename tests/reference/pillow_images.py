"""Images and what Pillow makes of them, for the C++ image preprocessing test (vision/image.h).

    pillow_images.py OUT_DIR PATCH DOWNSAMPLE MAX_TOKENS MIN_PIXELS

writes test images of many sizes, modes and formats into OUT_DIR and, per image, what the reference
preprocessing computes with Pillow: NAME.decoded (RGB bytes of open().convert("RGB")), NAME.padded
(RGB bytes after ImageOps.pad to the planned size, grey 127) and NAME.patches (bf16 bits, uint16
little-endian, [grid, 3 * PATCH^2], channel-major patches in row-major grid order), and one line per
image in OUT_DIR/manifest.txt: NAME FILE WIDTH HEIGHT PLAN_WIDTH PLAN_HEIGHT VIT_H VIT_W LLM_H LLM_W.
The plan follows the reference's arithmetic, written here independently of the C++ code.
"""

import math
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from v41ref.vision import pixels  # noqa: E402


def gif(screen, frame, rect, glob=None, local=None, transparent=None, interlace=False):
    """GIF89a bytes written by hand, for what encoders rarely write: a first frame `frame`
    (2-D palette indices) at `rect` = (left, top) on a `screen` = (w, h), global and local
    palettes of any size (or none), a transparent index, interlaced rows. The LZW stream holds
    literals only, with a clear code often enough that codes stay 9 bits wide."""
    def table(p):
        n = max(1, math.ceil(math.log2(max(len(p), 2))))
        p = list(p) + [(0, 0, 0)] * ((1 << n) - len(p))
        return n, bytes(c for rgb in p for c in rgb)

    out = bytearray(b"GIF89a") + screen[0].to_bytes(2, "little") + screen[1].to_bytes(2, "little")
    if glob:
        n, t = table(glob)
        out += bytes([0x80 | 0x70 | (n - 1), 0, 0]) + t
    else:
        out += bytes([0x70, 0, 0])
    if transparent is not None:
        out += bytes([0x21, 0xF9, 4, 1, 0, 0, transparent, 0])
    h, w = frame.shape
    flags = 0x40 if interlace else 0
    lt = b""
    if local:
        n, lt = table(local)
        flags |= 0x80 | (n - 1)
    out += bytes([0x2C]) + b"".join(v.to_bytes(2, "little") for v in (rect[0], rect[1], w, h))
    out += bytes([flags]) + lt
    rows = [y for f, s in ((0, 8), (4, 8), (2, 4), (1, 2)) for y in range(f, h, s)] if interlace else range(h)
    codes, run = [256], 0
    for y in rows:
        for v in frame[y]:
            codes.append(int(v))
            run += 1
            if run == 254:
                codes.append(256)
                run = 0
    codes.append(257)
    bits = sum(c << (9 * i) for i, c in enumerate(codes))
    data = bits.to_bytes((9 * len(codes) + 7) // 8, "little")
    out += bytes([8])
    for i in range(0, len(data), 255):
        out += bytes([len(data[i:i + 255])]) + data[i:i + 255]
    return bytes(out + b"\x00\x3b")


def images(rng):
    """(name, file name, PIL save arguments, image) for every case."""
    def rgb(w, h):
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")

    def smooth(w, h):  # a photo-like gradient with noise, so JPEG artefacts stay mild
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
        a = a + rng.integers(-20, 21, a.shape)
        return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB")

    rgba = Image.fromarray(rng.integers(0, 256, (31, 45, 4), dtype=np.uint8), "RGBA")
    la = Image.fromarray(rng.integers(0, 256, (19, 27, 2), dtype=np.uint8), "LA")
    pal = rgb(33, 21).convert("P", palette=Image.Palette.ADAPTIVE, colors=200)
    pal.info["transparency"] = 5
    one = Image.fromarray(rng.integers(0, 2, (13, 50), dtype=np.uint8).astype(bool))
    g16 = Image.fromarray((rng.integers(0, 600, (23, 17))).astype(np.uint16))
    pal16 = [tuple(int(c) for c in rng.integers(0, 256, 3)) for _ in range(16)]
    idx = lambda w, h, top: rng.integers(0, top, (h, w)).astype(np.uint8)
    crafted = [
        ("gif_offset", gif((10, 8), idx(5, 4, 16), (3, 2), glob=pal16)),
        ("gif_transparent", gif((10, 8), idx(5, 4, 16), (3, 2), glob=pal16, transparent=7)),
        ("gif_grown", gif((6, 6), idx(5, 5, 16), (4, 3), glob=pal16)),
        ("gif_short_palette", gif((9, 9), idx(9, 9, 200), (0, 0), glob=pal16[:4])),
        ("gif_no_palette", gif((8, 5), idx(8, 5, 256), (0, 0))),
        ("gif_interlaced", gif((7, 19), idx(7, 19, 16), (0, 0), glob=pal16, interlace=True)),
        ("gif_local", gif((12, 4), idx(12, 4, 8), (0, 0), glob=pal16, local=pal16[8:])),
    ]
    webp_rgba = Image.fromarray(rng.integers(0, 256, (37, 53, 4), dtype=np.uint8), "RGBA")
    return [(n, n + ".gif", None, b) for n, b in crafted] + [
        ("gif_pillow", "gif_pillow.gif", {}, rgb(41, 23).convert("P", palette=Image.Palette.ADAPTIVE)),
        ("gif_gray", "gif_gray.gif", {}, rgb(23, 41).convert("L")),
        ("webp_lossy", "webp_lossy.webp", {"quality": 80}, smooth(131, 71)),
        ("webp_lossless_alpha", "webp_lossless_alpha.webp", {"lossless": True}, webp_rgba),
        ("webp_lossy_alpha", "webp_lossy_alpha.webp", {"quality": 70}, webp_rgba),
        ("rgb_37x23", "rgb_37x23.png", {}, rgb(37, 23)),
        ("rgb_1x1", "rgb_1x1.png", {}, rgb(1, 1)),
        ("rgb_1000x1000", "rgb_1000x1000.png", {}, smooth(1000, 1000)),
        ("wide_3000x40", "wide_3000x40.png", {}, rgb(3000, 40)),
        ("tall_40x3000", "tall_40x3000.png", {}, rgb(40, 3000)),
        ("line_2000x3", "line_2000x3.png", {}, rgb(2000, 3)),
        ("column_3x2000", "column_3x2000.png", {}, rgb(3, 2000)),
        ("strip_60000x8", "strip_60000x8.png", {}, rgb(60000, 8)),
        ("strip_10x20000", "strip_10x20000.png", {}, rgb(10, 20000)),
        ("rgba", "rgba.png", {}, rgba),
        ("la", "la.png", {}, la),
        ("palette_trns", "palette_trns.png", {}, pal),
        ("bits1", "bits1.png", {}, one),
        ("gray16", "gray16.png", {}, g16),
        ("gray", "gray.png", {}, rgb(29, 41).convert("L")),
        ("photo_640x480", "photo_640x480.jpg", {"quality": 90}, smooth(640, 480)),
        ("photo_1920x1080", "photo_1920x1080.jpg", {"quality": 85}, smooth(1920, 1080)),
        ("photo_444", "photo_444.jpg", {"quality": 95, "subsampling": 0}, smooth(301, 97)),
        ("photo_progressive", "photo_progressive.jpg", {"progressive": True}, smooth(97, 301)),
        ("photo_gray", "photo_gray.jpg", {}, smooth(123, 77).convert("L")),
    ]


def main():
    out, p, r, n, min_pixels = sys.argv[1], *map(int, sys.argv[2:6])
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    with open(os.path.join(out, "manifest.txt"), "w") as m:
        for name, file, args, im in images(rng):
            path = os.path.join(out, file)
            if args is None:  # bytes written by hand
                with open(path, "wb") as f:
                    f.write(im)
            else:
                im.save(path, **args)
            img, padded, patches, (vh, vw, lh, lw) = pixels(path, p, r, n, min_pixels)
            img.tofile(os.path.join(out, name + ".decoded"))
            padded.tofile(os.path.join(out, name + ".padded"))
            patches.astype("<u2").tofile(os.path.join(out, name + ".patches"))
            h, w = img.shape[:2]
            m.write(f"{name} {file} {w} {h} {padded.shape[1]} {padded.shape[0]} {vh} {vw} {lh} {lw}\n")


if __name__ == "__main__":
    main()
