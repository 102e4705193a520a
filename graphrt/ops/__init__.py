"""The fused ops: functional calls and plan classes."""
from .rmsnorm import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward

__all__ = ["RmsNormForward", "RmsNormBackward", "rmsnorm_forward", "rmsnorm_backward"]
