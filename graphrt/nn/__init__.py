"""torch.nn modules and autograd glue built on graphrt's ops."""
from .grouped import GroupedLinear
from .hstu import HstuLmsd
from .mhc import MhcProjection
from .rmsnorm import RMSNorm, rms_norm

__all__ = ["GroupedLinear", "HstuLmsd", "MhcProjection", "RMSNorm", "rms_norm"]
