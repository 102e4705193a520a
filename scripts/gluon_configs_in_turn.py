"""The 1x128 Gluon kernel's configs timed in turn against the plan's at the three benchmark
cases (random counts as in fp8_unscaled.py), each output compared bitwise with the plan's
config's. Prints the median of the rounds per config and the ratio to the plan's; with $OUT
set, writes the config that is best at its worst case to $OUT/best.txt (the
GRAPHRT_SANITIZE_GLUON_CONFIG form, for compute-sanitizer).

Usage: python3 scripts/gluon_configs_in_turn.py [rounds]
"""
import os
import statistics
import sys

import torch

from graphrt.bench.timing import stream_time_us
from graphrt.bench.wgrad import offsets_of, random_counts
from graphrt.device_checks import error_flags
from graphrt.ops.grouped_gemm import kernels_gluon as fp8k
from graphrt.ops.registry import op

Config = fp8k.GluonConfig
CONFIGS = {"plan's": fp8k.GLUON_CONFIG, "128 late": Config(128, 6, 232, True),
           "128 late shared": Config(128, 6, 232, True, True),
           "128 shared": Config(128, 6, 232, False, True),
           "192 late shared": Config(192, 4, 240, True, True)}


def main(rounds: int):
    print(f"device {torch.cuda.get_device_name(0)}", flush=True)
    gen = torch.Generator().manual_seed(0)
    ratios = {name: [] for name in CONFIGS}
    for experts, hidden, inter, tokens in op("grouped_gemm_wgrad").cases:
        offsets = offsets_of(random_counts(experts, tokens, gen))
        a = torch.randn(hidden, tokens, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(inter, tokens, device="cuda").to(torch.float8_e4m3fn).t()
        a_scale = (torch.rand(tokens // 128, hidden, device="cuda") + 0.5).t()
        b_scale = torch.rand(tokens // 128, inter, device="cuda") + 0.5
        errors = error_flags(a.device)

        def call(config, out):
            return lambda: fp8k.launch_wgrad_fp8_gluon(
                a, b, a_scale, b_scale, offsets, out, None, torch.bfloat16, errors,
                hidden=hidden, inter=inter, accumulate=False, config=config)

        outs = {}
        for name, config in CONFIGS.items():
            outs[name] = torch.full((experts, hidden, inter), float("nan"), device="cuda",
                                    dtype=torch.bfloat16)
            call(config, outs[name])()
        torch.cuda.synchronize()
        plan_bits = outs["plan's"].view(torch.int16)
        for name, out in outs.items():
            print(f"  {name}: bitwise equal to the plan's config's: "
                  f"{torch.equal(out.view(torch.int16), plan_bits)}", flush=True)
        times = {name: [] for name in CONFIGS}
        for _ in range(rounds):
            for name, config in CONFIGS.items():
                times[name].append(stream_time_us(call(config, outs[name]), calls=5, repeats=5))
        flop = 2.0 * hidden * inter * tokens
        plan_us = statistics.median(times["plan's"])
        print(f"E{experts} {hidden}x{inter} T{tokens}:", flush=True)
        for name, us in times.items():
            median = statistics.median(us)
            ratios[name].append(plan_us / median)
            print(f"  {name:<16} {median:8.1f} us ({min(us):.1f}-{max(us):.1f})  "
                  f"{flop / median / 1e6:7.1f} TFLOP/s  {plan_us / median:.3f}x the plan's",
                  flush=True)
    best = max((name for name in CONFIGS if name != "plan's"), key=lambda n: min(ratios[n]))
    print(f"best at its worst case: {best} ({min(ratios[best]):.3f}x the plan's)", flush=True)
    if os.environ.get("OUT"):
        c = CONFIGS[best]
        with open(os.path.join(os.environ["OUT"], "best.txt"), "w") as f:
            f.write(f"{c.block_n},{c.stages},{c.mma_regs},{int(c.late_spread)},"
                    f"{int(c.shared_spread)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
