"""AdamW step in PyTorch: the semantics, the CPU backend and the test oracle."""
from __future__ import annotations

import math


def adamw_update_reference(p, g, m, v, step: float, *, lr: float, beta1: float, beta2: float,
                           eps: float, weight_decay: float, maximize: bool = False):
    """(p, m, v) after one AdamW step in FP32 from FP32 copies of the inputs; ``step`` is this
    update's count (1 on the first). The update reads the new m and v before rounding:

        p *= 1 - lr * weight_decay
        m += (1 - beta1) * (g - m);  v = beta2 * v + (1 - beta2) * g^2
        p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
    """
    g = -g.float() if maximize else g.float()
    p, m, v = p.float(), m.float(), v.float()
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m)
    v = v * beta2 + (1 - beta2) * g * g
    bias1 = 1 - math.pow(beta1, step)
    bias2_sqrt = math.sqrt(1 - math.pow(beta2, step))
    p = p - (lr / bias1) * m / (v.sqrt() / bias2_sqrt + eps)
    return p, m, v


def adamw_step_reference(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps,
                         weight_decay, maximize=False) -> None:
    """In place, tensor by tensor, each stored back in its own dtype."""
    lr = float(lr)
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        new_p, new_m, new_v = adamw_update_reference(
            p, g, m, v, float(step), lr=lr, beta1=beta1, beta2=beta2, eps=eps,
            weight_decay=weight_decay, maximize=maximize)
        p.copy_(new_p)
        m.copy_(new_m)
        v.copy_(new_v)
