"""A Hugging Face Llama training step (AdamW) many ways, each in a fresh process so that peak
memory is its own: eager, eager with graphrt's norms, torch.compile (default and
reduce-overhead), per-layer graphs (graph_modules: make_graphed_callables per decoder layer),
graph_step, and graph_step of the compiled model, all with torch.optim.AdamW(capturable=True);
then with the optimizer's step fused: graphrt.optim.AdamW under graph_step, and as the peer
torch's own AdamW(fused=True) under reduce-overhead. Needs transformers.

Run one variant alone: ``python -m graphrt.bench.hf VARIANT BATCHxSEQ`` (prints one JSON line;
``eager_paired``, stock and graphrt norms timed in alternating blocks in one process, prints
two).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from . import report
from ..models import eager_step_fn, lm_loss

VARIANTS = ("eager", "eager_graphrt_norms", "eager_paired", "compile", "compile_reduce_overhead",
            "graphed_layers", "graph_step", "graph_step_compiled",
            "compile_reduce_overhead+torch_fused_adamw", "graph_step+graphrt_adamw",
            "graph_step_compiled+graphrt_adamw")
SIZES = ((1, 512), (2, 2048))
CONFIG = dict(hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
              num_key_value_heads=8, intermediate_size=5632, vocab_size=32000,
              max_position_embeddings=4096, use_cache=False)
STEPS = 20
VARIANT_TIMEOUT_S = 240


def _model():
    import transformers

    config = transformers.LlamaConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()


def _batches(batch: int, seq: int) -> list[tuple]:
    """Four (input ids, labels) batches of random tokens, the same in every process."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    return [tuple(torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda",
                                generator=gen) for _ in range(2)) for _ in range(4)]


PAIRED_BLOCKS, PAIRED_BLOCK_STEPS = 40, 5


def measure_paired(batch: int, seq: int) -> list[dict]:
    """The eager step with stock norms and with graphrt's, in one process on one host: two
    models with the same weights, each with its own AdamW, timed in alternating blocks of
    steps so that the host's drift over the run falls on both alike. A row per variant with
    the median of its blocks' ms per step, and its blocks' range."""
    import statistics

    import graphrt

    models = {"eager (paired)": _model(), "eager_graphrt_norms (paired)": _model()}
    graphrt.nn.replace_norms(models["eager_graphrt_norms (paired)"])
    data = _batches(batch, seq)
    steps, times, losses = {}, {}, {}
    for name, model in models.items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, capturable=True)
        steps[name] = eager_step_fn(model, opt, lm_loss)
        for i in range(6):
            steps[name](*data[i % 4])
        times[name] = []
    torch.cuda.synchronize()
    for block in range(PAIRED_BLOCKS):
        order = list(steps) if block % 2 == 0 else list(reversed(steps))
        for name in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(PAIRED_BLOCK_STEPS):
                losses[name] = steps[name](*data[i % 4])
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3 / PAIRED_BLOCK_STEPS)
    return [{"variant": name, "tokens": f"{batch}x{seq}",
             "ms_per_step": statistics.median(times[name]),
             "ms_range": f"{min(times[name]):.2f}-{max(times[name]):.2f}",
             "loss": float(losses[name])} for name in models]   # no peak memory: one process


def measure(variant: str, batch: int, seq: int) -> dict:
    """ms per step (wall, host included, back to back), peak memory reserved, capture time."""
    import graphrt
    from graphrt.capture import graph_modules, graph_step

    model = _model()
    variant, _, optimizer = variant.partition("+")
    if not variant.startswith(("eager", "compile")) or variant == "eager_graphrt_norms":
        graphrt.nn.replace_norms(model)
    if optimizer == "graphrt_adamw":
        opt = graphrt.optim.AdamW(model.parameters(), lr=1e-5)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, capturable=True,
                                fused=optimizer == "torch_fused_adamw" or None)
    data = _batches(batch, seq)
    t0 = time.perf_counter()
    if variant.startswith("graph_step"):
        target = torch.compile(model) if variant == "graph_step_compiled" else model
        # the sample batch becomes the static inputs that every step overwrites: not data[0]
        step_graph = graph_step(target, lm_loss, tuple(t.clone() for t in data[0]), opt)
        step = step_graph.step
    else:
        forward = model
        if variant == "compile":
            forward = torch.compile(model)
        elif variant == "compile_reduce_overhead":
            forward = torch.compile(model, mode="reduce-overhead")
        elif variant == "graphed_layers":
            graph_modules(model, model.model.layers, (data[0][0],))

        step = eager_step_fn(forward, opt, lm_loss)
        for _ in range(3):
            step(*data[0])
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    for i in range(3):
        step(*data[i % 4])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(STEPS):
        loss = step(*data[i % 4])
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / STEPS
    row = {"variant": variant + (f"+{optimizer}" if optimizer else ""),
           "tokens": f"{batch}x{seq}", "ms_per_step": ms,
           "peak_reserved_MiB": torch.cuda.max_memory_reserved() / 2**20,
           "setup_s": setup_s, "loss": float(loss)}
    if variant.startswith("graph_step"):
        mem = step_graph.memory()
        row.update(pool_reserved_MiB=mem["reserved"] / 2**20,
                   pool_allocated_MiB=mem["allocated"] / 2**20)
    return row


def _sizes() -> tuple:
    """SIZES, or those in GRAPHRT_BENCH_HF_SIZES ("1x512,2x2048")."""
    chosen = os.environ.get("GRAPHRT_BENCH_HF_SIZES")
    if not chosen:
        return SIZES
    return tuple(tuple(int(v) for v in s.split("x")) for s in chosen.split(","))


def _variants() -> tuple:
    """VARIANTS, or those in GRAPHRT_BENCH_HF_VARIANTS (comma-separated)."""
    chosen = os.environ.get("GRAPHRT_BENCH_HF_VARIANTS")
    return tuple(chosen.split(",")) if chosen else VARIANTS


def run(progress=print) -> list[dict]:
    rows = []
    for batch, seq in _sizes():
        for variant in _variants():
            progress(f"hf llama: {variant}, {batch}x{seq} tokens ...")
            proc = subprocess.run([sys.executable, "-m", "graphrt.bench.hf", variant,
                                   f"{batch}x{seq}"], capture_output=True, text=True,
                                  timeout=VARIANT_TIMEOUT_S)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                progress(f"  failed: {' | '.join(tail)}")
                rows.append({"variant": variant, "tokens": f"{batch}x{seq}", "error": tail[-1:]})
                continue
            for line in lines:   # the paired variant prints a row per model
                rows.append(json.loads(line))
                progress(f"  {line}")
        base = next((r for r in rows if r.get("variant") == "compile_reduce_overhead"
                     and r["tokens"] == f"{batch}x{seq}" and "ms_per_step" in r), None)
        eager_mem = next((r["peak_reserved_MiB"] for r in rows if r.get("variant") == "eager"
                          and r["tokens"] == f"{batch}x{seq}" and "ms_per_step" in r), None)
        for r in rows:
            if r["tokens"] == f"{batch}x{seq}" and "ms_per_step" in r:
                if base:
                    r["vs_reduce_overhead"] = base["ms_per_step"] / r["ms_per_step"]
                if eager_mem and "peak_reserved_MiB" in r:   # paired rows have none
                    r["memory_vs_eager"] = r["peak_reserved_MiB"] / eager_mem
    return rows


def main(progress=print) -> list[dict]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SystemExit("graphrt bench hf: needs transformers (pip install graphrt[hf])")
    return report.publish(
        "hf", run(progress), progress,
        columns=["variant", "tokens", "ms_per_step", "ms_range", "vs_reduce_overhead",
                 "peak_reserved_MiB",
                 "memory_vs_eager", "setup_s", "loss"],
        legend="Llama (hidden 2048, 4 layers, 16/8 heads, intermediate 5632, vocab 32000), bf16, "
               "SDPA, AdamW(capturable) (+...: the optimizer's step fused); ms_per_step: wall "
               "time per step, back to back, host included; vs_reduce_overhead: "
               "torch.compile(mode='reduce-overhead') time over this one; peak_reserved: "
               "torch.cuda.max_memory_reserved in a fresh process")


if __name__ == "__main__":
    b, s = (int(v) for v in sys.argv[2].split("x"))
    if sys.argv[1] == "eager_paired":
        for row in measure_paired(b, s):
            print(json.dumps(row))
    else:
        print(json.dumps(measure(sys.argv[1], b, s)))
