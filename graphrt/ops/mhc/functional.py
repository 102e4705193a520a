"""Functional mHC projection/RMS backward: plan from the runtime's store, scratch from its arena."""
from __future__ import annotations

from ...result import Result
from ...runtime import runtime_for
from .plan import MhcProjectionBackward


def mhc_projection_backward(x, weight, grad_proj, grad_r, r, *, allow_tf32: bool = False,
                            dx=None, dweight=None, stream=None, runtime=None) -> Result:
    """mHC projection/RMS backward. Returns ``(dx, dweight)``.

    dx = P @ W + grad_r / (r * K) * x (BF16) and dweight = P^T @ x (FP32, bitwise reproducible),
    with P = grad_proj[:, :N]; TF32 matrix products, so ``allow_tf32=True`` is required.

    >>> dx, dw = graphrt.ops.mhc_projection_backward(x, w, grad_proj, grad_r, r,
    ...                                              allow_tf32=True)     # doctest: +SKIP
    """
    rt = runtime_for("x", x, runtime)
    return rt.run(MhcProjectionBackward, (x, weight, grad_proj, grad_r, r),
                  {"allow_tf32": allow_tf32, "dx": dx, "dweight": dweight}, stream)
