"""Every functional op as a PyTorch operator, ``torch.ops.graphrt.<name>`` (the names of
``graphrt.ops``), with a fake implementation so that torch.compile and other tracers see its
output shapes without running it.

The operators take the functional calls' inputs and configuration (outputs are always
allocated) and return their outputs as a list of tensors: an output the call leaves out
(``h_new`` without a residual, ``mask`` at dropout 0, ``dweight`` when not computed) is an
empty tensor. They are registered with define/impl, not ``torch.library.custom_op``, whose
safety layers cost tens of microseconds per call.

>>> y, rstd, _ = torch.ops.graphrt.rmsnorm_forward(x, w, 1e-6, None)      # doctest: +SKIP
"""
from __future__ import annotations

import torch

from .adamw import adamw_step
from .grouped_gemm import grouped_gemm_wgrad
from .hstu import hstu_lmsd_backward, hstu_lmsd_forward
from .mhc import mhc_projection_backward
from .proj_rope import gemm_proj_rope_mxfp8
from .proj_rope.reference import FP8
from .rmsnorm import rmsnorm_backward, rmsnorm_forward

_lib = torch.library.Library("graphrt", "FRAGMENT")

SCHEMAS = {
    "rmsnorm_forward": "(Tensor x, Tensor w, float eps=1e-06, Tensor? residual=None) -> Tensor[]",
    "rmsnorm_backward": "(Tensor g, Tensor x, Tensor w, Tensor rstd, Tensor? g_residual=None) "
                        "-> Tensor[]",
    "mhc_projection_backward": "(Tensor x, Tensor weight, Tensor grad_proj, Tensor grad_r, "
                               "Tensor r, bool allow_tf32=False) -> Tensor[]",
    "hstu_lmsd_forward": "(Tensor x, Tensor u, Tensor weight, Tensor bias, float eps=1e-06, "
                         "float dropout_ratio=0.0, Tensor? seed=None, Tensor? offset=None, "
                         "bool apply_u_silu=True, bool concat_u=True, bool concat_x=True) "
                         "-> Tensor[]",
    "hstu_lmsd_backward": "(Tensor dy, Tensor x, Tensor u, Tensor weight, Tensor bias, "
                          "Tensor mean, Tensor rstd, Tensor? mask, float dropout_ratio, "
                          "bool apply_u_silu, bool concat_u, bool concat_x, "
                          "bool compute_dweight=True) -> Tensor[]",
    "grouped_gemm_wgrad": "(Tensor a, Tensor b, Tensor offsets, ScalarType? wgrad_dtype=None, "
                          "str input_order='tensor2d') -> Tensor",
    "gemm_proj_rope_mxfp8": "(Tensor x, Tensor w, Tensor cos, Tensor sin, Tensor? x_scale=None, "
                            "Tensor? w_scale=None, bool w_out_in=True, int qk_nope_dim=128, "
                            "int qk_rope_dim=64) -> Tensor[]",
    "adamw_step": "(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
                  "Tensor(c!)[] exp_avg_sqs, Tensor[] steps, float lr, float beta1, float beta2, "
                  "float eps, float weight_decay, bool maximize=False) -> ()",
}


def _none_as_empty(t, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0) if t is None else t


def _rmsnorm_forward(x, w, eps=1e-6, residual=None):
    out = rmsnorm_forward(x, w, eps=eps, residual=residual)
    return [out[0], out[1], out[2] if residual is not None else x.new_empty(0)]


def _rmsnorm_backward(g, x, w, rstd, g_residual=None):
    return list(rmsnorm_backward(g, x, w, rstd, g_residual=g_residual))


def _mhc_projection_backward(x, weight, grad_proj, grad_r, r, allow_tf32=False):
    return list(mhc_projection_backward(x, weight, grad_proj, grad_r, r, allow_tf32=allow_tf32))


def _hstu_lmsd_forward(x, u, weight, bias, eps=1e-6, dropout_ratio=0.0, seed=None, offset=None,
                       apply_u_silu=True, concat_u=True, concat_x=True):
    y, mean, rstd, mask = hstu_lmsd_forward(
        x, u, weight, bias, eps=eps, dropout_ratio=dropout_ratio,
        seed=0 if seed is None else seed, offset=0 if offset is None else offset,
        apply_u_silu=apply_u_silu, concat_u=concat_u, concat_x=concat_x)
    return [y, mean, rstd, x.new_empty(0, dtype=torch.int8) if mask is None else mask]


def _hstu_lmsd_backward(dy, x, u, weight, bias, mean, rstd, mask, dropout_ratio, apply_u_silu,
                        concat_u, concat_x, compute_dweight=True):
    dx, du, dweight, dbias = hstu_lmsd_backward(
        dy, x, u, weight, bias, mean, rstd, mask, dropout_ratio=dropout_ratio,
        apply_u_silu=apply_u_silu, concat_u=concat_u, concat_x=concat_x,
        compute_dweight=compute_dweight)
    return [dx, du, _none_as_empty(dweight, weight), dbias]


def _grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=None, input_order="tensor2d"):
    return grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=wgrad_dtype or torch.bfloat16,
                              input_order=input_order)[0]


def _gemm_proj_rope_mxfp8(x, w, cos, sin, x_scale=None, w_scale=None, w_out_in=True,
                          qk_nope_dim=128, qk_rope_dim=64):
    return list(gemm_proj_rope_mxfp8(x, w, cos, sin, x_scale=x_scale, w_scale=w_scale,
                                     w_out_in=w_out_in, qk_nope_dim=qk_nope_dim,
                                     qk_rope_dim=qk_rope_dim))


def _adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
                maximize=False):
    adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, betas=(beta1, beta2), eps=eps,
               weight_decay=weight_decay, maximize=maximize)


# -- fake implementations: the outputs' shapes and dtypes, from the inputs' ----------------------
def _fake_rmsnorm_forward(x, w, eps=1e-6, residual=None):
    h = torch.empty_like(x) if residual is not None else x.new_empty(0)
    return [torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32), h]


def _fake_rmsnorm_backward(g, x, w, rstd, g_residual=None):
    return [torch.empty_like(x), w.new_empty(w.shape, dtype=torch.float32)]


def _fake_mhc_projection_backward(x, weight, grad_proj, grad_r, r, allow_tf32=False):
    return [torch.empty_like(x), weight.new_empty(weight.shape, dtype=torch.float32)]


def _fake_hstu_lmsd_forward(x, u, weight, bias, eps=1e-6, dropout_ratio=0.0, seed=None,
                            offset=None, apply_u_silu=True, concat_u=True, concat_x=True):
    n, d = x.shape
    segments = 1 + int(concat_u) + int(concat_x)
    mask = x.new_empty((n, d) if dropout_ratio > 0 else (0,), dtype=torch.int8)
    return [x.new_empty(n, segments * d), x.new_empty(n, dtype=torch.float32),
            x.new_empty(n, dtype=torch.float32), mask]


def _fake_hstu_lmsd_backward(dy, x, u, weight, bias, mean, rstd, mask, dropout_ratio,
                             apply_u_silu, concat_u, concat_x, compute_dweight=True):
    dweight = torch.empty_like(weight) if compute_dweight else weight.new_empty(0)
    return [torch.empty_like(x), torch.empty_like(u), dweight, torch.empty_like(bias)]


def _fake_grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=None, input_order="tensor2d"):
    return a.new_empty(offsets.shape[0], a.shape[0], b.shape[1],
                       dtype=wgrad_dtype or torch.bfloat16)


def _fake_gemm_proj_rope_mxfp8(x, w, cos, sin, x_scale=None, w_scale=None, w_out_in=True,
                               qk_nope_dim=128, qk_rope_dim=64):
    t, d = x.shape[0], qk_nope_dim + qk_rope_dim
    heads = (w.shape[0] if w_out_in else w.shape[1]) // d
    return [x.new_empty(t, heads, d, dtype=FP8), x.new_empty(t, heads, d // 32, dtype=torch.uint8),
            x.new_empty(t, heads, d, dtype=FP8), x.new_empty(t // 32, heads, d, dtype=torch.uint8)]


def _fake_adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps,
                     weight_decay, maximize=False):
    return None


for _name, _schema in SCHEMAS.items():
    _lib.define(_name + _schema)
    _lib.impl(_name, globals()[f"_{_name}"], "CompositeExplicitAutograd")
    torch.library.register_fake(f"graphrt::{_name}", globals()[f"_fake_{_name}"], lib=_lib)
