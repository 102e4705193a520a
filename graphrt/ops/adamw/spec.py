"""The AdamW step, declared: arguments, key and functional call (it writes in place)."""
from __future__ import annotations

import torch

from ...opspec import OpSpec, Option, Tensor
from ...validate import flag_value
from .plan import AdamWStep, parameter_list


def _on_device(name, lr) -> bool:
    """A tensor lr is read when the kernel runs (a captured step follows its schedule)."""
    return isinstance(lr, torch.Tensor)


STEP = OpSpec(
    "adamw_step", AdamWStep,
    (Tensor("params", schema="Tensor(a!)[]"), Tensor("grads", schema="Tensor[]"),
     Tensor("exp_avgs", schema="Tensor(b!)[]"), Tensor("exp_avg_sqs", schema="Tensor(c!)[]"),
     Tensor("steps", schema="Tensor[]")),
    (Option("lr", 1e-3, _on_device, "float", flag="lr_on_device"),
     Option("betas", (0.9, 0.999), schema="float[]"), Option("eps", 1e-8, schema="float"),
     Option("weight_decay", 1e-2, schema="float"),
     Option("maximize", False, flag_value, "bool")),
    (), prepare=parameter_list, returns="none",
    doc="""One AdamW step (decoupled weight decay), in place on ``params``, ``exp_avgs`` and
    ``exp_avg_sqs``; ``steps`` are FP32 one-element tensors already counting this step. ``lr``
    is a float or a one-element FP32 tensor on the device (read when the kernel runs, so a
    captured step follows a schedule that writes it). The update uses the new moments before
    they are rounded to their dtype. ``graphrt.optim.AdamW`` is the optimizer built on it.

    >>> p = torch.randn(8); g = torch.randn(8); m = torch.zeros(8); v = torch.zeros(8)
    >>> graphrt.ops.adamw_step([p], [g], [m], [v], [torch.ones(())], lr=0.1)
    """)

adamw_step = STEP.functional
