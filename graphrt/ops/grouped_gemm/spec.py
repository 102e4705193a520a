"""Grouped GEMM weight gradients of MoE experts, declared: arguments, key, outputs, functional
call."""
from __future__ import annotations

import torch

from ...errors import ContractError
from ...opspec import OpSpec, Option, Output, Tensor
from ...streams import is_capturing
from ...validate import flag_value, require_tensor, vector_operand
from .plan import GroupedGemmWgrad, check_offsets_on_host, offsets_spec, operand_spec, scale_spec


def _as_given(name, value):
    return value


def _output_dtype(facts, v) -> tuple:
    """The output's dtype: the given wgrad's, else wgrad_dtype."""
    wgrad = v["wgrad"]
    return (("wgrad_dtype", wgrad.dtype if isinstance(wgrad, torch.Tensor) else v["wgrad_dtype"]),)


def _shape(v) -> tuple:
    return (v["offsets"].shape[0], v["a"].shape[0], v["b"].shape[1])


def _stacked(v) -> torch.Tensor:
    if v["accumulate_on_output"]:
        raise ContractError("accumulate_on_output: needs an existing output; pass wgrad or "
                            "wgrad_ptrs")
    return v["a"].new_empty(_shape(v), dtype=v["wgrad_dtype"])


def _pointers(v) -> torch.Tensor:
    """Each expert's address in the stacked output, built on the device, on this stream."""
    out = v["wgrad"]
    step = out[0].numel() * out.element_size() if out.shape[0] else 0
    return (torch.arange(out.shape[0], dtype=torch.int64, device=out.device) * step
            + out.data_ptr())


def _check_offsets(rt, args, config, own) -> None:
    """Eager calls read the offsets on the host (one synchronization) and name the first bad
    expert before anything is launched. Without the check the call goes straight on (its plan
    lookup, or its bound call, checks the contract)."""
    check = own["check_offsets"]
    if not isinstance(check, bool):
        raise ContractError(f"check_offsets: expected True or False, got {check!r}")
    if not check:
        return
    a, b, offsets = args
    plan = rt.plan(GroupedGemmWgrad, a, b, offsets, **config)   # contract errors come first
    if not is_capturing(a.device):
        vector_operand("offsets", require_tensor("offsets", offsets), (torch.int32,),
                       plan.experts, a.device)
        check_offsets_on_host(offsets, a.shape[1])


WGRAD = OpSpec(
    "grouped_gemm_wgrad", GroupedGemmWgrad,
    (Tensor("a", lambda name, t: operand_spec(name, t, 1)),
     Tensor("b", lambda name, t: operand_spec(name, t, 0)), Tensor("offsets", offsets_spec)),
    (Option("output_mode", "dense", _as_given),
     Option("wgrad_dtype", torch.bfloat16, schema="ScalarType?"),
     Option("accumulate_on_output", False, flag_value, flag="accumulate"),
     Option("input_order", "tensor2d", _as_given, "str"),
     Option("check_offsets", True, to_plan=False),
     Option("a_scale", None, scale_spec(1), "Tensor?"),
     Option("b_scale", None, scale_spec(0), "Tensor?")),
    (Output("wgrad", when=lambda v: v["wgrad_ptrs"] is None, make=_stacked),
     Output("wgrad_ptrs", when=lambda v: v["output_mode"] == "discrete" and v["wgrad"] is None,
            make=_pointers, returned=False, computed=True)),
    extra_flags=_output_dtype, before_run=_check_offsets,
    before_run_idle=lambda check_offsets: check_offsets is False, returns="first",
    doc="""Weight gradients of all MoE experts in one launch. Returns ``(wgrad,)``: the dense (E,
    hidden, intermediate) output (in discrete mode the stacked buffer the call allocated, or the
    ``wgrad`` given; None when only ``wgrad_ptrs`` were given).

    FP8 inputs: float8_e4m3fn codes ``a`` (hidden, T) and ``b`` (T, intermediate), both
    tokens-major, with ``a_scale`` (hidden, blocks) and ``b_scale`` (blocks, intermediate): uint8
    E8M0 scales per 32 tokens (MXFP8) or float32 scales per 128 tokens (1x128 blocks), counted
    from token 0. MXFP8 values are exact in BF16 and are multiplied on BF16 tensor cores with
    FP32 sums; on Hopper the call first writes them into scratch it allocates (twice as large
    as ``a`` and ``b``; from the graph's pool under capture), which costs 10-42% over BF16
    inputs at the benchmark shapes. A 1x128 block's products are summed by the FP8 tensor
    cores, which on Hopper keep about 14 bits (relative error about 1e-4 against exact sums),
    then scaled and added in FP32; on Hopper that runs at 1.08-1.14x BF16's FLOP rate.

    ``input_order="tensor_ragged"``: the experts whose token count is not a multiple of 8 are
    first copied into scratch the call allocates (about as large as ``a`` and ``b``; from the
    graph's pool under capture), so that the product reads 16 bytes at a time. On Hopper that
    copy makes such calls 1.25-1.6x slower than counts in multiples of 8 at the benchmark
    shapes: route in multiples of 8 where the model allows it.

    Eager calls read ``offsets`` on the host (one synchronization) and raise ``ContractError``
    naming the first bad expert before anything is launched; ``check_offsets=False`` skips that
    read. While a CUDA graph is being captured the host cannot look: the kernel treats an expert
    with invalid bounds as empty and flags it for ``graphrt.check_errors()``.

    >>> (wg,) = graphrt.ops.grouped_gemm_wgrad(a, b, offsets)          # doctest: +SKIP
    >>> (wg,) = graphrt.ops.grouped_gemm_wgrad(a8, b8, offsets, a_scale=sa, b_scale=sb)  # doctest: +SKIP
    """)

grouped_gemm_wgrad = WGRAD.functional
