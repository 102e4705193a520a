"""CUDA-graph capture on the GPU: fragments, whole steps, pools, arena, fork/join, randomness."""
import copy

import pytest
import torch

import graphrt
from graphrt import ArenaExhausted, CaptureError, ContractError
from graphrt.models import Stack, eager_step_fn, mse
from graphrt.capture import TokenBuckets, capture, fork, graph_step, uniform_, verify_replay
from graphrt.ops import rmsnorm_backward, rmsnorm_forward
from graphrt.ops.rmsnorm import rmsnorm_backward_reference, rmsnorm_forward_reference

from ..helpers import assert_steps_equal_eager, poison, rel_l2

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _norm_inputs(rows=512, hidden=1024):
    x = torch.randn(rows, hidden, dtype=BF16, device="cuda")
    w = 1 + 0.1 * torch.randn(hidden, device="cuda")
    g = torch.randn(rows, hidden, dtype=BF16, device="cuda")
    return x, w, g


def _norm_step(x, w, g):
    y, rstd = rmsnorm_forward(x, w)
    dx, dw = rmsnorm_backward(g, x, w, rstd)
    return y, dx, dw


def test_fragment_replays_fresh_inputs_and_checks_arguments(seed):
    x, w, g = _norm_inputs()
    frag = capture(_norm_step, x, w, g)
    assert frag.nodes()["kernel"] >= 3 and frag.workspace_bytes > 0
    for _ in range(3):
        nx, ng = torch.randn_like(x), torch.randn_like(g)
        poison(*frag.outputs)
        y, dx, dw = frag(nx, w, ng)
        ref_y, ref_rstd, _ = rmsnorm_forward_reference(nx, w, 1e-6)
        ref_dx, ref_dw = rmsnorm_backward_reference(ng, nx, w, ref_rstd)
        assert rel_l2(y, ref_y) < 5e-3 and rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5
    copies = frag(x, w, g, clone=True)
    assert copies[0].data_ptr() != frag.outputs[0].data_ptr()
    for bad, pattern in [((x[:10], w, g), "captured with \\(512, 1024\\)"),
                         ((x.float(), w, g), "bfloat16"),
                         ((x.cpu(), w, g), "cuda"),
                         ((x, w), "captured with 3 inputs")]:
        with pytest.raises(ContractError, match=pattern):
            frag(*bad)
    frag.release()
    with pytest.raises(CaptureError, match="released"):
        frag(x, w, g)


def test_stack_backward_graph_equals_eager_bitwise(seed):
    torch.manual_seed(0)
    eager_model = Stack(256, 512, 4, device="cuda")
    graph_model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-3, capturable=True)
    graph_opt = torch.optim.AdamW(graph_model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(128, 256, dtype=BF16, device="cuda")
    y = torch.randn(128, 256, dtype=BF16, device="cuda")
    step = graph_step(graph_model, mse, (x, y), graph_opt)
    for p, q in zip(eager_model.parameters(), graph_model.parameters()):
        assert torch.equal(p, q), "warm-up changed the model"
    assert step.nodes()["kernel"] > 20
    assert_steps_equal_eager(step, graph_model, eager_model, eager_opt, mse, x, y)


def test_forward_and_backward_fragments_share_the_pool(seed):
    rt = graphrt.Runtime("cuda")
    x, w, g = _norm_inputs()
    fwd = capture(lambda x, w: rmsnorm_forward(x, w, runtime=rt), x, w, runtime=rt)
    y_static, rstd_static = fwd.outputs
    bwd = capture(lambda g, x, w, r: rmsnorm_backward(g, x, w, r, runtime=rt),
                  g, x, w, rstd_static, runtime=rt)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.copy_(torch.randn_like(g))
        poison(y_static, rstd_static, *bwd.outputs)
        fwd.replay()
        dx, dw = bwd(g, x, w, rstd_static)  # same tensors: no copies
        ref_y, ref_rstd, _ = rmsnorm_forward_reference(x, w, 1e-6)
        ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, ref_rstd)
        assert rel_l2(y_static, ref_y) < 5e-3 and rel_l2(rstd_static, ref_rstd) < 1e-5
        assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5
    report = verify_replay(bwd, lambda g, x, w, r: rmsnorm_backward(g, x, w, r, runtime=rt),
                           lambda i: (torch.randn_like(g), x, w, rstd_static), steps=3)
    assert report.ok, str(report)


def test_workspace_addresses_stay_reserved(seed):
    rt = graphrt.Runtime("cuda", arena_bytes=16 << 20)
    x, w, g = _norm_inputs()
    _, rstd = rmsnorm_forward(x, w, runtime=rt)
    frag = capture(lambda g, x, w, r: rmsnorm_backward(g, x, w, r, runtime=rt), g, x, w, rstd,
                   runtime=rt)
    held = frag.workspace_bytes
    assert held > 0 and rt.arena.stats()["in_use"] >= held
    with rt.arena.scope():
        other = rt.arena.take(held)
        other.fill_(255)  # eager use of the arena must not touch the fragment's workspace
        dx, dw = frag(g, x, w, rstd)
    ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd)
    assert rel_l2(dx, ref_dx) < 5e-3 and rel_l2(dw, ref_dw) < 1e-5
    frag.release()   # what may be left: a region the warm-ups' bound call keeps
    stats = rt.arena.stats()
    assert stats["live_regions"] == stats["kept_regions"] and stats["pinned_bytes"] == 0


def test_arena_exhaustion_during_capture_leaves_runtime_usable(seed):
    rt = graphrt.Runtime("cuda", arena_bytes=1024)
    x, w, g = _norm_inputs()
    _, rstd = rmsnorm_forward(x, w, runtime=rt)

    def warm_outside_arena(g, x, w, r):
        return rmsnorm_backward(g, x, w, r, runtime=rt)

    # the warm-up already needs the workspace, so exhaustion shows before the capture too
    with pytest.raises(ArenaExhausted):
        capture(warm_outside_arena, g, x, w, rstd, runtime=rt)
    assert not torch.cuda.is_current_stream_capturing()
    # exhaustion inside the capture itself: the warm-up takes no workspace, the capture does
    calls = {"n": 0}

    def needs_workspace_only_when_captured(g, x, w, r):
        calls["n"] += 1
        if torch.cuda.is_current_stream_capturing():
            return rmsnorm_backward(g, x, w, r, runtime=rt)
        return g * 2

    with pytest.raises(ArenaExhausted, match="during capture"):
        capture(needs_workspace_only_when_captured, g, x, w, rstd, runtime=rt)
    assert not torch.cuda.is_current_stream_capturing()
    assert rt.arena.stats()["in_use"] == 0
    frag = capture(lambda x: rmsnorm_forward(x, w, runtime=rt), x, runtime=rt)
    y, _ = frag(torch.randn_like(x))
    assert not torch.isnan(y.float()).any()


def test_fork_join_shows_a_parallel_branch(seed):
    a = torch.randn(2048, 2048, dtype=BF16, device="cuda")
    b = torch.randn(2048, 2048, dtype=BF16, device="cuda")

    def step(a, b):
        with fork() as branch:
            side = a.t() @ b          # e.g. a weight gradient
        main = a @ b                  # e.g. an input gradient
        branch.join()
        return main, side

    frag = capture(step, a, b)
    shape = frag.shape()
    assert shape["max_parallel_kernels"] >= 2, shape
    main, side = frag(torch.randn_like(a), b)
    assert rel_l2(main, frag.inputs[0] @ b) < 1e-2 and rel_l2(side, frag.inputs[0].t() @ b) < 1e-2


def test_random_values_fresh_per_replay_and_reproducible(seed):
    rt = graphrt.runtime("cuda")
    out = torch.empty(1 << 16, device="cuda")
    rt.rng.set(1234, 0)
    frag = capture(lambda o: uniform_(o, rt.rng), out)
    assert rt.rng.get() == (1234, 0), "warm-up consumed random numbers"
    start = rt.rng.snapshot()
    first = frag(out, clone=True)
    second = frag(out, clone=True)
    assert not torch.equal(first, second)
    assert rt.rng.get() == (1234, 2 * out.numel())
    assert 0.49 < first.mean().item() < 0.51 and first.min() >= 0 and first.max() < 1
    rt.rng.restore(start)
    assert torch.equal(uniform_(torch.empty_like(out), rt.rng), first)
    assert torch.equal(uniform_(torch.empty_like(out), rt.rng), second)
    report = verify_replay(frag, lambda o: uniform_(torch.empty_like(o), rt.rng).clone(),
                           lambda i: (out,), steps=2)
    assert report.ok, str(report)


def test_verify_replay_catches_a_wrong_eager_function(seed):
    x, w, _ = _norm_inputs()
    frag = capture(lambda x: rmsnorm_forward(x, w)[0], x)
    good = verify_replay(frag, lambda x: rmsnorm_forward(x, w)[0], lambda i: (torch.randn_like(x),))
    assert good.ok and len(good.checks) == 6, str(good)
    bad = verify_replay(frag, lambda x: rmsnorm_forward(x, w * 1.01)[0],
                        lambda i: (torch.randn_like(x),))
    assert not bad.ok


def test_host_sync_in_step_is_a_clear_error_naming_the_line(seed):
    model = Stack(64, 128, 1, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(16, 64, dtype=BF16, device="cuda")
    before = [p.detach().clone() for p in model.parameters()]

    def loss_with_sync(out, target):
        loss = mse(out, target)
        if loss.item() > 1e9:  # a host sync
            raise AssertionError
        return loss

    with pytest.raises(CaptureError, match="synchronizes with the host") as info:
        graph_step(model, loss_with_sync, (x, x), opt)
    assert f"test_capture_gpu.py:{loss_with_sync.__code__.co_firstlineno + 2}" in str(info.value)
    assert "loss.item()" in str(info.value)
    assert not torch.cuda.is_current_stream_capturing()
    # everything is as it was: parameters, no gradients, a usable optimizer and runtime
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters())
    assert torch.isfinite(eager_step_fn(model, opt)(x, x)).all()
    step = graph_step(model, mse, (x, x), opt)
    assert torch.isfinite(step(x, x)).all()
    y, _ = rmsnorm_forward(x, torch.ones(64, device="cuda"))
    assert torch.isfinite(y.float()).all()


def test_sync_only_outside_capture_is_not_rejected(seed):
    """Code that syncs eagerly and skips it while a stream captures (as Hugging Face's mask
    preparation does) captures, as it would with torch.cuda.graph."""
    x, w, _ = _norm_inputs()
    eager_syncs = []

    def fn(x):
        if not torch.cuda.is_current_stream_capturing():
            eager_syncs.append(bool((x[:, -1] == 0).all()))   # a host sync, eager only
        return rmsnorm_forward(x, w)[0]

    frag = capture(fn, x)
    assert eager_syncs  # the warm-ups ran it
    nx = torch.randn_like(x)
    assert torch.equal(frag(nx), rmsnorm_forward(nx, w)[0])


def test_sync_inside_a_model_names_the_models_line(seed):
    class Syncs(torch.nn.Module):
        def forward(self, x):
            scale = float(x.abs().max())   # a host sync inside the model
            return x / scale

    x = torch.randn(8, 8, device="cuda")
    with pytest.raises(CaptureError) as info:
        capture(Syncs(), x)
    assert "float(x.abs().max())" in str(info.value) and "in forward" in str(info.value)
    frag = capture(lambda x: x * 2, x)            # the runtime and its pool still work
    assert torch.equal(frag(x), x * 2)


def test_token_buckets_replay_variable_token_counts(seed):
    hidden = 512
    w = 1 + 0.1 * torch.randn(hidden, device="cuda")
    layer = TokenBuckets(lambda x: rmsnorm_forward(x, w)[0], buckets=(256, 1024))
    for tokens in (100, 256, 300, 1000, 77):
        x = torch.randn(tokens, hidden, dtype=BF16, device="cuda")
        y = layer(x)
        assert y.shape == x.shape
        assert rel_l2(y, rmsnorm_forward_reference(x, w, 1e-6)[0]) < 5e-3
    report = layer.memory_report()
    assert [r["bucket"] for r in report] == [256, 1024]
    assert [r["replays"] for r in report] == [3, 2]
    assert all(r["memory_bytes"] >= 0 for r in report)
    with pytest.raises(ContractError, match="exceeds the largest bucket"):
        layer(torch.randn(2000, hidden, dtype=BF16, device="cuda"))


class _SyncsBetweenLayers(torch.nn.Module):
    """A model graph_step cannot capture: it reads a value on the host between its layers."""

    def __init__(self, hidden=256, layers=3):
        super().__init__()
        from graphrt.models import Block
        self.blocks = torch.nn.ModuleList(Block(hidden, 2 * hidden, device="cuda")
                                          for _ in range(layers))
        self.seen = []

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            self.seen.append(float(x.detach().float().abs().max()))   # a host sync between layers
        return x


def test_graph_modules_trains_a_model_with_syncs_between_layers_like_eager(seed):
    from graphrt.capture import graph_modules
    eager = _SyncsBetweenLayers()
    graphed = copy.deepcopy(eager)
    x = torch.randn(128, 256, dtype=BF16, device="cuda")
    with pytest.raises(CaptureError, match="synchronizes with the host"):
        graph_step(graphed, mse, (x, x))
    report = graph_modules(graphed, graphed.blocks, (x,))
    assert report.graphed == ["blocks.0", "blocks.1", "blocks.2"]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, graphed)]
    for step in range(5):
        bx, by = torch.randn_like(x), torch.randn_like(x)
        for model, opt in zip((eager, graphed), opts):
            opt.zero_grad(set_to_none=True)
            loss = mse(model(bx), by)
            loss.backward()
            opt.step()
        for (name, p), q in zip(eager.named_parameters(), graphed.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {step}: grad of {name}"
            assert torch.equal(p, q), f"step {step}: {name}"
    assert all(c == {"graph": 5, "eager": 0} for c in report.calls.values()), report.report()
    graphed.blocks[0](torch.randn(64, 256, dtype=BF16, device="cuda"))   # another shape: eager
    assert report.calls["blocks.0"]["eager"] == 1 and "shape" in report.eager_reasons["blocks.0"]
    assert "3 modules run as CUDA graphs" in report.report()
    report.restore()
    assert "forward" not in graphed.blocks[0].__dict__


def test_graph_step_of_a_compiled_model(seed):
    """torch.compile (default mode) composes: Inductor's kernels inside graphrt's step graph."""
    torch.manual_seed(0)
    eager = Stack(256, 512, 2, device="cuda")
    graphed = copy.deepcopy(eager)
    compiled = torch.compile(graphed)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, capturable=True) for m in (eager, graphed)]
    x = torch.randn(128, 256, dtype=BF16, device="cuda")
    step = graph_step(compiled, mse, (x, x), opts[1])
    assert step.nodes()["kernel"] > 0
    for _ in range(3):
        bx, by = torch.randn_like(x), torch.randn_like(x)
        loss = step(bx, by).clone()
        opts[0].zero_grad(set_to_none=True)
        eager_loss = mse(eager(bx), by)
        eager_loss.backward()
        opts[0].step()
        assert abs(loss.item() - eager_loss.item()) <= 1e-2 * abs(eager_loss.item())
    worst = max(((p.float() - q.float()).norm() / p.float().norm()).item()
                for p, q in zip(eager.parameters(), graphed.parameters()))
    assert worst < 1e-2


def test_graph_step_memory_is_reported_and_near_eager(seed):
    torch.manual_seed(0)
    model = Stack(1024, 4096, 4, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    x = torch.randn(4096, 1024, dtype=BF16, device="cuda")
    step = graph_step(model, mse, (x, x), opt)
    mem = step.memory()
    assert 0 < mem["allocated"] <= mem["reserved"]


def test_fragment_writes_its_graph_as_a_picture(tmp_path, seed):
    x, w, g = _norm_inputs()
    frag = capture(_norm_step, x, w, g)
    written = frag.write_picture(tmp_path / "norm")
    dot = written[0].read_text()
    assert dot.count("[label=") == frag.nodes()["total"] and "kernel" in dot
