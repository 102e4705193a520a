"""HSTU LayerNorm-Multiply-SiLU-Dropout (concat_u, concat_x, SiLU, p = 0.1) against eager
PyTorch and torch.compile."""
from __future__ import annotations

import torch

from ..ops import HstuLmsdBackward, HstuLmsdForward
from ..ops.registry import HSTU_CASES
from . import report
from .timing import COPY_CEILING_TBPS, device_time_us, n_input_sets, rotating, stream_time_us

CASES = HSTU_CASES
P = 0.1


def eager_forward(x, u, w, b):
    xf, uf = x.float(), u.float()
    y = torch.nn.functional.layer_norm(xf, (xf.shape[1],), w.float(), b.float(), 1e-6)
    a = torch.nn.functional.silu(uf)
    keep = torch.rand(3, *x.shape, device=x.device) >= P
    parts = [a, xf, y * a]
    out = torch.cat([torch.where(k, v / (1 - P), 0.0) for k, v in zip(keep, parts)], dim=1)
    mask = (keep[2].to(torch.int8) << 2) | (keep[1].to(torch.int8) << 1) | keep[0].to(torch.int8)
    return out.to(x.dtype), mask


def eager_backward(dy, x, u, w, b, mean, rstd, mask):
    d = x.shape[1]
    dyf = dy.float()
    m = mask.to(torch.int32)
    keep = [((m >> i) & 1).float() / (1 - P) for i in range(3)]
    g_u, g_x, g = dyf[:, :d] * keep[2], dyf[:, d:2 * d] * keep[1], dyf[:, 2 * d:] * keep[0]
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    uf = u.float()
    sig = torch.sigmoid(uf)
    a, a_prime = uf * sig, sig * (1 + uf * (1 - sig))
    dl = g * a
    wd = dl * w.float()
    dx = g_x + rstd[:, None] * (wd - wd.mean(1, keepdim=True) - xhat * (xhat * wd).mean(1, keepdim=True))
    du = (g * (xhat * w.float() + b.float()) + g_u) * a_prime
    return dx.to(x.dtype), du.to(u.dtype), (dl * xhat).sum(0).to(w.dtype), dl.sum(0).to(b.dtype)


def run(progress=print) -> list[dict]:
    rows = []
    compiled_fwd, compiled_bwd = torch.compile(eager_forward), torch.compile(eager_backward)
    flags = dict(apply_u_silu=True, concat_u=True, concat_x=True)
    for n, d in CASES:
        progress(f"lmsd N={n} D={d} ...")
        sets = []
        for _ in range(n_input_sets(15 * n * d, torch.device("cuda"))):
            x = torch.randn(n, d, dtype=torch.bfloat16, device="cuda")
            u = torch.randn(n, d, dtype=torch.bfloat16, device="cuda")
            w = (1 + 0.1 * torch.randn(d, device="cuda")).to(torch.bfloat16)
            b = (0.1 * torch.randn(d, device="cuda")).to(torch.bfloat16)
            mean, rstd = x.float().mean(1), torch.rsqrt(x.float().var(1, unbiased=False) + 1e-6)
            dy = torch.randn(n, 3 * d, dtype=torch.bfloat16, device="cuda")
            mask = eager_forward(x, u, w, b)[1]
            sets.append((x, u, w, b, dy, mean, rstd, mask))
        fwd = HstuLmsdForward(*sets[0][:4], dropout_ratio=P, **flags).compile()
        bwd = HstuLmsdBackward(sets[0][4], *sets[0][:4], *sets[0][5:], dropout_ratio=P,
                               **flags).compile()
        ws = torch.empty(bwd.workspace_bytes(), dtype=torch.uint8, device="cuda")
        y = torch.empty(n, 3 * d, dtype=torch.bfloat16, device="cuda")
        m_out, r_out = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        k_out = torch.empty(n, d, dtype=torch.int8, device="cuda")
        dx, du = (torch.empty(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        dw, db = (torch.empty(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        impls = {
            "forward": {
                "graphrt": lambda x, u, w, b, *_: fwd.execute(x, u, w, b, seed=1, offset=0, y=y,
                                                              mean=m_out, rstd=r_out, mask=k_out),
                "eager": lambda x, u, w, b, *_: eager_forward(x, u, w, b),
                "torch.compile": lambda x, u, w, b, *_: compiled_fwd(x, u, w, b)},
            "backward": {
                "graphrt": lambda x, u, w, b, dy, mean, rstd, mask: bwd.execute(
                    dy, x, u, w, b, mean, rstd, mask, dx=dx, du=du, dweight=dw, dbias=db,
                    workspace=ws),
                "eager": lambda x, u, w, b, dy, mean, rstd, mask: eager_backward(
                    dy, x, u, w, b, mean, rstd, mask),
                "torch.compile": lambda x, u, w, b, dy, mean, rstd, mask: compiled_bwd(
                    dy, x, u, w, b, mean, rstd, mask)}}
        nbytes = {"forward": n * (11 * d + 8), "backward": n * (15 * d + 8)}
        for direction, fns in impls.items():
            times = {k: stream_time_us(rotating(f, sets)) for k, f in fns.items()}
            flushed = {k: device_time_us(rotating(f, sets)) for k, f in fns.items()}
            for name, us in times.items():
                tbps = nbytes[direction] / (us * 1e-6) / 1e12
                rows.append({"direction": direction, "N": n, "D": d, "impl": name, "us": us,
                             "TB/s": tbps, "of_ceiling": tbps / COPY_CEILING_TBPS,
                             "speedup_vs": us / times["graphrt"], "do_bench_us": flushed[name]})
        del sets
        torch.cuda.empty_cache()
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "lmsd", run(progress), progress,
        legend="effective bytes: forward x, u read, y (3 segments), mask, stats written; backward "
               "dy, x, u, mask read, dx, du written. speedup_vs: that implementation's time over "
               "graphrt's")
