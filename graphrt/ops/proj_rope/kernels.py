"""Triton kernel for projection GEMM + RoPE + dual-direction MXFP8 quantize.

A program owns 32 tokens x 32 features of one head, which is one quantization block in each
direction. RoPE columns need both members of an interleaved pair, so a block that reaches into
the rope features computes a second product with the partner rows of W (the permutation lives
in the W addressing; no data moves). The E8M0 exponent is read off the FP32 bits and the E4M3
codes are rounded to nearest even with integer arithmetic: the same bits on every backend.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...kernel_utils import mma

BLOCK = tl.constexpr(32)    # tokens and features per program: one block in each direction
BLOCK_K = tl.constexpr(32)


@triton.jit
def _e4m3_codes(v):
    """uint8 E4M3 (fn) codes of FP32 values already within [-448, 448], nearest even."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(v)
    abits = a.to(tl.int32, bitcast=True)
    mant = abits & 0x7FFFFF
    m3 = mant >> 20
    rem = mant & 0xFFFFF
    up = (rem > 0x80000) | ((rem == 0x80000) & ((m3 & 1) == 1))
    m3 = m3 + up.to(tl.int32)
    exponent = ((abits >> 23) & 0xFF) - 120 + (m3 >> 3)  # rebias 127 -> 7, carry from rounding
    normal = (exponent << 3) | (m3 & 7)
    t = a * 512.0                                         # subnormals: multiples of 2^-9
    whole = tl.floor(t)
    frac = t - whole
    whole_i = whole.to(tl.int32)
    sub = whole_i + ((frac > 0.5) | ((frac == 0.5) & ((whole_i & 1) == 1))).to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def _block_exponent(amax):
    """E8M0 exponent ceil(log2(max(amax, 1e-30) / 448)), clamped to [-127, 127]."""
    ratio = tl.math.div_rn(tl.maximum(amax, 1e-30), tl.full(amax.shape, 448.0, tl.float32))
    bits = ratio.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def _pow2(e):
    """2^e as FP32 for integer e in [-127, 127] (2^-127 is the one subnormal)."""
    bits = tl.where(e <= -127, 0x400000, (e + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_decode(code):
    """FP32 values of uint8 E4M3 (fn) codes."""
    c = code.to(tl.int32)
    exponent = (c >> 3) & 0xF
    mant = c & 7
    normal = (((exponent + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mant.to(tl.float32) * 0.001953125, normal)
    return tl.where((c & 0x80) != 0, -value, value)


@triton.jit
def _load_operand(PTR, SCALE, offs, scale_offs, mask, MX: tl.constexpr, DOT_FP32: tl.constexpr):
    if MX:
        v = _e4m3_decode(tl.load(PTR + offs, mask=mask, other=0))
        v = v * _pow2(tl.load(SCALE + scale_offs, mask=mask, other=127).to(tl.int32) - 127)
        if not DOT_FP32:
            v = v.to(tl.bfloat16)  # exact: E4M3 times a power of two fits BF16
    else:
        v = tl.load(PTR + offs, mask=mask, other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
    return v


@triton.jit(do_not_specialize=["tokens"])
def _proj_rope_kernel(X, XS, W, WS, COS, SIN, ROW, ROW_S, COL, COL_S, tokens,
                      K: tl.constexpr, HEADS: tl.constexpr, NOPE: tl.constexpr,
                      ROPE: tl.constexpr, W_OUT_IN: tl.constexpr, MX: tl.constexpr,
                      DOT_FP32: tl.constexpr):
    D: tl.constexpr = NOPE + ROPE
    N_TOTAL: tl.constexpr = HEADS * D
    HALF: tl.constexpr = ROPE // 2
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    head = tl.program_id(1)
    block = tl.program_id(2)
    c = block * BLOCK + tl.arange(0, BLOCK)          # features of this head
    r = c - NOPE                                      # rope feature index (negative: nope)
    is_rope = r >= 0
    j = tl.where(r < HALF, r, r - HALF)
    first = tl.where(is_rope, NOPE + 2 * j + (r >= HALF).to(tl.int32), c)
    partner = tl.where(is_rope, NOPE + 2 * j + (r < HALF).to(tl.int32), c)
    row1 = (head * D + first).to(tl.int64)
    row2 = (head * D + partner).to(tl.int64)
    has_rope = block * BLOCK + BLOCK > NOPE
    acc1 = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    kk = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        k_mask = k < K
        x = _load_operand(X, XS, t[:, None] * K + k[None, :],
                          t[:, None] * (K // 32) + (k // 32)[None, :], k_mask[None, :], MX, DOT_FP32)
        if W_OUT_IN:   # W [N_total, K]: element (row, k); scales (N_total, K / 32)
            w_off1 = row1[None, :] * K + k[:, None]
            w_s1 = row1[None, :] * (K // 32) + (k // 32)[:, None]
        else:          # W [K, N_total]: element (k, row); scales (K / 32, N_total)
            w_off1 = k[:, None].to(tl.int64) * N_TOTAL + row1[None, :]
            w_s1 = (k // 32)[:, None].to(tl.int64) * N_TOTAL + row1[None, :]
        w1 = _load_operand(W, WS, w_off1, w_s1, k_mask[:, None], MX, DOT_FP32)
        acc1 += mma(x, w1, DOT_FP32)
        if has_rope:
            if W_OUT_IN:
                w_off2 = row2[None, :] * K + k[:, None]
                w_s2 = row2[None, :] * (K // 32) + (k // 32)[:, None]
            else:
                w_off2 = k[:, None].to(tl.int64) * N_TOTAL + row2[None, :]
                w_s2 = (k // 32)[:, None].to(tl.int64) * N_TOTAL + row2[None, :]
            w2 = _load_operand(W, WS, w_off2, w_s2, k_mask[:, None], MX, DOT_FP32)
            acc2 += mma(x, w2, DOT_FP32)
    y = acc1
    if has_rope:
        rc = tl.where(is_rope, r, 0)
        cs = tl.load(COS + t[:, None] * ROPE + rc[None, :], mask=is_rope[None, :], other=1.0).to(tl.float32)
        sn = tl.load(SIN + t[:, None] * ROPE + rc[None, :], mask=is_rope[None, :], other=0.0).to(tl.float32)
        sign = tl.where(r < HALF, -1.0, 1.0)
        y = tl.where(is_rope[None, :], acc1 * cs + acc2 * sn * sign[None, :], acc1)
    feature = (head * D + c).to(tl.int64)
    # rowwise: the 32 features of each token are one block
    e_row = _block_exponent(tl.max(tl.abs(y), axis=1))
    q_row = tl.minimum(tl.maximum(y * _pow2(-e_row)[:, None], -448.0), 448.0)
    tl.store(ROW + t[:, None] * N_TOTAL + feature[None, :], _e4m3_codes(q_row))
    tl.store(ROW_S + t * (N_TOTAL // 32) + head * (D // 32) + block, (e_row + 127).to(tl.uint8))
    # columnwise: the 32 tokens of each feature are one block
    e_col = _block_exponent(tl.max(tl.abs(y), axis=0))
    q_col = tl.minimum(tl.maximum(y * _pow2(-e_col)[None, :], -448.0), 448.0)
    tl.store(COL + t[:, None] * N_TOTAL + feature[None, :], _e4m3_codes(q_col))
    tl.store(COL_S + tl.program_id(0).to(tl.int64) * N_TOTAL + feature, (e_col + 127).to(tl.uint8))


def launch(x, x_scale, w, w_scale, cos, sin, row, row_s, col, col_s, *, tokens: int, k: int,
           heads: int, nope: int, rope: int, w_out_in: bool, dot_fp32: bool) -> None:
    """Outputs are the uint8 views of the float8 tensors; scales uint8."""
    if tokens == 0:
        return
    mx = x_scale is not None
    grid = (triton.cdiv(tokens, BLOCK.value), heads, (nope + rope) // BLOCK.value)
    _proj_rope_kernel[grid](x, x_scale if mx else x, w, w_scale if mx else w, cos, sin, row,
                            row_s, col, col_s, tokens, K=k, HEADS=heads, NOPE=nope, ROPE=rope,
                            W_OUT_IN=w_out_in, MX=mx, DOT_FP32=dot_fp32, num_warps=4)
