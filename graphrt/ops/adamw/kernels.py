"""Triton kernels for the AdamW step: one launch for many tensors of a dtype (or one per tensor),
each program a block of elements, everything in FP32 registers between one read and one write
of p, m and v (14 bytes an element for BF16 tensors, the floor of the update). The bias
corrections come from the device-side step count, so a captured step stays right as the count
grows."""
from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from ...kernel_utils import CONSTEXPR, CompileCase, PreparedLaunch, TL_DTYPES, cdiv, launch
from ...streams import current_stream

BLOCK = 4096
WARPS = 8


@triton.jit
def _update(P, G, M, V, STEP, LR, offs, mask, lr, beta1, beta2, eps, weight_decay, log2_beta1,
            log2_beta2, LR_ON_DEVICE: tl.constexpr, MAXIMIZE: tl.constexpr):
    """The AdamW update of elements ``offs`` of one tensor, in FP32 registers."""
    step = tl.load(STEP).to(tl.float32)
    if LR_ON_DEVICE:
        lr = tl.load(LR).to(tl.float32)
    p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    if MAXIMIZE:
        g = -g
    p = p * (1.0 - lr * weight_decay)
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    bias1 = 1.0 - tl.exp2(step * log2_beta1)
    bias2_sqrt = tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
    p = p - (lr / bias1) * m / (tl.sqrt(v) / bias2_sqrt + eps)
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)


# n stays specialized: its divisibility by 16 is what lets the masked loads and stores be 16-byte
# vectors (without it, 2-byte scalar accesses ran at about a quarter of the bandwidth)
@triton.jit(do_not_specialize=["lr", "beta1", "beta2", "eps", "weight_decay", "log2_beta1",
                               "log2_beta2"])
def _adamw_kernel(P, G, M, V, STEP, LR, n, lr, beta1, beta2, eps, weight_decay, log2_beta1,
                  log2_beta2, LR_ON_DEVICE: tl.constexpr, MAXIMIZE: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _update(P, G, M, V, STEP, LR, offs, offs < n, lr, beta1, beta2, eps, weight_decay,
            log2_beta1, log2_beta2, LR_ON_DEVICE, MAXIMIZE)


@triton.jit(do_not_specialize=["tensors", "lr", "beta1", "beta2", "eps", "weight_decay",
                               "log2_beta1", "log2_beta2"])
def _adamw_many_kernel(ADDRESSES, BLOCK_ENDS, SIZES, tensors, LR, lr, beta1, beta2, eps,
                       weight_decay, log2_beta1, log2_beta2, DTYPE: tl.constexpr,
                       LR_ON_DEVICE: tl.constexpr, MAXIMIZE: tl.constexpr, BLOCK: tl.constexpr):
    """Many tensors of one dtype in one launch: ADDRESSES holds the p, g, m, v and step addresses
    of each tensor (five rows of ``tensors``), BLOCK_ENDS its cumulative block counts, SIZES its
    element counts. Every address is 16-byte aligned and every size a multiple of 8, so the
    accesses stay 16-byte vectors."""
    program = tl.program_id(0)
    lo = 0
    hi = tensors - 1
    while lo < hi:   # the first tensor whose blocks end after this program
        mid = (lo + hi) // 2
        after = tl.load(BLOCK_ENDS + mid) > program
        hi = tl.where(after, mid, hi)
        lo = tl.where(after, lo, mid + 1)
    first = tl.load(BLOCK_ENDS + lo - 1, mask=lo > 0, other=0)
    n = tl.multiple_of(tl.load(SIZES + lo), 8)
    row = ADDRESSES + lo
    P = tl.multiple_of(tl.load(row).to(tl.pointer_type(DTYPE)), 16)
    G = tl.multiple_of(tl.load(row + tensors).to(tl.pointer_type(DTYPE)), 16)
    M = tl.multiple_of(tl.load(row + 2 * tensors).to(tl.pointer_type(DTYPE)), 16)
    V = tl.multiple_of(tl.load(row + 3 * tensors).to(tl.pointer_type(DTYPE)), 16)
    STEP = tl.load(row + 4 * tensors).to(tl.pointer_type(tl.float32))
    offs = (program - first).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _update(P, G, M, V, STEP, LR, offs, offs < n, lr, beta1, beta2, eps, weight_decay,
            log2_beta1, log2_beta2, LR_ON_DEVICE, MAXIMIZE)


def _hyper_arguments(lr, beta1: float, beta2: float, eps: float, weight_decay: float) -> tuple:
    """(the kernels' float arguments from ``lr`` on, whether lr is a device tensor)."""
    on_device = not isinstance(lr, float)
    log2_beta1 = math.log2(beta1) if beta1 > 0 else -math.inf
    log2_beta2 = math.log2(beta2) if beta2 > 0 else -math.inf
    return (0.0 if on_device else lr, beta1, beta2, eps, weight_decay, log2_beta1,
            log2_beta2), on_device


def launch_adamw(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1: float, beta2: float,
                 eps: float, weight_decay: float, maximize: bool) -> None:
    """One launch per tensor on the current stream; ``lr`` a float or a one-element tensor."""
    floats, on_device = _hyper_arguments(lr, beta1, beta2, eps, weight_decay)
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        n = p.numel()
        if n == 0:
            continue
        launch(_adamw_kernel, (cdiv(n, BLOCK),), p, g, m, v, step, lr if on_device else step,
               n, *floats, LR_ON_DEVICE=on_device, MAXIMIZE=maximize, BLOCK=BLOCK,
               num_warps=WARPS)


def fits_one_launch(p, g, m, v) -> bool:
    """Whether a parameter can share the many-tensor launch: 16-byte aligned addresses and a
    size that is a multiple of 8 elements (16-byte vectors throughout)."""
    return (p.numel() % 8 == 0 and p.numel() > 0 and not (p.data_ptr() | g.data_ptr()
                                                          | m.data_ptr() | v.data_ptr()) & 15)


class ManyTensorTable:
    """The device tables of one many-tensor launch: the parameters (all of ``dtype``) listed by
    their p, g, m, v and step addresses, cumulative block counts and sizes. The host copies
    stay referenced until the table is dropped (the upload is asynchronous)."""

    __slots__ = ("dtype", "tensors", "blocks", "addresses", "block_ends", "sizes", "_host",
                 "_stream", "_uploaded")

    def __init__(self, rows: list, device: torch.device):
        self.dtype = rows[0][0].dtype
        self.tensors = len(rows)
        sizes = [row[0].numel() for row in rows]
        ends = list(itertools.accumulate(cdiv(n, BLOCK) for n in sizes))
        self.blocks = ends[-1]
        host = (torch.tensor([[t.data_ptr() for t in column] for column in zip(*rows)],
                             dtype=torch.int64),
                torch.tensor(ends, dtype=torch.int32), torch.tensor(sizes, dtype=torch.int64))
        if device.type == "cuda":
            host = tuple(t.pin_memory() for t in host)
        self.addresses, self.block_ends, self.sizes = (t.to(device, non_blocking=True)
                                                       for t in host)
        self._host = host
        self._stream = self._uploaded = None
        if device.type == "cuda":
            self._stream = current_stream(device)
            self._uploaded = torch.cuda.Event()
            self._uploaded.record(self._stream)

    def keep_for_current_stream(self) -> None:
        """On a stream other than the one the tables were made on: waits there for their upload
        and makes them outlive their use there (the caching allocator only orders frees on the
        stream that made them)."""
        if self._stream is None:   # the CPU (Triton's interpreter)
            return
        current = current_stream(self.addresses.device)
        if current != self._stream:
            current.wait_event(self._uploaded)
            for t in (self.addresses, self.block_ends, self.sizes):
                t.record_stream(current)


def _many_arguments(table: ManyTensorTable, lr, beta1: float, beta2: float, eps: float,
                    weight_decay: float, maximize: bool) -> tuple[tuple, dict]:
    """The many-tensor kernel's positional arguments (the float lr at ``_FLOAT_LR``) and its
    launch keywords, for ``table``."""
    floats, on_device = _hyper_arguments(lr, beta1, beta2, eps, weight_decay)
    return ((table.addresses, table.block_ends, table.sizes, table.tensors,
             lr if on_device else table.sizes, *floats),
            dict(DTYPE=TL_DTYPES[table.dtype], LR_ON_DEVICE=on_device, MAXIMIZE=maximize,
                 BLOCK=BLOCK, num_warps=WARPS))


_FLOAT_LR = 5   # the position of the float lr among ``_many_arguments``'s


def launch_adamw_many(table: ManyTensorTable, *, lr, beta1: float, beta2: float, eps: float,
                      weight_decay: float, maximize: bool) -> None:
    """One launch for every parameter of ``table`` on the current stream."""
    args, keywords = _many_arguments(table, lr, beta1, beta2, eps, weight_decay, maximize)
    launch(_adamw_many_kernel, (table.blocks,), *args, **keywords)


def adamw_many_launcher(table: ManyTensorTable, *, lr_tensor, beta1: float, beta2: float,
                        eps: float, weight_decay: float, maximize: bool):
    """``launch_adamw_many`` of ``table`` with everything fixed but a float lr: a function of
    lr (ignored where ``lr_tensor`` is the device tensor the kernel reads it from)."""
    args, keywords = _many_arguments(table, 0.0 if lr_tensor is None else lr_tensor, beta1,
                                     beta2, eps, weight_decay, maximize)
    prepared = PreparedLaunch(_adamw_many_kernel, (table.blocks,), keywords)
    if lr_tensor is not None:
        return lambda lr: prepared(*args)
    head, rest = args[:_FLOAT_LR], args[_FLOAT_LR + 1:]
    return lambda lr: prepared(*head, lr, *rest)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: BF16 parameters and gradients with FP32
    moments, the learning rate as a float and on the device; the many-tensor launch on BF16."""
    c = CONSTEXPR
    hyper = dict(lr="fp32", beta1="fp32", beta2="fp32", eps="fp32", weight_decay="fp32",
                 log2_beta1="fp32", log2_beta2="fp32")
    cases = [CompileCase(f"adamw lr_on_device={on_device}", _adamw_kernel, dict(
        P="*bf16", G="*bf16", M="*fp32", V="*fp32", STEP="*fp32", LR="*fp32", n="i32", **hyper,
        LR_ON_DEVICE=c, MAXIMIZE=c, BLOCK=c),
        dict(LR_ON_DEVICE=on_device, MAXIMIZE=False, BLOCK=BLOCK), num_warps=WARPS,
        divisible=("n",)) for on_device in (False, True)]
    cases.append(CompileCase("adamw many tensors", _adamw_many_kernel, dict(
        ADDRESSES="*i64", BLOCK_ENDS="*i32", SIZES="*i64", tensors="i32", LR="*fp32", **hyper,
        DTYPE=c, LR_ON_DEVICE=c, MAXIMIZE=c, BLOCK=c),
        dict(DTYPE=tl.bfloat16, LR_ON_DEVICE=True, MAXIMIZE=False, BLOCK=BLOCK),
        num_warps=WARPS))
    return cases
