"""Fixed-order reductions shared by the ops (Triton): no atomics, bitwise reproducible."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import triton
import triton.language as tl

from .kernel_utils import (cdiv, CompileCase, CONSTEXPR, launch, next_power_of_2, use_pdl,
                           wait_for_prior_kernel)

_TILE_ELEMENTS = 2048    # parts x columns loaded per step by one program (4 warps)
_TARGET_PROGRAMS = 512   # enough programs to spread the partials over every SM


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


def compile_cases() -> list[CompileCase]:
    """The variant scripts/compile_check.py compiles."""
    c = CONSTEXPR
    return [CompileCase("reduction", _sum_partials_kernel, dict(
        PARTIAL="*fp32", OUT_A="*bf16", OUT_B="*bf16", n_parts="i32", COLS=c, BLOCK_P=c,
        BLOCK_C=c, NUM_STAGES=c, AFTER_PRIMARY=c, EVICTION=c),
        dict(COLS=512, BLOCK_P=64, BLOCK_C=16, NUM_STAGES=3, AFTER_PRIMARY=True,
             EVICTION="evict_last"))]
