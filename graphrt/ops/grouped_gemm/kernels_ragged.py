"""Hopper kernel (Gluon, Triton 3.6) for the BF16 grouped wgrad with ragged inputs: the
experts whose token count n_e is a multiple of 8, their blocks A_e [hidden, n_e] and B_e
[intermediate, n_e] (tokens unit-stride, so rows 16-byte aligned) read by TMA as they lie. TMA
takes no row stride off 16 bytes (boxes of odd counts stopped the kernel with an illegal
instruction on the H200, 2026-12-03) and no box whose first element is off a 16-byte boundary
(views of every 8th row, which have 16-byte strides, stopped it the same way on an H100,
2026-12-06), so the others are read from a copy with rows padded to
64 tokens (``RaggedTmaConfig.padded_odd``, kernels.launch_ragged_padded, launched before this
kernel), and every expert is taken when the offsets are in order. The experts left (all of
them out of order, or those off multiples of 8 without the copy) go to the Triton kernel
(kernels.py), launched after this one. Plans run it for up to
PLAN_MAX_EXPERTS experts; tensor2d operands have their own TMA kernel (kernels_tensor2d.py).

A work item is one [128, 256] tile of one expert's output: one box of each operand a stage
of 64 tokens, the tokens past n_e zero-filled by TMA (they lie outside the descriptor), so
nothing is zeroed in shared memory; the product is stored 16 bytes a thread
(kernels_gluon._store_layout).

Persistent and warp-specialized like the 1x128 FP8 kernel (kernels_gluon.py): a loader warp
makes each work item's two descriptors on the device (routing may change between CUDA-graph
replays) and streams the boxes through a ring of stages; two MMA warpgroups of 64 output rows
each keep one product in flight. Up to ``RaggedTmaConfig.sorted_max_experts`` experts,
program p takes the items of the experts sorted by count, largest first, the programs' order
reversed every round (docs/perf/wgrad.md's model of the split; every partition computes the
same order), the experts left to the Triton kernel ranked last and never walked; above that,
or with ``sorted_experts=False``, items p, p + programs, ... (experts outermost), skipping
those experts' items one by one. Device-made descriptors live in Triton's global scratch,
which the launch takes from the caching allocator (kernel_utils.ScratchRun), in two slots that
items take in turn: before it rewrites a slot, the loader waits for the loads still in flight
that read it.
"""
from __future__ import annotations

from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ...kernel_utils import (CompileCase, CONSTEXPR, launch_with_scratch, ON_TESTED_TRITON,
                             register_share, TL_DTYPES, untested_triton_case, use_pdl)
from ...device_checks import PADDED_COPY_LATE
from ...validate import sm_count
from . import kernels as _triton_kernels
from .kernels import experts_vector
from .kernels_gluon import (_bounds_at, _expert_at_rank, _expert_ranks, _release,
                            _sorted_rounds, _sorted_tile_work, _offsets_in_order,
                            _stage_barriers, _store_item, _store_layout, _tile_count, _tma_takes,
                            _work, BLOCK_M, TMA_FIRST)

# where the padded copy puts an expert's block, and its rows' length: the copy's own code
_padded_slot = gluon.jit(_triton_kernels._padded_slot.fn)
_padded_count = gluon.jit(_triton_kernels._padded_count.fn)
# the word copy's arithmetic, shared with kernels._ragged_padded_kernel
_words_at = gluon.jit(_triton_kernels._words_at.fn)
_words_end = gluon.jit(_triton_kernels._words_end.fn)
_words_moved = gluon.jit(_triton_kernels._words_moved.fn)
_padded_words_at = gluon.jit(_triton_kernels._padded_words_at.fn)

BLOCK_N = gl.constexpr(256)   # tiles of BLOCK_M = 128 rows: two warpgroups of 64
BLOCK_K = gl.constexpr(64)    # tokens a stage: 128 bytes, the swizzle's width
GROUP_M = 8
GLUON_API_OK = ON_TESTED_TRITON
# at 128 and 256 experts (items of 2-4 steps) the Triton kernel alone was 4-9% faster than
# this kernel then the Triton kernel's share at random counts on the H200 (2-3% slower at
# equal counts; docs/perf/wgrad.md, 2026-12-03)
PLAN_MAX_EXPERTS = 64
LAUNCH_REGS = register_share(4 + 4 + 4)
LOADER_REGS, MMA_REGS = gl.constexpr(48), gl.constexpr(224)
# with the copy under the product: its warps share the loader's warpgroup (setmaxnreg sets a
# warpgroup's registers as one: RaggedTmaConfig.copy_regs), and the MMA warpgroup of the
# default partition takes what is left (200 registers beside 80)
COPY_WARPS = gl.constexpr(2)
assert PADDED_COPY_LATE == 8, "the bit _wait_copied's inline assembly sets"


@dataclass(frozen=True)
class RaggedTmaConfig:
    """Shared-memory stages of 48 KB (A's 128 and B's 256 rows of 64 tokens); ``sorted_experts``:
    for calls of at most ``sorted_max_experts`` experts, the programs walk the experts largest
    first, the programs' order reversed every round, rather than experts in order, program p
    taking items p, p + programs, ... On the H200 (docs/perf/wgrad.md, 2026-12-03) the sorted
    split is 2-10% faster at 8 and 32 experts with random counts (the static split leaves some
    SMs the large experts' items), 2-5% slower at equal counts, and 5-9% slower at 128 and 256
    experts, where looking up each item's expert costs more than the balance gains.
    ``padded_odd``: plans with a call workspace first copy the experts whose counts are off
    multiples of 8 with rows padded to 64 tokens (kernels.launch_ragged_padded), and this kernel
    reads those copies, taking every expert when the offsets are in order. On the H200
    (docs/perf/wgrad.md, 2026-12-04) that is 2-5% faster at odd counts than the Triton kernel
    on the experts copied as rows, and no slower at counts in multiples of 256."""

    stages: int = 4
    sorted_experts: bool = True
    sorted_max_experts: int = 64
    padded_odd: bool = True
    # the padded copy made inside this kernel, under the product: COPY_WARPS warps of every
    # program copy [copy_rows, 64-token] chunks of it, 8-byte words through ``copy_stages``
    # shared-memory stages (cp.async), the experts largest first, token tile outermost; the
    # loader waits for each token tile's chunks (counters in the workspace) before reading it
    copy_under: bool = False
    copy_rows: int = 32
    copy_stages: int = 3
    copy_run: int = 16   # chunks of one token tile a program copies before it counts them
    copy_regs: int = 80

    def sorts(self, experts: int) -> bool:
        """Whether a call of ``experts`` experts takes the sorted split."""
        return self.sorted_experts and experts <= self.sorted_max_experts


RAGGED_TMA_CONFIG = RaggedTmaConfig()


@gluon.jit
def _odd_taken(OFFSETS, experts, tokens_sum, EXPERTS_POW2: gl.constexpr, PADDED: gl.constexpr,
               WARPS: gl.constexpr):
    """Whether this kernel takes the experts off multiples of 8 tokens: PADDED (their padded
    copy is given) and every expert's bounds valid (the copy's condition)."""
    if PADDED:
        return _offsets_in_order(OFFSETS, experts, tokens_sum, EXPERTS_POW2, WARPS)
    return False


@gluon.jit
def _ptx(INSTRUCTION: gl.constexpr):
    """One PTX instruction without operands (its text ends in ``// $0``, the unused result)."""
    gl.inline_asm_elementwise(INSTRUCTION, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait_copied(READY_AT, COLS: gl.constexpr, ERRORS):
    """Waits until all COLS chunks of the padded copy's token tile counted at READY_AT are
    written (``_chunk_released``), then orders this thread's TMA reads after those writes.
    After about 2^20 polls (far longer than any copy) it flags PADDED_COPY_LATE and goes on
    rather than hang: whether it did (the caller then stops waiting)."""
    written = gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                        [READY_AT], dtype=gl.int32, is_pure=False, pack=1)
    polls = 0
    while (written < COLS) & (polls < 2**20):
        written = gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                            [READY_AT], dtype=gl.int32, is_pure=False, pack=1)
        polls += 1
    if written < COLS:   # device_checks.PADDED_COPY_LATE (8)
        gl.inline_asm_elementwise(
            "{ .reg .b32 late; mov.b32 late, 8; red.relaxed.gpu.global.or.b32 [$1], late; "
            "mov.u32 $0, 0; }", "=r,l", [ERRORS], dtype=gl.int32, is_pure=False, pack=1)
    _ptx("fence.proxy.async.global; // $0")
    return written < COLS


@gluon.jit
def _wait_landed(ready, lo, hi):
    """Waits until the loads of the filled stages lo .. hi - 1 have landed (each among the
    last STAGES filled: its barrier's latest phase)."""
    STAGES: gl.constexpr = ready.shape[0]
    for stage in range(lo, hi):
        mbarrier.wait(ready.index(stage % STAGES), (stage // STAGES) & 1)


@gluon.jit
def _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0, count,
               READY_AT, wait, ERRORS, HIDDEN: gl.constexpr, INTER: gl.constexpr,
               COPY_UNDER: gl.constexpr, COPY_ROWS: gl.constexpr):
    """The item's descriptors made (the expert's blocks [hidden, n_e] and [intermediate, n_e]
    at a_block and b_block, rows ``row_stride`` tokens apart, a multiple of 8), one box of each
    streamed into the stages from the i-th filled on, the tokens past n_e coming as zeros: the
    next stage to fill. COPY_UNDER and ``wait``: the blocks are the padded copy made under the
    product, each box read once its token tile's counter (READY_AT + k0 / 64) is complete."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    NBYTES: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K * 2
    n = count.to(gl.int32)
    a_desc = tma.make_tensor_descriptor(a_block, [HIDDEN, n], [row_stride, 1],
                                        [BLOCK_M, BLOCK_K], a_bufs.type.layout)
    b_desc = tma.make_tensor_descriptor(b_block, [INTER, n], [row_stride, 1],
                                        [BLOCK_N, BLOCK_K], b_bufs.type.layout)
    for k0 in range(0, n, BLOCK_K):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # fresh barriers: phase 1 passes
        if COPY_UNDER:
            if wait:
                late = _wait_copied(READY_AT + k0 // BLOCK_K,
                                    _copy_cols(HIDDEN, INTER, COPY_ROWS), ERRORS)
                wait = wait & ~late
        bar = ready.index(s)
        mbarrier.expect(bar, NBYTES)
        tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [n0, k0], bar, b_bufs.index(s))
        i += 1
    return i


@gluon.jit
def _ragged_load_partition(A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty, OFFSETS,
                           ERRORS, experts, tokens_sum, HIDDEN: gl.constexpr,
                           INTER: gl.constexpr, GROUP: gl.constexpr, SORTED: gl.constexpr,
                           EXPERTS_POW2: gl.constexpr, PADDED: gl.constexpr,
                           COPY_UNDER: gl.constexpr, COPY_ROWS: gl.constexpr):
    """Items alternate between two descriptor slots (two call sites of _load_item, so two
    places in the global scratch): an item rewrites the slot of the item before the last, and
    first waits for that item's loads still in flight (those among the last STAGES filled;
    a stage refilled since was consumed, so it had landed)."""
    slots = (0, 0, 0, 0, 0, 0)   # the next stage, the slot, each slot's first and end stage
    odd_taken = _odd_taken(OFFSETS, experts, tokens_sum, EXPERTS_POW2, PADDED, 1)
    if SORTED:
        ranks, idx, taken = _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2, 1, 4,
                                          TMA_FIRST, odd_taken)
        for round_ in range(0, _sorted_rounds(taken, _tile_count(HIDDEN, INTER, BLOCK_N))):
            live, expert, m0, n0, begin, end = _sorted_tile_work(
                round_, ranks, idx, taken, OFFSETS, ERRORS, experts, tokens_sum, False, HIDDEN,
                INTER, BLOCK_N, GROUP)
            count = end - begin
            if live & (count > 0) & (_tma_takes(count) | odd_taken):
                slots = _load_in_slot(A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty,
                                      slots, expert, m0, n0, begin, count, ERRORS, HIDDEN,
                                      INTER, PADDED, COPY_UNDER, COPY_ROWS)
    else:
        for work in range(gl.program_id(0), experts * _tile_count(HIDDEN, INTER, BLOCK_N),
                          gl.num_programs(0)):
            expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, False,
                                               HIDDEN, INTER, BLOCK_N, GROUP)
            count = end - begin
            if (count > 0) & (_tma_takes(count) | odd_taken):
                slots = _load_in_slot(A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty,
                                      slots, expert, m0, n0, begin, count, ERRORS, HIDDEN,
                                      INTER, PADDED, COPY_UNDER, COPY_ROWS)


@gluon.jit
def _load_in_slot(A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty, slots, expert, m0,
                  n0, begin, count, ERRORS, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                  PADDED: gl.constexpr, COPY_UNDER: gl.constexpr, COPY_ROWS: gl.constexpr):
    """One item's loads with its descriptors in the slot whose turn it is: ``slots`` after it.
    PADDED: an expert off multiples of 8 tokens is read from its padded copy (rows 128 bytes
    apart; kernels._ragged_padded_kernel, or with COPY_UNDER ``_ragged_copy_partition``, whose
    counters for the expert's token tiles start at READY_AT)."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    a_block = A + HIDDEN * begin
    b_block = B + INTER * begin
    row_stride = count
    ready_at = READY
    wait = count < 0   # False, as a scalar tensor
    if PADDED:
        if count % 8 != 0:
            slot = _padded_slot(begin, expert)
            a_block = A_PAD + HIDDEN * slot
            b_block = B_PAD + INTER * slot
            row_stride = _padded_count(count)
            ready_at = READY + slot // BLOCK_K
            wait = count >= 0
    i, slot, start0, end0, start1, end1 = slots
    if slot == 0:
        _wait_landed(ready, gl.maximum(start0, i - STAGES), end0)
        start0 = i
        i = _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0,
                       count, ready_at, wait, ERRORS, HIDDEN, INTER, COPY_UNDER, COPY_ROWS)
        end0 = i
    else:
        _wait_landed(ready, gl.maximum(start1, i - STAGES), end1)
        start1 = i
        i = _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0,
                       count, ready_at, wait, ERRORS, HIDDEN, INTER, COPY_UNDER, COPY_ROWS)
        end1 = i
    return i, 1 - slot, start0, end0, start1, end1


@gluon.jit
def _ragged_mma_partition(a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS, ERRORS,
                          experts, tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                          DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                          OUT_DTYPE: gl.constexpr, GROUP: gl.constexpr, SORTED: gl.constexpr,
                          EXPERTS_POW2: gl.constexpr, PADDED: gl.constexpr, ROW0: gl.constexpr):
    """One warpgroup: rows ROW0 .. ROW0 + 63 of each tile's A box. The experts that
    ``_tma_takes`` leaves (none with PADDED and the offsets in order) are the Triton
    kernel's."""
    i = 0
    odd_taken = _odd_taken(OFFSETS, experts, tokens_sum, EXPERTS_POW2, PADDED, 4)
    if SORTED:
        ranks, idx, taken = _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2, 4, 8,
                                          TMA_FIRST, odd_taken)
        for round_ in range(0, _sorted_rounds(taken, _tile_count(HIDDEN, INTER, BLOCK_N))):
            live, expert, m0, n0, begin, end = _sorted_tile_work(
                round_, ranks, idx, taken, OFFSETS, ERRORS, experts, tokens_sum, ROW0 == 0,
                HIDDEN, INTER, BLOCK_N, GROUP)
            count = end - begin
            if live & (_tma_takes(count) | odd_taken):
                i = _ragged_item(a_bufs, b_bufs, ready, empty, OUT, OUT_PTRS, expert, m0, n0,
                                 count, i, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, ROW0)
    else:
        for work in range(gl.program_id(0), experts * _tile_count(HIDDEN, INTER, BLOCK_N),
                          gl.num_programs(0)):
            expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum,
                                               ROW0 == 0, HIDDEN, INTER, BLOCK_N, GROUP)
            count = end - begin
            if _tma_takes(count) | odd_taken:
                i = _ragged_item(a_bufs, b_bufs, ready, empty, OUT, OUT_PTRS, expert, m0, n0,
                                 count, i, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE, ROW0)


@gluon.jit
def _ragged_item(a_bufs, b_bufs, ready, empty, OUT, OUT_PTRS, expert, m0, n0, count, i,
                 HIDDEN: gl.constexpr, INTER: gl.constexpr, DISCRETE: gl.constexpr,
                 ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr, ROW0: gl.constexpr):
    """One work item of one warpgroup: the product over the expert's stages (the i-th filled
    onwards) and its store; the stages used so far."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([64, BLOCK_N], gl.float32, layout)
    steps = (count + BLOCK_K - 1) // BLOCK_K
    for step in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s).slice(ROW0, 64, dim=0),
                            b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if step > 0:
            _release(empty, i - 1)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if steps > 0:
        _release(empty, i - 1)
    out_layout: gl.constexpr = _store_layout(BLOCK_N)
    tile = gl.convert_layout(acc, out_layout)
    m = m0 + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    _store_item(tile, OUT, OUT_PTRS, expert, m, n, count > 0, HIDDEN, INTER, DISCRETE,
                ACCUMULATE, OUT_DTYPE)
    return i


@gluon.constexpr_function
def _copy_cols(hidden, inter, rows):
    """Chunks of one 64-token tile of an expert's padded copy: A's and B's rows, ``rows`` a
    chunk."""
    return (hidden + rows - 1) // rows + (inter + rows - 1) // rows


@gluon.jit
def _chunk_at(c, A, B, A_PAD, B_PAD, READY, expert, begin, count, HIDDEN: gl.constexpr,
              INTER: gl.constexpr, ROWS: gl.constexpr):
    """(source block, padded block, first row, first token, width, counter) of chunk ``c`` of
    one expert's padded copy: token tile c // cols, A's row chunks then B's."""
    COLS_A: gl.constexpr = (HIDDEN + ROWS - 1) // ROWS
    cols: gl.constexpr = _copy_cols(HIDDEN, INTER, ROWS)
    col = c % cols
    t0 = (c // cols) * BLOCK_K
    slot = _padded_slot(begin, expert)
    on_a = col < COLS_A
    src = gl.where(on_a, A + HIDDEN * begin, B + INTER * begin)
    dst = gl.where(on_a, A_PAD + HIDDEN * slot, B_PAD + INTER * slot)
    r0 = gl.where(on_a, col, col - COLS_A) * ROWS
    width = gl.where(on_a, HIDDEN, INTER)
    return src, dst, r0, t0, width, READY + slot // BLOCK_K + c // cols


@gluon.jit
def _chunk_issued(c, live, lows, highs, A, B, A_PAD, B_PAD, READY, expert, begin, count,
                  HIDDEN: gl.constexpr, INTER: gl.constexpr, ROWS: gl.constexpr,
                  layout: gl.constexpr):
    """The words of chunk ``c`` (``_tile_words``' pair: each word, the word after it) loaded
    into one staging stage by cp.async, none where not ``live``; one commit group."""
    src, _, r0, t0, width, _ = _chunk_at(c, A, B, A_PAD, B_PAD, READY, expert, begin, count,
                                         HIDDEN, INTER, ROWS)
    r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    w = gl.arange(0, BLOCK_K // 4, layout=gl.SliceLayout(0, layout))
    at, keep = _words_at(r, w, t0, count, width)
    words = src.to(gl.pointer_type(gl.uint64), bitcast=True) + at
    keep = keep & live
    async_copy.async_copy_global_to_shared(lows, words, mask=keep)
    async_copy.async_copy_global_to_shared(highs, words + 1,
                                           mask=keep & (at + 1 < _words_end(count, width)))
    async_copy.commit_group()


@gluon.jit
def _chunks_released(READY_AT, n, WARPS: gl.constexpr):
    """Counts ``n`` more chunks of a token tile as written: after every thread's stores (made
    visible to TMA's reads, the async proxy), one release add at GPU scope, by the first
    thread. The release waits for the stores to land, so it comes once a run of chunks."""
    _ptx("fence.proxy.async.global; // $0")
    gl.thread_barrier()
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    lane = gl.arange(0, 32 * WARPS, layout=lanes)
    gl.inline_asm_elementwise(
        "{ .reg .pred first; setp.eq.s32 first, $1, 0; "
        "@first red.release.gpu.global.add.s32 [$2], $3; mov.u32 $0, 0; }", "=r,r,l,r",
        [lane, READY_AT + lane * 0, lane * 0 + n.to(gl.int32)], dtype=gl.int32,
        is_pure=False, pack=1)


@gluon.jit
def _ragged_copy_partition(A, B, A_PAD, B_PAD, READY, lows, highs, OFFSETS, experts,
                           tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                           EXPERTS_POW2: gl.constexpr, RUN: gl.constexpr):
    """The padded copy (kernels._ragged_padded_kernel's, 8-byte words) made under the
    product when every expert's bounds are valid: the experts off multiples of 8 tokens in the
    product's order (largest first), each as chunks of ``lows.shape[1]`` rows (A's, then B's)
    of one 64-token tile, token tile outermost. Runs of RUN chunks of one token tile (the
    tile's last run shorter) go to the programs in turn: run g of the whole sequence is
    program g % programs's. The chunks' words go through the staging stages ``lows`` and
    ``highs`` (the word after each), issued STAGES - 1 chunks ahead; each run then counts its
    chunks at READY[slot / 64 + token tile] (``_chunks_released``), zeroed before the
    kernel."""
    WARPS: gl.constexpr = COPY_WARPS
    STAGES: gl.constexpr = lows.shape[0]
    ROWS: gl.constexpr = lows.shape[1]
    cols: gl.constexpr = _copy_cols(HIDDEN, INTER, ROWS)
    runs_a_tile: gl.constexpr = (cols + RUN - 1) // RUN
    words: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [WARPS, 1], [1, 0])
    in_order = _offsets_in_order(OFFSETS, experts, tokens_sum, EXPERTS_POW2, WARPS)
    if in_order:
        ranks, idx, taken = _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2, WARPS, 4,
                                          TMA_FIRST, in_order)
        begins, counts, bad = _bounds_at(OFFSETS, idx, experts, tokens_sum)
        programs = gl.num_programs(0)
        start = gl.program_id(0).to(gl.int64) * 0   # the expert's first run of all
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, words))
        w = gl.arange(0, BLOCK_K // 4, layout=gl.SliceLayout(0, words))
        for rank in range(0, taken):
            expert = _expert_at_rank(ranks, idx, rank)
            here = idx == expert
            begin = gl.sum(gl.where(here, begins, 0), axis=0)
            count = gl.sum(gl.where(here, counts, 0), axis=0)
            runs = gl.where(count % 8 != 0, gl.cdiv(count, BLOCK_K) * runs_a_tile, 0)
            first = (gl.program_id(0) - start % programs + programs) % programs
            # this program's chunk slots: RUN a run, those past a tile's chunks left empty
            slots = (gl.where(first < runs, gl.cdiv(runs - first, programs), 0) *
                     RUN).to(gl.int32)
            for k in gl.static_range(STAGES - 1):
                c, live = _run_chunk(k, first, programs, cols, RUN)
                _chunk_issued(c, live & (k < slots), lows.index(k), highs.index(k), A, B,
                              A_PAD, B_PAD, READY, expert, begin, count, HIDDEN, INTER, ROWS,
                              words)
            for k in range(0, slots):
                ahead = k + STAGES - 1
                c, live = _run_chunk(ahead, first, programs, cols, RUN)
                _chunk_issued(c, live & (ahead < slots), lows.index(ahead % STAGES),
                              highs.index(ahead % STAGES), A, B, A_PAD, B_PAD, READY, expert,
                              begin, count, HIDDEN, INTER, ROWS, words)
                async_copy.wait_group(STAGES - 1)
                low = lows.index(k % STAGES).load(words)
                high = highs.index(k % STAGES).load(words)
                c, live = _run_chunk(k, first, programs, cols, RUN)
                src, dst, r0, t0, width, _ = _chunk_at(c, A, B, A_PAD, B_PAD, READY, expert,
                                                       begin, count, HIDDEN, INTER, ROWS)
                at, keep = _padded_words_at(r0 + r, w, t0, count, width)
                gl.store(dst.to(gl.pointer_type(gl.uint64), bitcast=True) + at,
                         _words_moved(low, high, r0 + r, w, t0, count), mask=keep & live)
                if k % RUN == RUN - 1:   # the run's last slot: count its chunks
                    run = first + (k // RUN) * programs
                    _chunks_released(READY + _padded_slot(begin, expert) // BLOCK_K +
                                     run // runs_a_tile,
                                     gl.minimum(cols - (run % runs_a_tile) * RUN, RUN), WARPS)
            async_copy.wait_group(0)
            start += runs


@gluon.jit
def _run_chunk(k, first, programs, COLS: gl.constexpr, RUN: gl.constexpr):
    """(chunk of the expert's copy, whether it exists) of this program's k-th chunk slot:
    slot k % RUN of its (k // RUN)-th run, run first + (k // RUN) * programs of the expert,
    its tile's runs RUN chunks apart."""
    RUNS_A_TILE: gl.constexpr = (COLS + RUN - 1) // RUN
    run = first + (k // RUN) * programs
    in_tile = (run % RUNS_A_TILE) * RUN + k % RUN
    return (run // RUNS_A_TILE) * COLS + in_tile, in_tile < COLS


@gluon.jit(do_not_specialize=["experts", "tokens_sum"])
def _wgrad_ragged_tma_kernel(A, B, A_PAD, B_PAD, READY, OFFSETS, OUT, OUT_PTRS, ERRORS, experts,
                             tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                             DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                             OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                             SORTED: gl.constexpr, EXPERTS_POW2: gl.constexpr,
                             PADDED: gl.constexpr, WAIT_PRIOR: gl.constexpr,
                             COPY_UNDER: gl.constexpr, COPY_ROWS: gl.constexpr,
                             COPY_STAGES: gl.constexpr, COPY_RUN: gl.constexpr,
                             COPY_REGS: gl.constexpr):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], smem)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready, empty, _ = _stage_barriers(STAGES)
    # the copy and the Triton kernel launched after this one (programmatic dependent launches)
    # may start while it drains: they wait for it before they read what it writes or end
    _ptx("griddepcontrol.launch_dependents; // $0")
    if WAIT_PRIOR:   # a dependent launch itself, after the padded copy (or the zeroed
        _ptx("griddepcontrol.wait; // $0")   # counters): wait for its writes
    if COPY_UNDER:
        staging: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        lows = gl.allocate_shared_memory(gl.uint64, [COPY_STAGES, COPY_ROWS, BLOCK_K // 4],
                                         staging)
        highs = gl.allocate_shared_memory(gl.uint64, [COPY_STAGES, COPY_ROWS, BLOCK_K // 4],
                                          staging)
        gl.warp_specialize([
            (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS,
                                     ERRORS, experts, tokens_sum, HIDDEN, INTER, DISCRETE,
                                     ACCUMULATE, OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2,
                                     PADDED, 0)),
            (_ragged_load_partition, (A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty,
                                      OFFSETS, ERRORS, experts, tokens_sum, HIDDEN, INTER,
                                      GROUP, SORTED, EXPERTS_POW2, PADDED, True, COPY_ROWS)),
            (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS,
                                     ERRORS, experts, tokens_sum, HIDDEN, INTER, DISCRETE,
                                     ACCUMULATE, OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2,
                                     PADDED, 64)),
            (_ragged_copy_partition, (A, B, A_PAD, B_PAD, READY, lows, highs, OFFSETS, experts,
                                      tokens_sum, HIDDEN, INTER, EXPERTS_POW2, COPY_RUN)),
        ], [1, 4, COPY_WARPS], [COPY_REGS, MMA_REGS, COPY_REGS])
    else:
        gl.warp_specialize([
            (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS,
                                     ERRORS, experts, tokens_sum, HIDDEN, INTER, DISCRETE,
                                     ACCUMULATE, OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2,
                                     PADDED, 0)),
            (_ragged_load_partition, (A, B, A_PAD, B_PAD, READY, a_bufs, b_bufs, ready, empty,
                                      OFFSETS, ERRORS, experts, tokens_sum, HIDDEN, INTER,
                                      GROUP, SORTED, EXPERTS_POW2, PADDED, False, COPY_ROWS)),
            (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS,
                                     ERRORS, experts, tokens_sum, HIDDEN, INTER, DISCRETE,
                                     ACCUMULATE, OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2,
                                     PADDED, 64)),
        ], [1, 4], [LOADER_REGS, MMA_REGS])


def fits_ragged_tma_kernel(hidden: int, inter: int, experts: int, capability) -> bool:
    """Whether plans run this kernel for ragged BF16 operands of these sizes: a Hopper GPU,
    Triton 3.6, hidden and intermediate multiples of 8 (every ragged expert's blocks then
    start 16-byte aligned in the 16-byte aligned buffers plans require), and at most
    PLAN_MAX_EXPERTS experts."""
    return (GLUON_API_OK and capability is not None and capability[0] == 9
            and hidden % 8 == 0 and inter % 8 == 0 and experts <= PLAN_MAX_EXPERTS)


def fits_tokens(tokens_sum: int) -> bool:
    """Whether a call of ``tokens_sum`` tokens fits TMA's 32-bit extents and coordinates."""
    return tokens_sum < 2**31


def launch_wgrad_ragged_tma(a, b, offsets, out, out_ptrs, out_dtype, errors, *, hidden: int,
                            inter: int, accumulate: bool,
                            config: RaggedTmaConfig = RAGGED_TMA_CONFIG, padded=None,
                            counters=None) -> None:
    """The BF16 wgrad of the experts ``_tma_takes`` through this kernel: a (hidden, T) and b
    (T, intermediate) holding the experts' blocks, arguments as kernels.launch_wgrad's, on
    operands ``fits_ragged_tma_kernel`` and ``fits_tokens`` accept, 16-byte aligned.
    ``padded``: (a_pad, b_pad), the copy kernels.launch_ragged_padded made of the experts off
    multiples of 8 tokens, which this kernel then takes too when the offsets are in order; it
    is then a programmatic dependent launch (where ``use_pdl`` allows) that waits for the copy,
    so that its start overlaps the copy's end. ``counters`` (int32, zeroed just before, as
    kernels.launch_counters_zeroed does): with ``config.copy_under`` and ``padded`` this
    kernel makes the padded copy itself, under the product (``_ragged_copy_partition``)."""
    experts = offsets.numel()
    if experts == 0:
        return
    work = _tile_count(hidden, inter, BLOCK_N.value) * experts
    sort = config.sorts(experts)
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    a_pad, b_pad = padded if padded is not None else (a, b)
    copy_under = padded is not None and counters is not None and config.copy_under
    after_copy = padded is not None and use_pdl(a)
    launch_with_scratch(_wgrad_ragged_tma_kernel, (min(work, sm_count(a.device)),), a, b,
                        a_pad, b_pad, counters if copy_under else offsets, offsets, out_arg,
                        ptrs_arg, errors, experts, a.shape[1], HIDDEN=hidden, INTER=inter,
                        DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate,
                        OUT_DTYPE=TL_DTYPES[out_dtype], STAGES=config.stages, GROUP=GROUP_M,
                        SORTED=sort,
                        EXPERTS_POW2=experts_vector(experts) if sort or padded else 2,
                        PADDED=padded is not None, WAIT_PRIOR=after_copy,
                        COPY_UNDER=copy_under, COPY_ROWS=config.copy_rows,
                        COPY_STAGES=config.copy_stages, COPY_RUN=config.copy_run,
                        COPY_REGS=config.copy_regs, launch_pdl=after_copy, num_warps=4,
                        maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: dense and discrete (accumulating)
    output at the first benchmark case's sizes, both splits; with the padded copy of the
    experts off multiples of 8 tokens (a dependent launch after it), dense, both splits."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for discrete, sorted_experts, padded, under in (
            (False, True, False, False), (True, True, False, False),
            (False, False, False, False), (True, False, False, False),
            (False, True, True, False), (False, False, True, False), (False, True, True, True)):
        name = (f"wgrad ragged TMA (Gluon) discrete={discrete} sorted_experts={sorted_experts}"
                f"{' padded copy' if padded else ''}{' made under the product' if under else ''}")
        if not GLUON_API_OK:
            cases.append(untested_triton_case(name))
            continue
        cases.append(CompileCase(name, _wgrad_ragged_tma_kernel, dict(
            A="*bf16", B="*bf16", A_PAD="*bf16", B_PAD="*bf16", READY="*i32", OFFSETS="*i32",
            OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32", experts="i32", tokens_sum="i32",
            HIDDEN=c, INTER=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, STAGES=c, GROUP=c,
            SORTED=c, EXPERTS_POW2=c, PADDED=c, WAIT_PRIOR=c, COPY_UNDER=c, COPY_ROWS=c,
            COPY_STAGES=c, COPY_RUN=c, COPY_REGS=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=discrete,
                 OUT_DTYPE=gl.bfloat16, STAGES=RAGGED_TMA_CONFIG.stages, GROUP=GROUP_M,
                 SORTED=sorted_experts, EXPERTS_POW2=8 if sorted_experts or padded else 2,
                 PADDED=padded, WAIT_PRIOR=padded, COPY_UNDER=under,
                 COPY_ROWS=RAGGED_TMA_CONFIG.copy_rows,
                 COPY_STAGES=RAGGED_TMA_CONFIG.copy_stages,
                 COPY_RUN=RAGGED_TMA_CONFIG.copy_run, COPY_REGS=RAGGED_TMA_CONFIG.copy_regs),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    return cases
