"""The host bench's bare launches of an op's own kernels (graphrt/bench/host.py), on the CPU
through the Triton interpreter: they launch exactly what the plan's execute launches."""
import torch

from graphrt.bench.host import captured_launches, same_kernels
from graphrt.ops import RmsNormBackward

from .helpers import env, needs_interpreter


@needs_interpreter
def test_same_kernels_write_what_the_plan_writes(seed):
    x = torch.randn(33, 64, dtype=torch.bfloat16)
    w = 1 + 0.5 * torch.randn(64)
    rstd = torch.rand(33) + 0.5
    g = torch.randn_like(x)
    with env(GRAPHRT_BACKEND="triton"):
        plan = RmsNormBackward(g, x, w, rstd).compile()
        workspace = torch.empty(plan.workspace_bytes(), dtype=torch.uint8)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        plan.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=workspace)
        want = dx.clone(), dw.clone()
        launches = captured_launches(plan, (g, x, w, rstd), {"dx": dx, "dw": dw}, workspace)
        assert len(launches) == 2   # the rows and the dw reduction
        cases = same_kernels("rmsnorm_backward", plan, (g, x, w, rstd), {"dx": dx, "dw": dw},
                             workspace)
        assert sorted(cases) == ["rmsnorm_backward: the same kernels (2), Triton's kernel[grid]",
                                 "rmsnorm_backward: the same kernels (2), graphrt's launch"]
        for run in cases.values():
            dx.fill_(float("nan"))
            dw.fill_(float("nan"))
            run()
            assert torch.equal(dx, want[0]) and torch.equal(dw, want[1])


def test_a_launch_not_through_launch_gives_no_rows():
    """An execute that also runs another DSL's kernel (it marks the launch as one a binding
    cannot replay) has no bare-launch rows: the captured launches would not be all its work."""
    from graphrt.kernel_utils import mark_unrecorded_launch
    from graphrt.plan import Plan

    class OtherDsl(Plan):
        def execute(self, x, *, workspace=None, stream=None):
            mark_unrecorded_launch()

    plan = object.__new__(OtherDsl)
    assert captured_launches(plan, (torch.zeros(1),), {}, None) is None
    assert same_kernels("other", plan, (torch.zeros(1),), {}, None) == {}


def test_a_recorded_launch_not_through_launch_gives_no_rows():
    """Likewise for another DSL's launch that a binding can replay (graphrt.cute_launch)."""
    from graphrt.cute_launch import launch, PackedLaunch, POINTER
    from graphrt.plan import Plan

    class RecordedDsl(Plan):
        def execute(self, x, *, workspace=None, stream=None):
            launch(PackedLaunch(lambda packed: 0, (POINTER, POINTER), (), True), 0, (x,), ())

    plan = object.__new__(RecordedDsl)
    assert captured_launches(plan, (torch.zeros(1),), {}, None) is None


def test_plan_rows_carry_the_goal_and_the_same_kernels_bare():
    from types import SimpleNamespace

    from graphrt.bench.host import _launch_goal, BARE_LAUNCH

    binding = SimpleNamespace(launches=[object(), object()])
    case = SimpleNamespace(plan=SimpleNamespace(_bindings=SimpleNamespace(recorded={1: binding})))
    best = {BARE_LAUNCH: 11.0, "op: the same kernels (2), Triton's kernel[grid]": 30.0,
            "op: the same kernels (2), graphrt's launch": 20.0, "other: plan.execute": 9.0}
    assert _launch_goal("op: plan.execute", case, best) == {
        "kernels": 2, "goal us": 16.0, "same kernels us": 30.0}
    assert _launch_goal("op: functional", SimpleNamespace(), best) == {}


def test_full_path_calls_counts_the_calls_that_reach_the_runtimes_full_path():
    """On the CPU no call is bound, so every functional call takes the full path; a call that
    does not reach the runtime counts none; the runtime is left as it was."""
    import graphrt
    from graphrt.bench.host import full_path_calls
    rt = graphrt.runtime("cpu")
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8)
    assert full_path_calls(lambda: graphrt.ops.rmsnorm_forward(x, w), rt, calls=5) == "5/5"
    assert full_path_calls(lambda: torch.add(x, x), rt, calls=5) == "0/5"
    assert "_run" not in vars(rt)
