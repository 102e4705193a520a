"""graphrt.nn.MhcProjection: the projection/RMS stage of mHC with graphrt's fused backward."""
from __future__ import annotations

import torch

from ..errors import ContractError
from ..ops.mhc import mhc_projection_backward, mhc_projection_forward_reference
from ..validate import dtype_name, require_tensor, size_value
from .dispatch import call


def _backward(x, weight, grad_proj, grad_r, r, allow_tf32):
    return mhc_projection_backward(x, weight, grad_proj, grad_r, r, allow_tf32=allow_tf32)


class _MhcProjectionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, n_pad):
        proj, r = mhc_projection_forward_reference(x, weight, n_pad)
        ctx.save_for_backward(x, weight, r)
        return proj, r

    @staticmethod
    def backward(ctx, grad_proj, grad_r):
        x, weight, r = ctx.saved_tensors
        if grad_proj is None:
            grad_proj = torch.zeros(x.shape[0], weight.shape[0], device=x.device)
        if grad_r is None:
            grad_r = torch.zeros_like(r)
        dx, dweight = call(_backward, "mhc_projection_backward", x, weight,
                           grad_proj.contiguous(), grad_r.contiguous(), r, True)
        return dx, dweight, None


class MhcProjection(torch.nn.Module):
    """proj = x @ W^T (FP32, zero-padded to ``n_pad`` columns) and r = RMS of x over K, for
    x BF16 [T, K]; the backward is graphrt's fused mHC projection/RMS backward (products at least as
    precise as TF32).

    >>> stage = graphrt.nn.MhcProjection(4 * 5120, 24, n_pad=32).cuda()    # doctest: +SKIP
    >>> proj, r = stage(x)
    """

    def __init__(self, k: int, n: int, n_pad: int | None = None, *, device=None):
        super().__init__()
        k, n = size_value("k", k), size_value("n", n)
        n_pad = n if n_pad is None else size_value("n_pad", n_pad)
        self.k, self.n, self.n_pad = k, n, n_pad
        if self.n_pad < n:
            raise ContractError(f"n_pad: expected at least n={n}, got {n_pad}")
        self.weight = torch.nn.Parameter(torch.randn(n, k, device=device) / k ** 0.5)

    def forward(self, x: torch.Tensor):
        x = require_tensor("x", x)
        if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != self.k:
            raise ContractError(f"x: expected a bfloat16 [T, {self.k}] tensor, got "
                                f"{dtype_name(x.dtype)} {tuple(x.shape)}")
        if x.device != self.weight.device:
            raise ContractError(f"x: expected device {self.weight.device}, got {x.device}")
        return _MhcProjectionFunction.apply(x, self.weight, self.n_pad)

    def extra_repr(self) -> str:
        return f"k={self.k}, n={self.n}, n_pad={self.n_pad}"
