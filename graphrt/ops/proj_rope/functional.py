"""Functional projection GEMM + RoPE + dual-direction MXFP8 quantize."""
from __future__ import annotations

from ...result import Result
from ...runtime import runtime_for
from .plan import GemmProjRopeMxfp8


def gemm_proj_rope_mxfp8(x, w, cos, sin, *, x_scale=None, w_scale=None, w_out_in: bool = True,
                         qk_nope_dim: int = 128, qk_rope_dim: int = 64, out_fp8_row=None,
                         out_scales_row=None, out_fp8_col=None, out_scales_col=None,
                         stream=None, runtime=None) -> Result:
    """Project, rotate each head's rope features and quantize to MXFP8 in both directions.
    Returns ``(out_fp8_row, out_scales_row, out_fp8_col, out_scales_col)``: codes (T, H, D)
    float8_e4m3fn with E8M0 scales (T, H, D/32) rowwise and (T/32, H, D) columnwise.

    NaN and infinity follow the OCP MX spec: a block of 32 that holds either gets the NaN scale
    (byte 255), which makes the whole block NaN, and the E4M3 NaN code 0x7F in every place (E4M3
    has no infinity). Input codes 0x7F/0xFF and input scale bytes 255 read as NaN. Every backend
    writes the same bytes.

    >>> q = graphrt.ops.gemm_proj_rope_mxfp8(x, w, cos, sin)                  # doctest: +SKIP
    """
    rt = runtime_for("x", x, runtime)
    config = {"x_scale": x_scale, "w_scale": w_scale, "w_out_in": w_out_in,
              "qk_nope_dim": qk_nope_dim, "qk_rope_dim": qk_rope_dim, "out_fp8_row": out_fp8_row,
              "out_scales_row": out_scales_row, "out_fp8_col": out_fp8_col,
              "out_scales_col": out_scales_col}
    return rt.run(GemmProjRopeMxfp8, (x, w, cos, sin), config, stream)
