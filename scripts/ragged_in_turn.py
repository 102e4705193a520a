"""Ragged wgrad against the other layouts and against itself at odd counts, at the benchmark
cases: every layout timed in turn at counts in multiples of 256 (``layouts_in_turn``: each
layout's median over the rounds, the ragged plan's fraction of the fastest), then the ragged
plan at odd counts and at those counts in turn (the odd / x256 ratio). The counts are
``graphrt bench wgrad``'s. Run it on two trees in turn to compare them on one GPU.

    python scripts/ragged_in_turn.py
"""

import torch

from graphrt.bench.timing import rotating
from graphrt.bench.wgrad import (_operands, call_workspace, CASES, layouts_in_turn,
                                  medians_in_turn, odd_counts, offsets_of,
                                  random_counts)
from graphrt.ops import GroupedGemmWgrad


def ragged_odd_and_x256(experts, hidden, inter, tokens, aligned, odd, rounds=5):
    """The ragged plan's median time at ``odd`` and at ``aligned`` counts, timed in turn."""
    sets = [_operands(tokens, hidden, inter, "k", "k") for _ in range(2)]
    out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
    runs = {}
    for name, counts in (("odd", odd), ("x256", aligned)):
        offsets = offsets_of(counts)
        plan = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets,
                                input_order="tensor_ragged").compile()
        ws = call_workspace(plan, tokens)
        runs[name] = rotating(lambda a, b, plan=plan, ws=ws, offsets=offsets: plan.execute(
            a, b, offsets, wgrad=out, workspace=ws), sets)
    return medians_in_turn(runs, rounds)


def main():
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        aligned = random_counts(experts, tokens, gen)
        odd = odd_counts(aligned, gen)
        layouts = layouts_in_turn(experts, hidden, inter, tokens, aligned)
        fastest = min(layouts.values())
        cells = ", ".join(f"{'/'.join(k)} {us:.1f}" for k, us in layouts.items())
        ragged = layouts["k", "k", "tensor_ragged"]
        print(f"E{experts} {hidden}x{inter} T{tokens} x256, us: {cells}; ragged "
              f"{fastest / ragged:.3f} of the fastest", flush=True)
        both = ragged_odd_and_x256(experts, hidden, inter, tokens, aligned, odd)
        print(f"E{experts} {hidden}x{inter} T{tokens} ragged: odd {both['odd']:.1f} us, x256 "
              f"{both['x256']:.1f} us, odd / x256 {both['odd'] / both['x256']:.3f}",
              flush=True)


if __name__ == "__main__":
    main()
