"""HSTU LayerNorm-Multiply-SiLU-Dropout forward and backward, declared: arguments, key,
outputs, functional calls."""
from __future__ import annotations

import torch

from ...contract import row_spec, vector_spec
from ...opspec import REQUIRED, OpSpec, Option, Output, Tensor, like
from ...validate import eps_value, flag_value, sm_count
from .plan import HstuLmsdBackward, HstuLmsdForward, dropout_p32

BF16, FP32 = torch.bfloat16, torch.float32


def _dropout_key(name, p) -> float:
    return dropout_p32(p)


def _segment_flags(default) -> tuple[Option, ...]:
    return tuple(Option(name, default, flag_value, "bool")
                 for name in ("apply_u_silu", "concat_u", "concat_x"))


def _rng_flags(facts, v) -> tuple:
    """seed and offset given as tensors are read by the kernel (graph-safe): another plan."""
    return (("rng_tensors", isinstance(v["seed"], torch.Tensor)
             or isinstance(v["offset"], torch.Tensor)),)


def _rows(v) -> int:
    return v["x"].shape[0]


def _width(v) -> int:
    return v["x"].shape[-1]


FORWARD = OpSpec(
    "hstu_lmsd_forward", HstuLmsdForward,
    (Tensor("x", row_spec), Tensor("u", row_spec), Tensor("weight", vector_spec),
     Tensor("bias", vector_spec)),
    (Option("eps", 1e-6, lambda name, v: eps_value(v), "float"),
     Option("dropout_ratio", 0.0, _dropout_key, "float"),
     Option("seed", 0, schema="Tensor?"), Option("offset", 0, schema="Tensor?"),
     *_segment_flags(True)),
    (Output("y", lambda v: (_rows(v), (1 + bool(v["concat_u"]) + bool(v["concat_x"]))
                            * _width(v)), BF16),
     Output("mean", lambda v: (_rows(v),), FP32), Output("rstd", lambda v: (_rows(v),), FP32),
     Output("mask", lambda v: (_rows(v), _width(v)), torch.int8,
            when=lambda v: dropout_p32(v["dropout_ratio"]) > 0)),
    extra_flags=_rng_flags,
    doc="""HSTU fused LayerNorm, affine, multiply by SiLU(u) and inverted dropout.

    Returns ``(y, mean, rstd, mask)``: y BF16 [N, S*D] holds [drop(a) if concat_u, drop(x) if
    concat_x, drop(l * a)]; mask int8 [N, D] (None when dropout_ratio is 0) has bit 0 for l*a,
    bit 1 for x, bit 2 for a. seed and offset are ints or one-element int64 tensors (graph-safe).

    >>> y, mean, rstd, mask = graphrt.ops.hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.1,
    ...                                                     seed=1234, offset=0)  # doctest: +SKIP
    """)


def _backward_programs(facts, v) -> tuple:
    """The programs whose FP32 dweight/dbias partials are summed in a fixed order."""
    programs = 0
    if facts[1] == "triton":
        from .kernels import backward_programs
        x = v["x"]
        d = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
        programs = backward_programs(max(d, 1), sm_count(facts[0]))
    return (("programs", programs),)


BACKWARD = OpSpec(
    "hstu_lmsd_backward", HstuLmsdBackward,
    (Tensor("dy", row_spec), Tensor("x", row_spec), Tensor("u", row_spec),
     Tensor("weight", vector_spec), Tensor("bias", vector_spec), Tensor("mean"), Tensor("rstd"),
     Tensor("mask", schema="Tensor?")),
    (Option("dropout_ratio", REQUIRED, _dropout_key, "float"), *_segment_flags(REQUIRED),
     Option("compute_dweight", True, flag_value, "bool")),
    (Output("dx", **like("x", BF16)), Output("du", **like("u", BF16)),
     Output("dweight", lambda v: (_width(v),), BF16, when=lambda v: v["compute_dweight"]),
     Output("dbias", lambda v: (_width(v),), BF16)),
    extra_flags=_backward_programs,
    doc="""Backward of hstu_lmsd_forward. Returns ``(dx, du, dweight, dbias)``; dweight is None
    when ``compute_dweight`` is False. The flags must be the forward's.

    >>> dx, du, dw, db = graphrt.ops.hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask,
    ...     dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)  # doctest: +SKIP
    """)

hstu_lmsd_forward = FORWARD.functional
hstu_lmsd_backward = BACKWARD.functional
