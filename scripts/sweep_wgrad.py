"""Sweep grouped-wgrad tile configs on the GPU: each checked against a loop of torch.mm, then
timed next to torch._grouped_mm and the loop (device machine)."""
import itertools

import torch

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.bench.wgrad import CASES, random_counts
from graphrt.ops.grouped_gemm.kernels import GemmConfig, launch_wgrad
from graphrt.ops.grouped_gemm.reference import expert_bounds

CONFIGS = [GemmConfig(*c) for c in [
    (128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8),
    (128, 256, 64, 8, 3, 8), (256, 128, 64, 8, 3, 8), (128, 128, 64, 4, 4, 8),
    (128, 128, 128, 8, 3, 8), (128, 256, 64, 8, 4, 8), (64, 256, 64, 4, 4, 8)]]


def main():
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        counts = random_counts(experts, tokens, gen)
        offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device="cuda")
        bounds = expert_bounds(offsets, tokens)
        sets = [(torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda").t(),
                 torch.randn(tokens, inter, dtype=torch.bfloat16, device="cuda")) for _ in range(2)]
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        ref = torch.stack([sets[0][0][:, s:e].float() @ sets[0][1][s:e].float() for s, e in bounds])
        flops = 2.0 * hidden * inter * tokens

        def tf(us):
            return flops / us / 1e6
        peers = {"torch._grouped_mm": lambda a, b: torch._grouped_mm(a, b, offs=offsets),
                 "loop": lambda a, b: [torch.mm(a[:, s:e], b[s:e], out=out[i])
                                       for i, (s, e) in enumerate(bounds)]}
        line = ", ".join(f"{k} {tf(stream_time_us(rotating(f, sets))):.0f}" for k, f in peers.items())
        print(f"E={experts} {hidden}x{inter} tokens={tokens}: {line} TFLOP/s", flush=True)
        for cfg in CONFIGS:
            def run(a, b, cfg=cfg):
                launch_wgrad(cfg, a, b, offsets, out, None, torch.bfloat16, hidden=hidden,
                             inter=inter, a_k_major=False, b_k_major=False, ragged=False,
                             accumulate=False, dot_fp32=False)
            try:
                run(*sets[0])
                err = ((out.float() - ref).norm() / ref.norm()).item()
                us = stream_time_us(rotating(run, sets))
                print(f"  {cfg}: {us:.1f} us {tf(us):.0f} TFLOP/s err={err:.1e}", flush=True)
            except Exception as e:
                print(f"  {cfg}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
