"""Host time per call: every op's functional call and plan.execute beside torch.add, a bare
3-argument Triton launch and bare launches of each op's own kernels (Triton's kernel[grid] and
graphrt's launch); graphrt's, Liger's and torch's RMSNorm modules forward and forward+backward
under autograd, and graphrt's against transformers' LlamaRMSNorm at the Hugging Face step's shape.

Each call is enqueued behind a GPU sleep, so the host never waits on the GPU: the figures are
enqueue time alone (best of several rounds of 200 calls, rounds interleaved across the cases).
The modules' rows also give wall time per step at the two benchmark shapes, where the GPU's
time counts too.

    graphrt bench host
    python -m graphrt.bench.host --profile "graphrt.nn.RMSNorm forward + backward"
"""
from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import time

import torch
import triton
import triton.language as tl

from . import report

MODULE_SHAPES = ((4096, 5120), (16384, 2048))


@triton.jit
def _add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=keep) + 1, mask=keep)


def host_us(fn, calls: int = 200, sleep: bool = True) -> float:
    """Mean host time per call of ``fn`` over ``calls`` calls, in microseconds: enqueue time
    behind a GPU sleep, or (``sleep`` false) wall time until the GPU is done."""
    torch.cuda.synchronize()
    if sleep:
        torch.cuda._sleep(int(6e8))   # about 0.3 s of GPU time: longer than the enqueue
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if not sleep:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def op_cases(device) -> dict:
    """Functional call and plan.execute of every op in the registry, on its sample call, and
    the same kernels launched bare (see ``same_kernels``)."""
    import graphrt
    from ..ops.registry import OPS
    rt = graphrt.runtime(device)
    cases = {}
    for entry in OPS:
        inputs, config, outputs = entry.sample(device)
        functional = entry.functional()
        plan = rt.plan(entry.plan_class(), *inputs, **config, **outputs)
        keywords = {k: v for k, v in {**config, **outputs}.items() if k in plan.execute_keywords}
        workspace = (torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device=device)
                     if plan.workspace_bytes() else None)

        def execute(plan=plan, inputs=inputs, keywords=keywords, workspace=workspace):
            plan.execute(*inputs, **keywords, workspace=workspace)
        execute.plan = plan
        cases[f"{entry.name}: functional"] = (lambda f=functional, i=inputs, c=config: f(*i, **c))
        if entry.name == "grouped_gemm_wgrad":   # its default reads the offsets on the host
            cases[f"{entry.name}: functional, check_offsets=False"] = (
                lambda f=functional, i=inputs, c=config: f(*i, **c, check_offsets=False))
            # ragged blocks with counts off multiples of 8: the rows workspace allocated and
            # the copy launched before the product
            a, b, offsets = inputs
            odd = offsets.clone()
            odd[:-1] -= 3
            cases[f"{entry.name}: functional, tensor_ragged, odd counts, check_offsets=False"] = (
                lambda f=functional, i=(a.contiguous(), b, odd), c=config: f(
                    *i, **c, input_order="tensor_ragged", check_offsets=False))
            # MXFP8 codes, both K-major: on Hopper the values' workspace allocated, the values
            # pass and the tensor2d TMA kernel launched
            fp8, blocks = torch.float8_e4m3fn, -(-a.shape[1] // 32)
            mx = (a.contiguous().to(fp8), b.t().contiguous().to(fp8).t(), offsets)
            scales = dict(a_scale=torch.full((a.shape[0], blocks), 127, dtype=torch.uint8,
                                             device=device),
                          b_scale=torch.full((blocks, b.shape[1]), 127, dtype=torch.uint8,
                                             device=device))
            cases[f"{entry.name}: functional, MXFP8, check_offsets=False"] = (
                lambda f=functional, i=mx, c=config, s=scales: f(*i, **c, **s,
                                                                 check_offsets=False))
            # tensor2d with both operands K-major: Hopper's TMA kernel (scratch allocated)
            cases[f"{entry.name}: functional, tensor2d K-K, check_offsets=False"] = (
                lambda f=functional, i=(a.contiguous(), b.t().contiguous().t(), offsets),
                c=config: f(*i, **c, check_offsets=False))
        if "seed" in config:   # a training loop's dropout: a new seed (Python int) each step
            seeds = itertools.count(1)
            cases[f"{entry.name}: functional, a new seed every call"] = (
                lambda f=functional, i=inputs, c=config, s=seeds: f(*i, **{**c, "seed": next(s)}))
        cases[f"{entry.name}: plan.execute"] = execute
        cases.update(same_kernels(entry.name, plan, inputs, keywords, workspace))
    return cases


def captured_launches(plan, inputs: tuple, keywords: dict, workspace) -> list | None:
    """(kernel, grid, args, kwargs) of every launch one ``execute`` of ``plan`` makes through
    ``kernel_utils.launch``, from a full execute (its checks and argument computation; no
    binding replay); None when it also launched otherwise (another DSL's kernels, recorded or
    not), so that the captured launches are not all of its work."""
    from .. import binding, kernel_utils
    real = kernel_utils._launcher
    launches = []
    recording = binding.Recording()   # marked incomplete by a launch not through ``launch``

    class Capture:
        def __call__(self, kernel, grid, args, kwargs):
            launches.append((kernel, grid, args, kwargs))
            complete, recorded = recording.complete, len(recording.launches)
            try:
                return real(kernel, grid, args, kwargs)
            finally:   # what a launch through ``launch`` marks or records does not count
                recording.complete = complete
                del recording.launches[recorded:]

        def __getattr__(self, name):
            return getattr(real, name)

    kernel_utils._launcher = Capture()
    try:
        with binding.recording_into(recording):
            type(plan).execute.__wrapped__(plan, *inputs, **keywords, workspace=workspace)
    finally:
        kernel_utils._launcher = real
    # left in the recording: launches not through ``launch`` (graphrt.cute_launch's)
    return launches if recording.complete and not recording.launches else None


def same_kernels(name: str, plan, inputs: tuple, keywords: dict, workspace) -> dict:
    """The kernels ``plan.execute`` launches, with the same arguments and no plan around them,
    through Triton's own ``kernel[grid]`` and through graphrt's pre-bound ``launch``: what issue
    26 calls "a bare launch of the same kernel". (Calling ``plan.execute`` with Triton's launch
    would not measure it: the plan replays its recorded launches.)"""
    from ..kernel_utils import launch
    launches = captured_launches(plan, inputs, keywords, workspace)
    if not launches:   # none, or not all through ``launch``
        return {}
    n = f" ({len(launches)})" if len(launches) > 1 else ""

    def through_triton():
        for kernel, grid, args, kwargs in launches:
            kernel[grid](*args, **kwargs)

    def through_graphrt():
        for kernel, grid, args, kwargs in launches:
            launch(kernel, grid, *args, **kwargs)
    return {f"{name}: the same kernel{'s' if n else ''}{n}, Triton's kernel[grid]": through_triton,
            f"{name}: the same kernel{'s' if n else ''}{n}, graphrt's launch": through_graphrt}


def module_cases(rows: int, hidden: int, device) -> dict:
    """Forward and forward+backward of the RMSNorm modules (graphrt, Liger, torch)."""
    import graphrt
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn_like(x)
    modules = {"graphrt.nn.RMSNorm": graphrt.nn.RMSNorm(hidden, device=device),
               "torch.nn.RMSNorm": torch.nn.RMSNorm(hidden, eps=1e-6, device=device,
                                                    dtype=torch.bfloat16)}
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        modules["LigerRMSNorm"] = LigerRMSNorm(hidden, eps=1e-6).to(device)
    except Exception:  # the peer is optional
        pass
    cases = {}
    for name, module in modules.items():
        cases[f"{name} forward"] = lambda m=module: m(x)
        cases[f"{name} forward + backward"] = lambda m=module: m(x).backward(g)
    return cases


LLAMA_NORM_SHAPE = (1, 512, 2048)   # the Hugging Face step of `graphrt bench hf` at 1x512


def llama_norm_cases(device) -> dict:
    """Forward + backward of the norm the Hugging Face Llama step uses, BF16 weight as there:
    transformers' LlamaRMSNorm against graphrt.nn.RMSNorm (what ``replace_norms`` puts in its
    place); empty without transformers."""
    import graphrt
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except Exception:  # the optional extra
        return {}
    hidden = LLAMA_NORM_SHAPE[-1]
    x = torch.randn(*LLAMA_NORM_SHAPE, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn_like(x)
    modules = {"transformers LlamaRMSNorm": LlamaRMSNorm(hidden, eps=1e-6),
               "graphrt.nn.RMSNorm": graphrt.nn.RMSNorm(hidden, dtype=torch.bfloat16)}
    shape = "x".join(map(str, LLAMA_NORM_SHAPE))
    return {f"{name}, BF16 weight, {shape}, forward + backward":
            (lambda m=module.to(device, torch.bfloat16): m(x).backward(g))
            for name, module in modules.items()}


OPTIMIZER_PARAMETERS = 100   # FP32 parameters of 8192 elements each


def optimizer_cases(device) -> dict:
    """``opt.step()`` over a model-sized parameter list: graphrt.optim.AdamW against torch's
    fused and foreach AdamW (each on its own parameters, gradients set)."""
    import graphrt

    def parameters():
        params = [torch.nn.Parameter(torch.randn(8192, device=device))
                  for _ in range(OPTIMIZER_PARAMETERS)]
        for p in params:
            p.grad = torch.randn_like(p)
        return params
    optimizers = {
        "graphrt.optim.AdamW": graphrt.optim.AdamW(parameters(), lr=1e-4),
        "torch.optim.AdamW(fused=True)": torch.optim.AdamW(parameters(), lr=1e-4, fused=True),
        "torch.optim.AdamW(foreach=True)": torch.optim.AdamW(parameters(), lr=1e-4,
                                                             foreach=True)}
    return {f"{name}.step(), {OPTIMIZER_PARAMETERS} parameters": opt.step
            for name, opt in optimizers.items()}


BARE_LAUNCH = "bare Triton launch, 3 arguments"
PER_FURTHER_KERNEL_US = 5.0


def full_path_calls(fn, rt, calls: int = 20) -> str:
    """How many of ``calls`` calls of ``fn`` took ``rt``'s full path (plan lookup, checks and
    allocation in ``Runtime._run``) rather than a bound call, as "n/calls": a functional row
    that reads slow with every call on the full path lost its binding, not its speed."""
    real = rt._run
    taken = 0

    def counted(*args, **kwargs):
        nonlocal taken
        taken += 1
        return real(*args, **kwargs)
    rt._run = counted
    try:
        for _ in range(calls):
            fn()
    finally:
        del rt._run
    return f"{taken}/{calls}"


def _launch_goal(name: str, case, best: dict) -> dict:
    """For a plan.execute case: its kernels (the launches its binding replays), the goal of
    issue 26 (a bare launch plus 5 us per further kernel, from this run's bare 3-argument
    launch) and the same kernels launched bare through Triton's ``kernel[grid]``."""
    plan = getattr(case, "plan", None)
    bindings = getattr(plan, "_bindings", None)
    if bindings is None or not bindings.recorded:
        return {}
    kernels = max(len(b.launches) for b in list(bindings.recorded.values()))
    op = name.split(":")[0]
    same = [us for row, us in best.items()
            if row.startswith(f"{op}: the same kernel") and row.endswith("Triton's kernel[grid]")]
    return {"kernels": kernels,
            "goal us": best[BARE_LAUNCH] + PER_FURTHER_KERNEL_US * (kernels - 1),
            **({"same kernels us": same[0]} if same else {})}


def run(progress=print, rounds: int = 5, match: str = "") -> list[dict]:
    """Every case's host time, or with ``match`` only the cases whose names hold it (beside
    torch.add and the bare launch, and without the wall-time rows)."""
    device = torch.device("cuda", torch.cuda.current_device())
    small = torch.zeros(16, device=device)
    cases = {"torch.add, 16 elements": lambda: torch.add(small, small),
             BARE_LAUNCH: lambda: _add_one_kernel[(1,)](small, 16, BLOCK=16)}
    rows, hidden = MODULE_SHAPES[0]
    measured = {**op_cases(device), **module_cases(rows, hidden, device),
                **optimizer_cases(device)}
    cases.update((name, fn) for name, fn in measured.items() if match in name)
    progress(f"host time per call, behind a GPU sleep ({torch.cuda.get_device_name()}); "
             f"{len(cases)} cases x {rounds} rounds")
    for fn in cases.values():   # compiles, plan builds and bindings before timing
        for _ in range(3):
            fn()
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            best[name] = min(best[name], host_us(fn))
    import graphrt
    rt = graphrt.runtime(device)
    table = [{"call": name, "host us": us, **_launch_goal(name, cases[name], best),
              **({"full path": full_path_calls(cases[name], rt)} if ": functional" in name
                 else {})}
             for name, us in best.items()]
    if match:
        return table
    for rows, hidden in MODULE_SHAPES:
        for name, fn in module_cases(rows, hidden, device).items():
            if name.endswith("backward"):
                for _ in range(3):
                    fn()
                wall = min(host_us(fn, 50, sleep=False) for _ in range(rounds))
                table.append({"call": f"{name}, {rows}x{hidden}, wall time", "host us": wall})
    # wall time only: LlamaRMSNorm's ~20 launches a call would fill the launch queue behind
    # the sleep, and the enqueue figure would then wait on the GPU
    for name, fn in llama_norm_cases(device).items():
        for _ in range(3):
            fn()
        wall = min(host_us(fn, 50, sleep=False) for _ in range(rounds))
        table.append({"call": f"{name}, wall time", "host us": wall})
    return table


def profile(name: str, progress=print) -> None:
    """cProfile of case ``name`` (autograd's backward on this thread, so that it shows)."""
    device = torch.device("cuda", torch.cuda.current_device())
    cases = {**op_cases(device), **module_cases(*MODULE_SHAPES[0], device)}
    fn = cases[name]
    for _ in range(3):
        fn()
    profiler = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        torch.cuda._sleep(int(2e9))
        profiler.enable()
        for _ in range(300):
            fn()
        profiler.disable()
    torch.cuda.synchronize()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
        progress(f"cProfile of {name}, 300 calls, by {order}:\n{text.getvalue()}")


def trace(name: str, progress=print) -> None:
    """torch.profiler's CPU-side table of case ``name`` (CUDA API calls included): which
    calls wait on the GPU or allocate."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    device = torch.device("cuda", torch.cuda.current_device())
    cases = {**op_cases(device), **module_cases(*MODULE_SHAPES[0], device)}
    fn = cases[name]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
    progress(f"torch.profiler of {name}, 50 calls:")
    progress(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main(progress=print, match: str = "") -> list[dict]:
    return report.publish("host", run(progress, match=match), progress,
                          columns=["call", "host us", "kernels", "goal us", "same kernels us",
                                   "full path"],
                          legend="goal us (plan.execute rows): issue 26's goal, this run's bare "
                                 "3-argument launch plus 5 us per further kernel; same kernels "
                                 "us: the plan's own kernels launched bare through Triton's "
                                 "kernel[grid]; full path (functional rows): of 20 calls after "
                                 "the timing, those that took the runtime's full path instead "
                                 "of a bound call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="", help="a case to run under cProfile")
    parser.add_argument("--trace", default="", help="a case to run under torch.profiler")
    parser.add_argument("--match", default="", help="time only the cases whose names hold this")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
    if args.trace:
        trace(args.trace)
    if not (args.profile or args.trace):
        main(match=args.match)
