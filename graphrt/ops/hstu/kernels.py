"""Triton kernels for HSTU LayerNorm-Multiply-SiLU-Dropout, forward and backward.

Rows are run-time extents and row strides run-time values (multiples of 8 elements, hinted so
loads stay 16 bytes wide); offsets are 64-bit. Dropout is counter-addressed Philox: each run of
eight columns of a row makes three calls at counters (3 x octet index + k, offset) under the
64-bit seed and takes 24 16-bit draws from them (philox.dropout_mask has the layout), so masks
do not depend on the launch shape. The forward splits its tile by column within each octet, so
that every value meets its draws in the thread that made them.
The backward's programs each own rows interleaved over the grid and one row of FP32 dweight and
dbias partials, summed in the reduction's grouped order: by the last programs to arrive where
the call has zeroed counters (the runtime's arena has them), else by a second launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import triton
import triton.language as tl

from ...kernel_utils import (allow_dependent_launch, cdiv, CompileCase, CONSTEXPR, launch,
                             persistent_grid, row_offsets, sigmoid, use_pdl, wait_for_prior_kernel)
from ...reduction import finish_in_groups, sum_partials_in_groups
from .philox import split_int64


@dataclass(frozen=True)
class HstuConfig:
    block_d: int
    block_rows: int
    num_warps: int
    programs_per_sm: int = 2
    num_stages: int = 2
    max_registers: int | None = None   # ptxas cap, so that more programs fit on an SM


def forward_config(d: int) -> HstuConfig:
    """8 values per thread. From sweeps on an H200 (docs/perf/hstu.md, HSTU v6):
    - D <= 256: tiles of 2048 elements, 8 warps, three programs per SM (70 registers: all
      resident), 4 stages. At D=256 a cap of 80 registers measured 1-2% faster in three sweeps
      (with 4 stages 51.9 us; uncapped with 3 stages 53.7);
    - D=512: tiles of two rows, 4 warps, five per SM, 4 stages (104.7 us; 3 stages 106.4; tiles
      of four rows on 8 warps 117.1: a row's two warps now wait at the barriers for each other
      only);
    - larger D: not swept."""
    block_d = triton.next_power_of_2(d)
    if block_d == 512:
        return HstuConfig(block_d, 2, 4, programs_per_sm=5, num_stages=4)
    rows = max(1, 2048 // block_d)
    if block_d <= 256:
        return HstuConfig(block_d, rows, 8, programs_per_sm=3, num_stages=4,
                          max_registers=80 if block_d == 256 else None)
    return HstuConfig(block_d, rows, max(8, min(16, block_d * rows // 256)), programs_per_sm=2,
                      num_stages=3)


def backward_config(d: int) -> HstuConfig:
    block_d = triton.next_power_of_2(d)
    rows = max(1, 2048 // block_d)
    return HstuConfig(block_d, rows, max(4, min(16, block_d * rows // 512)), num_stages=3)


# rows of partials whose loads the backward's last programs issue together, by BLOCK_D (the
# plan sums in one launch up to D=512): the most for which ptxas (Triton 3.9's, compile_check)
# leaves the kernel at 255 registers without spilling; more spilled in the main loop (11 local
# loads an iteration at D=128 with 8 rows)
_FINISH_UNROLL = {512: 8}


def finish_unroll(block_d: int) -> int:
    return _FINISH_UNROLL.get(block_d, 2)


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
def _columns_and_affine(W, B, D: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Both kernels' prologue: the column range, its mask, and weight and bias as FP32, read
    once the prior kernel's writes are visible."""
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    wait_for_prior_kernel(PDL)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    return cols, col_mask, w, b


@triton.jit
def _load_bf16_pairs(BASE, rows, stride, row_mask, D: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_ROWS: tl.constexpr):
    """A [BLOCK_ROWS, BLOCK_D] tile of BF16 as FP32, read as 32-bit pairs: widening is then one
    shift or one AND per value, where the compiler's conversion takes two for odd columns."""
    pair_cols = tl.arange(0, BLOCK_D // 2)
    # row strides are multiples of 8 elements, so of 4 pairs
    offsets = tl.multiple_of(rows * (stride // 2), 4)[:, None] + pair_cols[None, :]
    pairs = tl.load(BASE.to(tl.pointer_type(tl.int32), bitcast=True) + offsets,
                    mask=row_mask[:, None] & (pair_cols < D // 2)[None, :], other=0)
    low = (pairs << 16).to(tl.float32, bitcast=True)
    high = (pairs & -65536).to(tl.float32, bitcast=True)
    return tl.reshape(tl.join(low, high), [BLOCK_ROWS, BLOCK_D])


@triton.jit
def _store_row_stats(MEAN, RSTD, rows, row_mask, mean, rstd, cols, BLOCK_D: tl.constexpr,
                     HARDWARE: tl.constexpr):
    """Stores mean and rstd [ROWS] from the thread that holds column 0 of each row: tl.store
    would first move them to a layout of their own, through shared memory and three barriers
    per tile."""
    if HARDWARE:
        shape: tl.constexpr = [rows.shape[0], BLOCK_D]
        first = ((cols[None, :] == 0) & row_mask[:, None]).to(tl.int32)
        # pack=8: one call per run of eight columns, decided by the run's first element
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $16, 0; @p st.global.b32 [$8], $24; "
            "@p st.global.b32 [$32], $40; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
            "mov.b32 $3, 0; mov.b32 $4, 0; mov.b32 $5, 0; mov.b32 $6, 0; mov.b32 $7, 0; }",
            "=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,f,f,f,f,f,f,f,f,"
            "l,l,l,l,l,l,l,l,f,f,f,f,f,f,f,f",
            [tl.broadcast_to((MEAN + rows).to(tl.int64)[:, None], shape), first,
             tl.broadcast_to(mean[:, None], shape),
             tl.broadcast_to((RSTD + rows).to(tl.int64)[:, None], shape),
             tl.broadcast_to(rstd[:, None], shape)],
            dtype=tl.int32, is_pure=False, pack=8)
    else:
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)


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
def _split8(t, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Columns 8o + j of t [ROWS, BLOCK_D] as eight tensors [ROWS, BLOCK_D // 8], j = 0..7 (each
    thread holds whole runs of eight columns, so this only renames registers)."""
    t = tl.reshape(t, [ROWS, BLOCK_D // 8, 2, 2, 2])   # [.., a, b, c]: column 4a + 2b + c
    even, odd = tl.split(t)
    e0, e1 = tl.split(even)
    o0, o1 = tl.split(odd)
    c0, c4 = tl.split(e0)
    c2, c6 = tl.split(e1)
    c1, c5 = tl.split(o0)
    c3, c7 = tl.split(o1)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _join8(c0, c1, c2, c3, c4, c5, c6, c7, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The inverse of _split8."""
    even = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    odd = tl.join(tl.join(c1, c5), tl.join(c3, c7))
    return tl.reshape(tl.join(even, odd), [ROWS, BLOCK_D])


@triton.jit
def _octet_words(q, seed, offset):
    """The twelve Philox words of octets q (runs of eight columns, numbered row-major): three
    calls at counters 3q, 3q + 1, 3q + 2 (the layout philox.dropout_mask spells out)."""
    q3 = q * 3
    c2 = (tl.zeros(q3.shape, tl.int64) + (offset & 0xFFFFFFFF)).to(tl.uint32)
    c3 = (tl.zeros(q3.shape, tl.int64) + ((offset >> 32) & 0xFFFFFFFF)).to(tl.uint32)
    w0, w1, w2, w3 = _philox4x32_10((q3 & 0xFFFFFFFF).to(tl.uint32), (q3 >> 32).to(tl.uint32),
                                    c2, c3, seed)
    q = q3 + 1
    w4, w5, w6, w7 = _philox4x32_10((q & 0xFFFFFFFF).to(tl.uint32), (q >> 32).to(tl.uint32),
                                    c2, c3, seed)
    q = q3 + 2
    w8, w9, w10, w11 = _philox4x32_10((q & 0xFFFFFFFF).to(tl.uint32), (q >> 32).to(tl.uint32),
                                      c2, c3, seed)
    return w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11


@triton.jit
def _kept(word, HIGH: tl.constexpr, THRESHOLD: tl.constexpr):
    """Whether the 16-bit draw in the low or high half of ``word`` keeps its element (draw >=
    THRESHOLD), compared in place: high >= T is word >= T << 16, and low >= T is
    word << 16 >= T << 16."""
    limit = tl.full((), THRESHOLD * 65536, tl.uint32)
    if HIGH:
        return word >= limit
    return (word << 16) >= limit


@triton.jit
def _dropout_column(y_u, y_x, y_l, word_a, word_b, ODD: tl.constexpr, THRESHOLD: tl.constexpr,
                    SCALE: tl.constexpr):
    """Dropout of column j of each octet: (y_u, y_x, y_l, mask code), kept values scaled by
    SCALE = 1/(1 - p).
    Column j takes draws 3j, 3j + 1, 3j + 2: for even j the low and high halves of word 3j/2
    and the low half of the next word, for odd j the high half of word (3j - 1)/2 and both
    halves of the next."""
    if ODD:
        keep_l = _kept(word_a, True, THRESHOLD)
        keep_x = _kept(word_b, False, THRESHOLD)
        keep_u = _kept(word_b, True, THRESHOLD)
    else:
        keep_l = _kept(word_a, False, THRESHOLD)
        keep_x = _kept(word_a, True, THRESHOLD)
        keep_u = _kept(word_b, False, THRESHOLD)
    code = keep_l.to(tl.int8) | (keep_x.to(tl.int8) << 1) | (keep_u.to(tl.int8) << 2)
    # a factor of 1/(1 - p) or 0 (one select, one product per value): tl.where on the value
    # lets the compiler move the choice past the BF16 conversion, onto packed halves
    return (y_u * tl.where(keep_u, SCALE, 0.0), y_x * tl.where(keep_x, SCALE, 0.0),
            y_l * tl.where(keep_l, SCALE, 0.0), code)


@triton.jit
def _dropout_tile(y_u, y_x, y_l, rows, seed, offset, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  ROWS: tl.constexpr, THRESHOLD: tl.constexpr, SCALE: tl.constexpr):
    """Dropout of the three segments of a [ROWS, BLOCK_D] tile: the tiles split by column
    within each octet, so that every value meets its draws in the thread that made them;
    returns the three segments and the int8 mask (all three bits; the caller clears those of
    disabled segments)."""
    index = rows[:, None].to(tl.int64) * D + tl.arange(0, BLOCK_D)[None, :]
    first, _, _, _, _, _, _, _ = _split8(index, ROWS, BLOCK_D)
    w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11 = _octet_words(first >> 3, seed, offset)
    u0, u1, u2, u3, u4, u5, u6, u7 = _split8(y_u, ROWS, BLOCK_D)
    x0, x1, x2, x3, x4, x5, x6, x7 = _split8(y_x, ROWS, BLOCK_D)
    l0, l1, l2, l3, l4, l5, l6, l7 = _split8(y_l, ROWS, BLOCK_D)
    u0, x0, l0, k0 = _dropout_column(u0, x0, l0, w0, w1, False, THRESHOLD, SCALE)
    u1, x1, l1, k1 = _dropout_column(u1, x1, l1, w1, w2, True, THRESHOLD, SCALE)
    u2, x2, l2, k2 = _dropout_column(u2, x2, l2, w3, w4, False, THRESHOLD, SCALE)
    u3, x3, l3, k3 = _dropout_column(u3, x3, l3, w4, w5, True, THRESHOLD, SCALE)
    u4, x4, l4, k4 = _dropout_column(u4, x4, l4, w6, w7, False, THRESHOLD, SCALE)
    u5, x5, l5, k5 = _dropout_column(u5, x5, l5, w7, w8, True, THRESHOLD, SCALE)
    u6, x6, l6, k6 = _dropout_column(u6, x6, l6, w9, w10, False, THRESHOLD, SCALE)
    u7, x7, l7, k7 = _dropout_column(u7, x7, l7, w10, w11, True, THRESHOLD, SCALE)
    return (_join8(u0, u1, u2, u3, u4, u5, u6, u7, ROWS, BLOCK_D),
            _join8(x0, x1, x2, x3, x4, x5, x6, x7, ROWS, BLOCK_D),
            _join8(l0, l1, l2, l3, l4, l5, l6, l7, ROWS, BLOCK_D),
            _join8(k0, k1, k2, k3, k4, k5, k6, k7, ROWS, BLOCK_D))


@triton.jit(do_not_specialize=["n_rows", "stride_x", "stride_u", "stride_y", "seed_lo",
                               "seed_hi", "off_lo", "off_hi"])
def _hstu_fwd_kernel(X, U, W, B, Y, MEAN, RSTD, MASK, SEED, OFFSET, n_rows,
                     stride_x, stride_u, stride_y, seed_lo, seed_hi, off_lo, off_hi, eps,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     SILU: tl.constexpr, CONCAT_U: tl.constexpr, CONCAT_X: tl.constexpr,
                     DROPOUT: tl.constexpr, THRESHOLD: tl.constexpr, SCALE: tl.constexpr,
                     SEED_FROM_TENSORS: tl.constexpr, NUM_STAGES: tl.constexpr,
                     PDL: tl.constexpr, HARDWARE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols, col_mask, w, b = _columns_and_affine(W, B, D, BLOCK_D, PDL)
    seed, offset = _seed_and_offset(SEED, OFFSET, seed_lo, seed_hi, off_lo, off_hi,
                                    SEED_FROM_TENSORS)
    SEGMENT_BITS: tl.constexpr = 1 | (2 if CONCAT_X else 0) | (4 if CONCAT_U else 0)
    first = pid.to(tl.int64) * BLOCK_ROWS
    for r0 in tl.range(first, n_rows, programs * BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = r0 + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        x = _load_bf16_pairs(X, rows, stride_x, row_mask, D, BLOCK_D, BLOCK_ROWS)
        u = _load_bf16_pairs(U, rows, stride_u, row_mask, D, BLOCK_D, BLOCK_ROWS)
        # two passes over the registers: E[x^2] - E[x]^2 loses the variance of rows whose mean
        # is large against their spread (0.5 +- 1e-3: 0.5% off in rstd)
        mean = tl.sum(x, axis=1) / D
        centered = tl.where(col_mask[None, :], x - mean[:, None], 0.0)
        var = tl.sum(centered * centered, axis=1) / D
        rstd = tl.math.rsqrt(var + eps)
        xhat = centered * rstd[:, None]
        if SILU:
            a = u * sigmoid(u, HARDWARE)
        else:
            a = u
        y_u = a
        y_x = x
        y_l = (xhat * w[None, :] + b[None, :]) * a
        if DROPOUT:
            y_u, y_x, y_l, code = _dropout_tile(y_u, y_x, y_l, rows, seed, offset, D, BLOCK_D,
                                                BLOCK_ROWS, THRESHOLD, SCALE)
            tl.store(MASK + rows[:, None] * D + cols[None, :], code & SEGMENT_BITS, mask=mask)
        y_row = Y + row_offsets(rows, stride_y) + cols[None, :]
        segment = 0
        if CONCAT_U:
            tl.store(y_row, y_u.to(Y.dtype.element_ty), mask=mask)
            segment += 1
        if CONCAT_X:
            tl.store(y_row + segment * D, y_x.to(Y.dtype.element_ty), mask=mask)
            segment += 1
        tl.store(y_row + segment * D, y_l.to(Y.dtype.element_ty), mask=mask)
        _store_row_stats(MEAN, RSTD, rows, row_mask, mean, rstd, cols, BLOCK_D, HARDWARE)
    allow_dependent_launch(PDL)


# COUNTERS: any 4-byte-aligned word of the arena's counter map, so its alignment is not part
# of the specialization
@triton.jit(do_not_specialize=["n_rows", "stride_dy", "stride_x", "stride_u", "stride_dx",
                               "stride_du", "COUNTERS"])
def _hstu_bwd_kernel(DY, X, U, W, B, MEAN, RSTD, MASK, DX, DU, PARTIAL, COUNTERS, DW, DB,
                     n_rows, stride_dy, stride_x, stride_u, stride_dx, stride_du,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     SILU: tl.constexpr, CONCAT_U: tl.constexpr, CONCAT_X: tl.constexpr,
                     DROPOUT: tl.constexpr, SCALE: tl.constexpr, COMPUTE_DW: tl.constexpr,
                     NUM_STAGES: tl.constexpr, PDL: tl.constexpr, FINISH: tl.constexpr,
                     FINISH_UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols, col_mask, w, b = _columns_and_affine(W, B, D, BLOCK_D, PDL)
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
    if FINISH:   # dweight and dbias summed here, not by a second launch
        if COMPUTE_DW:
            finish_in_groups(PARTIAL, COUNTERS, DW, DB, pid, programs, cols, col_mask, D,
                             BLOCK_D, True, FINISH_UNROLL)
        else:
            finish_in_groups(PARTIAL + programs.to(tl.int64) * D, COUNTERS, DB, DB, pid,
                             programs, cols, col_mask, D, BLOCK_D, False, FINISH_UNROLL)


def launch_forward(cfg: HstuConfig, sm_count: int, x, u, weight, bias, y, mean, rstd, mask,
                   seed, offset, n_rows: int, strides, eps: float, flags: dict, threshold: int,
                   scale: float) -> None:
    """strides: row strides of x, u, y. seed/offset: ints, or one-element int64 tensors."""
    if n_rows == 0:
        return
    from_tensors = not isinstance(seed, int)
    seed_lo, seed_hi = (0, 0) if from_tensors else split_int64(seed)
    off_lo, off_hi = (0, 0) if from_tensors else split_int64(offset)
    seed_ptr, off_ptr = (seed, offset) if from_tensors else (mean, mean)
    dropout = mask is not None
    programs = persistent_grid(cdiv(n_rows, cfg.block_rows),
                               sm_count * cfg.programs_per_sm)
    pdl = use_pdl(x)
    launch(_hstu_fwd_kernel, (programs,),
        x, u, weight, bias, y, mean, rstd, mask if dropout else mean, seed_ptr, off_ptr, n_rows,
        *strides, seed_lo, seed_hi, off_lo, off_hi, eps, D=weight.shape[0],
        BLOCK_D=cfg.block_d, BLOCK_ROWS=cfg.block_rows, SILU=flags["apply_u_silu"],
        CONCAT_U=flags["concat_u"], CONCAT_X=flags["concat_x"], DROPOUT=dropout,
        THRESHOLD=threshold, SCALE=scale, SEED_FROM_TENSORS=from_tensors,
        NUM_STAGES=cfg.num_stages, PDL=pdl, HARDWARE=x.is_cuda, launch_pdl=pdl,
        num_warps=cfg.num_warps, maxnreg=cfg.max_registers)


def launch_backward(cfg: HstuConfig, programs: int, dy, x, u, weight, bias, mean, rstd, mask,
                    dx, du, dweight, dbias, partial, counters, n_rows: int, strides,
                    flags: dict, scale: float) -> None:
    """partial: FP32 [2, programs, D] (dweight rows, then dbias rows), then the grouped order's
    [2, groups, D]; strides of dy, x, u, dx, du. ``counters`` (zeroed int32 words, see
    ``reduction.finish_in_groups``) or None: then the sums take a second launch."""
    d = weight.shape[0]
    compute_dw = dweight is not None
    pdl = use_pdl(x)
    launch(_hstu_bwd_kernel, (programs,),
        dy, x, u, weight, bias, mean, rstd, mask if mask is not None else mean, dx, du, partial,
        counters if counters is not None else partial, dweight if compute_dw else dbias, dbias,
        n_rows, *strides, D=d, BLOCK_D=cfg.block_d, BLOCK_ROWS=cfg.block_rows,
        SILU=flags["apply_u_silu"], CONCAT_U=flags["concat_u"], CONCAT_X=flags["concat_x"],
        DROPOUT=mask is not None, SCALE=scale, COMPUTE_DW=compute_dw,
        NUM_STAGES=cfg.num_stages, PDL=pdl, FINISH=counters is not None,
        FINISH_UNROLL=finish_unroll(cfg.block_d), launch_pdl=pdl,
        num_warps=cfg.num_warps)
    if counters is not None:
        return
    if compute_dw:
        sum_partials_in_groups(partial, [dweight, dbias], programs)
    else:
        sum_partials_in_groups(partial[programs * d:], [dbias], programs)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles, at the benchmark's D = 512: the forward
    with dropout (seed given as ints or read from tensors) and without, the backward."""
    from ..registry import op
    _, d = op("hstu_lmsd_forward").cases[1]
    c = CONSTEXPR
    cases = [CompileCase(f"hstu fwd dropout={dropout} tensor_seed={from_tensors}",
                         _hstu_fwd_kernel, dict(
        X="*bf16", U="*bf16", W="*bf16", B="*bf16", Y="*bf16", MEAN="*fp32", RSTD="*fp32",
        MASK="*i8", SEED="*i64", OFFSET="*i64", n_rows="i32", stride_x="i32", stride_u="i32",
        stride_y="i32", seed_lo="i32", seed_hi="i32", off_lo="i32", off_hi="i32", eps="fp32",
        D=c, BLOCK_D=c, BLOCK_ROWS=c, SILU=c, CONCAT_U=c, CONCAT_X=c, DROPOUT=c, THRESHOLD=c,
        SCALE=c, SEED_FROM_TENSORS=c, NUM_STAGES=c, PDL=c, HARDWARE=c),
        dict(D=d, BLOCK_D=d, BLOCK_ROWS=4, SILU=concat, CONCAT_U=concat, CONCAT_X=concat,
             DROPOUT=dropout, THRESHOLD=6553, SCALE=1 / 0.9, SEED_FROM_TENSORS=from_tensors,
             NUM_STAGES=3, PDL=True, HARDWARE=True), num_warps=8)
        for dropout, from_tensors, concat in ((True, False, True), (True, True, True),
                                              (False, False, False))]
    # the backward at its plan's configuration: without the finish (a second launch sums),
    # and with it where the finish's rows in flight meet the kernel's register limit
    for bwd_d, finish in ((d, False), (128, True), (d, True)):
        cfg = backward_config(bwd_d)
        cases.append(CompileCase(f"hstu bwd d={bwd_d} finish={finish}", _hstu_bwd_kernel, dict(
            DY="*bf16", X="*bf16", U="*bf16", W="*bf16", B="*bf16", MEAN="*fp32", RSTD="*fp32",
            # without the finish, the launch passes the partials where the counters go
            MASK="*i8", DX="*bf16", DU="*bf16", PARTIAL="*fp32",
            COUNTERS="*i32" if finish else "*fp32", DW="*bf16",
            DB="*bf16", n_rows="i32", stride_dy="i32", stride_x="i32", stride_u="i32",
            stride_dx="i32", stride_du="i32", D=c, BLOCK_D=c, BLOCK_ROWS=c, SILU=c, CONCAT_U=c,
            CONCAT_X=c, DROPOUT=c, SCALE=c, COMPUTE_DW=c, NUM_STAGES=c, PDL=c, FINISH=c,
            FINISH_UNROLL=c),
            dict(D=bwd_d, BLOCK_D=cfg.block_d, BLOCK_ROWS=cfg.block_rows, SILU=True,
                 CONCAT_U=True, CONCAT_X=True, DROPOUT=True, SCALE=1 / 0.9, COMPUTE_DW=True,
                 NUM_STAGES=cfg.num_stages, PDL=True, FINISH=finish,
                 FINISH_UNROLL=finish_unroll(cfg.block_d)), num_warps=cfg.num_warps))
    return cases
