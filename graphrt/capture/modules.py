"""graph_modules: capture chosen submodules' forward and backward as CUDA graphs, the rest eager.

For models that cannot be captured whole (host syncs between layers, data-dependent routing,
eager-only code around the layers), each listed module's forward and backward become a pair of
graphs (``torch.cuda.make_graphed_callables`` underneath: one pool for all, captured in the order
they run, graph-safe RNG, inputs copied in only when they are not already the static ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from ..errors import CaptureError, ContractError
from ..runtime import Runtime
from ..runtime import runtime as default_runtime
from . import failure
from .fragment import _capture_failure, _reset_generator_capture_state, check_capturable

_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _same_constant(a, b) -> bool:
    return a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)


@dataclass
class _Signature:
    """What a graphed call was captured with: the argument tree, each tensor's shape, dtype,
    device and requires_grad, and every other argument's value."""

    spec: pytree.TreeSpec
    tensor_slots: tuple[int, ...]
    tensor_meta: tuple
    constants: tuple

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> tuple["_Signature", list[torch.Tensor]]:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = tuple(i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor))
        tensors = [leaves[i] for i in slots]
        meta = tuple((t.shape, t.dtype, t.device, t.requires_grad) for t in tensors)
        constants = tuple(v for v in leaves if not isinstance(v, torch.Tensor))
        return cls(spec, slots, meta, constants), tensors

    def mismatch(self, other: "_Signature") -> str | None:
        if other.spec != self.spec:
            return "the arguments' structure differs from the captured call"
        if other.tensor_meta != self.tensor_meta:
            return "a tensor argument's shape, dtype, device or requires_grad differs"
        for a, b in zip(self.constants, other.constants):
            if not _same_constant(a, b):
                return f"a non-tensor argument differs ({type(b).__name__})"
        return None

    def rebuild(self, tensors) -> tuple[tuple, dict]:
        leaves = []
        tensors, constants = iter(tensors), iter(self.constants)
        slots = set(self.tensor_slots)
        for i in range(len(self.tensor_slots) + len(self.constants)):
            leaves.append(next(tensors) if i in slots else next(constants))
        return pytree.tree_unflatten(leaves, self.spec)


class _FlatCall(torch.nn.Module):
    """The module as a function of its tensor arguments alone (what make_graphed_callables
    takes); its parameters are the wrapped module's."""

    def __init__(self, inner: torch.nn.Module, eager_forward, signature: _Signature):
        super().__init__()
        self.inner = inner
        self._eager_forward = eager_forward
        self._signature = signature

    def forward(self, *tensors):
        args, kwargs = self._signature.rebuild(tensors)
        return self._eager_forward(*args, **kwargs)


@dataclass
class GraphedModules:
    """What ``graph_modules`` did. ``graphed``: the modules whose calls replay graphs;
    ``calls``: per module, how many calls replayed (``"graph"``) and ran eagerly (``"eager"``);
    ``eager_reasons``: why a call of a graphed module ran eagerly (first reason per module).
    ``restore()`` puts the original forwards back."""

    graphed: list[str] = field(default_factory=list)
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    eager_reasons: dict[str, str] = field(default_factory=dict)
    _restore: list = field(default_factory=list, repr=False)
    _hold: object = field(default=None, repr=False)

    def report(self) -> str:
        lines = [f"{len(self.graphed)} modules run as CUDA graphs (forward and backward):"]
        for name in self.graphed:
            c = self.calls[name]
            why = f"; eager because {self.eager_reasons[name]}" if name in self.eager_reasons else ""
            lines.append(f"  {name}: {c['graph']} graph calls, {c['eager']} eager calls{why}")
        lines.append("everything else runs eagerly")
        return "\n".join(lines)

    def restore(self) -> None:
        for module, forward in self._restore:
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
        self._restore = []
        if self._hold is not None:
            self._hold.release()
            self._hold = None


def _resolve(model: torch.nn.Module, modules) -> list[tuple[str, torch.nn.Module]]:
    if isinstance(modules, (str, torch.nn.Module)):
        modules = [modules]
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for m in modules:
        if isinstance(m, str):
            try:
                m = model.get_submodule(m)
            except AttributeError as err:
                raise ContractError(f"modules: {m!r} is not a submodule of the model") from err
        if not isinstance(m, torch.nn.Module) or id(m) not in names:
            raise ContractError(f"modules: expected submodules of the model (or their names), "
                                f"got {type(m).__name__}")
        out.append((names[id(m)], m))
    if not out:
        raise ContractError("modules: expected at least one submodule to capture")
    if len({id(m) for _, m in out}) != len(out):
        raise ContractError("modules: a module is listed twice")
    return out


def _record_calls(model, targets, sample_args, sample_kwargs) -> dict:
    """Run the model once (autograd on, no backward) and keep each target's first call as its
    signature and detached static copies of its tensors (nothing that keeps the autograd graph
    of this run alive: its nodes belong to the default stream, and a capture must not meet
    them)."""
    seen: dict[int, tuple] = {}
    handles = []
    for _, m in targets:
        def hook(module, args, kwargs, key=id(m)):
            if key not in seen:
                signature, tensors = _Signature.of(args, kwargs)
                seen[key] = (signature, tuple(_static_copy(t) for t in tensors))
        handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        model(*sample_args, **sample_kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def graph_modules(model: torch.nn.Module, modules, sample_args: tuple = (),
                  sample_kwargs: dict | None = None, *, warmup: int = 3,
                  runtime: Runtime | None = None) -> GraphedModules:
    """Capture each listed submodule's forward and backward as CUDA graphs; the rest of the
    model (and anything between the layers: host syncs, routing) stays eager.

    ``model(*sample_args, **sample_kwargs)`` runs once (autograd on, no backward) to see how each
    module is called; each call with the same tensor shapes, dtypes and requires_grad and the
    same other arguments then replays its graphs. A call that differs runs eagerly and is
    counted in the returned report. The model must be in training mode, as when it trains
    (an eval-mode call runs eagerly); gradients land in ``.grad`` as usual. Non-tensor arguments
    must be equal between calls: with Hugging Face models pass ``use_cache=False`` (a new cache
    object each call would send every call to the eager path).

    >>> g = graphrt.capture.graph_modules(model, model.model.layers, (ids,), {"use_cache": False})  # doctest: +SKIP
    >>> loss = loss_fn(model(ids, use_cache=False), labels); loss.backward()       # doctest: +SKIP
    >>> print(g.report())                                                          # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise ContractError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(modules, torch.nn.ModuleList):
        modules = list(modules)
    targets = _resolve(model, modules)
    sample_args = tuple(sample_args) if isinstance(sample_args, (tuple, list)) else (sample_args,)
    sample_kwargs = dict(sample_kwargs or {})
    if int(warmup) < 1:
        raise ContractError(f"warmup: expected at least 1 warm-up run, got {warmup}")
    device = next((t.device for t in pytree.tree_leaves((sample_args, sample_kwargs))
                   if isinstance(t, torch.Tensor)), None)
    if device is None:
        raise ContractError("sample_args: expected at least one tensor to run the model with")
    check_capturable(device)
    rt = runtime or default_runtime(device)
    if torch.cuda.is_current_stream_capturing():
        raise CaptureError("graph_modules: called while a stream is capturing; call it eagerly")

    calls = _record_calls(model, targets, sample_args, sample_kwargs)
    missing = [name for name, m in targets if id(m) not in calls]
    if missing:
        raise ContractError(f"modules: {missing} did not run when the model ran on the sample "
                            f"inputs; list only modules its forward calls")
    flat, signatures, samples = [], [], []
    for name, m in targets:
        signature, statics = calls[id(m)]
        flat.append(_FlatCall(m, m.forward, signature).train(m.training))
        signatures.append(signature)
        samples.append(statics)
    del calls

    result = GraphedModules()
    pool = torch.cuda.graph_pool_handle()
    with rt.arena.hold() as hold:   # graphrt workspaces taken in the captures stay theirs
        try:
            graphed = torch.cuda.make_graphed_callables(tuple(flat), tuple(samples),
                                                        num_warmup_iters=int(warmup),
                                                        allow_unused_input=True, pool=pool)
        except BaseException as err:  # noqa: BLE001 - said in terms of the user's code
            hold.release()
            if failure.classify(err) is not None:   # CUDA ended the capture: torch's generator
                _reset_generator_capture_state(device)  # was left in capture mode
            raise _capture_failure(err) from err
    result._hold = hold
    for (name, m), wrapper, signature in zip(targets, graphed, signatures):
        result.graphed.append(name)
        result.calls[name] = {"graph": 0, "eager": 0}
        result._restore.append((m, m.__dict__.get("forward")))
        m.forward = _dispatcher(name, m.forward, wrapper, signature, result)
    return result


def _dispatcher(name, eager_forward, wrapper, signature, result: GraphedModules):
    counts = result.calls[name]
    graph_training = wrapper.training   # the mode the module was captured in

    def forward(*args, **kwargs):
        reason = None
        if wrapper.inner.training != graph_training:
            reason = "its training/eval mode differs from the captured call"
        elif torch.cuda.is_current_stream_capturing():
            reason = "a stream is capturing (an enclosing capture records it eagerly)"
        else:
            call, tensors = _Signature.of(args, kwargs)
            reason = signature.mismatch(call)
        if reason is None:
            counts["graph"] += 1
            return wrapper(*tensors)
        counts["eager"] += 1
        result.eager_reasons.setdefault(name, reason)
        return eager_forward(*args, **kwargs)

    return forward
