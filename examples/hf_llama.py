"""Train a Hugging Face Llama (built from a config: random weights, nothing downloaded) with
graphrt: swap its RMSNorms for graphrt's, capture the whole step (forward, loss, backward, graphrt's AdamW)
as one CUDA graph, and train it next to an eager copy, step by step.

    python examples/hf_llama.py [--steps 5] [--tokens 512] [--layers 2]

Needs transformers (pip install -e ".[hf]") and a GPU; without a GPU it says so and stops.
"""
from __future__ import annotations

import argparse
import copy

import torch

import graphrt
from graphrt.bench.timing import timed_ms
from graphrt.models import eager_step_fn, lm_loss
from graphrt.capture import graph_step


def build(layers: int, hidden: int = 1024, vocab: int = 32000):
    import transformers

    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                      num_hidden_layers=layers, num_attention_heads=16,
                                      num_key_value_heads=8, vocab_size=vocab, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()


def run(steps: int = 5, tokens: int = 512, layers: int = 2, out=print) -> dict:
    try:
        import transformers  # noqa: F401
    except ImportError:
        out("hf_llama: needs transformers (pip install -e '.[hf]'); nothing was run")
        return {}
    if not torch.cuda.is_available():
        out("hf_llama: CUDA graphs need a GPU; nothing was run on this CPU machine")
        return {}
    eager = build(layers)
    report = graphrt.nn.replace_norms(eager)
    out(f"replaced {len(report.replaced)} norms with graphrt.nn.RMSNorm; left alone: "
        f"{report.skipped or 'none'}")
    graphed = copy.deepcopy(eager)
    # graphrt's AdamW: torch's, with the step fused (most of this step's GPU time otherwise)
    opt_e, opt_g = (graphrt.optim.AdamW(m.parameters(), lr=1e-4) for m in (eager, graphed))
    gen = torch.Generator(device="cuda").manual_seed(1)
    batches = [tuple(torch.randint(0, 32000, (1, tokens), device="cuda", generator=gen)
                     for _ in range(2)) for _ in range(steps)]
    # the sample batch becomes the step's static inputs: a copy, not one of the batches
    sample = tuple(t.clone() for t in batches[0])
    step, capture_ms = timed_ms(lambda: graph_step(graphed, lm_loss, sample, opt_g))
    out(f"captured the step in {capture_ms:.0f} ms: {step.nodes()['kernel']} kernels, "
        f"pool {step.memory()['reserved'] / 2**20:.0f} MiB")

    eager_step = eager_step_fn(eager, opt_e, lm_loss)

    for i, (ids, labels) in enumerate(batches):
        loss_e, te = timed_ms(lambda: eager_step(ids, labels))
        loss_g, tg = timed_ms(lambda: step(ids, labels))
        out(f"step {i}: loss eager {loss_e.item():.5f} graph {loss_g.item():.5f}  "
            f"eager {te:7.2f} ms  graph {tg:7.2f} ms")
    graphrt.check_errors()
    return {"steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    run(args.steps, args.tokens, args.layers)


if __name__ == "__main__":
    main()
