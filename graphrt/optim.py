"""Optimizers built on graphrt's ops (what a training loop imports, beside graphrt.nn)."""
from __future__ import annotations

import torch

from .errors import UnsupportedError
from .ops.adamw import adamw_step


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose step is graphrt's fused AdamW op: one pass over each
    parameter's p, g, m and v in FP32 registers, with the step counts on the device, so the step
    is CUDA-graph capturable (``capturable`` is always on) and ``graph_step`` can hold it. The
    state (``step``, ``exp_avg``, ``exp_avg_sq``) has torch's names and layout, so checkpoints
    move between the two. ``amsgrad``, ``differentiable`` and sparse gradients are not supported.

    >>> opt = graphrt.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)  # doctest: +SKIP
    >>> loss.backward(); opt.step(); opt.zero_grad()                              # doctest: +SKIP
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, maximize: bool = False, amsgrad: bool = False,
                 **unsupported):
        for name in ("differentiable", "fused"):
            if unsupported.get(name):
                raise UnsupportedError(f"{name}: graphrt.optim.AdamW has its own fused step; "
                                       f"leave {name} unset")
        unsupported.pop("foreach", None)
        unsupported.pop("capturable", None)
        if unsupported:
            raise TypeError(f"AdamW got unexpected keyword arguments {sorted(unsupported)}")
        if amsgrad:
            raise UnsupportedError("amsgrad: graphrt.optim.AdamW does not implement it; use "
                                   "torch.optim.AdamW(amsgrad=True, capturable=True)")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         maximize=maximize, capturable=True, foreach=False)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("amsgrad"):
                raise UnsupportedError("amsgrad: graphrt.optim.AdamW does not implement it")
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise UnsupportedError("graphrt.optim.AdamW: sparse gradients are not supported")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            torch._foreach_add_(steps, 1)
            adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"],
                       betas=group["betas"], eps=group["eps"],
                       weight_decay=group["weight_decay"], maximize=group["maximize"])
        return loss
