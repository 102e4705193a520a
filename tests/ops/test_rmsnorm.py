"""RMSNorm train forward/backward: reference, contract errors, plan keys, kernels."""
import pytest
import torch

import graphrt
from graphrt import ContractError
from graphrt.ops import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward
from graphrt.ops.rmsnorm import rmsnorm_backward_reference, rmsnorm_forward_reference

from ..helpers import (assert_unchanged, env, needs_interpreter, no_tensor_allocation, poison,
                       rel_l2, snapshot)

BF16 = torch.bfloat16


def _inputs(shape, device="cpu", w_dtype=torch.float32, residual=False):
    x = torch.randn(shape, dtype=BF16, device=device)
    w = (1 + 0.5 * torch.randn(shape[-1], device=device)).to(w_dtype)
    res = torch.randn(shape, dtype=BF16, device=device) if residual else None
    return x, w, res


def _autograd_fp64(x, w, eps, g, residual=None):
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_()
    h = xd if residual is None else (xd + residual.double())
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * wd
    y.backward(g.double())
    return y.detach(), xd.grad, wd.grad


# -- the reference against torch.autograd in FP64 -------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 8), (7, 64), (2, 3, 136)])
@pytest.mark.parametrize("w_dtype", [torch.float32, BF16])
def test_reference_matches_fp64_autograd(seed, shape, w_dtype):
    x, w, _ = _inputs(shape, w_dtype=w_dtype)
    g = torch.randn(shape, dtype=BF16)
    y, rstd, _ = rmsnorm_forward_reference(x, w, 1e-6)
    dx, dw = rmsnorm_backward_reference(g, x, w, rstd)
    ref_y, ref_dx, ref_dw = _autograd_fp64(x, w, 1e-6, g)
    assert rel_l2(y, ref_y) < 4e-3
    assert rel_l2(dx, ref_dx) < 4e-3
    assert rel_l2(dw, ref_dw) < 1e-6
    assert dw.dtype == torch.float32 and rstd.dtype == torch.float32


def test_reference_residual_matches_fp64_autograd(seed):
    x, w, res = _inputs((5, 32), residual=True)
    g = torch.randn(5, 32, dtype=BF16)
    y, rstd, h = rmsnorm_forward_reference(x, w, 1e-5, res)
    assert torch.equal(h, (x.float() + res.float()).to(BF16))
    dx, dw = rmsnorm_backward_reference(g, h, w, rstd)
    # autograd on the rounded h gives the same gradient as on x + residual
    ref_y, ref_dh, ref_dw = _autograd_fp64(h, w, 1e-5, g)
    assert rel_l2(y, ref_y) < 4e-3 and rel_l2(dx, ref_dh) < 4e-3 and rel_l2(dw, ref_dw) < 1e-6


def test_functional_cpu_runs_reference_and_result_names(seed):
    x, w, res = _inputs((3, 5, 64), residual=True)
    r = rmsnorm_forward(x, w, residual=res)
    assert r.names == ("y", "rstd", "h_new") and r.rstd.shape == (3, 5)
    out = rmsnorm_backward(torch.randn_like(x), r.h_new, w, r.rstd, g_residual=torch.randn_like(x))
    assert out.names == ("dx", "dw") and out.dx.shape == x.shape and out.dw.dtype == torch.float32


# -- contract errors: each names the argument and writes nothing ----------------------------------
def _bwd_case(**over):
    x, w, _ = _inputs((6, 64))
    args = dict(g=torch.randn(6, 64, dtype=BF16), x=x, w=w, rstd=torch.rand(6) + 0.5,
                dx=torch.empty(6, 64, dtype=BF16), dw=torch.empty(64))
    args.update(over)
    return args


BAD_BACKWARD = {
    "dtype": (dict(g=torch.randn(6, 64)), "g: expected dtype bfloat16"),
    "weight dtype": (dict(w=torch.randn(64, dtype=torch.float16)), "w: expected dtype"),
    "shape": (dict(g=torch.randn(5, 64, dtype=BF16)), "g: expected 6 rows"),
    "weight shape": (dict(w=torch.randn(32)), "w: expected a contiguous \\[64\\]"),
    "rstd shape": (dict(rstd=torch.rand(5)), "rstd: expected 6 contiguous"),
    "stride": (dict(x=torch.randn(64, 6, dtype=BF16).t()), "x: layout not supported"),
    "row stride": (dict(g=torch.randn(6, 68, dtype=BF16)[:, :64]), "g: layout not supported.*16 bytes"),
    "hidden % 8": (dict(g=torch.randn(6, 12, dtype=BF16), x=torch.randn(6, 12, dtype=BF16),
                        w=torch.randn(12), dx=torch.empty(6, 12, dtype=BF16), dw=torch.empty(12)),
                   "H must be a multiple of 8"),
    "hidden too large": (dict(g=torch.randn(1, 32776, dtype=BF16), x=torch.randn(1, 32776, dtype=BF16),
                              w=torch.randn(32776), rstd=torch.rand(1), dx=torch.empty(1, 32776, dtype=BF16),
                              dw=torch.empty(32776)), "H must be a multiple of 8 in \\[8, 32768\\]"),
    "device": (dict(w=torch.randn(64, device="meta")), "w: expected device cpu"),
    "dx dtype": (dict(dx=torch.empty(6, 64)), "dx: expected dtype bfloat16"),
    "dw dtype": (dict(dw=torch.empty(64, dtype=torch.float16)), "dw: expected dtype float32"),
}


@pytest.mark.parametrize("case", sorted(BAD_BACKWARD))
def test_backward_contract_errors_write_nothing(seed, case):
    over, pattern = BAD_BACKWARD[case]
    args = _bwd_case(**over)
    for name in ("dx", "dw"):
        if args[name].device.type != "meta":
            poison(args[name])
    before = snapshot(args["dx"], args["dw"])
    with pytest.raises(ContractError, match=pattern):
        rmsnorm_backward(args["g"], args["x"], args["w"], args["rstd"], dx=args["dx"], dw=args["dw"])
    assert_unchanged(before, (args["dx"], args["dw"]))


def test_backward_rejects_outputs_overlapping_inputs(seed):
    args = _bwd_case()
    g = args["g"]
    before = snapshot(g)
    with pytest.raises(ContractError, match="dx: memory overlaps g"):
        rmsnorm_backward(g, args["x"], args["w"], args["rstd"], dx=g, dw=args["dw"])
    assert_unchanged(before, (g,))


def test_forward_contract_errors_write_nothing(seed):
    x, w, res = _inputs((4, 64), residual=True)
    y, rstd = torch.full((4, 64), float("nan"), dtype=BF16), torch.full((4,), float("nan"))
    before = snapshot(y, rstd)
    for kwargs, pattern in [
        (dict(x=x.float()), "x: expected dtype bfloat16"),
        (dict(residual=res[:3]), "residual: expected 4 rows"),
        (dict(y=torch.empty(4, 64, dtype=BF16)[:, :32]), "y: expected last dim 64"),
        (dict(rstd=torch.empty(4, dtype=torch.float64)), "rstd: expected dtype float32"),
        (dict(eps=-1.0), "eps: expected a positive finite float"),
        (dict(eps=float("nan")), "eps: expected a positive finite float"),
        (dict(y=x), "y: memory overlaps x"),
        (dict(x="not a tensor"), "x: expected a torch.Tensor"),
    ]:
        call = dict(x=x, w=w, eps=1e-6, residual=None, y=y, rstd=rstd)
        call.update(kwargs)
        if call["residual"] is not None:
            call["h_new"] = torch.empty(4, 64, dtype=BF16)
        with pytest.raises(ContractError, match=pattern):
            rmsnorm_forward(call.pop("x"), call.pop("w"), **call)
        assert_unchanged(before, (y, rstd))


@needs_interpreter
def test_too_small_workspace_is_rejected(seed):
    with env(GRAPHRT_BACKEND="triton"):
        args = _bwd_case()
        plan = RmsNormBackward(args["g"], args["x"], args["w"], args["rstd"]).compile()
        assert plan.workspace_bytes() > 0
        poison(args["dx"], args["dw"])
        before = snapshot(args["dx"], args["dw"])
        small = torch.empty(plan.workspace_bytes() - 256, dtype=torch.uint8)
        for ws, pattern in [(None, "workspace: this plan needs"), (small, "workspace: expected at least")]:
            with pytest.raises(ContractError, match=pattern):
                plan.execute(args["g"], args["x"], args["w"], args["rstd"], dx=args["dx"],
                             dw=args["dw"], workspace=ws)
        assert_unchanged(before, (args["dx"], args["dw"]))


# -- plan-store keys ------------------------------------------------------------------------------
def test_plan_keys_exclude_rows_and_include_static_facts(seed):
    def key(shape, w_dtype=torch.float32, residual=False, x_dtype=BF16, cls=RmsNormForward):
        x, w, res = _inputs(shape, w_dtype=w_dtype, residual=residual)
        return cls.contract_for(x.to(x_dtype), w, residual=res)

    base = key((4, 64))
    assert key((37, 64)) == base and key((2, 3, 64)) == base          # rows are run-time extents
    assert key((4, 128)) != base                                       # H
    assert key((4, 64), w_dtype=BF16) != base                          # weight dtype
    assert key((4, 64), residual=True) != base                         # residual flag
    assert key((4, 64), x_dtype=torch.float16) != base                 # activation dtype
    x, w, _ = _inputs((4, 64))
    padded = torch.randn(4, 72, dtype=BF16)[:, :64]
    assert RmsNormForward.contract_for(padded, w) == base              # padded rows read in place
    assert RmsNormForward.contract_for(x, w, eps=1e-5) != base


def test_one_plan_serves_every_row_count(seed):
    rt = graphrt.Runtime("cpu")
    for rows in (1, 37, 128):
        x, w, _ = _inputs((rows, 64))
        y, rstd = rmsnorm_forward(x, w, runtime=rt)
        rmsnorm_backward(torch.randn_like(x), x, w, rstd, runtime=rt)
    s = rt.plans.stats()
    assert s["compiles"] == 2 and s["hits"] == 4


# -- Triton kernels under the interpreter ---------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("shape", [(1, 8), (5, 24), (33, 64), (1000, 64), (3, 9000)])
@pytest.mark.parametrize("w_dtype", [torch.float32, BF16])
def test_triton_kernels_interpreted(seed, shape, w_dtype):
    x, w, res = _inputs(shape, w_dtype=w_dtype, residual=True)
    g, g_res = torch.randn(shape, dtype=BF16), torch.randn(shape, dtype=BF16)
    rt = graphrt.Runtime("cpu")
    with env(GRAPHRT_BACKEND="triton"):
        y, rstd, h = (torch.full(shape, float("nan"), dtype=BF16), torch.full(shape[:-1], float("nan")),
                      torch.full(shape, float("nan"), dtype=BF16))
        rmsnorm_forward(x, w, residual=res, y=y, rstd=rstd, h_new=h, runtime=rt)
        dx, dw = rmsnorm_backward(g, h, w, rstd, g_residual=g_res, runtime=rt)
        y2, rstd2 = rmsnorm_forward(x, w, runtime=rt)
    ref_y, ref_rstd, ref_h = rmsnorm_forward_reference(x, w, 1e-6, res)
    # the interpreter rounds FP32 -> BF16 by truncation, so h may sit one BF16 ulp off
    assert (h.float() - ref_h.float()).abs().le(ref_h.float().abs() * 2 ** -7 + 1e-6).all()
    ref_y, ref_rstd, _ = rmsnorm_forward_reference(h, w, 1e-6)
    assert rel_l2(y, ref_y) < 1e-2 and rel_l2(rstd, ref_rstd) < 1e-5
    ref_dx, ref_dw = rmsnorm_backward_reference(g, h, w, rstd, g_res)
    assert rel_l2(dx, ref_dx) < 1e-2 and rel_l2(dw, ref_dw) < 1e-5
    ref_y2, ref_rstd2, _ = rmsnorm_forward_reference(x, w, 1e-6)
    assert rel_l2(y2, ref_y2) < 1e-2 and rel_l2(rstd2, ref_rstd2) < 1e-5


# -- GPU --------------------------------------------------------------------------------------------
GPU_SHAPES = [(1, 8), (1, 4096), (37, 4096), (129, 5120), (4, 32768), (1000, 7168), (3, 7, 2048),
              (513, 16392)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("w_dtype", [torch.float32, BF16])
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_kernels_match_reference(seed, shape, w_dtype, residual):
    x, w, res = _inputs(shape, "cuda", w_dtype, residual)
    y = torch.full(shape, float("nan"), dtype=BF16, device="cuda")
    rstd = torch.full(shape[:-1], float("nan"), device="cuda")
    h = torch.full(shape, float("nan"), dtype=BF16, device="cuda") if residual else None
    rmsnorm_forward(x, w, residual=res, y=y, rstd=rstd, h_new=h)
    ref_y, ref_rstd, ref_h = rmsnorm_forward_reference(x, w, 1e-6, res)
    if residual:
        assert torch.equal(h, ref_h)
    assert rel_l2(y, ref_y) < 5e-3 and rel_l2(rstd, ref_rstd) < 1e-5
    xin = h if residual else x
    g = torch.randn(shape, dtype=BF16, device="cuda")
    g_res = torch.randn(shape, dtype=BF16, device="cuda") if residual else None
    dx = torch.full(shape, float("nan"), dtype=BF16, device="cuda")
    dw = torch.full(shape[-1:], float("nan"), device="cuda")
    rmsnorm_backward(g, xin, w, rstd, g_residual=g_res, dx=dx, dw=dw)
    ref_dx, ref_dw = rmsnorm_backward_reference(g, xin, w, rstd, g_res)
    assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5


@pytest.mark.gpu
def test_gpu_padded_rows_read_in_place(seed):
    base = torch.randn(64, 4160, dtype=BF16, device="cuda")
    x = base[:, :4096]
    w = torch.randn(4096, device="cuda")
    y_base = torch.full((64, 4224), float("nan"), dtype=BF16, device="cuda")
    y = y_base[:, :4096]
    _, rstd = rmsnorm_forward(x, w, y=y)
    assert rel_l2(y, rmsnorm_forward_reference(x, w, 1e-6)[0]) < 5e-3
    assert torch.isnan(y_base[:, 4096:].float()).all()  # padding untouched
    g = torch.randn(64, 4160, dtype=BF16, device="cuda")[:, :4096]
    dx, dw = rmsnorm_backward(g, x, w, rstd)
    ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd)
    assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (4097, 7168), (3, 32768)])
def test_gpu_dw_bitwise_reproducible(seed, shape):
    x, w, _ = _inputs(shape, "cuda")
    g = torch.randn(shape, dtype=BF16, device="cuda")
    _, rstd = rmsnorm_forward(x, w)
    first = rmsnorm_backward(g, x, w, rstd)
    for _ in range(3):
        again = rmsnorm_backward(g, x, w, rstd)
        assert torch.equal(again.dw, first.dw) and torch.equal(again.dx, first.dx)


def _triton_cache_size():
    from graphrt import reduction
    from graphrt.ops.rmsnorm import kernels
    total = 0
    for k in (kernels._rmsnorm_fwd_rows_kernel, kernels._rmsnorm_bwd_rows_kernel,
              reduction._sum_partials_kernel):
        for cache in k.device_caches.values():
            total += len(cache[0])
    return total


@pytest.mark.gpu
def test_gpu_one_compile_across_row_counts(seed):
    rt = graphrt.Runtime("cuda", arena_bytes=64 << 20)
    x, w, _ = _inputs((8, 5120), "cuda")
    _, rstd = rmsnorm_forward(x, w, runtime=rt)
    rmsnorm_backward(torch.randn_like(x), x, w, rstd, runtime=rt)
    kernels_before = _triton_cache_size()
    for rows in (1, 37, 4096, 16384):
        x, w2, _ = _inputs((rows, 5120), "cuda")
        _, rstd = rmsnorm_forward(x, w, runtime=rt)
        rmsnorm_backward(torch.randn_like(x), x, w, rstd, runtime=rt)
    torch.cuda.synchronize()
    assert rt.plans.stats()["compiles"] == 2
    assert _triton_cache_size() == kernels_before, "Triton recompiled for a new row count"


@pytest.mark.gpu
def test_gpu_execute_no_sync_no_allocation(seed):
    x, w, res = _inputs((300, 2048), "cuda", residual=True)
    fwd = RmsNormForward(x, w, residual=res).compile()
    bwd = RmsNormBackward(x, x, w, torch.empty(300, device="cuda")).compile()
    y, h = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(300, device="cuda")
    g, dx, dw = torch.randn_like(x), torch.empty_like(x), torch.empty(2048, device="cuda")
    ws = torch.empty(bwd.workspace_bytes(), dtype=torch.uint8, device="cuda")
    for _ in range(2):  # the first run includes Triton's JIT
        torch.cuda.set_sync_debug_mode("error")
        try:
            with no_tensor_allocation():
                fwd.execute(x, w, residual=res, y=y, rstd=rstd, h_new=h)
                bwd.execute(g, h, w, rstd, dx=dx, dw=dw, workspace=ws)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    ref_dx, ref_dw = rmsnorm_backward_reference(g, h, w, rstd)
    assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5


@pytest.mark.gpu
def test_gpu_execute_captured_in_cuda_graph(seed):
    shape = (777, 4096)
    x, w, _ = _inputs(shape, "cuda")
    g = torch.randn(shape, dtype=BF16, device="cuda")
    y, rstd = torch.empty_like(x), torch.empty(shape[0], device="cuda")
    dx, dw = torch.empty_like(x), torch.empty(shape[1], device="cuda")
    fwd = RmsNormForward(x, w).compile()
    bwd = RmsNormBackward(g, x, w, rstd).compile()
    ws = torch.empty(bwd.workspace_bytes(), dtype=torch.uint8, device="cuda")

    def step():
        fwd.execute(x, w, y=y, rstd=rstd)
        bwd.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for scale in (0.5, -1.25):
        x.mul_(scale)
        g.copy_(torch.randn_like(g))
        poison(y, rstd, dx, dw)
        graph.replay()
        ref_y, ref_rstd, _ = rmsnorm_forward_reference(x, w, 1e-6)
        ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, ref_rstd)
        assert rel_l2(y, ref_y) < 5e-3 and rel_l2(rstd, ref_rstd) < 1e-5
        assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5


# -- inputs where eps and rstd matter (N(0,1) rows hide them: rstd is about 1) ----------------------
def _scaled_rows(shape, kind):
    x = torch.randn(shape)
    if kind == "tiny":
        x = x * 1e-3                       # mean(x^2) ~ 1e-6 = eps
    elif kind == "large":
        x = x * 30                         # rstd ~ 1/30
    else:                                  # near-constant rows
        x = 0.5 + 1e-3 * x
    return x.to(BF16)


@needs_interpreter
@pytest.mark.parametrize("shape", [(5, 24), (3, 9000)])          # rows kernel, chunked kernel
@pytest.mark.parametrize("kind", ["tiny", "large", "constant"])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_interpreted_kernels_where_eps_and_rstd_matter(seed, shape, kind, eps):
    x = _scaled_rows(shape, kind)
    w = (1 + 0.5 * torch.randn(shape[-1])).float()
    g = torch.randn(shape, dtype=BF16)
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        y, rstd = rmsnorm_forward(x, w, eps=eps, runtime=rt)
        dx, dw = rmsnorm_backward(g, x, w, rstd, runtime=rt)
    ref_y, ref_dx, ref_dw = _autograd_fp64(x, w, eps, g)
    ref_rstd = torch.rsqrt(x.double().pow(2).mean(-1) + eps)
    assert rel_l2(rstd, ref_rstd) < 1e-5
    assert rel_l2(y, ref_y) < 1e-2
    assert rel_l2(dx, ref_dx) < 1e-2 and rel_l2(dw, ref_dw) < 1e-4
