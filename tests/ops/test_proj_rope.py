"""Projection GEMM + RoPE + dual-direction MXFP8: the quantizer exactly, the op, errors."""
import os
import pytest
import torch

import graphrt
from graphrt.ops import GemmProjRopeMxfp8, gemm_proj_rope_mxfp8
from graphrt.ops.proj_rope import gemm_proj_rope_mxfp8_reference, mxfp8_dequantize, mxfp8_quantize
from graphrt.ops.proj_rope.reference import FP8, apply_rope

from ..helpers import assert_rejected, env, needs_interpreter

BF16 = torch.bfloat16


def _quantize_one(values):
    codes, scales = mxfp8_quantize(torch.tensor([values], dtype=torch.float32), dim=1)
    return codes.view(torch.uint8)[0].tolist(), int(scales[0, 0]) - 127


def _block(*head, fill=0.0):
    return list(head) + [fill] * (32 - len(head))


def test_quantizer_powers_of_two_are_exact():
    codes, e = _quantize_one(_block(448.0, 1.0, 2.0 ** -6, -0.5))
    assert e == 0                                    # amax / 448 = 1 exactly
    assert codes[:4] == [0x7E, 0x38, 0x08, 0xB0]     # 448, 1, min normal, -0.5
    codes, e = _quantize_one(_block(896.0, 3.0))
    assert e == 1 and codes[:2] == [0x7E, 0x3C]      # 896 / 2 = 448; 3 / 2 = 1.5


def test_quantizer_around_448_and_binade_rounding():
    _, e = _quantize_one(_block(447.99))
    assert e == 0                                    # just under 448: no extra exponent
    codes, e = _quantize_one(_block(449.0))
    assert e == 1 and codes[0] == 0x76               # 224.5 -> 224 = 1.75 * 2^7 (ties to even)
    codes, _ = _quantize_one(_block(448.0, 15.5, 31.0, 1.0625, 1.1875))
    # 15.5 rounds up into the next binade (16); 31 -> 32; 1.0625 ties to 1.0; 1.1875 ties to 1.25
    assert codes[1:5] == [0x58, 0x60, 0x38, 0x3A]


def test_quantizer_zero_block_subnormals_and_negative_zero():
    codes, e = _quantize_one(_block(0.0))
    assert e == -108 and codes == [0] * 32           # amax clamped to 1e-30
    codes, e = _quantize_one(_block(448.0, 2.0 ** -9, 3 * 2.0 ** -10, 2.0 ** -10))
    assert e == 0 and codes[1:4] == [0x01, 0x02, 0x00]   # subnormals, ties to even
    codes, _ = _quantize_one(_block(-0.0, fill=-0.0))
    assert codes[0] == 0x80


def test_quantize_dequantize_round_trip_and_rope_reference(seed):
    v = torch.randn(64, 96)
    for dim in (0, 1):
        codes, scales = mxfp8_quantize(v, dim)
        back = mxfp8_dequantize(codes, scales, dim)
        # half an E4M3 step: 2^-4 relative for normal codes, 2^-10 of the block scale below them
        step = torch.pow(2.0, scales.double() - 127 - 10).float().repeat_interleave(32, dim=dim)
        assert ((back - v).abs() <= v.abs() * 2 ** -4 + step).all()
    y = torch.randn(4, 2, 16)
    cos, sin = torch.randn(4, 8), torch.randn(4, 8)
    out = apply_rope(y, cos, sin, nope=8)
    assert torch.equal(out[..., :8], y[..., :8])
    assert torch.allclose(out[..., 8], y[..., 8] * cos[:, None, 0] - y[..., 9] * sin[:, None, 0])
    assert torch.allclose(out[..., 12], y[..., 9] * cos[:, None, 4] + y[..., 8] * sin[:, None, 4])


def _problem(t, k, heads, nope=128, rope=64, w_out_in=True, mx=False, device="cpu"):
    d = nope + rope
    x = torch.randn(t, k, dtype=BF16, device=device)
    w = (torch.randn(heads * d, k, device=device) / k ** 0.5).to(BF16)
    if not w_out_in:
        w = w.t().contiguous()
    cos, sin = torch.randn(t, rope, device=device).to(BF16), torch.randn(t, rope, device=device).to(BF16)
    kwargs = dict(w_out_in=w_out_in, qk_nope_dim=nope, qk_rope_dim=rope)
    if mx:
        x, xs = mxfp8_quantize(x.float(), 1)
        w, ws = mxfp8_quantize(w.float(), 1 if w_out_in else 0)
        kwargs.update(x_scale=xs, w_scale=ws)
    return x, w, cos, sin, kwargs


def _check(out, ref):
    """Every element within one E4M3 rounding step of the reference's (the FP32 values differ
    only in summation order, so a value near a rounding boundary may round the other way, and a
    block whose maximum sits at a power of two may take the next scale): no element is free."""
    for dim, (codes, scales, ref_codes, ref_scales) in ((2, (out[0], out[1], ref[0], ref[1])),
                                                        (0, (out[2], out[3], ref[2], ref[3]))):
        got, want = mxfp8_dequantize(codes, scales, dim), mxfp8_dequantize(ref_codes, ref_scales, dim)
        unit = torch.pow(2.0, torch.maximum(scales, ref_scales).double() - 127).float()
        unit = unit.repeat_interleave(32, dim=dim)        # the block's scale, per element
        bound = 2 ** -3 * torch.maximum(got.abs(), want.abs()) + 2 ** -9 * unit
        assert ((got - want).abs() <= bound).all()
        assert ((scales.int() - ref_scales.int()).abs() <= 1).all()
        assert (scales == ref_scales).float().mean() >= 0.99


@needs_interpreter
@pytest.mark.parametrize("nope,rope", [(128, 64), (16, 48)])
@pytest.mark.parametrize("w_out_in", [True, False])
@pytest.mark.parametrize("mx", [False, True])
def test_triton_kernel_interpreted_bitwise(seed, nope, rope, w_out_in, mx):
    _interpreted_matches_reference(*_problem(64, 64, 2, nope, rope, w_out_in, mx))


def _interpreted_matches_reference(x, w, cos, sin, kw):
    with env(GRAPHRT_BACKEND="triton"):
        out = gemm_proj_rope_mxfp8(x, w, cos, sin, runtime=graphrt.Runtime("cpu"), **kw)
    ref = gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw)
    # the kernel computes the same FP32 values (up to summation order) and the same rounding
    _check(out, ref)
    same = [(a.view(torch.uint8) == b.view(torch.uint8)).float().mean().item() for a, b in zip(out, ref)]
    assert min(same) >= 0.99, same


def _dequant_matches_reference(device, dot_fp32, lowest_scale):
    """One dequantization launch for two operands against the reference's FP32 values rounded to
    BF16, bitwise: blocks along the columns (rows not a whole tile, columns not a whole tile) and
    along the rows (row groups not a whole tile). Scale bytes reach ``lowest_scale`` and 254."""
    from graphrt.ops.proj_rope.kernels import launch_dequant
    gen = torch.Generator().manual_seed(5)
    codes_a = torch.randint(0, 256, (40, 96), generator=gen, dtype=torch.uint8)
    codes_a[codes_a & 0x7F == 0x7F] = 0x3C      # no NaN codes
    scales_a = torch.randint(100, 150, (40, 3), generator=gen, dtype=torch.uint8)
    scales_a[0, 0], scales_a[1, 1], scales_a[2, 2] = lowest_scale, 254, 127
    codes_b = torch.randint(0, 0x7F, (96, 160), generator=gen, dtype=torch.uint8)
    scales_b = torch.randint(110, 140, (3, 160), generator=gen, dtype=torch.uint8)
    operands = []
    for codes, scales, along_cols in ((codes_a, scales_a, True), (codes_b, scales_b, False)):
        codes, scales = codes.to(device), scales.to(device)
        out = torch.full(codes.shape, float("nan"), dtype=BF16, device=device)
        operands.append((codes, scales, out, along_cols))
    launch_dequant(operands, dot_fp32=dot_fp32)
    for codes, scales, out, along_cols in operands:
        want = mxfp8_dequantize(codes.view(FP8), scales, 1 if along_cols else 0).to(BF16)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@needs_interpreter
def test_dequant_kernel_bitwise_interpreted():
    # The interpreter rounds FP32 subnormals to BF16 differently from the GPU, so no scale
    # here makes subnormal products; the GPU test takes scale byte 0 (2^-127).
    _dequant_matches_reference("cpu", dot_fp32=True, lowest_scale=100)


@needs_interpreter
def test_mxfp8_path_in_token_chunks_interpreted(seed, monkeypatch):
    """The MXFP8 path dequantizes x a chunk of tokens at a time: three chunks give the same
    bytes as the reference."""
    from graphrt.ops.proj_rope import plan as proj_plan
    monkeypatch.setattr(proj_plan, "X_CHUNK", 32)
    _interpreted_matches_reference(*_problem(96, 64, 1, mx=True))


def test_functional_cpu_reference_path(seed):
    x, w, cos, sin, kw = _problem(32, 64, 1)
    out = gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)
    assert out.out_fp8_row.shape == (32, 1, 192) and out.out_scales_col.shape == (1, 1, 192)
    assert out.out_fp8_row.dtype == FP8


def _errors(device):
    x, w, cos, sin, kw = _problem(64, 64, 1, device=device)
    outs = dict(out_fp8_row=torch.zeros(64, 1, 192, dtype=FP8, device=device),
                out_scales_row=torch.full((64, 1, 6), 7, dtype=torch.uint8, device=device),
                out_fp8_col=torch.zeros(64, 1, 192, dtype=FP8, device=device),
                out_scales_col=torch.full((2, 1, 192), 7, dtype=torch.uint8, device=device))
    xq, xs = mxfp8_quantize(x.float(), 1)
    cases = [
        (dict(x=x[:48], cos=cos[:48], sin=sin[:48]), "multiple of 32"),
        (dict(w=torch.randn(192, 72, device=device).to(BF16)), "w: expected K=64"),
        (dict(x=xq), "w: expected dtype float8_e4m3fn"),
        (dict(x_scale=xs), "x_scale: scales belong to the MXFP8 path"),
        (dict(x=xq, w=mxfp8_quantize(w.float(), 1)[0]), "x_scale: the MXFP8 path needs"),
        (dict(cos=cos.float()), "cos: expected bfloat16"),
    ]
    assert_rejected(gemm_proj_rope_mxfp8, ("x", "w", "cos", "sin"),
                    dict(x=x, w=w, cos=cos, sin=sin, **kw, **outs), cases, list(outs.values()))


def test_error_paths_write_nothing_cpu():
    _errors("cpu")


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [32, 2048, 4096])
@pytest.mark.parametrize("w_out_in", [True, False])
@pytest.mark.parametrize("mx", [False, True])
def test_gpu_matches_reference(seed, tokens, w_out_in, mx):
    x, w, cos, sin, kw = _problem(tokens, 1536, 16, w_out_in=w_out_in, mx=mx, device="cuda")
    out = gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)
    _check(out, gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw))


@pytest.mark.gpu
def test_gpu_dequant_kernel_bitwise():
    _dequant_matches_reference("cuda", dot_fp32=False, lowest_scale=0)


@pytest.mark.gpu
@pytest.mark.parametrize("nope,rope", [(64, 64), (128, 32), (256, 64)])
def test_gpu_other_head_shapes(seed, nope, rope):
    """Head shapes beside DeepSeek's (on Hopper the first two run the warp-specialized kernel,
    the third the head kernel), with a last tile of 32 tokens."""
    x, w, cos, sin, kw = _problem(160, 256, 3, nope, rope, device="cuda")
    out = gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)
    _check(out, gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw))


def _agrees_with_head_kernel(launch, tokens, k, heads, w_out_in=True):
    """``launch(x, w, cos, sin, *outs, tokens=, k=, heads=, nope=, rope=, w_out_in=)`` against
    the Triton head kernel, outputs poisoned first: the same FP32 values up to summation order
    and the same quantizer, so their bytes agree."""
    from graphrt.ops.proj_rope.kernels import head_config, launch_head
    x, w, cos, sin, _ = _problem(tokens, k, heads, w_out_in=w_out_in, device="cuda")
    shapes = [(tokens, heads * 192), (tokens, heads * 6), (tokens, heads * 192), (tokens // 32, heads * 192)]
    results = []
    for run in (launch, lambda *o, **a: launch_head(head_config(False), *o, dot_fp32=False, **a)):
        outs = [torch.full(sh, 0xAB, dtype=torch.uint8, device="cuda") for sh in shapes]
        run(x, w, cos, sin, *outs, tokens=tokens, k=k, heads=heads, nope=128, rope=64,
            w_out_in=w_out_in)
        results.append(outs)
    for got, head in zip(*results):
        assert (got == head).float().mean().item() >= 0.9999


@pytest.mark.gpu
@pytest.mark.parametrize("w_out_in", [True, False])
def test_gpu_warp_specialized_kernel_agrees_with_head_kernel(seed, w_out_in):
    """The Gluon kernel issues the same products in the same order as the head kernel, over
    whole tiles and a last tile of 32 tokens."""
    from graphrt.ops.proj_rope.kernels_ws import GLUON_API_OK, WS_CONFIG, launch_ws
    if torch.cuda.get_device_capability()[0] != 9 or not GLUON_API_OK:
        pytest.skip("the warp-specialized kernel runs on Hopper with Triton 3.6")
    _agrees_with_head_kernel(lambda *o, **a: launch_ws(WS_CONFIG, *o, **a), 288, 1536, 3, w_out_in)


def _cute_kernels():
    """graphrt's CuTe DSL module on Hopper, or a skip (it needs nvidia-cutlass-dsl)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the CuTe DSL kernel runs on Hopper")
    try:
        from graphrt.ops.proj_rope import kernels_cute
    except ImportError:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    return kernels_cute


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [32, 288, 4096])
def test_gpu_cute_kernel_agrees_with_head_kernel(seed, tokens):
    """The CuTe kernel (W multicast, epilogue warpgroup): rows past the tokens and a cluster
    whose second CTA has no rows (32 tokens) included."""
    launch_cute = _cute_kernels().launch_cute
    _agrees_with_head_kernel(lambda *o, tokens, heads, **_: launch_cute(*o, tokens=tokens,
                                                                         heads=heads),
                             tokens, 1536, 5)


@pytest.mark.gpu
def test_gpu_cute_packed_launch_equals_the_dsl_call(seed):
    """The installed DSL packs the kernel's arguments as graphrt's packed launch expects (so
    that launch is the one taken), and the two launches give the same bytes, from threads
    that launch side by side on their own streams, each with its own buffers."""
    import threading

    from graphrt.cute_launch import DslLaunch, PackedLaunch
    kernels = _cute_kernels()
    packed = kernels.launcher(torch.cuda.current_device())
    assert isinstance(packed, PackedLaunch)
    dsl = DslLaunch(kernels.compiled(torch.cuda.current_device()).to(torch.cuda.current_device()),
                    kernels.ARGUMENT_KINDS, kernels.POINTER_TYPES)
    tokens, k, heads = 288, 1536, 3
    shapes = [(tokens, heads * 192), (tokens, heads * 6), (tokens, heads * 192),
              (tokens // 32, heads * 192)]
    clusters = kernels.clusters(torch.device("cuda"), tokens, heads)

    def run(launcher, operands, stream):
        outs = [torch.full(sh, 0xAB, dtype=torch.uint8, device="cuda") for sh in shapes]
        launcher(stream.cuda_stream, *(t.data_ptr() for t in (*operands, *outs)), tokens, k,
                 heads, clusters)
        return outs

    problems = [_problem(tokens, k, heads, device="cuda")[:4] for _ in range(4)]
    want = [run(dsl, p, torch.cuda.current_stream()) for p in problems]
    torch.cuda.synchronize()
    got, errors = [None] * len(problems), []

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(5):
                    got[i] = run(packed, problems[i], stream)
            stream.synchronize()
        except Exception as error:  # reported below, on the test's thread
            errors.append(error)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(problems))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for mine, theirs in zip(got, want):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_plan_takes_cute_kernel(seed):
    """On Hopper with the DSL the plan runs the CuTe kernel for W stored [N, K] (and the Triton
    kernels for [K, N])."""
    _cute_kernels()
    for w_out_in, cute in ((True, True), (False, False)):
        x, w, cos, sin, kw = _problem(256, 512, 2, w_out_in=w_out_in, device="cuda")
        kernel = GemmProjRopeMxfp8(x, w, cos, sin, **kw).compile().describe()["kernel"]
        assert kernel.startswith("CuTe") == cute, kernel


@pytest.mark.gpu
@pytest.mark.parametrize("mx", [False, True])
def test_gpu_capture_replay(seed, mx):
    from graphrt.capture import capture, verify_replay
    x, w, cos, sin, kw = _problem(256, 512, 4, mx=mx, device="cuda")
    frag = capture(lambda x: tuple(gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)), x)
    report = verify_replay(frag, lambda x: tuple(gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)),
                           lambda i: (torch.randn(x.shape, device="cuda").to(x.dtype),), steps=2)
    assert report.ok, str(report)


@pytest.mark.gpu
def test_gpu_error_paths_write_nothing():
    _errors("cuda")


def _crafted_exact(device, w_out_in, runtime=None):
    """Crafted values through the kernel: a selector W makes Y = x exactly (one product per
    element) and cos = 1, sin = 0 leave the rope features unrotated, so every code and scale
    byte must equal the reference quantizer's: E4M3 rounding, and block maxima at and around
    448 * 2^k (where the E8M0 exponent steps)."""
    gen = torch.Generator().manual_seed(7)
    magnitudes = torch.pow(2.0, torch.randint(-30, 30, (32, 32), generator=gen).float())
    x = torch.randn(32, 32, generator=gen) * magnitudes
    x[0, :8] = torch.tensor([448.0, -448.0, 15.5, 0.0, -0.0, 2.0 ** -9, 3 * 2.0 ** -10, 464.0])
    x[1] = 0.0
    x = x.to(BF16)
    edges = torch.tensor([448.0, 448.0 * 1.00390625, 448.0 * 0.99609375, 896.0, 450.0, 446.0])
    for i, v in enumerate(edges):   # a row whose block maximum sits on or beside a step
        x[2 + i] = (torch.rand(32, generator=gen) * v * 2.0 ** (i - 3)).to(BF16)
        x[2 + i, i] = (v * 2.0 ** (i - 3)).to(BF16)
    w = torch.zeros(192, 32)
    w[torch.arange(192), torch.arange(192) % 32] = 1.0
    w = w.to(BF16)
    if not w_out_in:
        w = w.t().contiguous()
    x, w = x.to(device), w.to(device)
    cos = torch.ones(32, 64, dtype=BF16, device=device)
    sin = torch.zeros(32, 64, dtype=BF16, device=device)
    extra = {} if runtime is None else {"runtime": runtime}
    out = gemm_proj_rope_mxfp8(x, w, cos, sin, w_out_in=w_out_in, **extra)
    ref = gemm_proj_rope_mxfp8_reference(x, w, cos, sin, w_out_in=w_out_in)
    for got, want in zip(out, ref):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@needs_interpreter
def test_kernel_quantizes_exactly_interpreted():
    with env(GRAPHRT_BACKEND="triton"):
        _crafted_exact("cpu", True, graphrt.Runtime("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("w_out_in", [True, False])
def test_gpu_kernel_quantizes_exactly(w_out_in):
    _crafted_exact("cuda", w_out_in)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_zero_tokens_on_every_backend(backend):
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreted kernel runs on the CPU only with TRITON_INTERPRET=1")
    x, w = torch.randn(0, 64, dtype=torch.bfloat16), torch.randn(2 * 192, 64, dtype=torch.bfloat16)
    cs = torch.randn(0, 64).to(torch.bfloat16)
    with env(GRAPHRT_BACKEND=backend):
        out = graphrt.ops.gemm_proj_rope_mxfp8(x, w, cs, cs, runtime=graphrt.Runtime("cpu"))
    assert [tuple(t.shape)[:2] for t in out] == [(0, 2)] * 4


# -- NaN and infinity: the OCP MX NaN scale, one answer on every backend ------------------------------
BAD_FEATURE = 100    # a nope feature of head 0: row block 3, and its own columnwise blocks


def _non_finite_problem(device, mx, w_out_in=True):
    """96 tokens x 2 heads with non-finite inputs: (x, w, cos, sin, kw, bad_tokens). On the BF16
    path x holds a NaN, +inf and -inf in three tokens and W an infinity in BAD_FEATURE's row; on
    the MXFP8 path x holds a NaN code and a NaN scale byte, W a NaN code."""
    x, w, cos, sin, kw = _problem(96, 64, 2, w_out_in=w_out_in, mx=mx, device=device)
    w_at = (BAD_FEATURE, 9) if w_out_in else (9, BAD_FEATURE)
    if mx:
        x.view(torch.uint8)[3, 5] = 0x7F
        kw["x_scale"][40, 0] = 255
        w.view(torch.uint8)[w_at] = 0xFF
        return x, w, cos, sin, kw, {3, 40}
    x[3, 5], x[40, 7], x[50, 1] = float("nan"), float("inf"), -float("inf")
    w[w_at] = float("inf")
    return x, w, cos, sin, kw, {3, 40, 50}


def _check_non_finite(out, ref, bad_tokens):
    """The reference follows the semantics (a block is NaN exactly where it holds a non-finite
    value: the bad tokens' rowwise blocks, their token blocks' columnwise ones, and BAD_FEATURE's
    in both directions), and ``out`` agrees: scale byte 255 and code 0x7F in those blocks, the
    rest as _check asks of finite outputs."""
    heads = ref[0].shape[1]
    want_row = torch.zeros(96, heads, 6, dtype=torch.bool)
    want_row[sorted(bad_tokens)] = True
    want_row[:, 0, BAD_FEATURE // 32] = True
    want_col = torch.zeros(3, heads, 192, dtype=torch.bool)
    want_col[sorted({t // 32 for t in bad_tokens})] = True
    want_col[:, 0, BAD_FEATURE] = True
    assert torch.equal(ref[1].cpu() == 255, want_row) and torch.equal(ref[3].cpu() == 255, want_col)
    cleaned = []
    for result in (out, ref):
        codes_row, scales_row, codes_col, scales_col = (t.view(torch.uint8).cpu() for t in result)
        for codes, scales, bad in ((codes_row, scales_row, want_row.repeat_interleave(32, 2)),
                                   (codes_col, scales_col, want_col.repeat_interleave(32, 0))):
            assert torch.equal(scales == 255, bad.reshape(scales.shape[0], -1)[:, ::32].reshape(scales.shape)
                               if scales.shape[-1] == 6 else bad[::32])
            assert (codes.view(96, -1)[bad.view(96, -1)] == 0x7F).all()
        keep = [codes_row.masked_fill(want_row.repeat_interleave(32, 2), 0), scales_row.masked_fill(want_row, 127),
                codes_col.masked_fill(want_col.repeat_interleave(32, 0), 0), scales_col.masked_fill(want_col, 127)]
        cleaned.append([keep[0].view(FP8), keep[1], keep[2].view(FP8), keep[3]])
    _check(*cleaned)


@pytest.mark.parametrize("mx", [False, True])
def test_reference_non_finite_blocks_take_the_nan_scale(seed, mx):
    x, w, cos, sin, kw, bad = _non_finite_problem("cpu", mx)
    ref = gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw)
    _check_non_finite(ref, ref, bad)
    back = mxfp8_dequantize(ref[0], ref[1], 2)
    assert back[sorted(bad)].isnan().all() and back[60, 1].isfinite().all()


def test_quantizer_nan_and_infinity_blocks():
    for special in (float("nan"), float("inf"), -float("inf")):
        codes, e = _quantize_one(_block(1.0, special, -3.0))
        assert e == 128 and codes == [0x7F] * 32
    # E4M3 has no infinity: the largest finite FP32 value still quantizes to a finite block
    codes, e = _quantize_one(_block(3.0e38))
    assert e == 120 and codes[0] == 0x76


@needs_interpreter
@pytest.mark.parametrize("mx", [False, True])
@pytest.mark.parametrize("w_out_in", [True, False])
def test_non_finite_interpreted_kernel_agrees(seed, mx, w_out_in):
    x, w, cos, sin, kw, bad = _non_finite_problem("cpu", mx, w_out_in)
    with env(GRAPHRT_BACKEND="triton"):
        out = gemm_proj_rope_mxfp8(x, w, cos, sin, runtime=graphrt.Runtime("cpu"), **kw)
    _check_non_finite(out, gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw), bad)


def _gpu_launchers():
    """Every GEMM kernel this GPU and install can run, by name: launch(x, w, cos, sin, *outs, **shape)."""
    from graphrt.ops.proj_rope import kernels, kernels_ws
    launchers = {
        "head": lambda *o, **a: kernels.launch_head(kernels.head_config(False), *o, dot_fp32=False, **a),
        "block": lambda *o, **a: kernels.launch_block(*o, dot_fp32=False, **a),
    }
    if torch.cuda.get_device_capability()[0] == 9 and kernels_ws.GLUON_API_OK:
        launchers["gluon"] = lambda *o, **a: kernels_ws.launch_ws(kernels_ws.WS_CONFIG, *o, **a)
    try:
        from graphrt.ops.proj_rope import kernels_cute
        if torch.cuda.get_device_capability()[0] == 9:
            launchers["cute"] = lambda *o, tokens, heads, **_: kernels_cute.launch_cute(
                *o, tokens=tokens, heads=heads)
    except ImportError:
        pass
    return launchers


@pytest.mark.gpu
@pytest.mark.parametrize("mx", [False, True])
@pytest.mark.parametrize("w_out_in", [True, False])
def test_gpu_non_finite_plan_agrees(seed, mx, w_out_in):
    x, w, cos, sin, kw, bad = _non_finite_problem("cuda", mx, w_out_in)
    out = gemm_proj_rope_mxfp8(x, w, cos, sin, **kw)
    _check_non_finite(out, gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw), bad)


@pytest.mark.gpu
def test_gpu_non_finite_every_kernel_agrees(seed):
    x, w, cos, sin, kw, bad = _non_finite_problem("cuda", False)
    ref = gemm_proj_rope_mxfp8_reference(x, w, cos, sin, **kw)
    shapes = [(96, 2 * 192), (96, 2 * 6), (96, 2 * 192), (3, 2 * 192)]
    for name, launch in _gpu_launchers().items():
        outs = [torch.full(sh, 0xAB, dtype=torch.uint8, device="cuda") for sh in shapes]
        launch(x, w, cos, sin, *outs, tokens=96, k=64, heads=2, nope=128, rope=64, w_out_in=True)
        got = [o.view(sh[0], 2, -1) for o, sh in zip(outs, shapes)]
        try:
            _check_non_finite([got[0].view(FP8), got[1], got[2].view(FP8), got[3]], ref, bad)
        except AssertionError as error:
            raise AssertionError(f"the {name} kernel: {error}") from error
