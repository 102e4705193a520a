"""graphrt.jax: the ops on JAX arrays, eagerly and inside jax.jit and lax.scan, bitwise equal to
the torch calls on the same data, with the same errors."""
import itertools

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import graphrt  # noqa: E402
import graphrt.jax as gjax  # noqa: E402
from graphrt import ContractError, UnsupportedError  # noqa: E402

from .helpers import env, rel_l2  # noqa: E402


def _bf16(rng, *shape, scale=1.0):
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(jnp.bfloat16)


def _same(jax_out, torch_out):
    got = torch.from_dlpack(jax_out)
    assert got.dtype == torch_out.dtype and torch.equal(got, torch_out)


def test_grouped_wgrad_from_jax_equals_torch_and_fp64():
    rng = np.random.default_rng(0)
    counts = [5, 0, 9, 3]
    offsets = jnp.asarray(list(itertools.accumulate(counts)), dtype=jnp.int32)
    a, b = _bf16(rng, 16, sum(counts)), _bf16(rng, sum(counts), 24)
    (w,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
    assert isinstance(w, jax.Array) and w.shape == (4, 16, 24) and w.dtype == jnp.float32
    (want,) = graphrt.ops.grouped_gemm_wgrad(torch.from_dlpack(a), torch.from_dlpack(b),
                                             torch.from_dlpack(offsets), wgrad_dtype=torch.float32)
    _same(w, want)
    ta, tb = torch.from_dlpack(a).double(), torch.from_dlpack(b).double()
    begin = 0
    for e, n in enumerate(counts):
        ref = ta[:, begin:begin + n] @ tb[begin:begin + n]
        assert torch.allclose(torch.from_dlpack(w)[e].double(), ref, atol=1e-4)
        begin += n


@pytest.mark.parametrize("jit", [False, True])
def test_discrete_output_pointers_from_jax(jit):
    """wgrad_ptrs (int64, x64 mode) into buffers the caller owns, eagerly and under jax.jit: the
    call returns a completion token, and after it each expert's poisoned buffer holds its FP64
    reference (zeros for the empty expert)."""
    rng = np.random.default_rng(6)
    counts = [5, 0, 9, 3]
    offsets = jnp.asarray(list(itertools.accumulate(counts)), dtype=jnp.int32)
    a, b = _bf16(rng, 16, sum(counts)), _bf16(rng, sum(counts), 24)
    device = "cuda" if next(iter(a.devices())).platform == "gpu" else "cpu"
    owned = torch.full((4, 16, 24), float("nan"), device=device)   # the caller's FP32 buffers

    def call(a, b, offsets, ptrs):
        return gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_ptrs=ptrs, wgrad_dtype=jnp.float32)
    with jax.enable_x64(True), env(GRAPHRT_BACKEND="triton"):   # the reference needs a stack
        ptrs = jnp.asarray(np.array([owned[e].data_ptr() for e in range(4)], np.int64))
        (token,) = (jax.jit(call) if jit else call)(a, b, offsets, ptrs)
        token.block_until_ready()
    assert isinstance(token, jax.Array) and token.shape == () and token.dtype == jnp.int32
    ta, tb = torch.from_dlpack(a).double(), torch.from_dlpack(b).double()
    begin = 0
    for e, n in enumerate(counts):
        ref = ta[:, begin:begin + n] @ tb[begin:begin + n]
        assert torch.allclose(owned[e].double().cpu(), ref.cpu(), atol=1e-4), e
        begin += n


def test_proj_and_rmsnorm_from_jax_equal_torch():
    rng = np.random.default_rng(1)
    x, w = _bf16(rng, 32, 64), _bf16(rng, 2 * 192, 64, scale=0.125)
    cos, sin = _bf16(rng, 32, 64), _bf16(rng, 32, 64)
    got = gjax.gemm_proj_rope_mxfp8(x, w, cos, sin)
    want = graphrt.ops.gemm_proj_rope_mxfp8(*(torch.from_dlpack(t) for t in (x, w, cos, sin)))
    for g, t in zip(got, want):
        _same(g, t)
    h, nw = _bf16(rng, 8, 64), jnp.asarray(1 + 0.1 * rng.standard_normal(64), dtype=jnp.float32)
    y, rstd = gjax.rmsnorm_forward(h, nw, eps=1e-5)
    ty, trstd = graphrt.ops.rmsnorm_forward(torch.from_dlpack(h), torch.from_dlpack(nw), eps=1e-5)
    _same(y, ty)
    _same(rstd, trstd)
    g = _bf16(rng, 8, 64)
    dx, dw = gjax.rmsnorm_backward(g, h, nw, rstd)
    tdx, tdw = graphrt.ops.rmsnorm_backward(*(torch.from_dlpack(t) for t in (g, h, nw, rstd)))
    _same(dx, tdx)
    _same(dw, tdw)
    assert rel_l2(torch.from_dlpack(dw), tdw) == 0.0


def test_jax_errors_are_named():
    rng = np.random.default_rng(2)
    a, b = _bf16(rng, 8, 6), _bf16(rng, 6, 8)
    offsets = jnp.asarray([6], dtype=jnp.int32)
    with pytest.raises(ContractError, match="a, b: expected bfloat16"):
        gjax.grouped_gemm_wgrad(a.astype(jnp.float32), b, offsets)
    with pytest.raises(ContractError, match="offsets: the last end must equal tokens_sum=6"):
        gjax.grouped_gemm_wgrad(a, b, jnp.asarray([4], dtype=jnp.int32))
    with pytest.raises(ContractError, match="a: expected a jax.Array"):
        gjax.grouped_gemm_wgrad(np.zeros((8, 6)), b, offsets)
    with pytest.raises(ContractError, match="wgrad_dtype"):
        gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.int8)
    with pytest.raises(ContractError, match="wgrad_ptrs: expected int64 addresses.*x64"):
        gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_ptrs=jnp.asarray([64], dtype=jnp.int32))
    with pytest.raises(ContractError, match="wgrad_ptrs: expected a jax.Array"):
        gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_ptrs=np.array([64], np.int64))
    x = _bf16(rng, 32, 64)
    with pytest.raises(UnsupportedError, match="w_out_in"):
        gjax.gemm_proj_rope_mxfp8(x, _bf16(rng, 64, 384), x, x, w_out_in=False)
    with pytest.raises(ContractError, match="a, b: expected bfloat16"):   # at trace time
        jax.jit(lambda a, b, o: gjax.grouped_gemm_wgrad(a, b, o))(a.astype(jnp.float32), b, offsets)
    with pytest.raises(Exception, match="offsets: the last end must equal tokens_sum=6"):
        jax.block_until_ready(jax.jit(lambda a, b, o: gjax.grouped_gemm_wgrad(a, b, o))(
            a, b, jnp.asarray([4], dtype=jnp.int32)))   # a value check: when the call runs,
        #                                                   seen once the result is waited on


def test_jit_and_scan_equal_the_eager_calls_with_offsets_changing():
    """Under jax.jit each op equals its eager call bitwise; inside lax.scan the grouped wgrad
    takes new offsets every iteration (one trace, one plan)."""
    rng = np.random.default_rng(3)
    a, b = _bf16(rng, 16, 20), _bf16(rng, 20, 24)
    routings = [[5, 0, 9, 6], [20, 0, 0, 0], [1, 2, 3, 14]]
    stacked = jnp.asarray([list(itertools.accumulate(c)) for c in routings], dtype=jnp.int32)
    wgrad = jax.jit(lambda a, b, o: gjax.grouped_gemm_wgrad(a, b, o, wgrad_dtype=jnp.float32))
    for offsets in stacked:
        (got,) = wgrad(a, b, offsets)
        (want,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
        _same(got, torch.from_dlpack(want))

    def body(carry, offsets):
        (w,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
        return carry + w.sum(), w
    total, per_step = jax.jit(lambda o: jax.lax.scan(body, jnp.float32(0), o))(stacked)
    for i, offsets in enumerate(stacked):
        (want,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
        _same(per_step[i], torch.from_dlpack(want))

    x, w = _bf16(rng, 32, 64), _bf16(rng, 2 * 192, 64, scale=0.125)
    cos, sin = _bf16(rng, 32, 64), _bf16(rng, 32, 64)
    got = jax.jit(gjax.gemm_proj_rope_mxfp8)(x, w, cos, sin)
    for g, t in zip(got, gjax.gemm_proj_rope_mxfp8(x, w, cos, sin)):
        _same(g, torch.from_dlpack(t))
    h, nw = _bf16(rng, 8, 64), jnp.asarray(1 + 0.1 * rng.standard_normal(64), dtype=jnp.float32)
    res = _bf16(rng, 8, 64)
    for jitted, eager in ((jax.jit(lambda h, nw: gjax.rmsnorm_forward(h, nw, eps=1e-5)),
                           gjax.rmsnorm_forward(h, nw, eps=1e-5)),
                          (jax.jit(lambda h, nw, r: gjax.rmsnorm_forward(h, nw, residual=r)),
                           gjax.rmsnorm_forward(h, nw, residual=res))):
        args = (h, nw) if len(eager) == 2 else (h, nw, res)
        for g, t in zip(jitted(*args), eager):
            _same(g, torch.from_dlpack(t))
    y, rstd = gjax.rmsnorm_forward(h, nw)
    g = _bf16(rng, 8, 64)
    for got_t, want_t in zip(jax.jit(gjax.rmsnorm_backward)(g, h, nw, rstd),
                             gjax.rmsnorm_backward(g, h, nw, rstd)):
        _same(got_t, torch.from_dlpack(want_t))


@pytest.mark.gpu
def test_gpu_jit_runs_on_xlas_stream_and_equals_eager():
    """On the GPU (the image's jax with CUDA): the jitted grouped wgrad and RMSNorm, inside
    lax.scan with new offsets each iteration, equal the eager calls bitwise."""
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    rng = np.random.default_rng(4)
    a, b = _bf16(rng, 256, 1024), _bf16(rng, 1024, 128)
    stacked = jnp.asarray([[256, 256, 768, 1024], [0, 512, 512, 1024]], dtype=jnp.int32)

    def body(carry, offsets):
        (w,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
        return carry, w
    _, per_step = jax.jit(lambda o: jax.lax.scan(body, 0, o))(stacked)
    for i, offsets in enumerate(stacked):
        (want,) = gjax.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=jnp.float32)
        _same(per_step[i], torch.from_dlpack(want))
    h, nw = _bf16(rng, 512, 1024), jnp.asarray(1 + 0.1 * rng.standard_normal(1024), dtype=jnp.float32)
    for g, t in zip(jax.jit(gjax.rmsnorm_forward)(h, nw), gjax.rmsnorm_forward(h, nw)):
        _same(g, torch.from_dlpack(t))


def test_rms_norm_custom_vjp_matches_jnp_gradients():
    """jax.grad through graphrt.jax.rms_norm (eager and jitted) against the same norm written in
    jnp (FP32 math), on inputs scaled far from 1 (rstd about 1/30)."""
    rng = np.random.default_rng(5)
    x = _bf16(rng, 16, 128, scale=30.0)
    w = jnp.asarray(1 + 0.1 * rng.standard_normal(128), dtype=jnp.float32)
    target = jnp.asarray(rng.standard_normal((16, 128)), dtype=jnp.float32)

    def reference(x, w):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * w
        return jnp.sum(y * target)

    def ours(x, w):
        return jnp.sum(gjax.rms_norm(x, w).astype(jnp.float32) * target)

    want = jax.grad(reference, (0, 1))(x, w)
    for grad in (jax.grad(ours, (0, 1)), jax.jit(jax.grad(ours, (0, 1)))):
        dx, dw = grad(x, w)
        assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
        assert rel_l2(torch.from_dlpack(dx).float(), torch.from_dlpack(want[0]).float()) < 1e-2
        assert rel_l2(torch.from_dlpack(dw), torch.from_dlpack(want[1])) < 1e-2


def test_bench_against_xla_checks_agreement_and_times_every_impl():
    from graphrt.bench import jax_ops
    rows = jax_ops.run(progress=lambda *_: None, small=True)
    impls = {(r["op"], r["impl"]) for r in rows}
    assert impls == {("wgrad", "XLA ragged_dot_general"), ("wgrad", "graphrt (jit)"),
                     ("wgrad", "graphrt (jit, check_offsets=False)"),
                     ("proj", "XLA (jnp pipeline)"), ("proj", "graphrt (jit)")}
    assert all(r["us"] > 0 for r in rows)
    assert rows[0]["rel_l2_vs_xla"] < 1e-2
    proj = [r for r in rows if r["op"] == "proj"]
    assert proj[0]["scales_equal"] and proj[0]["codes_differing"] < 0.01
