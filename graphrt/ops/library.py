"""Every functional op as a PyTorch operator, ``torch.ops.graphrt.<name>`` (the names of
``graphrt.ops``), with a fake implementation so that torch.compile and other tracers see its
output shapes without running it. Schemas, implementations and fakes come from each op's
:class:`~graphrt.opspec.OpSpec`.

The operators take the functional calls' inputs and configuration (outputs are always
allocated) and return their outputs as a list of tensors: an output the call leaves out
(``h_new`` without a residual, ``mask`` at dropout 0, ``dweight`` when not computed) is an
empty tensor. They are registered with define/impl, not ``torch.library.custom_op``, whose
safety layers cost tens of microseconds per call.

>>> y, rstd, _ = torch.ops.graphrt.rmsnorm_forward(x, w, 1e-6, None)      # doctest: +SKIP
"""
from __future__ import annotations

import torch

from .adamw.spec import STEP
from .grouped_gemm.spec import WGRAD
from .hstu.spec import BACKWARD as HSTU_BACKWARD, FORWARD as HSTU_FORWARD
from .mhc.spec import BACKWARD as MHC_BACKWARD
from .proj_rope.spec import PROJECTION
from .rmsnorm.spec import BACKWARD as RMSNORM_BACKWARD, FORWARD as RMSNORM_FORWARD

SPECS = (RMSNORM_FORWARD, RMSNORM_BACKWARD, MHC_BACKWARD, HSTU_FORWARD, HSTU_BACKWARD, WGRAD,
         PROJECTION, STEP)

_lib = torch.library.Library("graphrt", "FRAGMENT")
for _spec in SPECS:
    _spec.register(_lib)
