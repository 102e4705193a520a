"""One input, one answer on every backend: the interpreted Triton kernels against the
reference backend on random valid shapes, strides and scales (hypothesis, derandomized so CI
sees the same cases every run)."""
import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import graphrt
from graphrt.ops.proj_rope import mxfp8_dequantize

from .helpers import env, needs_interpreter, rel_l2

BF16 = torch.bfloat16
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True, print_blob=True)
SCALES = st.sampled_from([1e-3, 1.0, 30.0])


def _both(call):
    """call(runtime) on the reference backend and on the interpreted kernels."""
    out = {}
    for backend in ("reference", "triton"):
        with env(GRAPHRT_BACKEND=backend):
            out[backend] = call(graphrt.Runtime("cpu"))
    return out["reference"], out["triton"]


def _rows(rows, hidden, pad, scale, gen):
    base = torch.randn(rows, hidden + pad, generator=gen) * scale
    return base.to(BF16)[:, :hidden]


@needs_interpreter
@SETTINGS
@given(rows=st.integers(1, 40), hidden=st.sampled_from([8, 24, 64, 136]),
       pad=st.sampled_from([0, 8]), scale=SCALES, residual=st.booleans(),
       w_bf16=st.booleans(), seed=st.integers(0, 2**16))
def test_rmsnorm_backends_agree(rows, hidden, pad, scale, residual, w_bf16, seed):
    gen = torch.Generator().manual_seed(seed)
    x = _rows(rows, hidden, pad, scale, gen)
    res = _rows(rows, hidden, 0, scale, gen) if residual else None
    w = (1 + 0.3 * torch.randn(hidden, generator=gen)).to(BF16 if w_bf16 else torch.float32)
    g = _rows(rows, hidden, pad, 1.0, gen)

    def call(rt):
        fwd = graphrt.ops.rmsnorm_forward(x, w, residual=res, runtime=rt)
        h = fwd[2] if residual else x
        return (*fwd, *graphrt.ops.rmsnorm_backward(g, h, w, fwd[1], runtime=rt))

    ref, tri = _both(call)
    # with a residual, h = x + residual is rounded to BF16 first, and the interpreter rounds by
    # truncation where the reference rounds to nearest: statistics one BF16 ulp of h apart
    fp32_tol = 2 ** -8 if residual else 1e-4
    names = ("y", "rstd", "h", "dx", "dw") if residual else ("y", "rstd", "dx", "dw")
    for name, a, b in zip(names, tri, ref):
        assert rel_l2(a, b) < (2e-2 if a.dtype == BF16 else fp32_tol), name


@needs_interpreter
@SETTINGS
@given(n=st.integers(1, 30), d=st.sampled_from([8, 24, 64]), pad=st.sampled_from([0, 8]),
       scale=SCALES, flags=st.sampled_from(list(itertools.product((True, False), repeat=3))),
       p=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**16))
def test_hstu_backends_agree(n, d, pad, scale, flags, p, seed):
    gen = torch.Generator().manual_seed(seed)
    x, u = _rows(n, d, pad, scale, gen), _rows(n, d, pad, 1.0, gen)
    w = (1 + 0.2 * torch.randn(d, generator=gen)).to(BF16)
    b = (0.1 * torch.randn(d, generator=gen)).to(BF16)
    kw = dict(zip(("apply_u_silu", "concat_u", "concat_x"), flags))

    def call(rt):
        y, mean, rstd, mask = graphrt.ops.hstu_lmsd_forward(x, u, w, b, dropout_ratio=p, seed=5,
                                                            offset=9, runtime=rt, **kw)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(BF16)
        grads = graphrt.ops.hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, dropout_ratio=p,
                                               runtime=rt, **kw)
        return (y, mean, rstd, mask, *grads)

    ref, tri = _both(call)
    if p > 0:
        assert torch.equal(tri[3], ref[3]), "dropout masks differ"
    for name, a, b_ in zip(("y", "mean", "rstd", "mask", "dx", "du", "dweight", "dbias"), tri, ref):
        if name == "mask" or a is None:
            continue
        assert rel_l2(a, b_) < (3e-2 if a.dtype == BF16 else 1e-4), name


@needs_interpreter
@SETTINGS
@given(t=st.integers(1, 40), k=st.sampled_from([8, 64, 136]), n=st.integers(1, 24),
       extra=st.sampled_from([0, 8]), seed=st.integers(0, 2**16))
def test_mhc_backends_agree(t, k, n, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen).to(BF16)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    gp = torch.randn(t, n + extra, generator=gen)
    gr = torch.randn(t, 1, generator=gen)
    r = torch.rand(t, 1, generator=gen) + 0.5
    ref, tri = _both(lambda rt: graphrt.ops.mhc_projection_backward(x, w, gp, gr, r,
                                                                    allow_tf32=True, runtime=rt))
    assert rel_l2(tri[0], ref[0]) < 6e-3 and rel_l2(tri[1], ref[1]) < 1e-4


@needs_interpreter
@SETTINGS
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=5),
       hidden=st.sampled_from([8, 24, 40]), inter=st.sampled_from([8, 16, 24]),
       layout=st.sampled_from(["kn", "mn", "kk", "mk"]), out=st.sampled_from(["bf16", "fp32"]),
       seed=st.integers(0, 2**16))
def test_grouped_wgrad_backends_agree(counts, hidden, inter, layout, out, seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(counts)
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)
    a = torch.randn(hidden, tokens, generator=gen).to(BF16)
    b = torch.randn(tokens, inter, generator=gen).to(BF16)
    if layout[0] == "m":
        a = a.t().contiguous().t()
    if layout[1] == "k":
        b = b.t().contiguous().t()
    dtype = BF16 if out == "bf16" else torch.float32
    ref, tri = _both(lambda rt: graphrt.ops.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=dtype,
                                                               runtime=rt)[0])
    if tokens:
        assert rel_l2(tri, ref) < (1e-2 if dtype == BF16 else 1e-5)
    else:
        assert torch.equal(tri, ref)


@needs_interpreter
@settings(max_examples=3, deadline=None, derandomize=True)
@given(t=st.sampled_from([32, 64]), heads=st.integers(1, 2), w_out_in=st.booleans(),
       scale=SCALES, seed=st.integers(0, 2**16))
def test_proj_backends_agree(t, heads, w_out_in, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, 64, generator=gen) * scale).to(BF16)
    w = (torch.randn(heads * 192, 64, generator=gen) / 8).to(BF16)
    if not w_out_in:
        w = w.t().contiguous()
    cos, sin = (torch.randn(t, 64, generator=gen).to(BF16) for _ in range(2))
    ref, tri = _both(lambda rt: graphrt.ops.gemm_proj_rope_mxfp8(x, w, cos, sin, w_out_in=w_out_in,
                                                                 runtime=rt))
    for dim, (codes, scales, rc, rs) in ((2, (tri[0], tri[1], ref[0], ref[1])),
                                         (0, (tri[2], tri[3], ref[2], ref[3]))):
        got, want = mxfp8_dequantize(codes, scales, dim), mxfp8_dequantize(rc, rs, dim)
        unit = torch.pow(2.0, torch.maximum(scales, rs).double() - 127).float()
        bound = 2 ** -3 * torch.maximum(got.abs(), want.abs()) + 2 ** -9 * unit.repeat_interleave(32, dim)
        assert ((got - want).abs() <= bound).all()


