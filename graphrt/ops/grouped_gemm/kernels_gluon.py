"""Hopper kernel (Gluon, Triton 3.6) for the FP8 grouped wgrad with block scales: the tensor
cores multiply one block of tokens while the CUDA cores scale another.

Triton keeps a dot asynchronous only when its result feeds nothing but the next dot, so the
Triton kernel (kernels.py) waits for every block's product before scaling it, and a [128, 64]
tile (the largest it runs well) reads 24 KB per 2 MFLOP block: L2 bandwidth bounds it near
700 TFLOP/s on the H200. Here a persistent program is warp-specialized:
- a loader warp streams each block's A [128, 128] and B^T [BLOCK_N, 128] codes through TMA into
  a ring of shared-memory stages;
- two MMA warpgroups (64 output rows each, separate partitions, so neither waits for the
  other) multiply each block on its own (``use_acc=False``) and scale the product into their
  FP32 sum: while one scales, the other's product can run.
A block the expert shares with a neighbour (its first and last, when they are not whole) is
loaded whole and the other tokens are zeroed in shared memory in both operands (each warpgroup
its half, joined by a barrier), so no neighbour's value (NaN included) reaches the sum.

For the 1x128 recipe (FP32 scales per 128 tokens) the plan runs it for the calls
``fits_gluon_kernel`` accepts (tokens_sum % 16 == 0, 16-byte aligned operands, Hopper, Triton
3.6), the Triton kernel otherwise. On the H200 it runs at 775-800 TFLOP/s against the Triton
kernel's 684-729 at the first benchmark case (docs/perf/wgrad.md). With E8M0 scales per 32
tokens (MXFP8) each staged block is multiplied in four 32-token products, each waited for and
scaled: correct on the H200 but slower than the Triton kernel (315 against 345 TFLOP/s), so
the plan does not run it. ``scripts/sweep_wgrad.py --fp8`` times both.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from ...kernel_utils import (cdiv, CompileCase, CONSTEXPR, gluon_descriptor, gluon_descriptor_type,
                             launch, ON_TESTED_TRITON, pow2, register_share, TL_DTYPES)
from ...validate import sm_count
from . import kernels as _triton_kernels

BLOCK_M = gl.constexpr(128)   # two warpgroups of 64 rows
BLOCK_K = gl.constexpr(128)   # the scale block
GROUP_M = 8
GLUON_API_OK = ON_TESTED_TRITON   # written for Triton 3.6's Gluon, whose API moves
# Warps launched: an MMA warpgroup (the default partition), the loader's warp padded to a
# warpgroup, the other MMA warpgroup; setmaxnreg moves the loader's registers to the MMA ones.
LAUNCH_REGS = register_share(4 + 4 + 4)
LOADER_REGS, MMA_REGS = gl.constexpr(24), gl.constexpr(232)


@dataclass(frozen=True)
class GluonConfig:
    """Output columns per tile (128 output rows) and shared-memory stages."""

    block_n: int = 128
    stages: int = 6


GLUON_CONFIG = GluonConfig()

# The program's tile, its expert's bounds (with their checks) and the output store are the
# Triton kernels' own code, compiled as Gluon functions: both kernels walk tiles, flag bad
# offsets and write alike.
_tile_origin = gluon.jit(_triton_kernels._tile_origin.fn)
_expert_tokens = gluon.jit(_triton_kernels._expert_tokens.fn)
_store_tile = gluon.jit(_triton_kernels._store_tile.fn)   # its tensors carry their layouts
_pow2 = gluon.jit(pow2.fn)
MX_BLOCK = gl.constexpr(32)   # tokens per E8M0 scale (MXFP8)


@gluon.jit
def _work(work, OFFSETS, ERRORS, experts, tokens_sum, FLAG: gl.constexpr, HIDDEN: gl.constexpr,
          INTER: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr):
    """Work item ``work`` (experts outermost): its expert, first row and column, and the
    expert's tokens; FLAG: this partition reports bad offsets (one does)."""
    tiles: gl.constexpr = gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN)
    expert = work // tiles
    tile = work % tiles
    m0, n0 = _tile_origin(tile, HIDDEN, INTER, BLOCK_M, BN, GROUP)
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, experts, FLAG & (tile == 0),
                                  tokens_sum)
    return expert, m0, n0, begin, begin + count


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS, experts,
                    tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr, GROUP: gl.constexpr):
    STAGES: gl.constexpr = a_bufs.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    work_items = experts * (gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN))
    i = 0
    for work in range(gl.program_id(0), work_items, gl.num_programs(0)):
        expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, False,
                                           HIDDEN, INTER, BN, GROUP)
        for block in range(begin // BLOCK_K, (end + BLOCK_K - 1) // BLOCK_K):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)   # fresh barriers pass phase 1
            bar = ready.index(s)
            mbarrier.expect(bar, NBYTES)
            k0 = (block * BLOCK_K).to(gl.int32)
            tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [n0, k0], bar, b_bufs.index(s))
            i += 1


@gluon.jit
def _zero_outside(buf, lo, hi, k0, ROWS: gl.constexpr, COLS: gl.constexpr):
    """Zeroes the tokens (columns) of a staged [ROWS, COLS] block outside [lo, hi), in place,
    and makes the writes visible to the tensor cores (one warpgroup's share)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    codes = buf.load(layout)
    k = k0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    keep = (k >= lo) & (k < hi)
    buf.store(gl.where(keep[None, :], codes, gl.zeros_like(codes)))
    fence_async_shared()


@gluon.jit
def _block_scales(A_SCALE, B_SCALE, block, valid, m, n, sa_m, sa_k, sb_k, sb_n,
                  HIDDEN: gl.constexpr, INTER: gl.constexpr):
    """a_scale[m, block] and b_scale[block, n] (zeros where not ``valid``), loaded in the
    layouts of ``m`` and ``n``."""
    sa = gl.load(A_SCALE + m.to(gl.int64) * sa_m + block * sa_k, mask=(m < HIDDEN) & valid,
                 other=0.0)
    sb = gl.load(B_SCALE + block * sb_k + n.to(gl.int64) * sb_n, mask=(n < INTER) & valid,
                 other=0.0)
    return sa, sb


@gluon.jit
def _scale_values(A_SCALE, B_SCALE, q, valid, m, n, sa_m, sa_k, sb_k, sb_n,
                  HIDDEN: gl.constexpr, INTER: gl.constexpr, MX: gl.constexpr):
    """``_block_scales`` of scale block ``q`` as FP32 values: E8M0 bytes decoded to 2^(s - 127)
    when ``MX`` (2^-127 where not ``valid``), FP32 scales as loaded (0 where not ``valid``)."""
    sa, sb = _block_scales(A_SCALE, B_SCALE, q, valid, m, n, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                           INTER)
    if MX:
        sa, sb = _pow2(sa.to(gl.int32) - 127), _pow2(sb.to(gl.int32) - 127)
    return sa, sb


@gluon.jit
def _stage_ready(a_bufs, b_bufs, ready, zeroed, i, z, block, begin, end, ROW0: gl.constexpr):
    """Waits for the i-th stage the loader filled (block ``block``) and zeroes its tokens
    outside [begin, end) when the expert shares the block (both operands; each warpgroup its
    A rows and half of B's, joined by a barrier): (the stage, the zeroings so far)."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    BN: gl.constexpr = b_bufs.shape[1]
    HALF_N: gl.constexpr = BN // 2
    B_ROW0: gl.constexpr = ROW0 // 64 * HALF_N   # this warpgroup's half of B's rows to zero
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    k0 = block * BLOCK_K
    lo = gl.maximum(begin, k0)
    hi = gl.minimum(end, k0 + BLOCK_K)
    if (lo > k0) | (hi < k0 + BLOCK_K):
        _zero_outside(a_bufs.index(s).slice(ROW0, 64, dim=0), lo, hi, k0, 64, BLOCK_K)
        _zero_outside(b_bufs.index(s).slice(B_ROW0, HALF_N, dim=0), lo, hi, k0, HALF_N,
                      BLOCK_K)
        gl.thread_barrier()
        mbarrier.arrive(zeroed)
        mbarrier.wait(zeroed, z & 1)
        z += 1
    return s, z


@gluon.jit
def _spread(sa_flat, sb_flat, layout: gl.constexpr):
    """A block's scales, loaded one value a thread, in the product's row and column layouts
    (through shared memory)."""
    return (gl.convert_layout(sa_flat, gl.SliceLayout(1, layout)),
            gl.convert_layout(sb_flat, gl.SliceLayout(0, layout)))


@gluon.jit
def _release(empty, i):
    """Gives the i-th filled stage back to the loader, once this warpgroup's product of it
    has finished."""
    gl.thread_barrier()
    mbarrier.arrive(empty.index(i % empty.shape[0]))


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                   OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n,
                   HIDDEN: gl.constexpr, INTER: gl.constexpr, DISCRETE: gl.constexpr,
                   ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr, GROUP: gl.constexpr,
                   MX: gl.constexpr, ROW0: gl.constexpr):
    """One warpgroup: output rows ROW0 .. ROW0 + 63 of each tile.

    A block's scales are loaded one value a thread (64 + BLOCK_N values over 128 threads) and
    spread through shared memory to the threads that scale the product: each thread loading
    the 34 it uses, with their 64-bit addresses, made the kernel issue-bound (460-490 TFLOP/s
    against 705). The loads for the expert's next block are issued while this block's
    product runs (705 -> 797 TFLOP/s). MX (E8M0 scales per 32 tokens): each staged block is
    multiplied in four 32-token products, each scaled as it finishes."""
    BN: gl.constexpr = b_bufs.shape[1]
    if MX:
        SCALE_TOKENS: gl.constexpr = MX_BLOCK
    else:
        SCALE_TOKENS: gl.constexpr = BLOCK_K
    SUBS: gl.constexpr = BLOCK_K // SCALE_TOKENS   # scale blocks (products) a staged block
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    work_items = experts * (gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN))
    i = 0
    z = 0
    for work in range(gl.program_id(0), work_items, gl.num_programs(0)):
        expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum,
                                           ROW0 == 0, HIDDEN, INTER, BN, GROUP)
        m = m0 + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        m_flat = m0 + ROW0 + gl.arange(0, 64, layout=flat)
        n_flat = n0 + gl.arange(0, BN, layout=flat)
        total = gl.zeros([64, BN], gl.float32, layout)
        first = begin // BLOCK_K
        last = (end + BLOCK_K - 1) // BLOCK_K
        # scale blocks q_first .. q_last - 1 hold the expert's tokens (none when it is empty:
        # an empty expert inside a block still runs that block, on zeroed tokens, and its
        # scales load as 0 (1x128) or 2^-127 (MXFP8), so that a neighbour's NaN or infinite
        # scale leaves its zeros alone)
        q_first = begin // SCALE_TOKENS
        q_last = gl.where(end > begin, (end + SCALE_TOKENS - 1) // SCALE_TOKENS, q_first)
        q = first * SUBS
        sa_next, sb_next = _scale_values(A_SCALE, B_SCALE, q, (q >= q_first) & (q < q_last),
                                         m_flat, n_flat, sa_m, sa_k, sb_k, sb_n, HIDDEN, INTER,
                                         MX)
        for block in range(first, last):
            s, z = _stage_ready(a_bufs, b_bufs, ready, zeroed, i, z, block, begin, end, ROW0)
            for j in gl.static_range(SUBS):
                issued = warpgroup_mma(
                    a_bufs.index(s).slice(ROW0, 64, dim=0).slice(j * SCALE_TOKENS, SCALE_TOKENS,
                                                                 dim=1),
                    b_bufs.index(s).slice(j * SCALE_TOKENS, SCALE_TOKENS, dim=1).permute((1, 0)),
                    gl.zeros([64, BN], gl.float32, layout), use_acc=False, is_async=True)
                sa_flat, sb_flat = sa_next, sb_next
                q = block * SUBS + j + 1
                sa_next, sb_next = _scale_values(A_SCALE, B_SCALE, q,
                                                 (q >= q_first) & (q < q_last), m_flat, n_flat,
                                                 sa_m, sa_k, sb_k, sb_n, HIDDEN, INTER, MX)
                sa, sb = _spread(sa_flat, sb_flat, layout)
                done = warpgroup_mma_wait(num_outstanding=0, deps=(issued,))
                if j == SUBS - 1:
                    _release(empty, i)
                total += done * sa[:, None] * sb[None, :]
            i += 1
        if ACCUMULATE:
            if end > begin:
                _store_tile(total, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE,
                            ACCUMULATE, OUT_DTYPE)
        else:
            _store_tile(total, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                        OUT_DTYPE)


@gluon.jit(do_not_specialize=["experts", "tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_fp8_ws_kernel(a_desc, b_desc, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS,
                         experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN: gl.constexpr,
                         INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                         OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                         MX: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    zeroed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)   # one arrival per MMA warpgroup
    mbarrier.init(zeroed, count=2)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                          OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                          INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, GROUP, MX, 0)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS,
                           experts, tokens_sum, HIDDEN, INTER, GROUP)),
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                          OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                          INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, GROUP, MX, 64)),
    ], [1, 4], [LOADER_REGS, MMA_REGS])


# -- MXFP8 on BF16 tensor cores ------------------------------------------------------------------
# E4M3 codes times E8M0 scales are exact in BF16, so a converting warpgroup can turn each staged
# FP8 block into scaled BF16 operands (zeroing tokens outside the expert as it goes) and the MMA
# warps sum the expert's BF16 products without any per-block scaling, as the BF16 kernel does.
MX_STEP = gl.constexpr(64)   # tokens a step: two E8M0 scale blocks


@dataclass(frozen=True)
class MxConfig:
    """Output columns per tile (128 rows), FP8 stages (loader -> converter) and BF16 stages
    (converter -> MMA warps) of the MXFP8 kernel; ``split``: the MMA warps convert A
    themselves and the converting warpgroup only B."""

    block_n: int = 128
    fp8_stages: int = 4
    bf16_stages: int = 3
    split: bool = True


MX_CONFIG = MxConfig()
# Warps: the converter (the default partition, at the launch's share), the loader padded to a
# warpgroup, the MMA warps (8); setmaxnreg moves the loader's registers to the MMA warps.
MX_LAUNCH_REGS = register_share(4 + 4 + 8)
MX_LOADER_REGS, MX_MMA_REGS = gl.constexpr(24), gl.constexpr(176)


@gluon.jit
def _mx_load_partition(a_desc, b_desc, a8, b8, ready8, empty8, OFFSETS, ERRORS, experts,
                       tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                       GROUP: gl.constexpr):
    STAGES: gl.constexpr = a8.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    work_items = experts * (gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN))
    i = 0
    for work in range(gl.program_id(0), work_items, gl.num_programs(0)):
        expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, False,
                                           HIDDEN, INTER, BN, GROUP)
        for step in range(begin // MX_STEP, (end + MX_STEP - 1) // MX_STEP):
            s = i % STAGES
            mbarrier.wait(empty8.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready8.index(s)
            mbarrier.expect(bar, NBYTES)
            k0 = (step * MX_STEP).to(gl.int32)
            tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a8.index(s))
            tma.async_copy_global_to_shared(b_desc, [n0, k0], bar, b8.index(s))
            i += 1


@gluon.jit
def _mx_scale_codes(SCALE, rows, row_stride, block_stride, q, end, ROWS: gl.constexpr):
    """The rows' E8M0 scale bytes of block ``q`` (127, a scale of 1, for blocks at or past the
    expert's end, which may be past the last scale block)."""
    return gl.load(SCALE + rows.to(gl.int64) * row_stride + q * block_stride,
                   mask=(rows < ROWS) & (q * MX_BLOCK < end), other=127)


@gluon.jit
def _mx_convert_half(src, dst, e, q, begin, end, layout: gl.constexpr):
    """One 32-token half of a staged operand: codes [ROWS, 32] times their rows' E8M0 scales
    ``e`` (of block ``q``), tokens outside [begin, end) zeroed, stored as BF16."""
    codes = src.load(layout)
    values = codes.to(gl.float32) * _pow2(e.to(gl.int32) - 127)[:, None]
    k0 = q * MX_BLOCK
    if (k0 < begin) | (k0 + MX_BLOCK > end):   # the expert's first or last block
        k = k0 + gl.arange(0, MX_BLOCK, layout=gl.SliceLayout(0, layout))
        values = gl.where(((k >= begin) & (k < end))[None, :], values, 0.0)
    dst.store(values.to(gl.bfloat16))


@gluon.jit
def _mx_convert_step(src, dst, e0, e1, step, begin, end, layout: gl.constexpr):
    """Both 32-token halves of one staged operand (scale bytes ``e0``, ``e1``) into BF16."""
    _mx_convert_half(src.slice(0, MX_BLOCK, dim=1), dst.slice(0, MX_BLOCK, dim=1), e0, 2 * step,
                     begin, end, layout)
    _mx_convert_half(src.slice(MX_BLOCK, MX_BLOCK, dim=1), dst.slice(MX_BLOCK, MX_BLOCK, dim=1),
                     e1, 2 * step + 1, begin, end, layout)


@gluon.jit
def _mx_convert_partition(a8, b8, a16, b16, ready8, empty8, ready16, empty16, A_SCALE, B_SCALE,
                          OFFSETS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n,
                          HIDDEN: gl.constexpr, INTER: gl.constexpr, GROUP: gl.constexpr,
                          SPLIT: gl.constexpr):
    """Converts each staged step's B (and A unless ``SPLIT``) into the BF16 stages. Each
    step's scale bytes are loaded a step ahead, so that their latency runs under the previous
    step's conversion (203-215 -> 273-280 TFLOP/s)."""
    S8: gl.constexpr = a8.shape[0]
    S16: gl.constexpr = a16.shape[0]
    BN: gl.constexpr = b8.shape[1]
    # a row a thread (one scale each); 8 tokens a thread, 4 threads a row, ran slower (2026-12-02:
    # 175-183 TFLOP/s against 203-215): four scale loads a thread instead of one
    rows_a: gl.constexpr = gl.BlockedLayout([1, 32], [32, 1], [4, 1], [1, 0])
    rows_b: gl.constexpr = gl.BlockedLayout([BN // 128, 32], [32, 1], [4, 1], [1, 0])
    work_items = experts * (gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN))
    i = 0
    for work in range(gl.program_id(0), work_items, gl.num_programs(0)):
        expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, False,
                                           HIDDEN, INTER, BN, GROUP)
        m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_a))
        n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, rows_b))
        q = begin // MX_STEP * 2
        if not SPLIT:
            ea0 = _mx_scale_codes(A_SCALE, m, sa_m, sa_k, q, end, HIDDEN)
            ea1 = _mx_scale_codes(A_SCALE, m, sa_m, sa_k, q + 1, end, HIDDEN)
        eb0 = _mx_scale_codes(B_SCALE, n, sb_n, sb_k, q, end, INTER)
        eb1 = _mx_scale_codes(B_SCALE, n, sb_n, sb_k, q + 1, end, INTER)
        for step in range(begin // MX_STEP, (end + MX_STEP - 1) // MX_STEP):
            s8 = i % S8
            s16 = i % S16
            q = 2 * step + 2
            if not SPLIT:
                na0 = _mx_scale_codes(A_SCALE, m, sa_m, sa_k, q, end, HIDDEN)
                na1 = _mx_scale_codes(A_SCALE, m, sa_m, sa_k, q + 1, end, HIDDEN)
            nb0 = _mx_scale_codes(B_SCALE, n, sb_n, sb_k, q, end, INTER)
            nb1 = _mx_scale_codes(B_SCALE, n, sb_n, sb_k, q + 1, end, INTER)
            mbarrier.wait(ready8.index(s8), (i // S8) & 1)
            mbarrier.wait(empty16.index(s16), ((i // S16) & 1) ^ 1)
            if not SPLIT:
                _mx_convert_step(a8.index(s8), a16.index(s16), ea0, ea1, step, begin, end,
                                 rows_a)
                ea0, ea1 = na0, na1
            _mx_convert_step(b8.index(s8), b16.index(s16), eb0, eb1, step, begin, end, rows_b)
            eb0, eb1 = nb0, nb1
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(empty8.index(s8))
            mbarrier.arrive(ready16.index(s16))
            i += 1


@gluon.jit
def _mx_mma_partition(a8, a16, b16, ready8, empty8, ready16, empty16, A_SCALE, OFFSETS, OUT,
                      OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, HIDDEN: gl.constexpr,
                      INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                      OUT_DTYPE: gl.constexpr, GROUP: gl.constexpr, SPLIT: gl.constexpr):
    """Both MMA warpgroups (8 warps, 64 rows each): the expert's BF16 products summed on the
    tensor cores, one product in flight while the previous one's stage is given back; with
    ``SPLIT`` they first convert each step's A themselves (its BF16 stage is free: the
    product that read it, S16 >= 2 steps back, has finished)."""
    S8: gl.constexpr = a8.shape[0]
    S16: gl.constexpr = a16.shape[0]
    BN: gl.constexpr = b16.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, BN, 16])
    rows_a: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [8, 1], [1, 0])
    work_items = experts * (gl.cdiv(HIDDEN, BLOCK_M) * gl.cdiv(INTER, BN))
    i = 0
    for work in range(gl.program_id(0), work_items, gl.num_programs(0)):
        expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, True,
                                           HIDDEN, INTER, BN, GROUP)
        m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        acc = gl.zeros([BLOCK_M, BN], gl.float32, layout)
        first = begin // MX_STEP
        last = (end + MX_STEP - 1) // MX_STEP
        if SPLIT:
            m_rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_a))
            ea0 = _mx_scale_codes(A_SCALE, m_rows, sa_m, sa_k, 2 * first, end, HIDDEN)
            ea1 = _mx_scale_codes(A_SCALE, m_rows, sa_m, sa_k, 2 * first + 1, end, HIDDEN)
        for step in range(first, last):
            s = i % S16
            if SPLIT:
                na0 = _mx_scale_codes(A_SCALE, m_rows, sa_m, sa_k, 2 * step + 2, end, HIDDEN)
                na1 = _mx_scale_codes(A_SCALE, m_rows, sa_m, sa_k, 2 * step + 3, end, HIDDEN)
                s8 = i % S8
                mbarrier.wait(ready8.index(s8), (i // S8) & 1)
                _mx_convert_step(a8.index(s8), a16.index(s), ea0, ea1, step, begin, end, rows_a)
                ea0, ea1 = na0, na1
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(empty8.index(s8))
            mbarrier.wait(ready16.index(s), (i // S16) & 1)
            acc = warpgroup_mma(a16.index(s), b16.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if step > first:   # the previous step's product has finished, in both warpgroups
                _release(empty16, i + S16 - 1)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if last > first:
            _release(empty16, i + S16 - 1)
        if ACCUMULATE:
            if end > begin:
                _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE,
                            ACCUMULATE, OUT_DTYPE)
        else:
            _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                        OUT_DTYPE)


@gluon.jit(do_not_specialize=["experts", "tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_mxfp8_kernel(a_desc, b_desc, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS,
                        experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN: gl.constexpr,
                        INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                        OUT_DTYPE: gl.constexpr, S8: gl.constexpr, S16: gl.constexpr,
                        GROUP: gl.constexpr, SPLIT: gl.constexpr):
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a8 = gl.allocate_shared_memory(a_desc.dtype, [S8] + a_desc.block_type.shape, a_desc.layout)
    b8 = gl.allocate_shared_memory(b_desc.dtype, [S8] + b_desc.block_type.shape, b_desc.layout)
    a16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, MX_STEP],
                                                                    gl.bfloat16)
    b16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, MX_STEP], gl.bfloat16)
    a16 = gl.allocate_shared_memory(gl.bfloat16, [S16, BLOCK_M, MX_STEP], a16_layout)
    b16 = gl.allocate_shared_memory(gl.bfloat16, [S16, BN, MX_STEP], b16_layout)
    ready8 = gl.allocate_shared_memory(gl.int64, [S8, 1], mbarrier.MBarrierLayout())
    empty8 = gl.allocate_shared_memory(gl.int64, [S8, 1], mbarrier.MBarrierLayout())
    ready16 = gl.allocate_shared_memory(gl.int64, [S16, 1], mbarrier.MBarrierLayout())
    empty16 = gl.allocate_shared_memory(gl.int64, [S16, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(S8):
        mbarrier.init(ready8.index(s), count=1)
        mbarrier.init(empty8.index(s), count=2 if SPLIT else 1)   # the readers of the stage
    for s in gl.static_range(S16):
        mbarrier.init(ready16.index(s), count=1)
        mbarrier.init(empty16.index(s), count=1)
    gl.warp_specialize([
        (_mx_convert_partition, (a8, b8, a16, b16, ready8, empty8, ready16, empty16, A_SCALE,
                                 B_SCALE, OFFSETS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k,
                                 sb_n, HIDDEN, INTER, GROUP, SPLIT)),
        (_mx_load_partition, (a_desc, b_desc, a8, b8, ready8, empty8, OFFSETS, ERRORS, experts,
                              tokens_sum, HIDDEN, INTER, GROUP)),
        (_mx_mma_partition, (a8, a16, b16, ready8, empty8, ready16, empty16, A_SCALE, OFFSETS,
                             OUT, OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, HIDDEN,
                             INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, GROUP, SPLIT)),
    ], [1, 8], [MX_LOADER_REGS, MX_MMA_REGS])


def launch_wgrad_mxfp8_gluon(a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype, errors,
                             *, hidden: int, inter: int, accumulate: bool,
                             config: MxConfig = MX_CONFIG) -> None:
    """MXFP8 (uint8 E8M0 scales per 32 tokens) through the BF16-product kernel: arguments as
    ``launch_wgrad_fp8_gluon``'s, on operands ``fits_gluon_kernel`` accepts."""
    experts = offsets.numel()
    if experts == 0:
        return
    a_desc = gluon_descriptor(a, [BLOCK_M.value, MX_STEP.value])
    b_desc = gluon_descriptor(b.t(), [config.block_n, MX_STEP.value])
    work = cdiv(hidden, BLOCK_M.value) * cdiv(inter, config.block_n) * experts
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    launch(_wgrad_mxfp8_kernel, (min(work, sm_count(a.device)),), a_desc, b_desc, a_scale,
           b_scale, offsets, out_arg, ptrs_arg, errors, experts, a.shape[1], a_scale.stride(0),
           a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), HIDDEN=hidden, INTER=inter,
           DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate, OUT_DTYPE=TL_DTYPES[out_dtype],
           S8=config.fp8_stages, S16=config.bf16_stages, GROUP=GROUP_M, SPLIT=config.split,
           num_warps=4, maxnreg=MX_LAUNCH_REGS)


def fits_gluon_kernel(a, b, capability) -> bool:
    """Whether this kernel takes these FP8 operands: a Hopper GPU, Triton 3.6, both
    tokens-major, tokens_sum a positive multiple of 16, rows 16-byte strided and 16-byte
    aligned bases (TMA's rows and addresses)."""
    return (GLUON_API_OK and capability is not None and capability[0] == 9
            and a.stride(1) == 1 and b.stride(0) == 1 and a.shape[1] > 0
            and a.shape[1] % 16 == 0 and a.stride(0) % 16 == 0 and b.stride(1) % 16 == 0
            and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)


def launch_wgrad_fp8_gluon(a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype, errors,
                           *, hidden: int, inter: int, accumulate: bool,
                           config: GluonConfig | MxConfig | None = None) -> None:
    """The FP8 wgrad on Hopper: arguments as kernels.launch_wgrad_fp8's (a (hidden, T) and b
    (T, intermediate) both tokens-major; FP32 scales per 128 tokens, or uint8 E8M0 per 32), on
    operands ``fits_gluon_kernel`` accepts. By default 1x128 runs the FP8-product kernel and
    MXFP8 the BF16-product one; a ``GluonConfig`` picks the FP8-product kernel for either."""
    if config is None:
        config = MX_CONFIG if a_scale.dtype == torch.uint8 else GLUON_CONFIG
    if isinstance(config, MxConfig):
        launch_wgrad_mxfp8_gluon(a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype,
                                 errors, hidden=hidden, inter=inter, accumulate=accumulate,
                                 config=config)
        return
    experts = offsets.numel()
    if experts == 0:
        return
    a_desc = gluon_descriptor(a, [BLOCK_M.value, BLOCK_K.value])
    b_desc = gluon_descriptor(b.t(), [config.block_n, BLOCK_K.value])
    work = cdiv(hidden, BLOCK_M.value) * cdiv(inter, config.block_n) * experts
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    launch(_wgrad_fp8_ws_kernel, (min(work, sm_count(a.device)),), a_desc, b_desc, a_scale,
           b_scale, offsets, out_arg, ptrs_arg, errors, experts, a.shape[1], a_scale.stride(0),
           a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), HIDDEN=hidden, INTER=inter,
           DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate, OUT_DTYPE=TL_DTYPES[out_dtype],
           STAGES=config.stages, GROUP=GROUP_M, MX=a_scale.dtype == torch.uint8, num_warps=4,
           maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: dense and discrete output at the first
    benchmark case's sizes, for FP32 scales per 128 tokens (the plan's) and E8M0 scales per 32
    (MXFP8, which the plan does not run here yet)."""
    import triton

    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for mx, discrete in itertools.product((False, True), (False, True)):
        name = f"wgrad fp8 {'mxfp8' if mx else '1x128'} (Gluon) discrete={discrete}"
        if not GLUON_API_OK:
            cases.append(CompileCase(name, None, {}, {}, skip=f"written for Triton 3.6, this is "
                                                             f"{triton.__version__}"))
            continue
        fp8 = torch.float8_e4m3fn
        scale = "*u8" if mx else "*fp32"
        cases.append(CompileCase(name, _wgrad_fp8_ws_kernel, dict(
            a_desc=gluon_descriptor_type([BLOCK_M.value, BLOCK_K.value], fp8),
            b_desc=gluon_descriptor_type([GLUON_CONFIG.block_n, BLOCK_K.value], fp8),
            A_SCALE=scale, B_SCALE=scale, OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64",
            ERRORS="*i32", experts="i32", tokens_sum="i32", sa_m="i32", sa_k="i32", sb_k="i32",
            sb_n="i32", HIDDEN=c, INTER=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, STAGES=c,
            GROUP=c, MX=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=False,
                 OUT_DTYPE=gl.bfloat16, STAGES=GLUON_CONFIG.stages, GROUP=GROUP_M, MX=mx),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    for discrete, split in ((False, True), (True, True), (False, False)):
        name = f"wgrad mxfp8 BF16 products (Gluon) discrete={discrete} split={split}"
        if not GLUON_API_OK:
            cases.append(CompileCase(name, None, {}, {}, skip=f"written for Triton 3.6, this is "
                                                             f"{triton.__version__}"))
            continue
        fp8 = torch.float8_e4m3fn
        cases.append(CompileCase(name, _wgrad_mxfp8_kernel, dict(
            a_desc=gluon_descriptor_type([BLOCK_M.value, MX_STEP.value], fp8),
            b_desc=gluon_descriptor_type([MX_CONFIG.block_n, MX_STEP.value], fp8),
            A_SCALE="*u8", B_SCALE="*u8", OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64",
            ERRORS="*i32", experts="i32", tokens_sum="i32", sa_m="i32", sa_k="i32", sb_k="i32",
            sb_n="i32", HIDDEN=c, INTER=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, S8=c, S16=c,
            GROUP=c, SPLIT=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=False,
                 OUT_DTYPE=gl.bfloat16, S8=MX_CONFIG.fp8_stages, S16=MX_CONFIG.bf16_stages,
                 GROUP=GROUP_M, SPLIT=split),
            num_warps=4, maxnreg=MX_LAUNCH_REGS, gluon=True))
    return cases
