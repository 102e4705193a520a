"""Functional grouped GEMM weight gradients."""
from __future__ import annotations

import torch

from ...result import Result
from ...runtime import runtime as default_runtime
from ...validate import require_tensor
from .plan import GroupedGemmWgrad


def grouped_gemm_wgrad(a, b, offsets, *, output_mode: str = "dense", wgrad=None, wgrad_ptrs=None,
                       wgrad_dtype=torch.bfloat16, accumulate_on_output: bool = False,
                       input_order: str = "tensor2d", stream=None, runtime=None) -> Result:
    """Weight gradients of all MoE experts in one launch. Returns ``(wgrad,)``: the dense (E,
    hidden, intermediate) output (in discrete mode the stacked buffer the call allocated, or the
    ``wgrad`` given; None when only ``wgrad_ptrs`` were given).

    >>> (wg,) = graphrt.ops.grouped_gemm_wgrad(a, b, offsets)          # doctest: +SKIP
    """
    rt = runtime or default_runtime(require_tensor("a", a).device)
    config = {"output_mode": output_mode, "wgrad": wgrad, "wgrad_ptrs": wgrad_ptrs,
              "wgrad_dtype": wgrad_dtype, "accumulate_on_output": accumulate_on_output,
              "input_order": input_order}
    return rt.run(GroupedGemmWgrad, (a, b, offsets), config, stream)
