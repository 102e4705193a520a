"""Plan for the AdamW step over a list of tensors."""
from __future__ import annotations

import torch

from ...errors import ContractError
from ...plan import Plan
from ...streams import on_stream
from ...validate import dtype_name, real_value, require_disjoint, require_tensor
from .reference import adamw_step_reference

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LISTS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps")


def _tensor_list(name: str, value, length: int | None = None) -> list:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise ContractError(f"{name}: expected a list of tensors, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ContractError(f"{name}: expected {length} tensors (one per parameter), got {len(value)}")
    for i, t in enumerate(value):
        require_tensor(f"{name}[{i}]", t)
    return list(value)


def parameter_list(params) -> list:
    """``params`` as a non-empty list of tensors (a ContractError otherwise)."""
    params = _tensor_list("params", params)
    if not params:
        raise ContractError("params: expected at least one tensor, got an empty list")
    return params


def _betas(betas) -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ContractError(f"betas: expected a pair (beta1, beta2), got {betas!r}")
    return (real_value("betas[0]", betas[0], 0.0, 1.0, high_open=True),
            real_value("betas[1]", betas[1], 0.0, 1.0, high_open=True))


def _check_lr(lr, device: torch.device):
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1 or lr.dtype != torch.float32 or lr.device != device:
            raise ContractError(f"lr: a tensor lr must be one float32 element on {device}, got "
                                f"{dtype_name(lr.dtype)} shape {tuple(lr.shape)} on {lr.device}")
        return lr
    return real_value("lr", lr, 0.0)


class AdamWStep(Plan):
    """One AdamW step, in place, over lists of parameters, gradients, both moments and the
    per-parameter step counts (FP32 one-element tensors on the device, already counting this
    step, as ``torch.optim.AdamW(capturable=True)`` keeps them). p, g, m and v of one parameter
    share a dtype (BF16, FP16 or FP32) and a shape and are contiguous; the math is FP32.

    >>> plan = AdamWStep(params, grads, ms, vs, steps, lr=1e-3).compile()      # doctest: +SKIP
    >>> plan.execute(params, grads, ms, vs, steps, lr=1e-3)                    # doctest: +SKIP
    """

    op = "adamw_step"
    output_names = ()

    def execute(self, params, grads, exp_avgs, exp_avg_sqs, steps, *, lr=1e-3, betas=(0.9, 0.999),
                eps: float = 1e-8, weight_decay: float = 1e-2, workspace=None, stream=None) -> None:
        params = _tensor_list("params", params)
        n = len(params)
        lists = [params] + [_tensor_list(name, value, n) for name, value in
                            zip(LISTS[1:], (grads, exp_avgs, exp_avg_sqs, steps))]
        device = params[0].device
        for i, (p, g, m, v, step) in enumerate(zip(*lists)):
            if p.dtype not in DTYPES:
                raise ContractError(f"params[{i}]: expected dtype bfloat16, float16 or float32, got "
                                    f"{dtype_name(p.dtype)}")
            for name, t in (("params", p), ("grads", g), ("exp_avgs", m), ("exp_avg_sqs", v)):
                if t.dtype != p.dtype or t.shape != p.shape or t.device != device:
                    raise ContractError(f"{name}[{i}]: expected {dtype_name(p.dtype)} {tuple(p.shape)} "
                                        f"on {device} like params[{i}], got {dtype_name(t.dtype)} "
                                        f"{tuple(t.shape)} on {t.device}")
                if not t.is_contiguous():
                    raise ContractError(f"{name}[{i}]: expected a contiguous tensor, got strides "
                                        f"{t.stride()}")
            if step.dtype != torch.float32 or step.numel() != 1 or step.device != device:
                raise ContractError(f"steps[{i}]: expected one float32 element on {device} (the step "
                                    f"count), got {dtype_name(step.dtype)} shape {tuple(step.shape)} "
                                    f"on {step.device}")
            require_disjoint({f"params[{i}]": p, f"exp_avgs[{i}]": m, f"exp_avg_sqs[{i}]": v},
                             {f"grads[{i}]": g, f"steps[{i}]": step})
        lr = _check_lr(lr, device)
        if isinstance(lr, torch.Tensor) != self.contract.flag("lr_on_device"):
            raise ContractError("lr: this plan was built for a "
                                f"{'tensor' if self.contract.flag('lr_on_device') else 'float'} lr")
        beta1, beta2 = _betas(betas)
        eps = real_value("eps", eps, 0.0)
        weight_decay = real_value("weight_decay", weight_decay, 0.0)
        hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                     maximize=self.contract.flag("maximize"))
        if self.backend == "reference":
            adamw_step_reference(*lists, **hyper)
            return
        from .kernels import launch_adamw
        with on_stream(stream):
            launch_adamw(*lists, **hyper)
