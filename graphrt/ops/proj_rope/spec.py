"""Projection GEMM + RoPE + dual-direction MXFP8 quantize, declared: arguments, key, outputs,
functional call."""
from __future__ import annotations

import torch

from ...contract import compact_rows_spec, compact_spec
from ...opspec import OpSpec, Option, Output, Tensor
from ...validate import flag_value, int_value
from .plan import GemmProjRopeMxfp8
from .reference import FP8


def _head_dim(v) -> int:
    return v["qk_nope_dim"] + v["qk_rope_dim"]


def _codes(v) -> tuple:
    """(tokens, heads, head dim)."""
    w, d = v["w"], _head_dim(v)
    return (v["x"].shape[0], (w.shape[0] if v["w_out_in"] else w.shape[1]) // d, d)


PROJECTION = OpSpec(
    "gemm_proj_rope_mxfp8", GemmProjRopeMxfp8,
    (Tensor("x", compact_rows_spec), Tensor("w", compact_spec), Tensor("cos", compact_rows_spec),
     Tensor("sin", compact_rows_spec)),
    (Option("x_scale", None, compact_rows_spec, "Tensor?"),
     Option("w_scale", None, compact_spec, "Tensor?"),
     Option("w_out_in", True, flag_value, "bool"),
     Option("qk_nope_dim", 128, int_value, "int"), Option("qk_rope_dim", 64, int_value, "int")),
    (Output("out_fp8_row", _codes, FP8),
     Output("out_scales_row", lambda v: (*_codes(v)[:2], _head_dim(v) // 32), torch.uint8),
     Output("out_fp8_col", _codes, FP8),
     Output("out_scales_col", lambda v: (v["x"].shape[0] // 32, *_codes(v)[1:]), torch.uint8)),
    doc="""Project, rotate each head's rope features and quantize to MXFP8 in both directions.
    Returns ``(out_fp8_row, out_scales_row, out_fp8_col, out_scales_col)``: codes (T, H, D)
    float8_e4m3fn with E8M0 scales (T, H, D/32) rowwise and (T/32, H, D) columnwise.

    NaN and infinity follow the OCP MX spec: a block of 32 that holds either gets the NaN scale
    (byte 255), which makes the whole block NaN, and the E4M3 NaN code 0x7F in every place (E4M3
    has no infinity). Input codes 0x7F/0xFF and input scale bytes 255 read as NaN. Every backend
    writes the same bytes.

    >>> q = graphrt.ops.gemm_proj_rope_mxfp8(x, w, cos, sin)                  # doctest: +SKIP
    """)

gemm_proj_rope_mxfp8 = PROJECTION.functional
