"""Triton kernels for RMSNorm train forward/backward.

Rows are a run-time extent (never specialized), so one compile serves every row count. Rows of up
to ``MAX_BLOCK_H`` elements live in registers, and a grid of persistent programs walks tiles of
rows interleaved over the programs, loading the next tile while it computes the current one. Longer
rows are walked in chunks. In the backward, each program owns one row of FP32 dw partials in the
workspace; a second kernel sums them over programs in a fixed order (no atomics).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import triton
import triton.language as tl

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


def _row_config(hidden: int, block_rows: int, num_warps: int, programs_per_sm: int) -> RowConfig:
    if hidden > MAX_BLOCK_H:
        return RowConfig(CHUNK_H, triton.cdiv(hidden, CHUNK_H), 1, 8, 0)
    return RowConfig(triton.next_power_of_2(hidden), 1, block_rows, num_warps, programs_per_sm)


# Tile choices from sweeps on an H200 (scripts/sweep_rmsnorm.py; NOTES.md has the figures).
def forward_config(hidden: int) -> RowConfig:
    block_h = triton.next_power_of_2(hidden)
    rows = max(1, min(64, 2048 // block_h))
    if block_h * rows <= 4096:
        return _row_config(hidden, rows, 4, 8)
    return _row_config(hidden, rows, 8, 4)


def backward_config(hidden: int) -> RowConfig:
    block_h = triton.next_power_of_2(hidden)
    if block_h <= 2048:
        return _row_config(hidden, max(1, min(16, 4096 // block_h)), 8, 2)
    return _row_config(hidden, max(1, 8192 // block_h), 16, 1)


@lru_cache(maxsize=None)
def backward_programs(hidden: int, sm_count: int) -> int:
    """Programs of the backward grid, each owning one row of dw partials: a plan-time fact,
    since the order of the dw reduction depends on it."""
    cfg = backward_config(hidden)
    return sm_count * (cfg.programs_per_sm if cfg.num_chunks == 1 else 2)


# -- forward -----------------------------------------------------------------------------------
@triton.jit
def _load_h(X, RES, H_NEW, rows2, col, mask, stride_x, stride_res, stride_h,
            HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr):
    """x (or x + residual rounded to storage precision) as FP32; stores h_new when asked."""
    x = tl.load(X + rows2 * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(RES + rows2 * stride_res + col, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H_NEW.dtype.element_ty)
        if STORE_H:
            tl.store(H_NEW + rows2 * stride_h + col, h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit(do_not_specialize=["n_rows", "stride_x", "stride_res", "stride_y", "stride_h"])
def _rmsnorm_fwd_rows_kernel(X, RES, W, Y, RSTD, H_NEW, n_rows,
                             stride_x, stride_res, stride_y, stride_h, eps,
                             HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    # tiles are interleaved over programs, so the rows in flight at once are neighbours in memory
    step = tl.num_programs(0).to(tl.int64) * BLOCK_ROWS
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    cols = tl.arange(0, BLOCK_H)[None, :]
    col_mask = cols < HIDDEN
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    rows = first + tl.arange(0, BLOCK_ROWS)
    mask = (rows < n_rows)[:, None] & col_mask
    x_next = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r_next = tl.load(RES + rows[:, None] * stride_res + cols, mask=mask, other=0.0)
    for r0 in range(first, n_rows, step):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        rows2 = rows[:, None]
        mask = row_mask[:, None] & col_mask
        x = x_next.to(tl.float32)
        if HAS_RESIDUAL:
            h = (x + r_next.to(tl.float32)).to(H_NEW.dtype.element_ty)
            x = h.to(tl.float32)
        # issue the next tile's loads before this tile's arithmetic and stores
        nxt = rows2 + step
        nmask = (nxt < n_rows) & col_mask
        x_next = tl.load(X + nxt * stride_x + cols, mask=nmask, other=0.0)
        if HAS_RESIDUAL:
            r_next = tl.load(RES + nxt * stride_res + cols, mask=nmask, other=0.0)
            tl.store(H_NEW + rows2 * stride_h + cols, h, mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)
        tl.store(Y + rows2 * stride_y + cols, (x * rstd[:, None] * w).to(Y.dtype.element_ty),
                 mask=mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["stride_x", "stride_res", "stride_y", "stride_h"])
def _rmsnorm_fwd_chunked_kernel(X, RES, W, Y, RSTD, H_NEW,
                                stride_x, stride_res, stride_y, stride_h, eps,
                                HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                                NUM_CHUNKS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    sum_sq = tl.zeros([BLOCK_H], dtype=tl.float32)
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        x = _load_h(X, RES, H_NEW, row, col, col < HIDDEN, stride_x, stride_res, stride_h,
                    HAS_RESIDUAL, True)
        sum_sq += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / HIDDEN + eps)
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        col_mask = col < HIDDEN
        x = _load_h(X, RES, H_NEW, row, col, col_mask, stride_x, stride_res, stride_h,
                    HAS_RESIDUAL, False)
        w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + col, (x * rstd * w).to(Y.dtype.element_ty), mask=col_mask)
    tl.store(RSTD + row, rstd)


# -- backward ----------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_rows", "stride_g", "stride_x", "stride_gres", "stride_dx"])
def _rmsnorm_bwd_rows_kernel(G, X, W, RSTD, G_RES, DX, PARTIAL, n_rows,
                             stride_g, stride_x, stride_gres, stride_dx,
                             HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, HAS_G_RESIDUAL: tl.constexpr):
    # tiles are interleaved over programs; each program sums its own tiles' dw in tile order
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK_ROWS
    first = pid.to(tl.int64) * BLOCK_ROWS
    cols = tl.arange(0, BLOCK_H)[None, :]
    col_mask = cols < HIDDEN
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    rows = first + tl.arange(0, BLOCK_ROWS)
    mask = (rows < n_rows)[:, None] & col_mask
    g_next = tl.load(G + rows[:, None] * stride_g + cols, mask=mask, other=0.0)
    x_next = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0)
    rstd_next = tl.load(RSTD + rows, mask=rows < n_rows, other=0.0)
    dw_acc = tl.zeros([BLOCK_ROWS, BLOCK_H], dtype=tl.float32)
    for r0 in range(first, n_rows, step):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        rows2 = rows[:, None]
        mask = row_mask[:, None] & col_mask
        g = g_next.to(tl.float32)
        x = x_next.to(tl.float32)
        rstd = rstd_next
        # issue the next tile's loads before this tile's arithmetic and stores
        nxt = rows + step
        nmask = (nxt < n_rows)[:, None] & col_mask
        g_next = tl.load(G + nxt[:, None] * stride_g + cols, mask=nmask, other=0.0)
        x_next = tl.load(X + nxt[:, None] * stride_x + cols, mask=nmask, other=0.0)
        rstd_next = tl.load(RSTD + nxt, mask=nxt < n_rows, other=0.0)
        xhat = x * rstd[:, None]
        wg = g * w
        mean_wgx = tl.sum(wg * xhat, axis=1) / HIDDEN
        dx = rstd[:, None] * (wg - xhat * mean_wgx[:, None])
        if HAS_G_RESIDUAL:
            dx += tl.load(G_RES + rows2 * stride_gres + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows2 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += g * xhat
    partial_row = PARTIAL + pid.to(tl.int64) * HIDDEN
    tl.store(partial_row + tl.arange(0, BLOCK_H), tl.sum(dw_acc, axis=0),
             mask=tl.arange(0, BLOCK_H) < HIDDEN)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program", "stride_g", "stride_x",
                               "stride_gres", "stride_dx"])
def _rmsnorm_bwd_chunked_kernel(G, X, W, RSTD, G_RES, DX, PARTIAL, n_rows, rows_per_program,
                                stride_g, stride_x, stride_gres, stride_dx,
                                HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
                                NUM_CHUNKS: tl.constexpr, HAS_G_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    row_begin = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_H)
    partial_row = PARTIAL + pid.to(tl.int64) * HIDDEN
    for c in range(NUM_CHUNKS):
        col = cols + c * BLOCK_H
        tl.store(partial_row + col, tl.zeros([BLOCK_H], dtype=tl.float32), mask=col < HIDDEN)
    for row in range(row_begin, row_end):
        rstd = tl.load(RSTD + row)
        dot = tl.zeros([BLOCK_H], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            col_mask = col < HIDDEN
            g = tl.load(G + row * stride_g + col, mask=col_mask, other=0.0).to(tl.float32)
            x = tl.load(X + row * stride_x + col, mask=col_mask, other=0.0).to(tl.float32)
            w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
            dot += g * w * x
        mean_wgx = tl.sum(dot, axis=0) * rstd / HIDDEN
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            col_mask = col < HIDDEN
            g = tl.load(G + row * stride_g + col, mask=col_mask, other=0.0).to(tl.float32)
            x = tl.load(X + row * stride_x + col, mask=col_mask, other=0.0).to(tl.float32)
            w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
            xhat = x * rstd
            dx = rstd * (g * w - xhat * mean_wgx)
            if HAS_G_RESIDUAL:
                dx += tl.load(G_RES + row * stride_gres + col, mask=col_mask,
                              other=0.0).to(tl.float32)
            tl.store(DX + row * stride_dx + col, dx.to(DX.dtype.element_ty), mask=col_mask)
            # each thread re-reads only the partials it wrote itself (same layout every pass)
            acc = tl.load(partial_row + col, mask=col_mask, other=0.0)
            tl.store(partial_row + col, acc + g * xhat, mask=col_mask)


# -- launchers ---------------------------------------------------------------------------------
def launch_forward(cfg: RowConfig, sm_count: int, x, residual, w, y, rstd, h_new, n_rows,
                   strides, eps):
    """strides: row strides (elements) of x, residual, y, h_new."""
    if n_rows == 0:
        return
    has_res = residual is not None
    res, hn = (residual, h_new) if has_res else (x, y)
    if cfg.num_chunks > 1:
        _rmsnorm_fwd_chunked_kernel[(n_rows,)](
            x, res, w, y, rstd, hn, *strides, eps, HIDDEN=w.shape[0], BLOCK_H=cfg.block_h,
            NUM_CHUNKS=cfg.num_chunks, HAS_RESIDUAL=has_res, num_warps=cfg.num_warps)
        return
    programs = min(triton.cdiv(n_rows, cfg.block_rows), sm_count * cfg.programs_per_sm)
    _rmsnorm_fwd_rows_kernel[(programs,)](
        x, res, w, y, rstd, hn, n_rows, *strides, eps, HIDDEN=w.shape[0],
        BLOCK_H=cfg.block_h, BLOCK_ROWS=cfg.block_rows, HAS_RESIDUAL=has_res,
        num_warps=cfg.num_warps)


def launch_backward(cfg: RowConfig, n_programs: int, g, x, w, rstd, g_residual, dx, dw, partial,
                    n_rows, strides):
    """strides: row strides (elements) of g, x, g_residual, dx. partial: FP32 [n_programs, H]."""
    hidden = w.shape[0]
    has_gres = g_residual is not None
    args = (g, x, w, rstd, g_residual if has_gres else g, dx, partial, n_rows)
    if cfg.num_chunks > 1:
        _rmsnorm_bwd_chunked_kernel[(n_programs,)](
            *args, triton.cdiv(n_rows, n_programs), *strides, HIDDEN=hidden, BLOCK_H=cfg.block_h, NUM_CHUNKS=cfg.num_chunks,
            HAS_G_RESIDUAL=has_gres, num_warps=cfg.num_warps)
    else:
        _rmsnorm_bwd_rows_kernel[(n_programs,)](
            *args, *strides, HIDDEN=hidden, BLOCK_H=cfg.block_h, BLOCK_ROWS=cfg.block_rows,
            HAS_G_RESIDUAL=has_gres, num_warps=cfg.num_warps)
    sum_partials(partial, dw, n_programs)
