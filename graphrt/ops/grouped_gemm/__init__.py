"""Grouped GEMM weight gradients for MoE experts."""
from .spec import grouped_gemm_wgrad
from .plan import GroupedGemmWgrad
from .reference import grouped_gemm_wgrad_reference

__all__ = ["GroupedGemmWgrad", "grouped_gemm_wgrad", "grouped_gemm_wgrad_reference"]
