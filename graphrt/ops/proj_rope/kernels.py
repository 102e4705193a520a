"""Triton kernels for projection GEMM + RoPE + dual-direction MXFP8 quantize.

The GEMM kernels take BF16 operands; the MXFP8 path first dequantizes x and W into BF16 scratch
(exact: an E4M3 code times a power of two fits BF16), which measured faster on the H200 than
decoding in the K loop or FP8 products rescaled per 32-wide block.

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

from ...kernel_utils import (allow_dependent_launch, cdiv, CompileCase, CONSTEXPR, launch, mma,
                             pow2, use_pdl, wait_for_prior_kernel)

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
def _abs_bits(v):
    """|v| of FP32 values as int32 bits, whose integer order is the float order with NaN above
    +inf: the maximum of these is a block's amax that does not drop a NaN."""
    return v.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _block_exponent(amax_bits):
    """E8M0 exponent ceil(log2(max(amax, 1e-30) / 448)) of a block maximum given as _abs_bits,
    without a division: with amax = m * 2^E (m in [1, 2)) and 448 = 1.75 * 2^8, the FP32
    quotient's ceil log2 is E - 8, plus one when m > 1.75 (the quotient never rounds onto a
    power of two). It is in [-127, 120] for a finite amax; a NaN or an infinity gives 128, the
    OCP MX NaN scale (byte 255)."""
    bits = tl.maximum(amax_bits, 0x0DA24260)    # 1e-30
    exponent = (bits >> 23) & 0xFF
    e = exponent - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    return tl.where(exponent == 0xFF, 128, e)


@triton.jit
def _quant_factor(e):
    """2^-e, which brings a block within E4M3's range; NaN for the NaN scale (e = 128), so that
    every code of that block is E4M3's NaN."""
    bits = tl.where(e >= 127, 0x400000, (127 - e) << 23)
    return tl.where(e == 128, 0x7FC00000, bits).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_decode(code):
    """FP32 values of uint8 E4M3 (fn) codes."""
    c = code.to(tl.int32)
    exponent = (c >> 3) & 0xF
    mant = c & 7
    normal = (((exponent + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mant.to(tl.float32) * 0.001953125, normal)
    bits = tl.where((c & 0x7F) == 0x7F, 0x7FC00000, value.to(tl.int32, bitcast=True))  # NaN
    # the sign as a bit, not a negation: Triton 3.6's interpreter negates 0.0 to +0.0
    sign = (c & 0x80) << 24
    return (bits | sign).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_bytes(q, HW_CVT: tl.constexpr):
    """uint8 E4M3 codes of values already scaled by _quant_factor, nearest even: finite values
    are then within [-448, 448], and the NaN scale's blocks are NaN, code 0x7F (the hardware's
    satfinite conversion gives that for the canonical NaN a product with NaN is)."""
    if HW_CVT:
        return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    codes = _e4m3_codes(tl.minimum(tl.maximum(q, -448.0), 448.0))
    return tl.where(q != q, 0x7F, codes.to(tl.int32)).to(tl.uint8)


@triton.jit(do_not_specialize=["tokens"])
def _proj_rope_block_kernel(X, W, COS, SIN, ROW, ROW_S, COL, COL_S, tokens,
                            K: tl.constexpr, HEADS: tl.constexpr, NOPE: tl.constexpr,
                            ROPE: tl.constexpr, W_OUT_IN: tl.constexpr, HW_CVT: tl.constexpr,
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
        x = tl.load(X + t[:, None] * K + k[None, :], mask=k_mask[None, :], other=0.0)
        if W_OUT_IN:   # W [N_total, K]: element (row, k)
            w_off1 = row1[None, :] * K + k[:, None]
        else:          # W [K, N_total]: element (k, row)
            w_off1 = k[:, None].to(tl.int64) * N_TOTAL + row1[None, :]
        acc1 += mma(x, tl.load(W + w_off1, mask=k_mask[:, None], other=0.0), DOT_FP32)
        if has_rope:
            if W_OUT_IN:
                w_off2 = row2[None, :] * K + k[:, None]
            else:
                w_off2 = k[:, None].to(tl.int64) * N_TOTAL + row2[None, :]
            acc2 += mma(x, tl.load(W + w_off2, mask=k_mask[:, None], other=0.0), DOT_FP32)
    y = acc1
    if has_rope:
        rc = tl.where(is_rope, r, 0)
        cs = tl.load(COS + t[:, None] * ROPE + rc[None, :], mask=is_rope[None, :], other=1.0).to(tl.float32)
        sn = tl.load(SIN + t[:, None] * ROPE + rc[None, :], mask=is_rope[None, :], other=0.0).to(tl.float32)
        sign = tl.where(r < HALF, -1.0, 1.0)
        y = tl.where(is_rope[None, :], acc1 * cs + acc2 * sn * sign[None, :], acc1)
    feature = (head * D + c).to(tl.int64)
    # rowwise: the 32 features of each token are one block
    e_row = _block_exponent(tl.max(_abs_bits(y), axis=1))
    q_row = y * _quant_factor(e_row)[:, None]
    tl.store(ROW + t[:, None] * N_TOTAL + feature[None, :], _e4m3_bytes(q_row, HW_CVT))
    tl.store(ROW_S + t * (N_TOTAL // 32) + head * (D // 32) + block, (e_row + 127).to(tl.uint8))
    # columnwise: the 32 tokens of each feature are one block
    e_col = _block_exponent(tl.max(_abs_bits(y), axis=0))
    q_col = y * _quant_factor(e_col)[None, :]
    tl.store(COL + t[:, None] * N_TOTAL + feature[None, :], _e4m3_bytes(q_col, HW_CVT))
    tl.store(COL_S + tl.program_id(0).to(tl.int64) * N_TOTAL + feature, (e_col + 127).to(tl.uint8))


@triton.jit
def _quantize_store(y, t, t_block, feature0, ROW, ROW_S, COL, COL_S, tokens,
                    WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, N_TOTAL: tl.constexpr,
                    HW_CVT: tl.constexpr):
    """Both MXFP8 directions of y [BLOCK_M tokens, WIDTH features from feature0]."""
    f = feature0 + tl.arange(0, WIDTH)
    t_ok = (t < tokens)[:, None]
    a = _abs_bits(y)
    e_row = _block_exponent(tl.max(tl.reshape(a, [BLOCK_M, WIDTH // 32, 32]), axis=2))
    s_row = tl.reshape(tl.broadcast_to(_quant_factor(e_row)[:, :, None], [BLOCK_M, WIDTH // 32, 32]),
                       [BLOCK_M, WIDTH])
    q = y * s_row
    tl.store(ROW + t[:, None] * N_TOTAL + f[None, :], _e4m3_bytes(q, HW_CVT), mask=t_ok)
    j = tl.arange(0, WIDTH // 32)
    tl.store(ROW_S + t[:, None] * (N_TOTAL // 32) + (feature0 // 32 + j)[None, :],
             (e_row + 127).to(tl.uint8), mask=t_ok)
    e_col = _block_exponent(tl.max(tl.reshape(a, [BLOCK_M // 32, 32, WIDTH]), axis=1))
    s_col = tl.reshape(tl.broadcast_to(_quant_factor(e_col)[:, None, :], [BLOCK_M // 32, 32, WIDTH]),
                       [BLOCK_M, WIDTH])
    q = y * s_col
    tl.store(COL + t[:, None] * N_TOTAL + f[None, :], _e4m3_bytes(q, HW_CVT), mask=t_ok)
    tb = t_block.to(tl.int64) * (BLOCK_M // 32) + tl.arange(0, BLOCK_M // 32)
    tl.store(COL_S + tb[:, None] * N_TOTAL + f[None, :], (e_col + 127).to(tl.uint8),
             mask=(tb < tokens // 32)[:, None])


@triton.jit(do_not_specialize=["tokens"])
def _proj_rope_head_kernel(X_DESC, W_NOPE, W_ROPE, COS, SIN, ROW, ROW_S, COL, COL_S, tokens,
                           K: tl.constexpr, HEADS: tl.constexpr, NOPE: tl.constexpr,
                           ROPE: tl.constexpr, W_OUT_IN: tl.constexpr, HW_CVT: tl.constexpr,
                           DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
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
        if DOT_FP32:
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


def head_config(interpreted: bool) -> HeadConfig:
    if interpreted:
        return HeadConfig(32, 32, 1, 1)
    return HeadConfig(64, 64, 4, 3)  # the best of scripts/sweep_proj.py on the H200


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def fits_head_kernel(k: int, nope: int, rope: int) -> bool:
    """The head kernel's shapes: power-of-two nope (>= 32) and rope halves (>= 32), K % 16 == 0."""
    return k % 16 == 0 and _power_of_two(nope) and nope >= 32 and _power_of_two(rope // 2) \
        and rope >= 64


def launch_head(cfg: HeadConfig, x, w, cos, sin, row, row_s, col, col_s, *, tokens: int, k: int,
                heads: int, nope: int, rope: int, w_out_in: bool, dot_fp32: bool) -> None:
    """The head kernel on BF16 x and w; outputs are the uint8 views of the float8 tensors."""
    if tokens == 0:
        return
    bm, bk = cfg.block_m, cfg.block_k
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    if w_out_in:
        w_nope, w_rope = (TensorDescriptor.from_tensor(w, [n, bk]) for n in (nope, rope))
    else:
        w_nope, w_rope = (TensorDescriptor.from_tensor(w, [bk, n]) for n in (nope, rope))
    grid = (cdiv(tokens, bm) * heads,)
    launch(_proj_rope_head_kernel, grid,
        x_desc, w_nope, w_rope, cos, sin, row, row_s, col, col_s, tokens, K=k, HEADS=heads,
        NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=not dot_fp32, DOT_FP32=dot_fp32,
        BLOCK_M=bm, BLOCK_K=bk, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)


def launch_block(x, w, cos, sin, row, row_s, col, col_s, *, tokens: int, k: int, heads: int,
                 nope: int, rope: int, w_out_in: bool, dot_fp32: bool) -> None:
    """The block kernel (any legal head shape); arguments as launch_head's."""
    if tokens == 0:
        return
    grid = (cdiv(tokens, BLOCK.value), heads, (nope + rope) // BLOCK.value)
    launch(_proj_rope_block_kernel, grid, x, w, cos, sin, row, row_s, col, col_s, tokens, K=k,
           HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=not dot_fp32,
           DOT_FP32=dot_fp32, num_warps=4)


DEQUANT_ROWS, DEQUANT_COLS, DEQUANT_WARPS = 32, 128, 4


@triton.jit
def _mxfp8_dequant_tile(CODES, SCALES, OUT, rows, tile, COLS: tl.constexpr,
                        BLOCKS_ALONG_COLS: tl.constexpr, HW_CVT: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # A tile's scales are loaded once as a small 2-D block and broadcast over their 32 codes
    # through a third axis, so the codes move in 16-byte accesses and no load is per element.
    col_tiles: tl.constexpr = (COLS + BLOCK_C - 1) // BLOCK_C
    r0 = (tile // col_tiles).to(tl.int64) * BLOCK_R
    c0 = (tile % col_tiles) * BLOCK_C
    j = tl.arange(0, 32)
    if BLOCKS_ALONG_COLS:   # scales (rows, COLS / 32); axes (row, block, column in block)
        r = r0 + tl.arange(0, BLOCK_R)
        blocks = c0 // 32 + tl.arange(0, BLOCK_C // 32)
        e = tl.load(SCALES + r[:, None] * (COLS // 32) + blocks[None, :],
                    mask=(r < rows)[:, None] & (blocks < COLS // 32)[None, :], other=127)
        c = blocks[:, None] * 32 + j[None, :]
        offs = r[:, None, None] * COLS + c[None, :, :]
        mask = (r < rows)[:, None, None] & (c < COLS)[None, :, :]
        factor = pow2(e.to(tl.int32) - 127)[:, :, None]
    else:                   # scales (rows / 32, COLS); axes (block of rows, row in block, column)
        groups = r0 // 32 + tl.arange(0, BLOCK_R // 32)
        c = c0 + tl.arange(0, BLOCK_C)
        e = tl.load(SCALES + groups[:, None] * COLS + c[None, :],
                    mask=(groups < (rows + 31) // 32)[:, None] & (c < COLS)[None, :], other=127)
        r = groups[:, None] * 32 + j[None, :]
        offs = r[:, :, None] * COLS + c[None, None, :]
        mask = (r < rows)[:, :, None] & (c < COLS)[None, None, :]
        factor = pow2(e.to(tl.int32) - 127)[:, None, :]
    codes = tl.load(CODES + offs, mask=mask, other=0)
    if HW_CVT:
        v = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = _e4m3_decode(codes)
    tl.store(OUT + offs, (v * factor).to(tl.bfloat16), mask=mask)


@triton.jit(do_not_specialize=["rows_a", "tiles_a", "rows_b"])
def _mxfp8_dequant_kernel(CODES_A, SCALES_A, OUT_A, rows_a, tiles_a, CODES_B, SCALES_B, OUT_B,
                          rows_b, COLS_A: tl.constexpr, COLS_B: tl.constexpr,
                          ALONG_COLS_A: tl.constexpr, ALONG_COLS_B: tl.constexpr,
                          HW_CVT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                          PDL: tl.constexpr):
    # the first tiles_a programs take operand A, the rest operand B
    wait_for_prior_kernel(PDL)
    tile = tl.program_id(0)
    if tile < tiles_a:
        _mxfp8_dequant_tile(CODES_A, SCALES_A, OUT_A, rows_a, tile, COLS_A, ALONG_COLS_A, HW_CVT,
                            BLOCK_R, BLOCK_C)
    else:
        _mxfp8_dequant_tile(CODES_B, SCALES_B, OUT_B, rows_b, tile - tiles_a, COLS_B,
                            ALONG_COLS_B, HW_CVT, BLOCK_R, BLOCK_C)
    allow_dependent_launch(PDL)


def launch_dequant(operands, *, dot_fp32: bool) -> None:
    """One launch for one or two operands (codes, scales, out, blocks_along_cols): BF16 ``out``
    = uint8 E4M3 ``codes`` [rows, cols] times their E8M0 ``scales``, blocks of 32 along the
    columns (scales [rows, cols / 32]) or along the rows (scales [rows / 32, cols])."""
    operands = [op for op in operands if op[0].shape[0]]
    if not operands:
        return
    (ca, sa, oa, along_a), (cb, sb, ob, along_b) = operands[0], operands[-1]
    tiles = [cdiv(c.shape[0], DEQUANT_ROWS) * cdiv(c.shape[1], DEQUANT_COLS)
             for c, *_ in operands]
    pdl = use_pdl(ca)
    launch(_mxfp8_dequant_kernel, (sum(tiles),), ca, sa, oa, ca.shape[0], tiles[0], cb, sb, ob,
           cb.shape[0], COLS_A=ca.shape[1], COLS_B=cb.shape[1], ALONG_COLS_A=along_a,
           ALONG_COLS_B=along_b, HW_CVT=not dot_fp32, BLOCK_R=DEQUANT_ROWS,
           BLOCK_C=DEQUANT_COLS, PDL=pdl, launch_pdl=pdl, num_warps=DEQUANT_WARPS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles at the benchmark's shape: the block and
    head kernels for W [out, in] and [in, out], and the MXFP8 dequantize kernel for W's blocks
    along either axis."""
    from ..registry import op
    _, k, heads, nope, rope = op("gemm_proj_rope_mxfp8").cases[0]
    c = CONSTEXPR
    cases = []
    for w_out_in in (True, False):
        cases.append(CompileCase(f"proj block w_out_in={w_out_in}", _proj_rope_block_kernel, dict(
            X="*bf16", W="*bf16", COS="*bf16", SIN="*bf16", ROW="*u8", ROW_S="*u8", COL="*u8",
            COL_S="*u8", tokens="i32", K=c, HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, HW_CVT=c,
            DOT_FP32=c),
            dict(K=k, HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=True,
                 DOT_FP32=False)))
        w_nope, w_rope = (("tensordesc<bf16[128,64]>", "tensordesc<bf16[64,64]>") if w_out_in
                          else ("tensordesc<bf16[64,128]>", "tensordesc<bf16[64,64]>"))
        cases.append(CompileCase(f"proj head w_out_in={w_out_in}", _proj_rope_head_kernel, dict(
            X_DESC="tensordesc<bf16[64,64]>", W_NOPE=w_nope, W_ROPE=w_rope, COS="*bf16",
            SIN="*bf16", ROW="*u8", ROW_S="*u8", COL="*u8", COL_S="*u8", tokens="i32", K=c,
            HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, HW_CVT=c, DOT_FP32=c, BLOCK_M=c, BLOCK_K=c,
            NUM_STAGES=c),
            dict(K=k, HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=True,
                 DOT_FP32=False, BLOCK_M=64, BLOCK_K=64, NUM_STAGES=3)))
    for along_cols in (True, False):   # W's blocks along its columns or rows; x's along columns
        cases.append(CompileCase(
            f"mxfp8 dequant W blocks_along_cols={along_cols}", _mxfp8_dequant_kernel, dict(
                CODES_A="*u8", SCALES_A="*u8", OUT_A="*bf16", rows_a="i32", tiles_a="i32",
                CODES_B="*u8", SCALES_B="*u8", OUT_B="*bf16", rows_b="i32", COLS_A=c, COLS_B=c,
                ALONG_COLS_A=c, ALONG_COLS_B=c, HW_CVT=c, BLOCK_R=c, BLOCK_C=c, PDL=c),
            dict(COLS_A=k if along_cols else heads * (nope + rope), COLS_B=k,
                 ALONG_COLS_A=along_cols, ALONG_COLS_B=True, HW_CVT=True, BLOCK_R=DEQUANT_ROWS,
                 BLOCK_C=DEQUANT_COLS, PDL=True), num_warps=DEQUANT_WARPS))
    return cases
