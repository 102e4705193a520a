"""Triton kernels for HSTU LayerNorm-Multiply-SiLU-Dropout, forward and backward.

Rows are run-time extents and row strides run-time values (multiples of 8 elements, hinted so
loads stay 16 bytes wide); offsets are 64-bit. Dropout is counter-addressed Philox: each pair of
adjacent columns makes one call at counter (pair index, offset) under the 64-bit seed and takes
six 16-bit draws from it (philox.dropout_mask has the layout), so masks do not depend on the
launch shape.
The backward's programs each own rows interleaved over the grid and one row of FP32 dweight and
dbias partials; the shared reduction sums them in a fixed order.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import triton
import triton.language as tl

from ...kernel_utils import (allow_dependent_launch, persistent_grid, row_offsets, use_pdl,
                             wait_for_prior_kernel)
from ...reduction import sum_partials


@dataclass(frozen=True)
class HstuConfig:
    block_d: int
    block_rows: int
    num_warps: int
    programs_per_sm: int = 2
    num_stages: int = 2


def forward_config(d: int) -> HstuConfig:
    block_d = triton.next_power_of_2(d)
    rows = max(1, 2048 // block_d)
    return HstuConfig(block_d, rows, max(8, min(16, block_d * rows // 256)), programs_per_sm=4,
                      num_stages=3)


def backward_config(d: int) -> HstuConfig:
    block_d = triton.next_power_of_2(d)
    rows = max(1, 2048 // block_d)
    return HstuConfig(block_d, rows, max(4, min(16, block_d * rows // 512)), num_stages=3)


@lru_cache(maxsize=None)
def backward_programs(d: int, sm_count: int) -> int:
    """Programs of the backward grid, each owning one row of dweight/dbias partials: a plan-time
    fact, since the order of the reduction depends on it (cached: read on every plan lookup)."""
    return sm_count * backward_config(d).programs_per_sm


@triton.jit
def _seed_and_offset(SEED, OFFSET, seed_lo, seed_hi, off_lo, off_hi, FROM_TENSORS: tl.constexpr):
    if FROM_TENSORS:
        seed = tl.load(SEED)
        offset = tl.load(OFFSET)
    else:
        seed = (seed_hi.to(tl.int64) << 32) | (seed_lo.to(tl.int64) & 0xFFFFFFFF)
        offset = (off_hi.to(tl.int64) << 32) | (off_lo.to(tl.int64) & 0xFFFFFFFF)
    return seed, offset


@triton.jit
def _drop(v, bits, BIT: tl.constexpr, SCALE: tl.constexpr, DROPOUT: tl.constexpr):
    if DROPOUT:
        return tl.where(((bits >> BIT) & 1) != 0, v * SCALE, 0.0)
    return v


@triton.jit
def _philox4x32_10(c0, c1, c2, c3, seed):
    """Philox4x32-10 (the same words as tl.philox): each round's two 32 x 32 products are one
    widening multiply apiece (hi and lo from one instruction, not two)."""
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(10):
        prod_b = c2.to(tl.uint64) * 0xCD9E8D57
        prod_a = c0.to(tl.uint64) * 0xD2511F53
        c0 = (prod_b >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (prod_a >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = prod_b.to(tl.uint32)
        c3 = prod_a.to(tl.uint32)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _keep_bits(seed, offset, rows, BLOCK_D: tl.constexpr, D: tl.constexpr,
               THRESHOLD: tl.constexpr, CONCAT_U: tl.constexpr, CONCAT_X: tl.constexpr):
    """Keep bits of [rows, BLOCK_D]: one Philox call per pair of adjacent columns, six 16-bit
    draws out of its words (the layout philox.dropout_mask spells out)."""
    pairs = tl.arange(0, BLOCK_D // 2)
    e = rows[:, None].to(tl.int64) * (D // 2) + pairs[None, :]
    c0 = (e & 0xFFFFFFFF).to(tl.uint32)
    c1 = (e >> 32).to(tl.uint32)
    c2 = (tl.zeros_like(c0) + (offset & 0xFFFFFFFF)).to(tl.uint32)
    c3 = (tl.zeros_like(c0) + ((offset >> 32) & 0xFFFFFFFF)).to(tl.uint32)
    r0, r1, r2, _ = _philox4x32_10(c0, c1, c2, c3, seed)
    even = ((r0 & 0xFFFF) >= THRESHOLD).to(tl.int32)
    odd = ((r1 >> 16) >= THRESHOLD).to(tl.int32)
    if CONCAT_X:
        even |= ((r0 >> 16) >= THRESHOLD).to(tl.int32) << 1
        odd |= ((r2 & 0xFFFF) >= THRESHOLD).to(tl.int32) << 1
    if CONCAT_U:
        even |= ((r1 & 0xFFFF) >= THRESHOLD).to(tl.int32) << 2
        odd |= ((r2 >> 16) >= THRESHOLD).to(tl.int32) << 2
    return tl.interleave(even, odd)


@triton.jit(do_not_specialize=["n_rows", "stride_x", "stride_u", "stride_y", "seed_lo",
                               "seed_hi", "off_lo", "off_hi"])
def _hstu_fwd_kernel(X, U, W, B, Y, MEAN, RSTD, MASK, SEED, OFFSET, n_rows,
                     stride_x, stride_u, stride_y, seed_lo, seed_hi, off_lo, off_hi, eps,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     SILU: tl.constexpr, CONCAT_U: tl.constexpr, CONCAT_X: tl.constexpr,
                     DROPOUT: tl.constexpr, THRESHOLD: tl.constexpr, SCALE: tl.constexpr,
                     SEED_FROM_TENSORS: tl.constexpr,
                     NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    wait_for_prior_kernel(PDL)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    seed, offset = _seed_and_offset(SEED, OFFSET, seed_lo, seed_hi, off_lo, off_hi,
                                    SEED_FROM_TENSORS)
    first = pid.to(tl.int64) * BLOCK_ROWS
    for r0 in tl.range(first, n_rows, programs * BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + row_offsets(rows, stride_x) + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row_offsets(rows, stride_u) + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / D
        var = tl.maximum(tl.sum(x * x, axis=1) / D - mean * mean, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
        xhat = (x - mean[:, None]) * rstd[:, None]
        lin = xhat * w[None, :] + b[None, :]
        if SILU:
            a = u * tl.sigmoid(u)
        else:
            a = u
        bits = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.int32)
        if DROPOUT:
            bits = _keep_bits(seed, offset, rows, BLOCK_D, D, THRESHOLD, CONCAT_U, CONCAT_X)
            tl.store(MASK + rows[:, None] * D + cols[None, :], bits.to(tl.int8), mask=mask)
        y_row = Y + row_offsets(rows, stride_y) + cols[None, :]
        segment = 0
        if CONCAT_U:
            tl.store(y_row, _drop(a, bits, 2, SCALE, DROPOUT).to(Y.dtype.element_ty), mask=mask)
            segment += 1
        if CONCAT_X:
            tl.store(y_row + segment * D, _drop(x, bits, 1, SCALE, DROPOUT).to(Y.dtype.element_ty),
                     mask=mask)
            segment += 1
        tl.store(y_row + segment * D,
                 _drop(lin * a, bits, 0, SCALE, DROPOUT).to(Y.dtype.element_ty), mask=mask)
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
    allow_dependent_launch(PDL)


@triton.jit(do_not_specialize=["n_rows", "stride_dy", "stride_x", "stride_u", "stride_dx",
                               "stride_du"])
def _hstu_bwd_kernel(DY, X, U, W, B, MEAN, RSTD, MASK, DX, DU, PARTIAL, n_rows,
                     stride_dy, stride_x, stride_u, stride_dx, stride_du,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     SILU: tl.constexpr, CONCAT_U: tl.constexpr, CONCAT_X: tl.constexpr,
                     DROPOUT: tl.constexpr, SCALE: tl.constexpr, COMPUTE_DW: tl.constexpr,
                     NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    wait_for_prior_kernel(PDL)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    acc_w = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    first = pid.to(tl.int64) * BLOCK_ROWS
    for r0 in tl.range(first, n_rows, programs * BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        dy_row = DY + row_offsets(rows, stride_dy) + cols[None, :]
        x = tl.load(X + row_offsets(rows, stride_x) + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row_offsets(rows, stride_u) + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        bits = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.int32)
        if DROPOUT:
            bits = tl.load(MASK + rows[:, None] * D + cols[None, :], mask=mask, other=0).to(tl.int32)
        segment = 0
        g_u = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
        g_x = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
        if CONCAT_U:
            g_u = _drop(tl.load(dy_row, mask=mask, other=0.0).to(tl.float32), bits, 2, SCALE, DROPOUT)
            segment += 1
        if CONCAT_X:
            g_x = _drop(tl.load(dy_row + segment * D, mask=mask, other=0.0).to(tl.float32), bits, 1,
                        SCALE, DROPOUT)
            segment += 1
        g = _drop(tl.load(dy_row + segment * D, mask=mask, other=0.0).to(tl.float32), bits, 0,
                  SCALE, DROPOUT)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        lin = xhat * w[None, :] + b[None, :]
        if SILU:
            sig = tl.sigmoid(u)
            a = u * sig
            a_prime = sig * (1.0 + u * (1.0 - sig))
        else:
            a = u
            a_prime = tl.full([BLOCK_ROWS, BLOCK_D], 1.0, tl.float32)
        dl = g * a
        wd = dl * w[None, :]
        mean_wd = tl.sum(wd, axis=1) / D
        mean_xwd = tl.sum(xhat * wd, axis=1) / D
        dx = g_x + rstd[:, None] * (wd - mean_wd[:, None] - xhat * mean_xwd[:, None])
        du = (g * lin + g_u) * a_prime
        tl.store(DX + row_offsets(rows, stride_dx) + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        tl.store(DU + row_offsets(rows, stride_du) + cols[None, :], du.to(DU.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            acc_w += dl * xhat
        acc_b += dl
    allow_dependent_launch(PDL)
    partial = PARTIAL + pid.to(tl.int64) * D
    if COMPUTE_DW:
        tl.store(partial + cols, tl.sum(acc_w, axis=0), mask=col_mask)
    tl.store(partial + programs.to(tl.int64) * D + cols, tl.sum(acc_b, axis=0), mask=col_mask)


def _split64(value: int) -> tuple[int, int]:
    """A signed 64-bit int as (low, high) signed 32-bit halves (kernel ints keep one type)."""
    value &= (1 << 64) - 1
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


def launch_forward(cfg: HstuConfig, sm_count: int, x, u, weight, bias, y, mean, rstd, mask,
                   seed, offset, n_rows: int, strides, eps: float, flags: dict, threshold: int,
                   scale: float) -> None:
    """strides: row strides of x, u, y. seed/offset: ints, or one-element int64 tensors."""
    if n_rows == 0:
        return
    from_tensors = not isinstance(seed, int)
    seed_lo, seed_hi = (0, 0) if from_tensors else _split64(seed)
    off_lo, off_hi = (0, 0) if from_tensors else _split64(offset)
    seed_ptr, off_ptr = (seed, offset) if from_tensors else (mean, mean)
    dropout = mask is not None
    programs = persistent_grid(triton.cdiv(n_rows, cfg.block_rows),
                               sm_count * cfg.programs_per_sm)
    pdl = use_pdl(x)
    _hstu_fwd_kernel[(programs,)](
        x, u, weight, bias, y, mean, rstd, mask if dropout else mean, seed_ptr, off_ptr, n_rows,
        *strides, seed_lo, seed_hi, off_lo, off_hi, eps, D=weight.shape[0],
        BLOCK_D=cfg.block_d, BLOCK_ROWS=cfg.block_rows, SILU=flags["apply_u_silu"],
        CONCAT_U=flags["concat_u"], CONCAT_X=flags["concat_x"], DROPOUT=dropout,
        THRESHOLD=threshold, SCALE=scale, SEED_FROM_TENSORS=from_tensors,
        NUM_STAGES=cfg.num_stages, PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps)


def launch_backward(cfg: HstuConfig, programs: int, dy, x, u, weight, bias, mean, rstd, mask,
                    dx, du, dweight, dbias, partial, n_rows: int, strides, flags: dict,
                    scale: float) -> None:
    """partial: FP32 [2, programs, D] (dweight rows, then dbias rows); strides of dy, x, u, dx, du."""
    d = weight.shape[0]
    compute_dw = dweight is not None
    pdl = use_pdl(x)
    _hstu_bwd_kernel[(programs,)](
        dy, x, u, weight, bias, mean, rstd, mask if mask is not None else mean, dx, du, partial,
        n_rows, *strides, D=d, BLOCK_D=cfg.block_d, BLOCK_ROWS=cfg.block_rows,
        SILU=flags["apply_u_silu"], CONCAT_U=flags["concat_u"], CONCAT_X=flags["concat_x"],
        DROPOUT=mask is not None, SCALE=scale, COMPUTE_DW=compute_dw,
        NUM_STAGES=cfg.num_stages, PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps)
    if compute_dw:
        sum_partials(partial, [dweight, dbias], programs)
    else:
        sum_partials(partial[programs * d:], [dbias], programs)
