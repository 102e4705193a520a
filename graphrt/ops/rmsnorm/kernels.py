"""Triton kernels for RMSNorm train forward/backward.

Rows are a run-time extent (never specialized), so one compile serves every row count. Rows of up
to ``MAX_BLOCK_H`` elements live in registers, and a grid of persistent programs walks tiles of
rows interleaved over the programs; Triton's loop pipeliner keeps several tiles of loads in flight. Longer
rows are walked in chunks. In the backward, each program owns one row of FP32 dw partials in the
workspace; a second kernel sums them over programs in a fixed order (no atomics).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import triton
import triton.language as tl

from ...kernel_utils import (allow_dependent_launch, cdiv, CompileCase, CONSTEXPR, launch,
                             persistent_grid, row_offsets, use_pdl, wait_for_prior_kernel)
from ...reduction import sum_partials

MAX_BLOCK_H = 8192
CHUNK_H = 4096


@dataclass(frozen=True)
class RowConfig:
    block_h: int          # columns per tile (a power of two)
    num_chunks: int       # tiles per row (1: the whole row is in registers)
    block_rows: int       # rows per tile
    num_warps: int
    programs_per_sm: int  # persistent programs per SM (single-chunk kernels)
    num_stages: int = 1   # row tiles whose loads the loop pipeliner keeps in flight


def _row_config(hidden: int, block_rows: int, num_warps: int, programs_per_sm: int,
                num_stages: int) -> RowConfig:
    if hidden > MAX_BLOCK_H:
        return RowConfig(CHUNK_H, cdiv(hidden, CHUNK_H), 1, 8, 0)
    return RowConfig(triton.next_power_of_2(hidden), 1, block_rows, num_warps, programs_per_sm,
                     num_stages)


# Tile choices from sweeps on an H200 (scripts/sweep_rmsnorm.py; docs/perf/rmsnorm.md has the figures):
# (rows per tile, warps, programs per SM, pipeline stages).
def forward_config(hidden: int) -> RowConfig:
    block_h = triton.next_power_of_2(hidden)
    if block_h <= 2048:
        return _row_config(hidden, max(1, 2048 // block_h), 4, 4, 4)
    if block_h == 4096:
        return _row_config(hidden, 2, 4, 8, 4)
    return _row_config(hidden, 1, 4, 2 if hidden <= 6144 else 8, 3)


def backward_config(hidden: int) -> RowConfig:
    block_h = triton.next_power_of_2(hidden)
    if block_h <= 2048:
        return _row_config(hidden, max(1, 2048 // block_h), 4, 2, 4)
    if block_h == 4096:
        return _row_config(hidden, 1, 16, 1, 5)
    if hidden <= 6144:
        return _row_config(hidden, 1, 8, 1, 4)
    return _row_config(hidden, 1, 16, 1, 3)


@lru_cache(maxsize=None)
def backward_programs(hidden: int, sm_count: int) -> int:
    """Programs of the backward grid, each owning one row of dw partials: a plan-time fact,
    since the order of the dw reduction depends on it."""
    cfg = backward_config(hidden)
    return sm_count * (cfg.programs_per_sm if cfg.num_chunks == 1 else 2)


# -- forward -----------------------------------------------------------------------------------
@triton.jit
def _load_h(X, RES, H_NEW, x_off, res_off, h_off, col, mask,
            HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr):
    """x (or x + residual rounded to storage precision) as FP32; stores h_new when asked."""
    x = tl.load(X + x_off + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(RES + res_off + col, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H_NEW.dtype.element_ty)
        if STORE_H:
            tl.store(H_NEW + h_off + col, h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit(do_not_specialize=["n_rows", "stride_x", "stride_res", "stride_y", "stride_h"])
def _rmsnorm_fwd_rows_kernel(X, RES, W, Y, RSTD, H_NEW, n_rows,
                             stride_x, stride_res, stride_y, stride_h, eps,
                             HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                             NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    # tiles are interleaved over programs, so the rows in flight at once are neighbours in
    # memory; the loop pipeliner keeps NUM_STAGES tiles of loads in flight
    step = tl.num_programs(0).to(tl.int64) * BLOCK_ROWS
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    cols = tl.arange(0, BLOCK_H)[None, :]
    col_mask = cols < HIDDEN
    wait_for_prior_kernel(PDL)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    for r0 in tl.range(first, n_rows, step, num_stages=NUM_STAGES):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask
        x = _load_h(X, RES, H_NEW, row_offsets(rows, stride_x), row_offsets(rows, stride_res),
                    row_offsets(rows, stride_h), cols, mask, HAS_RESIDUAL, True)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)
        tl.store(Y + row_offsets(rows, stride_y) + cols,
                 (x * rstd[:, None] * w).to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
    allow_dependent_launch(PDL)


@triton.jit(do_not_specialize=["stride_x", "stride_res", "stride_y", "stride_h"])
def _rmsnorm_fwd_chunked_kernel(X, RES, W, Y, RSTD, H_NEW,
                                stride_x, stride_res, stride_y, stride_h, eps,
                                HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                                NUM_CHUNKS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_off = tl.multiple_of(row * stride_x, 8)
    res_off = tl.multiple_of(row * stride_res, 8)
    h_off = tl.multiple_of(row * stride_h, 8)
    cols = tl.arange(0, BLOCK_H)
    sum_sq = tl.zeros([BLOCK_H], dtype=tl.float32)
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        x = _load_h(X, RES, H_NEW, x_off, res_off, h_off, col, col < HIDDEN, HAS_RESIDUAL, True)
        sum_sq += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / HIDDEN + eps)
    y_off = tl.multiple_of(row * stride_y, 8)
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        col_mask = col < HIDDEN
        x = _load_h(X, RES, H_NEW, x_off, res_off, h_off, col, col_mask, HAS_RESIDUAL, False)
        w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(Y + y_off + col, (x * rstd * w).to(Y.dtype.element_ty), mask=col_mask)
    tl.store(RSTD + row, rstd)


# -- backward ----------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_rows", "stride_g", "stride_x", "stride_gres", "stride_dx"])
def _rmsnorm_bwd_rows_kernel(G, X, W, RSTD, G_RES, DX, PARTIAL, n_rows,
                             stride_g, stride_x, stride_gres, stride_dx,
                             HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, HAS_G_RESIDUAL: tl.constexpr,
                             NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    # tiles are interleaved over programs; each program sums its own tiles' dw in tile order
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK_ROWS
    first = pid.to(tl.int64) * BLOCK_ROWS
    cols = tl.arange(0, BLOCK_H)[None, :]
    col_mask = cols < HIDDEN
    wait_for_prior_kernel(PDL)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_ROWS, BLOCK_H], dtype=tl.float32)
    for r0 in tl.range(first, n_rows, step, num_stages=NUM_STAGES):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask
        g = tl.load(G + row_offsets(rows, stride_g) + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row_offsets(rows, stride_x) + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        xhat = x * rstd[:, None]
        wg = g * w
        mean_wgx = tl.sum(wg * xhat, axis=1) / HIDDEN
        dx = rstd[:, None] * (wg - xhat * mean_wgx[:, None])
        if HAS_G_RESIDUAL:
            dx += tl.load(G_RES + row_offsets(rows, stride_gres) + cols, mask=mask,
                          other=0.0).to(tl.float32)
        tl.store(DX + row_offsets(rows, stride_dx) + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += g * xhat
    allow_dependent_launch(PDL)
    partial_row = PARTIAL + pid.to(tl.int64) * HIDDEN
    tl.store(partial_row + tl.arange(0, BLOCK_H), tl.sum(dw_acc, axis=0),
             mask=tl.arange(0, BLOCK_H) < HIDDEN)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program", "stride_g", "stride_x",
                               "stride_gres", "stride_dx"])
def _rmsnorm_bwd_chunked_kernel(G, X, W, RSTD, G_RES, DX, PARTIAL, n_rows, rows_per_program,
                                stride_g, stride_x, stride_gres, stride_dx,
                                HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                                NUM_CHUNKS: tl.constexpr, HAS_G_RESIDUAL: tl.constexpr,
                                PDL: tl.constexpr):
    pid = tl.program_id(0)
    row_begin = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_H)
    partial_row = PARTIAL + pid.to(tl.int64) * HIDDEN
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        tl.store(partial_row + col, tl.zeros([BLOCK_H], dtype=tl.float32), mask=col < HIDDEN)
    for row in range(row_begin, row_end):
        g_off = tl.multiple_of(row * stride_g, 8)
        x_off = tl.multiple_of(row * stride_x, 8)
        rstd = tl.load(RSTD + row)
        dot = tl.zeros([BLOCK_H], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            col_mask = col < HIDDEN
            g = tl.load(G + g_off + col, mask=col_mask, other=0.0).to(tl.float32)
            x = tl.load(X + x_off + col, mask=col_mask, other=0.0).to(tl.float32)
            w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
            dot += g * w * x
        mean_wgx = tl.sum(dot, axis=0) * rstd / HIDDEN
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            col_mask = col < HIDDEN
            g = tl.load(G + g_off + col, mask=col_mask, other=0.0).to(tl.float32)
            x = tl.load(X + x_off + col, mask=col_mask, other=0.0).to(tl.float32)
            w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
            xhat = x * rstd
            dx = rstd * (g * w - xhat * mean_wgx)
            if HAS_G_RESIDUAL:
                dx += tl.load(G_RES + tl.multiple_of(row * stride_gres, 8) + col, mask=col_mask,
                              other=0.0).to(tl.float32)
            tl.store(DX + tl.multiple_of(row * stride_dx, 8) + col, dx.to(DX.dtype.element_ty),
                     mask=col_mask)
            # each thread re-reads only the partials it wrote itself (same layout every pass)
            acc = tl.load(partial_row + col, mask=col_mask, other=0.0)
            tl.store(partial_row + col, acc + g * xhat, mask=col_mask)
    allow_dependent_launch(PDL)


# -- launchers ---------------------------------------------------------------------------------
def launch_forward(cfg: RowConfig, sm_count: int, x, residual, w, y, rstd, h_new, n_rows,
                   strides, eps):
    """strides: row strides (elements) of x, residual, y, h_new."""
    if n_rows == 0:
        return
    has_res = residual is not None
    res, hn = (residual, h_new) if has_res else (x, y)
    if cfg.num_chunks > 1:
        launch(_rmsnorm_fwd_chunked_kernel, (n_rows,),
            x, res, w, y, rstd, hn, *strides, eps, HIDDEN=w.shape[0], BLOCK_H=cfg.block_h,
            NUM_CHUNKS=cfg.num_chunks, HAS_RESIDUAL=has_res, num_warps=cfg.num_warps)
        return
    programs = persistent_grid(cdiv(n_rows, cfg.block_rows),
                               sm_count * cfg.programs_per_sm)
    pdl = use_pdl(x)
    launch(_rmsnorm_fwd_rows_kernel, (programs,),
        x, res, w, y, rstd, hn, n_rows, *strides, eps, HIDDEN=w.shape[0],
        BLOCK_H=cfg.block_h, BLOCK_ROWS=cfg.block_rows, HAS_RESIDUAL=has_res,
        NUM_STAGES=cfg.num_stages, PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps)


def launch_backward(cfg: RowConfig, n_programs: int, g, x, w, rstd, g_residual, dx, dw, partial,
                    n_rows, strides):
    """strides: row strides (elements) of g, x, g_residual, dx. partial: FP32 [n_programs, H]."""
    hidden = w.shape[0]
    has_gres = g_residual is not None
    args = (g, x, w, rstd, g_residual if has_gres else g, dx, partial, n_rows)
    pdl = use_pdl(x)
    if cfg.num_chunks > 1:
        launch(_rmsnorm_bwd_chunked_kernel, (n_programs,),
            *args, cdiv(n_rows, n_programs), *strides, HIDDEN=hidden, BLOCK_H=cfg.block_h,
            NUM_CHUNKS=cfg.num_chunks, HAS_G_RESIDUAL=has_gres, PDL=pdl, num_warps=cfg.num_warps)
    else:
        launch(_rmsnorm_bwd_rows_kernel, (n_programs,),
            *args, *strides, HIDDEN=hidden, BLOCK_H=cfg.block_h, BLOCK_ROWS=cfg.block_rows,
            HAS_G_RESIDUAL=has_gres, NUM_STAGES=cfg.num_stages, PDL=pdl, launch_pdl=pdl,
            num_warps=cfg.num_warps)
    sum_partials(partial, [dw], n_programs)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: both row kernels with a residual, and the
    chunked ones for a hidden size beyond one block."""
    c = CONSTEXPR
    return [
        CompileCase("rmsnorm fwd rows", _rmsnorm_fwd_rows_kernel, dict(
            X="*bf16", RES="*bf16", W="*fp32", Y="*bf16", RSTD="*fp32", H_NEW="*bf16",
            n_rows="i32", stride_x="i32", stride_res="i32", stride_y="i32", stride_h="i32",
            eps="fp32", HIDDEN=c, BLOCK_H=c, BLOCK_ROWS=c, HAS_RESIDUAL=c, NUM_STAGES=c, PDL=c),
            dict(HIDDEN=4096, BLOCK_H=4096, BLOCK_ROWS=2, HAS_RESIDUAL=True, NUM_STAGES=4,
                 PDL=True)),
        CompileCase("rmsnorm bwd rows", _rmsnorm_bwd_rows_kernel, dict(
            G="*bf16", X="*bf16", W="*fp32", RSTD="*fp32", G_RES="*bf16", DX="*bf16",
            PARTIAL="*fp32", n_rows="i32", stride_g="i32", stride_x="i32", stride_gres="i32",
            stride_dx="i32", HIDDEN=c, BLOCK_H=c, BLOCK_ROWS=c, HAS_G_RESIDUAL=c, NUM_STAGES=c,
            PDL=c),
            dict(HIDDEN=5120, BLOCK_H=8192, BLOCK_ROWS=1, HAS_G_RESIDUAL=True, NUM_STAGES=4,
                 PDL=True), num_warps=8),
        CompileCase("rmsnorm fwd chunked", _rmsnorm_fwd_chunked_kernel, dict(
            X="*bf16", RES="*bf16", W="*bf16", Y="*bf16", RSTD="*fp32", H_NEW="*bf16",
            stride_x="i32", stride_res="i32", stride_y="i32", stride_h="i32", eps="fp32",
            HIDDEN=c, BLOCK_H=c, NUM_CHUNKS=c, HAS_RESIDUAL=c),
            dict(HIDDEN=16392, BLOCK_H=4096, NUM_CHUNKS=5, HAS_RESIDUAL=True), num_warps=8),
        CompileCase("rmsnorm bwd chunked", _rmsnorm_bwd_chunked_kernel, dict(
            G="*bf16", X="*bf16", W="*fp32", RSTD="*fp32", G_RES="*bf16", DX="*bf16",
            PARTIAL="*fp32", n_rows="i32", rows_per_program="i32", stride_g="i32",
            stride_x="i32", stride_gres="i32", stride_dx="i32", HIDDEN=c, BLOCK_H=c,
            NUM_CHUNKS=c, HAS_G_RESIDUAL=c, PDL=c),
            dict(HIDDEN=16392, BLOCK_H=4096, NUM_CHUNKS=5, HAS_G_RESIDUAL=False, PDL=True),
            num_warps=8),
    ]
