"""graphrt.nn.RMSNorm: autograd through the RMSNorm plans. Eager calls go straight to the
functional ops; under torch.compile the same calls go through registered operators (with fake
implementations), so that models using the module trace."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..errors import ContractError
from .dispatch import call
from ..ops.rmsnorm import rmsnorm_backward, rmsnorm_forward
from ..ops.rmsnorm.plan import MAX_HIDDEN, MIN_HIDDEN, WEIGHT_DTYPES
from ..validate import dtype_name, eps_value, size_value


def _rows(t: Tensor) -> Tensor:
    """Autograd may hand us expanded or transposed gradients; the kernels read rows in place."""
    return t if t.stride(-1) == 1 and t.is_contiguous() else t.contiguous()


# The operators torch.compile sees (fake implementations give it shapes without running them).
# They are registered with define/impl rather than torch.library.custom_op, whose safety layers
# cost tens of microseconds per call, and carry no autograd kernel: the autograd.Functions
# below own the derivatives and, outside a compile, call the functional ops directly.
_lib = torch.library.Library("graphrt", "FRAGMENT")
_lib.define("rmsnorm_fwd(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)")
_lib.define("rmsnorm_residual_fwd(Tensor x, Tensor residual, Tensor w, float eps) "
            "-> (Tensor, Tensor, Tensor)")
_lib.define("rmsnorm_bwd(Tensor g, Tensor x, Tensor w, Tensor rstd, Tensor? g_residual) "
            "-> (Tensor, Tensor)")


def _forward(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    y, rstd = rmsnorm_forward(x, w, eps=eps)
    return y, rstd


def _residual_forward(x: Tensor, residual: Tensor, w: Tensor,
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    y, rstd, h_new = rmsnorm_forward(x, w, eps=eps, residual=residual)
    return y, rstd, h_new


def _backward(g: Tensor, x: Tensor, w: Tensor, rstd: Tensor,
              g_residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    dw = None if w.dtype == torch.float32 else w.new_empty(w.shape)  # dw in w's dtype
    dx, dw = rmsnorm_backward(_rows(g), x, w, rstd,
                              g_residual=None if g_residual is None else _rows(g_residual), dw=dw)
    return dx, dw


for _name, _fn in (("rmsnorm_fwd", _forward), ("rmsnorm_residual_fwd", _residual_forward),
                   ("rmsnorm_bwd", _backward)):
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")


@torch.library.register_fake("graphrt::rmsnorm_fwd")
def _(x, w, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("graphrt::rmsnorm_residual_fwd")
def _(x, residual, w, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32), torch.empty_like(x)


@torch.library.register_fake("graphrt::rmsnorm_bwd")
def _(g, x, w, rstd, g_residual):
    return torch.empty_like(x), torch.empty_like(w)


class _RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, rstd = call(_forward, "rmsnorm_fwd", x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, g_y):
        x, w, rstd = ctx.saved_tensors
        dx, dw = call(_backward, "rmsnorm_bwd", g_y, x, w, rstd, None)
        return dx, dw, None


class _RmsNormResidualFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, w, eps):
        y, rstd, h_new = call(_residual_forward, "rmsnorm_residual_fwd", x, residual, w, eps)
        ctx.save_for_backward(h_new, w, rstd)
        return y, h_new

    @staticmethod
    def backward(ctx, g_y, g_h):
        h_new, w, rstd = ctx.saved_tensors
        dh, dw = call(_backward, "rmsnorm_bwd", g_y, h_new, w, rstd, g_h)
        return dh, dh, dw, None


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, residual: Tensor | None = None):
    """Differentiable RMSNorm: ``y``, or ``(y, h_new)`` with a residual (h_new = x + residual)."""
    if residual is None:
        return _RmsNormFunction.apply(x, weight, eps)
    return _RmsNormResidualFunction.apply(x, residual, weight, eps)


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
        self.hidden_size = size_value("hidden_size", hidden_size, multiple=8, low=MIN_HIDDEN,
                                      high=MAX_HIDDEN)
        self.eps = eps_value(eps)
        if dtype not in WEIGHT_DTYPES:
            raise ContractError(f"dtype: the weight is float32 or bfloat16, got {dtype_name(dtype)}")
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: Tensor, residual: Tensor | None = None):
        if x.shape[-1] != self.hidden_size:
            raise ContractError(f"x: expected last dim {self.hidden_size} (the module's "
                                f"hidden_size), got shape {tuple(x.shape)}")
        return rms_norm(x, self.weight, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
