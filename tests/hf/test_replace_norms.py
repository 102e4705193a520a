"""graphrt.nn.replace_norms on Hugging Face models (CPU: the reference path)."""
import pytest
import torch

import graphrt
from graphrt import ContractError

from ..helpers import rel_l2
from .models import tiny


@pytest.mark.parametrize("family,expected", [("llama", 5), ("qwen3", 9), ("mistral", 5)])
def test_replace_norms_keeps_weights_and_outputs(family, expected):
    model = tiny(family)
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        ref = model(ids).logits
    weights = {n: p for n, p in model.named_parameters() if "norm" in n}
    report = graphrt.nn.replace_norms(model)
    assert len(report.replaced) == expected and report.skipped == {}
    for name in report.replaced:
        module = model.get_submodule(name)
        assert isinstance(module, graphrt.nn.RMSNorm)
        assert module.weight is weights[name + ".weight"]   # the same Parameter object
        assert module.weight.dtype == torch.bfloat16
    with torch.no_grad():
        out = model(ids).logits
    assert rel_l2(out, ref) < 2e-2
    assert graphrt.nn.replace_norms(model).replaced == []   # nothing left to swap


def test_replace_norms_leaves_gemma_alone_and_says_why():
    model = tiny("gemma")     # x * (1 + weight): not graphrt's RMSNorm
    report = graphrt.nn.replace_norms(model)
    assert report.replaced == [] and len(report.skipped) == 5
    assert all("outputs differ" in why for why in report.skipped.values())
    assert type(model.model.norm).__name__ == "GemmaRMSNorm"


class MyRMSNorm(torch.nn.Module):
    """Says eps=1e-6 but uses 1e-1: only the small-scale probe rows can tell."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = 1e-6

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-1) * self.weight).to(x.dtype)


def test_replace_norms_probe_catches_an_eps_that_is_not_used():
    model = torch.nn.Sequential(MyRMSNorm(64), torch.nn.Linear(64, 64))
    report = graphrt.nn.replace_norms(model)
    assert report.replaced == [] and "outputs differ" in report.skipped["0"]
    honest = torch.nn.Sequential(MyRMSNorm(64))
    honest[0].eps = 1e-1
    assert graphrt.nn.replace_norms(honest).replaced == ["0"]


def test_replace_norms_rejects_a_non_module():
    with pytest.raises(ContractError, match="model"):
        graphrt.nn.replace_norms("llama")
