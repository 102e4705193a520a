"""How evenly a grouped-wgrad launch's work items spread over the H200's 132 SMs, by a model
(no GPU): each item (one output tile of one expert) costs its expert's 64-token steps plus one
for its store; the launch takes as long as its busiest SM. Schedules compared, at the
benchmark cases' counts as ``scripts/sweep_wgrad.py --ragged`` draws them:
- stride: the persistent TMA kernel's (program p takes items p, p + 132, ..., experts
  outermost);
- in order: the hardware's for a one-item-per-program grid, experts outermost (the Triton
  kernel's): each item to the first SM that frees up;
- sorted stride / sorted snake: experts by count, largest first; snake reverses the programs'
  order every round;
- LPT: sorted, each item to the least-loaded SM (the bound the others are compared with)."""
import heapq

import torch

from graphrt.bench.wgrad import CASES, odd_counts, random_counts

SMS = 132


def _stride(costs, snake=False):
    load = [0] * SMS
    for w, c in enumerate(costs):
        rnd, k = divmod(w, SMS)
        load[SMS - 1 - k if snake and rnd % 2 else k] += c
    return max(load)


def _greedy(costs):
    heap = [(0, p) for p in range(SMS)]
    for c in costs:
        t, p = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, p))
    return max(t for t, _ in heap)


def main():
    gen = torch.Generator().manual_seed(0)
    print("case | counts | mean | stride | in order | sorted stride | sorted snake | LPT (steps)")
    for experts, hidden, inter, tokens in CASES:
        counts = random_counts(experts, tokens, gen)
        odd_counts(counts, gen)   # the sweep's draws, in its order
        tiles = 8 * -(-(hidden // 8) // 128) * -(-inter // 256)
        costs = [-(-n // 64) + 1 for n in counts for _ in range(tiles)]
        ranked = sorted(costs, reverse=True)
        print(f"E{experts} {hidden}x{inter} T{tokens} | {counts} | {sum(costs) / SMS:.1f} | "
              f"{_stride(costs)} | {_greedy(costs)} | {_stride(ranked)} | "
              f"{_stride(ranked, snake=True)} | {_greedy(ranked)}")


if __name__ == "__main__":
    main()
