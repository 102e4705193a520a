"""verify_replay: a captured fragment against eager execution, with poisoned outputs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import ContractError
from .fragment import Fragment
from .tree import flatten, unflatten


@dataclass
class StepCheck:
    step: int
    phase: str                 # "fresh inputs" or "mutated in place"
    max_abs_diff: float
    bitwise_equal: bool
    nan_in_replay: bool


@dataclass
class ReplayReport:
    """What verify_replay saw; ``ok`` is True when every check passed."""

    atol: float
    checks: list[StepCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(
            not c.nan_in_replay and (c.bitwise_equal if self.atol == 0 else c.max_abs_diff <= self.atol)
            for c in self.checks)

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.checks), default=0.0)

    def __str__(self) -> str:
        rows = [f"  step {c.step} {c.phase:16s} max|diff| {c.max_abs_diff:.3g} "
                f"bitwise {'yes' if c.bitwise_equal else 'no'}{' NaN!' if c.nan_in_replay else ''}"
                for c in self.checks]
        verdict = "OK" if self.ok else "FAILED"
        return f"replay vs eager (atol={self.atol}): {verdict}\n" + "\n".join(rows)


def _poison(leaves) -> None:
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t.fill_(float("nan"))


def _compare(step: int, phase: str, replay, eager) -> StepCheck:
    got, _ = flatten(replay)
    want, _ = flatten(eager)
    if len(got) != len(want):
        raise ValueError(f"eager_fn returned {len(want)} outputs, the fragment {len(got)}")
    diff, equal, nan = 0.0, True, False
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor):
            equal &= g == w
            continue
        if g.is_floating_point():
            nan |= bool(torch.isnan(g).any() & ~torch.isnan(w).any())
        equal &= torch.equal(g, w) or bool(torch.isnan(g).eq(torch.isnan(w)).all()
                                            and torch.equal(g.nan_to_num(0), w.nan_to_num(0)))
        if g.numel():
            diff = max(diff, (g.double() - w.double()).abs().nan_to_num(float("inf")).max().item())
    return StepCheck(step, phase, diff, bool(equal), nan)


def _mutate(leaves) -> None:
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            if t.element_size() == 1:     # float8 has no arithmetic kernels: through FP32
                t.copy_(t.float().mul_(0.5).add_(0.125))
            else:
                t.mul_(0.5).add_(0.125)


def verify_replay(fragment: Fragment, eager_fn: Callable, make_inputs: Callable[[int], tuple],
                  steps: int = 3, atol: float = 0.0) -> ReplayReport:
    """Replay ``fragment`` against ``eager_fn`` for ``steps`` steps.

    Each step: fresh inputs from ``make_inputs(step)``; the static outputs poisoned with NaN; the
    replay compared with ``eager_fn`` on the same inputs (bitwise when ``atol`` is 0). Then the
    static inputs are mutated in place (x * 0.5 + 0.125), the fragment is replayed without new
    arguments and compared again. Random ops start both runs from the same runtime RNG state.

    >>> report = verify_replay(frag, step_fn, lambda i: (torch.randn(...),), steps=5)  # doctest: +SKIP
    >>> assert report.ok, str(report)
    """
    if not isinstance(fragment, Fragment):
        raise ContractError(f"fragment: expected a graphrt.capture.Fragment (from capture() or "
                            f"graph_step(...).fragment), got {type(fragment).__name__}")
    if not callable(eager_fn) or not callable(make_inputs):
        raise ContractError("eager_fn, make_inputs: expected callables")
    report = ReplayReport(float(atol))
    rng = fragment.runtime.rng
    for step in range(steps):
        args = tuple(make_inputs(step))
        for phase in ("fresh inputs", "mutated in place"):
            if phase == "mutated in place":
                _mutate(flatten(fragment.inputs)[0])
                args = fragment.inputs
            else:
                fragment.load(*args)
            _poison(flatten(fragment.outputs)[0])
            state = rng.snapshot()
            fragment.replay()
            replayed = [t.clone() if isinstance(t, torch.Tensor) else t
                        for t in flatten(fragment.outputs)[0]]
            rng.restore(state)
            leaves, spec = flatten(fragment.inputs)
            eager = eager_fn(*unflatten([a.clone() if isinstance(a, torch.Tensor) else a
                                         for a in leaves], spec))
            report.checks.append(_compare(step, phase, replayed, eager))
    return report
