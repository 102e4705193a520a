"""Functional grouped GEMM weight gradients."""
from __future__ import annotations

import torch

from ...errors import ContractError

from ...result import Result
from ...runtime import runtime_for
from ...streams import is_capturing
from ...validate import vector_operand
from .plan import GroupedGemmWgrad, check_offsets_on_host


def grouped_gemm_wgrad(a, b, offsets, *, output_mode: str = "dense", wgrad=None, wgrad_ptrs=None,
                       wgrad_dtype=torch.bfloat16, accumulate_on_output: bool = False,
                       input_order: str = "tensor2d", check_offsets: bool = True,
                       stream=None, runtime=None) -> Result:
    """Weight gradients of all MoE experts in one launch. Returns ``(wgrad,)``: the dense (E,
    hidden, intermediate) output (in discrete mode the stacked buffer the call allocated, or the
    ``wgrad`` given; None when only ``wgrad_ptrs`` were given).

    Eager calls read ``offsets`` on the host (one synchronization) and raise ``ContractError``
    naming the first bad expert before anything is launched; ``check_offsets=False`` skips that
    read. While a CUDA graph is being captured the host cannot look: the kernel treats an expert
    with invalid bounds as empty and flags it for ``graphrt.check_errors()``.

    >>> (wg,) = graphrt.ops.grouped_gemm_wgrad(a, b, offsets)          # doctest: +SKIP
    """
    rt = runtime_for("a", a, runtime)
    if not isinstance(check_offsets, bool):
        raise ContractError(f"check_offsets: expected True or False, got {check_offsets!r}")
    config = {"output_mode": output_mode, "wgrad": wgrad, "wgrad_ptrs": wgrad_ptrs,
              "wgrad_dtype": wgrad_dtype, "accumulate_on_output": accumulate_on_output,
              "input_order": input_order}
    plan = rt.plan(GroupedGemmWgrad, a, b, offsets, **config)   # contract errors come first
    if check_offsets and not is_capturing(a.device):
        vector_operand("offsets", offsets, (torch.int32,), plan.experts, a.device)
        check_offsets_on_host(offsets, a.shape[1])
    return rt.run(GroupedGemmWgrad, (a, b, offsets), config, stream)
