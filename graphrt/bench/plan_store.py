"""Host cost of a plan-store hit (CPU; no GPU needed)."""
from __future__ import annotations

import torch

from ..ops.rmsnorm import RmsNormBackward
from ..plan import PlanStore
from . import report
from .timing import host_time_us


def run(progress=print) -> list[dict]:
    """On a GPU machine the tensors are CUDA tensors (the Triton backend's key); else CPU ones."""
    store = PlanStore()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device=device)
    g, w = torch.randn_like(x), torch.randn(4096, device=device)
    rstd = torch.rand(64, device=device)
    store.get(RmsNormBackward, g, x, w, rstd)
    key = RmsNormBackward.contract_for(g, x, w, rstd)
    rows = [
        {"what": f"store.get(plan_cls, *tensors) on {device}: key from tensors + lookup",
         "us": host_time_us(lambda: store.get(RmsNormBackward, g, x, w, rstd))},
        {"what": "contract_for(*tensors): key only", "us": host_time_us(
            lambda: RmsNormBackward.contract_for(g, x, w, rstd))},
        {"what": "store.lookup(key): lookup only", "us": host_time_us(lambda: store.lookup(key))},
    ]
    return rows


def main(progress=print) -> list[dict]:
    return report.publish("plan_store", run(progress), progress)
