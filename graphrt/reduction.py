"""Fixed-order reductions shared by the ops (Triton): no atomics, bitwise reproducible."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_parts"])
def _sum_partials_kernel(PARTIAL, OUT, n_parts, COLS: tl.constexpr, BLOCK_P: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < COLS
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & col_mask[None, :]
        tile = tl.load(PARTIAL + parts[:, None] * COLS + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(OUT + cols, acc.to(OUT.dtype.element_ty), mask=col_mask)


def sum_partials(partial, out, n_parts: int) -> None:
    """out[c] = sum over p of partial[p, c] for partial [n_parts, C]: tiles of 32 parts are summed
    as one tree and the tiles in order, the same way every run (no atomics)."""
    cols = out.numel()
    block_c = 64
    _sum_partials_kernel[(triton.cdiv(cols, block_c),)](partial, out, n_parts, COLS=cols,
                                                        BLOCK_P=32, BLOCK_C=block_c, num_warps=4)
