"""Triton kernel for the mHC projection/RMS backward.

One pass over x: a program owns a block of K columns and a group of row tiles (interleaved over
the groups). Per row tile it writes dx = P @ W + grad_r / (r K) * x and accumulates x^T @ P into
its own FP32 dweight partial; the partials of all groups are then summed in a fixed order by the
shared reduction kernel (no atomics: bitwise reproducible). Row counts are run-time values.

The products run on BF16 tensor cores with FP32 operands split in two (v = hi + lo, both BF16):
x is exact in BF16, P @ W takes hi*hi + hi*lo + lo*hi, and x^T @ P takes x*hi + x*lo, so every
product keeps about 16 mantissa bits, more than TF32's 11. BF16 operands can be read transposed
from shared memory, which lets x feed both products without a transpose through registers.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ...kernel_utils import (allow_dependent_launch, cdiv, CompileCase, CONSTEXPR, launch, mma,
                             use_pdl, wait_for_prior_kernel)
from ...reduction import sum_partials

MAX_GROUPS = 8  # row groups at most: the workspace holds that many dweight partials
# A program's start and end (W loaded and split, the pipeline filled, its dweight partial
# written) cost about as much as this many row tiles: fitted on an H200 (docs/perf/mhc.md, mHC v9)
PROGRAM_OVERHEAD_TILES = 3.6
PARTIAL_EVICTION = "evict_last"  # the partials stay in L2 until the reduction reads them


@dataclass(frozen=True)
class MhcConfig:
    block_t: int
    block_k: int
    num_warps: int
    num_stages: int
    max_registers: int | None = None  # ptxas register cap (None: the compiler's choice)


@lru_cache(maxsize=4096)
def row_groups(k_blocks: int, row_tiles: int, slots: int) -> int:
    """Programs along the rows (the number of dweight partials) with the least estimated time:
    k_blocks * groups programs run ``slots`` at a time, in whole waves (a part-filled last wave
    costs a whole one), each walking row_tiles / groups tiles plus PROGRAM_OVERHEAD_TILES.
    Depends on the row count, a run-time extent: the kernels compile once for every choice."""
    def cost(g: int) -> float:
        return cdiv(k_blocks * g, slots) * (row_tiles / g + PROGRAM_OVERHEAD_TILES)
    return min(range(1, MAX_GROUPS + 1), key=cost)


# The tile swept on an H200 (scripts/sweep_mhc.py; docs/perf/mhc.md has the figures): 64 x 128 tiles,
# 4 warps, 3 stages, 89 KB of shared memory, so 2 programs per SM.
TILE = MhcConfig(block_t=64, block_k=128, num_warps=4, num_stages=3)
PROGRAMS_PER_SM = 2


def n_block(n: int) -> int:
    """Projection columns padded to a power of two of at least 16 (the matrix-unit minimum)."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _split_bf16(v):
    """v (FP32) as hi + lo, both BF16: about 16 mantissa bits together."""
    hi = v.to(tl.bfloat16)
    return hi, (v - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit(do_not_specialize=["n_rows"])
def _mhc_bwd_kernel(X_DESC, DX_DESC, P_DESC, GP, W, GR, R, PARTIAL, n_rows,
                    K: tl.constexpr, N: tl.constexpr, N_PAD: tl.constexpr, N_BLOCK: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                    P_TMA: tl.constexpr, DOT_FP32: tl.constexpr, PDL: tl.constexpr,
                    EVICTION: tl.constexpr):
    # x, dx and (when its row stride allows) grad_proj move through TMA: the hardware computes
    # addresses and bounds (rows past T and columns past N read as zero, and are not written)
    pid_k = tl.program_id(0)
    group = tl.program_id(1)
    k0 = pid_k * BLOCK_K
    cols = k0 + tl.arange(0, BLOCK_K)
    col_mask = cols < K
    ns = tl.arange(0, N_BLOCK)
    n_mask = ns < N
    wait_for_prior_kernel(PDL)
    w = tl.load(W + ns[:, None] * K + cols[None, :], mask=n_mask[:, None] & col_mask[None, :],
                other=0.0)
    w_hi, w_lo = _split_bf16(w)
    # dweight^T of this program's rows: x^T p_hi in the first N_BLOCK columns, x^T p_lo after
    acc = tl.zeros([BLOCK_K, 2 * N_BLOCK], dtype=tl.float32)
    for t0 in tl.range(group * BLOCK_T, n_rows, tl.num_programs(1) * BLOCK_T,
                       num_stages=NUM_STAGES):
        rows = t0 + tl.arange(0, BLOCK_T)
        row_mask = rows < n_rows
        x = X_DESC.load([t0, k0])
        if P_TMA:
            p = P_DESC.load([t0, 0])
        else:
            p = tl.load(GP + rows.to(tl.int64)[:, None] * N_PAD + ns[None, :],
                        mask=row_mask[:, None] & n_mask[None, :], other=0.0)
        p_hi, p_lo = _split_bf16(p)
        gr = tl.load(GR + rows, mask=row_mask, other=0.0)
        r = tl.load(R + rows, mask=row_mask, other=1.0)
        rms_term = gr / (r * K)
        pw = mma(p_hi, w_hi, DOT_FP32) + mma(p_hi, w_lo, DOT_FP32) + mma(p_lo, w_hi, DOT_FP32)
        dx = pw + rms_term[:, None] * x.to(tl.float32)
        DX_DESC.store([t0, k0], dx.to(tl.bfloat16))
        # one product for both halves: x is read from shared memory once, not twice
        p_both = tl.reshape(tl.permute(tl.join(p_hi, p_lo), (0, 2, 1)), [BLOCK_T, 2 * N_BLOCK])
        acc += mma(tl.trans(x), p_both, DOT_FP32)
    allow_dependent_launch(PDL)
    acc_hi, acc_lo = tl.split(tl.permute(tl.reshape(acc, [BLOCK_K, 2, N_BLOCK]), (0, 2, 1)))
    acc = acc_hi + acc_lo
    partial = PARTIAL + group.to(tl.int64) * (N * K)
    tl.store(partial + ns[None, :] * K + cols[:, None], acc,
             mask=n_mask[None, :] & col_mask[:, None], eviction_policy=EVICTION)


def p_through_tma(n_pad: int) -> bool:
    """TMA needs grad_proj's row stride to be a multiple of 16 bytes."""
    return n_pad * 4 % 16 == 0


def launch_backward(cfg: MhcConfig, slots: int, x, weight, grad_proj, grad_r, r, dx, dweight,
                    partial, n_rows: int, groups: int | None = None) -> None:
    """partial: FP32 workspace of MAX_GROUPS * N * K elements (``groups`` * N * K with ``groups``
    given); slots: programs resident at once on the device. groups: None for ``row_groups``'s
    choice."""
    if n_rows == 0:
        dweight.zero_()
        return
    n, k = weight.shape
    k_blocks = cdiv(k, cfg.block_k)
    if groups is None:
        groups = row_groups(k_blocks, cdiv(n_rows, cfg.block_t), slots)
    n_pad, nb = grad_proj.shape[1], n_block(n)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_t, cfg.block_k])
    dx_desc = TensorDescriptor.from_tensor(dx, [cfg.block_t, cfg.block_k])
    p_tma = p_through_tma(n_pad)
    p_desc = (TensorDescriptor(grad_proj, [n_rows, n], [n_pad, 1], [cfg.block_t, nb]) if p_tma
              else x_desc)
    pdl = use_pdl(x)
    launch(_mhc_bwd_kernel, (k_blocks, groups), x_desc, dx_desc, p_desc, grad_proj, weight,
           grad_r, r, partial, n_rows, K=k, N=n, N_PAD=n_pad, N_BLOCK=nb, BLOCK_T=cfg.block_t,
           BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages, P_TMA=p_tma, DOT_FP32=not x.is_cuda,
           PDL=pdl, EVICTION=PARTIAL_EVICTION, launch_pdl=pdl, num_warps=cfg.num_warps,
           maxnreg=cfg.max_registers)
    # the reduction's tile shape follows MAX_GROUPS, not groups: one compile for every choice
    sum_partials(partial, [dweight], groups, PARTIAL_EVICTION, max_parts=max(groups, MAX_GROUPS))


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: the benchmark's K, with the padded
    width of the partials through TMA (24) and not (25)."""
    from ..registry import op
    _, k = op("mhc_projection_backward").cases[0]
    c, bt, bk = CONSTEXPR, TILE.block_t, TILE.block_k
    return [CompileCase(f"mhc bwd n_pad={n_pad}", _mhc_bwd_kernel, dict(
        X_DESC=f"tensordesc<bf16[{bt},{bk}]>", DX_DESC=f"tensordesc<bf16[{bt},{bk}]>",
        P_DESC=f"tensordesc<fp32[{bt},32]>", GP="*fp32", W="*fp32", GR="*fp32", R="*fp32",
        PARTIAL="*fp32", n_rows="i32", K=c, N=c, N_PAD=c, N_BLOCK=c, BLOCK_T=c, BLOCK_K=c,
        NUM_STAGES=c, P_TMA=c, DOT_FP32=c, PDL=c, EVICTION=c),
        dict(K=k, N=24, N_PAD=n_pad, N_BLOCK=32, BLOCK_T=bt, BLOCK_K=bk,
             NUM_STAGES=TILE.num_stages, P_TMA=p_through_tma(n_pad), DOT_FP32=False, PDL=True,
             EVICTION=PARTIAL_EVICTION),
        num_warps=TILE.num_warps, maxnreg=TILE.max_registers) for n_pad in (24, 25)]
