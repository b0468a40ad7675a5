"""Engram n-gram hashing (spec 9.1-9.4, 12.5): multipliers, primes, offsets and hash ids."""

import numpy as np

DEAD = -1
SEED_MULT = 10007


def multiplier_bound(compressed_vocab):
    max_long = np.iinfo(np.int64).max
    return max(1, (max_long // int(compressed_vocab)) // 2)


def hash_multipliers(layer_ids, max_ngram, compressed_vocab):
    """mu[z][i] = 2*v_i + 1 with v = default_rng(10007*layer).integers(0, bound, Ng) (spec 9.2)."""
    bound = multiplier_bound(compressed_vocab)
    rows = []
    for layer in layer_ids:
        v = np.random.default_rng(SEED_MULT * layer).integers(0, bound, size=max_ngram, dtype=np.int64)
        rows.append([2 * int(x) + 1 for x in v])
    return rows


def is_prime(n):
    """Deterministic Miller-Rabin for n < 3.3e24 (covers every 64-bit value)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(n_layers, max_ngram, n_heads, vocab_start):
    """P[z][g][h] (spec 9.3): per (z, g) the search restarts at vocab_start - 1, each head takes
    the smallest prime above the running value not used by any earlier (z, g, h)."""
    seen, out = set(), []
    for _ in range(n_layers):
        per_layer = []
        for _ in range(max_ngram - 1):
            current, sizes = vocab_start - 1, []
            for _ in range(n_heads):
                c = current + 1
                while not is_prime(c) or c in seen:
                    c += 1
                seen.add(c)
                sizes.append(c)
                current = c
            per_layer.append(sizes)
        out.append(per_layer)
    return out


class EngramHasher:
    """Hash ids for chunks of a sequence; keeps the compressed-id history between calls."""

    def __init__(self, layer_ids, max_ngram, n_heads, vocab_start, compressed_vocab, pad_id, token_map=None):
        self.layer_ids = list(layer_ids)
        self.ng, self.hh = max_ngram, n_heads
        self.primes = engram_primes(len(self.layer_ids), max_ngram, n_heads, vocab_start)
        flat = [[p for g in layer for p in g] for layer in self.primes]
        self.flat_primes = np.array(flat, dtype=np.int64)  # [L_E, NC]
        self.offsets = np.array([np.concatenate([[0], np.cumsum(f)[:-1]]) for f in flat], dtype=np.int64)
        self.table_rows = [int(sum(f)) for f in flat]
        self.multipliers = np.array(hash_multipliers(self.layer_ids, max_ngram, compressed_vocab), dtype=np.int64)
        self.token_map = None if token_map is None else np.asarray(token_map, dtype=np.int64)
        if self.token_map is not None and int(self.token_map.max()) + 1 != compressed_vocab:
            raise ValueError(f"token map: {int(self.token_map.max()) + 1} compressed ids, config "
                             f"engram_compressed_vocab_size is {compressed_vocab}")
        self.pad = int(self.compress([pad_id])[0])
        self.history = []  # compressed ids of the last Ng-1 positions

    def compress(self, raw_ids):
        raw = np.asarray(raw_ids, dtype=np.int64)
        if self.token_map is None:
            return raw  # identity map (engine convention, spec 9.1)
        if raw.size and (raw.min() < 0 or raw.max() >= len(self.token_map)):
            raise ValueError(f"token map: raw id outside [0, {len(self.token_map)})")
        return self.token_map[raw]

    def reset(self):
        self.history = []

    def ids_from_compressed(self, comp, start_pos, history):
        """comp: compressed ids (DEAD = -1 allowed) of positions [s, s+T); history: compressed ids
        of positions [s-len(history), s). Returns int64 [T, L_E, NC]."""
        comp = [int(c) for c in comp]
        hist = [int(c) for c in history]
        seq = hist + comp  # seq[k] is position start_pos - len(hist) + k
        base = start_pos - len(hist)
        T = len(comp)
        tokens = np.zeros((T, self.ng), dtype=np.int64)
        for t in range(T):
            p = start_pos + t
            blocked = False
            for shift in range(self.ng):
                q = p - shift
                src = seq[q - base] if q >= 0 else None
                blocked = blocked or p < shift or src == DEAD
                tokens[t, shift] = self.pad if blocked else src
        prods = tokens[:, None, :] * self.multipliers[None, :, :]  # [T, L_E, Ng]; no overflow
        out = np.zeros((T, len(self.layer_ids), (self.ng - 1) * self.hh), dtype=np.int64)
        rolling = prods[..., 0]
        for g in range(self.ng - 1):
            rolling = np.bitwise_xor(rolling, prods[..., g + 1])
            cols = slice(g * self.hh, (g + 1) * self.hh)
            out[..., cols] = rolling[..., None] % self.flat_primes[None, :, cols] + self.offsets[None, :, cols]
        return out

    def step(self, raw_ids, start_pos, dead=None):
        """Hash ids of one chunk and the history update (spec 12.5); positions of `dead` (image
        rows) are DEAD."""
        comp = self.compress(raw_ids)
        if dead is not None and np.any(dead):
            comp = np.where(np.asarray(dead, dtype=bool), DEAD, comp)
        need = min(self.ng - 1, start_pos)
        if len(self.history) < need:
            raise ValueError("engram history shorter than the chunk's start position requires")
        hist = self.history[len(self.history) - need :] if need else []
        ids = self.ids_from_compressed(comp, start_pos, hist)
        self.history = (list(hist) + [int(c) for c in comp])[-(self.ng - 1) :]
        return ids
