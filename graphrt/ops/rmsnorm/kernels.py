"""Triton kernels for RMSNorm train forward/backward.

Rows are a run-time extent (never specialized), so one compile serves every row count. Rows of up
to ``MAX_BLOCK_H`` elements live in registers; longer rows are walked in chunks. The backward runs
a fixed grid of programs that each own a contiguous run of rows and one row of FP32 dw partials in
the workspace; a second kernel sums the partials over programs in a fixed order (no atomics).
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from ...reduction import sum_partials

MAX_BLOCK_H = 8192
CHUNK_H = 4096


@dataclass(frozen=True)
class RowConfig:
    block_h: int
    num_chunks: int
    block_rows: int
    num_warps: int


def row_config(hidden: int, tile_elems: int, max_rows: int) -> RowConfig:
    """Tile shape for rows of ``hidden`` elements: whole rows in registers when they fit."""
    if hidden <= MAX_BLOCK_H:
        block_h = triton.next_power_of_2(hidden)
        block_rows = max(1, min(max_rows, tile_elems // block_h))
        num_chunks = 1
    else:
        block_h, block_rows, num_chunks = CHUNK_H, 1, triton.cdiv(hidden, CHUNK_H)
    num_warps = max(1, min(16, block_h * block_rows // 512))
    return RowConfig(block_h, num_chunks, block_rows, num_warps)


@triton.jit
def _load_row_chunk(X, RES, H_NEW, rows2, col, mask, stride_x, stride_res, stride_h,
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
def _rmsnorm_fwd_kernel(X, RES, W, Y, RSTD, H_NEW, n_rows,
                        stride_x, stride_res, stride_y, stride_h, eps,
                        HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    rows2 = rows[:, None]
    cols = tl.arange(0, BLOCK_H)[None, :]
    if NUM_CHUNKS == 1:
        col_mask = cols < HIDDEN
        mask = row_mask[:, None] & col_mask
        x = _load_row_chunk(X, RES, H_NEW, rows2, cols, mask, stride_x, stride_res, stride_h,
                            HAS_RESIDUAL, True)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(Y + rows2 * stride_y + cols, (x * rstd[:, None] * w).to(Y.dtype.element_ty),
                 mask=mask)
    else:
        sum_sq = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            mask = row_mask[:, None] & (col < HIDDEN)
            x = _load_row_chunk(X, RES, H_NEW, rows2, col, mask, stride_x, stride_res, stride_h,
                                HAS_RESIDUAL, True)
            sum_sq += tl.sum(x * x, axis=1)
        rstd = 1.0 / tl.sqrt(sum_sq / HIDDEN + eps)
        for c in range(NUM_CHUNKS):
            col = cols + c * BLOCK_H
            col_mask = col < HIDDEN
            mask = row_mask[:, None] & col_mask
            x = _load_row_chunk(X, RES, H_NEW, rows2, col, mask, stride_x, stride_res, stride_h,
                                HAS_RESIDUAL, False)
            w = tl.load(W + col, mask=col_mask, other=0.0).to(tl.float32)
            tl.store(Y + rows2 * stride_y + col, (x * rstd[:, None] * w).to(Y.dtype.element_ty),
                     mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program", "stride_g", "stride_x",
                               "stride_gres", "stride_dx"])
def _rmsnorm_bwd_kernel(G, X, W, RSTD, G_RES, DX, PARTIAL, n_rows, rows_per_program,
                        stride_g, stride_x, stride_gres, stride_dx,
                        HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, HAS_G_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    row_begin = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_H)
    partial_row = PARTIAL + pid.to(tl.int64) * HIDDEN
    if NUM_CHUNKS == 1:
        col_mask = cols < HIDDEN
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for r0 in range(row_begin, row_end, BLOCK_ROWS):
            rows = r0 + tl.arange(0, BLOCK_ROWS)
            row_mask = rows < row_end
            rows2 = rows[:, None]
            mask = row_mask[:, None] & col_mask[None, :]
            g = tl.load(G + rows2 * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            x = tl.load(X + rows2 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            xhat = x * rstd[:, None]
            wg = g * w[None, :]
            mean_wgx = tl.sum(wg * xhat, axis=1) / HIDDEN
            dx = rstd[:, None] * (wg - xhat * mean_wgx[:, None])
            if HAS_G_RESIDUAL:
                dx += tl.load(G_RES + rows2 * stride_gres + cols[None, :], mask=mask,
                              other=0.0).to(tl.float32)
            tl.store(DX + rows2 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            dw_acc += tl.sum(g * xhat, axis=0)
        tl.store(partial_row + cols, dw_acc, mask=col_mask)
    else:
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
                acc = tl.load(partial_row + col, mask=col_mask, other=0.0)
                tl.store(partial_row + col, acc + g * xhat, mask=col_mask)


def forward_config(hidden: int) -> RowConfig:
    return row_config(hidden, tile_elems=4096, max_rows=64)


def backward_config(hidden: int) -> RowConfig:
    return row_config(hidden, tile_elems=4096, max_rows=16)


def launch_forward(cfg: RowConfig, x, residual, w, y, rstd, h_new, n_rows, strides, eps):
    """strides: row strides (elements) of x, residual, y, h_new."""
    if n_rows == 0:
        return
    grid = (triton.cdiv(n_rows, cfg.block_rows),)
    has_res = residual is not None
    _rmsnorm_fwd_kernel[grid](
        x, residual if has_res else x, w, y, rstd, h_new if has_res else y, n_rows, *strides, eps,
        HIDDEN=w.shape[0], BLOCK_H=cfg.block_h, NUM_CHUNKS=cfg.num_chunks,
        BLOCK_ROWS=cfg.block_rows, HAS_RESIDUAL=has_res, num_warps=cfg.num_warps)


def launch_backward(cfg: RowConfig, n_programs: int, g, x, w, rstd, g_residual, dx, dw, partial,
                    n_rows, strides):
    """strides: row strides (elements) of g, x, g_residual, dx. partial: FP32 [n_programs, H]."""
    hidden = w.shape[0]
    has_gres = g_residual is not None
    rows_per_program = triton.cdiv(n_rows, n_programs)
    _rmsnorm_bwd_kernel[(n_programs,)](
        g, x, w, rstd, g_residual if has_gres else g, dx, partial, n_rows, rows_per_program,
        *strides, HIDDEN=hidden, BLOCK_H=cfg.block_h, NUM_CHUNKS=cfg.num_chunks,
        BLOCK_ROWS=cfg.block_rows, HAS_G_RESIDUAL=has_gres, num_warps=cfg.num_warps)
    sum_partials(partial, dw, n_programs)
