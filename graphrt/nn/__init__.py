"""torch.nn modules and autograd glue built on graphrt's ops."""
from .grouped import GroupedLinear
from .replace import NormReplacement, replace_norms
from .hstu import HstuLmsd
from .mhc import MhcProjection
from .rmsnorm import RMSNorm, rms_norm

__all__ = ["GroupedLinear", "HstuLmsd", "MhcProjection", "NormReplacement", "RMSNorm", "replace_norms",
           "rms_norm"]
