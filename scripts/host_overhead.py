"""Host time per call: graphrt's RMSNorm through each layer of its API (module with autograd,
functional call, plan.execute, the bare Triton launches) against Liger's and PyTorch's modules,
then a cProfile of the layer named by --profile. The GPU is kept busy by a sleep queued ahead of
the calls, so the host never waits on it: the figures are enqueue time alone.

Usage: python3 scripts/host_overhead.py [--rows 4096] [--hidden 5120] [--profile backward]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import graphrt
from graphrt.ops import RmsNormBackward, RmsNormForward, rmsnorm_backward, rmsnorm_forward
from graphrt.ops.rmsnorm import kernels as rms_kernels
from graphrt.validate import sm_count


def host_us(fn, calls: int = 200, repeats: int = 5, sleep: bool = True) -> float:
    """Best-of-``repeats`` mean time per call of ``fn`` (microseconds): enqueue time behind a
    GPU sleep, or with ``sleep`` false wall time (host time where the GPU keeps up)."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        if sleep:
            torch.cuda._sleep(int(4e8))  # about 0.2 s of GPU time: longer than the enqueue
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return best * 1e6


def cases(rows: int, hidden: int):
    rt = graphrt.runtime()
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    w = 1 + 0.1 * torch.randn(hidden, device="cuda")
    g = torch.randn_like(x)
    y, rstd = torch.empty_like(x), torch.empty(rows, device="cuda")
    dx, dw = torch.empty_like(x), torch.empty(hidden, device="cuda")
    fwd = rt.plan(RmsNormForward, x, w, eps=1e-6)
    bwd = rt.plan(RmsNormBackward, g, x, w, rstd)
    partial = torch.empty(bwd.workspace_bytes() // 4, device="cuda")
    stream = torch.cuda.current_stream()

    def plan_backward():
        with rt.arena.scope():
            ws = rt.arena.take(bwd.workspace_bytes(), stream)
            bwd.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)

    def bare_forward():
        rms_kernels.launch_forward(fwd.config, sm_count(x.device), x, None, w, y, rstd, None, rows,
                                   (hidden, 0, hidden, 0), 1e-6)

    def bare_backward():
        rms_kernels.launch_backward(bwd.config, bwd.n_programs, g, x, w, rstd, None, dx, dw,
                                    partial, rows, (hidden, hidden, 0, hidden))

    xr = x.detach().requires_grad_()
    modules = {"graphrt.nn.RMSNorm": graphrt.nn.RMSNorm(hidden, device="cuda"),
               "torch.nn.RMSNorm": torch.nn.RMSNorm(hidden, eps=1e-6, device="cuda",
                                                    dtype=torch.bfloat16)}
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        modules["LigerRMSNorm"] = LigerRMSNorm(hidden, eps=1e-6).cuda()
    except Exception as exc:  # the peer is optional
        print(f"Liger not measured: {exc}")

    out = {}
    for name, module in modules.items():
        out[f"{name} forward"] = lambda m=module: m(xr)
        out[f"{name} forward + backward"] = lambda m=module: m(xr).backward(g)
    out.update({
        "functional forward": lambda: rmsnorm_forward(x, w),
        "functional backward": lambda: rmsnorm_backward(g, x, w, rstd),
        "plan.execute forward": lambda: fwd.execute(x, w, y=y, rstd=rstd),
        "plan.execute backward (with arena)": plan_backward,
        "bare Triton launch forward": bare_forward,
        "bare Triton launches backward (2)": bare_backward,
    })
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--profile", default="", help="a case name's start, to run under cProfile")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--rounds", type=int, default=7, help="timed batches per case")
    parser.add_argument("--wall", action="store_true",
                        help="wall time per call without the GPU sleep (for small shapes)")
    args = parser.parse_args()
    measured = cases(args.rows, args.hidden)
    what = "wall time" if args.wall else "host time behind a GPU sleep"
    print(f"{what} per call, {args.rows} x {args.hidden} BF16 ({torch.cuda.get_device_name()})")
    # rounds over all the cases, each case's best round kept: the host's speed drifts, and
    # interleaving spreads the drift over every case alike
    best = {name: float("inf") for name in measured}
    for _ in range(args.rounds):
        for name, fn in measured.items():
            best[name] = min(best[name], host_us(fn, args.calls, 1, sleep=not args.wall))
    for name, us in best.items():
        print(f"{name:>44}: {us:7.1f} us", flush=True)
    if args.profile:
        name = next(n for n in measured if n.startswith(args.profile))
        fn = measured[name]
        profiler = cProfile.Profile()
        if not args.wall:
            torch.cuda._sleep(int(2e9))
        profiler.enable()
        for _ in range(400):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(f"cProfile of {name}, 400 calls:\n{text.getvalue()}")


if __name__ == "__main__":
    main()
