"""The fused ops: functional calls and plan classes."""
from .mhc import MhcProjectionBackward, mhc_projection_backward
from .rmsnorm import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward

__all__ = ["MhcProjectionBackward", "RmsNormBackward", "RmsNormForward", "mhc_projection_backward",
           "rmsnorm_backward", "rmsnorm_forward"]
