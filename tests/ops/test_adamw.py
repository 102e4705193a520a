"""AdamW step: the reference against torch.optim.AdamW, the kernel against the reference,
errors, and graphrt.optim.AdamW as a drop-in optimizer."""
import pytest
import torch

import graphrt
from graphrt import UnsupportedError
from graphrt.ops import adamw_step
from graphrt.ops.adamw import adamw_step_reference

from ..helpers import assert_rejected, env, needs_interpreter

HYPER = dict(lr=3e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)


def _state(shapes, dtype, device="cpu", step=3.0):
    """(params, grads, exp_avgs, exp_avg_sqs, steps) of fresh random values."""
    params = [torch.randn(s, device=device).to(dtype) for s in shapes]
    grads = [torch.randn(s, device=device).to(dtype) for s in shapes]
    ms = [0.1 * torch.randn(s, device=device).to(dtype) for s in shapes]
    vs = [0.01 * torch.rand(s, device=device).to(dtype) for s in shapes]
    steps = [torch.full((), step + i, device=device) for i in range(len(shapes))]
    return params, grads, ms, vs, steps


def _clone(lists):
    return [[t.clone() for t in ts] for ts in lists]


@pytest.mark.parametrize("maximize", [False, True])
def test_reference_matches_torch_adamw(seed, maximize):
    """Five steps of the reference (through graphrt.optim.AdamW on the CPU) against
    torch.optim.AdamW in FP32."""
    ours = torch.nn.Linear(32, 16)
    theirs = torch.nn.Linear(32, 16)
    theirs.load_state_dict(ours.state_dict())
    kw = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.2, maximize=maximize)
    opts = graphrt.optim.AdamW(ours.parameters(), **kw), torch.optim.AdamW(theirs.parameters(), **kw)
    for _ in range(5):
        x = torch.randn(8, 32)
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    state = opts[0].state_dict()
    opts[1].load_state_dict(state)           # the state moves between the two
    assert float(opts[1].state_dict()["state"][0]["step"]) == 5


def _compare(got, want, dtype, rounds_to_nearest):
    """FP32 within a few units in the last place; BF16 at most two steps apart, and where the
    conversion rounds to nearest (the GPU; Triton's interpreter truncates) nearly all equal."""
    for g_list, w_list in zip(got, want):
        for g, w in zip(g_list, w_list):
            if dtype == torch.float32:
                torch.testing.assert_close(g, w, rtol=2e-6, atol=1e-7)
                continue
            # two steps of the dtype at the value, or an FP32 rounding of the operands where
            # m + (1 - beta1) (g - m) cancels to near zero
            bound = 2 * torch.finfo(dtype).eps * w.float().abs() + 1e-6 * w.float().abs().max()
            assert ((g.float() - w.float()).abs() <= bound).all()
            if rounds_to_nearest:   # (98% measured on the H200: the kernel's FMAs and
                assert (g == w).float().mean() > 0.97   # approximate sqrt/div move m's last bits)


def _kernel_against_reference(device, dtype, lr_on_device, maximize, shapes, runtime=None):
    lists = _state(shapes, dtype, device)
    want = _clone(lists)
    lr = torch.full((), HYPER["lr"], device=device) if lr_on_device else HYPER["lr"]
    kw = dict(HYPER, lr=lr, maximize=maximize)
    adamw_step(*lists, **kw, **({} if runtime is None else {"runtime": runtime}))
    adamw_step_reference(*want, lr=HYPER["lr"], beta1=0.9, beta2=0.99, eps=HYPER["eps"],
                         weight_decay=HYPER["weight_decay"], maximize=maximize)
    _compare(lists[:4], want[:4], dtype, rounds_to_nearest=device != "cpu")


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lr_on_device", [False, True])
def test_interpreted_kernel_matches_reference(seed, dtype, lr_on_device):
    with env(GRAPHRT_BACKEND="triton"):
        _kernel_against_reference("cpu", dtype, lr_on_device, lr_on_device, [(7,), (5000,), (3, 33)],
                                  graphrt.Runtime("cpu"))


def _mixed_state(device):
    """Parameters that share the many-tensor launch (sizes multiples of 8, in two dtypes) and
    ones that do not (odd sizes, an offset view), as lists of one dtype per parameter."""
    shapes = [(64,), (8, 24), (7,), (3, 33), (4096 + 8,), (16,)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16,
              torch.float32]
    lists = [[], [], [], [], []]
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        one = _state([shape], dtype, device, step=2.0 + i)
        for items, (t,) in zip(lists, one):
            items.append(t)
    base = torch.randn(40, device=device)   # a parameter at a 4-byte offset: launched alone
    lists[0].append(base[1:9])
    for items, t in zip(lists[1:], (torch.randn(8, device=device), torch.zeros(8, device=device),
                                    torch.zeros(8, device=device), torch.full((), 1.0, device=device))):
        items.append(t)
    return lists


def _many_against_per_tensor(device):
    """Two steps through one plan (the second call takes the checked-call cache): bitwise the
    per-tensor launches' result (the same update), parameters grouped per dtype into one
    launch each and the others alone; the first step also against the reference."""
    from graphrt.ops.adamw import AdamWStep
    from graphrt.ops.adamw.kernels import launch_adamw
    lists = _mixed_state(device)
    per_tensor, reference = _clone(lists), _clone(lists)
    plan = AdamWStep(*lists, **HYPER).compile()
    hyper = dict(lr=HYPER["lr"], beta1=0.9, beta2=0.99, eps=HYPER["eps"],
                 weight_decay=HYPER["weight_decay"], maximize=False)
    adamw_step_reference(*reference, **hyper)
    for step in range(2):
        plan.execute(*lists, **HYPER)
        launch_adamw(*per_tensor, **hyper)
        if step == 0:
            for got, want in zip(lists[0], reference[0]):
                _compare([[got]], [[want]], got.dtype, rounds_to_nearest=device != "cpu")
        for ts in (lists[4], per_tensor[4]):
            for t in ts:
                t.add_(1)
    checked = next(iter(plan._checked_calls.values()))
    assert len(checked.tables(lists, lists[0][0].device)) == 2 and checked.alone == [2, 3, 6]
    for got_list, want_list in zip(lists[:4], per_tensor[:4]):
        for got, want in zip(got_list, want_list):
            assert torch.equal(got, want)


@needs_interpreter
def test_interpreted_many_tensor_launch_matches_reference(seed):
    with env(GRAPHRT_BACKEND="triton"):
        _many_against_per_tensor("cpu")


def test_cached_checks_still_reject_a_changed_call():
    """A call that passed the checks is remembered by its tensors' addresses, shapes, dtypes,
    devices and contiguity: a strided view at the same address is checked again."""
    from graphrt.ops.adamw import AdamWStep
    params, grads, ms, vs, steps = _state([(6,), (6,)], torch.float32)
    base = torch.zeros(12)
    ms[1] = base[:6]
    plan = AdamWStep(params, grads, ms, vs, steps, **HYPER).compile()
    plan.execute(params, grads, ms, vs, steps, **HYPER)
    plan.execute(list(params), grads, ms, vs, steps, **HYPER)   # the same tensors: not rechecked
    assert plan.checked_calls_missed == 1
    strided = base[::2]   # the same address, shape and dtype; only the strides differ
    with pytest.raises(graphrt.ContractError, match=r"exp_avgs\[1\]: expected a contiguous"):
        plan.execute(params, grads, [ms[0], strided], vs, steps, **HYPER)
    with pytest.raises(graphrt.ContractError, match="overlap"):
        plan.execute(params, grads, [params[0], ms[1]], vs, steps, **HYPER)


def test_overlap_sweep_matches_every_pair():
    """The address-order sweep of _spans_disjoint against a check of every pair, on random
    views of one buffer (parameters that overlap within themselves included)."""
    import random
    from graphrt.ops.adamw.plan import _spans_disjoint

    def every_pair(rows):
        spans = [(t.data_ptr(), t.data_ptr() + 4 * t.numel(), written, i)
                 for i, row in enumerate(rows) for t, written in zip(row, (1, 0, 1, 1, 0))
                 if t.numel()]
        return not any(a[3] != b[3] and (a[2] or b[2]) and a[0] < b[1] and b[0] < a[1]
                       for a in spans for b in spans)
    rng = random.Random(0)
    buf = torch.zeros(200)
    for _ in range(500):
        rows = [[buf[lo:lo + (rng.randint(0, 12) if k < 4 else 1)]
                 for k, lo in enumerate(rng.randint(0, 190) for _ in range(5))]
                for _ in range(rng.randint(1, 4))]
        assert _spans_disjoint(rows) == every_pair(rows)


def test_overlapping_parameters_keep_per_tensor_launches():
    """One launch for all parameters would race where one parameter's tensors overlap
    another's; such calls keep one launch per tensor, in order."""
    from graphrt.ops.adamw.plan import _spans_disjoint
    params, grads, ms, vs, steps = _state([(8,), (8,)], torch.float32)
    rows = list(zip(params, grads, ms, vs, steps))
    assert _spans_disjoint(rows)
    assert _spans_disjoint([rows[0], (*rows[1][:4], steps[0])])      # a shared step: read only
    assert not _spans_disjoint([rows[0], (params[0], *rows[1][1:])])  # one p twice
    assert not _spans_disjoint([rows[0], (rows[1][0], ms[0], *rows[1][2:])])  # g_1 is m_0
    from graphrt.ops.adamw.plan import _CheckedCall
    cpu = torch.device("cpu")
    together, apart = _CheckedCall(), _CheckedCall()
    assert len(together.tables([params, grads, ms, vs, steps], cpu)) == 1 and together.alone == []
    assert apart.tables([[params[0]] * 2, grads, ms, vs, steps], cpu) == []
    assert apart.alone == [0, 1]


def test_errors_write_nothing():
    params, grads, ms, vs, steps = _state([(4,), (6,)], torch.float32)
    bad_step = [steps[0], torch.ones((), dtype=torch.float64)]
    cases = [
        (dict(grads=grads[:1]), "grads: expected 2 tensors"),
        (dict(grads=[grads[0], grads[1].double()]), r"grads\[1\]: expected float32"),
        (dict(exp_avgs=[ms[0], torch.zeros(12)[::2]]), r"exp_avgs\[1\]: expected a contiguous"),
        (dict(steps=bad_step), r"steps\[1\]: expected one float32"),
        (dict(exp_avgs=[params[0], ms[1]]), "overlap"),
        (dict(lr=-1.0), "lr: expected a finite value"),
        (dict(betas=(0.9, 1.0)), r"betas\[1\]"),
        (dict(eps=float("nan")), "eps"),
        (dict(params=params[0]), "params: expected a list"),
        (dict(params=[]), "params: expected at least one"),
        (dict(params=[params[0].int(), params[1]]), r"params\[0\]: expected dtype"),
    ]
    assert_rejected(adamw_step, ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps"),
                    dict(params=params, grads=grads, exp_avgs=ms, exp_avg_sqs=vs, steps=steps,
                         **HYPER), cases, [*params, *ms, *vs])


def test_optimizer_rejects_what_it_does_not_implement():
    p = [torch.nn.Parameter(torch.randn(3))]
    with pytest.raises(UnsupportedError, match="amsgrad"):
        graphrt.optim.AdamW(p, amsgrad=True)
    with pytest.raises(UnsupportedError, match="fused"):
        graphrt.optim.AdamW(p, fused=True)
    with pytest.raises(TypeError, match="unexpected"):
        graphrt.optim.AdamW(p, momentum=0.9)


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lr_on_device", [False, True])
def test_gpu_kernel_matches_reference(seed, dtype, lr_on_device):
    _kernel_against_reference("cuda", dtype, lr_on_device, False, [(1,), (4096,), (4097,), (1000, 1537)])


@pytest.mark.gpu
def test_gpu_many_tensor_launch_matches_reference(seed):
    _many_against_per_tensor("cuda")


@pytest.mark.gpu
def test_gpu_many_tensor_tables_used_from_another_stream(seed):
    """Tables made on one stream and used on another (which then waits for their upload and
    keeps them alive): two steps, ordered between the streams as a caller must, equal the
    per-tensor launches bitwise."""
    from graphrt.ops.adamw import AdamWStep
    from graphrt.ops.adamw.kernels import launch_adamw
    lists = _mixed_state("cuda")
    per_tensor = _clone(lists)
    hyper = dict(lr=HYPER["lr"], beta1=0.9, beta2=0.99, eps=HYPER["eps"],
                 weight_decay=HYPER["weight_decay"], maximize=False)
    plan = AdamWStep(*lists, **HYPER).compile()
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (first, second):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            plan.execute(*lists, **HYPER)
        torch.cuda.current_stream().wait_stream(stream)
        launch_adamw(*per_tensor, **hyper)
    torch.cuda.synchronize()
    for got_list, want_list in zip(lists[:4], per_tensor[:4]):
        for got, want in zip(got_list, want_list):
            assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_duplicated_parameter_updates_twice_in_order(seed):
    """The same parameter listed twice (with two moment pairs) is updated twice, in order, as
    by the per-tensor launches and the reference."""
    from graphrt.ops.adamw import AdamWStep
    params, grads, ms, vs, steps = _state([(4096,), (4096,)], torch.float32, "cuda")
    params = [params[0], params[0]]
    want = _clone([params, grads, ms, vs, steps])
    want[0][1] = want[0][0]
    AdamWStep(params, grads, ms, vs, steps, **HYPER).compile().execute(
        params, grads, ms, vs, steps, **HYPER)
    adamw_step_reference(*want, lr=HYPER["lr"], beta1=0.9, beta2=0.99, eps=HYPER["eps"],
                         weight_decay=HYPER["weight_decay"], maximize=False)
    _compare([params[:1]], [want[0][:1]], torch.float32, rounds_to_nearest=True)


@pytest.mark.gpu
def test_gpu_optimizer_captured_matches_eager(seed):
    """graph_step with graphrt.optim.AdamW: five captured steps equal five eager ones bitwise
    (the same kernels), and the device-side lr follows a schedule between replays."""
    from graphrt.capture import graph_step
    from graphrt.models import eager_step_fn, mse
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
              .cuda().to(torch.bfloat16) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    lrs = [torch.full((), 1e-3, device="cuda") for _ in range(2)]
    opts = [graphrt.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1) for m, lr in zip(models, lrs)]
    data = [(torch.randn(32, 64, device="cuda").to(torch.bfloat16),
             torch.randn(32, 64, device="cuda").to(torch.bfloat16)) for _ in range(5)]
    eager = eager_step_fn(models[0], opts[0], mse)
    graph = graph_step(models[1], mse, tuple(t.clone() for t in data[0]), opts[1])
    for i, (x, y) in enumerate(data):
        for lr in lrs:
            lr.fill_(1e-3 * (i + 1))
        a, b = eager(x, y), graph.step(x, y)
        assert torch.equal(a.float(), b.float())
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)


def test_functional_call_names_a_bad_parameter_past_the_first_and_writes_nothing():
    """The functional call checks only the first parameter before the plan lookup; the rest
    are checked by execute, before anything is written, and each bad one is named."""
    params, grads, ms, vs, steps = _state([(6,), (6,)], torch.float32)
    before = [t.clone() for t in params + ms + vs]
    for bad, match in ((params[:1] + ["x"], r"params\[1\]: expected a torch.Tensor"),
                       ((), "params: expected at least one tensor"),
                       (params[0], "params: expected a list of tensors"),
                       (["x"], r"params\[0\]: expected a torch.Tensor")):
        with pytest.raises(graphrt.ContractError, match=match):
            graphrt.ops.adamw_step(bad, grads, ms, vs, steps, **HYPER)
    with pytest.raises(graphrt.ContractError, match=r"grads\[1\]: expected"):
        graphrt.ops.adamw_step(params, [grads[0], grads[1][:3]], ms, vs, steps, **HYPER)
    assert all(torch.equal(a, b) for a, b in zip(before, params + ms + vs))


def test_a_recent_call_serves_only_calls_of_its_kind(monkeypatch):
    """The server ``execute`` keeps (``_RecentStep``), on CPU tensors with the launches
    recorded: made after a kind's second call, it serves the same tensors and hyperparameters with any valid float
    lr, and turns away (launching nothing) every call that differs in what the checks or the
    launch read: a tensor, its address or strides, a list's length, a hyperparameter, an lr
    the checks reject, the stream, a capture."""
    from graphrt import binding
    from graphrt.ops.adamw import AdamWStep
    from graphrt.ops.adamw import kernels, plan as plan_module
    launched = []
    monkeypatch.setattr(kernels, "launch_adamw_many", lambda table, **hyper: None)
    monkeypatch.setattr(kernels, "adamw_many_launcher", lambda table, **hyper: (
        lambda lr: launched.append((table, dict(hyper, lr=lr)))))
    monkeypatch.setattr(kernels, "launch_adamw", lambda *lists, **hyper: None)
    stream, capturing = [7], [False]
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: stream[0])
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing[0])
    monkeypatch.setattr(plan_module, "_serves_on", lambda device: True)   # CPU tensors here
    lists = _state([(8,), (16,)], torch.float32)
    base = torch.randn(32)
    lists[0][1] = base[:16]   # a parameter with a strided twin at its address
    kwargs = dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01, maximize=False)
    plan = AdamWStep(*lists, **kwargs, backend="triton").compile()
    executed = {k: v for k, v in kwargs.items() if k != "maximize"}   # the contract's
    plan.execute(*lists, **executed)
    assert plan._servers == ()   # a kind seen once
    plan.execute(*lists, **executed)
    recent, = plan._servers
    launched.clear()
    assert recent(lists, {**kwargs, "lr": 0.25}) == ()
    (table, hyper), = launched
    assert table is plan._checked_calls[next(iter(plan._checked_calls))]._tables[0]
    assert hyper == dict(lr=0.25, lr_tensor=None, beta1=0.9, beta2=0.99, eps=1e-8,
                         weight_decay=0.01, maximize=False)
    launched.clear()
    params = lists[0]
    others = {
        "another tensor": ([params[0], params[1].clone()], *lists[1:]),
        "a strided view at the address": ([params[0], base[::2]], *lists[1:]),
        "one parameter fewer": tuple(ts[:1] for ts in lists),
        "not a tensor": ([params[0], 1.0], *lists[1:]),
        "a list missing": lists[:4],
    }
    for name, args in others.items():
        assert recent(args, kwargs) is None, name
    class Real(float):   # equal values of another kind: the server takes only floats
        pass
    changed = {"lr": [0, -1e-3, float("nan"), float("inf"), torch.ones(())],
               "betas": [(0.9, 0.999), [0.9, 0.99], (0.9, Real(0.99)),
                         torch.tensor([0.9, 0.99])],
               "eps": [1e-7, 1, Real(1e-8), torch.tensor(1e-8)],
               "weight_decay": [0.0, Real(0.01)],
               "maximize": [True]}
    for name, values in changed.items():
        for value in values:
            assert recent(lists, {**kwargs, name: value}) is None, (name, value)
    assert recent(lists, dict(reversed(kwargs.items()))) is None
    stream[0] = 8
    assert recent(lists, kwargs) is None
    stream[0], capturing[0] = 7, True
    assert recent(lists, kwargs) is None
    capturing[0] = False
    assert not launched
    assert recent(lists, kwargs) == () and len(launched) == 1
    plan.execute(*lists, **{**executed, "lr": 0.5})   # plan.execute is served by it too
    assert len(launched) == 2 and launched[-1][1]["lr"] == 0.5
    plan.execute(*lists, **executed, stream=None)
    assert len(launched) == 3
    plan.execute(*lists, **{**executed, "eps": 1e-7})   # another eps: the full path
    assert len(launched) == 3


def _parameters_of(shapes, dtypes) -> list:
    """The five lists of fresh random CUDA state for parameters of these shapes and dtypes,
    every one fitting the many-tensor launch."""
    lists = [[], [], [], [], []]
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        for items, (t,) in zip(lists, _state([shape], dtype, "cuda", step=2.0 + i)):
            items.append(t)
    return lists


def _expect_per_tensor_step(lists, per_tensor, lr, betas, eps, weight_decay) -> None:
    """The same step by the per-tensor launches on ``per_tensor``: every tensor of ``lists``
    equal to it, bitwise."""
    from graphrt.ops.adamw.kernels import launch_adamw
    launch_adamw(*per_tensor, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps,
                 weight_decay=weight_decay, maximize=False)
    torch.cuda.synchronize()
    for got_list, want_list in zip(lists[:4], per_tensor[:4]):
        for got, want in zip(got_list, want_list):
            assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_functional_steps_served_by_the_recent_call_equal_per_tensor_launches(seed,
                                                                                 monkeypatch):
    """Functional steps on one runtime, lr changing every step: from the third on, the recent
    call serves them (execute is not called), and after every step each tensor equals the
    per-tensor launches' bitwise. Fresh gradients (other addresses) take the full path again,
    with the same result."""
    from graphrt.ops.adamw import AdamWStep
    from graphrt.ops.adamw.plan import _RecentStep
    rt = graphrt.Runtime("cuda")
    lists = _parameters_of([(64,), (8, 24), (4096 + 8,), (16,)],
                           [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32])
    per_tensor = _clone(lists)
    executed = []
    real = AdamWStep.execute
    monkeypatch.setattr(AdamWStep, "execute",
                        lambda self, *a, **k: (executed.append(1), real(self, *a, **k))[1])
    betas, eps, weight_decay = (0.9, 0.99), 1e-6, 0.1
    for step in range(6):
        if step == 4:   # fresh gradients: other addresses
            lists[1] = [g.clone() for g in lists[1]]
        lr = 1e-3 * (step + 1)
        adamw_step(*lists, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, runtime=rt)
        _expect_per_tensor_step(lists, per_tensor, lr, betas, eps, weight_decay)
    assert len(executed) == 4   # steps 0, 1 (the kind's first two), 4 and 5 (fresh gradients)
    (plan, _, _), = rt._recent_plans[AdamWStep]
    assert isinstance(plan._servers[0], _RecentStep)


@needs_interpreter
def test_the_runtime_serves_a_few_kinds_of_step_by_their_recent_calls(monkeypatch):
    """Three parameter groups stepped in turn through the functional call (a runtime taken for
    a CUDA one, launches recorded), two through one plan and one (maximize) through another:
    each group's third step on is served by its plan's server without the plan store
    (execute is not called), with that step's lr. The runtime keeps each plan once, and a
    cleared plan store makes them stale."""
    import sys
    from graphrt import binding
    from graphrt.ops.adamw import AdamWStep, kernels, plan as plan_module
    runtime_module = sys.modules["graphrt.runtime"]
    launched, executed, stream = [], [], [7]
    monkeypatch.setattr(kernels, "launch_adamw_many", lambda table, **hyper: None)
    monkeypatch.setattr(kernels, "adamw_many_launcher", lambda table, **hyper: (
        lambda lr: launched.append((table, lr))))
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: stream[0])
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)
    monkeypatch.setattr(plan_module, "_serves_on", lambda device: True)   # CPU tensors here
    real = AdamWStep.execute
    monkeypatch.setattr(AdamWStep, "execute",
                        lambda self, *a, **k: (executed.append(1), real(self, *a, **k))[1])
    rt = graphrt.Runtime("cpu")
    monkeypatch.setattr(rt, "_on_cuda", True)
    groups = [_state([(8,), (16,)], torch.float32), _state([(32,)], torch.float32),
              _state([(24,)], torch.float32)]
    maximize = [False, False, True]
    with env(GRAPHRT_BACKEND="triton"):
        for step in range(4):
            for g, lists in enumerate(groups):
                before = len(launched)
                adamw_step(*lists, lr=0.5 * step + g, maximize=maximize[g], runtime=rt)
                if step >= 2:
                    assert len(launched) == before + 1 and launched[-1][1] == 0.5 * step + g
        plans = [plan for plan, _, _ in rt._recent_plans[AdamWStep]]
        assert len(executed) == 6 and [len(p._servers) for p in plans] == [1, 2]
        stream[0] = 8   # another stream: group 0's server refuses, and its plan is kept once
        for _ in range(3):
            adamw_step(*groups[0], lr=0.1, runtime=rt)
        assert len(executed) == 9 and [p for p, _, _ in rt._recent_plans[AdamWStep]] == plans
        stream[0] = 7
        rt.plans.clear()
        adamw_step(*groups[0], lr=0.1, runtime=rt)
        assert len(executed) == 10
    assert runtime_module.RECENT_PLANS >= 2


@pytest.mark.gpu
def test_gpu_plan_execute_served_by_its_server_equals_per_tensor_launches(seed, monkeypatch):
    """plan.execute, lr changing every step: from the third step on the plan's server takes
    the call (the tensors are not keyed again), and every step equals the per-tensor
    launches bitwise."""
    from graphrt.ops.adamw import AdamWStep, plan as plan_module
    lists = _parameters_of([(64,), (8, 24), (4096 + 8,)],
                           [torch.float32, torch.bfloat16, torch.float32])
    per_tensor = _clone(lists)
    keyed = []
    real_key = plan_module._tensors_key
    monkeypatch.setattr(plan_module, "_tensors_key", lambda ls: (keyed.append(1), real_key(ls))[1])
    betas, eps, weight_decay = (0.9, 0.99), 1e-6, 0.1
    plan = AdamWStep(*lists, lr=1e-3, betas=betas, eps=eps,
                     weight_decay=weight_decay).compile()
    for step in range(5):
        lr = 1e-3 * (step + 1)
        plan.execute(*lists, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        _expect_per_tensor_step(lists, per_tensor, lr, betas, eps, weight_decay)
    assert len(keyed) == 2 and len(plan._servers) == 1


@needs_interpreter
def test_interpreted_steps_on_the_cpu_keep_no_server():
    """Servers test the CUDA stream: steps on CPU tensors (Triton's interpreter) never get one,
    and every step is checked and launched as usual."""
    from graphrt.ops.adamw import AdamWStep
    lists = _state([(8,), (16,)], torch.float32)
    with env(GRAPHRT_BACKEND="triton"):
        plan = AdamWStep(*lists, **HYPER).compile()
        for _ in range(3):
            plan.execute(*lists, **HYPER)
    assert plan._servers == ()


@needs_interpreter
@pytest.mark.parametrize("lr_on_device", [False, True])
def test_interpreted_prepared_many_tensor_launch_equals_the_plain_one(seed, lr_on_device):
    """A server's launcher (``adamw_many_launcher``: everything fixed but a float lr) and
    ``launch_adamw_many`` give the same step, bitwise, in Triton's interpreter."""
    from graphrt.ops.adamw.kernels import ManyTensorTable, adamw_many_launcher, launch_adamw_many
    lists = _state([(8,), (24,)], torch.float32)
    twin = _clone(lists)
    hyper = dict(beta1=0.9, beta2=0.99, eps=1e-6, weight_decay=0.1, maximize=False)
    lr = torch.full((), 2e-2) if lr_on_device else 2e-2
    with env(GRAPHRT_BACKEND="triton"):
        launch_adamw_many(ManyTensorTable(list(zip(*lists)), torch.device("cpu")), lr=lr,
                          **hyper)
        adamw_many_launcher(ManyTensorTable(list(zip(*twin)), torch.device("cpu")),
                            lr_tensor=lr if lr_on_device else None, **hyper)(
            0.5 if lr_on_device else lr)   # a device lr is read where the kernel runs
    for got_list, want_list in zip(twin[:4], lists[:4]):
        for got, want in zip(got_list, want_list):
            assert torch.equal(got, want)
