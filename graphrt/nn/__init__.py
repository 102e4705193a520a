"""torch.nn modules and autograd glue built on graphrt's ops."""
from .rmsnorm import RMSNorm, rms_norm

__all__ = ["RMSNorm", "rms_norm"]
