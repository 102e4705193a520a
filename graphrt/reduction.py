"""Fixed-order reductions shared by the ops (Triton), bitwise reproducible.

``sum_partials`` sums partial rows in a second launch. The grouped order sums them the same way
in two places: in the kernel that wrote them, by the last program to arrive (``finish_in_groups``:
one launch, with counters that are zero before the call and left zero after it), or in a
second launch (``sum_partials_in_groups``) where the caller has no such counters. Both give the
same bits: per column, the parts of each group of ``PARTS_PER_GROUP`` summed one after the
other, then the groups one after the other."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import triton
import triton.language as tl

from .arena.workspace import ALIGNMENT
from .kernel_utils import (cdiv, CompileCase, CONSTEXPR, launch, next_power_of_2, use_pdl,
                           wait_for_prior_kernel)

_TILE_ELEMENTS = 2048    # parts x columns loaded per step by one program (4 warps)
_TARGET_PROGRAMS = 512   # enough programs to spread the partials over every SM
PARTS_PER_GROUP = tl.constexpr(16)   # partial rows per group of the grouped order


@triton.jit(do_not_specialize=["n_parts"])
def _sum_partials_kernel(PARTIAL, OUT_A, OUT_B, n_parts, COLS: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, NUM_STAGES: tl.constexpr,
                         AFTER_PRIMARY: tl.constexpr, EVICTION: tl.constexpr = ""):
    matrix = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < COLS
    base = PARTIAL + matrix.to(tl.int64) * n_parts * COLS
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    wait_for_prior_kernel(AFTER_PRIMARY)  # the partials come from the kernel just before
    for p0 in tl.range(0, n_parts, BLOCK_P, num_stages=NUM_STAGES):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & col_mask[None, :]
        tile = tl.load(base + parts[:, None].to(tl.int64) * COLS + cols[None, :], mask=mask,
                       other=0.0, eviction_policy=EVICTION)
        acc += tl.sum(tile, axis=0)
    if matrix == 0:
        tl.store(OUT_A + cols, acc.to(OUT_A.dtype.element_ty), mask=col_mask)
    else:
        tl.store(OUT_B + cols, acc.to(OUT_B.dtype.element_ty), mask=col_mask)


@lru_cache(maxsize=1024)
def partial_blocks(n_parts: int, cols: int, matrices: int = 1) -> tuple[int, int]:
    """(parts, columns) per tile of the reduction: narrow column blocks when there are many
    parts, so that enough programs share the work; the summation order follows from these."""
    block_c = next_power_of_2(max(1, cdiv(cols * matrices, _TARGET_PROGRAMS)))
    block_c = max(16, min(1024, block_c))
    block_p = max(1, min(next_power_of_2(n_parts), _TILE_ELEMENTS // block_c))
    return block_p, block_c


def sum_partials(partial, outs: Sequence, n_parts: int, eviction_policy: str = "",
                 max_parts: int | None = None) -> None:
    """outs[m][c] = sum over p of partial[m, p, c], for partial viewed as [len(outs), n_parts, C]
    and one or two outputs of C elements each. Tiles of parts are summed as one tree and the
    tiles in order, the same way every run (no atomics). On a GPU it is a programmatic dependent
    launch: its programs may start while the kernel that wrote the partials finishes (that kernel
    calls ``allow_dependent_launch``), and wait for its writes before reading them.

    eviction_policy: the L2 policy of the partials' loads ("evict_last" where the kernel that
    wrote them keeps them in L2). max_parts: the most parts the caller ever passes; the tile
    shape then follows it, so one compile serves every ``n_parts`` up to it."""
    if not 1 <= len(outs) <= 2:
        raise ValueError(f"sum_partials takes one or two outputs, got {len(outs)}")
    cols = outs[0].numel()
    block_p, block_c = partial_blocks(max_parts or n_parts, cols, len(outs))
    grid = (cdiv(cols, block_c), len(outs))
    pdl = use_pdl(partial)
    launch(_sum_partials_kernel, grid, partial, outs[0], outs[-1], n_parts, COLS=cols,
           BLOCK_P=block_p, BLOCK_C=block_c, NUM_STAGES=3, AFTER_PRIMARY=pdl,
           EVICTION=eviction_policy, launch_pdl=pdl, num_warps=4)


def groups_of(n_parts: int) -> int:
    """Groups of the grouped order over ``n_parts`` partial rows."""
    return cdiv(n_parts, PARTS_PER_GROUP.value)


def grouped_counter_words(n_parts: int) -> int:
    """Zeroed int32 counters ``finish_in_groups`` takes: one per group, one for the groups."""
    return groups_of(n_parts) + 1


def grouped_workspace_bytes(n_parts: int, cols: int, matrices: int = 2) -> int:
    """Scratch of the grouped order: FP32 partials [matrices, n_parts, cols], then the group
    sums [matrices, groups, cols]; at least the arena's unit per counter word, which the
    arena's counters need (``WorkspaceArena.counters``)."""
    return max(4 * matrices * (n_parts + groups_of(n_parts)) * cols,
               ALIGNMENT * grouped_counter_words(n_parts))


@triton.jit
def _add_rows(BASE, count, cols, col_mask, COLS: tl.constexpr, BLOCK_C: tl.constexpr,
              UNROLL: tl.constexpr):
    """Rows 0 .. count - 1 of BASE ([.., COLS] FP32) added one after the other, UNROLL rows'
    loads issued together (a masked row adds +0.0, which leaves the sum as it was). The loads
    are .cg: programs on other SMs wrote the rows; read L2, never a stale L1 line."""
    total = tl.zeros([BLOCK_C], dtype=tl.float32)
    lane = tl.zeros([BLOCK_C], dtype=tl.int32)   # the row test as a vector (the interpreter's
    for first in range(0, count, UNROLL):       # masks take no scalar)
        for i in tl.static_range(UNROLL):
            # within one call's partials: far below 2^31 elements
            total += tl.load(BASE + (first + i) * COLS + cols,
                             mask=col_mask & (lane + first + i < count), other=0.0,
                             cache_modifier=".cg")
    return total


@triton.jit
def _sum_group_rows(PARTIAL, GROUP_SUMS, matrix, group, size, n_parts, n_groups, cols,
                    col_mask, COLS: tl.constexpr, BLOCK_C: tl.constexpr, UNROLL: tl.constexpr):
    """GROUP_SUMS[matrix, group] = the group's parts of PARTIAL[matrix] summed in order."""
    first = (matrix * n_parts + group * PARTS_PER_GROUP).to(tl.int64) * COLS
    total = _add_rows(PARTIAL + first, size, cols, col_mask, COLS, BLOCK_C, UNROLL)
    tl.store(GROUP_SUMS + (matrix * n_groups + group).to(tl.int64) * COLS + cols, total,
             mask=col_mask)


@triton.jit
def _sum_groups(GROUP_SUMS, OUT, matrix, n_groups, cols, col_mask, COLS: tl.constexpr,
                BLOCK_C: tl.constexpr, UNROLL: tl.constexpr):
    total = _add_rows(GROUP_SUMS + (matrix * n_groups).to(tl.int64) * COLS, n_groups, cols,
                      col_mask, COLS, BLOCK_C, UNROLL)
    tl.store(OUT + cols, total.to(OUT.dtype.element_ty), mask=col_mask)


@triton.jit
def finish_in_groups(PARTIAL, COUNTERS, OUT_A, OUT_B, part, n_parts, cols, col_mask,
                     COLS: tl.constexpr, BLOCK_C: tl.constexpr, TWO: tl.constexpr,
                     UNROLL: tl.constexpr):
    """Called by every program of a grid of ``n_parts`` after it stored its partial row
    ``part`` of each matrix of PARTIAL ([1 or 2 (TWO), n_parts, COLS] FP32, then the group
    sums' [1 or 2, groups_of(n_parts), COLS]): the program that arrives last in its group sums
    the group, and the last of those sums the groups into OUT_A (and OUT_B), in the grouped
    order. COUNTERS: ``grouped_counter_words`` int32 words, zero at the call and no other
    call's; each is left zero again. UNROLL: rows whose loads are issued together (more
    make the loads' latency count less, and may make a kernel near its register limit spill)."""
    n_groups = (n_parts + PARTS_PER_GROUP - 1) // PARTS_PER_GROUP
    group = part // PARTS_PER_GROUP
    size = tl.minimum(n_parts - group * PARTS_PER_GROUP, PARTS_PER_GROUP)
    GROUP_SUMS = PARTIAL + (1 + TWO) * n_parts.to(tl.int64) * COLS
    tl.debug_barrier()   # every thread's partial stores before the one thread's release
    arrived = tl.atomic_add(COUNTERS + group, 1, sem="acq_rel", scope="gpu")
    if arrived == size - 1:
        tl.atomic_xchg(COUNTERS + group, 0, sem="relaxed", scope="gpu")
        _sum_group_rows(PARTIAL, GROUP_SUMS, 0, group, size, n_parts, n_groups, cols,
                        col_mask, COLS, BLOCK_C, UNROLL)
        if TWO:
            _sum_group_rows(PARTIAL, GROUP_SUMS, 1, group, size, n_parts, n_groups, cols,
                            col_mask, COLS, BLOCK_C, UNROLL)
        tl.debug_barrier()
        done = tl.atomic_add(COUNTERS + n_groups, 1, sem="acq_rel", scope="gpu")
        if done == n_groups - 1:
            tl.atomic_xchg(COUNTERS + n_groups, 0, sem="relaxed", scope="gpu")
            _sum_groups(GROUP_SUMS, OUT_A, 0, n_groups, cols, col_mask, COLS, BLOCK_C, UNROLL)
            if TWO:
                _sum_groups(GROUP_SUMS, OUT_B, 1, n_groups, cols, col_mask, COLS, BLOCK_C, UNROLL)


@triton.jit(do_not_specialize=["n_parts"])
def _sum_in_groups_kernel(PARTIAL, OUT_A, OUT_B, n_parts, COLS: tl.constexpr,
                          BLOCK_C: tl.constexpr, GROUPS_PAD: tl.constexpr,
                          AFTER_PRIMARY: tl.constexpr):
    """``finish_in_groups``'s sums in a launch of their own: the same additions, in the same
    order, the groups side by side (a masked part adds +0.0, which leaves a sum unchanged)."""
    matrix = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < COLS
    base = PARTIAL + matrix.to(tl.int64) * n_parts * COLS
    groups = tl.arange(0, GROUPS_PAD)
    n_groups = (n_parts + PARTS_PER_GROUP - 1) // PARTS_PER_GROUP
    sums = tl.zeros([GROUPS_PAD, BLOCK_C], dtype=tl.float32)
    wait_for_prior_kernel(AFTER_PRIMARY)
    for i in tl.static_range(PARTS_PER_GROUP):   # every load in flight together
        parts = groups * PARTS_PER_GROUP + i
        mask = (parts < n_parts)[:, None] & col_mask[None, :]
        sums += tl.load(base + parts[:, None].to(tl.int64) * COLS + cols[None, :], mask=mask,
                        other=0.0)
    total = tl.zeros([BLOCK_C], dtype=tl.float32)
    for g in range(0, n_groups):   # one group's sum plus zeros: exact, so in order
        total += tl.sum(tl.where(groups[:, None] == g, sums, 0.0), axis=0)
    if matrix == 0:
        tl.store(OUT_A + cols, total.to(OUT_A.dtype.element_ty), mask=col_mask)
    else:
        tl.store(OUT_B + cols, total.to(OUT_B.dtype.element_ty), mask=col_mask)


def sum_partials_in_groups(partial, outs: Sequence, n_parts: int) -> None:
    """``sum_partials`` in the grouped order (the bits ``finish_in_groups`` gives): a
    programmatic dependent launch on a GPU, like ``sum_partials``."""
    if not 1 <= len(outs) <= 2:
        raise ValueError(f"sum_partials_in_groups takes one or two outputs, got {len(outs)}")
    cols = outs[0].numel()
    # sum_partials' column blocks, at most 128 wide: each program holds every group's sums
    block_c = min(128, partial_blocks(n_parts, cols, len(outs))[1])
    pdl = use_pdl(partial)
    launch(_sum_in_groups_kernel, (cdiv(cols, block_c), len(outs)), partial, outs[0],
           outs[-1], n_parts, COLS=cols, BLOCK_C=block_c,
           GROUPS_PAD=next_power_of_2(groups_of(n_parts)), AFTER_PRIMARY=pdl, launch_pdl=pdl,
           num_warps=4)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles."""
    c = CONSTEXPR
    return [CompileCase("reduction", _sum_partials_kernel, dict(
        PARTIAL="*fp32", OUT_A="*bf16", OUT_B="*bf16", n_parts="i32", COLS=c, BLOCK_P=c,
        BLOCK_C=c, NUM_STAGES=c, AFTER_PRIMARY=c, EVICTION=c),
        dict(COLS=512, BLOCK_P=64, BLOCK_C=16, NUM_STAGES=3, AFTER_PRIMARY=True,
             EVICTION="evict_last")),
        CompileCase("reduction in groups", _sum_in_groups_kernel, dict(
            PARTIAL="*fp32", OUT_A="*bf16", OUT_B="*bf16", n_parts="i32", COLS=c, BLOCK_C=c,
            GROUPS_PAD=c, AFTER_PRIMARY=c),
            dict(COLS=512, BLOCK_C=16, GROUPS_PAD=32, AFTER_PRIMARY=True))]
