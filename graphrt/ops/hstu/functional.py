"""Functional HSTU LayerNorm-Multiply-SiLU-Dropout calls."""
from __future__ import annotations

from ...result import Result
from ...runtime import runtime_for
from .plan import HstuLmsdBackward, HstuLmsdForward


def hstu_lmsd_forward(x, u, weight, bias, *, eps: float = 1e-6, dropout_ratio: float = 0.0,
                      seed=0, offset=0, apply_u_silu: bool = True, concat_u: bool = True,
                      concat_x: bool = True, y=None, mean=None, rstd=None, mask=None,
                      stream=None, runtime=None) -> Result:
    """HSTU fused LayerNorm, affine, multiply by SiLU(u) and inverted dropout.

    Returns ``(y, mean, rstd, mask)``: y BF16 [N, S*D] holds [drop(a) if concat_u, drop(x) if
    concat_x, drop(l * a)]; mask int8 [N, D] (None when dropout_ratio is 0) has bit 0 for l*a,
    bit 1 for x, bit 2 for a. seed and offset are ints or one-element int64 tensors (graph-safe).

    >>> y, mean, rstd, mask = graphrt.ops.hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.1,
    ...                                                     seed=1234, offset=0)  # doctest: +SKIP
    """
    rt = runtime_for("x", x, runtime)
    config = {"eps": eps, "dropout_ratio": dropout_ratio, "seed": seed, "offset": offset,
              "apply_u_silu": apply_u_silu, "concat_u": concat_u, "concat_x": concat_x,
              "y": y, "mean": mean, "rstd": rstd, "mask": mask}
    result = rt.run(HstuLmsdForward, (x, u, weight, bias), config, stream)
    return result


def hstu_lmsd_backward(dy, x, u, weight, bias, mean, rstd, mask, *, dropout_ratio,
                       apply_u_silu, concat_u, concat_x, compute_dweight: bool = True, dx=None,
                       du=None, dweight=None, dbias=None, stream=None, runtime=None) -> Result:
    """Backward of hstu_lmsd_forward. Returns ``(dx, du, dweight, dbias)``; dweight is None
    when ``compute_dweight`` is False. The flags must be the forward's.

    >>> dx, du, dw, db = graphrt.ops.hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask,
    ...     dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)  # doctest: +SKIP
    """
    rt = runtime_for("x", x, runtime)
    config = {"dropout_ratio": dropout_ratio, "apply_u_silu": apply_u_silu,
              "concat_u": concat_u, "concat_x": concat_x, "compute_dweight": compute_dweight,
              "dx": dx, "du": du, "dweight": dweight, "dbias": dbias}
    return rt.run(HstuLmsdBackward, (dy, x, u, weight, bias, mean, rstd, mask), config, stream)
