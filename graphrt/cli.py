"""graphrt command line: info (versions, device, backends), demo (RMSNorm through the plan API and
a captured training step), bench <op|all> (an op against its peers)."""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from importlib import metadata


def _graphrt():
    """The graphrt package with its public names loaded (torch imported): what the commands use.
    --help and --version need neither."""
    import graphrt
    graphrt._load()
    return graphrt


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def info(_args=None, out=print) -> dict:
    facts = {"graphrt": _version("graphrt"), "python": platform.python_version()}
    for k, v in facts.items():        # before torch loads (about 1.5 s)
        out(f"{k:>20}: {v}")
    graphrt = _graphrt()
    import torch
    from graphrt.plan import triton_available

    shown = len(facts)
    facts.update({"torch": torch.__version__, "triton": _version("triton"),
                  "cuda-python": _version("cuda-python"), "cachetools": _version("cachetools")})
    backends = ["reference"]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        facts.update(device=p.name, compute_capability=f"{p.major}.{p.minor}",
                     sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                     cuda=torch.version.cuda)
        if triton_available():
            backends.append("triton")
    else:
        facts.update(device="cpu (no CUDA device): the reference backend runs; with "
                            "TRITON_INTERPRET=1 the Triton kernels run under Triton's interpreter")
    facts["backends"] = ", ".join(backends)
    facts.update(_fast_paths())
    rt = graphrt.runtime()
    stats = rt.stats()
    for k, v in list(facts.items())[shown:]:
        out(f"{k:>20}: {v}")
    out(f"{'plan store':>20}: {stats['plans']}")
    out(f"{'arena':>20}: {stats['arena']}")
    return facts


def _fast_paths() -> dict:
    """Which fast paths this installation takes, and the projection kernel it would run."""
    import importlib.util

    import torch
    from graphrt.plan import hopper_module, import_failure, triton_available

    if not triton_available():
        return {"kernels": "no Triton: every op runs the PyTorch reference"}
    from graphrt import kernel_utils

    triton_version = _version("triton")
    facts = {"direct launch": "on" if kernel_utils.direct_launch_enabled() else
             f"off (Triton {triton_version} launches kernels in a way graphrt does not know)",
             "tested Triton": f"{kernel_utils.TESTED_TRITONS_TEXT} on the GPU (every fast "
                              f"path), 3.9 on the CPU (interpreter)"
                              + ("; GRAPHRT_TRUST_TRITON=1 runs the Gluon kernels on any"
                                 if kernel_utils.TRITON_TRUSTED else "")}
    on_hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    if not torch.cuda.is_available():
        facts["kernels"] = "rmsnorm, mhc, lmsd, wgrad, proj: Triton (interpreted with TRITON_INTERPRET=1)"
        return facts
    pdl = kernel_utils.PDL_ENABLED and torch.cuda.get_device_capability()[0] >= 9
    facts["programmatic launch"] = "on" if pdl else "off (GRAPHRT_PDL=0, or before compute capability 9.0)"
    gluon = kernel_utils.ON_TESTED_TRITON
    # the module the plan imports, so that a DSL that is installed but does not import shows
    cute = hopper_module("graphrt.ops.proj_rope", "kernels_cute",
                         torch.cuda.get_device_capability()) is not None
    cute_note = ""
    if on_hopper and not cute:
        cute_note = (" (nvidia-cutlass-dsl is not installed: the fastest one needs it)"
                     if importlib.util.find_spec("cutlass") is None else " (the CuTe DSL kernel "
                     f"did not import: {import_failure('graphrt.ops.proj_rope', 'kernels_cute')})")
    if on_hopper and cute:
        proj = "CuTe DSL kernel (nvidia-cutlass-dsl)"
    elif on_hopper and gluon:
        proj = "warp-specialized Gluon kernel" + cute_note
    else:
        proj = "portable Triton kernel" + cute_note
    wgrad = ("Triton, TMA kernels in Gluon; FP8 with 1x128 scales: warp-specialized Gluon kernel"
             if on_hopper and gluon else "Triton")
    facts["kernels"] = f"rmsnorm, mhc, lmsd: Triton; wgrad: {wgrad}; proj: {proj}"
    return facts


def _time_us(fn, device, iters: int = 50) -> tuple[float, float]:
    """(device time, host time) per call in microseconds; on a CPU both are wall time."""
    import torch
    fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / iters
    sync()
    if device.type != "cuda":
        return host, host
    from graphrt.bench.timing import stream_time_us
    return stream_time_us(fn), host


def demo(_args=None, out=print) -> None:
    """RMSNorm through the plan API, checked against the reference, with timings and stats; then
    the capture example: a small stack trained eagerly and as one CUDA graph per step."""
    import torch
    on_gpu = torch.cuda.is_available()
    if not on_gpu:   # the Triton kernels can still run, under Triton's interpreter (set before
        os.environ.setdefault("TRITON_INTERPRET", "1")   # the kernel modules are imported)
    graphrt = _graphrt()
    from graphrt.ops import RmsNormBackward, RmsNormForward
    from graphrt.ops.rmsnorm import rmsnorm_backward_reference, rmsnorm_forward_reference
    from graphrt.plan import triton_available

    rt = graphrt.runtime()
    device = rt.device
    interpreted = not on_gpu and triton_available() and os.environ.get("TRITON_INTERPRET") == "1"
    backend = "triton" if on_gpu or interpreted else "reference"
    rows, hidden = (16384, 4096) if on_gpu else (64, 1024)
    out(f"graphrt demo on {device}: RMSNorm train forward/backward, {rows} x {hidden} BF16")
    torch.manual_seed(0)
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device)
    w = 1 + 0.1 * torch.randn(hidden, device=device)
    g = torch.randn_like(x)
    fwd = rt.plan(RmsNormForward, x, w, eps=1e-6, backend=backend)
    y, rstd = torch.empty_like(x), torch.empty(rows, device=device)
    bwd = rt.plan(RmsNormBackward, g, x, w, rstd, backend=backend)
    dx, dw = torch.empty_like(x), torch.empty(hidden, device=device)
    out(f"  plans: {fwd.describe()['contract']}\n         {bwd.describe()['contract']}")

    def forward():
        fwd.execute(x, w, y=y, rstd=rstd)

    def backward():
        with rt.arena.scope():
            ws = rt.arena.take(bwd.workspace_bytes(), torch.cuda.current_stream() if device.type == "cuda" else None)
            bwd.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)

    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
    if on_gpu:
        (t_fwd, h_fwd), (t_bwd, h_bwd) = _time_us(forward, device), _time_us(backward, device)
    else:
        forward()
        backward()
    ref_y, ref_rstd, _ = rmsnorm_forward_reference(x, w, 1e-6)
    ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd)
    errors_fwd = f"rel err y {rel(y, ref_y):.1e}"
    errors_bwd = f"rel err dx {rel(dx, ref_dx):.1e}, dw {rel(dw, ref_dw):.1e}"
    if on_gpu:
        out(f"  backend: {fwd.backend}, errors against the PyTorch reference")
        out(f"  forward : {t_fwd:9.1f} us  {rows * hidden * 4 / t_fwd / 1e3:8.1f} GB/s   "
            f"host {h_fwd:6.1f} us/call   {errors_fwd}")
        out(f"  backward: {t_bwd:9.1f} us  {rows * hidden * 6 / t_bwd / 1e3:8.1f} GB/s   "
            f"host {h_bwd:6.1f} us/call   {errors_bwd}")
    else:
        what = ("the Triton kernels under Triton's interpreter" if interpreted else
                "the PyTorch reference (Triton is not installed, so there is nothing to compare)")
        out(f"  no GPU here: ran {what}, against the PyTorch reference; timings need a GPU")
        out(f"  forward : {errors_fwd}")
        out(f"  backward: {errors_bwd}")
    out(f"  plan store: {rt.plans.stats()}")
    out(f"  arena: {rt.arena.stats()}")
    out("")
    # BF16 matmuls on a CPU run at about 1 GFLOP/s: the CPU demo trains a smaller stack
    _run_example("graph_backward", out, **({} if on_gpu else
                                           {"tokens": 128, "hidden": 256, "ffn": 1024, "steps": 3}))


def _run_example(name: str, out, **options) -> None:
    """Run examples/<name>.py from the source tree (the demo's second part)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    if not path.exists():
        out(f"(examples/{name}.py is not in this installation; skipped)")
        return
    spec = importlib.util.spec_from_file_location(f"graphrt_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run(out=out, **options)


def bench(args, out=print) -> None:
    import torch
    _graphrt()
    from graphrt.ops.registry import BENCHMARKS as ops
    names = list(ops) if args.op == "all" else [args.op]
    if getattr(args, "out", None):
        os.environ["GRAPHRT_BENCH_DIR"] = args.out   # read by bench.report.save
    if getattr(args, "plot", False):
        os.environ["GRAPHRT_BENCH_PLOT"] = "1"       # read by bench.report.publish
    for name in names:
        if name not in ops:
            raise SystemExit(f"graphrt bench: unknown op {name!r}; choose from {sorted(ops)} or all")
        if name != "plan_store" and not torch.cuda.is_available():
            if args.op != "all":
                raise SystemExit(f"graphrt bench {name}: needs a CUDA GPU, and torch sees none "
                                 f"here (graphrt bench plan_store runs on the CPU)")
            out(f"graphrt bench {name}: needs a CUDA GPU; skipped")
            continue
        import importlib
        importlib.import_module(ops[name]).main(progress=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="graphrt", description=__doc__)
    parser.add_argument("--version", action="version",
                        version=f"graphrt {_version('graphrt')} (torch {_version('torch')}, "
                                f"triton {_version('triton')})")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device, backends, plan-store and arena stats")
    sub.add_parser("demo", help="run the demo (RMSNorm through the plan API)")
    b = sub.add_parser("bench", help="benchmark an op against its peers")
    b.add_argument("op", help="rmsnorm | mhc | lmsd | wgrad | proj | adamw | host | jax | "
                              "capture | ddp | hf | plan_store | all")
    b.add_argument("--out", metavar="DIR", default=None,
                   help="where each run writes its JSON (default: $GRAPHRT_BENCH_DIR, else "
                        "bench/results under the current directory)")
    b.add_argument("--plot", action="store_true",
                   help="also draw each table as a PNG beside its JSON (needs matplotlib)")
    args = parser.parse_args(argv)
    {"info": info, "demo": demo, "bench": bench}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
