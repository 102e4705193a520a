"""Grouped GEMM weight gradients from FP8 inputs: MXFP8 (E8M0 scales per 32 tokens) and FP32
scales per 128 tokens (DeepSeek-V3's 1x128 blocks), against FP64 on the dequantized values."""
import itertools

import pytest
import torch

import graphrt
from graphrt.ops import GroupedGemmWgrad, grouped_gemm_wgrad

from ..helpers import assert_rejected, env, needs_interpreter, rel_l2

FP8 = torch.float8_e4m3fn
BLOCK = {"mxfp8": 32, "fp32x128": 128}


def _scales(rows, blocks, recipe, device, narrow=False):
    """Random scales: E8M0 bytes around 2^0, so products stay far from FP32's limits
    (``narrow``: 2^-2 .. 2^2, so that sums stay inside FP16's), or FP32 values in [0.25, 3.25)."""
    if recipe == "mxfp8":
        low, high = (125, 130) if narrow else (119, 136)
        return torch.randint(low, high, (rows, blocks), dtype=torch.uint8, device=device)
    return torch.rand(rows, blocks, device=device) * 3 + 0.25


def _problem(counts, hidden, inter, recipe, device="cpu", scales_mn_major=False,
             narrow_scales=False):
    """FP8 codes a (hidden, T) and b (T, intermediate), both tokens-major. Scales a_scale
    (hidden, blocks) and b_scale (blocks, intermediate): by default as rowwise quantizers of A
    and B^T write them (a_scale row-major, b_scale the transpose of a row-major (intermediate,
    blocks) tensor); ``scales_mn_major``: each block's scales contiguous along hidden and
    intermediate instead; ``narrow_scales``: see ``_scales``."""
    tokens = sum(counts)
    blocks = -(-tokens // BLOCK[recipe])
    a = (torch.randn(hidden, tokens, device=device) * 4).to(FP8)
    b = (torch.randn(inter, tokens, device=device) * 4).to(FP8).t()
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    if scales_mn_major:
        sa = _scales(blocks, hidden, recipe, device, narrow_scales).t()
        sb = _scales(blocks, inter, recipe, device, narrow_scales)
    else:
        sa = _scales(hidden, blocks, recipe, device, narrow_scales)
        sb = _scales(inter, blocks, recipe, device, narrow_scales).t()
    return a, b, sa, sb, offsets


def _fp64(a, b, a_scale, b_scale, counts):
    """Per expert, in FP64: codes times 2^(s - 127) (E8M0) or s (FP32), one scale per block of
    tokens counted from token 0."""
    ends = list(itertools.accumulate(counts))
    return _fp64_between(a, b, a_scale, b_scale, list(zip([0] + ends[:-1], ends)))


def _fp64_between(a, b, a_scale, b_scale, bounds):
    """``_fp64`` of experts given as (begin, end) token bounds; None bounds: an empty expert."""
    tokens = a.shape[1]

    def values(codes, scales, dim):
        s = scales.double().cpu()
        if scales.dtype == torch.uint8:
            s = torch.pow(2.0, s - 127)
        block = 32 if scales.dtype == torch.uint8 else 128
        return codes.double().cpu() * s.repeat_interleave(block, dim).narrow(dim, 0, tokens)

    av, bv = values(a, a_scale, 1), values(b, b_scale, 0)
    empty = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    return torch.stack([empty if span is None else av[:, span[0]:span[1]] @ bv[span[0]:span[1]]
                        for span in bounds])


def _check(counts, hidden, inter, recipe, device, out_dtype=torch.float32, mode="dense",
           accumulate=False, scales_mn_major=False, runtime=None):
    a, b, sa, sb, offsets = _problem(counts, hidden, inter, recipe, device, scales_mn_major,
                                     narrow_scales=out_dtype == torch.float16)
    init = torch.randn(len(counts), hidden, inter, device=device).to(out_dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    kwargs = dict(a_scale=sa, b_scale=sb, wgrad=w, wgrad_dtype=out_dtype, output_mode=mode,
                  accumulate_on_output=accumulate)
    if mode == "discrete":
        kwargs["wgrad_ptrs"] = torch.tensor([w[e].data_ptr() for e in range(len(counts))],
                                            device=device)
    grouped_gemm_wgrad(a, b, offsets, **kwargs, runtime=runtime)
    want = _fp64(a, b, sa, sb, counts)
    if accumulate:   # an empty expert stays untouched
        want = torch.stack([want[e] + init[e].double().cpu() if n else init[e].double().cpu()
                            for e, n in enumerate(counts)])
    assert rel_l2(w.cpu(), want) < _tolerance(recipe, device, out_dtype)


def _tolerance(recipe, device, out_dtype=torch.float32):
    """Relative L2 error allowed against FP64. MXFP8 runs on BF16 tensor cores with FP32
    accumulation (its values are exact in BF16). The 1x128 recipe sums each block on Hopper's
    FP8 tensor cores, which keep about 14 bits while summing (DeepSeek-V3's report measures
    the same; the kernel adds each block's sum in FP32): 1.2e-4 measured on the H200 at 128
    tokens a block. test_gpu_exact_on_integer_values shows that the rest is exact."""
    if out_dtype != torch.float32:
        return 1e-2
    return 5e-4 if recipe == "fp32x128" and device == "cuda" else 1e-5


# experts starting and ending inside scale blocks, one inside a single block, empty ones;
# tokens_sum 360 (rows not 16-byte aligned) and 352 (aligned: 16 codes a load on the GPU)
COUNTS = [0, 37, 5, 0, 300, 18]
COUNTS_ALIGNED = [0, 37, 5, 0, 300, 10]


@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_reference_backend_matches_fp64(recipe):
    torch.manual_seed(0)
    _check(COUNTS, 24, 40, recipe, "cpu")


@needs_interpreter
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
@pytest.mark.parametrize("out_dtype,mode,accumulate", [(torch.float32, "dense", False),
                                                       (torch.bfloat16, "discrete", True)])
@pytest.mark.parametrize("counts", [COUNTS, COUNTS_ALIGNED])
@pytest.mark.parametrize("scales_mn_major", [False, True])
def test_triton_kernel_interpreted(recipe, out_dtype, mode, accumulate, counts, scales_mn_major):
    torch.manual_seed(1)
    with env(GRAPHRT_BACKEND="triton"):
        _check(counts, 24, 40, recipe, "cpu", out_dtype, mode, accumulate, scales_mn_major)


def _bad_offsets_flag_and_leave_the_rest(recipe, device, hidden, inter, runtime=None):
    """Offsets the host does not check (check_offsets=False): an expert whose end falls below
    its begin, and one ending past tokens_sum (the last then begins past its end). Each call
    flags the first bad expert and computes the bad ones as empty (zeros over the poison, or
    left as they were when accumulating); the others, the one after the decreasing end
    included (it begins there), match FP64."""
    counts = [0, 300, 17, 0, 1024, 259]
    a, b, sa, sb, offsets = _problem(counts, hidden, inter, recipe, device)
    tokens = a.shape[1]
    graphrt.check_errors(device)
    for position, value, first in ((3, int(offsets[2]) - 5, 3), (4, tokens + 40, 4)):
        bad = offsets.clone()
        bad[position] = value
        ends = bad.tolist()
        bounds = [(begin, end) if 0 <= begin <= end <= tokens else None
                  for begin, end in zip([0] + ends[:-1], ends)]
        w = torch.full((len(counts), hidden, inter), float("nan"), device=device)
        grouped_gemm_wgrad(a, b, bad, a_scale=sa, b_scale=sb, wgrad=w,
                           wgrad_dtype=torch.float32, check_offsets=False, runtime=runtime)
        with pytest.raises(graphrt.DeviceCheckError, match=f"offsets.*first at index {first}"):
            graphrt.check_errors(device)
        want = _fp64_between(a, b, sa, sb, bounds)
        assert rel_l2(w.cpu(), want) < _tolerance(recipe, device), (position, value)
        init = torch.randn(len(counts), hidden, inter, device=device)
        w.copy_(init)
        grouped_gemm_wgrad(a, b, bad, a_scale=sa, b_scale=sb, wgrad=w,
                           wgrad_dtype=torch.float32, accumulate_on_output=True,
                           check_offsets=False, runtime=runtime)
        with pytest.raises(graphrt.DeviceCheckError, match=f"offsets.*first at index {first}"):
            graphrt.check_errors(device)
        want = want + init.double().cpu()
        assert rel_l2(w.cpu(), want) < _tolerance(recipe, device), (position, value, "acc")


def test_bad_offsets_reference_backend_cpu():
    for recipe in ("mxfp8", "fp32x128"):
        _bad_offsets_flag_and_leave_the_rest(recipe, "cpu", 24, 40, graphrt.Runtime("cpu"))


@needs_interpreter
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_bad_offsets_interpreted(recipe):
    with env(GRAPHRT_BACKEND="triton"):
        _bad_offsets_flag_and_leave_the_rest(recipe, "cpu", 24, 40, graphrt.Runtime("cpu"))


def _nan_codes_stay_in_their_expert(recipe, device):
    """E4M3 NaN codes (0x7F) in one expert's tokens, inside blocks it shares with neighbours,
    leave every other expert exact. (The Triton interpreter reads those codes as 480, so on
    the CPU this checks finite neighbours only; the GPU reads NaN.)"""
    counts = [37, 5, 100, 18]
    a, b, sa, sb, offsets = _problem(counts, 24, 40, recipe, device)
    a.view(torch.uint8)[:, 38] = 0x7F
    b.view(torch.uint8)[41, :] = 0xFF
    w = torch.full((4, 24, 40), float("nan"), device=device)
    grouped_gemm_wgrad(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=w, wgrad_dtype=torch.float32)
    want = _fp64(a, b, sa, sb, counts)
    for e in (0, 2, 3):
        assert rel_l2(w[e].cpu(), want[e]) < _tolerance(recipe, device), e


@needs_interpreter
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_nan_codes_stay_in_their_expert_interpreted(recipe):
    with env(GRAPHRT_BACKEND="triton"):
        _nan_codes_stay_in_their_expert(recipe, "cpu")


def _nan_scales_leave_empty_experts_zero(recipe, device, launch=None, scales_mn_major=False):
    """A NaN scale (E8M0 255, or FP32 NaN) in a block an empty expert sits inside: the experts
    owning tokens of that block are NaN, as their dequantized values are; the empty one is
    zeros. ``launch(a, b, sa, sb, offsets, w)``: the kernel called directly (default: the
    functional call)."""
    counts = [37, 0, 5, 118]   # expert 1 empty at token 37; tokens_sum 160, rows 16-byte aligned
    a, b, sa, sb, offsets = _problem(counts, 32, 48, recipe, device, scales_mn_major)
    if recipe == "mxfp8":
        sa[:, 1] = 255   # the block of tokens 32-63
    else:
        sa[:, 0] = float("nan")   # tokens 0-127
    w = torch.full((4, 32, 48), float("nan"), device=device)
    if launch is None:
        grouped_gemm_wgrad(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=w,
                           wgrad_dtype=torch.float32)
    else:
        launch(a, b, sa, sb, offsets, w)
    assert torch.equal(w[1].cpu(), torch.zeros(32, 48))
    assert w[2].isnan().all()


@needs_interpreter
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_nan_scales_leave_empty_experts_zero_interpreted(recipe):
    with env(GRAPHRT_BACKEND="triton"):
        _nan_scales_leave_empty_experts_zero(recipe, "cpu")


def _check_mx_values(tokens, scales_mn_major, device):
    """kernels_mx_values' pass on its own: every value exact (codes times 2^(s - 127), NaN where
    the scale is E8M0's NaN), nothing outside the two views' tokens written (the scratch
    poisoned with 0xFF bytes first)."""
    from graphrt.ops.grouped_gemm.kernels_mx_values import (launch_mx_values, mx_values_bytes,
                                                            mx_values_views)
    hidden, inter = 24, 40
    a, b, sa, sb, _ = _problem([tokens], hidden, inter, "mxfp8", device, scales_mn_major)
    sa[3, 2] = 255
    nbytes = mx_values_bytes(tokens, hidden, inter)
    scratch = torch.full((nbytes + 64,), 0xFF, dtype=torch.uint8, device=device)
    a_values, b_values = mx_values_views(scratch[:nbytes], tokens, hidden, inter)
    assert a_values.stride(0) % 8 == 0 and b_values.stride(1) == a_values.stride(0)
    launch_mx_values(a, b, sa, sb, a_values, b_values)
    for values, codes, scales, dim in ((a_values, a, sa, 1), (b_values, b, sb, 0)):
        factors = torch.pow(2.0, scales.double().cpu() - 127).masked_fill(scales.cpu() == 255,
                                                                            float("nan"))
        want = (codes.double().cpu() * factors.repeat_interleave(32, dim)
                .narrow(dim, 0, tokens)).to(torch.bfloat16)
        got = values.cpu()
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert a_values[3, 64:96].isnan().all()
    assert (scratch[nbytes:] == 0xFF).all()
    gap = scratch[hidden * a_values.stride(0) * 2:nbytes - inter * a_values.stride(0) * 2]
    assert (gap == 0xFF).all()


@needs_interpreter
@pytest.mark.parametrize("tokens", [352, 360, 357])   # multiples of 16 and of 8, and neither
@pytest.mark.parametrize("scales_mn_major", [False, True])
def test_mx_values_pass_interpreted(tokens, scales_mn_major):
    torch.manual_seed(tokens)
    _check_mx_values(tokens, scales_mn_major, "cpu")


def _errors(device):
    a, b, sa, sb, offsets = _problem([40, 24], 8, 8, "fp32x128", device)
    w = torch.full((2, 8, 8), float("nan"), dtype=torch.bfloat16, device=device)
    bf16 = torch.randn(8, 64, dtype=torch.bfloat16, device=device)
    cases = [
        (dict(a_scale=None), "a_scale: FP8 inputs need scales"),
        (dict(b_scale=sb.to(torch.uint8)), "b_scale: expected dtype float32 \\(like a_scale\\)"),
        (dict(a_scale=sa.double()), "a_scale: expected a 2-D uint8"),
        (dict(a_scale=sa[:, :0]), "a_scale: expected float32 \\(8, 1\\)"),
        (dict(b_scale=torch.ones(2, 8, device=device)), "b_scale: expected float32 \\(1, 8\\)"),
        (dict(a=a.t().contiguous().t()), "a: FP8 codes must be tokens-major"),
        (dict(b=b.contiguous()), "b: FP8 codes must be tokens-major"),
        (dict(b=b.to(torch.bfloat16)), "b: expected dtype float8_e4m3fn \\(like a\\)"),
        (dict(input_order="tensor_ragged"), "input_order: FP8 inputs take tensor2d only"),
        (dict(a=bf16, b=bf16.t()), "a_scale: scales belong to FP8 inputs"),
        (dict(a_scale=sa.to("meta")), "a_scale: expected device"),
    ]
    assert_rejected(grouped_gemm_wgrad, ("a", "b", "offsets"),
                    dict(a=a, b=b, offsets=offsets, a_scale=sa, b_scale=sb, wgrad=w), cases, (w,))


def test_error_paths_write_nothing_cpu():
    _errors("cpu")


def test_plan_key_holds_the_recipe_not_tokens_sum():
    rt = graphrt.Runtime("cpu")
    for counts in ([40, 24, 0], [100, 4, 3]):
        for recipe in ("mxfp8", "fp32x128"):
            a, b, sa, sb, offsets = _problem(counts, 8, 8, recipe)
            grouped_gemm_wgrad(a, b, offsets, a_scale=sa, b_scale=sb, runtime=rt)
    assert rt.plans.stats()["compiles"] == 2


# -- GPU --------------------------------------------------------------------------------------------
# "fp32x128/triton": the 1x128 recipe with the warp-specialized kernel turned off, so that the
# Triton kernel runs the aligned calls that the plan gives that kernel on Hopper
GPU_RECIPES = ["mxfp8", "fp32x128", "fp32x128/triton"]


def _recipe(recipe, monkeypatch):
    """(the recipe's name, the runtime to call on). "/triton" turns the warp-specialized
    kernel off and gives a fresh runtime: the default one's plans may have bound calls of the
    same kind recorded with that kernel, which would replay it."""
    if not recipe.endswith("/triton"):
        return recipe, None
    try:
        from graphrt.ops.grouped_gemm import kernels_gluon
    except ImportError:   # no Gluon in this Triton: the Triton kernel runs anyway
        pass
    else:
        monkeypatch.setattr(kernels_gluon, "fits_gluon_kernel", lambda *args: False)
    return recipe.split("/")[0], graphrt.Runtime("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GPU_RECIPES)
@pytest.mark.parametrize("hidden", [1024, 1160])
# tokens_sum 1600 (rows 16-byte aligned: 16 codes a load) and 1597; counts crossing blocks
@pytest.mark.parametrize("counts", [[0, 300, 17, 0, 1024, 259], [0, 301, 17, 0, 1023, 256]])
@pytest.mark.parametrize("scales_mn_major", [False, True])
def test_gpu_matches_fp64(seed, recipe, hidden, counts, scales_mn_major, monkeypatch):
    recipe, rt = _recipe(recipe, monkeypatch)
    _check(counts, hidden, 768, recipe, "cuda", scales_mn_major=scales_mn_major, runtime=rt)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GPU_RECIPES)
@pytest.mark.parametrize("counts", [[0, 300, 17, 0, 1024, 259], [0, 301, 17, 0, 1023, 256]])
def test_gpu_exact_on_integer_values(seed, recipe, counts, monkeypatch):
    """Codes in [-3, 3] and power-of-two scales: every block's sum is an integer below 2^11
    and every total fits FP32's 24 bits, so any rounding or misplaced token shows as a
    difference from FP64, whatever precision the tensor cores keep while summing."""
    recipe, rt = _recipe(recipe, monkeypatch)
    a, b, sa, sb, offsets = _problem(counts, 1160, 768, recipe, "cuda")
    a = torch.randint(-3, 4, a.shape, device="cuda").to(FP8)
    b = torch.randint(-3, 4, (b.shape[1], b.shape[0]), device="cuda").to(FP8).t()
    if recipe == "mxfp8":
        sa, sb = (torch.randint(125, 130, s.shape, dtype=torch.uint8, device="cuda")
                  for s in (sa, sb))
    else:
        sa, sb = (torch.pow(2.0, torch.randint(-2, 3, s.shape, device="cuda").float())
                  for s in (sa, sb))
    w = torch.full((len(counts), 1160, 768), float("nan"), device="cuda")
    grouped_gemm_wgrad(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=w, runtime=rt)
    assert torch.equal(w.cpu().double(), _fp64(a, b, sa, sb, counts))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GPU_RECIPES)
@pytest.mark.parametrize("out_dtype,mode", [(torch.bfloat16, "discrete"),
                                            (torch.float16, "dense")])
def test_gpu_output_modes_and_accumulate(seed, recipe, out_dtype, mode, monkeypatch):
    recipe, rt = _recipe(recipe, monkeypatch)
    _check([128, 0, 200, 312], 256, 384, recipe, "cuda", out_dtype, mode, True, runtime=rt)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe,direct", [("mxfp8", False), ("fp32x128", False),
                                           ("fp32x128", True)])
@pytest.mark.parametrize("scales_mn_major", [False, True])
def test_gpu_nan_scales_leave_empty_experts_zero(seed, recipe, direct, scales_mn_major):
    """Through the plan (the Gluon kernel for 1x128 on Hopper) and the Gluon kernel called
    directly, both scale layouts."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm import kernels_gluon
    launch = None
    if direct:
        if (not kernels_gluon.GLUON_API_OK
                or torch.cuda.get_device_capability()[0] != 9):
            pytest.skip("the Gluon kernel needs a Hopper GPU and Triton 3.6")

        def launch(a, b, sa, sb, offsets, w):
            kernels_gluon.launch_wgrad_fp8_gluon(a, b, sa, sb, offsets, w, None, torch.float32,
                                                 error_flags(a.device), hidden=32, inter=48,
                                                 accumulate=False)
    _nan_scales_leave_empty_experts_zero(recipe, "cuda", launch, scales_mn_major)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_bad_offsets_flag_and_leave_the_rest(seed, recipe, monkeypatch):
    """On Hopper: MXFP8 through its values and the tensor2d TMA kernel, 1x128 through the Gluon
    kernel with more work items than SMs (each program reads the next items' bounds ahead),
    and through the Triton kernel."""
    recipe, rt = _recipe(recipe, monkeypatch)
    _bad_offsets_flag_and_leave_the_rest(recipe, "cuda", 1160, 1000, rt)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_gpu_nan_codes_stay_in_their_expert(seed, recipe):
    _nan_codes_stay_in_their_expert(recipe, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1600, 1608, 1597])
@pytest.mark.parametrize("scales_mn_major", [False, True])
def test_gpu_mx_values_pass(seed, tokens, scales_mn_major):
    _check_mx_values(tokens, scales_mn_major, "cuda")


@pytest.mark.gpu
# tokens_sum 1600, 1608 (rows 8 codes apart from 16-byte aligned) and 1597
@pytest.mark.parametrize("counts", [[0, 300, 17, 0, 1024, 259], [0, 301, 25, 0, 1023, 259],
                                    [0, 301, 17, 0, 1023, 256]])
@pytest.mark.parametrize("workspace", ["given", "too small", None])
@pytest.mark.parametrize("out_dtype,mode,accumulate", [(torch.float32, "dense", False),
                                                       (torch.bfloat16, "discrete", True)])
def test_gpu_mxfp8_plan_with_and_without_the_values_workspace(seed, counts, workspace,
                                                              out_dtype, mode, accumulate):
    """plan.execute with the workspace for the codes' BF16 values (poisoned; Hopper: the values
    pass, then the tensor2d TMA kernel) and without one or with one too small (the values made
    inside the product), each against FP64."""
    hidden, inter = 1160, 768
    a, b, sa, sb, offsets = _problem(counts, hidden, inter, "mxfp8", "cuda")
    kwargs = dict(output_mode=mode, wgrad_dtype=out_dtype, accumulate_on_output=accumulate)
    plan = GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb, **kwargs).compile()
    nbytes = plan.call_workspace_bytes(a.shape[1])
    if torch.cuda.get_device_capability()[0] == 9 and plan.tensor2d_tma is not None:
        values = 2 * (hidden + inter) * (-(-a.shape[1] // 8) * 8)   # BF16, rows padded to 8
        assert values <= nbytes < values + 256
    ws = None
    if workspace is not None and nbytes:
        ws = torch.full((nbytes - (workspace == "too small"),), 0xFF, dtype=torch.uint8,
                        device="cuda")
    init = torch.randn(len(counts), hidden, inter, device="cuda").to(out_dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    out = dict(wgrad_ptrs=torch.tensor([w[e].data_ptr() for e in range(len(counts))],
                                       device="cuda")) if mode == "discrete" else dict(wgrad=w)
    plan.execute(a, b, offsets, a_scale=sa, b_scale=sb, workspace=ws, **out)
    want = _fp64(a, b, sa, sb, counts)
    if accumulate:
        want = torch.stack([want[e] + init[e].double().cpu() if n else init[e].double().cpu()
                            for e, n in enumerate(counts)])
    assert rel_l2(w.cpu(), want) < _tolerance("mxfp8", "cuda", out_dtype)


@pytest.mark.gpu
def test_gpu_error_paths_write_nothing():
    _errors("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "fp32x128"])
def test_gpu_capture_replays_new_routing_bitwise(seed, recipe):
    from graphrt.capture import capture
    a, b, sa, sb, offsets = _problem([100, 200, 0, 212], 512, 256, recipe, "cuda")
    frag = capture(lambda a, b, o: grouped_gemm_wgrad(a, b, o, a_scale=sa, b_scale=sb)[0],
                   a, b, offsets)
    for routing in ([512, 0, 0, 0], [1, 2, 3, 506], [128, 128, 128, 128]):
        new = torch.tensor(list(itertools.accumulate(routing)), dtype=torch.int32, device="cuda")
        replayed = frag(a, b, new).clone()
        (eager,) = grouped_gemm_wgrad(a, b, new, a_scale=sa, b_scale=sb)
        assert torch.equal(replayed, eager)
        plan = GroupedGemmWgrad(a, b, new, a_scale=sa, b_scale=sb)
        assert plan.contract == GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb).contract


@pytest.mark.gpu
@pytest.mark.parametrize("counts", [[0, 300, 17, 0, 1024, 259], [37, 5, 100, 18, 0]])
@pytest.mark.parametrize("out_dtype,mode,accumulate", [(torch.float32, "dense", False),
                                                       (torch.bfloat16, "discrete", True),
                                                       (torch.float16, "dense", True)])
@pytest.mark.parametrize("scales_mn_major", [False, True])
@pytest.mark.parametrize("config", [(128, 6), (128, 6, 232, True), (128, 6, 232, False, True),
                                    (128, 6, 232, True, True), (192, 4, 240, True),
                                    (192, 4, 240, True, True)],
                         ids=["128", "128-late-spread", "128-shared-spread",
                              "128-late-shared-spread", "192-late-spread",
                              "192-late-shared-spread"])
def test_gpu_gluon_kernel_matches_fp64(seed, counts, out_dtype, mode, accumulate,
                                       scales_mn_major, config):
    """The warp-specialized 1x128 kernel (kernels_gluon.py), called directly, both scale
    layouts, the plan's tile and 128 x 192 (two products a block), the scales
    spread by convert_layout or through the warpgroup's own buffers: experts starting and
    ending inside scale blocks, one inside a single block, empty ones, a hidden and an
    intermediate size that are no multiple of the tile, NaN codes in the neighbours' tokens of
    shared blocks, and more tiles than SMs (programs take several)."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm import kernels_gluon
    hidden, inter = 1160, 1000
    a, b, sa, sb, offsets = _problem(counts, hidden, inter, "fp32x128", "cuda",
                                     scales_mn_major)
    if not kernels_gluon.fits_gluon_kernel(a, b, torch.cuda.get_device_capability()):
        pytest.skip("the Gluon kernel needs a Hopper GPU and Triton 3.6")
    a.view(torch.uint8)[:, 38] = 0x7F     # in the second expert's tokens (or the first's)
    b.view(torch.uint8)[41, :] = 0xFF
    nan_expert = next(e for e, end in enumerate(offsets.tolist()) if end > 41)
    init = torch.randn(len(counts), hidden, inter, device="cuda").to(out_dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    ptrs = (torch.tensor([w[e].data_ptr() for e in range(len(counts))], device="cuda")
            if mode == "discrete" else None)
    kernels_gluon.launch_wgrad_fp8_gluon(a, b, sa, sb, offsets, w, ptrs, out_dtype,
                                         error_flags(a.device), hidden=hidden, inter=inter,
                                         accumulate=accumulate,
                                         config=kernels_gluon.GluonConfig(*config))
    want = _fp64(a, b, sa, sb, counts)
    for e, n in enumerate(counts):
        expected = want[e] + init[e].double().cpu() if accumulate else want[e]
        if accumulate and not n:
            expected = init[e].double().cpu()
        if e != nan_expert:
            assert rel_l2(w[e].cpu(), expected) < _tolerance("fp32x128", "cuda", out_dtype), e
