"""Warp-specialized Hopper kernel (Gluon) for projection GEMM + RoPE + dual-direction MXFP8.

A persistent program loops over tiles of 128 tokens x one whole head. Four partitions share it:
- the loader (1 warp) streams x and the head's nope and rope rows of W through TMA into a ring
  of shared-memory stages;
- two MMA partitions (a warpgroup each, 64 tokens of the tile each) run the products with wgmma,
  hand the FP32 tile to the epilogue through shared memory and go on to the next tile;
- the epilogue (8 warps) rotates the rope features, quantizes both directions and stores, while
  the MMA partitions already compute the next tile.

The epilogue reads the staged tile in two layouts: 16 features of one token per thread for the
rowwise blocks and 16 tokens of one feature per thread for the columnwise blocks, so each block
maximum is 15 comparisons in a thread and one shuffle. Hopper only (Blackwell has no wgmma and
runs the Triton head kernel). The shapes and the register split are the H200 sweep's best; see
docs/perf/proj.md for what was measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ...gluon_api import cta_barrier, tma_load
from ...kernel_utils import (cdiv, CompileCase, CONSTEXPR, gluon_descriptor, gluon_descriptor_type,
                             launch, ON_TESTED_TRITON, register_share, untested_triton_case)
from ...validate import sm_count
from . import kernels as _triton_kernels

# The E8M0 scale helpers are the Triton kernels' own, compiled as Gluon functions.
_abs_bits = gluon.jit(_triton_kernels._abs_bits.fn)
_block_exponent = gluon.jit(_triton_kernels._block_exponent.fn)
_quant_factor = gluon.jit(_triton_kernels._quant_factor.fn)

BLOCK_M = gl.constexpr(128)        # tokens per tile: two warpgroups of 64, four blocks of 32
EPILOGUE_WARPS = gl.constexpr(8)   # the epilogue's layouts assume 8
# Warps launched: one MMA warpgroup (the default partition), the loader's warp padded to a
# warpgroup, the other MMA warpgroup, the epilogue.
LAUNCH_WARPS = 4 + 4 + 4 + EPILOGUE_WARPS.value
LAUNCH_REGS = register_share(LAUNCH_WARPS)


@gluon.jit
def _tile_origin(tile, t_blocks, D: gl.constexpr):
    """First token and first feature (head * D) of a tile; a head's token tiles run in order."""
    return (tile % t_blocks) * BLOCK_M, (tile // t_blocks) * D


@gluon.jit
def _load_partition(descs, bufs, ready, empty, tokens, HEADS: gl.constexpr, NOPE: gl.constexpr,
                    ROPE: gl.constexpr, W_OUT_IN: gl.constexpr):
    x_desc, wn_desc, wr_desc = descs
    x_bufs, wn_bufs, wr_bufs = bufs
    STAGES: gl.constexpr = x_bufs.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    NBYTES: gl.constexpr = (x_desc.block_type.nbytes + wn_desc.block_type.nbytes
                            + wr_desc.block_type.nbytes)
    k_total = x_desc.shape[1]
    t_blocks = gl.cdiv(tokens, BLOCK_M)
    i = 0
    for tile in range(gl.program_id(0), t_blocks * HEADS, gl.num_programs(0)):
        t0, n0 = _tile_origin(tile, t_blocks, NOPE + ROPE)
        for k in range(0, k_total, BLOCK_K):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)   # fresh barriers pass phase 1
            bar = ready.index(s)
            mbarrier.expect(bar, NBYTES)
            tma_load(x_desc, [t0, k], bar, x_bufs.index(s))
            if W_OUT_IN:
                tma_load(wn_desc, [n0, k], bar, wn_bufs.index(s))
                tma_load(wr_desc, [n0 + NOPE, k], bar, wr_bufs.index(s))
            else:
                tma_load(wn_desc, [k, n0], bar, wn_bufs.index(s))
                tma_load(wr_desc, [k, n0 + NOPE], bar, wr_bufs.index(s))
            i += 1


@gluon.jit
def _mma_partition(bufs, ready, empty, staged, staged_bars, k_total, tokens, HEADS: gl.constexpr,
                   NOPE: gl.constexpr, ROPE: gl.constexpr, W_OUT_IN: gl.constexpr,
                   ROW0: gl.constexpr):
    """One warpgroup's products: tokens ROW0 .. ROW0 + 63 of each tile. The two warpgroups are
    separate partitions, so neither waits for the other between steps."""
    x_bufs, wn_bufs, wr_bufs = bufs
    nope_stage, rope_stage = staged
    staged_full, staged_free = staged_bars
    STAGES: gl.constexpr = x_bufs.shape[0]
    BLOCK_K: gl.constexpr = x_bufs.shape[2]
    nope_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NOPE, 16])
    rope_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROPE, 16])
    acc_nope = gl.zeros([64, NOPE], gl.float32, nope_layout)
    acc_rope = gl.zeros([64, ROPE], gl.float32, rope_layout)
    my_nope = nope_stage.reshape([128, NOPE]).slice(ROW0, 64, dim=0)
    my_rope = rope_stage.reshape([128, ROPE]).slice(ROW0, 64, dim=0)
    t_blocks = gl.cdiv(tokens, BLOCK_M)
    i = 0
    n = 0
    for tile in range(gl.program_id(0), t_blocks * HEADS, gl.num_programs(0)):
        for k in range(0, k_total, BLOCK_K):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            x = x_bufs.index(s).slice(ROW0, 64, dim=0)
            if W_OUT_IN:
                w_nope = wn_bufs.index(s).permute((1, 0))
                w_rope = wr_bufs.index(s).permute((1, 0))
            else:
                w_nope = wn_bufs.index(s)
                w_rope = wr_bufs.index(s)
            acc_nope = warpgroup_mma(x, w_nope, acc_nope, use_acc=k > 0, is_async=True)
            acc_rope = warpgroup_mma(x, w_rope, acc_rope, use_acc=k > 0, is_async=True)
            # This warpgroup's products of the previous step are done: release its stage (each
            # stage's barrier counts both warpgroups).
            acc_nope, acc_rope = warpgroup_mma_wait(num_outstanding=2, deps=(acc_nope, acc_rope))
            cta_barrier()
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=k > 0)
            i += 1
        acc_nope, acc_rope = warpgroup_mma_wait(num_outstanding=0, deps=(acc_nope, acc_rope))
        cta_barrier()
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES))
        mbarrier.wait(staged_free, (n & 1) ^ 1)
        cta_barrier()   # (as in the epilogue: for racecheck)
        my_nope.store(acc_nope)
        my_rope.store(acc_rope)
        cta_barrier()
        mbarrier.arrive(staged_full)
        n += 1


@gluon.jit
def _token_index(t0, layout: gl.constexpr):
    """Tokens of a [4, 32, 1] tile view (token block, token in block) in ``layout``'s slices."""
    b = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    r = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    return t0 + gl.expand_dims(gl.expand_dims(b * 32, 1), 2) + gl.expand_dims(gl.expand_dims(r, 0), 2)


@gluon.jit
def _feature_index(WIDTH: gl.constexpr, layout: gl.constexpr):
    f = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    return gl.expand_dims(gl.expand_dims(f, 0), 1)


@gluon.jit
def _columnwise_scales(view, scales, COL_S, tb, tb_ok, feature0, N_TOTAL: gl.constexpr,
                       by_col: gl.constexpr):
    """E8M0 exponents of one 32-feature chunk ``view`` [4, 32, 32] of the staged tile, one per 32
    tokens of a feature: bytes to COL_S, the factors 2^-e (NaN for the NaN scale) to ``scales``
    [4, 32]."""
    e = _block_exponent(gl.max(_abs_bits(view.load(by_col)), axis=1))
    scales.store(_quant_factor(e))
    f = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, by_col)))
    at = gl.expand_dims(tb.to(gl.int64) * N_TOTAL, 1) + gl.expand_dims(feature0 + f, 0)
    gl.store(COL_S + at, (e + 127).to(gl.uint8), mask=tb_ok)


@gluon.jit
def _quantize_chunk(view, scales, ROW, ROW_S, COL, row_at, ok, scale_at, scale_ok,
                    by_row: gl.constexpr):
    """Both directions' E4M3 bytes of one chunk [4, 32, 32], read in ``by_row`` (half a token's 32
    features per thread): the rowwise exponent from the token's 32 features, the columnwise
    scales from ``scales`` [4, 32]."""
    v = view.load(by_row)
    e = _block_exponent(gl.max(_abs_bits(v), axis=2))
    q = v * gl.expand_dims(_quant_factor(e), 2)
    gl.store(ROW + row_at, q.to(gl.float8e4nv).to(gl.uint8, bitcast=True), mask=ok)
    gl.store(ROW_S + scale_at, (e + 127).to(gl.uint8), mask=scale_ok)
    q = v * gl.expand_dims(scales.load(gl.SliceLayout(1, by_row)), 1)
    gl.store(COL + row_at, q.to(gl.float8e4nv).to(gl.uint8, bitcast=True), mask=ok)


@gluon.jit
def _epilogue_partition(staged, col_scales, staged_bars, outs, rope_tables, tokens,
                        HEADS: gl.constexpr, NOPE: gl.constexpr, ROPE: gl.constexpr):
    nope_stage, rope_stage = staged
    staged_full, staged_free = staged_bars
    ROW, ROW_S, COL, COL_S = outs
    COS, SIN = rope_tables
    D: gl.constexpr = NOPE + ROPE
    N_TOTAL: gl.constexpr = HEADS * D
    HALF: gl.constexpr = ROPE // 2
    # Views [token block, token, feature] of a 32-feature chunk, two warps per token block:
    # by_row gives a thread 16 features of one token (rowwise blocks, RoPE), by_col 16 tokens of
    # one feature (columnwise blocks); the other half is in the neighbouring thread.
    by_row: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 16, 2], [4, 2, 1], [2, 1, 0])
    by_col: gl.constexpr = gl.BlockedLayout([1, 16, 1], [1, 2, 16], [4, 1, 2], [2, 1, 0])
    rope_rows: gl.constexpr = gl.BlockedLayout([1, 1, HALF // 2], [1, 16, 2], [4, 2, 1], [2, 1, 0])
    pair_rows: gl.constexpr = gl.BlockedLayout([1, 1, HALF // 2, 2], [1, 16, 2, 1], [4, 2, 1, 1],
                                               [3, 2, 1, 0])
    t_blocks = gl.cdiv(tokens, BLOCK_M)
    n = 0
    for tile in range(gl.program_id(0), t_blocks * HEADS, gl.num_programs(0)):
        t0, n0 = _tile_origin(tile, t_blocks, D)
        # cos and sin do not depend on the products: load them before waiting for the tile.
        t = _token_index(t0, rope_rows)
        ok = t < tokens
        at = t.to(gl.int64) * ROPE + _feature_index(HALF, rope_rows)
        cos1 = gl.load(COS + at, mask=ok, other=0.0).to(gl.float32)
        sin1 = gl.load(SIN + at, mask=ok, other=0.0).to(gl.float32)
        cos2 = gl.load(COS + at + HALF, mask=ok, other=0.0).to(gl.float32)
        sin2 = gl.load(SIN + at + HALF, mask=ok, other=0.0).to(gl.float32)
        mbarrier.wait(staged_full, n & 1)
        cta_barrier()   # (orders nothing the barrier wait does not; racecheck needs it)
        # RoPE in place: interleaved (x1, x2) pairs in, rotated halves out.
        pairs = rope_stage.reshape([4, 32, HALF, 2]).load(pair_rows)
        x1, x2 = gl.split(pairs)
        x1 = gl.convert_layout(x1, rope_rows)
        x2 = gl.convert_layout(x2, rope_rows)
        cta_barrier()   # the two threads of a row read each other's outputs' places
        rope_stage.slice(0, HALF, dim=2).store(x1 * cos1 - x2 * sin1)
        rope_stage.slice(HALF, HALF, dim=2).store(x2 * cos2 + x1 * sin2)
        cta_barrier()
        # Columnwise: one exponent per 32 tokens of a feature.
        tb = t0 // 32 + gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(1, by_col)))
        tb_ok = gl.expand_dims(tb < tokens // 32, 1)
        for c in gl.static_range(NOPE // 32):
            _columnwise_scales(nope_stage.slice(c * 32, 32, dim=2), col_scales.index(c), COL_S,
                               tb, tb_ok, n0 + c * 32, N_TOTAL, by_col)
        for c in gl.static_range(ROPE // 32):
            _columnwise_scales(rope_stage.slice(c * 32, 32, dim=2), col_scales.index(NOPE // 32 + c),
                               COL_S, tb, tb_ok, n0 + NOPE + c * 32, N_TOTAL, by_col)
        cta_barrier()
        # Rowwise blocks, and the columnwise values with the scales just computed.
        t = _token_index(t0, by_row)
        ok = t < tokens
        row_at = t.to(gl.int64) * N_TOTAL + n0 + _feature_index(32, by_row)
        tok = gl.max(t, axis=2)                       # [4, 32]: each row's token
        scale_at = tok.to(gl.int64) * (N_TOTAL // 32) + n0 // 32
        scale_ok = tok < tokens
        for c in gl.static_range(NOPE // 32):
            _quantize_chunk(nope_stage.slice(c * 32, 32, dim=2), col_scales.index(c), ROW, ROW_S,
                            COL, row_at + c * 32, ok, scale_at + c, scale_ok, by_row)
        for c in gl.static_range(ROPE // 32):
            _quantize_chunk(rope_stage.slice(c * 32, 32, dim=2), col_scales.index(NOPE // 32 + c),
                            ROW, ROW_S, COL, row_at + NOPE + c * 32, ok,
                            scale_at + NOPE // 32 + c, scale_ok, by_row)
        cta_barrier()
        mbarrier.arrive(staged_free)
        n += 1


@gluon.jit(do_not_specialize=["tokens"])
def _proj_rope_ws_kernel(x_desc, wn_desc, wr_desc, COS, SIN, ROW, ROW_S, COL, COL_S, tokens,
                         HEADS: gl.constexpr, NOPE: gl.constexpr, ROPE: gl.constexpr,
                         W_OUT_IN: gl.constexpr, STAGES: gl.constexpr, MMA_REGS: gl.constexpr,
                         EPILOGUE_REGS: gl.constexpr, num_warps: gl.constexpr):
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    wn_bufs = gl.allocate_shared_memory(wn_desc.dtype, [STAGES] + wn_desc.block_type.shape, wn_desc.layout)
    wr_bufs = gl.allocate_shared_memory(wr_desc.dtype, [STAGES] + wr_desc.block_type.shape, wr_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)   # one arrival per MMA warpgroup
    # Row-major FP32 tile views [token block, token, feature]; 16-byte units XOR-swizzled by row
    # so that a warp's 32 rows at one column, or 32 columns of one row, hit distinct banks.
    stage_layout: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [2, 1, 0])
    nope_stage = gl.allocate_shared_memory(gl.float32, [4, 32, NOPE], stage_layout)
    rope_stage = gl.allocate_shared_memory(gl.float32, [4, 32, ROPE], stage_layout)
    col_scales = gl.allocate_shared_memory(gl.float32, [(NOPE + ROPE) // 32, 4, 32],
                                           gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    staged_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    staged_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(staged_full, count=2)
    mbarrier.init(staged_free, count=1)

    bufs = (x_bufs, wn_bufs, wr_bufs)
    staged = (nope_stage, rope_stage)
    staged_bars = (staged_full, staged_free)
    gl.warp_specialize([
        (_mma_partition, (bufs, ready, empty, staged, staged_bars, x_desc.shape[1], tokens, HEADS,
                          NOPE, ROPE, W_OUT_IN, 0)),
        (_load_partition, ((x_desc, wn_desc, wr_desc), bufs, ready, empty, tokens, HEADS, NOPE,
                           ROPE, W_OUT_IN)),
        (_mma_partition, (bufs, ready, empty, staged, staged_bars, x_desc.shape[1], tokens, HEADS,
                          NOPE, ROPE, W_OUT_IN, 64)),
        (_epilogue_partition, (staged, col_scales, staged_bars, (ROW, ROW_S, COL, COL_S),
                               (COS, SIN), tokens, HEADS, NOPE, ROPE)),
    ], [1, 4, EPILOGUE_WARPS], [24, MMA_REGS, EPILOGUE_REGS])


@dataclass(frozen=True)
class WsConfig:
    block_k: int
    stages: int
    mma_regs: int
    epilogue_regs: int


WS_CONFIG = WsConfig(block_k=64, stages=3, mma_regs=128, epilogue_regs=96)


# Gluon is experimental and its API moves (graphrt.gluon_api spells what moved between 3.6 and
# 3.9): the kernel runs on the Tritons it was tested with; others get the head kernel.
GLUON_API_OK = ON_TESTED_TRITON


def fits_ws_kernel(k: int, nope: int, rope: int) -> bool:
    """The warp-specialized kernel's shapes (on a Hopper GPU, with a tested Triton): K % 8 == 0
    (16-byte TMA rows), power-of-two nope and rope dims of at least 32, nope + rope <= 192 (the
    staged FP32 tile and the operand ring share the 227 KB of shared memory)."""
    def pow2(v):
        return v >= 32 and v & (v - 1) == 0
    return GLUON_API_OK and k % 8 == 0 and pow2(nope) and pow2(rope) and nope + rope <= 192


def launch_ws(cfg: WsConfig, x, w, cos, sin, row, row_s, col, col_s, *, tokens: int, k: int,
              heads: int, nope: int, rope: int, w_out_in: bool) -> None:
    """The warp-specialized kernel on BF16 x and w; outputs are uint8 views of the float8 tensors."""
    if tokens == 0:
        return
    bk = cfg.block_k
    x_desc = gluon_descriptor(x, [BLOCK_M.value, bk])
    if w_out_in:
        wn_desc, wr_desc = gluon_descriptor(w, [nope, bk]), gluon_descriptor(w, [rope, bk])
    else:
        wn_desc, wr_desc = gluon_descriptor(w, [bk, nope]), gluon_descriptor(w, [bk, rope])
    tiles = cdiv(tokens, BLOCK_M.value) * heads
    launch(_proj_rope_ws_kernel, (min(tiles, sm_count(x.device)),), x_desc, wn_desc, wr_desc,
           cos, sin, row, row_s, col, col_s, tokens, HEADS=heads, NOPE=nope, ROPE=rope,
           W_OUT_IN=w_out_in, STAGES=cfg.stages, MMA_REGS=cfg.mma_regs,
           EPILOGUE_REGS=cfg.epilogue_regs, num_warps=4, maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: the warp-specialized kernel for W
    [out, in] and [in, out] at the benchmark's shape."""
    from ..registry import op
    _, _, heads, nope, rope = op("gemm_proj_rope_mxfp8").cases[0]
    c, cfg = CONSTEXPR, WS_CONFIG

    def desc(block):
        return gluon_descriptor_type(block, torch.bfloat16)

    cases = []
    for w_out_in in (True, False):
        name = f"proj warp-specialized w_out_in={w_out_in}"
        if not GLUON_API_OK:
            cases.append(untested_triton_case(name))
            continue
        w_blocks = ([128, 64], [64, 64]) if w_out_in else ([64, 128], [64, 64])
        cases.append(CompileCase(name, _proj_rope_ws_kernel, dict(
            x_desc=desc([128, 64]), wn_desc=desc(w_blocks[0]), wr_desc=desc(w_blocks[1]),
            COS="*bf16", SIN="*bf16", ROW="*u8", ROW_S="*u8", COL="*u8", COL_S="*u8",
            tokens="i32", HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, STAGES=c, MMA_REGS=c,
            EPILOGUE_REGS=c, num_warps=c),
            dict(HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, STAGES=cfg.stages,
                 MMA_REGS=cfg.mma_regs, EPILOGUE_REGS=cfg.epilogue_regs, num_warps=4),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    return cases
