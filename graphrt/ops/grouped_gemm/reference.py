"""Grouped GEMM weight gradients for MoE experts in PyTorch: the semantics and the test oracle."""
from __future__ import annotations

import torch

from ...block_scaling import dequantize_blocks
from ...device_checks import OFFSETS_DECREASING, OFFSETS_LAST_NOT_TOTAL, OFFSETS_OUT_OF_RANGE

# tokens per scale of FP8 inputs, by the scales' dtype: E8M0 bytes per 32 (MXFP8), FP32 per 128
# (DeepSeek-V3's 1x128 blocks)
SCALE_BLOCKS = {torch.uint8: 32, torch.float32: 128}


def dequantize_tokens(codes: torch.Tensor, scales: torch.Tensor, tokens_dim: int) -> torch.Tensor:
    """FP32 values of FP8 ``codes``: each times the scale of its block of
    ``SCALE_BLOCKS[scales.dtype]`` tokens along ``tokens_dim``, blocks counted from token 0."""
    return dequantize_blocks(codes, scales, tokens_dim, SCALE_BLOCKS[scales.dtype])


def host_ends(offsets: torch.Tensor) -> list[int]:
    """The cumulative ends, read on the host (a synchronization)."""
    return [int(v) for v in offsets.cpu().tolist()]


def offset_problems(ends: list[int], tokens_sum: int) -> list[tuple[int, int]]:
    """[(expert, problem bit)] for every expert whose cumulative end is out of order, out of
    [0, tokens_sum], or (the last) not tokens_sum."""
    found = []
    for e, end in enumerate(ends):
        begin = ends[e - 1] if e else 0
        if end < begin:
            found.append((e, OFFSETS_DECREASING))
        if min(begin, end) < 0 or end > tokens_sum:
            found.append((e, OFFSETS_OUT_OF_RANGE))
    if ends and ends[-1] != tokens_sum:
        found.append((len(ends) - 1, OFFSETS_LAST_NOT_TOTAL))
    return found


def expert_bounds(offsets: torch.Tensor, tokens_sum: int) -> list[tuple[int, int]]:
    """[(begin, end)] per expert from cumulative ends (reads the offsets on the host). An expert
    whose bounds are out of order or outside [0, tokens_sum] is empty, (0, 0), as in the kernel."""
    ends = host_ends(offsets)
    empty = {e for e, bit in offset_problems(ends, tokens_sum) if bit != OFFSETS_LAST_NOT_TOTAL}
    return [(0, 0) if e in empty else (ends[e - 1] if e else 0, end) for e, end in enumerate(ends)]


def _in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """The elements of a dense 2-D tensor (row-major or its transpose) as they lie in memory."""
    return (t if t.is_contiguous() else t.t()).reshape(-1)


def expert_slices(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, input_order: str):
    """Per expert: (A_e [hidden, n_e], B_e [n_e, intermediate]) as views of a (hidden,
    tokens_sum) and b (tokens_sum, intermediate). With ``tensor_ragged`` the buffers hold one
    compact block per expert, tokens the unit-stride axis: A_e (hidden, n_e) with strides (n_e, 1)
    at element hidden * begin, B_e (n_e, intermediate) with strides (1, n_e) at intermediate * begin."""
    hidden, inter = a.shape[0], b.shape[1]
    out = []
    for begin, end in expert_bounds(offsets, a.shape[1]):
        n = end - begin
        if input_order == "tensor2d":
            out.append((a[:, begin:end], b[begin:end, :]))
            continue
        flat_a, flat_b = _in_memory_order(a), _in_memory_order(b)
        a_block = flat_a[hidden * begin:hidden * end].view(hidden, n)
        b_block = flat_b[inter * begin:inter * end].view(inter, n).t()
        out.append((a_block, b_block))
    return out


def grouped_gemm_wgrad_reference(a, b, offsets, *, input_order="tensor2d",
                                 out_dtype=torch.bfloat16, accumulate_into=None, a_scale=None,
                                 b_scale=None):
    """Stacked (E, hidden, intermediate): Wgrad[e] = A[:, begin:end] @ B[begin:end, :] in FP32
    (plus ``accumulate_into`` when given), cast to ``out_dtype``. Experts with invalid bounds
    count as empty (see ``expert_bounds``). FP8 ``a`` and ``b`` are dequantized with their
    scales first (``dequantize_tokens``)."""
    if a_scale is not None:
        a, b = dequantize_tokens(a, a_scale, 1), dequantize_tokens(b, b_scale, 0)
    if offsets.numel() == 0:
        return torch.empty(0, a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    results = []
    for e, (a_e, b_e) in enumerate(expert_slices(a, b, offsets, input_order)):
        w = a_e.float() @ b_e.float()
        if accumulate_into is not None:
            w = w + accumulate_into[e].float()
        results.append(w.to(out_dtype))
    return torch.stack(results)
