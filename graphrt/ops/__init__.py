"""The fused ops: functional calls and plan classes."""
from .grouped_gemm import GroupedGemmWgrad, grouped_gemm_wgrad
from .hstu import HstuLmsdBackward, HstuLmsdForward, hstu_lmsd_backward, hstu_lmsd_forward
from .mhc import MhcProjectionBackward, mhc_projection_backward
from .rmsnorm import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward

__all__ = ["GroupedGemmWgrad", "HstuLmsdBackward", "HstuLmsdForward", "MhcProjectionBackward", "RmsNormBackward",
           "RmsNormForward", "grouped_gemm_wgrad", "hstu_lmsd_backward", "hstu_lmsd_forward", "mhc_projection_backward",
           "rmsnorm_backward", "rmsnorm_forward"]
