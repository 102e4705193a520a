"""graphrt.nn.RMSNorm: autograd, residual path, torch.compile tracing."""
import pytest
import torch

import graphrt

from ..helpers import rel_l2

BF16 = torch.bfloat16


def _fp64_module(x, w, eps, residual=None):
    xd = x.detach().double().requires_grad_()
    rd = None if residual is None else residual.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    h = xd if rd is None else xd + rd
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * wd
    return y, h, xd, rd, wd


def _check(device, w_dtype, seed):
    norm = graphrt.nn.RMSNorm(64, eps=1e-5, device=device, dtype=w_dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(64))
    x = torch.randn(3, 5, 64, dtype=BF16, device=device, requires_grad=True)
    res = torch.randn(3, 5, 64, dtype=BF16, device=device, requires_grad=True)
    gy, gh = torch.randn(3, 5, 64, dtype=BF16, device=device), torch.randn(3, 5, 64, dtype=BF16, device=device)
    y, h = norm(x, res)
    torch.autograd.backward((y, h), (gy, gh))
    ry, rh, xd, rd, wd = _fp64_module(x, norm.weight, 1e-5, res)
    torch.autograd.backward((ry, rh), (gy.double(), gh.double()))
    assert rel_l2(y, ry) < 5e-3 and rel_l2(x.grad, xd.grad) < 5e-3 and rel_l2(res.grad, rd.grad) < 5e-3
    assert norm.weight.grad.dtype == w_dtype
    # h = x + residual is rounded to BF16 before it is normalized: dw carries that rounding
    assert rel_l2(norm.weight.grad, wd.grad) < 5e-3


@pytest.mark.parametrize("w_dtype", [torch.float32, BF16])
def test_module_autograd_cpu(seed, w_dtype):
    _check("cpu", w_dtype, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("w_dtype", [torch.float32, BF16])
def test_module_autograd_gpu(seed, w_dtype):
    _check("cuda", w_dtype, seed)


def _model(device):
    return torch.nn.Sequential(torch.nn.Linear(64, 64, dtype=BF16, device=device),
                               graphrt.nn.RMSNorm(64, device=device),
                               torch.nn.Linear(64, 16, dtype=BF16, device=device))


def test_traces_under_torch_compile_cpu(seed):
    model = _model("cpu")
    x = torch.randn(8, 64, dtype=BF16)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.float().sum().backward()
    assert torch.equal(out, model(x))
    assert model[1].weight.grad is not None


@pytest.mark.gpu
def test_compiles_with_inductor_gpu(seed):
    model = _model("cuda")
    x = torch.randn(32, 64, dtype=BF16, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.float().sum().backward()
    assert rel_l2(out, model(x)) < 1e-2
