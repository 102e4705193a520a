"""graphrt.nn.RMSNorm: autograd through the RMSNorm plans, registered as torch.library custom ops
(with fake implementations) so that models using it trace under torch.compile."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..ops.rmsnorm import rmsnorm_backward, rmsnorm_forward


def _rows(t: Tensor) -> Tensor:
    """Autograd may hand us expanded or transposed gradients; the kernels read rows in place."""
    return t if t.stride(-1) == 1 and t.is_contiguous() else t.contiguous()


@torch.library.custom_op("graphrt::rmsnorm_fwd", mutates_args=())
def _rmsnorm_fwd(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    y, rstd = rmsnorm_forward(x, w, eps=eps)
    return y, rstd


@_rmsnorm_fwd.register_fake
def _(x, w, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("graphrt::rmsnorm_residual_fwd", mutates_args=())
def _rmsnorm_residual_fwd(x: Tensor, residual: Tensor, w: Tensor,
                          eps: float) -> tuple[Tensor, Tensor, Tensor]:
    y, rstd, h_new = rmsnorm_forward(x, w, eps=eps, residual=residual)
    return y, rstd, h_new


@_rmsnorm_residual_fwd.register_fake
def _(x, residual, w, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32), torch.empty_like(x)


@torch.library.custom_op("graphrt::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd(g: Tensor, x: Tensor, w: Tensor, rstd: Tensor,
                 g_residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    dw = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    dx, dw = rmsnorm_backward(_rows(g), x, w, rstd,
                              g_residual=None if g_residual is None else _rows(g_residual), dw=dw)
    return dx, dw


@_rmsnorm_bwd.register_fake
def _(g, x, w, rstd, g_residual):
    return torch.empty_like(x), torch.empty_like(w)


def _save_fwd(ctx, inputs, output):
    x, w, _ = inputs
    ctx.save_for_backward(x, w, output[1])


def _bwd(ctx, g_y, g_rstd):
    x, w, rstd = ctx.saved_tensors
    dx, dw = _rmsnorm_bwd(g_y, x, w, rstd, None)
    return dx, dw, None


def _save_residual_fwd(ctx, inputs, output):
    _, _, w, _ = inputs
    ctx.save_for_backward(output[2], w, output[1])


def _residual_bwd(ctx, g_y, g_rstd, g_h):
    h_new, w, rstd = ctx.saved_tensors
    dh, dw = _rmsnorm_bwd(g_y, h_new, w, rstd, g_h)
    return dh, dh, dw, None


_rmsnorm_fwd.register_autograd(_bwd, setup_context=_save_fwd)
_rmsnorm_residual_fwd.register_autograd(_residual_bwd, setup_context=_save_residual_fwd)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, residual: Tensor | None = None):
    """Differentiable RMSNorm: ``y``, or ``(y, h_new)`` with a residual (h_new = x + residual)."""
    if residual is None:
        return _rmsnorm_fwd(x, weight, eps)[0]
    y, _, h_new = _rmsnorm_residual_fwd(x, residual, weight, eps)
    return y, h_new


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dim with a learned weight; BF16 activations, FP32 or BF16 weight.

    >>> norm = graphrt.nn.RMSNorm(4096).cuda()                        # doctest: +SKIP
    >>> y = norm(x)                       # x: BF16 [..., 4096]        # doctest: +SKIP
    >>> y, h = norm(x, residual)          # fused add: h = x + residual  # doctest: +SKIP
    >>> y.sum().backward()                # dx and a deterministic dw   # doctest: +SKIP
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, device=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: Tensor, residual: Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
