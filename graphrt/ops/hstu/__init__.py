"""HSTU LayerNorm-Multiply-SiLU-Dropout forward and backward."""
from .spec import hstu_lmsd_backward, hstu_lmsd_forward
from .plan import HstuLmsdBackward, HstuLmsdForward
from .reference import hstu_lmsd_backward_reference, hstu_lmsd_forward_reference

__all__ = ["HstuLmsdBackward", "HstuLmsdForward", "hstu_lmsd_backward", "hstu_lmsd_forward",
           "hstu_lmsd_backward_reference", "hstu_lmsd_forward_reference"]
