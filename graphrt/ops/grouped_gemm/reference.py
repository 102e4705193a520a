"""Grouped GEMM weight gradients for MoE experts in PyTorch: the semantics and the test oracle."""
from __future__ import annotations

import torch


def expert_bounds(offsets: torch.Tensor) -> list[tuple[int, int]]:
    """[(begin, end)] per expert from cumulative ends (reads the offsets on the host)."""
    ends = [int(v) for v in offsets.cpu().tolist()]
    begins = [0] + ends[:-1]
    return list(zip(begins, ends))


def expert_slices(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, input_order: str):
    """Per expert: (A_e [hidden, n_e], B_e [n_e, intermediate]) as views of a (hidden,
    tokens_sum) and b (tokens_sum, intermediate). With ``tensor_ragged`` the buffers hold one
    compact block per expert, tokens the unit-stride axis: A_e (hidden, n_e) with strides (n_e, 1)
    at element hidden * begin, B_e (n_e, intermediate) with strides (1, n_e) at intermediate * begin."""
    hidden, inter = a.shape[0], b.shape[1]
    out = []
    for begin, end in expert_bounds(offsets):
        n = end - begin
        if input_order == "tensor2d":
            out.append((a[:, begin:end], b[begin:end, :]))
            continue
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        a_block = flat_a[hidden * begin:hidden * end].view(hidden, n)
        b_block = flat_b[inter * begin:inter * end].view(inter, n).t()
        out.append((a_block, b_block))
    return out


def grouped_gemm_wgrad_reference(a, b, offsets, *, input_order="tensor2d",
                                 out_dtype=torch.bfloat16, accumulate_into=None):
    """Stacked (E, hidden, intermediate): Wgrad[e] = A[:, begin:end] @ B[begin:end, :] in FP32
    (plus ``accumulate_into`` when given), cast to ``out_dtype``."""
    results = []
    for e, (a_e, b_e) in enumerate(expert_slices(a, b, offsets, input_order)):
        w = a_e.float() @ b_e.float()
        if accumulate_into is not None:
            w = w + accumulate_into[e].float()
        results.append(w.to(out_dtype))
    return torch.stack(results)
