"""mHC projection/RMS backward in PyTorch: the semantics, the CPU backend and the test oracle."""
from __future__ import annotations

import torch


def mhc_projection_backward_reference(x: torch.Tensor, weight: torch.Tensor,
                                      grad_proj: torch.Tensor, grad_r: torch.Tensor,
                                      r: torch.Tensor, dtype: torch.dtype = torch.float64):
    """(dx, dweight) with P = grad_proj[:, :N]: dx = P @ W + grad_r / (r * K) * x (x's dtype),
    dweight = P^T @ x (FP32). Computed in ``dtype`` (FP64 for the test oracle)."""
    n, k = weight.shape
    p = grad_proj[:, :n].to(dtype)
    xd = x.to(dtype)
    dx = p @ weight.to(dtype) + grad_r.to(dtype) / (r.to(dtype) * k) * xd
    dweight = p.t() @ xd
    return dx.to(x.dtype), dweight.float()


def mhc_projection_forward_reference(x: torch.Tensor, weight: torch.Tensor, n_pad: int):
    """(proj, r): proj = x @ W^T in FP32 padded with zero columns to ``n_pad``; r = RMS of x."""
    n = weight.shape[0]
    proj = torch.zeros(x.shape[0], n_pad, dtype=torch.float32, device=x.device)
    proj[:, :n] = x.float() @ weight.float().t()
    r = x.float().pow(2).mean(dim=-1, keepdim=True).sqrt()
    return proj, r
