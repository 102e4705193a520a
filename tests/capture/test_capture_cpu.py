"""Capture API parts that need no GPU: validation, bucketing, trees, reports."""
import pytest
import torch

import graphrt
from graphrt import ContractError, Result, UnsupportedError
from graphrt.capture import bucket_for, capture, graph_step
from graphrt.capture.buckets import bucket_key
from graphrt.capture.tree import flatten, unflatten
from graphrt.capture.verify import ReplayReport, StepCheck


def test_capture_needs_a_cuda_device():
    with pytest.raises(UnsupportedError, match="CUDA graphs need tensors on a CUDA device"):
        capture(lambda x: x * 2, torch.zeros(3))
    with pytest.raises(ContractError, match="at least one tensor"):
        capture(lambda: None)


def test_graph_step_validates_batch_and_optimizer():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ContractError, match="sample_batch"):
        graph_step(model, torch.nn.functional.mse_loss, (torch.zeros(2, 4),))
    opt = torch.optim.AdamW(model.parameters(), capturable=False)
    with pytest.raises(ContractError, match="capturable=True"):
        graph_step(model, torch.nn.functional.mse_loss, (torch.zeros(2, 4), torch.zeros(2, 4)), opt)


def test_bucket_for():
    buckets = (256, 1024, 8192)
    assert [bucket_for(n, buckets) for n in (1, 256, 257, 1024, 8000)] == [256, 256, 1024, 1024, 8192]
    with pytest.raises(ContractError, match="exceeds the largest bucket 8192"):
        bucket_for(8193, buckets)
    with pytest.raises(ContractError):
        bucket_for(0, buckets)


def test_bucket_key_pads_token_dim_only():
    x = torch.zeros(300, 64)
    w = torch.zeros(64)
    k1 = bucket_key((x, w, 2.0), 300, 512, 0)
    k2 = bucket_key((torch.zeros(400, 64), w, 2.0), 400, 512, 0)
    assert k1 == k2 and k1[1][0] == (512, 64) and k1[2][0] == (64,)
    assert bucket_key((x, w, 3.0), 300, 512, 0) != k1
    assert bucket_key((x.double(), w, 2.0), 300, 512, 0) != k1


def test_tree_round_trip_keeps_structure():
    obj = (1, [torch.zeros(1), {"a": 2, "b": (3,)}], Result(("dx", "dw"), (4, 5)))
    leaves, spec = flatten(obj)
    assert len(leaves) == 6
    rebuilt = unflatten(leaves, spec)
    assert rebuilt[2].dw == 5 and rebuilt[1][1]["b"] == (3,) and isinstance(rebuilt[1], list)


def test_replay_report_verdicts():
    exact = ReplayReport(0.0, [StepCheck(0, "fresh inputs", 0.0, True, False)])
    assert exact.ok
    off = ReplayReport(0.0, [StepCheck(0, "fresh inputs", 1e-7, False, False)])
    assert not off.ok
    tol = ReplayReport(1e-6, [StepCheck(0, "fresh inputs", 1e-7, False, False)])
    assert tol.ok
    nan = ReplayReport(1.0, [StepCheck(0, "fresh inputs", 0.0, True, True)])
    assert not nan.ok and "FAILED" in str(nan)
    assert not ReplayReport(0.0).ok


def test_replay_input_mutation_covers_float8():
    """verify_replay mutates inputs in place between replays (x * 0.5 + 0.125); float8 tensors,
    which have no arithmetic kernels, go through FP32."""
    from graphrt.capture.verify import _mutate
    x = torch.randn(64).to(torch.float8_e4m3fn)
    b = torch.randn(64).to(torch.bfloat16)
    want_x = (x.float() * 0.5 + 0.125).to(torch.float8_e4m3fn)
    want_b = b * 0.5 + 0.125
    _mutate([x, b, torch.arange(3)])
    assert torch.equal(x.view(torch.uint8), want_x.view(torch.uint8))
    assert torch.equal(b, want_b)


def test_mhc_block_eager_cpu_reference_path():
    from graphrt.models import MhcBlock, loss_and_grads
    block = MhcBlock(32, 4, 64)
    loss, *grads = loss_and_grads(block)(torch.randn(8, 128, dtype=torch.bfloat16),
                                         torch.randn(8, 128, dtype=torch.bfloat16))
    assert torch.isfinite(loss) and len(grads) == len(list(block.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_deepseek_block_eager_cpu_reference_path():
    from graphrt.models import DeepSeekBlock, mse
    block = DeepSeekBlock(32, 4, 2, 64, 1)
    x = torch.randn(8, 128, dtype=torch.bfloat16)              # 8 tokens x 4 streams = 32 rows
    offsets = torch.tensor([12, 32], dtype=torch.int32)
    cos = torch.randn(32, 64).to(torch.bfloat16)
    out, q = block(x, offsets, cos, cos)
    mse(out, x).backward()
    assert q.out_fp8_row.shape == (32, 1, 192)
    assert all(p.grad is not None for p in block.parameters())


def test_hstu_block_eager_cpu_reference_path():
    from graphrt.models import HstuBlock, loss_and_grads
    block = HstuBlock(16, 0.1)
    step = loss_and_grads(block, lambda xu: block(*xu.chunk(2, dim=1)))
    loss, *grads = step(torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16))
    assert torch.isfinite(loss) and len(grads) == 3


def test_capture_failure_names_the_library_line_and_the_users_line():
    from graphrt.capture import failure

    lib_source = "def prepare(mask):\n    return mask.sync_me()\n"
    lib = {}
    exec(compile(lib_source, "/opt/env/lib/python3.11/site-packages/somelib/masks.py", "exec"), lib)

    import os
    torch_source = "def sync_me(self):\n    raise RuntimeError('called a synchronizing CUDA operation')\n"
    fake = {}   # stands for torch's own frame (.item() and friends)
    exec(compile(torch_source, os.path.join(os.path.dirname(torch.__file__), "fake.py"), "exec"), fake)
    Mask = type("Mask", (), {"sync_me": fake["sync_me"]})

    def users_model(mask):
        return lib["prepare"](mask)   # the user's line

    try:
        users_model(Mask())
    except RuntimeError as err:
        caught = err
    assert failure.classify(caught) == "sync"
    text = failure.where(caught)
    line = users_model.__code__.co_firstlineno + 1
    assert "site-packages/somelib/masks.py:2 in prepare" in text
    assert f"(reached from {__file__}:{line} in users_model: return lib" in text
    assert failure.classify(RuntimeError("operation not permitted when stream is capturing")) == "capture"
    assert failure.classify(ValueError("called a synchronizing CUDA operation")) is None
    assert failure.classify(RuntimeError("shape mismatch")) is None


def test_graph_modules_signature_round_trip_and_mismatch():
    from graphrt.capture.modules import _Signature

    x, cos = torch.randn(2, 3, requires_grad=True), torch.randn(3)
    args, kwargs = (x,), {"position": (cos, cos * 2), "mask": None, "scale": 0.5, "cache": object()}
    sig, tensors = _Signature.of(args, kwargs)
    assert len(tensors) == 3
    a2, k2 = sig.rebuild(tensors)
    assert a2[0] is x and k2["position"][1] is tensors[2] and k2["scale"] == 0.5
    same, _ = _Signature.of((torch.randn(2, 3, requires_grad=True),), {**kwargs})
    assert sig.mismatch(same) is None
    cases = [((torch.randn(2, 4, requires_grad=True),), kwargs, "shape"),
             ((x.detach(),), kwargs, "requires_grad"),
             (args, {**kwargs, "scale": 0.25}, "non-tensor"),
             (args, {**kwargs, "cache": object()}, "non-tensor"),
             (args, {k: v for k, v in kwargs.items() if k != "mask"}, "structure")]
    for a, k, why in cases:
        other, _ = _Signature.of(a, k)
        assert why in sig.mismatch(other)


def test_graph_modules_validates_before_running():
    from graphrt.capture import graph_modules

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(ContractError, match="submodule"):
        graph_modules(model, [torch.nn.Linear(4, 4)], (torch.zeros(2, 4),))
    with pytest.raises(ContractError, match="not a submodule"):
        graph_modules(model, ["7"], (torch.zeros(2, 4),))
    with pytest.raises(ContractError, match="listed twice"):
        graph_modules(model, [model[0], "0"], (torch.zeros(2, 4),))
    with pytest.raises(UnsupportedError, match="CUDA"):
        graph_modules(model, [model[0]], (torch.zeros(2, 4),))


def test_aliased_sample_args_become_distinct_static_inputs():
    from graphrt.capture.fragment import _distinct_static_inputs

    x, other = torch.randn(4, 3), torch.randn(2)
    out = _distinct_static_inputs((x, x, [x[1:], other], 2.0))
    assert out[0] is x and out[1] is not x and torch.equal(out[1], x)
    assert out[2][0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert out[2][1] is other and out[3] == 2.0
    plain = (x, other)
    assert _distinct_static_inputs(plain) is plain


def test_stale_autograd_graph_gets_its_own_advice():
    from graphrt.capture import failure

    err = RuntimeError("CUDA error: operation would make the legacy stream depend on a "
                       "capturing blocking stream")
    assert failure.classify(err) == "capture" and "del loss" in failure.advice(err)
    assert failure.advice(RuntimeError("called a synchronizing CUDA operation")) == failure.HINT


class _EagerGraph:
    """Stands in for a CUDA graph on the CPU: replay runs ``fn`` on the static inputs into the
    static outputs (``skip`` leaves the outputs as they are, like a graph that lost a kernel)."""

    def __init__(self, fn, inputs, outputs, skip=()):
        self.fn, self.inputs, self.outputs, self.skip = fn, inputs, outputs, set(skip)

    def replay(self):
        for i, (out, value) in enumerate(zip(self.outputs, self.fn(*self.inputs))):
            if i not in self.skip:
                out.copy_(value)

    def reset(self):
        pass


def _cpu_fragment(fn, inputs, skip=()):
    from graphrt.arena import WorkspaceArena
    from graphrt.capture import Fragment

    outputs = tuple(t.clone() for t in fn(*inputs))
    hold = WorkspaceArena(1024, "cpu").hold().__enter__()
    return Fragment(_EagerGraph(fn, inputs, outputs, skip), inputs, outputs, hold,
                    graphrt.Runtime("cpu"), 0)


def test_verify_replay_logic_on_the_cpu():
    from graphrt.capture import verify_replay

    def fn(x, w):
        return x * w, (x + 1).sum(0)

    inputs = (torch.randn(8, 4), torch.randn(4))
    make = lambda i: (torch.randn(8, 4), torch.randn(4))   # noqa: E731
    good = verify_replay(_cpu_fragment(fn, inputs), fn, make, steps=2)
    assert good.ok and len(good.checks) == 4, str(good)
    # an output the replay never writes keeps the NaN poison: caught
    stale = verify_replay(_cpu_fragment(fn, (torch.randn(8, 4), torch.randn(4)), skip=(1,)), fn,
                          make, steps=1)
    assert not stale.ok and any(c.nan_in_replay for c in stale.checks), str(stale)
    # an eager function that disagrees: caught bitwise, allowed within a tolerance
    off = lambda x, w: (x * w + 1e-3, (x + 1).sum(0))      # noqa: E731
    assert not verify_replay(_cpu_fragment(fn, inputs), off, make, steps=1).ok
    assert verify_replay(_cpu_fragment(fn, inputs), off, make, steps=1, atol=2e-3).ok


def test_graph_pictures_are_dot_with_one_box_per_node(tmp_path):
    from graphrt.capture.inspect import dot_text, write_picture

    dot = dot_text(["kernel", "kernel", "memcpy", "kernel"], [(0, 1), (0, 2), (1, 3), (2, 3)], "step")
    assert dot.startswith('digraph "step" {') and dot.count("[label=") == 4
    assert "n0 -> n1;" in dot and "n2 -> n3;" in dot and "fillcolor=khaki" in dot
    written = write_picture(dot, tmp_path / "step.png")
    assert written[0].suffix == ".dot" and written[0].read_text() == dot
