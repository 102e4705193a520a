"""Where a functional call's host time goes, on the GPU host: each part of a bound functional
call timed alone behind a GPU sleep (the recent call's served function, output allocation,
the arena, the key, the replayed launches, the Result), the parts of ``plan.execute`` (the
wrapper's tests, the binding key, the lookup, the replay), the C launch of Triton's compiled
kernel alone (the floor under any pre-bound launch), and graphrt.nn.RMSNorm's eager forward +
backward split against torch.nn.RMSNorm's. ``--autograd``: only the Python autograd layer's
cost, with autograd's device threads on and off.

    python scripts/host_parts.py [--autograd]
"""
from __future__ import annotations

import importlib
import sys
import traceback

import torch

import graphrt
from graphrt.bench.host import _add_one_kernel, host_us
from graphrt.ops.registry import OPS
from graphrt.result import Result
from graphrt.streams import current_stream

runtime_module = importlib.import_module("graphrt.runtime")


def best(fn, rounds: int = 5) -> float:
    for _ in range(3):
        fn()
    return min(host_us(fn) for _ in range(rounds))


def allocation_rows(device) -> dict:
    x = torch.empty(16, device=device)
    big, small = (4096, 5120), (4096,)
    index = device.index
    return {
        "torch.empty(big, dtype, device=torch.device)":
            lambda: torch.empty(big, dtype=torch.bfloat16, device=device),
        "torch.empty(small, dtype, device=torch.device)":
            lambda: torch.empty(small, dtype=torch.float32, device=device),
        "torch.empty(big, dtype, device=int)":
            lambda: torch.empty(big, dtype=torch.bfloat16, device=index),
        "x.new_empty(big, dtype)": lambda: x.new_empty(big, dtype=torch.bfloat16),
        "torch.empty_strided(big, strides, dtype, device)":
            lambda: torch.empty_strided(big, (5120, 1), dtype=torch.bfloat16, device=device),
        "four torch.empty (HSTU backward's outputs)":
            lambda: [torch.empty(big, dtype=torch.bfloat16, device=device),
                     torch.empty(big, dtype=torch.bfloat16, device=device),
                     torch.empty(small, dtype=torch.bfloat16, device=device),
                     torch.empty(small, dtype=torch.bfloat16, device=device)],
    }


def arena_rows(rt) -> dict:
    def lend():
        rt.arena.give_back(rt.arena.lend(1 << 16, current_stream(rt.device))[1])
    return {"arena lend + give_back": lend,
            "current_stream": lambda: current_stream(rt.device),
            "Result of 4": lambda: Result(("a", "b", "c", "d"), [1, 2, 3, 4])}


def op_rows(device, rt) -> dict:
    rows = {}
    for entry in OPS:
        if entry.name == "adamw_step":
            continue
        inputs, config, _ = entry.sample(device)
        if entry.name == "grouped_gemm_wgrad":
            config = {**config, "check_offsets": False}
        functional = entry.functional()
        for _ in range(3):
            functional(*inputs, **config)
        seen = []   # what the functional call passes to Runtime.run (served by no recent call)
        recent_calls = dict(rt._recent_calls)
        rt._recent_calls.clear()
        rt.run = lambda plan_cls, args, kwargs, stream=None: seen.append((plan_cls, kwargs))
        functional(*inputs, **config)
        del rt.run
        rt._recent_calls.update(recent_calls)
        plan_cls, kwargs = seen[0]
        keyed = runtime_module._call_key(plan_cls, inputs, kwargs)
        if keyed is None:
            rows[f"{entry.name}: not bound"] = lambda: None
            continue
        key, addresses, ints, _ = keyed   # and the tensors' positions
        call = rt._bound_calls.get(key)
        rows[f"{entry.name}: functional"] = lambda f=functional, i=inputs, c=config: f(*i, **c)
        rows[f"{entry.name}: call key"] = (
            lambda p=plan_cls, i=inputs, k=kwargs: runtime_module._call_key(p, i, k))
        if call is None:
            continue
        recent = rt._recent_calls.get(plan_cls)
        if recent is not None and recent.served not in (None, runtime_module._serves_nothing):
            served, seen = recent.served, []   # the values the functional call hands it
            recent.served = lambda *values: seen.append(values) or served(*values)
            functional(*inputs, **config)
            recent.served = served
            rows[f"{entry.name}: its served function alone (tests, allocate, launch, Result)"] = (
                lambda f=served, v=seen[0]: f(*v))
        rows[f"{entry.name}: bound call (allocate, arena, launch, Result)"] = (
            lambda c=call, i=inputs, k=kwargs, a=addresses, n=ints: c(rt, i, k, a, n))
        allocations = call.allocations
        rows[f"{entry.name}: its {len(allocations)} outputs' torch.empty_strided"] = (
            lambda a=allocations: [torch.empty_strided(s, st, dtype=d, device=v)
                                   for s, st, d, v in a])
        made = [torch.empty_strided(s, st, dtype=d, device=v) for s, st, d, v in allocations]
        # the workspace and zeroed counters the bound call launches with: its kept region's
        workspace = torch.empty(max(call.nbytes, 1), dtype=torch.uint8, device=device)
        counters = torch.zeros(64, dtype=torch.int32, device=device)
        kept = getattr(call, "_kept", None)
        if type(kept) is tuple:
            _, w_address, c_address = kept
        else:
            w_address, c_address = workspace.data_ptr(), counters.data_ptr()
        pool = [*addresses, *(t.data_ptr() for t in made), w_address, c_address]
        replay_addresses = [pool[i] for i in call.slots]
        rows[f"{entry.name}: the binding's launches alone ({len(call.binding.launches)})"] = (
            lambda b=call.binding, a=replay_addresses, n=ints, keep=(made, workspace, counters):
            b.launch(a, n))
    return rows


def execute_rows(device, rt) -> dict:
    """``plan.execute`` of each op's sample call and its parts: the wrapper's tests before the
    key, the binding key, key and lookup, the replay (overlap check and launches) alone, and
    the tensors' shapes, strides and addresses read alone (what any key has to read)."""
    from graphrt import binding
    rows = {}
    for entry in OPS:
        if entry.name == "adamw_step":
            continue
        inputs, config, outputs = entry.sample(device)
        plan = rt.plan(entry.plan_class(), *inputs, **config, **outputs)
        keywords = {k: v for k, v in {**config, **outputs}.items() if k in plan.execute_keywords}
        nbytes = plan.workspace_bytes()
        keywords["workspace"] = (torch.empty(nbytes, dtype=torch.uint8, device=device)
                                 if nbytes else None)
        for _ in range(3):
            plan.execute(*inputs, **keywords)
        bound = binding.binding_key(inputs, keywords, plan.run_time_ints)
        if bound is None or plan._bindings is None:
            continue
        key, positions, addresses, ints = bound
        found = plan._bindings.lookup(key)
        if found is None:
            continue
        name = entry.name
        tensors = [(*inputs, *keywords.values())[p] for p in positions]
        rows[f"{name}: plan.execute"] = lambda p=plan, i=inputs, k=keywords: p.execute(*i, **k)
        rows[f"{name}: execute's tests before the key"] = (
            lambda p=plan: (p._compiled, p._bindings, binding.active_recording(),
                            binding.launch_hooks_active(), p.bindable()))
        rows[f"{name}: its binding key ({len(tensors)} tensors)"] = (
            lambda i=inputs, k=keywords, r=plan.run_time_ints: binding.binding_key(i, k, r))
        rows[f"{name}: key + lookup"] = (
            lambda i=inputs, k=keywords, p=plan: p._bindings.lookup(
                binding.binding_key(i, k, p.run_time_ints)[0]))
        rows[f"{name}: replay alone ({len(found.launches)} launches)"] = (
            lambda f=found, a=addresses, n=ints: f.replay(a, n))
        rows[f"{name}: its tensors' shapes, strides, addresses"] = (
            lambda ts=tensors: [(t.shape, t.stride(), t.data_ptr()) for t in ts])
    return rows


class Scaled(torch.autograd.Function):
    """The Python autograd layer alone: one multiply each way."""
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, gy):
        (w,) = ctx.saved_tensors
        return gy * w, None


def module_rows(device) -> dict:
    """graphrt.nn.RMSNorm's eager forward + backward split against torch.nn.RMSNorm's (the
    first shape of ``graphrt bench host``'s modules): the module with an FP32 and a BF16
    weight, a bare autograd.Function over the same functional calls, and those calls alone.
    Each module's input requires grad, as in training (the module's own kind of call)."""
    from graphrt.bench.host import MODULE_SHAPES
    from graphrt.ops import rmsnorm_backward, rmsnorm_forward
    rows, hidden = MODULE_SHAPES[0]
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn_like(x)
    fp32 = graphrt.nn.RMSNorm(hidden, device=device)
    bf16 = graphrt.nn.RMSNorm(hidden, device=device, dtype=torch.bfloat16)
    native = torch.nn.RMSNorm(hidden, eps=1e-6, device=device, dtype=torch.bfloat16)
    w = fp32.weight.detach()
    _, rstd = rmsnorm_forward(x.detach(), w, eps=1e-6)

    class Bare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y, rstd = rmsnorm_forward(x, w, eps=1e-6)
            ctx.save_for_backward(x, w, rstd)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, w, rstd = ctx.saved_tensors
            dx, dw = rmsnorm_backward(gy, x, w, rstd)
            return dx, dw

    bare_x = x.detach().requires_grad_(True)
    w16 = native.weight.detach()
    return {
        "module: x * w forward + backward, native autograd": lambda: (x * w16).backward(g),
        "module: x * w forward + backward, a Python autograd.Function": lambda: Scaled.apply(
            x, w16).backward(g),
        "module: rmsnorm_forward alone (weight detached)": lambda: rmsnorm_forward(
            x.detach(), w, eps=1e-6),
        "module: rmsnorm_backward alone (weight detached)": lambda: rmsnorm_backward(
            g, x.detach(), w, rstd),
        "module: graphrt.nn.RMSNorm forward, FP32 / BF16 weight": lambda: (fp32(x), bf16(x)),
        "module: torch.nn.RMSNorm forward": lambda: native(x),
        "module: graphrt.nn.RMSNorm forward + backward, FP32 weight": lambda: fp32(x).backward(g),
        "module: graphrt.nn.RMSNorm forward + backward, BF16 weight": lambda: bf16(x).backward(g),
        "module: torch.nn.RMSNorm forward + backward": lambda: native(x).backward(g),
        "module: a bare autograd.Function over the functional calls, forward + backward":
            lambda: Bare.apply(bare_x, fp32.weight).backward(g),
    }


def c_launch_rows(device) -> dict:
    """Triton's C launch of a 3-argument kernel, called with its arguments ready."""
    from graphrt.kernel_utils import direct_run
    x = torch.zeros(16, device=device)
    compiled = _add_one_kernel[(1,)](x, 16, BLOCK=16)
    run = direct_run(compiled)
    if not hasattr(run, "form"):
        return {}
    stream = torch.cuda.current_stream(device).cuda_stream
    c_launch, leading, packed = run.form((1, 1, 1), stream, compiled.function,
                                         compiled.packed_metadata)
    args = (x.data_ptr(), 16, 16)
    if packed:
        return {"Triton's C launch alone, 3 arguments": lambda: c_launch(*leading, args)}
    return {"Triton's C launch alone, 3 arguments": lambda: c_launch(*leading, *args)}


def autograd_split(device) -> None:
    """Each case's forward + backward, enqueued behind a GPU sleep and as wall time, with
    autograd's device threads on (the default) and off (the backward on the calling thread):
    where the Python autograd.Function's cost over a native op goes on this host."""
    from graphrt.bench.host import MODULE_SHAPES
    rows, hidden = MODULE_SHAPES[0]
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn_like(x)
    xs = torch.randn(16, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
    gs = torch.randn_like(xs)   # 16 x 16: GPU time about nil
    ws = torch.randn(16, dtype=torch.bfloat16, device=device)
    c_apply = super(torch.autograd.Function, Scaled).apply   # without Function.apply's Python
    module = graphrt.nn.RMSNorm(hidden, device=device)
    native = torch.nn.RMSNorm(hidden, eps=1e-6, device=device, dtype=torch.bfloat16)
    cases = {
        "16x16 x * w, native": lambda: (xs * ws).backward(gs),
        "16x16 x * w, Python Function.apply": lambda: Scaled.apply(xs, ws).backward(gs),
        "16x16 x * w, the C apply alone": lambda: c_apply(xs, ws).backward(gs),
        "16x16 x * w forward only, native": lambda: xs * ws,
        "16x16 x * w forward only, Function.apply": lambda: Scaled.apply(xs, ws),
        f"graphrt.nn.RMSNorm, {rows}x{hidden}": lambda: module(x).backward(g),
        f"torch.nn.RMSNorm, {rows}x{hidden}": lambda: native(x).backward(g),
    }
    width = max(map(len, cases))
    for threads in (True, False):
        with torch.autograd.set_multithreading_enabled(threads):
            for name, fn in cases.items():
                queued = best(fn)
                wall = min(host_us(fn, sleep=False) for _ in range(5))
                print(f"autograd threads {'on ' if threads else 'off'}  {name:<{width}}  behind a "
                      f"sleep {queued:7.2f} us, wall {wall:7.2f} us", flush=True)


def main() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    if "--autograd" in sys.argv[1:]:
        autograd_split(device)
        return
    rt = graphrt.runtime(device)
    small = torch.zeros(16, device=device)
    rows = {"torch.add, 16 elements": lambda: torch.add(small, small),
            "bare Triton launch, 3 arguments": lambda: _add_one_kernel[(1,)](small, 16, BLOCK=16)}
    for builder, arguments in ((c_launch_rows, (device,)), (allocation_rows, (device,)),
                               (arena_rows, (rt,)), (op_rows, (device, rt)),
                               (execute_rows, (device, rt)), (module_rows, (device,))):
        try:
            rows.update(builder(*arguments))
        except Exception:   # the other groups' rows still print
            print(f"{builder.__name__} failed:\n{traceback.format_exc()}")
    # each row printed as soon as it is timed (about 2 s a row: five sleeps of 0.3 s and their
    # waits), so that a run cut short still shows the rows it reached
    width = max(map(len, rows))
    for name, fn in rows.items():
        print(f"{name:<{width}}  {best(fn):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
