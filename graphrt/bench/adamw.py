"""AdamW step over a model's parameters: graphrt's fused op against torch's foreach and fused
AdamW implementations (capturable, the step counts on the device), GPU time of back-to-back
steps. Bytes: p, g, m, v read and p, m, v written, per element."""
from __future__ import annotations

import torch

from . import report
from .timing import COPY_CEILING_TBPS, stream_time_us

# the HF bench's Llama (hidden 2048, 4 layers, intermediate 5632, vocab 32000): embedding, head and
# final norm, then each decoder layer's q, k, v, o, gate, up, down and two norms; and a 7168-wide MLP
_LLAMA_LAYER = [(2048, 2048), (1024, 2048), (1024, 2048), (2048, 2048), (5632, 2048),
                (5632, 2048), (2048, 5632), (2048,), (2048,)]
MODELS = {
    "llama-2048x4": [(32000, 2048), (32000, 2048), (2048,)] + _LLAMA_LAYER * 4,
    "7168-mlp": [(7168, 18432), (7168, 18432), (18432, 7168), (7168,)],
}


def _state(shapes, dtype):
    make = lambda: [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]   # noqa: E731
    params, grads, ms = make(), make(), make()
    vs = [t.abs_() for t in make()]
    steps = [torch.full((), 10.0, device="cuda") for _ in shapes]
    return params, grads, ms, vs, steps


def _torch_optimizer_step(params, grads, hyper):
    """torch.optim.AdamW(capturable=True, foreach=True) over the same tensors (its own moments)."""
    leaves = [torch.nn.Parameter(p) for p in params]
    for leaf, g in zip(leaves, grads):
        leaf.grad = g
    opt = torch.optim.AdamW(leaves, capturable=True, foreach=True, **hyper)
    return opt.step


def run(progress=print) -> list[dict]:
    from ..ops import adamw_step
    rows = []
    hyper = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for model in MODELS:
        for dtype in (torch.bfloat16, torch.float32):
            shapes = MODELS[model]
            params, grads, ms, vs, steps = _state(shapes, dtype)
            elements = sum(p.numel() for p in params)
            nbytes = 7 * elements * params[0].element_size()
            progress(f"adamw {model} {str(dtype)[6:]}: {elements / 1e6:.0f} M parameters ...")
            impls = {
                "graphrt adamw_step": lambda: adamw_step(params, grads, ms, vs, steps, **hyper),
                "torch _fused_adamw_": lambda: torch._fused_adamw_(
                    params, grads, ms, vs, [], steps, lr=hyper["lr"], beta1=0.9, beta2=0.95,
                    weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False),
                "torch AdamW foreach (capturable)": _torch_optimizer_step(params, grads, hyper),
            }
            times = {}
            for name, fn in impls.items():
                try:
                    times[name] = stream_time_us(fn, calls=5, repeats=5)
                except Exception as exc:   # a peer this torch lacks is reported, not fatal
                    progress(f"  {name}: {type(exc).__name__}: {exc}")
            for name, us in times.items():
                rows.append({"model": model, "dtype": str(dtype)[6:], "impl": name, "us": us,
                             "TB/s": nbytes / us / 1e6,
                             "of_copy_ceiling": nbytes / us / 1e6 / COPY_CEILING_TBPS,
                             "speedup_vs_graphrt": times["graphrt adamw_step"] / us})
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "adamw", run(progress), progress,
        columns=["model", "dtype", "impl", "us", "TB/s", "of_copy_ceiling", "speedup_vs_graphrt"],
        legend="GPU time per step, 5 back-to-back steps behind a sleep (host excluded); bytes: p, "
               "g, m, v read and p, m, v written; of_copy_ceiling: against the "
               f"measured {COPY_CEILING_TBPS} TB/s")
