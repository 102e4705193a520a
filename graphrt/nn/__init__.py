"""torch.nn modules and autograd glue built on graphrt's ops."""
from .mhc import MhcProjection
from .rmsnorm import RMSNorm, rms_norm

__all__ = ["MhcProjection", "RMSNorm", "rms_norm"]
