"""Counter-addressed Philox4x32-10 in PyTorch, bit-for-bit the same as Triton's ``tl.philox``,
and the HSTU dropout decisions built on it (shared by the reference backend and the kernels'
tests)."""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of a * b for a constant a and uint32 values b (int64 tensor)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo
    mid2 = a_lo * b_hi
    hi_hi = a_hi * b_hi
    mid = (lo_lo >> 16) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)
    low = (lo_lo & 0xFFFF) | ((mid & 0xFFFF) << 16)
    high = hi_hi + (mid1 >> 16) + (mid2 >> 16) + (mid >> 16)
    return high & _M32, low & _M32


def philox4x32(seed: int, c0, c1, c2, c3, rounds: int = 10):
    """Four uint32 streams (as int64 tensors) for counters (c0..c3) under the 64-bit ``seed``."""
    seed &= (1 << 64) - 1
    k0, k1 = seed & _M32, seed >> 32
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def keep_threshold(p: float) -> int:
    """A 16-bit draw r keeps its element when r >= threshold: P(keep) = 1 - p at a resolution
    of 2^-16 (p in FP32)."""
    p32 = float(torch.tensor(p, dtype=torch.float32))
    return int(p32 * 2 ** 16)


def dropout_mask(rows: int, cols: int, p: float, seed: int, offset: int,
                 segments: tuple[bool, bool, bool], device="cpu") -> torch.Tensor:
    """int8 [rows, cols]: bit 0 keeps the l*a segment, bit 1 the x segment, bit 2 the a segment
    (bits of disabled segments clear). Columns 2j and 2j+1 of a row share one Philox call at
    counter (lo(q), hi(q), lo(offset), hi(offset)) under ``seed``, q = (row * cols + 2j) / 2;
    its words r0, r1, r2 give six 16-bit draws: the even column's segments take r0's low half,
    r0's high half and r1's low half; the odd column's r1's high half, r2's low and high halves."""
    if cols % 2:
        raise ValueError(f"cols: draws come in column pairs, so cols must be even, got {cols}")
    q = torch.arange(rows * cols // 2, dtype=torch.int64, device=device)
    offset &= (1 << 64) - 1
    c2 = torch.full_like(q, offset & _M32)
    c3 = torch.full_like(q, offset >> 32)
    r0, r1, r2, _ = philox4x32(seed, q & _M32, q >> 32, c2, c3)
    lo, hi = (lambda r: r & 0xFFFF), (lambda r: r >> 16)
    draws = ((lo(r0), hi(r0), lo(r1)), (hi(r1), lo(r2), hi(r2)))   # [column parity][segment]
    threshold = keep_threshold(p)
    mask = torch.zeros(rows * cols // 2, 2, dtype=torch.int64, device=device)
    for parity in range(2):
        for bit, (draw, enabled) in enumerate(zip(draws[parity], segments)):
            if enabled:
                mask[:, parity] |= (draw >= threshold).to(torch.int64) << bit
    return mask.to(torch.int8).view(rows, cols)
