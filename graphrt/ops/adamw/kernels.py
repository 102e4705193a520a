"""Triton kernel for the AdamW step: one launch per tensor, each program a block of elements,
everything in FP32 registers between one read and one write of p, m and v (14 bytes an element
for BF16 tensors, the floor of the update). The bias corrections come from the device-side step
count, so a captured step stays right as the count grows."""
from __future__ import annotations

import math

import triton
import triton.language as tl

from ...kernel_utils import CONSTEXPR, CompileCase, cdiv, launch

BLOCK = 4096
WARPS = 8


# n stays specialized: its divisibility by 16 is what lets the masked loads and stores be 16-byte
# vectors (without it, 2-byte scalar accesses ran at about a quarter of the bandwidth)
@triton.jit(do_not_specialize=["lr", "beta1", "beta2", "eps", "weight_decay", "log2_beta1",
                               "log2_beta2"])
def _adamw_kernel(P, G, M, V, STEP, LR, n, lr, beta1, beta2, eps, weight_decay, log2_beta1,
                  log2_beta2, LR_ON_DEVICE: tl.constexpr, MAXIMIZE: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
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


def launch_adamw(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1: float, beta2: float,
                 eps: float, weight_decay: float, maximize: bool) -> None:
    """One launch per tensor on the current stream; ``lr`` a float or a one-element tensor."""
    on_device = not isinstance(lr, float)
    lr_value = 0.0 if on_device else lr
    log2_beta1 = math.log2(beta1) if beta1 > 0 else -math.inf
    log2_beta2 = math.log2(beta2) if beta2 > 0 else -math.inf
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        n = p.numel()
        if n == 0:
            continue
        launch(_adamw_kernel, (cdiv(n, BLOCK),), p, g, m, v, step, lr if on_device else step,
               n, lr_value, beta1, beta2, eps, weight_decay, log2_beta1, log2_beta2,
               LR_ON_DEVICE=on_device, MAXIMIZE=maximize, BLOCK=BLOCK, num_warps=WARPS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: BF16 parameters and gradients with FP32
    moments, the learning rate as a float and on the device."""
    c = CONSTEXPR
    return [CompileCase(f"adamw lr_on_device={on_device}", _adamw_kernel, dict(
        P="*bf16", G="*bf16", M="*fp32", V="*fp32", STEP="*fp32", LR="*fp32", n="i32",
        lr="fp32", beta1="fp32", beta2="fp32", eps="fp32", weight_decay="fp32",
        log2_beta1="fp32", log2_beta2="fp32", LR_ON_DEVICE=c, MAXIMIZE=c, BLOCK=c),
        dict(LR_ON_DEVICE=on_device, MAXIMIZE=False, BLOCK=BLOCK), num_warps=WARPS,
        divisible=("n",)) for on_device in (False, True)]
