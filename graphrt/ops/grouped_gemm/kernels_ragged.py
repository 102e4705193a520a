"""Hopper kernel (Gluon; Triton 3.6 and 3.9) for the BF16 grouped wgrad with ragged inputs: the
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
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ...gluon_api import tma_load
from ...kernel_utils import (CompileCase, CONSTEXPR, launch_with_scratch, ON_TESTED_TRITON,
                             register_share, TL_DTYPES, untested_triton_case, use_pdl)
from ...validate import sm_count
from . import kernels as _triton_kernels
from .kernels import experts_vector, output_arguments
from .kernels_gluon import (_expert_ranks, _release, _sorted_rounds, _sorted_tile_work,
                            _offsets_in_order, _stage_barriers, _store_item, _store_layout,
                            _tile_count, _tma_takes, _work, BLOCK_M, TMA_FIRST)

# where the padded copy puts an expert's block, and its rows' length: the copy's own code
_padded_slot = gluon.jit(_triton_kernels._padded_slot.fn)
_padded_count = gluon.jit(_triton_kernels._padded_count.fn)

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
def _wait_landed(ready, lo, hi):
    """Waits until the loads of the filled stages lo .. hi - 1 have landed (each among the
    last STAGES filled: its barrier's latest phase)."""
    STAGES: gl.constexpr = ready.shape[0]
    for stage in range(lo, hi):
        mbarrier.wait(ready.index(stage % STAGES), (stage // STAGES) & 1)


@gluon.jit
def _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0, count,
               HIDDEN: gl.constexpr, INTER: gl.constexpr):
    """The item's descriptors made (the expert's blocks [hidden, n_e] and [intermediate, n_e]
    at a_block and b_block, rows ``row_stride`` tokens apart, a multiple of 8), one box of each
    streamed into the stages from the i-th filled on, the tokens past n_e coming as zeros: the
    next stage to fill."""
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
        bar = ready.index(s)
        mbarrier.expect(bar, NBYTES)
        tma_load(a_desc, [m0, k0], bar, a_bufs.index(s))
        tma_load(b_desc, [n0, k0], bar, b_bufs.index(s))
        i += 1
    return i


@gluon.jit
def _ragged_load_partition(A, B, A_PAD, B_PAD, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS,
                           experts, tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                           GROUP: gl.constexpr, SORTED: gl.constexpr,
                           EXPERTS_POW2: gl.constexpr, PADDED: gl.constexpr):
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
                slots = _load_in_slot(A, B, A_PAD, B_PAD, a_bufs, b_bufs, ready, empty, slots,
                                      expert, m0, n0, begin, count, HIDDEN, INTER, PADDED)
    else:
        for work in range(gl.program_id(0), experts * _tile_count(HIDDEN, INTER, BLOCK_N),
                          gl.num_programs(0)):
            expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum, False,
                                               HIDDEN, INTER, BLOCK_N, GROUP)
            count = end - begin
            if (count > 0) & (_tma_takes(count) | odd_taken):
                slots = _load_in_slot(A, B, A_PAD, B_PAD, a_bufs, b_bufs, ready, empty, slots,
                                      expert, m0, n0, begin, count, HIDDEN, INTER, PADDED)


@gluon.jit
def _load_in_slot(A, B, A_PAD, B_PAD, a_bufs, b_bufs, ready, empty, slots, expert, m0, n0,
                  begin, count, HIDDEN: gl.constexpr, INTER: gl.constexpr, PADDED: gl.constexpr):
    """One item's loads with its descriptors in the slot whose turn it is: ``slots`` after it.
    PADDED: an expert off multiples of 8 tokens is read from its padded copy (rows 128 bytes
    apart; kernels._ragged_padded_kernel)."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    a_block = A + HIDDEN * begin
    b_block = B + INTER * begin
    row_stride = count
    if PADDED:
        if count % 8 != 0:
            slot = _padded_slot(begin, expert)
            a_block = A_PAD + HIDDEN * slot
            b_block = B_PAD + INTER * slot
            row_stride = _padded_count(count)
    i, slot, start0, end0, start1, end1 = slots
    if slot == 0:
        _wait_landed(ready, gl.maximum(start0, i - STAGES), end0)
        start0 = i
        i = _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0,
                       count, HIDDEN, INTER)
        end0 = i
    else:
        _wait_landed(ready, gl.maximum(start1, i - STAGES), end1)
        start1 = i
        i = _load_item(a_block, b_block, row_stride, a_bufs, b_bufs, ready, empty, i, m0, n0,
                       count, HIDDEN, INTER)
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


@gluon.jit(do_not_specialize=["experts", "tokens_sum"])
def _wgrad_ragged_tma_kernel(A, B, A_PAD, B_PAD, OFFSETS, OUT, OUT_PTRS, ERRORS, experts,
                             tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                             DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                             OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                             SORTED: gl.constexpr, EXPERTS_POW2: gl.constexpr,
                             PADDED: gl.constexpr, WAIT_PRIOR: gl.constexpr):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], smem)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready, empty, _ = _stage_barriers(STAGES)
    # the copy and the Triton kernel launched after this one (programmatic dependent launches)
    # may start while it drains: they wait for it before they read what it writes or end
    _ptx("griddepcontrol.launch_dependents; // $0")
    if WAIT_PRIOR:   # a dependent launch itself, after the padded copy: wait for its writes
        _ptx("griddepcontrol.wait; // $0")
    gl.warp_specialize([
        (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS, ERRORS,
                                 experts, tokens_sum, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                                 OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2, PADDED, 0)),
        (_ragged_load_partition, (A, B, A_PAD, B_PAD, a_bufs, b_bufs, ready, empty, OFFSETS,
                                  ERRORS, experts, tokens_sum, HIDDEN, INTER, GROUP, SORTED,
                                  EXPERTS_POW2, PADDED)),
        (_ragged_mma_partition, (a_bufs, b_bufs, ready, empty, OFFSETS, OUT, OUT_PTRS, ERRORS,
                                 experts, tokens_sum, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                                 OUT_DTYPE, GROUP, SORTED, EXPERTS_POW2, PADDED, 64)),
    ], [1, 4], [LOADER_REGS, MMA_REGS])


def fits_ragged_tma_kernel(hidden: int, inter: int, experts: int, capability) -> bool:
    """Whether plans run this kernel for ragged BF16 operands of these sizes: a Hopper GPU,
    a tested Triton (3.6, 3.9), hidden and intermediate multiples of 8 (every ragged expert's
    blocks then start 16-byte aligned in the 16-byte aligned buffers plans require), and at
    most PLAN_MAX_EXPERTS experts."""
    return (GLUON_API_OK and capability is not None and capability[0] == 9
            and hidden % 8 == 0 and inter % 8 == 0 and experts <= PLAN_MAX_EXPERTS)


def fits_tokens(tokens_sum: int) -> bool:
    """Whether a call of ``tokens_sum`` tokens fits TMA's 32-bit extents and coordinates."""
    return tokens_sum < 2**31


def launch_wgrad_ragged_tma(a, b, offsets, out, out_ptrs, out_dtype, errors, *, hidden: int,
                            inter: int, accumulate: bool,
                            config: RaggedTmaConfig = RAGGED_TMA_CONFIG, padded=None) -> None:
    """The BF16 wgrad of the experts ``_tma_takes`` through this kernel: a (hidden, T) and b
    (T, intermediate) holding the experts' blocks, arguments as kernels.launch_wgrad's, on
    operands ``fits_ragged_tma_kernel`` and ``fits_tokens`` accept, 16-byte aligned.
    ``padded``: (a_pad, b_pad), the copy kernels.launch_ragged_padded made of the experts off
    multiples of 8 tokens, which this kernel then takes too when the offsets are in order; it
    is then a programmatic dependent launch (where ``use_pdl`` allows) that waits for the copy,
    so that its start overlaps the copy's end."""
    experts = offsets.numel()
    if experts == 0:
        return
    work = _tile_count(hidden, inter, BLOCK_N.value) * experts
    sort = config.sorts(experts)
    out_arg, ptrs_arg = output_arguments(a, offsets, out, out_ptrs)
    a_pad, b_pad = padded if padded is not None else (a, b)
    after_copy = padded is not None and use_pdl(a)
    launch_with_scratch(_wgrad_ragged_tma_kernel, (min(work, sm_count(a.device)),), a, b,
                        a_pad, b_pad, offsets, out_arg, ptrs_arg, errors, experts, a.shape[1],
                        HIDDEN=hidden, INTER=inter, DISCRETE=out_ptrs is not None,
                        ACCUMULATE=accumulate, OUT_DTYPE=TL_DTYPES[out_dtype],
                        STAGES=config.stages, GROUP=GROUP_M, SORTED=sort,
                        EXPERTS_POW2=experts_vector(experts) if sort or padded else 2,
                        PADDED=padded is not None, WAIT_PRIOR=after_copy,
                        launch_pdl=after_copy, num_warps=4, maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: dense and discrete (accumulating)
    output at the first benchmark case's sizes, both splits; with the padded copy of the
    experts off multiples of 8 tokens (a dependent launch after it), dense, both splits."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for discrete, sorted_experts, padded in (
            (False, True, False), (True, True, False), (False, False, False),
            (True, False, False), (False, True, True), (False, False, True)):
        name = (f"wgrad ragged TMA (Gluon) discrete={discrete} sorted_experts={sorted_experts}"
                f"{' padded copy' if padded else ''}")
        if not GLUON_API_OK:
            cases.append(untested_triton_case(name))
            continue
        cases.append(CompileCase(name, _wgrad_ragged_tma_kernel, dict(
            A="*bf16", B="*bf16", A_PAD="*bf16", B_PAD="*bf16", OFFSETS="*i32", OUT="*bf16",
            OUT_PTRS="*i64", ERRORS="*i32", experts="i32", tokens_sum="i32", HIDDEN=c, INTER=c,
            DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, STAGES=c, GROUP=c, SORTED=c,
            EXPERTS_POW2=c, PADDED=c, WAIT_PRIOR=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=discrete,
                 OUT_DTYPE=gl.bfloat16, STAGES=RAGGED_TMA_CONFIG.stages, GROUP=GROUP_M,
                 SORTED=sorted_experts, EXPERTS_POW2=8 if sorted_experts or padded else 2,
                 PADDED=padded, WAIT_PRIOR=padded),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    return cases
