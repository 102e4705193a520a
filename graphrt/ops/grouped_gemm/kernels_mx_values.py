"""MXFP8 operands written out as their BF16 values, for a BF16 GEMM to read.

Hopper has no block-scaled FP8 instruction. Turning MXFP8 codes into BF16 inside the GEMM's
main loop costs the CUDA cores about as long as the BF16 product itself (kernels.py's
``_wgrad_mx_kernel`` runs at about half the BF16 path's speed); a separate pass over the codes is
memory-bound and costs a fraction of it. Each code times its E8M0 scale is exact in BF16
(``kernels._mx_to_bf16``), so the product of the values is the product the contract defines.

The values go to a scratch buffer: A's (hidden, T) and B's (intermediate, T), tokens the
unit-stride axis, each row padded to a multiple of 8 tokens so that every row starts 16-byte
aligned (as TMA needs) whatever T is.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_utils import cdiv, CompileCase, CONSTEXPR, launch
from .kernels import _mx_to_bf16, MX_BLOCK

BLOCK_ROWS = 16
BLOCK_TOKENS = 512   # 16 scale blocks a row
NUM_WARPS = 4


def padded_tokens(tokens_sum: int) -> int:
    """The row stride of the values, in tokens: a multiple of 8 (rows 16 bytes apart)."""
    return -(-tokens_sum // 8) * 8


def mx_values_bytes(tokens_sum: int, hidden: int, inter: int) -> int:
    """Bytes of the scratch: A's values, then B's from the next 256-byte boundary."""
    return _b_start(tokens_sum, hidden) + inter * padded_tokens(tokens_sum) * 2


def _b_start(tokens_sum: int, hidden: int) -> int:
    return -(-hidden * padded_tokens(tokens_sum) * 2 // 256) * 256


def mx_values_views(scratch: torch.Tensor, tokens_sum: int, hidden: int,
                    inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 views of a uint8 scratch of ``mx_values_bytes``: A's values (hidden, T) and B's
    (T, intermediate), both K-major, with rows ``padded_tokens(T)`` apart."""
    stride = padded_tokens(tokens_sum)
    start = _b_start(tokens_sum, hidden)
    a_rows = scratch[:hidden * stride * 2].view(torch.bfloat16).view(hidden, stride)
    b_rows = scratch[start:start + inter * stride * 2].view(torch.bfloat16).view(inter, stride)
    return a_rows[:, :tokens_sum], b_rows[:, :tokens_sum].t()


@triton.jit
def _rows_to_values(CODES, SCALES, OUT, row0, t0, rows, tokens_sum, out_stride, s_row, s_block,
                    CODES_8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """Rows row0 .. row0 + BLOCK_R (of ``rows``), tokens t0 .. t0 + BLOCK_T of codes
    [rows, tokens_sum] (tokens unit-stride) with E8M0 scales at s_row * row + s_block * block,
    written as BF16 values into OUT [rows, out_stride] (the padding past tokens_sum too; no
    reader looks at it). CODES_8: tokens_sum is a multiple of 8 (codes 8 a load)."""
    # rebuilt as multiples of 8 (which they are) for the compiler to see it: 16-byte stores,
    # 8-byte loads (tl.multiple_of on these scalars is not followed)
    out_stride = out_stride // 8 * 8
    if CODES_8:
        tokens_sum = tokens_sum // 8 * 8
    r = row0 + tl.arange(0, BLOCK_R)
    t = t0 + tl.arange(0, BLOCK_T)
    blocks = t0 // MX_BLOCK + tl.arange(0, BLOCK_T // MX_BLOCK)
    r64 = r.to(tl.int64)[:, None]
    live = (r < rows)[:, None]
    codes = tl.load(CODES + r64 * tokens_sum + t[None, :], mask=live & (t < tokens_sum)[None, :],
                    other=0.0)
    scales = tl.load(SCALES + r64 * s_row + blocks.to(tl.int64)[None, :] * s_block,
                     mask=live & (blocks * MX_BLOCK < tokens_sum)[None, :], other=127)
    out = OUT + r64 * out_stride + t[None, :]
    tl.store(out, _mx_to_bf16(codes, scales, False), mask=live & (t < out_stride)[None, :])


@triton.jit(do_not_specialize=["s_am", "s_ak", "s_bk", "s_bn"])
def _mx_values_kernel(A, B, A_SCALE, B_SCALE, A_OUT, B_OUT, tokens_sum, out_stride,
                      s_am, s_ak, s_bk, s_bn, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                      CODES_8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """One program a [BLOCK_R, BLOCK_T] tile: A's rows (hidden) first, then B's
    (intermediate; B's codes (T, intermediate) are K-major, so its rows are its columns)."""
    token_tiles = tl.cdiv(out_stride, BLOCK_T)
    program = tl.program_id(0)
    row_tile, t0 = program // token_tiles, program % token_tiles * BLOCK_T
    a_tiles: tl.constexpr = (HIDDEN + BLOCK_R - 1) // BLOCK_R
    if row_tile < a_tiles:
        _rows_to_values(A, A_SCALE, A_OUT, row_tile * BLOCK_R, t0, HIDDEN, tokens_sum,
                        out_stride, s_am, s_ak, CODES_8, BLOCK_R, BLOCK_T)
    else:
        _rows_to_values(B, B_SCALE, B_OUT, (row_tile - a_tiles) * BLOCK_R, t0, INTER,
                        tokens_sum, out_stride, s_bn, s_bk, CODES_8, BLOCK_R, BLOCK_T)


def launch_mx_values(a, b, a_scale, b_scale, a_values, b_values) -> None:
    """MXFP8 codes a (hidden, T) and b (T, intermediate), both K-major, with E8M0 scales
    a_scale (hidden, blocks) and b_scale (blocks, intermediate) of any strides, written as BF16
    values into ``mx_values_views``' a_values and b_values."""
    hidden, tokens_sum = a.shape
    inter = b.shape[1]
    stride = a_values.stride(0)
    programs = (cdiv(hidden, BLOCK_ROWS) + cdiv(inter, BLOCK_ROWS)) * cdiv(stride, BLOCK_TOKENS)
    if programs >= 2**31:
        raise ValueError(f"a, b: {hidden} + {inter} rows of {tokens_sum} tokens need more "
                         f"programs than one launch holds")
    launch(_mx_values_kernel, (programs,), a, b, a_scale, b_scale, a_values, b_values,
           tokens_sum, stride, a_scale.stride(0), a_scale.stride(1), b_scale.stride(0),
           b_scale.stride(1), HIDDEN=hidden, INTER=inter,
           CODES_8=tokens_sum % 8 == 0 and a.data_ptr() % 8 == 0 and b.data_ptr() % 8 == 0,
           BLOCK_R=BLOCK_ROWS,
           BLOCK_T=BLOCK_TOKENS, num_warps=NUM_WARPS)


def compile_cases() -> list[CompileCase]:
    """The pass at the first benchmark case's sizes: tokens_sum a multiple of 16 (as Triton
    specializes it), of 8, or neither."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    return [CompileCase(
        f"MXFP8 values as BF16, tokens_sum {tokens}", _mx_values_kernel,
        dict(A="*fp8e4nv", B="*fp8e4nv", A_SCALE="*u8", B_SCALE="*u8", A_OUT="*bf16",
             B_OUT="*bf16", tokens_sum="i32", out_stride="i32", s_am="i64", s_ak="i64",
             s_bk="i64", s_bn="i64", HIDDEN=c, INTER=c, CODES_8=c, BLOCK_R=c, BLOCK_T=c),
        dict(HIDDEN=hidden, INTER=inter, CODES_8=codes_8, BLOCK_R=BLOCK_ROWS,
             BLOCK_T=BLOCK_TOKENS),
        num_warps=NUM_WARPS, divisible=divisible)
        for tokens, codes_8, divisible in (
            ("a multiple of 16", True, ("tokens_sum", "out_stride")),
            ("a multiple of 8", True, ()), ("odd", False, ()))]
