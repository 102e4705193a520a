"""The fused ops: functional calls and plan classes."""
from .hstu import HstuLmsdBackward, HstuLmsdForward, hstu_lmsd_backward, hstu_lmsd_forward
from .mhc import MhcProjectionBackward, mhc_projection_backward
from .rmsnorm import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward

__all__ = ["HstuLmsdBackward", "HstuLmsdForward", "MhcProjectionBackward", "RmsNormBackward",
           "RmsNormForward", "hstu_lmsd_backward", "hstu_lmsd_forward", "mhc_projection_backward",
           "rmsnorm_backward", "rmsnorm_forward"]
