"""The op registry: every op of graphrt.ops listed once, with a plan, an operator, a benchmark
module and a sample call that its plan accepts and its functional call runs."""
import importlib

import pytest
import torch

import graphrt
from graphrt.ops.registry import BENCHMARKS, OPS, op

SMALL_CASES = {"rmsnorm_forward": (8, 64), "rmsnorm_backward": (8, 64),
               "mhc_projection_backward": (8, 64), "hstu_lmsd_forward": (8, 16),
               "hstu_lmsd_backward": (8, 16), "grouped_gemm_wgrad": (2, 16, 8, 32),
               "gemm_proj_rope_mxfp8": (32, 64, 2, 32, 32), "adamw_step": (16, 8)}


def test_every_functional_op_is_listed_once_with_its_operator_and_benchmark():
    names = [entry.name for entry in OPS]
    assert len(names) == len(set(names)) == len(SMALL_CASES)
    public = {n for n in graphrt.ops.__all__ if not n[0].isupper() and n in SMALL_CASES}
    assert public == set(names)
    for entry in OPS:
        assert callable(entry.functional()) and hasattr(torch.ops.graphrt, entry.name)
        assert entry.plan_class().op == entry.name
        assert entry.bench in BENCHMARKS.values()
        importlib.import_module(entry.bench)
    with pytest.raises(KeyError, match="no op"):
        op("rms_norm")


@pytest.mark.parametrize("entry", OPS, ids=lambda e: e.name)
def test_each_sample_runs_through_the_plan_and_the_functional_call(entry, seed):
    inputs, config, outputs = entry.sample("cpu", SMALL_CASES[entry.name])
    plan = graphrt.runtime("cpu").plan(entry.plan_class(), *inputs, **config, **outputs)
    for t in outputs.values():
        t.view(torch.uint8).fill_(0xFF)   # poisoned: the call must write every element
    keywords = {k: v for k, v in {**config, **outputs}.items() if k in plan.execute_keywords}
    workspace = torch.empty(plan.workspace_bytes(), dtype=torch.uint8)
    plan.execute(*inputs, **keywords, workspace=workspace if plan.workspace_bytes() else None)
    result = entry.functional()(*inputs, **config)
    for name, t in outputs.items():
        assert torch.equal(t.view(torch.uint8), getattr(result, name).view(torch.uint8)), name
