"""Every graphrt op in one list: its functional call, its plans, its benchmark module and a
small sample call (used by ``graphrt bench host`` and the scripts that walk every op).

>>> [op.name for op in OPS]                                              # doctest: +SKIP
['rmsnorm_forward', 'rmsnorm_backward', 'mhc_projection_backward', ...]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

BF16 = torch.bfloat16


@dataclass(frozen=True)
class OpEntry:
    """One op: ``name`` (as in ``graphrt.ops`` and ``torch.ops.graphrt``), the plan class,
    the ``graphrt bench`` module that measures it against its peers, its benchmark ``cases``
    (shape tuples, read by the bench module and the scripts), ``sample(device, case)``:
    (inputs, configuration keywords, output buffers) of a valid call at ``case`` (the first
    case when None), and the modules of its Triton kernels (each lists the variants that
    scripts/compile_check.py compiles in its ``compile_cases()``)."""

    name: str
    plan: str
    bench: str
    cases: tuple
    build: Callable[[torch.device, tuple], tuple[tuple, dict, dict]]
    kernels: tuple[str, ...] = ()

    def sample(self, device, case: tuple | None = None) -> tuple[tuple, dict, dict]:
        return self.build(torch.device(device), case or self.cases[0])

    def functional(self):
        from .. import ops
        return getattr(ops, self.name)

    def plan_class(self):
        from .. import ops
        return getattr(ops, self.plan)


def _rmsnorm_forward(device, case):
    rows, hidden = case
    x = torch.randn(rows, hidden, dtype=BF16, device=device)
    w = 1 + 0.1 * torch.randn(hidden, device=device)
    return (x, w), {"eps": 1e-6}, {"y": torch.empty_like(x),
                                   "rstd": torch.empty(rows, device=device)}


def _rmsnorm_backward(device, case):
    (x, w), _, _ = _rmsnorm_forward(device, case)
    rstd = torch.rand(x.shape[0], device=device) + 0.5
    return (torch.randn_like(x), x, w, rstd), {}, {"dx": torch.empty_like(x),
                                                   "dw": torch.empty_like(w)}


def _mhc_projection_backward(device, case):
    t, k = case
    x = torch.randn(t, k, dtype=BF16, device=device)
    weight = torch.randn(24, k, device=device) / k ** 0.5
    return ((x, weight, torch.randn(t, 24, device=device), torch.randn(t, 1, device=device),
             torch.rand(t, 1, device=device) + 0.5), {"allow_tf32": True},
            {"dx": torch.empty_like(x), "dweight": torch.empty_like(weight)})


def _hstu_inputs(n, d, device):
    x, u = (torch.randn(n, d, dtype=BF16, device=device) for _ in range(2))
    w = (1 + 0.1 * torch.randn(d, device=device)).to(BF16)
    b = (0.1 * torch.randn(d, device=device)).to(BF16)
    return x, u, w, b


def _hstu_lmsd_forward(device, case):
    n, d = case
    x, u, w, b = _hstu_inputs(n, d, device)
    return ((x, u, w, b), {"dropout_ratio": 0.1, "seed": 7, "offset": 0},
            {"y": torch.empty(n, 3 * d, dtype=BF16, device=device),
             "mean": torch.empty(n, device=device), "rstd": torch.empty(n, device=device),
             "mask": torch.empty(n, d, dtype=torch.int8, device=device)})


def _hstu_lmsd_backward(device, case):
    n, d = case
    x, u, w, b = _hstu_inputs(n, d, device)
    mean, rstd = torch.randn(n, device=device), torch.rand(n, device=device) + 0.5
    mask = (torch.rand(n, d, device=device) > 0.1).to(torch.int8)
    dy = torch.randn(n, 3 * d, dtype=BF16, device=device)
    flags = {"dropout_ratio": 0.1, "apply_u_silu": True, "concat_u": True, "concat_x": True}
    return ((dy, x, u, w, b, mean, rstd, mask), flags,
            {"dx": torch.empty_like(x), "du": torch.empty_like(u),
             "dweight": torch.empty_like(w), "dbias": torch.empty_like(b)})


def _grouped_gemm_wgrad(device, case):
    experts, hidden, inter, tokens = case
    a = torch.randn(tokens, hidden, dtype=BF16, device=device).t()
    b = torch.randn(tokens, inter, dtype=BF16, device=device)
    offsets = torch.arange(1, experts + 1, dtype=torch.int32, device=device) * (tokens // experts)
    return (a, b, offsets), {}, {"wgrad": torch.empty(experts, hidden, inter, dtype=BF16,
                                                      device=device)}


def _gemm_proj_rope_mxfp8(device, case):
    tokens, k, heads, nope, rope = case
    d = nope + rope
    x = torch.randn(tokens, k, dtype=BF16, device=device)
    w = (torch.randn(heads * d, k, device=device) / k ** 0.5).to(BF16)
    cos, sin = (torch.randn(tokens, rope, device=device).to(BF16) for _ in range(2))
    fp8 = torch.float8_e4m3fn
    outs = {"out_fp8_row": torch.empty(tokens, heads, d, dtype=fp8, device=device),
            "out_scales_row": torch.empty(tokens, heads, d // 32, dtype=torch.uint8,
                                          device=device),
            "out_fp8_col": torch.empty(tokens, heads, d, dtype=fp8, device=device),
            "out_scales_col": torch.empty(tokens // 32, heads, d, dtype=torch.uint8,
                                          device=device)}
    return (x, w, cos, sin), {"qk_nope_dim": nope, "qk_rope_dim": rope}, outs


def _adamw_step(device, case):
    params = [torch.randn(n, device=device) for n in case]
    state = [[torch.randn_like(p) for p in params] for _ in range(2)]
    state[1] = [v.abs() for v in state[1]]
    steps = [torch.ones((), device=device) for _ in params]   # counting this step
    return ((params, [torch.randn_like(p) for p in params], *state, steps),
            {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, {})


RMSNORM_CASES = ((16384, 2048), (16384, 4096), (16384, 5120), (16384, 7168), (4096, 5120))
HSTU_CASES = ((65536, 256), (65536, 512), (262144, 128))

OPS: tuple[OpEntry, ...] = (
    # the first case of each op is its sample: what graphrt bench host and the profiles run
    OpEntry("rmsnorm_forward", "RmsNormForward", "graphrt.bench.rmsnorm",
            RMSNORM_CASES[-1:] + RMSNORM_CASES[:-1], _rmsnorm_forward,
            ("graphrt.ops.rmsnorm.kernels",)),
    OpEntry("rmsnorm_backward", "RmsNormBackward", "graphrt.bench.rmsnorm",
            RMSNORM_CASES[-1:] + RMSNORM_CASES[:-1], _rmsnorm_backward,
            ("graphrt.ops.rmsnorm.kernels", "graphrt.reduction")),
    OpEntry("mhc_projection_backward", "MhcProjectionBackward", "graphrt.bench.mhc",
            ((4096, 20480), (16384, 28672)), _mhc_projection_backward,
            ("graphrt.ops.mhc.kernels", "graphrt.reduction")),
    OpEntry("hstu_lmsd_forward", "HstuLmsdForward", "graphrt.bench.lmsd", HSTU_CASES,
            _hstu_lmsd_forward, ("graphrt.ops.hstu.kernels",)),
    OpEntry("hstu_lmsd_backward", "HstuLmsdBackward", "graphrt.bench.lmsd", HSTU_CASES,
            _hstu_lmsd_backward, ("graphrt.ops.hstu.kernels", "graphrt.reduction")),
    # E, hidden, intermediate, tokens
    OpEntry("grouped_gemm_wgrad", "GroupedGemmWgrad", "graphrt.bench.wgrad",
            ((8, 7168, 2048, 32768), (32, 4096, 1536, 65536), (8, 2048, 1024, 8192)),
            _grouped_gemm_wgrad, ("graphrt.ops.grouped_gemm.kernels",
                                   "graphrt.ops.grouped_gemm.kernels_gluon",
                                   "graphrt.ops.grouped_gemm.kernels_mx_values",
                                   "graphrt.ops.grouped_gemm.kernels_ragged",
                                   "graphrt.ops.grouped_gemm.kernels_tensor2d")),
    # tokens, K, heads, qk_nope_dim, qk_rope_dim
    OpEntry("gemm_proj_rope_mxfp8", "GemmProjRopeMxfp8", "graphrt.bench.proj",
            ((4096, 1536, 128, 128, 64),), _gemm_proj_rope_mxfp8,
            ("graphrt.ops.proj_rope.kernels", "graphrt.ops.proj_rope.kernels_ws")),
    # the tensor sizes of one step's parameters
    OpEntry("adamw_step", "AdamWStep", "graphrt.bench.adamw",
            ((4096 * 1024, 1024, 11008 * 512),), _adamw_step, ("graphrt.ops.adamw.kernels",)),
)

# what `graphrt bench <name>` runs: each op's benchmark, and the ones that are not an op's
BENCHMARKS: dict[str, str] = {
    "rmsnorm": "graphrt.bench.rmsnorm", "mhc": "graphrt.bench.mhc", "lmsd": "graphrt.bench.lmsd",
    "wgrad": "graphrt.bench.wgrad", "proj": "graphrt.bench.proj", "adamw": "graphrt.bench.adamw",
    "host": "graphrt.bench.host", "plan_store": "graphrt.bench.plan_store",
    "capture": "graphrt.bench.capture", "ddp": "graphrt.bench.data_parallel",
    "hf": "graphrt.bench.hf", "jax": "graphrt.bench.jax_ops",
}


# Triton kernels that belong to no op: the capture layer's random fill
OTHER_KERNELS: tuple[str, ...] = ("graphrt.capture.random",)


def kernel_modules() -> tuple[str, ...]:
    """Every module with Triton kernels, each once: the ops' and OTHER_KERNELS."""
    return tuple(dict.fromkeys(m for entry in OPS for m in entry.kernels)) + OTHER_KERNELS


def op(name: str) -> OpEntry:
    """The entry of op ``name``."""
    for entry in OPS:
        if entry.name == name:
            return entry
    raise KeyError(f"graphrt has no op {name!r}; it has {[e.name for e in OPS]}")
