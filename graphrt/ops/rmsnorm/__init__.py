"""RMSNorm train forward/backward with a deterministic dw."""
from .spec import rmsnorm_backward, rmsnorm_forward
from .plan import RmsNormBackward, RmsNormForward
from .reference import rmsnorm_backward_reference, rmsnorm_forward_reference

__all__ = ["RmsNormForward", "RmsNormBackward", "rmsnorm_forward", "rmsnorm_backward",
           "rmsnorm_forward_reference", "rmsnorm_backward_reference"]
