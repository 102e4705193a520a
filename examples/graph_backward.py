"""Train a small transformer-like stack for a few steps eagerly and through graphrt's
graph_step (forward, loss, backward and AdamW as one CUDA graph), and compare.

    python examples/graph_backward.py [--tokens 1024] [--steps 10]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from graphrt.bench.timing import timed_ms
from graphrt.models import Stack, eager_step_fn, mse, twin_stacks
from graphrt.capture import graph_step


def run(tokens: int = 1024, steps: int = 10, hidden: int = 1024, ffn: int = 4096, layers: int = 4,
        out=print) -> dict:
    if not torch.cuda.is_available():
        out(f"graph_backward: no GPU here, so the capture and the timings are skipped: {steps} "
            f"eager steps of the same {layers}-layer stack ({tokens} tokens, hidden {hidden}, "
            f"ffn {ffn}) on the CPU reference kernels")
        model = Stack(hidden, ffn, layers)
        step = eager_step_fn(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        for i in range(steps):
            x, y = (torch.randn(tokens, hidden, dtype=torch.bfloat16) for _ in range(2))
            out(f"  step {i}: loss {step(x, y).item():.5f}")
        return {}
    eager_model, graph_model, eager_opt, graph_opt, batches = twin_stacks(
        tokens, hidden, ffn, layers, steps, lr=1e-4)
    out(f"graph_backward: {layers} x (RMSNorm, Linear {hidden}->{ffn}, GELU, Linear) + RMSNorm, "
        f"{tokens} tokens, AdamW; {steps} steps eager and captured")
    step = graph_step(graph_model, mse, tuple(t.clone() for t in batches[0]), graph_opt)
    out(f"  captured: {step.nodes()}")

    eager_step = eager_step_fn(eager_model, eager_opt)
    t_eager, t_graph, worst = [], [], 0.0
    for i, (x, y) in enumerate(batches):
        loss_e, te = timed_ms(lambda: eager_step(x, y))
        loss_g, tg = timed_ms(lambda: step(x, y))
        diff = (loss_e - loss_g).abs().item()
        for p, q in zip(eager_model.parameters(), graph_model.parameters()):
            diff = max(diff, (p.grad.float() - q.grad.float()).abs().max().item(),
                       (p.float() - q.float()).abs().max().item())
        worst = max(worst, diff)
        t_eager.append(te)
        t_graph.append(tg)
        out(f"  step {i}: loss {loss_g.item():.5f}  eager {te:7.2f} ms  graph {tg:7.2f} ms  "
            f"largest difference {diff:.3g}")
    med_e, med_g = statistics.median(t_eager[1:]), statistics.median(t_graph[1:])
    out(f"  median step: eager {med_e:.2f} ms, graph {med_g:.2f} ms, speedup {med_e / med_g:.2f}x; "
        f"largest difference over all steps {worst:.3g} (loss, grads, weights)")
    return {"eager_ms": med_e, "graph_ms": med_g, "largest_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    run(args.tokens, args.steps)


if __name__ == "__main__":
    main()
