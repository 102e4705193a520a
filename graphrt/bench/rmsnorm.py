"""RMSNorm train forward/backward against eager PyTorch, torch.compile and Liger."""
from __future__ import annotations

import torch

from ..ops.registry import RMSNORM_CASES
from ..ops.rmsnorm import RmsNormBackward, RmsNormForward
from . import report
from .timing import COPY_CEILING_TBPS, device_time_us, n_input_sets, rotating, stream_time_us

CASES = RMSNORM_CASES
EPS = 1e-6
BYTES_PER_ELEMENT = {"forward": 4, "backward": 6}


def eager_forward(x, w):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * rstd * w).to(x.dtype), rstd.squeeze(-1)


def eager_backward(g, x, w, rstd):
    xhat = x.float() * rstd.unsqueeze(-1)
    wg = g.float() * w
    dx = rstd.unsqueeze(-1) * (wg - xhat * (wg * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (g.float() * xhat).sum(0)


def _liger():
    try:
        from liger_kernel.ops.rms_norm import rms_norm_backward, rms_norm_forward
    except Exception:
        return None

    def fwd(x, w):
        return rms_norm_forward(x, w, EPS, 0.0, "llama", None)

    def bwd(g, x, w, rstd, meta):
        return rms_norm_backward(g, x, w, rstd, 0.0, meta[2], meta[0], meta[1], False, None)

    return fwd, bwd


def _compiled_autograd_backward(compiled_forward, sets):
    """torch.compile's own backward: AOTAutograd differentiates the compiled forward. Timing it
    repeatedly needs retain_graph, which donated buffers forbid, so they are off for this peer."""
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    graphs = {}
    for x, w, g, _ in sets:
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        graphs[id(x)] = (compiled_forward(xr, wr), xr, wr)

    def backward(x, w, g, rstd):
        y, xr, wr = graphs[id(x)]
        return torch.autograd.grad(y, (xr, wr), g, retain_graph=True)
    return backward


def _graphrt(x, w, rstd):
    fwd = RmsNormForward(x, w, eps=EPS).compile()
    bwd = RmsNormBackward(x, x, w, rstd).compile()
    ws = torch.empty(bwd.workspace_bytes(), dtype=torch.uint8, device=x.device)
    y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty(w.shape, device=x.device)
    rstd_out = torch.empty_like(rstd)
    return (lambda x, w, g, rstd: fwd.execute(x, w, y=y, rstd=rstd_out),
            lambda x, w, g, rstd: bwd.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws))


def run(cases=CASES, progress=print) -> list[dict]:
    device = torch.device("cuda")
    liger = _liger()
    compiled_fwd = torch.compile(eager_forward)
    compiled_bwd = torch.compile(eager_backward)
    compiled_y = torch.compile(lambda x, w: eager_forward(x, w)[0])
    rows = []
    for T, H in cases:
        progress(f"rmsnorm T={T} H={H} ...")
        n_sets = n_input_sets(T * H * 6, device)
        sets = []
        w = (1 + 0.1 * torch.randn(H, device=device))
        for _ in range(n_sets):
            x = torch.randn(T, H, dtype=torch.bfloat16, device=device)
            g = torch.randn(T, H, dtype=torch.bfloat16, device=device)
            sets.append((x, w, g, eager_forward(x, w)[1].contiguous()))
        ours_fwd, ours_bwd = _graphrt(*sets[0][:2], sets[0][3])
        impls = {
            "graphrt": (ours_fwd, ours_bwd),
            "eager": (lambda x, w, g, r: eager_forward(x, w), lambda x, w, g, r: eager_backward(g, x, w, r)),
            "torch.compile": (lambda x, w, g, r: compiled_fwd(x, w),
                              lambda x, w, g, r: compiled_bwd(g, x, w, r)),
        }
        impls["torch.compile (autograd)"] = (None, _compiled_autograd_backward(compiled_y, sets))
        if liger is not None:
            metas = {id(s[0]): liger[0](s[0], s[1]) for s in sets}
            impls["liger"] = (lambda x, w, g, r: liger[0](x, w),
                              lambda x, w, g, r: liger[1](g, x, w, metas[id(x)][2],
                                                          (metas[id(x)][3], metas[id(x)][4], metas[id(x)][5])))
        for direction, idx in (("forward", 0), ("backward", 1)):
            fns = {name: f[idx] for name, f in impls.items() if f[idx] is not None}
            times = {name: stream_time_us(rotating(fn, sets)) for name, fn in fns.items()}
            flushed = {name: device_time_us(rotating(fn, sets)) for name, fn in fns.items()}
            nbytes = T * H * BYTES_PER_ELEMENT[direction]
            for name, t in times.items():
                tbps = nbytes / (t * 1e-6) / 1e12
                rows.append({"direction": direction, "T": T, "H": H, "impl": name, "us": t,
                             "TB/s": tbps, "of_ceiling": tbps / COPY_CEILING_TBPS,
                             "speedup_vs": t / times["graphrt"], "do_bench_us": flushed[name],
                             "do_bench_TB/s": nbytes / (flushed[name] * 1e-6) / 1e12,
                             "do_bench_speedup_vs": flushed[name] / flushed["graphrt"]})
        del sets, impls
        torch.cuda.empty_cache()
    rows += module_rows(progress)
    return rows


def module_rows(progress=print) -> list[dict]:
    """The nn modules as a model meets them: forward + backward under eager autograd, wall time
    per step with the host's time included (graphrt's, Liger's, torch's RMSNorm)."""
    from .host import MODULE_SHAPES, host_us, module_cases
    rows = []
    for T, H in MODULE_SHAPES:
        progress(f"rmsnorm modules: {T} x {H}, forward + backward under autograd")
        steps = {name.replace(" forward + backward", ""): fn
                 for name, fn in module_cases(T, H, torch.device("cuda")).items()
                 if name.endswith("backward")}
        for fn in steps.values():
            for _ in range(3):
                fn()
        times = {name: min(host_us(fn, 50, sleep=False) for _ in range(5))
                 for name, fn in steps.items()}
        for name, t in times.items():
            rows.append({"direction": "module fwd+bwd (eager, wall)", "T": T, "H": H,
                         "impl": name, "us": t,
                         "speedup_vs": t / times["graphrt.nn.RMSNorm"]})
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "rmsnorm", run(progress=progress), progress,
        legend="us, TB/s: back-to-back calls over rotating input sets (timing.stream_time_us); "
               "do_bench_*: triton do_bench medians with its L2 flush. speedup_vs: that "
               "implementation's time over graphrt's (above 1: graphrt is faster)")
