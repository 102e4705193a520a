"""mHC projection/RMS backward: reference, contract errors, keys, kernels."""
import pytest
import torch

import graphrt
from graphrt import ContractError, UnsupportedError
from graphrt.ops import MhcProjectionBackward, mhc_projection_backward
from graphrt.ops.mhc import mhc_projection_backward_reference

from ..helpers import assert_unchanged, env, needs_interpreter, poison, rel_l2, snapshot


def _inputs(t, k, n=24, n_pad=32, device="cpu"):
    x = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    gp = torch.randn(t, n_pad, device=device)
    gr = torch.randn(t, 1, device=device)
    r = torch.rand(t, 1, device=device) + 0.5
    return x, w, gp, gr, r


def _check(dx, dw, ref_dx, ref_dw, rel=3e-3):
    for out, ref in ((dx, ref_dx), (dw, ref_dw)):
        assert rel_l2(out, ref) < rel
        assert (out.double() - ref.double()).abs().max() <= 1e-2 * ref.double().abs().max()


def test_reference_matches_autograd_fp64(seed):
    x, w, gp, gr, r = _inputs(9, 64, 5, 8)
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_()
    proj = xd @ wd.t()
    rms = xd.pow(2).mean(-1, keepdim=True).sqrt()
    torch.autograd.backward((proj, rms), (gp[:, :5].double(), gr.double()))
    # the op takes r from the forward: give it the same RMS
    dx, dw = mhc_projection_backward_reference(x, w, gp, gr, rms.detach())
    assert rel_l2(dx, xd.grad) < 4e-3 and rel_l2(dw, wd.grad) < 1e-6


def test_functional_cpu_and_padding_columns_ignored(seed):
    x, w, gp, gr, r = _inputs(17, 64)
    dx, dw = mhc_projection_backward(x, w, gp, gr, r, allow_tf32=True)
    gp2 = gp.clone()
    gp2[:, 24:] = 37.0
    dx2, dw2 = mhc_projection_backward(x, w, gp2, gr, r, allow_tf32=True)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2)
    _check(dx, dw, *mhc_projection_backward_reference(x, w, gp, gr, r))


def _errors(device):
    x, w, gp, gr, r = _inputs(16, 64, device=device)
    dx = torch.full((16, 64), float("nan"), dtype=torch.bfloat16, device=device)
    dw = torch.full((24, 64), float("nan"), device=device)
    cases = [
        (dict(allow_tf32=False), UnsupportedError, "allow_tf32"),
        (dict(x=x.half()), ContractError, "x: expected dtype bfloat16, got float16"),
        (dict(weight=w.half()), ContractError, "weight: expected dtype float32"),
        (dict(x=x.t().contiguous().t()), ContractError, "x: expected a compact row-major"),
        (dict(grad_proj=torch.randn(16, 40, device=device)[:, :32]), ContractError,
         "grad_proj: expected a compact row-major"),
        (dict(grad_r=torch.randn(16, 2, device=device)[:, :1]), ContractError,
         "grad_r: expected a compact row-major"),
        (dict(r=gr), ContractError, "r: memory overlaps grad_r"),
        (dict(weight=torch.randn(24, 72, device=device)), ContractError, "weight: expected \\[N, 64\\]"),
        (dict(grad_proj=torch.randn(16, 8, device=device)), ContractError, "at least N=24 columns"),
        (dict(grad_r=torch.randn(15, 1, device=device)), ContractError, "grad_r: expected shape \\(16, 1\\)"),
        (dict(weight=torch.randn(65, 64, device=device)), ContractError, "N must be in \\[1, 64\\]"),
        (dict(dweight=torch.empty(24, 64, dtype=torch.float64, device=device)), ContractError,
         "dweight: expected dtype float32"),
    ]
    for over, exc, pattern in cases:
        args = dict(x=x, weight=w, grad_proj=gp, grad_r=gr, r=r, allow_tf32=True, dx=dx, dweight=dw)
        args.update(over)
        before = snapshot(dx, dw)
        with pytest.raises(exc, match=pattern):
            mhc_projection_backward(**args)
        assert_unchanged(before, (dx, dw))


def test_error_paths_write_nothing_cpu(seed):
    _errors("cpu")


def test_plan_key_excludes_rows(seed):
    a = MhcProjectionBackward.contract_for(*_inputs(4, 64), allow_tf32=True)
    assert MhcProjectionBackward.contract_for(*_inputs(300, 64), allow_tf32=True) == a
    assert MhcProjectionBackward.contract_for(*_inputs(4, 128), allow_tf32=True) != a
    assert MhcProjectionBackward.contract_for(*_inputs(4, 64, n=8), allow_tf32=True) != a


def test_row_groups_follow_the_measured_h200_order():
    # 264 resident programs (132 SMs x 2); docs/perf/mhc.md (mHC v9) has the times these choices won
    from graphrt.ops.mhc.kernels import MAX_GROUPS, row_groups
    assert row_groups(160, 64, 264) == 3     # 4096 x 20480: 97.6 us, against 104.6 with 8
    assert row_groups(224, 256, 264) == 7    # 16384 x 28672: 501.1 us, against 538.3 with 3
    assert row_groups(224, 64, 264) == 1     # 4096 x 28672: 135.2 us, against 143.2 with 7
    assert row_groups(160, 1, 264) == 1
    assert all(1 <= row_groups(kb, rows, 264) <= MAX_GROUPS
               for kb in (1, 7, 160, 1000) for rows in (1, 3, 64, 4096))


@needs_interpreter
@pytest.mark.parametrize("t,k,n,n_pad", [(1, 64, 24, 24), (129, 136, 24, 32), (70, 256, 5, 8)])
def test_triton_kernel_interpreted(seed, t, k, n, n_pad):
    x, w, gp, gr, r = _inputs(t, k, n, n_pad)
    gp[:, n:] = 37.0
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        dx, dw = mhc_projection_backward(x, w, gp, gr, r, allow_tf32=True, runtime=rt)
        plan = rt.plan(MhcProjectionBackward, x, w, gp, gr, r, allow_tf32=True)
        small = torch.empty(plan.workspace_bytes() - 256, dtype=torch.uint8)
        with pytest.raises(ContractError, match="workspace: expected at least"):
            plan.execute(x, w, gp, gr, r, dx=torch.empty_like(dx), dweight=torch.empty_like(dw),
                         workspace=small)
    # the interpreter rounds FP32 -> BF16 by truncation: allow twice the BF16 error for dx
    _check(dx, dw, *mhc_projection_backward_reference(x, w, gp, gr, r), rel=6e-3)


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("t,k,n,n_pad", [(1, 20480, 24, 24), (129, 20480, 24, 32), (4096, 20480, 24, 24),
                                         (333, 28672, 24, 32), (64, 8, 1, 1), (100, 1000, 64, 64)])
def test_gpu_matches_fp64_reference(seed, t, k, n, n_pad):
    x, w, gp, gr, r = _inputs(t, k, n, n_pad, "cuda")
    gp[:, n:] = 37.0
    dx = torch.full((t, k), float("nan"), dtype=torch.bfloat16, device="cuda")
    dw = torch.full((n, k), float("nan"), device="cuda")
    mhc_projection_backward(x, w, gp, gr, r, allow_tf32=True, dx=dx, dweight=dw)
    _check(dx, dw, *mhc_projection_backward_reference(x, w, gp, gr, r))
    again = mhc_projection_backward(x, w, gp, gr, r, allow_tf32=True)
    assert torch.equal(again.dx, dx) and torch.equal(again.dweight, dw)


@pytest.mark.gpu
def test_gpu_one_compile_across_rows(seed):
    from graphrt.ops.mhc import kernels
    rt = graphrt.Runtime("cuda")
    mhc_projection_backward(*_inputs(8, 20480, device="cuda"), allow_tf32=True, runtime=rt)
    before = sum(len(c[0]) for c in kernels._mhc_bwd_kernel.device_caches.values())
    for t in (1, 129, 4096, 16384):
        mhc_projection_backward(*_inputs(t, 20480, device="cuda"), allow_tf32=True, runtime=rt)
    torch.cuda.synchronize()
    assert rt.plans.stats()["compiles"] == 1
    assert sum(len(c[0]) for c in kernels._mhc_bwd_kernel.device_caches.values()) == before


@pytest.mark.gpu
def test_gpu_capture_replay_after_in_place_mutation(seed):
    x, w, gp, gr, r = _inputs(1000, 20480, device="cuda")
    plan = MhcProjectionBackward(x, w, gp, gr, r, allow_tf32=True).compile()
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    ws = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.execute(x, w, gp, gr, r, dx=dx, dweight=dw, workspace=ws)
    torch.cuda.current_stream().wait_stream(side)
    first_dx, first_dw = dx.clone(), dw.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(x, w, gp, gr, r, dx=dx, dweight=dw, workspace=ws)
    poison(dx, dw)
    graph.replay()
    assert torch.equal(dx, first_dx) and torch.equal(dw, first_dw)
    x.mul_(0.5)
    gp.mul_(0.625)
    poison(dx, dw)
    graph.replay()
    _check(dx, dw, *mhc_projection_backward_reference(x, w, gp, gr, r))


@pytest.mark.gpu
def test_gpu_error_paths_write_nothing(seed):
    _errors("cuda")


@pytest.mark.gpu
def test_gpu_module_backward(seed):
    stage = graphrt.nn.MhcProjection(2048, 24, n_pad=32, device="cuda")
    x = torch.randn(256, 2048, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    proj, r = stage(x)
    gp, gr = torch.randn_like(proj), torch.randn_like(r)
    torch.autograd.backward((proj, r), (gp, gr))
    xd = x.detach().double().requires_grad_()
    wd = stage.weight.detach().double().requires_grad_()
    torch.autograd.backward((xd @ wd.t(), xd.pow(2).mean(-1, keepdim=True).sqrt()),
                            (gp[:, :24].double(), gr.double()))
    assert rel_l2(x.grad, xd.grad) < 5e-3 and rel_l2(stage.weight.grad, wd.grad) < 3e-3


@needs_interpreter
@pytest.mark.parametrize("term", ["projection", "rms"])
def test_interpreted_kernel_each_term_of_dx_alone(seed, term):
    """dx = P @ W + grad_r / (r K) * x: at K = 20480 the RMS term is 0.2% of dx, under any
    tolerance on the sum, so each term is checked alone (the other one zeroed)."""
    x, w, gp, gr, r = _inputs(33, 136)
    if term == "projection":
        gr.zero_()
    else:
        gp.zero_()
    with env(GRAPHRT_BACKEND="triton"):
        dx, dw = mhc_projection_backward(x, w, gp, gr, r, allow_tf32=True,
                                         runtime=graphrt.Runtime("cpu"))
    ref_dx, ref_dw = mhc_projection_backward_reference(x, w, gp, gr, r)
    assert rel_l2(dx, ref_dx) < 6e-3
    if term == "projection":
        # dweight is FP32 P^T x from split products: far tighter than the BF16 dx
        assert rel_l2(dw, ref_dw) < 1e-4
    else:
        assert torch.equal(dw, torch.zeros_like(dw))
