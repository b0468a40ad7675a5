"""Attention half of a block for one chunk of positions [s, s+T) (spec 5, 6, 10.2, 12).

Inputs/outputs are float64 arrays holding values rounded by the mode (numerics.Mode)."""

import numpy as np

from . import numerics as nx

ATTN_BLOCK = 64  # online-softmax block of the sparse-attention kernel (spec 5.6)


def rmsnorm(x, w, mode, eps):
    """y = w * (x * rsqrt(mean(x^2) + eps)) (spec 3.2); stats over the last axis."""
    var = mode.rf(np.mean(x * x, axis=-1, keepdims=True))
    r = mode.rf(1.0 / np.sqrt(mode.rf(var + eps)))
    return mode.ra(w * mode.rf(x * r))


# --- compressor (spec 5.3, 12.3) ----------------------------------------------------------------


def compress(lw, cfg, mode, state, layer, u, s):
    """New pre-RoPE latents for the groups completed by this chunk, and their first row index.
    Updates the fp32 carry of ratio > 1 sources."""
    r, T = cfg.compress_ratios[layer], u.shape[0]
    eps = mode.const(cfg.norm_eps)
    first, end = s // r, (s + T) // r
    if r == 1:
        return rmsnorm(lw.cmp_wkv(u, mode), lw.cmp_norm, mode, eps), first
    k, g = lw.cmp_wkv(u, mode), lw.cmp_wgate(u, mode)  # fp32 [T, Dh]
    ck, cg = state.carry[layer]  # positions [first*r, s) in position order
    k_all, g_all = np.concatenate([ck, k]), np.concatenate([cg, g])  # positions from first*r
    n_new = end - first
    lat = np.zeros((n_new, cfg.head_dim))
    if n_new:
        kk = k_all[: n_new * r].reshape(n_new, r, -1)
        gg = g_all[: n_new * r].reshape(n_new, r, -1)
        e = mode.rf(np.exp(mode.rf(gg - gg.max(axis=1, keepdims=True))))
        alpha = mode.rf(e / mode.rf(e.sum(axis=1, keepdims=True)))  # softmax per channel
        pooled = mode.rf(np.sum(kk * alpha, axis=1))
        lat = rmsnorm(mode.ra(pooled), lw.cmp_norm, mode, eps)  # bf16 cast before the norm
    state.carry[layer] = (k_all[n_new * r :], g_all[n_new * r :])
    return lat, first


def index_keys(lw, cfg, mode, rope, lat, first, r):
    """Index keys of new latents (spec 6.1): from the pre-RoPE latent, RoPE at j*r, fp4 Variant I."""
    kappa = rmsnorm(lw.idx_wk(lat, mode), lw.idx_k_norm, mode, mode.const(cfg.norm_eps))
    pos = (first + np.arange(lat.shape[0])) * r
    kappa = mode.ra(rope.apply(kappa, pos))
    return nx.fp4_quant_i(kappa, mode)


def publish_latents(cfg, mode, rope, lat, first, r):
    """Compressed-KV rows of new latents (spec 5.4): RoPE at j*r, then fp4 Variant C."""
    pos = (first + np.arange(lat.shape[0])) * r
    return nx.fp4_quant_c(mode.ra(rope.apply(lat, pos)), mode)


# --- indexer (spec 6.2-6.6) ---------------------------------------------------------------------


def candidate_mask(scores, visible, n_blocks_keep, block):
    """Rows of the kept candidate blocks (spec 6.5). scores [T, N] (-inf where invisible),
    visible [T] = number of visible rows per query. Returns bool [T, N]."""
    T, N = scores.shape
    nb = -(-N // block)
    padded = np.full((T, nb * block), -np.inf)
    padded[:, :N] = scores
    bs = padded.reshape(T, nb, block).max(axis=-1)
    last = (visible - 1) // block  # -1 when nothing is visible: no block is forced
    rows = np.arange(T)
    has = last >= 0
    bs[rows[has], last[has]] = np.inf
    top = nx.stable_topk_desc(bs, min(n_blocks_keep, nb))
    keep = np.zeros((T, nb), dtype=bool)
    keep[rows[:, None], top] = np.take_along_axis(bs, top, axis=-1) > -np.inf
    return np.repeat(keep, block, axis=1)[:, :N]


def topk_list(scores, visible, k_max):
    """The top-k list (spec 6.6): min(K, N) best rows (ties -> lowest row), ascending, rows that
    are not visible replaced by -1. Returns int32 [T, min(K, N)]."""
    T, N = scores.shape
    n = min(k_max, N)
    sel = np.sort(nx.stable_topk_desc(scores, n), axis=-1)
    # rows are ascending, so the invisible ones (the largest) are already at the end
    return np.where(sel < visible[:, None], sel, -1).astype(np.int32)


def index_scores(qi, w, keys, mode):
    """score_t = bf16( sum_h bf16( relu(bf16(qi_h . k_t)) * w_h ) ) (spec 6.3). qi [T, Hi, Di],
    w [T, Hi], keys [N, Di] -> [T, N]."""
    dots = mode.ra(np.einsum("thd,nd->thn", qi, keys))
    prod = mode.ra(np.maximum(dots, 0.0) * w[:, :, None])
    return mode.ra(prod.sum(axis=1))


# --- sparse attention with sink (spec 5.6) ------------------------------------------------------


def sparse_attention_row(q, keys, sink, tau, mode):
    """One query, all heads: q [H, Dh], keys [n, Dh] (key = value, in list order), sink [H].

    bf16 mode evaluates it as the kernel does: online softmax over blocks of 64 with fp32 results
    after each block step and probabilities rounded to bf16 before the value product.
    fp32 / fp64 modes (DeepInfer's own modes) evaluate the formula of spec 5.6 exactly: fp32
    scores, then softmax with the sink and the weighted sum in float64, rounded once. That makes
    the result independent of how the key list is split (e.g. across context-parallel ranks)."""
    rf = mode.rf
    H, Dh = q.shape
    z = rf(rf(q @ keys.T) * tau)  # [H, n]
    if mode.name != "bf16":
        m = np.maximum(z.max(axis=1) if z.shape[1] else -np.inf, sink)
        e = np.exp(z - m[:, None])
        l = e.sum(axis=1) + np.exp(sink - m)
        return mode.ra((e @ keys) / l[:, None])
    m = np.full(H, rf(-1e30))
    l = np.zeros(H)
    acc = np.zeros((H, Dh))
    for b0 in range(0, keys.shape[0], ATTN_BLOCK):
        zb, kb = z[:, b0 : b0 + ATTN_BLOCK], keys[b0 : b0 + ATTN_BLOCK]
        m_new = np.maximum(m, zb.max(axis=1))
        beta = rf(np.exp(rf(m - m_new)))
        p = rf(np.exp(rf(zb - m_new[:, None])))
        l = rf(rf(l * beta) + rf(p.sum(axis=1)))
        acc = rf(rf(acc * beta[:, None]) + rf(mode.ra(p) @ kb))
        m = m_new
    l = rf(l + rf(np.exp(rf(sink - m))))
    return mode.ra(acc / l[:, None])


# --- the attention half, in the order of spec 10.2 / 12.6 ---------------------------------------


def attention_half(m, layer, u, call):
    """u: normed attention input [T, D]. Returns the attention output [T, D] after wo_b."""
    cfg, mode, st = m.cfg, m.mode, m.state
    lw, rope = m.layers[layer], m.rope[layer]
    s, T, pos = call.start, call.n, call.positions
    H, Dh, W, r = cfg.n_heads, cfg.head_dim, cfg.window_size, cfg.compress_ratios[layer]
    eps = mode.const(cfg.norm_eps)
    tag = f"L{layer}.attn"

    # query and window KV (spec 5.1, 5.2)
    qr = rmsnorm(lw.wq_a(u, mode), lw.q_norm, mode, eps)
    q = mode.ra(rope.apply(lw.wq_b(qr, mode).reshape(T, H, Dh), pos))
    kv = rmsnorm(lw.wkv(u, mode), lw.kv_norm, mode, eps)
    kv = nx.act_quant(mode.ra(rope.apply(kv, pos)), mode)
    call.dump(f"{tag}.q", q)
    call.dump(f"{tag}.kv", kv)

    lists, ckv = None, None
    if r > 0:
        lat = None
        if cfg.is_kv_source(layer):
            lat, first = compress(lw, cfg, mode, st, layer, u, s)
            if cfg.owns_index_keys(layer):
                keys = index_keys(lw, cfg, mode, rope, lat, first, r)
                st.idxk[layer] = np.concatenate([st.idxk[layer], keys])
                call.dump(f"{tag}.idxk", keys)
                if len(keys):
                    st.key_pointer = layer
        if cfg.is_index_source(layer):
            lists = run_indexer(m, layer, u, qr, call)
            call.topk[layer] = lists
            call.dump(f"{tag}.topk", lists)
        else:
            lists = call.topk[cfg.idx_src[layer]]
        if lat is not None:
            rows = publish_latents(cfg, mode, rope, lat, first, r)
            st.ckv[layer] = np.concatenate([st.ckv[layer], rows])
            call.dump(f"{tag}.cmp", rows)
        ckv = st.ckv[cfg.kv_src[layer]]

    # window keys: ring positions [max(0, s-W+1), s) then the chunk's rows (spec 12.2)
    base = max(0, s - W + 1)
    ring_pos = np.arange(base, s)
    win = np.concatenate([st.ring[layer][ring_pos % W], kv])
    tau = mode.const(Dh**-0.5)
    o = np.zeros((T, H, Dh))
    for t in range(T):
        p = s + t
        keys = win[max(0, p - W + 1) - base : p - base + 1]
        if lists is not None and lists.shape[1]:
            sel = lists[t][lists[t] >= 0]
            keys = np.concatenate([keys, ckv[sel]])
        o[t] = sparse_attention_row(q[t], keys, lw.attn_sink, tau, mode)
    call.dump(f"{tag}.o", o)

    # ring update only after every query of the chunk has read it
    keep = min(T, W)
    st.ring[layer][pos[T - keep :] % W] = kv[T - keep :]

    # output projection (spec 5.7)
    o = mode.ra(rope.apply(o, pos, inverse=True))
    G = cfg.o_groups
    wo_a = lw.wo_a.w.reshape(G, cfg.o_lora_rank, -1)
    a = mode.ra(np.einsum("tgd,grd->tgr", o.reshape(T, G, -1), wo_a)).reshape(T, -1)
    out = lw.wo_b(a, mode)
    call.dump(f"{tag}.out", out)
    return out


def run_indexer(m, layer, u, qr, call):
    """Scores, visibility, candidate blocks and the top-k list of an index source (spec 6)."""
    cfg, mode, st = m.cfg, m.mode, m.state
    lw, rope = m.layers[layer], m.rope[layer]
    s, T, pos = call.start, call.n, call.positions
    r, Hi, Di = cfg.compress_ratios[layer], cfg.index_n_heads, cfg.index_head_dim
    n_rows = (s + T) // r
    visible = (pos + 1) // r
    if n_rows == 0:  # spec 6.7: empty list, indexer skipped
        return np.zeros((T, 0), dtype=np.int32)

    qi = mode.ra(rope.apply(lw.idx_wq_b(qr, mode).reshape(T, Hi, Di), pos))
    qi = nx.fp4_quant_i(qi, mode)
    w = mode.ra(lw.idx_weights_proj(u, mode) * mode.const(Di**-0.5 * Hi**-0.5))

    owner = cfg.key_owner[layer]
    if m.demo_decode_defect and call.is_decode and st.key_pointer is not None:
        owner = st.key_pointer  # spec 6.8: the stale shared pointer of the public decode path
    keys = st.idxk[owner][:n_rows]
    if keys.shape[0] < n_rows:  # the reference's zero-initialised cache beyond the written rows
        keys = np.concatenate([keys, np.zeros((n_rows - keys.shape[0], Di))])

    scores = index_scores(qi, w, keys, mode)
    scores = np.where(np.arange(n_rows)[None, :] < visible[:, None], scores, -np.inf)
    if cfg.candidates_on and layer == cfg.candidate_source_layer:
        call.candidates = candidate_mask(scores, visible, cfg.candidate_topk_blocks, cfg.candidate_block_size)
    elif cfg.is_candidate_consumer(layer):
        scores = np.where(call.candidates, scores, -np.inf)
    return topk_list(scores, visible, cfg.index_topk)
