"""Triton kernel for the mHC projection/RMS backward.

One pass over x: a program owns a block of K columns and a group of row tiles (interleaved over
the groups). Per row tile it writes dx = P @ W + grad_r / (r K) * x and accumulates P^T @ x into
its own FP32 dweight partial; the partials of all groups are then summed in a fixed order by the
shared reduction kernel (no atomics: bitwise reproducible). Row counts are run-time values.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from ...reduction import sum_partials


@dataclass(frozen=True)
class MhcConfig:
    block_t: int
    block_k: int
    groups: int       # programs along the rows: the number of dweight partials
    num_warps: int
    num_stages: int


def mhc_config(k: int, sm_count: int) -> MhcConfig:
    """Tiles from scripts/sweep_mhc.py on an H200 (4096 x 20480: 64 x 64 tiles with 4 warps and
    3 stages took 142 us; 64 x 128 with 8 warps 165 us; NOTES.md)."""
    block_k = 64
    k_blocks = triton.cdiv(k, block_k)
    groups = max(1, min(32, triton.cdiv(4 * sm_count, k_blocks)))
    return MhcConfig(block_t=64, block_k=block_k, groups=groups, num_warps=4, num_stages=3)


def n_block(n: int) -> int:
    """Projection columns padded to a power of two of at least 16 (the matrix-unit minimum)."""
    return max(16, triton.next_power_of_2(n))


@triton.jit(do_not_specialize=["n_rows"])
def _mhc_bwd_kernel(X, W, GP, GR, R, DX, PARTIAL, n_rows,
                    K: tl.constexpr, N: tl.constexpr, N_PAD: tl.constexpr, N_BLOCK: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr,
                    NUM_STAGES: tl.constexpr):
    pid_k = tl.program_id(0)
    group = tl.program_id(1)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    col_mask = cols < K
    ns = tl.arange(0, N_BLOCK)
    n_mask = ns < N
    w = tl.load(W + ns[:, None] * K + cols[None, :], mask=n_mask[:, None] & col_mask[None, :],
                other=0.0)
    acc = tl.zeros([N_BLOCK, BLOCK_K], dtype=tl.float32)
    first = group.to(tl.int64) * BLOCK_T  # 64-bit row indices: T * K may pass 2^31
    for t0 in tl.range(first, n_rows, GROUPS * BLOCK_T, num_stages=NUM_STAGES):
        rows = t0 + tl.arange(0, BLOCK_T)
        row_mask = rows < n_rows
        x_off = tl.multiple_of(rows * K, 8)[:, None]
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + x_off + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # columns of grad_proj from N on are ignored (masked to zero)
        p = tl.load(GP + rows[:, None] * N_PAD + ns[None, :],
                    mask=row_mask[:, None] & n_mask[None, :], other=0.0)
        gr = tl.load(GR + rows, mask=row_mask, other=0.0)
        r = tl.load(R + rows, mask=row_mask, other=1.0)
        rms_term = gr / (r * K)
        dx = tl.dot(p, w, input_precision="tf32") + rms_term[:, None] * x
        tl.store(DX + x_off + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        acc = tl.dot(tl.trans(p), x, acc, input_precision="tf32")
    partial = PARTIAL + group.to(tl.int64) * (N * K)
    tl.store(partial + ns[:, None] * K + cols[None, :], acc,
             mask=n_mask[:, None] & col_mask[None, :])


def launch_backward(cfg: MhcConfig, x, weight, grad_proj, grad_r, r, dx, dweight, partial,
                    n_rows: int) -> None:
    """partial: FP32 workspace of cfg.groups * N * K elements."""
    n, k = weight.shape
    grid = (triton.cdiv(k, cfg.block_k), cfg.groups)
    _mhc_bwd_kernel[grid](x, weight, grad_proj, grad_r, r, dx, partial, n_rows, K=k, N=n,
                          N_PAD=grad_proj.shape[1], N_BLOCK=n_block(n), BLOCK_T=cfg.block_t,
                          BLOCK_K=cfg.block_k, GROUPS=cfg.groups, NUM_STAGES=cfg.num_stages,
                          num_warps=cfg.num_warps)
    sum_partials(partial, dweight, cfg.groups)
