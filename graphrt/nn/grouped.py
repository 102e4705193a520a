"""graphrt.nn.GroupedLinear: MoE expert weights applied to tokens sorted by expert."""
from __future__ import annotations

import torch

from ..ops.grouped_gemm import grouped_gemm_wgrad
from ..ops.grouped_gemm.reference import expert_bounds
from ..streams import StreamTracker, fork


def _grouped_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """out[tokens of e] = x[tokens of e] @ w[e] for x [T, k], w [E, k, n] (torch._grouped_mm on
    a GPU; a per-expert loop elsewhere, which reads the offsets on the host)."""
    if x.is_cuda and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, w, offs=offsets)
    out = x.new_empty(x.shape[0], w.shape[2])
    for e, (begin, end) in enumerate(expert_bounds(offsets)):
        out[begin:end] = (x[begin:end].float() @ w[e].float()).to(x.dtype)
    return out


def _weight_grad(dy, x, offsets, dtype):
    # Wgrad[e] = dy_e^T x_e: A = dy^T (out, T) is M-major, B = x (T, in) is N-major
    return grouped_gemm_wgrad(dy.t(), x, offsets, wgrad_dtype=dtype)[0]


class _GroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, offsets, wgrad_on_side_stream):
        ctx.save_for_backward(x, weight, offsets)
        ctx.side = wgrad_on_side_stream and x.is_cuda
        return _grouped_matmul(x, weight.transpose(1, 2), offsets)

    @staticmethod
    def backward(ctx, dy):
        x, weight, offsets = ctx.saved_tensors
        dy = dy.contiguous()
        want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (ctx.side and want_dw):
            dx = _grouped_matmul(dy, weight, offsets) if want_dx else None
            dweight = _weight_grad(dy, x, offsets, weight.dtype) if want_dw else None
            return dx, dweight, None, None
        # the weight gradient runs on a side stream while the input gradient runs here; inside a
        # CUDA-graph capture the two become parallel branches
        main = torch.cuda.current_stream()
        with fork() as branch:
            dweight = _weight_grad(dy, x, offsets, weight.dtype)
        dx = _grouped_matmul(dy, weight, offsets) if want_dx else None
        branch.join()
        for t in (dy, x, offsets):
            StreamTracker.keep_alive(t, branch.side)
        StreamTracker.keep_alive(dweight, main)
        return dx, dweight, None, None


class GroupedLinear(torch.nn.Module):
    """Expert weights [E, out, in]; ``forward(x, offsets)`` maps tokens sorted by expert
    (x [T, in] BF16, offsets int32 [E] cumulative ends) to [T, out]. The weight gradient is
    graphrt's grouped wgrad kernel; forward and input gradient use torch._grouped_mm. With
    ``wgrad_on_side_stream`` the weight gradient overlaps the input gradient on a side stream.

    >>> experts = graphrt.nn.GroupedLinear(8, 7168, 2048).cuda()        # doctest: +SKIP
    >>> y = experts(x_sorted, offsets)                                   # doctest: +SKIP
    """

    def __init__(self, experts: int, in_features: int, out_features: int, *, device=None,
                 dtype: torch.dtype = torch.bfloat16, wgrad_on_side_stream: bool = False):
        super().__init__()
        self.wgrad_on_side_stream = wgrad_on_side_stream
        self.weight = torch.nn.Parameter(
            torch.randn(experts, out_features, in_features, device=device, dtype=dtype)
            / in_features ** 0.5)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return _GroupedLinearFunction.apply(x, self.weight, offsets, self.wgrad_on_side_stream)

    def extra_repr(self) -> str:
        e, o, i = self.weight.shape
        return f"experts={e}, in_features={i}, out_features={o}"
