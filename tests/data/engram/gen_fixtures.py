#!/usr/bin/python3
"""Writes the Engram fixtures of tests/unit/kernels/engram_hash_test.cpp from numpy itself.

  numpy_integers.txt  default_rng(seed).integers(low, high, size=n, dtype=np.int64) for many seeds
                      (one to eight 32-bit entropy words) and ranges (64-bit and 32-bit draw paths,
                      rejection-heavy ranges, powers of two), plus streams of consecutive draws
                      from one generator that switch between the 32-bit and 64-bit paths.
  hash_cases.txt      Engram tables and hash ids of a random token sequence with DEAD tokens,
                      computed by the small numpy implementation below (whole sequence at once).

Run with the system python (numpy >= 1.17): /usr/bin/python3 tests/data/engram/gen_fixtures.py
Line formats are described at the top of each file.
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEAD = -1
I64_MAX = 2**63 - 1

# --- raw RNG ---

SEEDS = [0, 1, 2, 3, 42, 12345, 10007, 20014, 30021, 140098, 200140, 400280, 610427, 10007 * 429196,
         2**31, 2**32 - 1, 2**32, 2**32 + 1, 123456789012345, 2**63 - 1, 2**64 - 1, 2**64,
         2**64 + 12345, 2**96 + 7, 2**127 + 3, 2**128 - 1, 2**128 + 99, 2**160 + 2**100 + 1,
         3**100, 7**80 + 5]

# (low, high): high exclusive.
RANGES = [(0, 1), (0, 2), (0, 3), (0, 7), (0, 1000), (0, 2**16), (0, 2**31), (0, 2**31 + 1),
          (0, 2**32 - 1), (0, 2**32), (0, 2**32 + 1), (0, 2**33), (0, 10**12 + 39),
          (0, 46539438283891), (0, 9007199254740991), (0, 2**62), (0, 2**62 + 1), (0, I64_MAX),
          (-5, 5), (-(2**31), 2**31), (-(2**62), 2**62 + 1), (-(2**63), I64_MAX), (17, 18)]

# Consecutive draws from one generator, as (low, high, n).
STREAM = [(0, 100, 3), (0, 2**40, 2), (0, 100, 1), (0, 2**32, 3), (0, 1, 4), (0, 7, 2),
          (0, I64_MAX, 2), (0, 3, 5)]


def seed_words(seed):
    words = []
    while True:
        words.append(seed & 0xFFFFFFFF)
        seed >>= 32
        if seed == 0:
            return words


def draw(seed, low, high, n):
    return [int(v) for v in np.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64)]


def write_rng(path):
    lines = [
        "# default_rng(seed).integers(low, high, size=n, dtype=np.int64), numpy " + np.__version__,
        "# rng <seed decimal> <low> <high> <n> <values...>",
        "# stream <seed decimal> <n draws>, then n lines: draw <low> <high> <n> <values...> taken",
        "#   one after the other from the same generator",
    ]
    for i, seed in enumerate(SEEDS):
        assert len(seed_words(seed)) <= 8
        # Every seed gets the released-like range, the 32-bit edge cases, and a rotating subset.
        picks = {(0, 46539438283891), (0, 1), (0, 2), (0, 3), (0, 2**32)}
        picks |= {RANGES[(i * 5 + k) % len(RANGES)] for k in range(5)}
        for low, high in sorted(picks, key=RANGES.index):
            vals = draw(seed, low, high, 8)
            lines.append(" ".join(map(str, ["rng", seed, low, high, 8] + vals)))
    for seed in [0, 10007, 2**64 + 12345]:
        gen = np.random.default_rng(seed)
        lines.append(f"stream {seed} {len(STREAM)}")
        for low, high, n in STREAM:
            vals = [int(v) for v in gen.integers(low, high, size=n, dtype=np.int64)]
            lines.append(" ".join(map(str, ["draw", low, high, n] + vals)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# --- independent Engram hash (whole sequence at once, vectorised over positions) ---


def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def engram_tables(layer_ids, ng, hh, vocab, vc):
    bound = max(1, (I64_MAX // vc) // 2)
    mults = [[2 * int(v) + 1 for v in np.random.default_rng(10007 * l).integers(0, bound, size=ng, dtype=np.int64)]
             for l in layer_ids]
    used = set()
    primes = []
    for _ in layer_ids:
        row = []
        for _g in range(ng - 1):
            cur = vocab - 1
            for _h in range(hh):
                cand = cur + 1
                while not is_prime(cand) or cand in used:
                    cand += 1
                used.add(cand)
                row.append(cand)
                cur = cand
        primes.append(row)
    offsets = [[int(v) for v in np.concatenate([[0], np.cumsum(row)[:-1]])] for row in primes]
    return mults, primes, offsets


def engram_hash(tokens, mults, primes, offsets, ng, hh, pad):
    tok = np.asarray(tokens, dtype=np.int64)
    t = len(tok)
    pos = np.arange(t)
    tau = np.empty((ng, t), dtype=np.int64)
    blocked = np.zeros(t, dtype=bool)
    for k in range(ng):
        src = np.full(t, pad, dtype=np.int64)
        src[k:] = tok[:t - k]
        blocked = blocked | (pos < k) | (src == DEAD)
        tau[k] = np.where(blocked, pad, src)
    out = np.zeros((t, len(mults), (ng - 1) * hh), dtype=np.int64)
    for z in range(len(mults)):
        pi = tau * np.asarray(mults[z], dtype=np.int64)[:, None]
        rho = np.bitwise_xor.accumulate(pi, axis=0)
        p = np.asarray(primes[z], dtype=np.int64).reshape(ng - 1, hh)
        off = np.asarray(offsets[z], dtype=np.int64).reshape(ng - 1, hh)
        out[:, z, :] = ((rho[1:, :, None] % p[:, None, :]) + off[:, None, :]).transpose(1, 0, 2).reshape(t, -1)
    return out


def self_check():
    # Spec Appendix A.3 and A.1, so a slip in this script cannot pass for numpy's truth.
    m, p, o = engram_tables([1], 3, 2, 100, 512)
    assert m == [[14831304026200453, 936705081716061, 6959601268494069]], m
    assert p == [[101, 103, 107, 109]] and o == [[0, 101, 204, 311]], (p, o)
    ids = engram_hash([5, 300, 7, 511], m, p, o, 3, 2, 2)[:, 0, :].tolist()
    assert ids == [[67, 142, 214, 321], [76, 196, 224, 313], [10, 201, 216, 327], [76, 199, 270, 404]], ids
    m, _, _ = engram_tables([1, 14], 4, 1, 2, 99092)
    assert m == [[76632096046245, 4839876093313, 35959672319349, 73987337458391],
                 [67716810739261, 51510806800915, 30921347202721, 82619226485591]], m


CASES = [
    # name, layer ids, Ng, Hh, engram_vocab_size, V_c, pad, T, token seed
    ("small", [3, 7], 4, 3, 1000, 300, 2, 40, 1),
    # V_c above 2^30 puts the multiplier draw on numpy's 32-bit path; layer 0 has seed 0.
    ("wide", [0, 2, 5], 3, 2, 50, 3_000_000_000, 11, 25, 2),
    ("long", [1], 6, 1, 2, 64, 0, 30, 3),
]


def write_hash(path):
    lines = [
        "# Engram hash cases: tables and ids of the whole sequence, numpy " + np.__version__,
        "# case <name> <Ng> <Hh> <engram_vocab_size> <V_c> <pad> <T> <L_E> <layer ids...>",
        "# mult <z> <Ng values> | prime <z> <NC values> | offset <z> <NC values>",
        "# tokens <T values, -1 = DEAD> | ids <p> <z> <NC values>",
    ]
    for name, layers, ng, hh, vocab, vc, pad, t, tseed in CASES:
        mults, primes, offsets = engram_tables(layers, ng, hh, vocab, vc)
        r = np.random.default_rng(tseed)
        tokens = [int(v) for v in r.integers(0, vc, size=t, dtype=np.int64)]
        for i in r.choice(np.arange(1, t - 1), size=max(2, t // 8), replace=False):
            tokens[int(i)] = DEAD
        tokens[0] = DEAD if name == "long" else tokens[0]
        tokens[t - 1] = DEAD if name == "small" else tokens[t - 1]
        tokens[t // 2] = tokens[t // 2 + 1] = DEAD
        tokens[3] = pad
        ids = engram_hash(tokens, mults, primes, offsets, ng, hh, pad)
        lines.append(" ".join(map(str, ["case", name, ng, hh, vocab, vc, pad, t, len(layers)] + layers)))
        for z in range(len(layers)):
            lines.append(" ".join(map(str, ["mult", z] + mults[z])))
            lines.append(" ".join(map(str, ["prime", z] + primes[z])))
            lines.append(" ".join(map(str, ["offset", z] + offsets[z])))
        lines.append(" ".join(map(str, ["tokens"] + tokens)))
        for p in range(t):
            for z in range(len(layers)):
                lines.append(" ".join(map(str, ["ids", p, z] + ids[p, z].tolist())))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    self_check()
    write_rng(os.path.join(HERE, "numpy_integers.txt"))
    write_hash(os.path.join(HERE, "hash_cases.txt"))
