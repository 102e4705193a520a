"""RMSNorm train forward and backward, declared: arguments, key, outputs, functional calls."""
from __future__ import annotations

import torch

from ...contract import row_spec, vector_spec
from ...opspec import OpSpec, Option, Output, Tensor, like
from ...validate import eps_value, require_tensor
from .plan import RmsNormBackward, RmsNormForward, backward_programs_for

FP32 = torch.float32

FORWARD = OpSpec(
    "rmsnorm_forward", RmsNormForward,
    (Tensor("x", row_spec), Tensor("w", vector_spec)),
    (Option("eps", 1e-6, lambda name, v: eps_value(v), "float"),
     Option("residual", None, row_spec, "Tensor?")),
    (Output("y", **like("x")),
     Output("rstd", lambda v: v["x"].shape[:-1], FP32),
     Output("h_new", **like("x"), when=lambda v: v["residual"] is not None)),
    doc="""RMSNorm train forward. Returns ``(y, rstd)``, or ``(y, rstd, h_new)`` with a residual.

    x: BF16 [..., H]; w: BF16 or FP32 [H]; rstd: FP32, one value per row. With ``residual``,
    h_new = x + residual (BF16) is what gets normalized.

    >>> x = torch.randn(4, 1024, dtype=torch.bfloat16)
    >>> w = torch.ones(1024)
    >>> y, rstd = graphrt.ops.rmsnorm_forward(x, w)
    >>> y.shape, rstd.shape
    (torch.Size([4, 1024]), torch.Size([4]))
    """)


def _backward_flags(facts, v) -> tuple:
    """dw's dtype, and the programs whose FP32 partials are summed in a fixed order."""
    device, backend = facts[0], facts[1]
    x = v["x"]
    hidden = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    programs = backward_programs_for(device, hidden) if backend == "triton" and hidden else 0
    dw = v["dw"]
    return (("dw_dtype", FP32 if dw is None else require_tensor("dw", dw).dtype),
            ("programs", programs))


BACKWARD = OpSpec(
    "rmsnorm_backward", RmsNormBackward,
    (Tensor("g", row_spec), Tensor("x", row_spec), Tensor("w", vector_spec), Tensor("rstd")),
    (Option("g_residual", None, row_spec, "Tensor?"),),
    (Output("dx", **like("x")), Output("dw", lambda v: v["w"].shape, FP32)),
    extra_flags=_backward_flags,
    doc="""RMSNorm train backward. Returns ``(dx, dw)``; dw is FP32 and bitwise reproducible.

    >>> y, rstd = graphrt.ops.rmsnorm_forward(x, w)
    >>> dx, dw = graphrt.ops.rmsnorm_backward(torch.randn_like(y), x, w, rstd)
    """)

rmsnorm_forward = FORWARD.functional
rmsnorm_backward = BACKWARD.functional
