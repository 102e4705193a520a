"""Functional AdamW step: plan from the runtime's store."""
from __future__ import annotations

from ...runtime import runtime_for
from .plan import AdamWStep, parameter_list


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr=1e-3, betas=(0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 1e-2, maximize: bool = False,
               stream=None, runtime=None) -> None:
    """One AdamW step (decoupled weight decay), in place on ``params``, ``exp_avgs`` and
    ``exp_avg_sqs``; ``steps`` are FP32 one-element tensors already counting this step. ``lr``
    is a float or a one-element FP32 tensor on the device (read when the kernel runs, so a
    captured step follows a schedule that writes it). The update uses the new moments before
    they are rounded to their dtype. ``graphrt.optim.AdamW`` is the optimizer built on it.

    >>> p = torch.randn(8); g = torch.randn(8); m = torch.zeros(8); v = torch.zeros(8)
    >>> graphrt.ops.adamw_step([p], [g], [m], [v], [torch.ones(())], lr=0.1)
    """
    params = parameter_list(params)
    rt = runtime_for("params[0]", params[0], runtime)
    rt.run(AdamWStep, (params, grads, exp_avgs, exp_avg_sqs, steps),
           {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize},
           stream)
