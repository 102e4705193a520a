"""graphrt.nn.GroupedLinear: MoE expert weights applied to tokens sorted by expert."""
from __future__ import annotations

import torch

from ..errors import ContractError
from ..ops.grouped_gemm import grouped_gemm_wgrad
from ..ops.grouped_gemm.plan import check_offsets_on_host
from ..ops.grouped_gemm.reference import expert_bounds
from ..streams import StreamTracker, fork, is_capturing
from ..validate import dtype_name, require_tensor, size_value, vector_operand
from .dispatch import call


def _grouped_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """out[tokens of e] = x[tokens of e] @ w[e] for x [T, k], w [E, k, n] (torch._grouped_mm on
    a GPU and under torch.compile; eagerly elsewhere a per-expert loop, which reads the offsets
    on the host)."""
    if (x.is_cuda or torch.compiler.is_compiling()) and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, w, offs=offsets)
    out = x.new_empty(x.shape[0], w.shape[2])
    for e, (begin, end) in enumerate(expert_bounds(offsets, x.shape[0])):
        out[begin:end] = (x[begin:end].float() @ w[e].float()).to(x.dtype)
    return out


def _wgrad(a, b, offsets, dtype, input_order):
    # the offsets were checked in forward
    return grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=dtype, input_order=input_order,
                              check_offsets=False)[0]


def _weight_grad(dy, x, offsets, dtype):
    # Wgrad[e] = dy_e^T x_e: A = dy^T (out, T) is M-major, B = x (T, in) is N-major
    return call(_wgrad, "grouped_gemm_wgrad", dy.t(), x, offsets, dtype, "tensor2d")


class _GroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, offsets, wgrad_on_side_stream):
        ctx.save_for_backward(x, weight, offsets)
        # side streams are eager-only: under torch.compile the two gradients stay in one graph
        ctx.side = wgrad_on_side_stream and x.is_cuda and not torch.compiler.is_compiling()
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

    Eager forward calls read the offsets on the host (one synchronization) and raise
    ``ContractError`` naming the first bad expert (out of order, outside [0, T], or a last end
    that is not T, which would leave rows of y unwritten); ``check_offsets=False`` skips the read.
    Under CUDA-graph capture and torch.compile the wgrad kernel flags bad offsets for
    ``graphrt.check_errors()`` instead.

    >>> experts = graphrt.nn.GroupedLinear(8, 7168, 2048).cuda()        # doctest: +SKIP
    >>> y = experts(x_sorted, offsets)                                   # doctest: +SKIP
    """

    def __init__(self, experts: int, in_features: int, out_features: int, *, device=None,
                 dtype: torch.dtype = torch.bfloat16, wgrad_on_side_stream: bool = False,
                 check_offsets: bool = True):
        super().__init__()
        for name, v in (("experts", experts), ("in_features", in_features),
                        ("out_features", out_features)):
            size_value(name, v)
        if dtype != torch.bfloat16:
            raise ContractError(f"dtype: the grouped kernels take bfloat16, got {dtype_name(dtype)}")
        self.wgrad_on_side_stream = bool(wgrad_on_side_stream)
        self.check_offsets = bool(check_offsets)
        self.weight = torch.nn.Parameter(
            torch.randn(experts, out_features, in_features, device=device, dtype=dtype)
            / in_features ** 0.5)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        experts, out_f, in_f = self.weight.shape
        x = require_tensor("x", x)
        if x.dim() != 2 or x.shape[1] != in_f or x.dtype != self.weight.dtype:
            raise ContractError(f"x: expected (T, {in_f}) {dtype_name(self.weight.dtype)}, got "
                                f"{tuple(x.shape)} {dtype_name(x.dtype)}")
        if x.device != self.weight.device:
            raise ContractError(f"x: expected device {self.weight.device}, got {x.device}")
        if torch.compiler.is_compiling():   # no host reads in a traced graph: the wgrad kernel
            # still flags bad offsets for graphrt.check_errors()
            return _GroupedLinearFunction.apply(x, self.weight, offsets, self.wgrad_on_side_stream)
        vector_operand("offsets", offsets, (torch.int32,), experts, x.device)
        if self.check_offsets and not is_capturing(x.device):
            check_offsets_on_host(offsets, x.shape[0])
        return _GroupedLinearFunction.apply(x, self.weight, offsets, self.wgrad_on_side_stream)

    def extra_repr(self) -> str:
        e, o, i = self.weight.shape
        return f"experts={e}, in_features={i}, out_features={o}"
