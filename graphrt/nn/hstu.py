"""graphrt.nn.HstuLmsd: HSTU's LayerNorm-Multiply-SiLU-Dropout stage with fused kernels."""
from __future__ import annotations

import torch

from ..errors import ContractError
from ..ops.hstu import hstu_lmsd_backward, hstu_lmsd_forward
from ..ops.hstu.plan import MAX_D, MIN_D, dropout_p32
from ..validate import eps_value, flag_value, require_tensor, size_value
from .dispatch import call
from ..runtime import runtime as default_runtime


def _forward(x, u, weight, bias, eps, p, seed, offset, silu, concat_u, concat_x):
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, weight, bias, eps=eps, dropout_ratio=p,
                                            seed=0 if seed is None else seed,
                                            offset=0 if offset is None else offset,
                                            apply_u_silu=silu,
                                            concat_u=concat_u, concat_x=concat_x)
    return y, mean, rstd, x.new_empty(0, dtype=torch.int8) if mask is None else mask


def _backward(dy, x, u, weight, bias, mean, rstd, mask, p, silu, concat_u, concat_x,
              compute_dweight):
    return hstu_lmsd_backward(dy, x, u, weight, bias, mean, rstd, mask, dropout_ratio=p,
                              apply_u_silu=silu, concat_u=concat_u, concat_x=concat_x,
                              compute_dweight=compute_dweight)


class _HstuLmsdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, u, weight, bias, eps, p, seed, offset, flags):
        y, mean, rstd, mask = call(_forward, "hstu_lmsd_forward", x, u, weight, bias, eps, p,
                                   seed, offset, flags["apply_u_silu"], flags["concat_u"],
                                   flags["concat_x"])
        ctx.save_for_backward(x, u, weight, bias, mean, rstd, mask)
        ctx.p, ctx.flags = p, flags
        return y

    @staticmethod
    def backward(ctx, dy):
        x, u, weight, bias, mean, rstd, mask = ctx.saved_tensors
        f = ctx.flags
        dx, du, dweight, dbias = call(
            _backward, "hstu_lmsd_backward", dy.contiguous(), x, u, weight, bias, mean, rstd,
            mask if ctx.p > 0 else None, ctx.p, f["apply_u_silu"], f["concat_u"], f["concat_x"],
            ctx.needs_input_grad[2])
        return dx, du, dweight if ctx.needs_input_grad[2] else None, dbias, None, None, None, \
            None, None


class HstuLmsd(torch.nn.Module):
    """y = [drop(a) if concat_u, drop(x) if concat_x, drop(LayerNorm(x) * w + b) * a)],
    a = SiLU(u) (or u); x, u BF16 [N, D]. Dropout (training mode) draws from the runtime's
    device-side (seed, offset), which each call advances, so CUDA-graph replays see fresh masks.
    The backward reuses the saved mean, rstd and mask (no recompute).

    >>> lmsd = graphrt.nn.HstuLmsd(512, dropout_ratio=0.1).cuda()      # doctest: +SKIP
    >>> y = lmsd(x, u)                                                # [N, 3 * 512]
    """

    def __init__(self, d: int, *, eps: float = 1e-6, dropout_ratio: float = 0.0,
                 apply_u_silu: bool = True, concat_u: bool = True, concat_x: bool = True,
                 device=None):
        super().__init__()
        d = size_value("d", d, multiple=8, low=MIN_D, high=MAX_D)
        self.eps, self.dropout_ratio = eps_value(eps), dropout_p32(dropout_ratio)
        self.flags = {"apply_u_silu": flag_value("apply_u_silu", apply_u_silu),
                      "concat_u": flag_value("concat_u", concat_u),
                      "concat_x": flag_value("concat_x", concat_x)}
        self.weight = torch.nn.Parameter(torch.ones(d, dtype=torch.bfloat16, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(d, dtype=torch.bfloat16, device=device))

    def forward(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        d = self.weight.shape[0]
        for name, t in (("x", x), ("u", u)):
            t = require_tensor(name, t)
            if t.dim() != 2 or t.shape[1] != d:
                raise ContractError(f"{name}: expected a 2-D [N, {d}] tensor (the module's d), "
                                    f"got shape {tuple(t.shape)}")
        p = self.dropout_ratio if self.training else 0.0
        seed = offset = None
        rng = None
        if p > 0:
            rng = default_runtime(x.device).rng
            seed, offset = rng.state[0:1], rng.state[1:2]
        y = _HstuLmsdFunction.apply(x, u, self.weight, self.bias, self.eps, p, seed, offset,
                                    self.flags)
        if rng is not None:
            rng.advance(x.shape[0] * x.shape[1])
        return y
