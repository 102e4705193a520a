"""mHC projection/RMS backward, declared: arguments, key, outputs, functional call."""
from __future__ import annotations

import torch

from ...contract import compact_rows_spec, compact_spec
from ...opspec import OpSpec, Option, Output, Tensor, like
from ...validate import flag_value, sm_count
from .plan import MhcProjectionBackward


def _slots(facts, v) -> tuple:
    """The resident programs pick the row groups, which fix the order of the dweight
    reduction: part of the key."""
    slots = 0
    if facts[1] == "triton":
        from .kernels import PROGRAMS_PER_SM
        slots = PROGRAMS_PER_SM * sm_count(facts[0])
    return (("slots", slots),)


BACKWARD = OpSpec(
    "mhc_projection_backward", MhcProjectionBackward,
    (Tensor("x", compact_rows_spec), Tensor("weight", compact_spec),
     Tensor("grad_proj", compact_rows_spec), Tensor("grad_r", compact_rows_spec),
     Tensor("r", compact_rows_spec)),
    (Option("allow_tf32", False, flag_value, "bool"),),
    (Output("dx", **like("x", torch.bfloat16)),
     Output("dweight", lambda v: v["weight"].shape, torch.float32)),
    extra_flags=_slots,
    doc="""mHC projection/RMS backward. Returns ``(dx, dweight)``.

    dx = P @ W + grad_r / (r * K) * x (BF16) and dweight = P^T @ x (FP32, bitwise reproducible),
    with P = grad_proj[:, :N]; TF32 matrix products, so ``allow_tf32=True`` is required.

    >>> dx, dw = graphrt.ops.mhc_projection_backward(x, w, grad_proj, grad_r, r,
    ...                                              allow_tf32=True)     # doctest: +SKIP
    """)

mhc_projection_backward = BACKWARD.functional
