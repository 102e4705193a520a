"""Triton kernels for grouped GEMM weight gradients, BF16 or block-scaled FP8 inputs: one
launch for all experts.

Program (tile, expert) computes one [BLOCK_M, BLOCK_N] tile of Wgrad[expert] by walking the
expert's tokens (begin, end read from the offsets on the device, so routing may change between
CUDA-graph replays). Operand layouts are compile-time choices; tokens_sum is the only run-time
extent. Accumulation is FP32; a tile of an empty expert is zeros (left alone when accumulating).
Offsets are never trusted: an expert whose bounds are not 0 <= begin <= end <= tokens_sum is
treated as empty (no read outside A and B), and the first tile of each expert reports bad bounds,
and a last end that is not tokens_sum, in the device error flags (graphrt.device_checks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ... import device_checks
from ...arena import align_up
from ...kernel_utils import (allow_dependent_launch, cdiv, CompileCase, CONSTEXPR, launch, mma,
                             next_power_of_2, persistent_grid, pow2, TL_DTYPES, use_pdl,
                             wait_for_prior_kernel)
from ...validate import sm_count

OFFSETS_DECREASING = tl.constexpr(device_checks.OFFSETS_DECREASING)
OFFSETS_OUT_OF_RANGE = tl.constexpr(device_checks.OFFSETS_OUT_OF_RANGE)
OFFSETS_LAST_NOT_TOTAL = tl.constexpr(device_checks.OFFSETS_LAST_NOT_TOTAL)
# which experts a persistent split over experts ranked by count walks (_ranks_by_count): every
# one; the ragged TMA kernel's (``_tma_takes``) ranked first; the ones it leaves ranked first
EVERY_EXPERT, TMA_FIRST, TMA_LEFT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# the padded copy's rows and slots: multiples of 64 tokens (128 bytes), so that every TMA box
# of it starts on a 128-byte line (boxes 16 bytes off one were 1.35-1.51x slower, 2026-12-03)
PAD_TOKENS = tl.constexpr(64)
# the output tile of the experts _ragged_padded_kernel computes (out-of-order offsets): at 64
# its registers cost that kernel's copy loop 9% more time on an H100 (docs/perf/wgrad.md,
# 2026-12-06)
ODD_TILE = tl.constexpr(32)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8   # row tiles walked together, so neighbouring programs share B columns
    max_registers: int | None = None   # per thread, so that more programs share an SM
    # ragged experts whose rows are not 16-byte aligned: load each step's tiles while the
    # previous step's product runs (the compiler pipelines only loads of 4 bytes and more)
    ragged_prefetch: bool = False

    def launch_options(self) -> dict:
        """The launch's num_warps, and maxnreg where a register cap is set."""
        if self.max_registers:
            return dict(num_warps=self.num_warps, maxnreg=self.max_registers)
        return dict(num_warps=self.num_warps)


def fp8_config(interpreted: bool, scale_block: int) -> GemmConfig:
    """MXFP8 (scale_block 32): BLOCK_K tokens a step, a multiple of 32; FP32 scales per 128
    tokens: block_k is the scale block. Both take one warpgroup a program and two programs an
    SM, so that one's tensor-core work overlaps the other's CUDA-core work (the best of
    ``scripts/sweep_wgrad.py --fp8`` on the H200)."""
    if interpreted:
        return GemmConfig(16, 16, scale_block, 1, 1, 2)
    if scale_block == 32:
        return GemmConfig(128, 128, 64, 4, 3)
    # two FP32 accumulators live (the running sum and the block's product)
    return GemmConfig(128, 64, 128, 4, 3)


def gemm_config(interpreted: bool) -> GemmConfig:
    if interpreted:  # the interpreter runs every lane in numpy: keep tiles small; groups of
        return GemmConfig(16, 16, 16, 1, 1, 2)   # two row tiles, so odd tile counts end short
    # the best of scripts/sweep_wgrad.py on the H200; ragged_prefetch: ragged experts with
    # counts off multiples of 8 120 -> 131 TFLOP/s at E8 7168 x 2048, the others unchanged
    return GemmConfig(128, 256, 64, 8, 3, ragged_prefetch=True)


@triton.jit
def _load_tiles(a_base, b_base, m, n, kk, m_mask, n_mask, k_mask, a_sm, a_sk, b_sk, b_sn):
    """A[m, kk] and B[kk, n] for one block of tokens kk, masked loads (zeros outside)."""
    a = tl.load(a_base + m[:, None] * a_sm + kk[None, :] * a_sk,
                mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    b = tl.load(b_base + kk[:, None] * b_sk + n[None, :] * b_sn,
                mask=k_mask[:, None] & n_mask[None, :], other=0.0)
    return a, b


@triton.jit
def _tile(a_base, b_base, m, n, kk, m_mask, n_mask, k_mask, a_sm, a_sk, b_sk, b_sn,
          DOT_FP32: tl.constexpr):
    """A[m, kk] @ B[kk, n] for one block of tokens kk, masked loads (zeros outside)."""
    a, b = _load_tiles(a_base, b_base, m, n, kk, m_mask, n_mask, k_mask, a_sm, a_sk, b_sk, b_sn)
    return mma(a, b, DOT_FP32)


@triton.jit
def _k_loop(acc, a_base, b_base, lo, hi, m, n, m_mask, n_mask, a_sm, a_sk, b_sk, b_sn,
            DOT_FP32: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """acc + A[m, lo:hi] @ B[lo:hi, n], BLOCK_K tokens per pipelined step."""
    k = tl.arange(0, BLOCK_K)
    for k0 in tl.range(lo, hi, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + k
        acc += _tile(a_base, b_base, m, n, kk, m_mask, n_mask, kk < hi, a_sm, a_sk, b_sk, b_sn,
                     DOT_FP32)
    return acc


@triton.jit
def _k_loop_prefetched(acc, a_base, b_base, lo, hi, m, n, m_mask, n_mask, a_sm, a_sk, b_sk,
                       b_sn, DOT_FP32: tl.constexpr, BLOCK_K: tl.constexpr):
    """``_k_loop`` for loads the compiler does not pipeline (two bytes wide): each step's tiles
    are loaded before the previous step's product is issued, so their latency overlaps it."""
    k = tl.arange(0, BLOCK_K)
    a, b = _load_tiles(a_base, b_base, m, n, lo + k, m_mask, n_mask, lo + k < hi, a_sm, a_sk,
                       b_sk, b_sn)
    for k0 in tl.range(lo, hi, BLOCK_K, num_stages=1):
        kk = k0 + BLOCK_K + k
        a_next, b_next = _load_tiles(a_base, b_base, m, n, kk, m_mask, n_mask, kk < hi, a_sm,
                                     a_sk, b_sk, b_sn)
        acc += mma(a, b, DOT_FP32)
        a, b = a_next, b_next
    return acc


@triton.jit
def _tile_origin(tile, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The first output row and column of program ``tile``: GROUP_M row tiles walked
    together, so that neighbouring programs share B's columns (scalar code: the Gluon kernel
    compiles it too)."""
    tiles_m: tl.constexpr = (HIDDEN + BLOCK_M - 1) // BLOCK_M
    tiles_n: tl.constexpr = (INTER + BLOCK_N - 1) // BLOCK_N
    group = tile // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    left = tiles_m - first_m
    rows_in_group = tl.where(left < GROUP_M, left, GROUP_M)   # tl.minimum: 3.7's interpreter fails
    tile_m = first_m + (tile % (GROUP_M * tiles_n)) % rows_in_group
    tile_n = (tile % (GROUP_M * tiles_n)) // rows_in_group
    return tile_m * BLOCK_M, tile_n * BLOCK_N


@triton.jit
def _tile_rows_cols(tile, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The output rows and columns of program ``tile`` (see _tile_origin)."""
    m0, n0 = _tile_origin(tile, HIDDEN, INTER, BLOCK_M, BLOCK_N, GROUP_M)
    return m0 + tl.arange(0, BLOCK_M), n0 + tl.arange(0, BLOCK_N)


@triton.jit
def _expert_tokens(OFFSETS, ERRORS, expert, experts, flag, tokens_sum):
    """(begin, count) of ``expert``'s tokens (of ``experts``), int64; an expert with invalid
    bounds is empty, and flagged where ``flag`` (one program an expert; scalar code: the Gluon
    kernel compiles it too)."""
    end = tl.load(OFFSETS + expert).to(tl.int64)
    begin = tl.load(OFFSETS + expert - 1, mask=expert > 0, other=0).to(tl.int64)
    total = tokens_sum.to(tl.int64)
    problem = tl.where(end < begin, OFFSETS_DECREASING, 0)
    problem |= tl.where((begin < 0) | (end < 0) | (end > total), OFFSETS_OUT_OF_RANGE, 0)
    problem |= tl.where((expert == experts - 1) & (end != total), OFFSETS_LAST_NOT_TOTAL, 0)
    if flag:
        if problem != 0:
            tl.atomic_or(ERRORS, problem)
            tl.atomic_min(ERRORS + 1, expert)
    valid = (problem & (OFFSETS_DECREASING | OFFSETS_OUT_OF_RANGE)) == 0
    begin = tl.where(valid, begin, 0)
    return begin, tl.where(valid, end - begin, 0)


@triton.jit
def _tma_takes(count):
    """Whether Hopper's ragged TMA kernel (kernels_ragged.py) takes an expert of this count
    (invalid bounds come as an empty expert): a multiple of 8, so that its blocks' rows start
    16-byte aligned, as TMA needs."""
    return count % 8 == 0


@triton.jit
def _rank_keys(OFFSETS, idx, experts, tokens_sum, SHARE: tl.constexpr, ODD_TAKEN=False):
    """What ``_ranks_by_count`` orders experts ``idx`` by: the token count (0 for invalid
    bounds); -1 with SHARE == TMA_FIRST for the experts the ragged TMA kernel leaves
    (``_tma_takes``, or none where ``ODD_TAKEN``: it reads the others' padded copy), with
    SHARE == TMA_LEFT for those it takes; -2 past the experts."""
    _, counts, bad = _bounds_at(OFFSETS, idx, experts, tokens_sum)
    counts = tl.where(bad, 0, counts)
    if SHARE == TMA_FIRST:
        counts = tl.where(_tma_takes(counts) | ODD_TAKEN, counts, -1)
    elif SHARE == TMA_LEFT:
        counts = tl.where(_tma_takes(counts) | ODD_TAKEN, -1, counts)
    return tl.where(idx < experts, counts, -2)


@triton.jit
def _ranks_by_count(OFFSETS, idx, others, experts, tokens_sum,
                    SHARE: tl.constexpr = EVERY_EXPERT, ODD_TAKEN=False):
    """Each expert ``idx`` (a vector over a power of two >= experts) ranked by token count,
    largest first, ties by index: a permutation of 0 .. experts - 1 for the experts,
    ``experts`` for the lanes past them. Experts with invalid bounds count as empty; with
    SHARE == TMA_FIRST the experts the ragged TMA kernel leaves (``_tma_takes``) come after the
    empty ones, with SHARE == TMA_LEFT those it takes (the empty ones among them); see
    ``_rank_keys`` for ODD_TAKEN.
    ``others`` (a few lanes, ``others[None, :]`` broadcast against ``idx[:, None]``) walks
    the experts a chunk at a time. The ragged TMA kernel (kernels_ragged.py) runs it with the
    chunk in each thread's registers: each chunk's comparisons and sum stay in a thread, so
    the cost grows with experts / chunk, not with a reduction across threads per expert.
    Every program computes the same order."""
    keys = _rank_keys(OFFSETS, idx, experts, tokens_sum, SHARE, ODD_TAKEN)[:, None]
    rows = idx[:, None]
    ranks = idx * 0
    for start in range(0, experts, others.shape[0]):
        other = start + others
        other_keys = _rank_keys(OFFSETS, other, experts, tokens_sum, SHARE, ODD_TAKEN)[None, :]
        other = other[None, :]
        ahead = (other < experts) & ((other_keys > keys) |
                                     ((other_keys == keys) & (other < rows)))
        ranks += tl.sum(ahead.to(ranks.dtype), axis=1)
    return ranks


@triton.jit
def _ranks_and_taken(OFFSETS, idx, others, experts, tokens_sum, SHARE: tl.constexpr,
                     ODD_TAKEN=False):
    """``_ranks_by_count``'s ranks, and how many experts the split walks (those ranked before
    the ones SHARE ranks last)."""
    keys = _rank_keys(OFFSETS, idx, experts, tokens_sum, SHARE, ODD_TAKEN)
    taken = tl.sum(((idx < experts) & (keys >= 0)).to(tl.int32), axis=0)
    return _ranks_by_count(OFFSETS, idx, others, experts, tokens_sum, SHARE, ODD_TAKEN), taken


@triton.jit
def _expert_at_rank(ranks, idx, rank):
    """The expert of ``rank`` in ``_ranks_by_count``'s order."""
    return tl.sum(tl.where(ranks == rank, idx, 0), axis=0)


@triton.jit
def _snake(round_, program, programs):
    """The position program ``program`` (of ``programs``) takes in round ``round_`` of a
    persistent loop that walks its positions largest first: the programs' order reverses every
    round, so that no program takes the largest of every round."""
    return round_ * programs + tl.where(round_ % 2 == 0, program, programs - 1 - program)


@triton.jit
def _bounds_at(OFFSETS, idx, experts, tokens_sum):
    """(begin, count, bad) of each expert ``idx`` (a vector in any layout; zeros and not bad
    past ``experts``), int64; bad: not 0 <= begin <= end <= tokens_sum."""
    live = idx < experts
    ends = tl.load(OFFSETS + idx, mask=live, other=0).to(tl.int64)
    begins = tl.load(OFFSETS + idx - 1, mask=(idx > 0) & live, other=0).to(tl.int64)
    bad = live & ((ends < begins) | (begins < 0) | (ends > tokens_sum.to(tl.int64)))
    return begins, ends - begins, bad


@triton.jit
def _expert_bounds(OFFSETS, experts, tokens_sum, EXPERTS_POW2: tl.constexpr):
    """Every expert's (begin, count) as int64 vectors of EXPERTS_POW2 (zeros past ``experts``),
    and whether every expert's bounds are valid (0 <= begin <= end <= tokens_sum): then the
    experts' ragged blocks, and their tokens' rows, are disjoint and in order."""
    begins, counts, bad = _bounds_at(OFFSETS, tl.arange(0, EXPERTS_POW2), experts, tokens_sum)
    return begins, counts, tl.sum(bad.to(tl.int32), axis=0) == 0


@triton.jit
def _offsets_in_order(OFFSETS, experts, tokens_sum, EXPERTS_POW2: tl.constexpr):
    """Whether every expert's bounds are valid (see _expert_bounds)."""
    _, _, in_order = _expert_bounds(OFFSETS, experts, tokens_sum, EXPERTS_POW2)
    return in_order


@triton.jit
def _ragged_rows_aligned(begin, count, HIDDEN: tl.constexpr, INTER: tl.constexpr):
    """Whether every row of the expert's ragged blocks starts 16-byte aligned (in buffers that
    do): its count and both blocks' offsets are multiples of 8 tokens."""
    return (count % 8 == 0) & ((HIDDEN * begin) % 8 == 0) & ((INTER * begin) % 8 == 0)


@triton.jit
def _copy_item(item, i, items, items_end, token_tiles, begins, counts):
    """(expert, begin, count, column tile, token tile) of item ``item`` of a persistent copy of
    ragged blocks whose items (each expert's ``token_tiles`` per column tile, ``items`` in all,
    ending at ``items_end``) are numbered expert by expert, column tile outermost; ``i``: the
    experts' lane indices of those vectors."""
    mine = (items_end - items <= item) & (item < items_end)
    local = item - tl.sum(tl.where(mine, items_end - items, 0), axis=0)
    tiles_t = tl.sum(tl.where(mine, token_tiles, 0), axis=0)
    expert = tl.sum(tl.where(mine, i, 0), axis=0)
    begin = tl.sum(tl.where(mine, begins, 0), axis=0)
    count = tl.sum(tl.where(mine, counts, 0), axis=0)
    return expert, begin, count, local // tiles_t, local % tiles_t


@triton.jit
def _padded_count(count):
    """An expert's row length in the padded copy: its count rounded up to PAD_TOKENS."""
    return (count + PAD_TOKENS - 1) // PAD_TOKENS * PAD_TOKENS


@triton.jit
def _padded_slot(begin, expert):
    """The token position of expert e's block in the padded copy: begin rounded down to
    PAD_TOKENS, plus PAD_TOKENS e. The blocks (rows of _padded_count tokens) are then disjoint
    for offsets in order: the next slot is at least (begin + n) // PAD_TOKENS + 1 units on, and
    a block takes at most n // PAD_TOKENS + 1; all fit in ``padded_slots`` tokens."""
    return (begin // PAD_TOKENS + expert) * PAD_TOKENS


@triton.jit
def _tile_padded(SRC, DST, r0, t0, count, WIDTH: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """Rows r0 .. r0 + BLOCK_R, tokens t0 .. t0 + BLOCK_T of one expert's ragged block SRC
    [WIDTH, count] (tokens unit-stride) written to DST [WIDTH, count rounded up to PAD_TOKENS],
    zeros past the count: rows 128 bytes apart (DST 128-byte aligned), 8 tokens a store."""
    r = r0 + tl.arange(0, BLOCK_R)
    t = t0 + tl.arange(0, BLOCK_T)
    padded = _padded_count(count)
    v = tl.load(SRC + r[:, None].to(tl.int64) * count + t[None, :],
                mask=(r < WIDTH)[:, None] & (t < count)[None, :], other=0.0)
    tl.store(DST + r[:, None].to(tl.int64) * padded + t[None, :], v,
             mask=(r < WIDTH)[:, None] & (t < padded)[None, :])


@triton.jit
def _tile_padded_aligned(SRC, DST, r0, t0, count, width, BLOCK_R: tl.constexpr,
                         BLOCK_T: tl.constexpr):
    """_tile_padded's tile moved 8 bytes (4 tokens) at a time (_tile_words, _words_stored)."""
    low, high = _tile_words(SRC, r0, t0, count, width, BLOCK_R, BLOCK_T)
    _words_stored(DST, low, high, r0, t0, count, width, BLOCK_R, BLOCK_T)


@triton.jit
def _tile_words(SRC, r0, t0, count, width, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """Rows r0 .. r0 + BLOCK_R of one expert's ragged block SRC [width, count] (tokens
    unit-stride), from token t0 on, as the 8-byte words that hold their tokens (the block's
    rows lie end to end, so a row starts anywhere in a word): (the word of each token t0 + 4k,
    the word after it), [BLOCK_R, BLOCK_T / 4] each (``_words_at``)."""
    at, live = _words_at(r0 + tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_T // 4), t0, count,
                         width)
    src = SRC.to(tl.pointer_type(tl.uint64), bitcast=True)
    return (tl.load(src + at, mask=live, other=0),
            tl.load(src + at + 1, mask=live & (at + 1 < _words_end(count, width)), other=0))


@triton.jit
def _words_end(count, width):
    """The word after the last one of a ragged block [width, count] (tokens unit-stride)."""
    return (width.to(tl.int64) * count + 3) // 4


@triton.jit
def _words_at(r, w, t0, count, width):
    """(index, mask) of the 8-byte words holding tokens t0 + 4 w of rows r of a ragged block
    [width, count] (r and w vectors; both [len(r), len(w)]): the mask keeps the rows
    below ``width`` and the words before the block's end rounded up to a word. SRC blocks are
    16-byte aligned in buffers that end on a word (widths multiples of 8), so every word the
    mask keeps lies in the buffer; a count of 0 reads nothing."""
    at = ((r.to(tl.int64) * count + t0) // 4)[:, None] + w[None, :]
    return at, (r < width)[:, None] & (at < _words_end(count, width))


@triton.jit
def _words_moved(low, high, r, w, t0, count):
    """``_words_at``'s words (``low``) and the words after them (``high``) shifted into the
    padded rows' words for tokens t0 + 4 w, zeros from the count on."""
    shift = (((r.to(tl.int64) * count + t0) % 4) * 16).to(tl.uint64)[:, None]
    # (a shift by 64 is undefined: where ``shift`` is 0 the word is ``low`` as it is)
    moved = tl.where(shift == 0, low, (low >> shift) | (high << (64 - shift)))
    # tokens from the count on are zeros: keep 16 bits for each token of the word before it
    before_count = tl.minimum(tl.maximum(count - t0 - 4 * w[None, :], 0), 4).to(tl.uint64)
    # (before_count * 0 + 1: ones in before_count's layout, which this helper, shared with
    # Gluon code, does not name; the minimum keeps the shift below 64, the where takes 4)
    kept_bits = (before_count * 0 + 1) << (16 * tl.minimum(before_count, 3))
    return tl.where(before_count == 4, moved, moved & (kept_bits - 1))


@triton.jit
def _padded_words_at(r, w, t0, count, width):
    """(index, mask) of the padded rows' words for tokens t0 + 4 w of rows r (``_words_at``'s
    shapes): rows of ``_padded_count`` tokens, so a row's words from t0 on are 16-byte aligned
    (t0 a multiple of 8)."""
    padded = _padded_count(count)
    return (((r.to(tl.int64) * padded + t0) // 4)[:, None] + w[None, :],
            (r < width)[:, None] & (w < (padded - t0) // 4)[None, :])


@triton.jit
def _words_stored(DST, low, high, r0, t0, count, width, BLOCK_R: tl.constexpr,
                  BLOCK_T: tl.constexpr):
    """_tile_words' words shifted into place and stored to the rows of DST [width, count
    rounded up to PAD_TOKENS] from token t0 on, 16 bytes at a time, zeros past the count."""
    r = r0 + tl.arange(0, BLOCK_R)
    w = tl.arange(0, BLOCK_T // 4)
    at, live = _padded_words_at(r, w, t0, count, width)
    dst = DST.to(tl.pointer_type(tl.uint64), bitcast=True)
    tl.store(dst + at, _words_moved(low, high, r, w, t0, count), mask=live)


@triton.jit
def _aligned_item(A, B, A_PAD, B_PAD, item, total, i, items, items_end, token_tiles, begins,
                  counts, HIDDEN: tl.constexpr, INTER: tl.constexpr, TILES_A: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """(block, padded block, first row, first token, count (0 past the last item), width) of
    item ``item`` of the copy, A's or B's by one select, not a branch."""
    expert, begin, count, col, tile_t = _copy_item(item, i, items, items_end, token_tiles,
                                                    begins, counts)
    slot = _padded_slot(begin, expert)
    on_a = col < TILES_A
    return (tl.where(on_a, A + HIDDEN * begin, B + INTER * begin),
            tl.where(on_a, A_PAD + HIDDEN * slot, B_PAD + INTER * slot),
            tl.where(on_a, col, col - TILES_A) * BLOCK_R, tile_t * BLOCK_T,
            tl.where(item < total, count, 0), tl.where(on_a, HIDDEN, INTER))


@triton.jit(do_not_specialize=["tokens_sum", "experts"])
def _ragged_padded_kernel(A, B, A_PAD, B_PAD, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum,
                          experts, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                          EXPERTS_POW2: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_T: tl.constexpr, PDL: tl.constexpr, ALIGNED: tl.constexpr,
                          STAGES: tl.constexpr, DISCRETE: tl.constexpr,
                          ACCUMULATE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """What Hopper's ragged TMA kernel needs done for the experts whose counts are off
    multiples of 8, whose rows it cannot read. When every expert's bounds are valid
    (``_offsets_in_order``) their ragged blocks are copied with rows padded to PAD_TOKENS:
    expert e's A_e [HIDDEN, n] to A_PAD + HIDDEN * _padded_slot(begin, e) as [HIDDEN, n rounded
    up to PAD_TOKENS] (B likewise), so that TMA can read them (rows 128 bytes apart, the slots
    disjoint). Persistent over items (expert, row tile, token tile) as _ragged_rows_kernel.
    Otherwise (the slots could overlap) nothing is copied and the valid ones among them are
    computed here into OUT (``_odd_experts_computed``): a flagged call, so no launch after the
    TMA kernel is kept for it. PDL: that kernel, a programmatic dependent launch, may start as
    this one's programs end (it waits for this grid before it reads the copy). ALIGNED: the
    tiles are moved 8 bytes at a time (_tile_padded_aligned), the loads pipelined STAGES items
    ahead."""
    allow_dependent_launch(PDL)
    TILES_A: tl.constexpr = (HIDDEN + BLOCK_R - 1) // BLOCK_R
    TILES: tl.constexpr = TILES_A + (INTER + BLOCK_R - 1) // BLOCK_R
    i = tl.arange(0, EXPERTS_POW2)
    begins, counts, in_order = _expert_bounds(OFFSETS, experts, tokens_sum, EXPERTS_POW2)
    copy = (counts % 8 != 0) & in_order
    token_tiles = tl.where(copy, (_padded_count(counts) + BLOCK_T - 1) // BLOCK_T,
                           0).to(tl.int32)
    items = token_tiles * TILES
    items_end = tl.cumsum(items, axis=0)
    total = tl.sum(items, axis=0)
    if ALIGNED:   # one load path (no branch), so that the pipeliner runs STAGES items ahead
        for item in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages=STAGES):
            src, dst, r0, t0, count, width = _aligned_item(
                A, B, A_PAD, B_PAD, item, total, i, items, items_end, token_tiles, begins,
                counts, HIDDEN, INTER, TILES_A, BLOCK_R, BLOCK_T)
            _tile_padded_aligned(src, dst, r0, t0, count, width, BLOCK_R, BLOCK_T)
    else:
        for item in range(tl.program_id(0), total, tl.num_programs(0)):
            expert, begin, count, col, tile_t = _copy_item(item, i, items, items_end, token_tiles,
                                                            begins, counts)
            slot = _padded_slot(begin, expert)
            if col < TILES_A:
                _tile_padded(A + HIDDEN * begin, A_PAD + HIDDEN * slot, col * BLOCK_R,
                             tile_t * BLOCK_T, count, HIDDEN, BLOCK_R, BLOCK_T)
            else:
                _tile_padded(B + INTER * begin, B_PAD + INTER * slot, (col - TILES_A) * BLOCK_R,
                             tile_t * BLOCK_T, count, INTER, BLOCK_R, BLOCK_T)
    if in_order == 0:
        _odd_experts_computed(A, B, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum, experts,
                              HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)


@triton.jit
def _odd_experts_computed(A, B, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum, experts,
                          HIDDEN: tl.constexpr, INTER: tl.constexpr, DISCRETE: tl.constexpr,
                          ACCUMULATE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """The wgrad of the valid experts the ragged TMA kernel leaves (``_tma_takes``) when the
    offsets are out of order: every expert's ODD_TILE x ODD_TILE tiles dealt over the
    programs, those of the others skipped; one token at a time, an outer product of two-byte
    loads added in FP32. Only flagged calls come here; a tensor-core product here, or larger
    tiles, cost the copy's loop its speed."""
    TILES: tl.constexpr = ((HIDDEN + ODD_TILE - 1) // ODD_TILE) * ((INTER + ODD_TILE - 1) //
                                                                    ODD_TILE)
    for start in range(0, experts * TILES, tl.num_programs(0)):
        position = start + tl.program_id(0)   # a tensor in the interpreter too
        if position < experts * TILES:
            tile = position % TILES
            expert = position // TILES
            begin, count = _expert_tokens(OFFSETS, ERRORS, expert, experts, False, tokens_sum)
            if _tma_takes(count) == 0:
                m, n = _tile_rows_cols(tile, HIDDEN, INTER, ODD_TILE, ODD_TILE, 8)
                # its blocks: A_e (HIDDEN, count), B_e (INTER, count), tokens unit-stride
                a_rows = A + HIDDEN * begin + m.to(tl.int64) * count
                b_rows = B + INTER * begin + n.to(tl.int64) * count
                acc = tl.zeros([ODD_TILE, ODD_TILE], dtype=tl.float32)
                for k in range(0, count):
                    a = tl.load(a_rows + k, mask=m < HIDDEN, other=0.0).to(tl.float32)
                    b = tl.load(b_rows + k, mask=n < INTER, other=0.0).to(tl.float32)
                    acc += a[:, None] * b[None, :]
                _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE,
                            ACCUMULATE, OUT_DTYPE)


@triton.jit
def _tile_to_rows(SRC, DST, w0, t0, count, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr,
                  BLOCK_T: tl.constexpr):
    """Columns w0 .. w0 + BLOCK_W, tokens t0 .. t0 + BLOCK_T of one expert's ragged block
    SRC [WIDTH, count] (tokens unit-stride) written as rows of DST [count, WIDTH]."""
    w = w0 + tl.arange(0, BLOCK_W)
    t = t0 + tl.arange(0, BLOCK_T)
    mask = (w < WIDTH)[:, None] & (t < count)[None, :]
    v = tl.load(SRC + w[:, None].to(tl.int64) * count + t[None, :], mask=mask)
    tl.store(DST + t[None, :].to(tl.int64) * WIDTH + w[:, None], v, mask=mask)


@triton.jit(do_not_specialize=["tokens_sum", "experts"])
def _ragged_rows_kernel(A, B, A_ROWS, B_ROWS, OFFSETS, tokens_sum, experts,
                        HIDDEN: tl.constexpr, INTER: tl.constexpr, SKIP_ALIGNED: tl.constexpr,
                        EXPERTS_POW2: tl.constexpr, BLOCK_W: tl.constexpr,
                        BLOCK_T: tl.constexpr):
    """The ragged blocks of the experts that the GEMM cannot load 8 tokens at a time (all of
    them unless ``SKIP_ALIGNED``) copied as rows: A_ROWS [tokens_sum, HIDDEN], B_ROWS
    [tokens_sum, INTER], each expert's tokens at its own rows. Persistent: the copy is cut
    into items (expert, column tile, token tile), numbered expert by expert, and program p
    takes items p, p + num_programs, ...; a call with nothing to copy reads the offsets once
    and returns. Nothing is copied unless every expert's bounds are valid (the GEMM then reads
    the blocks themselves)."""
    TILES_A: tl.constexpr = (HIDDEN + BLOCK_W - 1) // BLOCK_W
    TILES: tl.constexpr = TILES_A + (INTER + BLOCK_W - 1) // BLOCK_W
    i = tl.arange(0, EXPERTS_POW2)
    begins, counts, in_order = _expert_bounds(OFFSETS, experts, tokens_sum, EXPERTS_POW2)
    copy = (counts > 0) & in_order
    if SKIP_ALIGNED:
        copy = copy & (_ragged_rows_aligned(begins, counts, HIDDEN, INTER) == 0)
    # int32 items: about (tokens_sum / BLOCK_T + experts) x TILES, below 2^31 for any
    # input that fits in a GPU (tokens_sum itself is int32)
    token_tiles = tl.where(copy, (counts + BLOCK_T - 1) // BLOCK_T, 0).to(tl.int32)
    items = token_tiles * TILES
    items_end = tl.cumsum(items, axis=0)
    for item in range(tl.program_id(0), tl.sum(items, axis=0), tl.num_programs(0)):
        _, begin, count, col, tile_t = _copy_item(item, i, items, items_end, token_tiles,
                                                   begins, counts)
        t0 = tile_t * BLOCK_T
        if col < TILES_A:
            _tile_to_rows(A + HIDDEN * begin, A_ROWS + HIDDEN * begin, col * BLOCK_W, t0,
                          count, HIDDEN, BLOCK_W, BLOCK_T)
        else:
            _tile_to_rows(B + INTER * begin, B_ROWS + INTER * begin, (col - TILES_A) * BLOCK_W,
                          t0, count, INTER, BLOCK_W, BLOCK_T)


@triton.jit
def _program_tile(OFFSETS, ERRORS, tokens_sum, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(expert, rows, columns, their masks, begin, count) of this program: its output tile and
    its expert's tokens (see _tile_rows_cols and _expert_tokens)."""
    tile = tl.program_id(0)
    expert = tl.program_id(1)
    m, n = _tile_rows_cols(tile, HIDDEN, INTER, BLOCK_M, BLOCK_N, GROUP_M)
    m_mask, n_mask = m < HIDDEN, n < INTER
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, tl.num_programs(1), tile == 0,
                                  tokens_sum)
    return expert, m, n, m_mask, n_mask, begin, count


@triton.jit
def _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                DISCRETE: tl.constexpr, ACCUMULATE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """acc (plus the output's values when accumulating) into Wgrad[expert][m, n]."""
    if DISCRETE:
        address = tl.load(OUT_PTRS + expert)
        out = address.to(tl.pointer_type(OUT_DTYPE))
        # rows 16 bytes apart from a 16-byte aligned address: vector loads and stores, which
        # the compiler cannot infer from a loaded address
        if (address % 16 == 0) & (INTER % 8 == 0):
            _store_at(acc, out, m, n, HIDDEN, INTER, ACCUMULATE, OUT_DTYPE, True)
        else:
            _store_at(acc, out, m, n, HIDDEN, INTER, ACCUMULATE, OUT_DTYPE, False)
    else:
        _store_at(acc, OUT + expert.to(tl.int64) * (HIDDEN * INTER), m, n, HIDDEN, INTER,
                  ACCUMULATE, OUT_DTYPE, False)


@triton.jit
def _store_at(acc, out, m, n, HIDDEN: tl.constexpr, INTER: tl.constexpr,
              ACCUMULATE: tl.constexpr, OUT_DTYPE: tl.constexpr, ROWS_ALIGNED: tl.constexpr):
    """acc (plus the values there when accumulating) into the expert's output ``out``;
    ROWS_ALIGNED: its rows start 16-byte aligned (a dense output's alignment is inferred)."""
    rows = out + m[:, None].to(tl.int64) * INTER
    if ROWS_ALIGNED:
        rows = tl.multiple_of(rows, [16, 16])
    ptrs = rows + n[None, :]
    mask = (m < HIDDEN)[:, None] & (n < INTER)[None, :]
    if ACCUMULATE:
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, acc.to(OUT_DTYPE), mask=mask)


@triton.jit(do_not_specialize=["tokens_sum", "experts"])
def _wgrad_kernel(A, B, A_ROWS, B_ROWS, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum, experts,
                  HIDDEN: tl.constexpr, INTER: tl.constexpr, A_K_MAJOR: tl.constexpr,
                  B_K_MAJOR: tl.constexpr, RAGGED: tl.constexpr, DISCRETE: tl.constexpr,
                  ACCUMULATE: tl.constexpr, DOT_FP32: tl.constexpr, OUT_DTYPE: tl.constexpr,
                  K_ALIGNED: tl.constexpr, RAGGED_ALIGNED: tl.constexpr,
                  RAGGED_PREFETCH: tl.constexpr, RAGGED_ROWS: tl.constexpr,
                  SKIP_TMA_TAKEN: tl.constexpr, PDL: tl.constexpr,
                  EXPERTS_POW2: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  NUM_STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    """Program (tile, expert) computes that tile. SKIP_TMA_TAKEN: after Hopper's ragged TMA
    kernel (kernels_ragged.py) without the padded copy, the experts it takes are left alone,
    and a grid of one program an SM walks the items of the others, sorted by
    count, largest first, the programs' order reversed every round (1-10% faster than one
    program per tile at odd counts on the H200, docs/perf/wgrad.md). PDL: launched as a
    programmatic dependent launch right after that kernel or the rows copy; the offsets
    (written before either ran) are read first, and a program with nothing to do ends without
    waiting for the kernel before it (the first one waits, so that the call's kernels still end
    in order)."""
    if SKIP_TMA_TAKEN:
        TILES: tl.constexpr = ((HIDDEN + BLOCK_M - 1) // BLOCK_M) * ((INTER + BLOCK_N - 1) //
                                                                      BLOCK_N)
        idx = tl.arange(0, EXPERTS_POW2)
        ranks, taken = _ranks_and_taken(OFFSETS, idx, tl.arange(0, 8), experts, tokens_sum,
                                        TMA_LEFT)
        if (taken > 0) | (tl.program_id(0) == 0):
            wait_for_prior_kernel(PDL)
        for round_ in range(0, tl.cdiv(taken * TILES, tl.num_programs(0))):
            position = _snake(round_, tl.program_id(0), tl.num_programs(0))
            if position < taken * TILES:
                _wgrad_tile(A, B, A_ROWS, B_ROWS, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum,
                            position % TILES, _expert_at_rank(ranks, idx, position // TILES),
                            experts, HIDDEN, INTER, A_K_MAJOR, B_K_MAJOR, RAGGED, DISCRETE,
                            ACCUMULATE, DOT_FP32, OUT_DTYPE, K_ALIGNED, RAGGED_ALIGNED,
                            RAGGED_PREFETCH, RAGGED_ROWS, EXPERTS_POW2, BLOCK_M, BLOCK_N,
                            BLOCK_K, NUM_STAGES, GROUP_M)
    else:
        wait_for_prior_kernel(PDL)
        _wgrad_tile(A, B, A_ROWS, B_ROWS, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum,
                    tl.program_id(0), tl.program_id(1), experts, HIDDEN, INTER, A_K_MAJOR,
                    B_K_MAJOR, RAGGED, DISCRETE, ACCUMULATE, DOT_FP32, OUT_DTYPE, K_ALIGNED,
                    RAGGED_ALIGNED, RAGGED_PREFETCH, RAGGED_ROWS, EXPERTS_POW2, BLOCK_M,
                    BLOCK_N, BLOCK_K, NUM_STAGES, GROUP_M)


@triton.jit
def _wgrad_tile(A, B, A_ROWS, B_ROWS, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum, tile, expert,
                experts, HIDDEN: tl.constexpr, INTER: tl.constexpr, A_K_MAJOR: tl.constexpr,
                B_K_MAJOR: tl.constexpr, RAGGED: tl.constexpr, DISCRETE: tl.constexpr,
                ACCUMULATE: tl.constexpr, DOT_FP32: tl.constexpr, OUT_DTYPE: tl.constexpr,
                K_ALIGNED: tl.constexpr, RAGGED_ALIGNED: tl.constexpr,
                RAGGED_PREFETCH: tl.constexpr, RAGGED_ROWS: tl.constexpr,
                EXPERTS_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile ``tile`` of Wgrad[expert] (of ``experts``): the product over the expert's tokens,
    stored (an empty expert's zeros; left alone when accumulating)."""
    m, n = _tile_rows_cols(tile, HIDDEN, INTER, BLOCK_M, BLOCK_N, GROUP_M)
    m_mask, n_mask = m < HIDDEN, n < INTER
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, experts, tile == 0, tokens_sum)
    if ACCUMULATE:
        if count == 0:
            return
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if RAGGED:   # the expert's blocks: A_e (hidden, count), B_e (intermediate, count)
        a_off, b_off = HIDDEN * begin, INTER * begin
        if RAGGED_ALIGNED and _ragged_rows_aligned(begin, count, HIDDEN, INTER):
            # every row of both blocks starts 16-byte aligned: 8 tokens per load. The values
            # are rebuilt as multiples of 8 for the compiler to see it (tl.multiple_of would
            # mark the original values, which the other branch uses too)
            rows = count // 8 * 8
            acc = _k_loop(acc, A + a_off // 8 * 8, B + b_off // 8 * 8, 0, rows, m, n,
                          m_mask, n_mask, rows, 1, 1, rows, DOT_FP32, BLOCK_K, NUM_STAGES)
        elif RAGGED_ROWS and _offsets_in_order(OFFSETS, experts, tokens_sum, EXPERTS_POW2):
            # the blocks copied as rows by _ragged_rows_kernel: hidden and intermediate the
            # unit-stride axes, whatever the count
            acc = _k_loop(acc, A_ROWS + a_off, B_ROWS + b_off, 0, count, m, n, m_mask,
                          n_mask, 1, HIDDEN, INTER, 1, DOT_FP32, BLOCK_K, NUM_STAGES)
        elif RAGGED_PREFETCH:
            acc = _k_loop_prefetched(acc, A + a_off, B + b_off, 0, count, m, n, m_mask,
                                     n_mask, count, 1, 1, count, DOT_FP32, BLOCK_K)
        elif RAGGED_ROWS:   # out-of-order offsets: short unpipelined steps, few registers
            acc = _k_loop(acc, A + a_off, B + b_off, 0, count, m, n, m_mask, n_mask, count,
                          1, 1, count, DOT_FP32, 16, 1)
        else:
            acc = _k_loop(acc, A + a_off, B + b_off, 0, count, m, n, m_mask, n_mask, count,
                          1, 1, count, DOT_FP32, BLOCK_K, NUM_STAGES)
    else:   # element strides of A (hidden x tokens) and B (tokens x intermediate)
        stride = tokens_sum.to(tl.int64)
        if K_ALIGNED:   # tokens_sum % 8 == 0: K-major operands' rows start 16-byte aligned
            stride = tl.multiple_of(stride, 8)
        if A_K_MAJOR:
            a_sm, a_sk = stride, 1
        else:
            a_sm, a_sk = 1, HIDDEN
        if B_K_MAJOR:
            b_sk, b_sn = 1, stride
        else:
            b_sk, b_sn = INTER, 1
        if K_ALIGNED:
            # tokens are absolute indices here: those between the expert's first and last
            # multiples of 8 load 8 at a time (masks constant over 8 tokens); the fewer than 8
            # at each end come in one gathered block with exact masks. On the H200 (Triton
            # 3.6), skipping that block when both ends are empty, narrowing it to 16 tokens or
            # moving it before the loop each made the large cases with K-major B 9-25% slower
            stop = begin + count
            first_full = tl.multiple_of((begin + 7) // 8 * 8, 8)
            last_full = stop // 8 * 8
            acc = _k_loop(acc, A, B, first_full, last_full, m, n, m_mask, n_mask, a_sm,
                          a_sk, b_sk, b_sn, DOT_FP32, BLOCK_K, NUM_STAGES)
            if count > 0:
                head_end = tl.minimum(first_full, stop)
                tail_begin = tl.maximum(last_full, first_full)
                k = tl.arange(0, BLOCK_K)
                kk = tl.where(k < 8, begin // 8 * 8 + k, last_full + k - 8)
                k_mask = (((k < 8) & (kk >= begin) & (kk < head_end)) |
                          ((k >= 8) & (k < 16) & (kk >= tail_begin) & (kk < stop)))
                acc += _tile(A, B, m, n, kk, m_mask, n_mask, k_mask, a_sm, a_sk, b_sk,
                             b_sn, DOT_FP32)
        else:
            acc = _k_loop(acc, A + begin * a_sk, B + begin * b_sk, 0, count, m, n, m_mask,
                          n_mask, a_sm, a_sk, b_sk, b_sn, DOT_FP32, BLOCK_K, NUM_STAGES)
    _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)


@triton.jit
def _scaled_block(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, load_k, keep_k, block,
                  stride, sa_m, sa_k, sb_k, sb_n, SCALES_MN_MAJOR: tl.constexpr,
                  EDGE: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc + (A[m, kk] @ B[kk, n]) * a_scale[m, block] * b_scale[block, n] for one block of
    tokens kk sharing one scale per row of A and per column of B (K-major codes, rows
    ``stride`` apart). Tokens outside ``load_k`` are not read; an ``EDGE`` block (one the expert
    shares with a neighbour) also zeroes those outside ``keep_k`` after loading, which keeps its
    loads 16 codes wide. ``SCALES_MN_MAJOR``: a block's scales are contiguous along m and n
    (sa_m == sb_n == 1), which spares the per-element 64-bit address arithmetic."""
    a, b = _load_tiles(A, B, m, n, kk, m_mask, n_mask, load_k, stride, 1, 1, stride)
    if EDGE:
        a = tl.where(keep_k[None, :], a, tl.zeros_like(a))
        b = tl.where(keep_k[:, None], b, tl.zeros_like(b))
    if SCALES_MN_MAJOR:
        sa = tl.load(A_SCALE + block * sa_k + m, mask=m_mask, other=0)
        sb = tl.load(B_SCALE + block * sb_k + n, mask=n_mask, other=0)
    else:
        sa = tl.load(A_SCALE + m.to(tl.int64) * sa_m + block * sa_k, mask=m_mask, other=0)
        sb = tl.load(B_SCALE + block * sb_k + n.to(tl.int64) * sb_n, mask=n_mask, other=0)
    return acc + mma(a, b, DOT_FP32) * (sa[:, None] * sb[None, :])


@triton.jit(do_not_specialize=["tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_fp8_kernel(A, B, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum,
                      sa_m, sa_k, sb_k, sb_n, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                      SCALE_BLOCK: tl.constexpr,
                      SCALES_MN_MAJOR: tl.constexpr, ROWS_ALIGNED: tl.constexpr,
                      DISCRETE: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_FP32: tl.constexpr,
                      OUT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      NUM_STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    """Block-scaled FP8 codes, both operands K-major: scales per SCALE_BLOCK tokens counted
    from token 0 of the whole tensor, so an expert's first and last blocks may be shared with
    its neighbours. The blocks inside the expert run pipelined, 16 codes per load when the rows
    are 16-byte aligned; the partial blocks at its two ends run once each, masked."""
    expert, m, n, m_mask, n_mask, begin, count = _program_tile(
        OFFSETS, ERRORS, tokens_sum, HIDDEN, INTER, BLOCK_M, BLOCK_N, GROUP_M)
    if ACCUMULATE:
        if count == 0:
            return
    total = tokens_sum.to(tl.int64)
    stride = total
    if ROWS_ALIGNED:
        stride = tl.multiple_of(stride, 16)
    stop = begin + count
    first_full = (begin + SCALE_BLOCK - 1) // SCALE_BLOCK * SCALE_BLOCK
    last_full = stop // SCALE_BLOCK * SCALE_BLOCK
    k = tl.arange(0, SCALE_BLOCK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(first_full, last_full, SCALE_BLOCK, num_stages=NUM_STAGES):
        kk = k0 + k
        acc = _scaled_block(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk,
                            kk < last_full, kk, k0 // SCALE_BLOCK, stride, sa_m, sa_k, sb_k,
                            sb_n, SCALES_MN_MAJOR, False, DOT_FP32)
    head_end = tl.minimum(first_full, stop)
    if head_end > begin:   # the expert's tokens in the block holding its first token
        kk = begin // SCALE_BLOCK * SCALE_BLOCK + k
        acc = _scaled_block(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, kk < total,
                            (kk >= begin) & (kk < head_end), begin // SCALE_BLOCK, stride,
                            sa_m, sa_k, sb_k, sb_n, SCALES_MN_MAJOR, True,
                            DOT_FP32)
    tail_begin = tl.maximum(last_full, first_full)
    if stop > tail_begin:  # and in the block holding its last token, when that is another one
        kk = last_full + k
        acc = _scaled_block(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, kk < total,
                            (kk >= tail_begin) & (kk < stop), last_full // SCALE_BLOCK, stride,
                            sa_m, sa_k, sb_k, sb_n, SCALES_MN_MAJOR, True,
                            DOT_FP32)
    _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)


MX_BLOCK = tl.constexpr(32)   # tokens per E8M0 scale


@triton.jit
def _mx_to_bf16(codes, scale_bytes, ROWS_ARE_TOKENS: tl.constexpr):
    """E4M3 codes times their E8M0 scales (one per MX_BLOCK tokens along the tokens axis) as
    BF16: exact, since 4 significant bits times a power of two fit BF16 wherever FP32 does
    (only values below 2^-133 round). codes (m, tokens) with scales (m, blocks), or
    ``ROWS_ARE_TOKENS``: codes (tokens, n) with scales (blocks, n)."""
    scales = pow2(scale_bytes.to(tl.int32) - 127)
    if ROWS_ARE_TOKENS:
        blocks: tl.constexpr = scales.shape[0]
        cols: tl.constexpr = scales.shape[1]
        full = tl.reshape(tl.broadcast_to(scales[:, None, :], (blocks, MX_BLOCK, cols)),
                          (blocks * MX_BLOCK, cols))
    else:
        rows: tl.constexpr = scales.shape[0]
        blocks: tl.constexpr = scales.shape[1]
        full = tl.reshape(tl.broadcast_to(scales[:, :, None], (rows, blocks, MX_BLOCK)),
                          (rows, blocks * MX_BLOCK))
    return (codes.to(tl.float32) * full).to(tl.bfloat16)


@triton.jit
def _mx_step(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, k_mask, blocks, block_mask,
             stride, sa_m, sa_k, sb_k, sb_n, SCALES_MN_MAJOR: tl.constexpr,
             DOT_FP32: tl.constexpr):
    """acc + A[m, kk] @ B[kk, n] on the values of MXFP8 codes: ``kk`` covers whole scale blocks
    ``blocks`` (MX_BLOCK consecutive tokens each); tokens outside ``k_mask`` and blocks outside
    ``block_mask`` are not read (zero)."""
    a, b = _load_tiles(A, B, m, n, kk, m_mask, n_mask, k_mask, stride, 1, 1, stride)
    a_mask = m_mask[:, None] & block_mask[None, :]
    b_mask = block_mask[:, None] & n_mask[None, :]
    if SCALES_MN_MAJOR:
        sa = tl.load(A_SCALE + blocks[None, :] * sa_k + m[:, None], mask=a_mask, other=0)
        sb = tl.load(B_SCALE + blocks[:, None] * sb_k + n[None, :], mask=b_mask, other=0)
    else:
        sa = tl.load(A_SCALE + m[:, None].to(tl.int64) * sa_m + blocks[None, :] * sa_k,
                     mask=a_mask, other=0)
        sb = tl.load(B_SCALE + blocks[:, None] * sb_k + n[None, :].to(tl.int64) * sb_n,
                     mask=b_mask, other=0)
    return acc + mma(_mx_to_bf16(a, sa, False), _mx_to_bf16(b, sb, True), DOT_FP32)


@triton.jit(do_not_specialize=["tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_mx_kernel(A, B, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS, tokens_sum,
                     sa_m, sa_k, sb_k, sb_n, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                     SCALES_MN_MAJOR: tl.constexpr, ROWS_ALIGNED: tl.constexpr,
                     DISCRETE: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_FP32: tl.constexpr,
                     OUT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    """MXFP8 codes (E8M0 scales per MX_BLOCK tokens counted from token 0), both operands K-major,
    turned into their exact BF16 values in registers and multiplied on BF16 tensor cores with
    FP32 accumulation (Hopper has no block-scaled FP8 instruction; a scaled FP8 product per 32
    tokens keeps the tensor cores idle while the CUDA cores scale). The scale blocks inside the
    expert run pipelined, BLOCK_K tokens a step; the tokens it owns in the blocks it shares with
    its neighbours (fewer than MX_BLOCK at each end) run once, in one masked step."""
    expert, m, n, m_mask, n_mask, begin, count = _program_tile(
        OFFSETS, ERRORS, tokens_sum, HIDDEN, INTER, BLOCK_M, BLOCK_N, GROUP_M)
    if ACCUMULATE:
        if count == 0:
            return
    stride = tokens_sum.to(tl.int64)
    if ROWS_ALIGNED:   # 16-byte aligned rows: 16 codes a load inside whole blocks
        stride = tl.multiple_of(stride, 16)
    stop = begin + count
    first_full = tl.multiple_of((begin + MX_BLOCK - 1) // MX_BLOCK * MX_BLOCK, MX_BLOCK)
    last_full = stop // MX_BLOCK * MX_BLOCK
    k = tl.arange(0, BLOCK_K)
    blocks = tl.arange(0, BLOCK_K // MX_BLOCK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(first_full, last_full, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + k
        kb = k0 // MX_BLOCK + blocks
        acc = _mx_step(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, kk < last_full,
                       kb, kb < last_full // MX_BLOCK, stride, sa_m, sa_k, sb_k, sb_n,
                       SCALES_MN_MAJOR, DOT_FP32)
    head_end = tl.minimum(first_full, stop)
    tail_begin = tl.maximum(last_full, first_full)
    if (head_end > begin) | (stop > tail_begin):
        # one step of two blocks: the one holding the first token, the one holding the last
        edge = tl.arange(0, 2 * MX_BLOCK)
        head = edge < MX_BLOCK
        kk = tl.where(head, begin // MX_BLOCK * MX_BLOCK + edge, last_full + edge - MX_BLOCK)
        k_mask = ((head & (kk >= begin) & (kk < head_end)) |
                  ((edge >= MX_BLOCK) & (kk >= tail_begin) & (kk < stop)))
        two = tl.arange(0, 2)
        kb = tl.where(two == 0, begin // MX_BLOCK, last_full // MX_BLOCK)
        kb_mask = tl.where(two == 0, begin, tail_begin) < tl.where(two == 0, head_end, stop)
        acc = _mx_step(acc, A, B, A_SCALE, B_SCALE, m, n, m_mask, n_mask, kk, k_mask, kb,
                       kb_mask, stride, sa_m, sa_k, sb_k, sb_n, SCALES_MN_MAJOR, DOT_FP32)
    _store_tile(acc, OUT, OUT_PTRS, expert, m, n, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE)


def _grid_and_outputs(cfg: GemmConfig, hidden: int, inter: int, a, offsets, out, out_ptrs):
    """(grid, OUT, OUT_PTRS) of a launch, None without experts: one program per output tile
    and expert; the dense output or the address table, the unused argument a valid tensor."""
    experts = offsets.numel()
    if experts == 0:
        return None
    grid = (cdiv(hidden, cfg.block_m) * cdiv(inter, cfg.block_n), experts)
    return (grid, *output_arguments(a, offsets, out, out_ptrs))


def output_arguments(a, offsets, out, out_ptrs) -> tuple:
    """A wgrad kernel's (OUT, OUT_PTRS): the dense output or the address table, the unused
    argument a valid tensor."""
    return (a, out_ptrs) if out_ptrs is not None else (out, offsets)


@dataclass(frozen=True)
class RowsConfig:
    """_ragged_rows_kernel's tile [block_w columns, block_t tokens] and its persistent grid."""
    block_w: int = 64
    block_t: int = 64
    num_warps: int = 8
    programs_per_sm: int = 4


# 64 x 64 on 8 warps, 4 programs an SM: 0.64-0.71 of the copy ceiling at the benchmark cases'
# odd counts, 2.3 us where nothing is copied (scripts/sweep_wgrad.py --rows, H200)
ROWS_CONFIG = RowsConfig()


def ragged_rows_bytes(tokens_sum: int, hidden: int, inter: int) -> int:
    """Bytes of the scratch that holds ragged BF16 blocks copied as rows: A's [tokens_sum,
    hidden], then B's [tokens_sum, intermediate] from the next 256-byte boundary."""
    return ragged_rows_split(tokens_sum, hidden) + tokens_sum * inter * 2


def ragged_rows_split(tokens_sum: int, hidden: int) -> int:
    """Where B's rows start in that scratch."""
    return -(-tokens_sum * hidden * 2 // 256) * 256


def ragged_rows_views(rows: torch.Tensor, tokens_sum: int, hidden: int,
                      inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A's rows [tokens_sum, hidden] and B's rows [tokens_sum, intermediate], BF16 views of a
    uint8 scratch of ``ragged_rows_bytes``."""
    split = ragged_rows_split(tokens_sum, hidden)
    return (rows[:tokens_sum * hidden * 2].view(torch.bfloat16).view(tokens_sum, hidden),
            rows[split:split + tokens_sum * inter * 2].view(torch.bfloat16)
            .view(tokens_sum, inter))


@dataclass(frozen=True)
class PaddedConfig:
    """_ragged_padded_kernel's tile [block_r rows, block_t tokens] and its persistent grid: on
    the H200 at odd counts (docs/perf/wgrad.md, 2026-12-04) [64, 256] with 8 warps, 2 an SM,
    was the fastest of 8 configs or within 1% of it at the three benchmark cases (0.71-0.84 of
    the copy ceiling); read as 8-byte words (2026-12-05) the same tile ran 0.93 / 1.01 / 0.93x
    that time (0.91 / 0.80 / 0.77 of the ceiling)."""
    block_r: int = 64
    block_t: int = 256
    num_warps: int = 8
    programs_per_sm: int = 2
    # rows read as the aligned 8-byte words that hold them, shifted into place and stored 16
    # bytes at a time (_tile_padded_aligned; False: two-byte loads), the loads pipelined
    # ``stages`` items ahead. 2 or 3 stages measured 1.1-1.6x one stage's time on the H200
    # (2026-12-05).
    aligned_loads: bool = True
    stages: int = 1


PADDED_CONFIG = PaddedConfig()


def padded_slots(tokens_sum: int, experts: int) -> int:
    """Tokens of the padded copy's rows of slots (_padded_slot): every block ends by them."""
    return (tokens_sum // PAD_TOKENS + experts) * PAD_TOKENS


def _padded_layout(tokens_sum: int, experts: int, hidden: int) -> tuple[int, int]:
    """(padded_slots, byte offset of B's region) of the padded copy's scratch: A's region
    first, B's from the next 256-byte boundary."""
    slots = padded_slots(tokens_sum, experts)
    return slots, align_up(hidden * slots * 2)


def ragged_padded_bytes(tokens_sum: int, experts: int, hidden: int, inter: int) -> int:
    """Bytes of the scratch that holds the ragged BF16 blocks of experts off multiples of 8
    tokens with rows padded to PAD_TOKENS (_ragged_padded_kernel): A's [hidden, padded_slots]
    elements, then B's [intermediate, padded_slots] from the next 256-byte boundary."""
    slots, b_start = _padded_layout(tokens_sum, experts, hidden)
    return b_start + inter * slots * 2


def ragged_padded_views(scratch: torch.Tensor, tokens_sum: int, experts: int, hidden: int,
                        inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The A and B regions of a ``ragged_padded_bytes`` scratch as flat BF16 tensors."""
    slots, b_start = _padded_layout(tokens_sum, experts, hidden)
    return (scratch[:hidden * slots * 2].view(torch.bfloat16),
            scratch[b_start:b_start + inter * slots * 2].view(torch.bfloat16))


def launch_ragged_padded(cfg: PaddedConfig, a, b, a_pad, b_pad, offsets, out, out_ptrs,
                         out_dtype, errors, *, hidden: int, inter: int,
                         accumulate: bool) -> None:
    """The ragged blocks of a (hidden, T) and b (intermediate, T) whose counts are off
    multiples of 8 copied into a_pad and b_pad (``ragged_padded_views``) with rows padded to
    PAD_TOKENS, when every expert's bounds are valid; otherwise the valid ones among those
    experts computed into the output (``out``, ``out_ptrs``, ``out_dtype``, ``errors`` and
    ``accumulate`` as ``launch_wgrad`` takes them), which Hopper's ragged TMA kernel then
    leaves. A persistent grid of at most ``programs_per_sm`` programs an SM."""
    tokens_sum, experts = a.shape[1], offsets.shape[0]
    if experts == 0:
        return
    out_arg, ptrs_arg = output_arguments(a, offsets, out, out_ptrs)
    tiles = cdiv(hidden, cfg.block_r) + cdiv(inter, cfg.block_r)
    items = (cdiv(tokens_sum, cfg.block_t) + 2 * experts) * tiles
    programs = persistent_grid(items, sm_count(a.device) * cfg.programs_per_sm)
    launch(_ragged_padded_kernel, (programs,), a, b, a_pad, b_pad, offsets, out_arg, ptrs_arg,
           errors, tokens_sum, experts, HIDDEN=hidden, INTER=inter,
           EXPERTS_POW2=experts_vector(experts), BLOCK_R=cfg.block_r, BLOCK_T=cfg.block_t,
           PDL=use_pdl(a), ALIGNED=cfg.aligned_loads, STAGES=cfg.stages,
           DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate,
           OUT_DTYPE=TL_DTYPES[out_dtype], num_warps=cfg.num_warps)


def experts_vector(experts: int) -> int:
    """EXPERTS_POW2 of the kernels that read every expert's offsets as one vector."""
    return max(2, next_power_of_2(experts))


def launch_ragged_rows(cfg: RowsConfig, a, b, a_rows, b_rows, offsets, *, hidden: int,
                       inter: int, skip_aligned: bool) -> None:
    """The ragged blocks of a (hidden, T) and b (intermediate, T) copied as rows into a_rows
    (T, hidden) and b_rows (T, intermediate): every expert's, or those off 16-byte rows when
    ``skip_aligned``; a grid of at most ``programs_per_sm`` programs per SM, fewer when the
    copy of every expert would need fewer tiles."""
    tokens_sum, experts = a.shape[1], offsets.shape[0]
    tiles = cdiv(hidden, cfg.block_w) + cdiv(inter, cfg.block_w)
    items = (cdiv(tokens_sum, cfg.block_t) + experts) * tiles
    programs = persistent_grid(items, sm_count(a.device) * cfg.programs_per_sm)
    launch(_ragged_rows_kernel, (programs,), a, b, a_rows, b_rows, offsets, tokens_sum, experts,
           HIDDEN=hidden, INTER=inter, SKIP_ALIGNED=skip_aligned,
           EXPERTS_POW2=experts_vector(experts), BLOCK_W=cfg.block_w, BLOCK_T=cfg.block_t,
           num_warps=cfg.num_warps)


def launch_wgrad(cfg: GemmConfig, a, b, offsets, out, out_ptrs, out_dtype, errors, *,
                 hidden: int, inter: int, a_k_major: bool, b_k_major: bool, ragged: bool,
                 accumulate: bool, dot_fp32: bool, rows=None,
                 skip_tma_taken: bool = False) -> None:
    """out: the dense output; with ``out_ptrs`` (discrete) the addresses are read from it;
    ``errors``: the device's error flags (graphrt.device_checks.error_flags). ``rows``
    (ragged): a uint8 scratch of ``ragged_rows_bytes`` into which the experts whose blocks are
    not 16-byte aligned row by row are first copied as rows, which the GEMM then reads at full
    speed; without it those experts load two bytes at a time. ``skip_tma_taken`` (ragged): the
    experts that Hopper's ragged TMA kernel takes (``_tma_takes``: counts in multiples of 8,
    and invalid bounds) are left alone, the others taken by a persistent grid of one program
    an SM, as a programmatic dependent launch where ``use_pdl`` allows (it starts while the
    kernel before it drains). (Where that kernel reads the padded copy, ``launch_ragged_padded``
    takes the others and this launch is not needed.)"""
    if skip_tma_taken and not ragged:
        raise ValueError("skip_tma_taken: only ragged calls share their experts with a TMA kernel")
    launch_args = _grid_and_outputs(cfg, hidden, inter, a, offsets, out, out_ptrs)
    if launch_args is None:
        return
    grid, out_arg, ptrs_arg = launch_args
    tokens_sum, experts = a.shape[1], grid[1]
    pdl = skip_tma_taken and use_pdl(a)
    if skip_tma_taken:   # persistent: one program an SM
        grid = (min(grid[0] * experts, sm_count(a.device)),)
    # the 8-token path needs 16-byte aligned rows of the K-major operands (and BLOCK_K >= 16)
    # (ragged: the experts whose blocks turn out aligned on the device take it)
    aligned_bases = cfg.block_k >= 16 and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    k_aligned = (a_k_major or b_k_major) and not ragged and tokens_sum % 8 == 0 and aligned_bases
    # the vector of offsets the rows' checks read; a fixed value where nothing reads it, so
    # that other launches do not compile per expert count
    experts_pow2 = experts_vector(experts) if ragged and (rows is not None or skip_tma_taken) \
        else 2
    a_rows, b_rows = a, b   # the kernel's unused arguments: valid tensors
    if ragged and rows is not None:
        a_rows, b_rows = ragged_rows_views(rows, tokens_sum, hidden, inter)
        launch_ragged_rows(ROWS_CONFIG, a, b, a_rows, b_rows, offsets, hidden=hidden,
                           inter=inter, skip_aligned=aligned_bases)
    launch(_wgrad_kernel, grid, a, b, a_rows, b_rows, offsets, out_arg, ptrs_arg, errors,
        tokens_sum, experts, HIDDEN=hidden, INTER=inter, A_K_MAJOR=a_k_major, B_K_MAJOR=b_k_major,
        RAGGED=ragged, DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate, DOT_FP32=dot_fp32,
        OUT_DTYPE=TL_DTYPES[out_dtype], K_ALIGNED=k_aligned,
        RAGGED_ALIGNED=ragged and aligned_bases,
        # with the rows, two-byte loads remain only for out-of-order offsets
        RAGGED_PREFETCH=ragged and cfg.ragged_prefetch and rows is None,
        RAGGED_ROWS=ragged and rows is not None, SKIP_TMA_TAKEN=skip_tma_taken, PDL=pdl,
        EXPERTS_POW2=experts_pow2,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, GROUP_M=cfg.group_m, launch_pdl=pdl,
        **cfg.launch_options())


def launch_wgrad_fp8(cfg: GemmConfig, a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype,
                     errors, *, hidden: int, inter: int, accumulate: bool, dot_fp32: bool) -> None:
    """FP8 codes ``a`` (hidden, T) and ``b`` (T, intermediate), both K-major, with scales:
    a_scale (hidden, blocks), b_scale (blocks, intermediate), uint8 E8M0 per 32 tokens (MXFP8)
    or FP32 per 128 tokens (``cfg`` from ``fp8_config`` for that block), any strides (those
    with unit stride along hidden and intermediate take a variant with cheaper scale loads)."""
    launch_args = _grid_and_outputs(cfg, hidden, inter, a, offsets, out, out_ptrs)
    if launch_args is None:
        return
    grid, out_arg, ptrs_arg = launch_args
    tokens_sum = a.shape[1]
    rows_aligned = tokens_sum % 16 == 0 and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    common = dict(HIDDEN=hidden, INTER=inter,
                  SCALES_MN_MAJOR=a_scale.stride(0) == 1 and b_scale.stride(1) == 1,
                  ROWS_ALIGNED=rows_aligned, DISCRETE=out_ptrs is not None,
                  ACCUMULATE=accumulate, DOT_FP32=dot_fp32, OUT_DTYPE=TL_DTYPES[out_dtype],
                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages,
                  GROUP_M=cfg.group_m, **cfg.launch_options())
    args = (a, b, a_scale, b_scale, offsets, out_arg, ptrs_arg, errors, tokens_sum,
            a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1))
    if a_scale.dtype == torch.uint8:
        launch(_wgrad_mx_kernel, grid, *args, BLOCK_K=cfg.block_k, **common)
    else:
        launch(_wgrad_fp8_kernel, grid, *args, SCALE_BLOCK=cfg.block_k, **common)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles at the first benchmark case's hidden and
    intermediate sizes: BF16 layouts with and without the 8-token loads (ragged: its aligned
    experts' loop; and the ``ragged_prefetch`` loop at the plan's tile), output modes; FP8 with
    both scale blocks and scale layouts."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    bf16 = dict(A="*bf16", B="*bf16", A_ROWS="*bf16", B_ROWS="*bf16", OFFSETS="*i32",
                OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32", tokens_sum="i32", experts="i32",
                HIDDEN=c, INTER=c, A_K_MAJOR=c, B_K_MAJOR=c, RAGGED=c, DISCRETE=c, ACCUMULATE=c,
                DOT_FP32=c, OUT_DTYPE=c, K_ALIGNED=c, RAGGED_ALIGNED=c, RAGGED_PREFETCH=c,
                RAGGED_ROWS=c, SKIP_TMA_TAKEN=c, PDL=c,
                EXPERTS_POW2=c,
                BLOCK_M=c, BLOCK_N=c, BLOCK_K=c, NUM_STAGES=c, GROUP_M=c)
    plan_cfg = gemm_config(False)
    cases = [CompileCase(
        f"wgrad a_k={a_k} b_k={b_k} ragged={ragged} discrete={discrete} acc={acc} "
        f"aligned={aligned}{' ragged_prefetch (plan tile)' if prefetch else ''}"
        f"{' ragged rows' if rows else ''}{' TMA experts skipped' if skip else ''}",
        _wgrad_kernel,
        bf16, dict(HIDDEN=hidden, INTER=inter, A_K_MAJOR=a_k, B_K_MAJOR=b_k, RAGGED=ragged,
                   DISCRETE=discrete, ACCUMULATE=acc, DOT_FP32=False, OUT_DTYPE=tl.bfloat16,
                   K_ALIGNED=aligned and not ragged, RAGGED_ALIGNED=aligned and ragged,
                   RAGGED_PREFETCH=prefetch, RAGGED_ROWS=rows, SKIP_TMA_TAKEN=skip,
                   PDL=skip, EXPERTS_POW2=8, BLOCK_M=128,
                   BLOCK_N=plan_cfg.block_n if prefetch or rows else 128, BLOCK_K=64,
                   NUM_STAGES=3, GROUP_M=8), num_warps=8)
        for a_k, b_k, ragged, discrete, acc, aligned, prefetch, rows, skip in (
                (False, False, False, False, False, False, False, False, False),
                (True, False, False, False, False, False, False, False, False),
                (True, False, False, False, False, True, False, False, False),
                (True, True, False, False, False, True, False, False, False),
                (False, True, False, True, True, True, False, False, False),
                (False, True, False, True, True, False, False, False, False),
                (True, False, True, False, False, False, False, False, False),
                (True, True, True, False, False, True, False, False, False),
                (True, True, True, False, False, True, True, False, False),
                (True, True, True, False, False, True, False, True, False),
                (True, True, True, False, False, True, False, True, True))]
    cases.append(CompileCase(
        "wgrad ragged blocks to rows", _ragged_rows_kernel,
        dict(A="*bf16", B="*bf16", A_ROWS="*bf16", B_ROWS="*bf16", OFFSETS="*i32",
             tokens_sum="i32", experts="i32", HIDDEN=c, INTER=c, SKIP_ALIGNED=c,
             EXPERTS_POW2=c, BLOCK_W=c, BLOCK_T=c),
        dict(HIDDEN=hidden, INTER=inter, SKIP_ALIGNED=True, EXPERTS_POW2=8,
             BLOCK_W=ROWS_CONFIG.block_w, BLOCK_T=ROWS_CONFIG.block_t),
        num_warps=ROWS_CONFIG.num_warps))
    for aligned, stages in ((False, 1), (True, 1), (True, 3)):
        cases.append(CompileCase(
            "wgrad ragged blocks padded to 64 tokens"
            + (f", aligned loads, {stages} stages" if aligned else ""), _ragged_padded_kernel,
            dict(A="*bf16", B="*bf16", A_PAD="*bf16", B_PAD="*bf16", OFFSETS="*i32",
                 OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32", tokens_sum="i32", experts="i32",
                 HIDDEN=c, INTER=c, EXPERTS_POW2=c, BLOCK_R=c, BLOCK_T=c, PDL=c, ALIGNED=c,
                 STAGES=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c),
            dict(HIDDEN=hidden, INTER=inter, EXPERTS_POW2=8, BLOCK_R=PADDED_CONFIG.block_r,
                 BLOCK_T=PADDED_CONFIG.block_t, PDL=True, ALIGNED=aligned, STAGES=stages,
                 DISCRETE=stages == 3, ACCUMULATE=stages == 3, OUT_DTYPE=tl.bfloat16),
            num_warps=PADDED_CONFIG.num_warps))
    fp8 = dict(A="*fp8e4nv", B="*fp8e4nv", OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64",
               ERRORS="*i32", tokens_sum="i32", sa_m="i64", sa_k="i64", sb_k="i64", sb_n="i64",
               HIDDEN=c, INTER=c, SCALES_MN_MAJOR=c, ROWS_ALIGNED=c, DISCRETE=c, ACCUMULATE=c,
               DOT_FP32=c, OUT_DTYPE=c, BLOCK_M=c, BLOCK_N=c, NUM_STAGES=c, GROUP_M=c)
    for scale_block, mn_major, rows_aligned, discrete in (
            (128, True, True, False), (128, False, True, False), (32, True, True, False),
            (32, False, True, False), (32, True, False, True), (128, False, False, True)):
        cfg = fp8_config(False, scale_block)
        mx = scale_block == 32
        values = dict(HIDDEN=hidden, INTER=inter, SCALES_MN_MAJOR=mn_major,
                      ROWS_ALIGNED=rows_aligned, DISCRETE=discrete, ACCUMULATE=discrete,
                      DOT_FP32=False, OUT_DTYPE=tl.bfloat16, BLOCK_M=cfg.block_m,
                      BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages, GROUP_M=cfg.group_m)
        if mx:
            kernel, signature = _wgrad_mx_kernel, dict(fp8, A_SCALE="*u8", B_SCALE="*u8",
                                                       BLOCK_K=c)
            values["BLOCK_K"] = cfg.block_k
        else:
            kernel, signature = _wgrad_fp8_kernel, dict(fp8, A_SCALE="*fp32", B_SCALE="*fp32",
                                                        SCALE_BLOCK=c)
            values["SCALE_BLOCK"] = scale_block
        cases.append(CompileCase(
            f"wgrad {'mxfp8' if mx else 'fp8 fp32x128'} scales_mn_major={mn_major} "
            f"rows_aligned={rows_aligned} discrete={discrete}", kernel,
            {k: signature[k] for k in kernel.arg_names}, values, num_warps=cfg.num_warps))
    return cases
