"""mHC hyper-connections (spec 7), MoE (spec 8) and the Engram update (spec 9.5)."""

import numpy as np

from . import numerics as nx
from .attention import rmsnorm

# --- hyper-connections ------------------------------------------------------------------------


def sinkhorn(comb, iters, eps, mode):
    """comb [..., M, M] logits -> row softmax + eps, column normalise, then (iters-1) x (row, column)
    normalisation, all fp32 (spec 7.1 step 4)."""
    rf = mode.rf
    c = rf(np.exp(rf(comb - comb.max(axis=-1, keepdims=True))))
    c = rf(rf(c / rf(c.sum(axis=-1, keepdims=True))) + eps)
    c = rf(c / rf(rf(c.sum(axis=-2, keepdims=True)) + eps))
    for _ in range(iters - 1):
        c = rf(c / rf(rf(c.sum(axis=-1, keepdims=True)) + eps))
        c = rf(c / rf(rf(c.sum(axis=-2, keepdims=True)) + eps))
    return c


def hc_mixes(x, fn, scale, base, cfg, mode):
    """x [T, M, D] -> pre [T, M], post [T, M], comb [T, M, M] (spec 7.1)."""
    rf, M = mode.rf, cfg.hc_mult
    T = x.shape[0]
    xf = x.reshape(T, -1)
    rho = rf(1.0 / np.sqrt(rf(rf(np.mean(xf * xf, axis=-1)) + mode.const(cfg.norm_eps))))
    mix = rf(rf(xf @ fn.T) * rho[:, None])  # project first, then scale
    eps = mode.const(cfg.hc_eps)
    pre = rf(rf(nx.sigmoid(rf(rf(mix[:, :M] * scale[0]) + base[:M]))) + eps)
    post = rf(2.0 * rf(nx.sigmoid(rf(rf(mix[:, M : 2 * M] * scale[1]) + base[M : 2 * M]))))
    comb = rf(rf(mix[:, 2 * M :] * scale[2]) + base[2 * M :]).reshape(T, M, M)
    return pre, post, sinkhorn(comb, cfg.hc_sinkhorn_iters, eps, mode)


def hc_pre(x, pi, mode):
    """bf16( sum_c pi_c x_c ) (spec 7.2). x [T, M, D], pi [T, M]."""
    return mode.ra(np.einsum("tc,tcd->td", pi, x))


def hc_post(y, x, post, comb, mode):
    """out_k = bf16( post_k y + sum_j C_jk x_j ) (spec 7.2): the column of C picks the copy."""
    return mode.ra(post[:, :, None] * y[:, None, :] + np.einsum("tjk,tjd->tkd", comb, x))


# --- MoE --------------------------------------------------------------------------------------


def route(v, lw, cfg, mode, image_mask=None):
    """Router (spec 8.1): returns (expert ids [T, k] in selection order, weights [T, k]). Rows of
    `image_mask` select with bias_vl (docs/vision.md)."""
    rf = mode.rf
    s = rf(rf(v @ lw.gate_w.T) / mode.const(cfg.gate_temp))
    if cfg.score_func == "sqrtsoftplus":
        sc = rf(np.sqrt(rf(nx.softplus(s))))
    elif cfg.score_func == "sigmoid":
        sc = rf(nx.sigmoid(s))
    elif cfg.score_func == "softmax":
        e = rf(np.exp(rf(s - s.max(axis=-1, keepdims=True))))
        sc = rf(e / rf(e.sum(axis=-1, keepdims=True)))
    else:
        raise ValueError(f"{cfg.source}: score_func: unknown {cfg.score_func!r}")
    k = getattr(lw, "topk", cfg.n_activated_experts)  # draft stages have their own
    bias = lw.gate_bias[None, :]
    if image_mask is not None and image_mask.any():
        bias = np.where(image_mask[:, None], lw.gate_bias_vl[None, :], bias)
    ids = nx.stable_topk_desc(rf(sc + bias), k)
    w = np.take_along_axis(sc, ids, axis=-1)
    if cfg.norm_topk_prob and k > 1:
        w = rf(w / rf(rf(w.sum(axis=-1, keepdims=True)) + mode.const(1e-20)))
    return ids, rf(w * mode.const(cfg.route_scale))


def expert(v, w1, w2, w3, weight, cfg, mode):
    """SwiGLU expert (spec 8.2); `weight` [n] multiplies the fp32 activation before w2."""
    rf = mode.rf
    g, u = w1(v, mode), w3(v, mode)
    lim = cfg.swiglu_limit
    if lim > 0:
        u = np.clip(u, -lim, lim)
        g = np.minimum(g, lim)
    a = rf(rf(g * nx.sigmoid(g)) * u)
    if weight is not None:
        a = rf(weight[:, None] * a)
    return w2(mode.ra(a), mode)


def moe(v, lw, cfg, mode, image_mask=None):
    """Routed experts in ascending id order, then the shared expert, fp32 sum, one final rounding."""
    ids, w = route(v, lw, cfg, mode, image_mask)
    y = np.zeros_like(v)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        w1, w2, w3 = lw.experts[e]
        y[tok] = mode.rf(y[tok] + expert(v[tok], w1, w2, w3, w[tok, slot], cfg, mode))
    w1, w2, w3 = lw.shared
    y = mode.rf(y + expert(v, w1, w2, w3, None, cfg, mode))
    return mode.ra(y)


# --- Engram (spec 9.5) ------------------------------------------------------------------------


def engram_update(x, ids, lw, cfg, mode, image_mask=None):
    """x [T, M, D] stream, ids [T, NC] hash ids of this layer -> updated stream. Image rows
    (`image_mask`) have gate 0: they pass through."""
    rf, T, M, D = mode.rf, x.shape[0], cfg.hc_mult, cfg.dim
    eps = mode.const(cfg.norm_eps)
    ev = lw.eng_table.lookup(ids).reshape(T, -1)  # [T, NC*Dm] bf16 rows, n-gram order major
    kv = lw.eng_wkv(ev, mode)  # [T, (M+1)*D]
    key, val = kv[:, : M * D].reshape(T, M, D), kv[:, M * D :]
    omega = rf(lw.eng_q * lw.eng_k)  # [M, D]; only the product matters
    r = rf(rf(1.0 / np.sqrt(rf(rf(np.mean(x * x, axis=-1)) + eps)))
           * rf(1.0 / np.sqrt(rf(rf(np.mean(key * key, axis=-1)) + eps))))
    dot = rf(rf(rf(np.sum(x * omega[None] * key, axis=-1)) * r) * mode.const(D**-0.5))
    mag = np.sqrt(np.maximum(np.abs(dot), mode.const(1e-6)))
    gate = rf(nx.sigmoid(np.copysign(rf(mag), dot)))  # sign of +-0 kept
    if image_mask is not None:
        gate = np.where(image_mask[:, None], 0.0, gate)
    return mode.ra(x + gate[..., None] * val[:, None, :])


def final_hidden(x, pi, norm_w, cfg, mode):
    return rmsnorm(hc_pre(x, pi, mode), norm_w, mode, mode.const(cfg.norm_eps))
