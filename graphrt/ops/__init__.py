"""The fused ops: functional calls and plan classes."""
from .adamw import AdamWStep, adamw_step
from .grouped_gemm import GroupedGemmWgrad, grouped_gemm_wgrad
from .hstu import HstuLmsdBackward, HstuLmsdForward, hstu_lmsd_backward, hstu_lmsd_forward
from .mhc import MhcProjectionBackward, mhc_projection_backward
from .proj_rope import GemmProjRopeMxfp8, gemm_proj_rope_mxfp8
from .rmsnorm import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward
from . import library  # noqa: E402,F401 - registers torch.ops.graphrt.<name>

__all__ = ["AdamWStep", "GemmProjRopeMxfp8", "GroupedGemmWgrad", "HstuLmsdBackward", "HstuLmsdForward",
           "MhcProjectionBackward", "RmsNormBackward", "RmsNormForward", "adamw_step",
           "gemm_proj_rope_mxfp8", "grouped_gemm_wgrad", "hstu_lmsd_backward", "hstu_lmsd_forward",
           "mhc_projection_backward", "rmsnorm_backward", "rmsnorm_forward"]
