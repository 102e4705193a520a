"""RMSNorm train forward/backward in PyTorch: the semantics, the CPU backend and the test oracle."""
from __future__ import annotations

import torch


def rmsnorm_forward_reference(x: torch.Tensor, w: torch.Tensor, eps: float,
                              residual: torch.Tensor | None = None):
    """(y, rstd, h_new): h_new = x + residual rounded to x's dtype (None without a residual),
    rstd = 1/sqrt(mean(h^2) + eps) in FP32, y = h * rstd * w in x's dtype."""
    h_new = None
    if residual is not None:
        h_new = (x.double() + residual.double()).to(x.dtype)
        x = h_new
    xd = x.double()
    rstd = torch.rsqrt(xd.pow(2).mean(dim=-1) + eps)
    y = (xd * rstd.unsqueeze(-1) * w.double()).to(x.dtype)
    return y, rstd.float(), h_new


def rmsnorm_backward_reference(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                               rstd: torch.Tensor, g_residual: torch.Tensor | None = None):
    """(dx, dw): xhat = x * rstd; dx = rstd * (w*g - xhat * mean(w*g*xhat)) (+ g_residual) in x's
    dtype; dw = sum over rows of g * xhat in FP32."""
    h = x.shape[-1]
    xd = x.double().reshape(-1, h)
    gd = g.double().reshape(-1, h)
    r = rstd.double().reshape(-1, 1)
    xhat = xd * r
    wg = gd * w.double()
    dx = r * (wg - xhat * (wg * xhat).mean(dim=-1, keepdim=True))
    if g_residual is not None:
        dx = dx + g_residual.double().reshape(-1, h)
    dw = (gd * xhat).sum(dim=0)
    return dx.to(x.dtype).reshape(x.shape), dw.float()
