"""graphrt's ops on JAX arrays, eagerly (outside ``jax.jit``).

Arrays cross by DLPack both ways without a copy: each call views its JAX inputs as torch tensors,
runs the torch functional call (the same checks, ``ContractError``s and kernels), and returns
fresh C-contiguous JAX arrays that view the outputs. On a GPU the DLPack stream handshake orders
the work: the kernels' stream waits for JAX's producers of the inputs, and JAX's consumers of the
outputs wait for the kernels; nothing synchronizes the whole device.

JAX arrays are C-contiguous, so each op accepts the layouts that spells: the grouped wgrad's A
K-major ([hidden, tokens]) and B N-major ([tokens, intermediate]), the projection's W as
[out, in] (``w_out_in=True``). Inside ``jax.jit`` the arrays are tracers and these calls raise.

>>> (wgrad,) = graphrt.jax.grouped_gemm_wgrad(a, b, offsets)               # doctest: +SKIP
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .errors import ContractError, UnsupportedError
from .ops import gemm_proj_rope_mxfp8 as _proj
from .ops import grouped_gemm_wgrad as _wgrad
from .ops import rmsnorm_backward as _rms_bwd
from .ops import rmsnorm_forward as _rms_fwd

_DTYPES = {jnp.dtype(jnp.bfloat16): torch.bfloat16, jnp.dtype(jnp.float16): torch.float16,
           jnp.dtype(jnp.float32): torch.float32}


def _tensor(name: str, x, required: bool = True):
    """A torch view of JAX array ``x`` (None stays None where ``x`` is optional)."""
    if x is None and not required:
        return None
    if isinstance(x, jax.core.Tracer):
        raise UnsupportedError(f"{name}: graphrt.jax calls run eagerly; inside jax.jit the "
                               f"arrays are tracers (call it outside the jitted function)")
    if not isinstance(x, jax.Array):
        raise ContractError(f"{name}: expected a jax.Array, got {type(x).__name__}")
    return torch.from_dlpack(x)


def _arrays(result) -> tuple:
    return tuple(None if t is None else jax.dlpack.from_dlpack(t) for t in result)


def _torch_dtype(name: str, dtype) -> torch.dtype:
    try:
        return _DTYPES[jnp.dtype(dtype)]
    except (KeyError, TypeError):
        raise ContractError(f"{name}: expected bfloat16, float16 or float32, got {dtype!r}") from None


def grouped_gemm_wgrad(a, b, offsets, *, wgrad_dtype=jnp.bfloat16, input_order: str = "tensor2d",
                       check_offsets: bool = True) -> tuple:
    """Weight gradients of all MoE experts: ``(wgrad,)``, wgrad [E, hidden, intermediate].

    a: BF16 [hidden, tokens_sum] (K-major), b: BF16 [tokens_sum, intermediate] (N-major),
    offsets: int32 [E] cumulative ends (read on the host unless ``check_offsets=False``; the
    kernel itself never reads outside a and b). Discrete output pointers and block-scaled FP8
    inputs are torch-only for now: they raise.
    """
    ta, tb = _tensor("a", a), _tensor("b", b)
    if ta.dtype != torch.bfloat16 or tb.dtype != torch.bfloat16:
        raise ContractError(f"a, b: expected bfloat16 arrays from JAX (block-scaled FP8 inputs "
                            f"cannot be passed from JAX yet), got {ta.dtype} and {tb.dtype}")
    return _arrays(_wgrad(ta, tb, _tensor("offsets", offsets),
                          wgrad_dtype=_torch_dtype("wgrad_dtype", wgrad_dtype),
                          input_order=input_order, check_offsets=check_offsets))


def gemm_proj_rope_mxfp8(x, w, cos, sin, *, x_scale=None, w_scale=None, w_out_in: bool = True,
                         qk_nope_dim: int = 128, qk_rope_dim: int = 64) -> tuple:
    """Projection GEMM + RoPE + dual-direction MXFP8: ``(out_fp8_row, out_scales_row,
    out_fp8_col, out_scales_col)``. x and w BF16, or float8_e4m3fn codes with uint8 E8M0 scales
    (x_scale, w_scale); W as [out, in]."""
    if w_out_in is not True:
        raise UnsupportedError("w_out_in: from JAX W is [out, in] (w_out_in=True); the [in, out] "
                               "view has no row-major JAX equivalent: pass w.T materialized")
    return _arrays(_proj(_tensor("x", x), _tensor("w", w), _tensor("cos", cos),
                         _tensor("sin", sin), x_scale=_tensor("x_scale", x_scale, False),
                         w_scale=_tensor("w_scale", w_scale, False), w_out_in=True,
                         qk_nope_dim=qk_nope_dim, qk_rope_dim=qk_rope_dim))


def rmsnorm_forward(x, w, *, eps: float = 1e-6, residual=None) -> tuple:
    """``(y, rstd)``, or ``(y, rstd, h_new)`` with a residual; x BF16 [..., H], w FP32 or BF16."""
    return _arrays(_rms_fwd(_tensor("x", x), _tensor("w", w), eps=eps,
                            residual=_tensor("residual", residual, False)))


def rmsnorm_backward(g, x, w, rstd, *, g_residual=None) -> tuple:
    """``(dx, dw)``: dw FP32, deterministic."""
    return _arrays(_rms_bwd(_tensor("g", g), _tensor("x", x), _tensor("w", w),
                            _tensor("rstd", rstd), g_residual=_tensor("g_residual", g_residual,
                                                                      False)))
