"""Counter-addressed Philox4x32-10 in PyTorch, bit-for-bit the same as Triton's ``tl.philox``,
and the HSTU dropout decisions built on it (shared by the reference backend and the kernels'
tests)."""
from __future__ import annotations

import struct

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


def split_int64(value: int) -> tuple[int, int]:
    """A signed 64-bit int as (low, high) signed 32-bit halves (the kernels take seed and
    offset so, as ints of one type whatever their values)."""
    value &= (1 << 64) - 1
    lo, hi = value & _M32, value >> 32
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


def keep_threshold(p: float) -> int:
    """A 16-bit draw r keeps its element when r >= threshold: P(keep) = 1 - p at a resolution
    of 2^-16 (p in FP32)."""
    p32 = struct.unpack("f", struct.pack("f", p))[0]   # rounded to FP32 as the kernel holds it
    return int(p32 * 2 ** 16)


def dropout_mask(rows: int, cols: int, p: float, seed: int, offset: int,
                 segments: tuple[bool, bool, bool], device="cpu") -> torch.Tensor:
    """int8 [rows, cols]: bit 0 keeps the l*a segment, bit 1 the x segment, bit 2 the a segment
    (bits of disabled segments clear). Each run of eight columns 8o..8o+7 of a row (an octet,
    q = (row * cols + 8o) / 8) takes three Philox calls, at counters (lo(3q+k), hi(3q+k),
    lo(offset), hi(offset)) under ``seed`` for k = 0, 1, 2: twelve words, 24 16-bit draws.
    Word 4k+i is word i of call k; draw d is the low half of word d // 2 when d is even, else
    its high half; column 8o+j, segment s uses draw 3j + s."""
    if cols % 8:
        raise ValueError(f"cols: draws come in runs of eight columns, so cols must be a multiple "
                         f"of 8, got {cols}")
    octets = rows * cols // 8
    q = torch.arange(octets, dtype=torch.int64, device=device)
    offset &= (1 << 64) - 1
    c2 = torch.full_like(q, offset & _M32)
    c3 = torch.full_like(q, offset >> 32)
    words = []
    for k in range(3):
        counter = 3 * q + k
        words.extend(philox4x32(seed, counter & _M32, counter >> 32, c2, c3))
    threshold = keep_threshold(p)
    mask = torch.zeros(octets, 8, dtype=torch.int64, device=device)
    for j in range(8):
        for bit, enabled in enumerate(segments):
            if enabled:
                d = 3 * j + bit
                word = words[d // 2]
                draw = (word >> 16) if d % 2 else (word & 0xFFFF)
                mask[:, j] |= (draw >= threshold).to(torch.int64) << bit
    return mask.to(torch.int8).view(rows, cols)
