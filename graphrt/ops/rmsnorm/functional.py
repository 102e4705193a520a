"""Functional RMSNorm calls: plan from the runtime's store, scratch from its arena."""
from __future__ import annotations

from ...result import Result
from ...runtime import runtime_for
from .plan import RmsNormBackward, RmsNormForward


def rmsnorm_forward(x, w, *, eps: float = 1e-6, residual=None, y=None, rstd=None, h_new=None,
                    stream=None, runtime=None) -> Result:
    """RMSNorm train forward. Returns ``(y, rstd)``, or ``(y, rstd, h_new)`` with a residual.

    x: BF16 [..., H]; w: BF16 or FP32 [H]; rstd: FP32, one value per row. With ``residual``,
    h_new = x + residual (BF16) is what gets normalized.

    >>> x = torch.randn(4, 1024, dtype=torch.bfloat16)
    >>> w = torch.ones(1024)
    >>> y, rstd = graphrt.ops.rmsnorm_forward(x, w)
    >>> y.shape, rstd.shape
    (torch.Size([4, 1024]), torch.Size([4]))
    """
    rt = runtime_for("x", x, runtime)
    return rt.run(RmsNormForward, (x, w),
                  {"eps": eps, "residual": residual, "y": y, "rstd": rstd, "h_new": h_new}, stream)


def rmsnorm_backward(g, x, w, rstd, *, g_residual=None, dx=None, dw=None, stream=None,
                     runtime=None) -> Result:
    """RMSNorm train backward. Returns ``(dx, dw)``; dw is FP32 and bitwise reproducible.

    >>> y, rstd = graphrt.ops.rmsnorm_forward(x, w)
    >>> dx, dw = graphrt.ops.rmsnorm_backward(torch.randn_like(y), x, w, rstd)
    """
    rt = runtime_for("x", x, runtime)
    return rt.run(RmsNormBackward, (g, x, w, rstd),
                  {"g_residual": g_residual, "dx": dx, "dw": dw}, stream)
