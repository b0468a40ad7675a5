#!/usr/bin/python3
"""Run the numpy V4.1 reference on a prompt of token ids and save all logits.

  run_reference.py --model DIR --prompt-ids 1,2,3 [--dtype bf16|fp32|fp64]
                   [--chunks 3,2,5 | --stepwise] [--greedy N] [--token-map FILE.npy]
                   [--demo-decode-defect] [--draft] [--dump-dir DIR] --out OUT.npz

Writes `logits` [n_prompt, vocab] and, with --greedy N, `greedy_ids` [N] and `greedy_logits`
[N, vocab] (row i is the distribution greedy_ids[i] was taken from; row 0 = logits[-1]).
With --draft (and --greedy N), the DSpark draft head drafts before each greedy token is fed, with
that token: `draft_ids` [N, B], `draft_logits` [N, B, vocab] and `draft_confidence` [N, B].
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from v41ref import ConfigError, CheckpointError, load_model, run_prompt  # noqa: E402


def int_list(text, what):
    try:
        vals = [int(v) for v in text.split(",") if v.strip() != ""]
    except ValueError:
        raise SystemExit(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise SystemExit(f"{what}: empty list")
    return vals


def greedy_argmax(logits):
    return int(np.argmax(logits))  # numpy returns the first (lowest) id among equal maxima


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp64"])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--chunks", help="comma-separated chunk sizes summing to the prompt length")
    g.add_argument("--stepwise", action="store_true", help="feed the prompt one token at a time")
    ap.add_argument("--greedy", type=int, default=0, help="greedy steps after the prompt")
    ap.add_argument("--token-map", help=".npy int array: raw id -> Engram compressed id")
    ap.add_argument("--demo-decode-defect", action="store_true",
                    help="reproduce the public demo's index-key pointer on one-token decode calls")
    ap.add_argument("--draft", action="store_true", help="DSpark drafts at every greedy step")
    ap.add_argument("--dump-dir", help="write <dir>/call<k>/<name>.npy activations per call")
    ap.add_argument("--image-embeds", help=".npy [prompt length, dim]: image-span rows' embeddings "
                    "(docs/vision.md), with --image-rows")
    ap.add_argument("--image-rows", help="comma-separated prompt positions of image-span rows")
    ap.add_argument("--image", action="append", default=[],
                    help="an image file for the next image token of --prompt-ids (repeatable): "
                    "Pillow preprocessing, the numpy tower, the span (docs/vision.md)")
    ap.add_argument("--out", required=True, help="output .npz")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)

    ids = int_list(a.prompt_ids, "--prompt-ids")
    chunks = int_list(a.chunks, "--chunks") if a.chunks else None
    if chunks and (sum(chunks) != len(ids) or min(chunks) <= 0):
        raise SystemExit(f"--chunks: sizes {chunks} must be positive and sum to the prompt length {len(ids)}")
    if a.greedy < 0:
        raise SystemExit("--greedy: expected N >= 0")
    try:
        t0 = time.time()
        model = load_model(a.model, dtype=a.dtype, token_map=a.token_map, demo_decode_defect=a.demo_decode_defect)
        t1 = time.time()
        image = None
        if a.image:
            import json

            from v41ref.vision import VisionTower

            with open(os.path.join(a.model, "config.json")) as f:
                token = json.load(f)["image_token_id"]
            ids, mask, embeds = VisionTower(a.model).prompt(a.model, ids, token, a.image, a.dtype)
            image = (mask, embeds)
        elif a.image_rows:
            mask = np.zeros(len(ids), dtype=bool)
            mask[int_list(a.image_rows, "--image-rows")] = True
            image = (mask, np.load(a.image_embeds).astype(np.float64))
        logits = run_prompt(model, ids, chunks=chunks, stepwise=a.stepwise, dump_dir=a.dump_dir, image=image)
        out = {"logits": logits}
        if a.greedy:
            g_ids, g_logits = [greedy_argmax(logits[-1])], [logits[-1]]
            drafts = []
            for i in range(a.greedy):
                if a.draft:
                    drafts.append(model.draft(g_ids[-1]))
                if i == a.greedy - 1:
                    break
                row = model.forward([g_ids[-1]], dump_dir=a.dump_dir)[-1]
                g_ids.append(greedy_argmax(row))
                g_logits.append(row)
            if drafts:
                out["draft_ids"] = np.stack([d[0] for d in drafts])
                out["draft_logits"] = np.stack([d[1] for d in drafts])
                out["draft_confidence"] = np.stack([d[2] for d in drafts])
            out["greedy_ids"] = np.array(g_ids, dtype=np.int64)
            out["greedy_logits"] = np.stack(g_logits)
        t2 = time.time()
    except (ConfigError, CheckpointError, ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    np.savez(a.out, **out)
    if not a.quiet:
        msg = f"load {t1 - t0:.2f}s, forward {t2 - t1:.2f}s, {len(ids)} prompt tokens"
        if a.greedy:
            msg += f", greedy {out['greedy_ids'].tolist()}"
        print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
