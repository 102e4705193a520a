"""Projection GEMM + YaRN RoPE + dual-direction MXFP8 quantize in PyTorch: the semantics, the CPU
backend and the test oracle."""
from __future__ import annotations

import torch

from ...block_scaling import FP8, dequantize_blocks

FP8_MAX = 448.0
BLOCK = 32


NAN_EXPONENT = 128    # the E8M0 NaN scale (byte 255) as an exponent
E4M3_NAN = 0x7F


def block_exponents(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 exponents: e = ceil(log2(amax / 448)) in FP32, amax clamped to >= 1e-30, so e is in
    [-127, 120] for a finite amax; NAN_EXPONENT where amax is a NaN or an infinity. Read off the
    FP32 bits, so exact powers of two are exact."""
    ratio = amax.float().clamp_min(1e-30) / FP8_MAX
    bits = ratio.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    exponent = exponent.clamp(-127, 127)
    return torch.where(amax.isfinite(), exponent, NAN_EXPONENT)


def mxfp8_quantize(values: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn like ``values``, scales uint8 with ``dim`` reduced by 32): blocks of
    32 along ``dim``; data = clamp(v * 2^-e, -448, 448) rounded to nearest even.

    A block holding a NaN or an infinity gets the OCP MX NaN scale (byte 255), which makes every
    element of the block NaN, and the E4M3 NaN code 0x7F in all 32 places."""
    v = values.float().movedim(dim, -1)
    shape = v.shape
    blocks = v.reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK)
    e = block_exponents(blocks.abs().amax(dim=-1))
    finite_e = torch.where(e == NAN_EXPONENT, 0, e)
    scaled = blocks * torch.pow(2.0, -finite_e.double()).float().unsqueeze(-1)
    codes = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
    codes = torch.where((e == NAN_EXPONENT).unsqueeze(-1), E4M3_NAN, codes)
    codes = codes.view(FP8).reshape(shape).movedim(-1, dim)
    scales = (e + 127).to(torch.uint8).movedim(-1, dim)
    return codes.contiguous(), scales.contiguous()


def mxfp8_dequantize(codes: torch.Tensor, scales: torch.Tensor, dim: int) -> torch.Tensor:
    """FP32 values of MXFP8 codes with E8M0 ``scales`` per 32 along ``dim``; the NaN scale (255)
    makes its whole block NaN, as do E4M3's NaN codes their own place."""
    return dequantize_blocks(codes, scales, dim, BLOCK)


def apply_rope(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nope: int) -> torch.Tensor:
    """RoPE on each head's trailing features, interleaved in and halves out; y [T, H, D] FP32,
    cos and sin [T, rope] shared by all heads."""
    pe = y[..., nope:]
    half = pe.shape[-1] // 2
    x1, x2 = pe[..., 0::2], pe[..., 1::2]
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
    out = torch.cat((x1 * c[..., :half] - x2 * s[..., :half],
                     x2 * c[..., half:] + x1 * s[..., half:]), dim=-1)
    return torch.cat((y[..., :nope], out), dim=-1)


def gemm_proj_rope_mxfp8_reference(x, w, cos, sin, *, x_scale=None, w_scale=None,
                                   w_out_in=True, qk_nope_dim=128, qk_rope_dim=64):
    """(out_fp8_row, out_scales_row, out_fp8_col, out_scales_col) from FP32 GEMM, RoPE and both
    quantizations. On the MXFP8 path x and w are dequantized first."""
    if x.dtype == FP8:
        x = mxfp8_dequantize(x, x_scale, dim=1)
        w = mxfp8_dequantize(w, w_scale, dim=1 if w_out_in else 0)
    wf = w.float() if w_out_in else w.float().t()
    tokens = x.shape[0]
    head_dim = qk_nope_dim + qk_rope_dim
    y = (x.float() @ wf.t()).view(tokens, wf.shape[0] // head_dim, head_dim)
    y = apply_rope(y, cos, sin, qk_nope_dim)
    row_codes, row_scales = mxfp8_quantize(y, dim=2)
    col_codes, col_scales = mxfp8_quantize(y, dim=0)
    return row_codes, row_scales, col_codes, col_scales
