"""Projection GEMM + YaRN RoPE + dual-direction MXFP8 quantize."""
from .spec import gemm_proj_rope_mxfp8
from .plan import GemmProjRopeMxfp8
from .reference import gemm_proj_rope_mxfp8_reference, mxfp8_dequantize, mxfp8_quantize

__all__ = ["GemmProjRopeMxfp8", "gemm_proj_rope_mxfp8", "gemm_proj_rope_mxfp8_reference",
           "mxfp8_dequantize", "mxfp8_quantize"]
