"""Hopper kernel (Gluon; Triton 3.6, 3.7 and 3.9) for the 1x128 FP8 grouped wgrad: the tensor cores
multiply one block of 128 tokens while the CUDA cores scale another.

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

The plan runs it for the calls ``fits_gluon_kernel`` accepts (tokens_sum % 16 == 0, 16-byte
aligned operands, Hopper, a tested Triton), the Triton kernel otherwise. Since it reads each
item's bounds and first scales ahead (2026-12-06) it beats the Triton kernel at every shape
timed, 128 to 4096 tokens an expert (an H100: 1.10-1.18x at the three benchmark cases, up to
1.40x at 128 tokens an expert), and takes 0.87-0.96x BF16 K-K's time there
(docs/perf/wgrad.md); ``scripts/sweep_wgrad.py --fp8`` times its configurations,
``--fp8-choice`` the plan with either kernel. MXFP8 (E8M0 scales per 32 tokens) stays with the
Triton kernel: the same design with four 32-token products a block ran at 315 TFLOP/s against
its 345 (2026-12-02), and was taken out again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from ...gluon_api import cta_barrier, tma_load
from ...kernel_utils import (cdiv, CompileCase, CONSTEXPR, gluon_descriptor, gluon_descriptor_type,
                             launch, ON_TESTED_TRITON, register_share, TL_DTYPES,
                             untested_triton_case)
from ...validate import sm_count
from . import kernels as _triton_kernels

BLOCK_M = gl.constexpr(128)   # two warpgroups of 64 rows
BLOCK_K = gl.constexpr(128)   # the scale block
GROUP_M = 8
GLUON_API_OK = ON_TESTED_TRITON   # Gluon's API moves: the Tritons these kernels were tested with
# Warps launched: an MMA warpgroup (the default partition), the loader's warp padded to a
# warpgroup, the other MMA warpgroup; setmaxnreg moves the loader's registers to the MMA ones.
LAUNCH_REGS = register_share(4 + 4 + 4)
LOADER_REGS = gl.constexpr(24)


@dataclass(frozen=True)
class GluonConfig:
    """Output columns per tile (128 output rows) and shared-memory stages. A ``block_n`` that
    is no power of two (192) is multiplied as two products, the largest power of two below it
    and the rest, from the same A rows; ``mma_regs``: the registers setmaxnreg gives an MMA
    thread (the loader keeps 24); ``late_spread``: a block's scales are spread after its
    product is waited for, not while it runs (fewer registers live across the wait);
    ``shared_spread``: a block's row and column scales are spread through the warpgroup's own
    shared buffers with one barrier (a convert_layout per vector takes three in all)."""

    block_n: int = 128
    stages: int = 6
    mma_regs: int = 232
    late_spread: bool = False
    shared_spread: bool = False


GLUON_CONFIG = GluonConfig()

# The program's tile, its expert's bounds (with their checks) and the output store are the
# Triton kernels' own code, compiled as Gluon functions: both kernels walk tiles, flag bad
# offsets and write alike.
_tile_origin = gluon.jit(_triton_kernels._tile_origin.fn)
_expert_tokens = gluon.jit(_triton_kernels._expert_tokens.fn)
_store_tile = gluon.jit(_triton_kernels._store_tile.fn)   # its tensors carry their layouts

# the order of the experts and the snake, written as Triton code in kernels.py so that the
# interpreter tests them (vectors in the layouts the caller gives)
_ranks_and_taken = gluon.jit(_triton_kernels._ranks_and_taken.fn)
EVERY_EXPERT, TMA_FIRST = _triton_kernels.EVERY_EXPERT, _triton_kernels.TMA_FIRST
_tma_takes = gluon.jit(_triton_kernels._tma_takes.fn)
_bounds_at = gluon.jit(_triton_kernels._bounds_at.fn)
_expert_at_rank = gluon.jit(_triton_kernels._expert_at_rank.fn)
_snake = gluon.jit(_triton_kernels._snake.fn)


@gluon.jit
def _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2: gl.constexpr,
                  WARPS: gl.constexpr, CHUNK: gl.constexpr, SHARE: gl.constexpr,
                  ODD_TAKEN=False):
    """(ranks, idx, taken): every expert's rank by count, largest first, over the calling
    partition's WARPS warps, the experts compared CHUNK at a time in each thread's registers;
    SHARE (kernels.EVERY_EXPERT, TMA_FIRST) and ODD_TAKEN as ``_ranks_by_count`` takes them.
    ``taken``: how many experts the kernel takes (the ranks before those SHARE ranks last)."""
    pairs: gl.constexpr = gl.BlockedLayout([1, CHUNK], [32, 1], [WARPS, 1], [1, 0])
    idx = gl.arange(0, EXPERTS_POW2, layout=gl.SliceLayout(1, pairs))
    others = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, pairs))
    ranks, taken = _ranks_and_taken(OFFSETS, idx, others, experts, tokens_sum, SHARE, ODD_TAKEN)
    return ranks, idx, taken


@gluon.jit
def _offsets_in_order(OFFSETS, experts, tokens_sum, EXPERTS_POW2: gl.constexpr,
                      WARPS: gl.constexpr):
    """Whether every expert's bounds are valid (kernels._offsets_in_order), over the calling
    partition's WARPS warps."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    _, _, bad = _bounds_at(OFFSETS, gl.arange(0, EXPERTS_POW2, layout=layout), experts,
                           tokens_sum)
    return gl.sum(bad.to(gl.int32), axis=0) == 0


@gluon.jit
def _sorted_position(round_, ranks, idx, taken, TILES: gl.constexpr):
    """This program's item in round ``round_`` of a split over the ``taken`` experts ranked
    first, TILES items each, the programs' order reversed every round: whether there is one,
    its expert and its tile."""
    position = _snake(round_, gl.program_id(0), gl.num_programs(0))
    live = position < taken * TILES
    expert = gl.where(live, _expert_at_rank(ranks, idx, position // TILES), 0)
    return live, expert, position % TILES


@gluon.jit
def _sorted_rounds(taken, TILES: gl.constexpr):
    """Rounds of ``_sorted_position``'s split: every program takes at most one item a round."""
    return gl.cdiv(taken * TILES, gl.num_programs(0))


@gluon.jit
def _work(work, OFFSETS, ERRORS, experts, tokens_sum, FLAG: gl.constexpr, HIDDEN: gl.constexpr,
          INTER: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr, live=True):
    """Work item ``work`` (experts outermost): its expert, first row and column, and the
    expert's tokens; FLAG: this partition reports bad offsets (one does), for a ``live`` item
    (one read ahead past the last is not)."""
    tiles: gl.constexpr = _tile_count(HIDDEN, INTER, BN)
    expert = work // tiles
    tile = work % tiles
    m0, n0 = _tile_origin(tile, HIDDEN, INTER, BLOCK_M, BN, GROUP)
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, experts, FLAG & (tile == 0) & live,
                                  tokens_sum)
    return expert, m0, n0, begin, begin + count


@gluon.constexpr_function
def _tile_count(hidden, inter, block_n):
    """Output tiles of an expert, BLOCK_M rows by ``block_n`` columns: a constant that
    functions called with it see as one (``gl.cdiv`` makes a value of the caller's)."""
    return -(-hidden // BLOCK_M.value) * -(-inter // block_n)


@gluon.constexpr_function
def _column_parts(block_n):
    """A tile's columns as (first, second) products: the largest power of two up to
    ``block_n`` and the rest (0 when ``block_n`` is a power of two)."""
    first = 1 << (block_n.bit_length() - 1)
    return first, block_n - first


@gluon.constexpr_function
def _stage_shape(box, rows):
    """A stage of ``rows`` rows of ``box`` ([rows, cols], rows rounded up to a power of two
    as shared memory needs; the box itself when 0)."""
    return [1 << (rows - 1).bit_length(), box[1]] if rows else list(box)


@gluon.constexpr_function
def _stage_columns(b_shape, k_major, block_n):
    """The B columns a stage of ``b_shape`` holds: ``block_n`` when given (0: all)."""
    return block_n if block_n else _box_extents(b_shape, k_major)[1]


@gluon.constexpr_function
def _box_extents(shape, k_major):
    """(tokens, other axis) of a box or a ring of them (its last two axes): K-major boxes hold
    tokens along their last axis, M- and N-major ones along the one before."""
    rows, cols = shape[-2], shape[-1]
    return (cols, rows) if k_major else (rows, cols)


@gluon.constexpr_function
def _store_layout(block_n):
    """A warpgroup's [64, block_n] FP32 sum laid out for 16-byte stores: registers 0-2 of a
    thread hold 8 consecutive columns. The m64 wgmma accumulator spreads those over the four
    lanes of a quad (2 columns each) and gives each lane 4 such groups 8 columns apart, so
    going here swaps two lane bits with two register bits: shuffles within a warp."""
    col_regs = [[0, c] for c in (1, 2, 4)] + [[8, 0]]
    col_regs += [[0, c] for c in (32, 64, 128) if c < block_n]
    return gl.DistributedLinearLayout(
        reg_bases=col_regs, lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, block_n])


@gluon.jit
def _store_item(acc, OUT, OUT_PTRS, expert, m, n, has_tokens, HIDDEN: gl.constexpr,
                INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                OUT_DTYPE: gl.constexpr):
    """A work item's sum stored; accumulating, only for an expert ``has_tokens``."""
    if ACCUMULATE:
        if has_tokens:
            _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE,
                        ACCUMULATE, OUT_DTYPE)
    else:
        _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                    OUT_DTYPE)


@gluon.jit
def _sorted_tile_work(round_, ranks, idx, taken, OFFSETS, ERRORS, experts, tokens_sum,
                      FLAG: gl.constexpr, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                      BN: gl.constexpr, GROUP: gl.constexpr):
    """``_work`` in the order of ``_sorted_position`` (experts by count, largest first):
    whether this program has an item in round ``round_``, and ``_work``'s values."""
    tiles: gl.constexpr = _tile_count(HIDDEN, INTER, BN)
    live, expert, tile = _sorted_position(round_, ranks, idx, taken, tiles)
    m0, n0 = _tile_origin(tile, HIDDEN, INTER, BLOCK_M, BN, GROUP)
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, experts, FLAG & live & (tile == 0),
                                  tokens_sum)
    return live, expert, m0, n0, begin, begin + count


@gluon.jit
def _load_blocks(a_desc, b_desc, a_bufs, b_bufs, ready, empty, i, m0, n0, begin, end,
                 A_K_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr, BN: gl.constexpr):
    """One work item's blocks of tokens (those holding [begin, end), counted from token 0)
    streamed into the ring from the i-th filled on, BN columns of B a stage: the next to
    fill."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    BK: gl.constexpr = _box_extents(a_desc.block_type.shape, A_K_MAJOR)[0]
    # a stage's B columns may span several of the descriptor's boxes (_stage_ring)
    B_BOX: gl.constexpr = _box_extents(b_desc.block_type.shape, B_K_MAJOR)[1]
    B_BOXES: gl.constexpr = BN // B_BOX
    NBYTES: gl.constexpr = a_desc.block_type.nbytes + B_BOXES * b_desc.block_type.nbytes
    for block in range(begin // BK, (end + BK - 1) // BK):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)   # fresh barriers pass phase 1
        bar = ready.index(s)
        mbarrier.expect(bar, NBYTES)
        k0 = (block * BK).to(gl.int32)
        if A_K_MAJOR:
            tma_load(a_desc, [m0, k0], bar, a_bufs.index(s))
        else:
            tma_load(a_desc, [k0, m0], bar, a_bufs.index(s))
        for box in gl.static_range(B_BOXES):
            if B_K_MAJOR:
                tma_load(b_desc, [n0 + box * B_BOX, k0], bar,
                         b_bufs.index(s).slice(box * B_BOX, B_BOX, dim=0))
            else:
                tma_load(b_desc, [k0, n0 + box * B_BOX], bar,
                         b_bufs.index(s).slice(box * B_BOX, B_BOX, dim=1))
        i += 1
    return i


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS, experts,
                    tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr, GROUP: gl.constexpr,
                    A_K_MAJOR: gl.constexpr = True, B_K_MAJOR: gl.constexpr = True,
                    SORTED: gl.constexpr = False, EXPERTS_POW2: gl.constexpr = 2,
                    BLOCK_N: gl.constexpr = 0):
    """Streams each work item's blocks into the ring, items p, p + programs, ... (experts
    outermost) or with SORTED in ``_sorted_tile_work``'s order. ``A_K_MAJOR``/``B_K_MAJOR``:
    the descriptors' boxes hold the tokens along their second axis; otherwise along their
    first (the transposes of [tokens, hidden] and [tokens, intermediate] activations).
    BLOCK_N: a tile's columns, where B's stages hold more (0: all, ``_stage_columns``)."""
    BN: gl.constexpr = _stage_columns(b_bufs.shape, B_K_MAJOR, BLOCK_N)
    tiles: gl.constexpr = _tile_count(HIDDEN, INTER, BN)
    i = 0
    if SORTED:
        ranks, idx, taken = _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2, 1, 4,
                                          EVERY_EXPERT)
        for round_ in range(0, _sorted_rounds(taken, tiles)):
            live, expert, m0, n0, begin, end = _sorted_tile_work(
                round_, ranks, idx, taken, OFFSETS, ERRORS, experts, tokens_sum, False, HIDDEN,
                INTER, BN, GROUP)
            if live:
                i = _load_blocks(a_desc, b_desc, a_bufs, b_bufs, ready, empty, i, m0, n0,
                                 begin, end, A_K_MAJOR, B_K_MAJOR, BN)
    else:
        for work in range(gl.program_id(0), experts * tiles, gl.num_programs(0)):
            expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum,
                                               False, HIDDEN, INTER, BN, GROUP)
            i = _load_blocks(a_desc, b_desc, a_bufs, b_bufs, ready, empty, i, m0, n0, begin,
                             end, A_K_MAJOR, B_K_MAJOR, BN)


@gluon.jit
def _zero_outside(buf, lo, hi, k0, ROWS: gl.constexpr, COLS: gl.constexpr,
                  TOKENS_DIM: gl.constexpr = 1):
    """Zeroes the tokens of a staged [ROWS, COLS] block (its columns, or with TOKENS_DIM 0
    its rows) outside [lo, hi), in place, and makes the writes visible to the tensor cores
    (one warpgroup's share)."""
    if TOKENS_DIM == 1:
        layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        codes = buf.load(layout)
        k = k0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        keep = (k >= lo) & (k < hi)
        buf.store(gl.where(keep[None, :], codes, gl.zeros_like(codes)))
    else:   # 16 bytes of BF16 a thread, 64 columns a warp's row
        rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        codes = buf.load(rows_layout)
        k = k0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, rows_layout))
        keep = (k >= lo) & (k < hi)
        buf.store(gl.where(keep[:, None], codes, gl.zeros_like(codes)))
    fence_async_shared()


@gluon.jit
def _col_scales(B_SCALE, block, valid, n, sb_k, sb_n, INTER: gl.constexpr):
    """b_scale[block, n] (zeros where not ``valid``), loaded in the layout of ``n``."""
    return gl.load(B_SCALE + block * sb_k + n.to(gl.int64) * sb_n, mask=(n < INTER) & valid,
                   other=0.0)


@gluon.jit
def _block_scales(A_SCALE, B_SCALE, block, valid, m, n, sa_m, sa_k, sb_k, sb_n,
                  HIDDEN: gl.constexpr, INTER: gl.constexpr):
    """a_scale[m, block] and b_scale[block, n] (zeros where not ``valid``), loaded in the
    layouts of ``m`` and ``n``."""
    sa = gl.load(A_SCALE + m.to(gl.int64) * sa_m + block * sa_k, mask=(m < HIDDEN) & valid,
                 other=0.0)
    return sa, _col_scales(B_SCALE, block, valid, n, sb_k, sb_n, INTER)


@gluon.jit
def _stage_ready(a_bufs, b_bufs, ready, zeroed, i, z, block, begin, end, ROW0: gl.constexpr,
                 A_K_MAJOR: gl.constexpr = True, B_K_MAJOR: gl.constexpr = True,
                 BLOCK_N: gl.constexpr = 0):
    """Waits for the i-th stage the loader filled (block ``block`` of BK tokens) and zeroes
    its tokens outside [begin, end) when the expert shares the block (both operands; each
    warpgroup its A rows and half of B's, joined by a barrier): (the stage, the zeroings so
    far). ``A_K_MAJOR``/``B_K_MAJOR`` as ``_load_partition``'s: stages of [rows, tokens],
    otherwise [tokens, rows]."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    BK: gl.constexpr = _box_extents(a_bufs.shape, A_K_MAJOR)[0]
    BN: gl.constexpr = _stage_columns(b_bufs.shape, B_K_MAJOR, BLOCK_N)
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    k0 = block * BK
    lo = gl.maximum(begin, k0)
    hi = gl.minimum(end, k0 + BK)
    if (lo > k0) | (hi < k0 + BK):
        if A_K_MAJOR:
            _zero_outside(a_bufs.index(s).slice(ROW0, 64, dim=0), lo, hi, k0, 64, BK)
        else:
            _zero_outside(a_bufs.index(s).slice(ROW0, 64, dim=1), lo, hi, k0, BK, 64, 0)
        # this warpgroup's half of each of B's column parts
        PART0: gl.constexpr = _column_parts(BN)[0]
        PART1: gl.constexpr = _column_parts(BN)[1]
        _zero_b_half(b_bufs.index(s), 0, PART0, lo, hi, k0, ROW0, B_K_MAJOR)
        if PART1 > 0:
            _zero_b_half(b_bufs.index(s), PART0, PART1, lo, hi, k0, ROW0, B_K_MAJOR)
        cta_barrier()
        mbarrier.arrive(zeroed)
        mbarrier.wait(zeroed, z & 1)
        z += 1
    return s, z


@gluon.jit
def _zero_b_half(b_stage, first: gl.constexpr, count: gl.constexpr, lo, hi, k0,
                 ROW0: gl.constexpr, B_K_MAJOR: gl.constexpr):
    """``_zero_outside`` on the warpgroup ROW0's half of B's columns first .. first + count
    of a staged block."""
    BK: gl.constexpr = _box_extents(b_stage.shape, B_K_MAJOR)[0]
    HALF: gl.constexpr = count // 2
    if B_K_MAJOR:
        _zero_outside(b_stage.slice(first + ROW0 // 64 * HALF, HALF, dim=0), lo, hi, k0, HALF,
                      BK)
    else:
        _zero_outside(b_stage.slice(first + ROW0 // 64 * HALF, HALF, dim=1), lo, hi, k0, BK,
                      HALF, 0)


@gluon.jit
def _spread(sa_flat, sb_flat, layout: gl.constexpr):
    """A block's scales, loaded one value a thread, in the product's row and column layouts
    (through shared memory)."""
    return (gl.convert_layout(sa_flat, gl.SliceLayout(1, layout)),
            gl.convert_layout(sb_flat, gl.SliceLayout(0, layout)))


@gluon.jit
def _spread_shared(bufs, i, sa_flat, sb_flat, sb1_flat, layout: gl.constexpr,
                   layout1: gl.constexpr):
    """``_spread`` of the i-th block's row scales and both products' column scales through
    the warpgroup's ``_spread_buffers`` of the block's parity, with one barrier (the next
    block's barrier orders this block's reads before the block after rewrites them)."""
    rows, cols, cols1 = bufs
    rows.index(i % 2).store(sa_flat)
    cols.index(i % 2).store(sb_flat)
    if cols1.shape[1] > 1:
        cols1.index(i % 2).store(sb1_flat)
    cta_barrier()
    sa = rows.index(i % 2).load(gl.SliceLayout(1, layout))
    sb = cols.index(i % 2).load(gl.SliceLayout(0, layout))
    sb1 = sb
    if cols1.shape[1] > 1:
        sb1 = cols1.index(i % 2).load(gl.SliceLayout(0, layout1))
    return sa, sb, sb1


@gluon.jit
def _spread_block(bufs, i, sa_flat, sb_flat, sb1_flat, layout: gl.constexpr,
                  layout1: gl.constexpr, SHARED_SPREAD: gl.constexpr):
    """A block's (row scales, column scales, the second product's column scales) spread by
    ``_spread_shared`` or by ``_spread``, which leaves the second product's to its caller
    (the first product's columns stand in for them)."""
    if SHARED_SPREAD:
        sa, sb, sb1 = _spread_shared(bufs, i, sa_flat, sb_flat, sb1_flat, layout, layout1)
    else:
        sa, sb = _spread(sa_flat, sb_flat, layout)
        sb1 = sb
    return sa, sb, sb1


@gluon.jit
def _spread_buffers(BN0: gl.constexpr, BN1: gl.constexpr):
    """Two of each of the row scales' [64], the first product's column scales' [BN0] and the
    second's [BN1] (a placeholder of one where there is none), one allocation each: Triton
    puts a barrier between two stores to the same allocation."""
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    return (gl.allocate_shared_memory(gl.float32, [2, 64], layout),
            gl.allocate_shared_memory(gl.float32, [2, BN0], layout),
            gl.allocate_shared_memory(gl.float32, [2, BN1 if BN1 > 0 else 1], layout))


@gluon.jit
def _release(empty, i):
    """Gives the i-th filled stage back to the loader, once this warpgroup's product of it
    has finished."""
    cta_barrier()
    mbarrier.arrive(empty.index(i % empty.shape[0]))


@gluon.jit
def _work_ahead(work, OFFSETS, ERRORS, experts, tokens_sum, FLAG: gl.constexpr,
                HIDDEN: gl.constexpr, INTER: gl.constexpr, BN: gl.constexpr,
                GROUP: gl.constexpr):
    """``_work`` of item ``work``, which may lie past the last: then the last item's values,
    unflagged, for a caller that loads an item's bounds before it knows whether it has one."""
    items = experts * _tile_count(HIDDEN, INTER, BN)
    return _work(gl.minimum(work, items - 1), OFFSETS, ERRORS, experts, tokens_sum, FLAG,
                 HIDDEN, INTER, BN, GROUP, work < items)


@gluon.jit
def _first_scales(A_SCALE, B_SCALE, m0, n0, begin, end, live, m_rows, n_cols, sa_m, sa_k,
                  sb_k, sb_n, HIDDEN: gl.constexpr, INTER: gl.constexpr):
    """The scales of an item's first block (``_block_scales`` at rows m0 + ``m_rows`` and
    columns n0 + ``n_cols``); zeros for an empty expert or an item not ``live``."""
    return _block_scales(A_SCALE, B_SCALE, begin // BLOCK_K, live & (end > begin),
                         m0 + m_rows, n0 + n_cols, sa_m, sa_k, sb_k, sb_n, HIDDEN, INTER)


@gluon.jit
def _first_col_scales(B_SCALE, n0, begin, end, live, n_cols, sb_k, sb_n, INTER: gl.constexpr):
    """``_first_scales``' column scales alone, at columns n0 + ``n_cols``."""
    return _col_scales(B_SCALE, begin // BLOCK_K, live & (end > begin), n0 + n_cols, sb_k,
                       sb_n, INTER)


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                   OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n,
                   HIDDEN: gl.constexpr, INTER: gl.constexpr, DISCRETE: gl.constexpr,
                   ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr, GROUP: gl.constexpr,
                   ROW0: gl.constexpr, BN: gl.constexpr, LATE_SPREAD: gl.constexpr,
                   SHARED_SPREAD: gl.constexpr):
    """One warpgroup: output rows ROW0 .. ROW0 + 63 of each tile of BN columns.

    A block's scales are loaded one value a thread (64 + BLOCK_N values over 128 threads) and
    spread through shared memory to the threads that scale the product: each thread loading
    the 34 it uses, with their 64-bit addresses, made the kernel issue-bound (460-490 TFLOP/s
    against 705). The loads for the expert's next block are issued while this block's
    product runs (705 -> 797 TFLOP/s). An item's bounds are loaded two items ahead and its
    first block's scales one item ahead: loaded at its start, one after the other, they kept
    the tensor cores idle there, which cost short experts most. A tile whose columns are no
    power of two takes them as two products (``_column_parts``), waited for together."""
    BN0: gl.constexpr = _column_parts(BN)[0]
    BN1: gl.constexpr = _column_parts(BN)[1]
    # the second part's layouts exist (at BN0's width) where there is none, unused
    BN1_SHAPE: gl.constexpr = BN1 if BN1 > 0 else BN0
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN0, 32])
    layout1: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN1_SHAPE, 32])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    spread_bufs = 0   # no buffers: the scales go through convert_layout
    if SHARED_SPREAD:
        spread_bufs = _spread_buffers(BN0, BN1)
    m_rows = ROW0 + gl.arange(0, 64, layout=flat)
    n_cols = gl.arange(0, BN0, layout=flat)
    n_cols1 = BN0 + gl.arange(0, BN1_SHAPE, layout=flat)
    work_items = experts * _tile_count(HIDDEN, INTER, BN)
    programs = gl.num_programs(0)
    i = 0
    z = 0
    FLAG: gl.constexpr = ROW0 == 0
    # this item's and the next one's bounds, and this item's first scales
    expert, m0, n0, begin, end = _work_ahead(gl.program_id(0), OFFSETS, ERRORS, experts,
                                             tokens_sum, FLAG, HIDDEN, INTER, BN, GROUP)
    expert_1, m0_1, n0_1, begin_1, end_1 = _work_ahead(
        gl.program_id(0) + programs, OFFSETS, ERRORS, experts, tokens_sum, FLAG, HIDDEN,
        INTER, BN, GROUP)
    sa_first, sb_first = _first_scales(A_SCALE, B_SCALE, m0, n0, begin, end, True, m_rows,
                                       n_cols, sa_m, sa_k, sb_k, sb_n, HIDDEN, INTER)
    sb1_first = gl.zeros([BN1_SHAPE], gl.float32, flat)
    if BN1 > 0:
        sb1_first = _first_col_scales(B_SCALE, n0, begin, end, True, n_cols1, sb_k, sb_n,
                                      INTER)
    for work in range(gl.program_id(0), work_items, programs):
        expert_2, m0_2, n0_2, begin_2, end_2 = _work_ahead(
            work + 2 * programs, OFFSETS, ERRORS, experts, tokens_sum, FLAG, HIDDEN, INTER,
            BN, GROUP)
        live_1 = work + programs < work_items
        sa_first_1, sb_first_1 = _first_scales(A_SCALE, B_SCALE, m0_1, n0_1, begin_1, end_1,
                                               live_1, m_rows, n_cols, sa_m, sa_k, sb_k, sb_n,
                                               HIDDEN, INTER)
        sb1_first_1 = sb1_first
        if BN1 > 0:
            sb1_first_1 = _first_col_scales(B_SCALE, n0_1, begin_1, end_1, live_1, n_cols1,
                                            sb_k, sb_n, INTER)
        m_flat = m0 + m_rows
        n_flat = n0 + n_cols
        n_flat1 = n0 + n_cols1
        total = gl.zeros([64, BN0], gl.float32, layout)
        total1 = gl.zeros([64, BN1_SHAPE], gl.float32, layout1)
        first = begin // BLOCK_K
        last = (end + BLOCK_K - 1) // BLOCK_K
        # blocks first .. scaled - 1 hold the expert's tokens (none when it is empty: an empty
        # expert inside a block still runs that block, on zeroed tokens, and its scales load
        # as 0, so that a neighbour's NaN or infinite scale leaves its zeros alone)
        scaled = gl.where(end > begin, last, first)
        sa_next, sb_next, sb1_next = sa_first, sb_first, sb1_first
        for block in range(first, last):
            s, z = _stage_ready(a_bufs, b_bufs, ready, zeroed, i, z, block, begin, end, ROW0,
                                BLOCK_N=BN)
            a_rows = a_bufs.index(s).slice(ROW0, 64, dim=0)
            issued = warpgroup_mma(a_rows, b_bufs.index(s).slice(0, BN0, dim=0).permute((1, 0)),
                                   gl.zeros([64, BN0], gl.float32, layout), use_acc=False,
                                   is_async=True)
            if BN1 > 0:
                issued1 = warpgroup_mma(
                    a_rows, b_bufs.index(s).slice(BN0, BN1, dim=0).permute((1, 0)),
                    gl.zeros([64, BN1], gl.float32, layout1), use_acc=False, is_async=True)
            sa_flat, sb_flat, sb1_flat = sa_next, sb_next, sb1_next
            sa_next, sb_next = _block_scales(A_SCALE, B_SCALE, block + 1, block + 1 < scaled,
                                             m_flat, n_flat, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                                             INTER)
            if BN1 > 0:
                sb1_next = _col_scales(B_SCALE, block + 1, block + 1 < scaled, n_flat1, sb_k,
                                       sb_n, INTER)
            if not LATE_SPREAD:
                sa, sb, sb1 = _spread_block(spread_bufs, i, sa_flat, sb_flat, sb1_flat, layout,
                                            layout1, SHARED_SPREAD)
            if BN1 > 0:
                done, done1 = warpgroup_mma_wait(num_outstanding=0, deps=(issued, issued1))
            else:
                done = warpgroup_mma_wait(num_outstanding=0, deps=(issued,))
            _release(empty, i)
            if LATE_SPREAD:
                sa, sb, sb1 = _spread_block(spread_bufs, i, sa_flat, sb_flat, sb1_flat, layout,
                                            layout1, SHARED_SPREAD)
            total += done * sa[:, None] * sb[None, :]
            if BN1 > 0:
                # the rows a thread holds do not depend on the product's width: sa as it is
                sa1 = gl.convert_layout(sa, gl.SliceLayout(1, layout1))
                if not SHARED_SPREAD:
                    sb1 = gl.convert_layout(sb1_flat, gl.SliceLayout(0, layout1))
                total1 += done1 * sa1[:, None] * sb1[None, :]
            i += 1
        _store_part(total, OUT, OUT_PTRS, expert, m0 + ROW0, n0, end > begin, HIDDEN, INTER,
                    DISCRETE, ACCUMULATE, OUT_DTYPE)
        if BN1 > 0:
            _store_part(total1, OUT, OUT_PTRS, expert, m0 + ROW0, n0 + BN0, end > begin, HIDDEN,
                        INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)
        expert, m0, n0, begin, end = expert_1, m0_1, n0_1, begin_1, end_1
        expert_1, m0_1, n0_1, begin_1, end_1 = expert_2, m0_2, n0_2, begin_2, end_2
        sa_first, sb_first, sb1_first = sa_first_1, sb_first_1, sb1_first_1


@gluon.jit
def _store_part(total, OUT, OUT_PTRS, expert, m0, n0, has_tokens, HIDDEN: gl.constexpr,
                INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                OUT_DTYPE: gl.constexpr):
    """A warpgroup's [64, width] sum stored at rows m0.. and columns n0.. (``_store_item``)."""
    WIDTH: gl.constexpr = total.shape[1]
    out_layout: gl.constexpr = _store_layout(WIDTH)
    m = m0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    n = n0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, out_layout))
    _store_item(gl.convert_layout(total, out_layout), OUT, OUT_PTRS, expert, m, n, has_tokens,
                HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)


@gluon.jit
def _stage_barriers(STAGES: gl.constexpr):
    """The ring's barriers, initialized: ``ready`` per stage (its TMA loads landed),
    ``empty`` per stage (both MMA warpgroups are done with it), ``zeroed`` (both zeroed their
    share of a stage)."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    zeroed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)   # one arrival per MMA warpgroup
    mbarrier.init(zeroed, count=2)
    return ready, empty, zeroed


@gluon.jit
def _stage_ring(a_desc, b_desc, STAGES: gl.constexpr, B_ROWS: gl.constexpr = 0):
    """STAGES stages of one box of each descriptor in shared memory, in the descriptors'
    layouts, and ``_stage_barriers``'; with B_ROWS, B's stages have room for that many rows of
    the (K-major) descriptor's boxes, one after another (a width TMA boxes and shared memory
    cannot have, 192, takes 256 rows)."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_shape: gl.constexpr = _stage_shape(b_desc.block_type.shape, B_ROWS)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_shape, b_desc.layout)
    ready, empty, zeroed = _stage_barriers(STAGES)
    return a_bufs, b_bufs, ready, empty, zeroed


@gluon.jit(do_not_specialize=["experts", "tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_fp8_ws_kernel(a_desc, b_desc, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS,
                         experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN: gl.constexpr,
                         INTER: gl.constexpr, DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                         OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                         BLOCK_N: gl.constexpr, MMA_REGS: gl.constexpr = 232,
                         LATE_SPREAD: gl.constexpr = False,
                         SHARED_SPREAD: gl.constexpr = False):
    a_bufs, b_bufs, ready, empty, zeroed = _stage_ring(a_desc, b_desc, STAGES, BLOCK_N)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                          OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                          INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, GROUP, 0, BLOCK_N,
                          LATE_SPREAD, SHARED_SPREAD)),
        # (K-major A and B, items in plain order, EXPERTS_POW2 unused, the tile's columns)
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS,
                           experts, tokens_sum, HIDDEN, INTER, GROUP, True, True, False, 2,
                           BLOCK_N)),
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, A_SCALE, B_SCALE, OFFSETS, OUT,
                          OUT_PTRS, ERRORS, experts, tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN,
                          INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, GROUP, 64, BLOCK_N,
                          LATE_SPREAD, SHARED_SPREAD)),
    ], [1, 4], [LOADER_REGS, MMA_REGS])


def fits_gluon_kernel(a, b, capability) -> bool:
    """Whether this kernel takes these FP8 operands: a Hopper GPU, a tested Triton, both
    tokens-major, tokens_sum a positive multiple of 16, rows 16-byte strided and 16-byte
    aligned bases (TMA's rows and addresses)."""
    return (GLUON_API_OK and capability is not None and capability[0] == 9
            and a.stride(1) == 1 and b.stride(0) == 1 and a.shape[1] > 0
            and a.shape[1] % 16 == 0 and a.stride(0) % 16 == 0 and b.stride(1) % 16 == 0
            and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)


def _b_box_rows(block_n: int) -> int:
    """B's TMA box rows: TMA boxes are powers of two, so a 192-column stage is three boxes
    of 64."""
    return block_n & -block_n


def launch_wgrad_fp8_gluon(a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype, errors,
                           *, hidden: int, inter: int, accumulate: bool,
                           config: GluonConfig | None = None) -> None:
    """The 1x128 FP8 wgrad through this kernel: arguments as kernels.launch_wgrad_fp8's (a
    (hidden, T) and b (T, intermediate) both tokens-major, FP32 scales per 128 tokens), on
    operands ``fits_gluon_kernel`` accepts; ``config``: the module's ``GLUON_CONFIG`` (read
    at the call) when None."""
    config = GLUON_CONFIG if config is None else config
    experts = offsets.numel()
    if experts == 0:
        return
    a_desc = gluon_descriptor(a, [BLOCK_M.value, BLOCK_K.value])
    b_desc = gluon_descriptor(b.t(), [_b_box_rows(config.block_n), BLOCK_K.value])
    work = cdiv(hidden, BLOCK_M.value) * cdiv(inter, config.block_n) * experts
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    launch(_wgrad_fp8_ws_kernel, (min(work, sm_count(a.device)),), a_desc, b_desc, a_scale,
           b_scale, offsets, out_arg, ptrs_arg, errors, experts, a.shape[1], a_scale.stride(0),
           a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), HIDDEN=hidden, INTER=inter,
           DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate, OUT_DTYPE=TL_DTYPES[out_dtype],
           STAGES=config.stages, GROUP=GROUP_M, BLOCK_N=config.block_n,
           MMA_REGS=config.mma_regs, LATE_SPREAD=config.late_spread,
           SHARED_SPREAD=config.shared_spread, num_warps=4,
           maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: dense and discrete output at the first
    benchmark case's sizes."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for discrete in (False, True):
        name = f"wgrad fp8 1x128 (Gluon) discrete={discrete}"
        if not GLUON_API_OK:
            cases.append(untested_triton_case(name))
            continue
        fp8 = torch.float8_e4m3fn
        cases.append(CompileCase(name, _wgrad_fp8_ws_kernel, dict(
            a_desc=gluon_descriptor_type([BLOCK_M.value, BLOCK_K.value], fp8),
            b_desc=gluon_descriptor_type([_b_box_rows(GLUON_CONFIG.block_n), BLOCK_K.value],
                                         fp8),
            A_SCALE="*fp32", B_SCALE="*fp32", OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64",
            ERRORS="*i32", experts="i32", tokens_sum="i32", sa_m="i32", sa_k="i32", sb_k="i32",
            sb_n="i32", HIDDEN=c, INTER=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, STAGES=c,
            GROUP=c, BLOCK_N=c, MMA_REGS=c, LATE_SPREAD=c, SHARED_SPREAD=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=False,
                 OUT_DTYPE=gl.bfloat16, STAGES=GLUON_CONFIG.stages, GROUP=GROUP_M,
                 BLOCK_N=GLUON_CONFIG.block_n, MMA_REGS=GLUON_CONFIG.mma_regs,
                 LATE_SPREAD=GLUON_CONFIG.late_spread,
                 SHARED_SPREAD=GLUON_CONFIG.shared_spread),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    return cases
