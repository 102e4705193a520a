"""mHC projection/RMS backward (DeepSeek manifold-constrained hyper-connections)."""
from .spec import mhc_projection_backward
from .plan import MhcProjectionBackward
from .reference import mhc_projection_backward_reference, mhc_projection_forward_reference

__all__ = ["MhcProjectionBackward", "mhc_projection_backward",
           "mhc_projection_backward_reference", "mhc_projection_forward_reference"]
