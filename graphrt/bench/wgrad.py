"""Grouped GEMM weight gradients against torch._grouped_mm and a loop of torch.mm (TFLOP/s)."""
from __future__ import annotations

import itertools

import torch

from ..ops import GroupedGemmWgrad
from ..ops.grouped_gemm.reference import expert_bounds
from ..ops.registry import op
from . import report
from .timing import BF16_GEMM_CEILING_TFLOPS, device_time_us, rotating, stream_time_us

CASES = op("grouped_gemm_wgrad").cases


def random_counts(experts: int, tokens: int, generator: torch.Generator) -> list[int]:
    """Token counts per expert: random multiples of 256 summing to ``tokens``."""
    units = tokens // 256
    cuts = sorted(torch.randint(0, units + 1, (experts - 1,), generator=generator).tolist())
    return [256 * (b - a) for a, b in zip([0] + cuts, cuts + [units])]


def run(progress=print) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        progress(f"wgrad E={experts} hidden={hidden} intermediate={inter} tokens={tokens} ...")
        counts = random_counts(experts, tokens, gen)
        offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device="cuda")
        bounds = expert_bounds(offsets, tokens)
        sets = [(torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda").t(),
                 torch.randn(tokens, inter, dtype=torch.bfloat16, device="cuda"))
                for _ in range(2)]
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        plan = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets).compile()
        impls = {"graphrt": lambda a, b: plan.execute(a, b, offsets, wgrad=out),
                 "loop of torch.mm": lambda a, b: [torch.mm(a[:, s:e], b[s:e], out=out[i])
                                                   for i, (s, e) in enumerate(bounds)]}
        if hasattr(torch, "_grouped_mm"):
            impls["torch._grouped_mm"] = lambda a, b: torch._grouped_mm(a, b, offs=offsets)
        flops = 2.0 * hidden * inter * tokens
        times = {k: stream_time_us(rotating(f, sets)) for k, f in impls.items()}
        flushed = {k: device_time_us(rotating(f, sets)) for k, f in impls.items()}
        for name, us in times.items():
            tflops = flops / (us * 1e-6) / 1e12
            rows.append({"E": experts, "hidden": hidden, "intermediate": inter, "tokens": tokens,
                         "impl": name, "us": us, "TFLOP/s": tflops,
                         "of_ceiling": tflops / BF16_GEMM_CEILING_TFLOPS,
                         "speedup_vs": us / times["graphrt"], "do_bench_us": flushed[name]})
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "wgrad", run(progress), progress,
        legend="A is M-major (the transpose of a [tokens, hidden] activation), B N-major; token "
               "counts per expert are random multiples of 256")
