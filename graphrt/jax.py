"""graphrt's ops on JAX arrays, eagerly and inside ``jax.jit``.

Eagerly, arrays cross by DLPack both ways without a copy: each call views its JAX inputs as torch
tensors, runs the torch functional call (the same checks, ``ContractError``s and kernels), and
returns fresh C-contiguous JAX arrays that view the outputs. On a GPU the DLPack stream handshake
orders the work: the kernels' stream waits for JAX's producers of the inputs, and JAX's consumers
of the outputs wait for the kernels; nothing synchronizes the whole device.

Inside ``jax.jit`` (and ``lax.scan``) the same calls become XLA custom calls through
``jax.experimental.buffer_callback``: XLA allocates the outputs, and at run time the callback
views XLA's buffers as torch tensors (DLPack, no copy) and runs the torch call into them on XLA's
own stream. It was chosen over an XLA FFI handler of our own because the kernels are Triton's,
launched from Python, and it keeps one code path with the eager calls. Output shapes follow from
the static input shapes, and trace-time checks raise ``ContractError``; checks that need values
(the offsets) run when the call runs, where an error surfaces as a ``JaxRuntimeError`` that
carries graphrt's message (on a GPU JAX dispatches asynchronously: the error comes when the
result is waited on or used).

JAX arrays are C-contiguous, so each op accepts the layouts that spells: the grouped wgrad's A
K-major ([hidden, tokens]) and B N-major ([tokens, intermediate]), the projection's W as
[out, in] (``w_out_in=True``).

>>> (wgrad,) = graphrt.jax.grouped_gemm_wgrad(a, b, offsets)               # doctest: +SKIP
"""
from __future__ import annotations

import functools

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
    if not isinstance(x, jax.Array):
        raise ContractError(f"{name}: expected a jax.Array, got {type(x).__name__}")
    return torch.from_dlpack(x)


def _arrays(result) -> tuple:
    return tuple(None if t is None else jax.dlpack.from_dlpack(t) for t in result)


_DLPACK_CUDA = 2


def _traced(*arrays) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in arrays)


def _buffer_tensor(buffer):
    """A torch view of an XLA buffer handed to a buffer_callback."""
    return None if buffer is None else torch.from_dlpack(buffer)


def _in_jit(outputs, call, *arrays) -> tuple:
    """``call(output tensors, *input tensors)`` as an XLA custom call: ``outputs`` are the
    jax.ShapeDtypeStructs of the results, ``arrays`` the JAX inputs (None for an absent one)."""
    from jax.experimental.buffer_callback import buffer_callback

    for x in arrays:
        if x is not None and not isinstance(x, (jax.Array, jax.core.Tracer)):
            raise ContractError(f"expected jax arrays, got {type(x).__name__}")

    def run(outs, ins):
        call([_buffer_tensor(b) for b in outs], *(_buffer_tensor(b) for b in ins))

    def callback(ctx, outs, *ins):
        kind, index = outs[0].__dlpack_device__()
        if int(kind) == _DLPACK_CUDA:   # on XLA's stream: its producers and consumers stay in order
            device = torch.device("cuda", index)
            with torch.cuda.device(device), torch.cuda.stream(
                    torch.cuda.ExternalStream(ctx.stream, device=device)):
                run(outs, ins)
        else:
            run(outs, ins)

    return tuple(buffer_callback(callback, list(outputs))(*arrays))


def _shape_struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _require_rank(name: str, x, rank: int) -> None:
    if x.ndim != rank:
        raise ContractError(f"{name}: expected {rank} dims, got shape {tuple(x.shape)}")


def _torch_dtype(name: str, dtype) -> torch.dtype:
    try:
        return _DTYPES[jnp.dtype(dtype)]
    except (KeyError, TypeError):
        raise ContractError(f"{name}: expected bfloat16, float16 or float32, got {dtype!r}") from None


def _require_pointer_array(wgrad_ptrs) -> None:
    """wgrad_ptrs must be an int64 JAX array (x64 mode spells one)."""
    if not isinstance(wgrad_ptrs, (jax.Array, jax.core.Tracer)):
        raise ContractError(f"wgrad_ptrs: expected a jax.Array of int64 addresses, got "
                            f"{type(wgrad_ptrs).__name__}")
    if jnp.dtype(wgrad_ptrs.dtype) != jnp.int64:
        raise ContractError(f"wgrad_ptrs: expected int64 addresses, got {wgrad_ptrs.dtype} (JAX "
                            f"makes int64 arrays in x64 mode: jax.config.update("
                            f"'jax_enable_x64', True))")


def _completion_token(done: torch.Tensor):
    """A JAX scalar computed after the torch work on ``done``'s stream (its DLPack import orders
    JAX after it): waiting on it waits for that work."""
    return jax.dlpack.from_dlpack(done) + 0


def grouped_gemm_wgrad(a, b, offsets, *, wgrad_dtype=jnp.bfloat16, input_order: str = "tensor2d",
                       check_offsets: bool = True, wgrad_ptrs=None) -> tuple:
    """Weight gradients of all MoE experts: ``(wgrad,)``, wgrad [E, hidden, intermediate].

    a: BF16 [hidden, tokens_sum] (K-major), b: BF16 [tokens_sum, intermediate] (N-major),
    offsets: int32 [E] cumulative ends (read on the host unless ``check_offsets=False``; the
    kernel itself never reads outside a and b). Block-scaled FP8 inputs are torch-only for now:
    they raise.

    Discrete outputs: ``wgrad_ptrs``, an int64 [E] array (JAX's x64 mode) of the device addresses
    of E C-contiguous [hidden, intermediate] buffers of ``wgrad_dtype`` that the caller owns and
    keeps alive. The call overwrites them and returns ``(token,)``, an int32 scalar computed after
    the kernel: wait on it (``token.block_until_ready()``, or make the readers depend on it under
    ``jax.jit``) before reading the buffers.

    >>> (token,) = graphrt.jax.grouped_gemm_wgrad(a, b, offsets, wgrad_ptrs=ptrs)  # doctest: +SKIP
    """
    discrete = wgrad_ptrs is not None
    if discrete:
        _require_pointer_array(wgrad_ptrs)
    if _traced(a, b, offsets, wgrad_ptrs):
        for name, x, rank in (("a", a, 2), ("b", b, 2), ("offsets", offsets, 1)):
            _require_rank(name, x, rank)
        if jnp.dtype(a.dtype) != jnp.bfloat16 or jnp.dtype(b.dtype) != jnp.bfloat16:
            raise ContractError(f"a, b: expected bfloat16 arrays, got {a.dtype} and {b.dtype}")
        if a.shape[1] != b.shape[0]:
            raise ContractError(f"b: expected tokens_sum={a.shape[1]} rows like a's columns, got "
                                f"shape {tuple(b.shape)}")
        out_dtype = _torch_dtype("wgrad_dtype", wgrad_dtype)
        if discrete:
            _require_rank("wgrad_ptrs", wgrad_ptrs, 1)

            def run_discrete(outs, ta, tb, toff, tptrs):
                _wgrad(ta, tb, toff, wgrad_ptrs=tptrs, output_mode="discrete",
                       wgrad_dtype=out_dtype, input_order=input_order,
                       check_offsets=check_offsets)
                outs[0].zero_()   # on XLA's stream, after the kernel: the completion token
            return _in_jit([_shape_struct((), jnp.int32)], run_discrete, a, b, offsets,
                           wgrad_ptrs)
        out = _shape_struct((offsets.shape[0], a.shape[0], b.shape[1]), wgrad_dtype)
        return _in_jit([out], lambda outs, ta, tb, toff: _wgrad(
            ta, tb, toff, wgrad=outs[0], wgrad_dtype=out_dtype, input_order=input_order,
            check_offsets=check_offsets), a, b, offsets)
    ta, tb = _tensor("a", a), _tensor("b", b)
    if ta.dtype != torch.bfloat16 or tb.dtype != torch.bfloat16:
        raise ContractError(f"a, b: expected bfloat16 arrays from JAX (block-scaled FP8 inputs "
                            f"cannot be passed from JAX yet), got {ta.dtype} and {tb.dtype}")
    options = dict(wgrad_dtype=_torch_dtype("wgrad_dtype", wgrad_dtype), input_order=input_order,
                   check_offsets=check_offsets)
    if discrete:
        _wgrad(ta, tb, _tensor("offsets", offsets), wgrad_ptrs=_tensor("wgrad_ptrs", wgrad_ptrs),
               output_mode="discrete", **options)
        return (_completion_token(torch.zeros((), dtype=torch.int32, device=ta.device)),)
    return _arrays(_wgrad(ta, tb, _tensor("offsets", offsets), **options))


def gemm_proj_rope_mxfp8(x, w, cos, sin, *, x_scale=None, w_scale=None, w_out_in: bool = True,
                         qk_nope_dim: int = 128, qk_rope_dim: int = 64) -> tuple:
    """Projection GEMM + RoPE + dual-direction MXFP8: ``(out_fp8_row, out_scales_row,
    out_fp8_col, out_scales_col)``. x and w BF16, or float8_e4m3fn codes with uint8 E8M0 scales
    (x_scale, w_scale); W as [out, in]."""
    if w_out_in is not True:
        raise UnsupportedError("w_out_in: from JAX W is [out, in] (w_out_in=True); the [in, out] "
                               "view has no row-major JAX equivalent: pass w.T materialized")
    if _traced(x, w, cos, sin, x_scale, w_scale):
        _require_rank("x", x, 2)
        _require_rank("w", w, 2)
        d = qk_nope_dim + qk_rope_dim
        t, heads = x.shape[0], w.shape[0] // d
        outs = [_shape_struct((t, heads, d), jnp.float8_e4m3fn),
                _shape_struct((t, heads, d // 32), jnp.uint8),
                _shape_struct((t, heads, d), jnp.float8_e4m3fn),
                _shape_struct((t // 32, heads, d), jnp.uint8)]

        def run(o, tx, tw, tcos, tsin, txs, tws):
            _proj(tx, tw, tcos, tsin, x_scale=txs, w_scale=tws, w_out_in=True,
                  qk_nope_dim=qk_nope_dim, qk_rope_dim=qk_rope_dim, out_fp8_row=o[0],
                  out_scales_row=o[1], out_fp8_col=o[2], out_scales_col=o[3])
        return _in_jit(outs, run, x, w, cos, sin, x_scale, w_scale)
    return _arrays(_proj(_tensor("x", x), _tensor("w", w), _tensor("cos", cos),
                         _tensor("sin", sin), x_scale=_tensor("x_scale", x_scale, False),
                         w_scale=_tensor("w_scale", w_scale, False), w_out_in=True,
                         qk_nope_dim=qk_nope_dim, qk_rope_dim=qk_rope_dim))


def rmsnorm_forward(x, w, *, eps: float = 1e-6, residual=None) -> tuple:
    """``(y, rstd)``, or ``(y, rstd, h_new)`` with a residual; x BF16 [..., H], w FP32 or BF16."""
    if _traced(x, w, residual):
        outs = [_shape_struct(x.shape, x.dtype), _shape_struct(x.shape[:-1], jnp.float32)]
        if residual is not None:
            outs.append(_shape_struct(x.shape, x.dtype))

        def run(o, tx, tw, tres):
            _rms_fwd(tx, tw, eps=eps, residual=tres, y=o[0], rstd=o[1],
                     h_new=o[2] if tres is not None else None)
        return _in_jit(outs, run, x, w, residual)
    return _arrays(_rms_fwd(_tensor("x", x), _tensor("w", w), eps=eps,
                            residual=_tensor("residual", residual, False)))


def rmsnorm_backward(g, x, w, rstd, *, g_residual=None) -> tuple:
    """``(dx, dw)``: dw FP32, deterministic."""
    if _traced(g, x, w, rstd, g_residual):
        outs = [_shape_struct(x.shape, x.dtype), _shape_struct(w.shape, jnp.float32)]

        def run(o, tg, tx, tw, trstd, tgr):
            _rms_bwd(tg, tx, tw, trstd, g_residual=tgr, dx=o[0], dw=o[1])
        return _in_jit(outs, run, g, x, w, rstd, g_residual)
    return _arrays(_rms_bwd(_tensor("g", g), _tensor("x", x), _tensor("w", w),
                            _tensor("rstd", rstd), g_residual=_tensor("g_residual", g_residual,
                                                                      False)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x, w, eps: float = 1e-6):
    """Differentiable RMSNorm over the last dim for JAX models (Flax, Equinox): graphrt's forward
    and backward kernels through ``jax.custom_vjp``, eagerly and under ``jax.jit``. x BF16
    [..., H], w FP32 or BF16 [H]; the gradient of w comes back in w's dtype.

    >>> y = graphrt.jax.rms_norm(x, w)                                  # doctest: +SKIP
    >>> dx, dw = jax.grad(lambda x, w: rms_norm(x, w).sum(), (0, 1))(x, w)  # doctest: +SKIP
    """
    return rmsnorm_forward(x, w, eps=eps)[0]


def _rms_norm_forward(x, w, eps):
    y, rstd = rmsnorm_forward(x, w, eps=eps)
    return y, (x, w, rstd)


def _rms_norm_backward(eps, saved, g):
    x, w, rstd = saved
    dx, dw = rmsnorm_backward(g.astype(x.dtype), x, w, rstd)
    return dx, dw.astype(w.dtype)


rms_norm.defvjp(_rms_norm_forward, _rms_norm_backward)
