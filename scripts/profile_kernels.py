"""One call of each op at its benchmark shape, inside cudaProfilerStart/Stop, for
`ncu --profile-from-start off` on the device; with --copies, times plain device copies of the
same byte counts instead (a size-matched ceiling for the short kernels); with --time, times each
call back to back on the same inputs (for A/B runs, e.g. with and without GRAPHRT_PDL=0).

Usage: python3 scripts/profile_kernels.py [--copies | --time] [op ...]
(ops: rmsnorm mhc lmsd proj gemm wgrad_fp8; gemm is cuBLAS's x @ W^T at the proj shape, a peer;
wgrad_fp8 is the 1x128 FP8 wgrad at its first case: the plan (the warp-specialized Gluon
kernel on Hopper with Triton 3.6, else the Triton kernel), then the Gluon kernel directly)
"""
import sys

import torch

from graphrt.bench.timing import n_input_sets, rotating, stream_time_us
from graphrt.ops.registry import op

dev = torch.device("cuda")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
ops = args or ["rmsnorm", "mhc", "lmsd", "proj"]


def functional_call(name: str, case: tuple | None = None, **overrides):
    """(label, no-argument call) of op ``name``'s functional call at a registry case."""
    entry = op(name)
    case = case or entry.cases[0]
    inputs, config, _ = entry.sample(dev, case)
    config.update(overrides)
    fn = entry.functional()
    return f"{name} {'x'.join(map(str, case))}", lambda: fn(*inputs, **config)


def calls():
    """(name, no-argument callable) per kernel group to profile."""
    out = []
    if "rmsnorm" in ops:
        out += [functional_call(n, (16384, 2048)) for n in ("rmsnorm_forward", "rmsnorm_backward")]
    if "mhc" in ops:
        out.append(functional_call("mhc_projection_backward"))
    if "lmsd" in ops:
        for case in op("hstu_lmsd_forward").cases[:2]:
            out += [functional_call("hstu_lmsd_forward", case, seed=2),
                    functional_call("hstu_lmsd_backward", case)]
    if "proj" in ops:
        out.append(functional_call("gemm_proj_rope_mxfp8"))
    if "gemm" in ops:
        tokens, k, heads, nope, rope = op("gemm_proj_rope_mxfp8").cases[0]
        xg = torch.randn(tokens, k, dtype=torch.bfloat16, device=dev)
        wg = torch.randn(heads * (nope + rope), k, dtype=torch.bfloat16, device=dev)
        out.append((f"cuBLAS gemm {tokens}x{k}x{heads * (nope + rope)}", lambda: xg @ wg.t()))
    if "wgrad_fp8" in ops:
        out += wgrad_fp8_calls()
    return out


def wgrad_fp8_calls():
    """The 1x128 FP8 wgrad at the first benchmark case: the functional call and the
    warp-specialized Gluon kernel called directly."""

    from graphrt.bench.wgrad import _fp8_operands, offsets_of, random_counts
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm import kernels_gluon
    experts, hidden, inter, tokens = op("grouped_gemm_wgrad").cases[0]
    counts = random_counts(experts, tokens, torch.Generator().manual_seed(0))
    offsets = offsets_of(counts, dev)
    a, b, sa, sb = _fp8_operands(tokens, hidden, inter, torch.float32, 128)
    out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device=dev)
    label = f"wgrad fp8 1x128 {experts}x{hidden}x{inter} T{tokens}"
    return [(f"{label} plan", lambda: op("grouped_gemm_wgrad").functional()(
                a, b, offsets, a_scale=sa, b_scale=sb, check_offsets=False)),
            (f"{label} Gluon", lambda: kernels_gluon.launch_wgrad_fp8_gluon(
                a, b, sa, sb, offsets, out, None, torch.bfloat16, error_flags(dev),
                hidden=hidden, inter=inter, accumulate=False))]


def time_copies():
    """Device copies moving the bytes of the RMSNorm and LMSD benchmark cases."""
    for label, n_bytes in [("rmsnorm fwd 16384x2048", 16384 * 2048 * 4),
                           ("rmsnorm bwd 16384x2048", 16384 * 2048 * 6),
                           ("rmsnorm fwd/bwd 4096x5120", 4096 * 5120 * 4),
                           ("lmsd fwd 65536x256", 65536 * 256 * 11)]:
        half = n_bytes // 2
        sets = [(torch.empty(half, dtype=torch.uint8, device=dev),
                 torch.empty(half, dtype=torch.uint8, device=dev))
                for _ in range(n_input_sets(n_bytes, dev))]
        us = stream_time_us(rotating(lambda dst, src: dst.copy_(src), sets))
        print(f"copy of {n_bytes / 1e6:.1f} MB ({label}): {us:.1f} us, {n_bytes / us / 1e6:.2f} TB/s")


if __name__ == "__main__":
    if "--copies" in sys.argv:
        time_copies()
        sys.exit(0)
    todo = calls()
    if "--time" in sys.argv:
        for name, fn in todo:
            us = stream_time_us(fn)
            print(f"{name}: {us:.1f} us")
        sys.exit(0)
    for _, fn in todo:  # compile and warm up outside the profiled range
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in todo:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", ", ".join(name for name, _ in todo))
