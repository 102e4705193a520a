"""HSTU LayerNorm-Multiply-SiLU-Dropout in PyTorch: the semantics, the CPU backend and the
test oracle."""
from __future__ import annotations

import torch

from .philox import dropout_mask


def _segments(concat_u: bool, concat_x: bool) -> tuple[bool, bool, bool]:
    """Which mask bits exist: (l*a, x, a)."""
    return True, concat_x, concat_u


def hstu_lmsd_forward_reference(x, u, weight, bias, *, eps, dropout_ratio, seed, offset,
                                apply_u_silu, concat_u, concat_x, dtype=torch.float64, mask=None):
    """(y, mean, rstd, mask). ``mask`` may be given (an oracle for a kernel's own mask);
    otherwise it is drawn from Philox at (seed, offset) exactly as the kernels draw it."""
    n, d = x.shape
    xf = x.to(dtype)
    mean = xf.mean(dim=1)
    var = (xf.pow(2).mean(dim=1) - mean.pow(2)).clamp_min(0)
    # statistics are FP32 by contract
    mean32 = xf.float().mean(dim=1) if dtype == torch.float32 else mean.float()
    rstd = torch.rsqrt(var + eps)
    xhat = (xf - mean[:, None]) * rstd[:, None]
    lin = xhat * weight.to(dtype) + bias.to(dtype)
    uf = u.to(dtype)
    a = uf * torch.sigmoid(uf) if apply_u_silu else uf
    p = float(torch.tensor(dropout_ratio, dtype=torch.float32))
    if p > 0 and mask is None:
        mask = dropout_mask(n, d, p, int(seed), int(offset), _segments(concat_u, concat_x),
                            device=x.device)
    scale = 1.0 / (1.0 - p)

    def drop(v, bit):
        if p == 0:
            return v
        return torch.where(((mask.to(torch.int64) >> bit) & 1).bool(), v * scale, torch.zeros_like(v))

    parts = []
    if concat_u:
        parts.append(drop(a, 2))
    if concat_x:
        parts.append(drop(xf, 1))
    parts.append(drop(lin * a, 0))
    y = torch.cat(parts, dim=1).to(x.dtype)
    return y, mean32, rstd.float(), (mask if p > 0 else None)


def hstu_lmsd_backward_reference(dy, x, u, weight, bias, mean, rstd, mask, *, dropout_ratio,
                                 apply_u_silu, concat_u, concat_x, compute_dweight=True,
                                 dtype=torch.float64):
    """(dx, du, dweight, dbias); dweight is None when ``compute_dweight`` is False."""
    n, d = x.shape
    p = float(torch.tensor(dropout_ratio, dtype=torch.float32))
    scale = 1.0 / (1.0 - p)
    dyf = dy.to(dtype)
    seg = 0
    dy_u = dy_x = None
    if concat_u:
        dy_u, seg = dyf[:, seg * d:(seg + 1) * d], seg + 1
    if concat_x:
        dy_x, seg = dyf[:, seg * d:(seg + 1) * d], seg + 1
    dy_l = dyf[:, seg * d:(seg + 1) * d]

    def kept(bit):
        if p == 0:
            return torch.ones(n, d, dtype=dtype, device=x.device)
        return ((mask.to(torch.int64) >> bit) & 1).to(dtype) * scale

    xf, uf = x.to(dtype), u.to(dtype)
    xhat = (xf - mean.to(dtype)[:, None]) * rstd.to(dtype)[:, None]
    lin = xhat * weight.to(dtype) + bias.to(dtype)
    if apply_u_silu:
        sig = torch.sigmoid(uf)
        a, a_prime = uf * sig, sig * (1 + uf * (1 - sig))
    else:
        a, a_prime = uf, torch.ones_like(uf)
    g = kept(0) * dy_l
    g_x = kept(1) * dy_x if concat_x else torch.zeros_like(xf)
    g_u = kept(2) * dy_u if concat_u else torch.zeros_like(uf)
    dl = g * a
    wd = dl * weight.to(dtype)
    dx = g_x + rstd.to(dtype)[:, None] * (wd - wd.mean(dim=1, keepdim=True)
                                          - xhat * (xhat * wd).mean(dim=1, keepdim=True))
    du = (g * lin + g_u) * a_prime
    dweight = (dl * xhat).sum(dim=0).to(weight.dtype) if compute_dweight else None
    dbias = dl.sum(dim=0).to(bias.dtype)
    return dx.to(x.dtype), du.to(u.dtype), dweight, dbias
