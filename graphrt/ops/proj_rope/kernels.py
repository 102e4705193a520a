"""Triton kernels for projection GEMM + RoPE + dual-direction MXFP8 quantize.

Head kernel (the fast path: power-of-two nope and rope halves of at least 32, K % 16 == 0): a
program owns BLOCK_M tokens x one whole head. Operands come through TMA descriptors; the head's
nope rows and its rope rows are two products, and the rope product keeps the interleaved
(x1, x2) pairs side by side, so the rotation is a split of the accumulator. The epilogue
quantizes each 32-feature and each 32-token block from the FP32 values.

Block kernel (any legal head shape): a program owns 32 tokens x 32 features of one head, one
quantization block in each direction; a block that reaches into the rope features computes a
second product with the partner rows of W.

The E8M0 exponent is read off the FP32 bits. E4M3 codes are rounded to nearest even by the
hardware conversion on the GPU and by integer arithmetic in the interpreter: the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

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
def _e4m3_bytes(q, HW_CVT: tl.constexpr):
    """uint8 E4M3 codes of values within [-448, 448], nearest even."""
    if HW_CVT:
        return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return _e4m3_codes(q)


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
def _proj_rope_block_kernel(X, XS, W, WS, COS, SIN, ROW, ROW_S, COL, COL_S, tokens,
                      K: tl.constexpr, HEADS: tl.constexpr, NOPE: tl.constexpr,
                      ROPE: tl.constexpr, W_OUT_IN: tl.constexpr, MX: tl.constexpr,
                      HW_CVT: tl.constexpr, DOT_FP32: tl.constexpr):
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
    tl.store(ROW + t[:, None] * N_TOTAL + feature[None, :], _e4m3_bytes(q_row, HW_CVT))
    tl.store(ROW_S + t * (N_TOTAL // 32) + head * (D // 32) + block, (e_row + 127).to(tl.uint8))
    # columnwise: the 32 tokens of each feature are one block
    e_col = _block_exponent(tl.max(tl.abs(y), axis=0))
    q_col = tl.minimum(tl.maximum(y * _pow2(-e_col)[None, :], -448.0), 448.0)
    tl.store(COL + t[:, None] * N_TOTAL + feature[None, :], _e4m3_bytes(q_col, HW_CVT))
    tl.store(COL_S + tl.program_id(0).to(tl.int64) * N_TOTAL + feature, (e_col + 127).to(tl.uint8))


@triton.jit
def _decode_tile(codes, SCALE, rows, n_rows, row_stride, k0, BLOCK_K: tl.constexpr,
                 ROWS_MAJOR: tl.constexpr, HW_CVT: tl.constexpr, DOT_FP32: tl.constexpr):
    """MXFP8 codes -> values (BF16, exact; FP32 for the interpreter). ``rows`` index the scale
    rows (those from n_rows on are padding); ROWS_MAJOR: codes are [rows, BLOCK_K], else
    [BLOCK_K, rows]."""
    kb = (k0 + tl.arange(0, BLOCK_K)) // 32
    if ROWS_MAJOR:
        e = tl.load(SCALE + rows[:, None] * row_stride + kb[None, :],
                    mask=(rows < n_rows)[:, None], other=127)
    else:
        e = tl.load(SCALE + kb[:, None].to(tl.int64) * row_stride + rows[None, :],
                    mask=(rows < n_rows)[None, :], other=127)
    if HW_CVT:
        v = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = _e4m3_decode(codes)
    v = v * _pow2(e.to(tl.int32) - 127)
    if DOT_FP32:
        return v
    return v.to(tl.bfloat16)


@triton.jit
def _block_scales(SCALE, rows, n_rows, row_stride, block, ROWS_MAJOR: tl.constexpr):
    """FP32 factors 2^(e - 127) of one 32-wide K block for ``rows`` (padding rows: 1)."""
    if ROWS_MAJOR:
        e = tl.load(SCALE + rows * row_stride + block, mask=rows < n_rows, other=127)
    else:
        e = tl.load(SCALE + block * row_stride + rows, mask=rows < n_rows, other=127)
    return _pow2(e.to(tl.int32) - 127)


@triton.jit
def _quantize_store(y, t, t_block, feature0, ROW, ROW_S, COL, COL_S, tokens,
                    WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, N_TOTAL: tl.constexpr,
                    HW_CVT: tl.constexpr):
    """Both MXFP8 directions of y [BLOCK_M tokens, WIDTH features from feature0]."""
    f = feature0 + tl.arange(0, WIDTH)
    t_ok = (t < tokens)[:, None]
    a = tl.abs(y)
    e_row = _block_exponent(tl.max(tl.reshape(a, [BLOCK_M, WIDTH // 32, 32]), axis=2))
    s_row = tl.reshape(tl.broadcast_to(_pow2(-e_row)[:, :, None], [BLOCK_M, WIDTH // 32, 32]),
                       [BLOCK_M, WIDTH])
    q = tl.minimum(tl.maximum(y * s_row, -448.0), 448.0)
    tl.store(ROW + t[:, None] * N_TOTAL + f[None, :], _e4m3_bytes(q, HW_CVT), mask=t_ok)
    j = tl.arange(0, WIDTH // 32)
    tl.store(ROW_S + t[:, None] * (N_TOTAL // 32) + (feature0 // 32 + j)[None, :],
             (e_row + 127).to(tl.uint8), mask=t_ok)
    e_col = _block_exponent(tl.max(tl.reshape(a, [BLOCK_M // 32, 32, WIDTH]), axis=1))
    s_col = tl.reshape(tl.broadcast_to(_pow2(-e_col)[:, None, :], [BLOCK_M // 32, 32, WIDTH]),
                       [BLOCK_M, WIDTH])
    q = tl.minimum(tl.maximum(y * s_col, -448.0), 448.0)
    tl.store(COL + t[:, None] * N_TOTAL + f[None, :], _e4m3_bytes(q, HW_CVT), mask=t_ok)
    tb = t_block.to(tl.int64) * (BLOCK_M // 32) + tl.arange(0, BLOCK_M // 32)
    tl.store(COL_S + tb[:, None] * N_TOTAL + f[None, :], (e_col + 127).to(tl.uint8),
             mask=(tb < tokens // 32)[:, None])


@triton.jit(do_not_specialize=["tokens"])
def _proj_rope_head_kernel(X_DESC, XS, W_NOPE, W_ROPE, WS, COS, SIN, ROW, ROW_S, COL, COL_S,
                           tokens, K: tl.constexpr, HEADS: tl.constexpr, NOPE: tl.constexpr,
                           ROPE: tl.constexpr, W_OUT_IN: tl.constexpr, MX: tl.constexpr,
                           HW_CVT: tl.constexpr, DOT_FP32: tl.constexpr, FP8_MMA: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                           NUM_STAGES: tl.constexpr):
    D: tl.constexpr = NOPE + ROPE
    N_TOTAL: tl.constexpr = HEADS * D
    HALF: tl.constexpr = ROPE // 2
    t_blocks = tl.cdiv(tokens, BLOCK_M)
    head = tl.program_id(0) // t_blocks          # token blocks of one head run side by side
    t_block = tl.program_id(0) % t_blocks
    t0 = t_block * BLOCK_M
    t = t0.to(tl.int64) + tl.arange(0, BLOCK_M)
    n0 = head * D
    acc_nope = tl.zeros([BLOCK_M, NOPE], dtype=tl.float32)
    acc_rope = tl.zeros([BLOCK_M, ROPE], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        x = X_DESC.load([t0, k0])
        if W_OUT_IN:
            w_nope = W_NOPE.load([n0, k0])
            w_rope = W_ROPE.load([n0 + NOPE, k0])
        else:
            w_nope = W_NOPE.load([k0, n0])
            w_rope = W_ROPE.load([k0, n0 + NOPE])
        rows_nope = n0 + tl.arange(0, NOPE)
        rows_rope = n0 + NOPE + tl.arange(0, ROPE)
        w_stride: tl.constexpr = K // 32 if W_OUT_IN else N_TOTAL
        if FP8_MMA:   # one 32-wide block per step: FP8 products, rescaled by both E8M0 scales
            x = x.to(tl.float8e4nv, bitcast=True)
            w_nope = w_nope.to(tl.float8e4nv, bitcast=True)
            w_rope = w_rope.to(tl.float8e4nv, bitcast=True)
            if W_OUT_IN:
                w_nope = tl.trans(w_nope)
                w_rope = tl.trans(w_rope)
            sx = _block_scales(XS, t, tokens, K // 32, k0 // 32, True)
            s_nope = _block_scales(WS, rows_nope, N_TOTAL, w_stride, k0 // 32, W_OUT_IN)
            s_rope = _block_scales(WS, rows_rope, N_TOTAL, w_stride, k0 // 32, W_OUT_IN)
            acc_nope += tl.dot(x, w_nope) * (sx[:, None] * s_nope[None, :])
            acc_rope += tl.dot(x, w_rope) * (sx[:, None] * s_rope[None, :])
        else:
            if MX:
                x = _decode_tile(x, XS, t, tokens, K // 32, k0, BLOCK_K, True, HW_CVT, DOT_FP32)
                w_nope = _decode_tile(w_nope, WS, rows_nope, N_TOTAL, w_stride, k0, BLOCK_K,
                                      W_OUT_IN, HW_CVT, DOT_FP32)
                w_rope = _decode_tile(w_rope, WS, rows_rope, N_TOTAL, w_stride, k0, BLOCK_K,
                                      W_OUT_IN, HW_CVT, DOT_FP32)
            elif DOT_FP32:
                x = x.to(tl.float32)
            if W_OUT_IN:
                w_nope = tl.trans(w_nope)
                w_rope = tl.trans(w_rope)
            acc_nope += mma(x, w_nope, DOT_FP32)
            acc_rope += mma(x, w_rope, DOT_FP32)
    _quantize_store(acc_nope, t, t_block, n0, ROW, ROW_S, COL, COL_S, tokens, NOPE, BLOCK_M,
                    N_TOTAL, HW_CVT)
    x1, x2 = tl.split(tl.reshape(acc_rope, [BLOCK_M, HALF, 2]))   # interleaved pairs
    h = tl.arange(0, HALF)
    t_ok = (t < tokens)[:, None]
    cs = COS + t[:, None] * ROPE + h[None, :]
    sn = SIN + t[:, None] * ROPE + h[None, :]
    cos1 = tl.load(cs, mask=t_ok, other=0.0).to(tl.float32)
    sin1 = tl.load(sn, mask=t_ok, other=0.0).to(tl.float32)
    cos2 = tl.load(cs + HALF, mask=t_ok, other=0.0).to(tl.float32)
    sin2 = tl.load(sn + HALF, mask=t_ok, other=0.0).to(tl.float32)
    _quantize_store(x1 * cos1 - x2 * sin1, t, t_block, n0 + NOPE, ROW, ROW_S, COL, COL_S, tokens,
                    HALF, BLOCK_M, N_TOTAL, HW_CVT)
    _quantize_store(x2 * cos2 + x1 * sin2, t, t_block, n0 + NOPE + HALF, ROW, ROW_S, COL, COL_S,
                    tokens, HALF, BLOCK_M, N_TOTAL, HW_CVT)


@dataclass(frozen=True)
class HeadConfig:
    block_m: int
    block_k: int
    num_warps: int
    num_stages: int
    fp8_mma: bool = False   # MXFP8 inputs: FP8 products per 32-wide block (block_k 32), not upcast


def head_config(interpreted: bool, mx: bool = False) -> HeadConfig:
    if interpreted:
        return HeadConfig(32, 32, 1, 1)
    if mx:
        return HeadConfig(128, 32, 8, 6, fp8_mma=True)
    return HeadConfig(128, 64, 8, 3)


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def fits_head_kernel(k: int, nope: int, rope: int) -> bool:
    """The head kernel's shapes: power-of-two nope (>= 32) and rope halves (>= 32), K % 16 == 0."""
    return k % 16 == 0 and _power_of_two(nope) and nope >= 32 and _power_of_two(rope // 2) \
        and rope >= 64


def launch_head(cfg: HeadConfig, x, x_scale, w, w_scale, cos, sin, row, row_s, col, col_s, *,
                tokens: int, k: int, heads: int, nope: int, rope: int, w_out_in: bool,
                dot_fp32: bool) -> None:
    """The head kernel; outputs are the uint8 views of the float8 tensors, scales uint8."""
    if tokens == 0:
        return
    bm, bk = cfg.block_m, cfg.block_k
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    if w_out_in:
        w_nope, w_rope = (TensorDescriptor.from_tensor(w, [n, bk]) for n in (nope, rope))
    else:
        w_nope, w_rope = (TensorDescriptor.from_tensor(w, [bk, n]) for n in (nope, rope))
    mx = x_scale is not None
    grid = (triton.cdiv(tokens, bm) * heads,)
    _proj_rope_head_kernel[grid](
        x_desc, x_scale if mx else x, w_nope, w_rope, w_scale if mx else x, cos, sin, row, row_s,
        col, col_s, tokens, K=k, HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, MX=mx,
        HW_CVT=not dot_fp32, DOT_FP32=dot_fp32, FP8_MMA=mx and cfg.fp8_mma, BLOCK_M=bm, BLOCK_K=bk,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)


def launch_block(x, x_scale, w, w_scale, cos, sin, row, row_s, col, col_s, *, tokens: int,
                 k: int, heads: int, nope: int, rope: int, w_out_in: bool, dot_fp32: bool) -> None:
    """The block kernel (any legal head shape); arguments as launch_head's."""
    if tokens == 0:
        return
    mx = x_scale is not None
    grid = (triton.cdiv(tokens, BLOCK.value), heads, (nope + rope) // BLOCK.value)
    _proj_rope_block_kernel[grid](x, x_scale if mx else x, w, w_scale if mx else w, cos, sin, row,
                            row_s, col, col_s, tokens, K=k, HEADS=heads, NOPE=nope, ROPE=rope,
                            W_OUT_IN=w_out_in, MX=mx, HW_CVT=not dot_fp32, DOT_FP32=dot_fp32,
                            num_warps=4)
