"""One call of each op at its benchmark shape, inside cudaProfilerStart/Stop, for
`ncu --profile-from-start off` on the device; with --copies, times plain device copies of the
same byte counts instead (a size-matched ceiling for the short kernels); with --time, times each
call back to back on the same inputs (for A/B runs, e.g. with and without GRAPHRT_PDL=0).

Usage: python3 scripts/profile_kernels.py [--copies | --time] [op ...]
(ops: rmsnorm mhc lmsd proj gemm; gemm is cuBLAS's x @ W^T at the proj shape, a peer)
"""
import sys

import torch

import graphrt
from graphrt.bench.timing import n_input_sets, rotating, stream_time_us

dev = torch.device("cuda")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
ops = args or ["rmsnorm", "mhc", "lmsd", "proj"]


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16, device=dev)


def calls():
    """(name, no-argument callable) per kernel group to profile."""
    out = []
    if "rmsnorm" in ops:
        x, g, w = bf16(16384, 2048), bf16(16384, 2048), torch.randn(2048, device=dev)
        y, rstd = graphrt.ops.rmsnorm_forward(x, w)
        out += [("rmsnorm fwd 16384x2048", lambda: graphrt.ops.rmsnorm_forward(x, w)),
                ("rmsnorm bwd 16384x2048", lambda: graphrt.ops.rmsnorm_backward(g, x, w, rstd))]
    if "mhc" in ops:
        t, k = 4096, 20480
        xm, wm, gp = bf16(t, k), torch.randn(24, k, device=dev), torch.randn(t, 24, device=dev)
        gr, r = torch.randn(t, 1, device=dev), torch.rand(t, 1, device=dev) + 0.5
        out.append(("mhc bwd 4096x20480", lambda: graphrt.ops.mhc_projection_backward(
            xm, wm, gp, gr, r, allow_tf32=True)))
    if "lmsd" in ops:
        for d in (256, 512):
            xh, uh = bf16(65536, d), bf16(65536, d)
            wh, bh = bf16(d), bf16(d)
            flags = dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)
            yh, mean, rs, mask = graphrt.ops.hstu_lmsd_forward(xh, uh, wh, bh, seed=1, **flags)
            dy = torch.randn_like(yh)
            out += [(f"lmsd fwd 65536x{d}", lambda xh=xh, uh=uh, wh=wh, bh=bh, flags=flags:
                     graphrt.ops.hstu_lmsd_forward(xh, uh, wh, bh, seed=2, **flags)),
                    (f"lmsd bwd 65536x{d}", lambda dy=dy, xh=xh, uh=uh, wh=wh, bh=bh, mean=mean,
                     rs=rs, mask=mask, flags=flags: graphrt.ops.hstu_lmsd_backward(
                         dy, xh, uh, wh, bh, mean, rs, mask, **flags))]
    if "proj" in ops:
        xp, wp = bf16(4096, 1536), bf16(128 * 192, 1536)
        cs = bf16(4096, 64)
        out.append(("proj bf16 4096x1536x128h", lambda: graphrt.ops.gemm_proj_rope_mxfp8(xp, wp, cs, cs)))
    if "gemm" in ops:
        xg, wg = bf16(4096, 1536), bf16(128 * 192, 1536)
        out.append(("cuBLAS gemm 4096x1536x24576", lambda: xg @ wg.t()))
    return out


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
