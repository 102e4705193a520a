"""Shared test utilities."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason="needs TRITON_INTERPRET=1 (CPU runs)")


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "output holds NaN (an element was not written?)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t is not None:
            t.fill_(float("nan"))


def snapshot(*tensors):
    return [None if t is None else t.detach().clone() for t in tensors]


def assert_unchanged(before, tensors) -> None:
    for b, t in zip(before, tensors):
        if t is not None:
            assert torch.equal(b.view(torch.uint8) if b.dtype != torch.uint8 else b,
                               t.view(torch.uint8) if t.dtype != torch.uint8 else t), \
                "a rejected call wrote to an output"


def assert_rejected(call, positional: tuple, base: dict, cases, outputs) -> None:
    """Each ``(overrides, pattern)`` of ``cases``: ``call`` with ``base`` updated by the
    overrides (the names in ``positional`` passed positionally, in that order) raises a
    ContractError matching ``pattern`` and leaves every tensor of ``outputs`` as it was."""
    from graphrt import ContractError
    for over, pattern in cases:
        args = {**base, **over}
        before = snapshot(*outputs)
        inputs = [args.pop(name) for name in positional]
        with pytest.raises(ContractError, match=pattern):
            call(*inputs, **args)
        assert_unchanged(before, outputs)


@contextlib.contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


ALLOCATORS = ("empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full",
              "full_like", "empty_strided", "tensor", "randn", "rand")
TENSOR_ALLOCATORS = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor",
                     "new_empty_strided")


@contextlib.contextmanager
def no_tensor_allocation():
    """Patch torch's tensor-allocating functions to raise while the block runs."""
    saved = {name: getattr(torch, name) for name in ALLOCATORS}

    def forbid(name):
        def raiser(*a, **k):
            raise AssertionError(f"torch.{name} called on the execute path")
        return raiser

    methods = {name: getattr(torch.Tensor, name) for name in TENSOR_ALLOCATORS}
    for name in ALLOCATORS:
        setattr(torch, name, forbid(name))
    for name in TENSOR_ALLOCATORS:
        setattr(torch.Tensor, name, forbid(f"Tensor.{name}"))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
        for name, fn in methods.items():
            setattr(torch.Tensor, name, fn)


def assert_steps_equal_eager(step, graph_model, eager_model, eager_opt, loss_fn, x, y,
                             steps: int = 5) -> None:
    """Replay the captured ``step`` on fresh batches like ``x``, ``y`` (its gradients poisoned
    first) next to an eager step of ``eager_model`` (a DDP wrapper is unwrapped for the
    comparison): the loss, every gradient and every weight must be equal bitwise."""
    eager_params = list(getattr(eager_model, "module", eager_model).named_parameters())
    for i in range(steps):
        bx, by = torch.randn_like(x), torch.randn_like(y)
        for p in graph_model.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
        loss = step(bx, by).clone()
        eager_opt.zero_grad(set_to_none=True)
        eager_loss = loss_fn(eager_model(bx), by)
        eager_loss.backward()
        eager_opt.step()
        assert torch.equal(loss, eager_loss.detach()), f"step {i}: loss differs"
        for (name, p), q in zip(eager_params, graph_model.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {i}: grad of {name} differs"
            assert torch.equal(p, q), f"step {i}: {name} differs after the optimizer step"
