"""Each op declared once: its arguments, how they enter the plan's key, and its outputs.

An :class:`OpSpec` lists an op's tensor inputs and keyword options (with the function that turns
each into part of the plan's :class:`~graphrt.contract.Contract`, and its type in the operator
schema) and its outputs (shape and dtype from the arguments). From it come:

- the functional call ``graphrt.ops.<name>`` (real signature: unknown keywords raise TypeError),
- the plan's ``contract_for`` and constructor,
- the plan's ``allocate_outputs``,
- the operator ``torch.ops.graphrt.<name>``: its schema, implementation and fake implementation.

The plan class keeps what is particular to the op: ``check_support``, ``compile`` and
``execute``.

>>> spec = OpSpec("toy", ToyPlan, (Tensor("x", row_spec),), (Option("eps", 1e-6, eps_key),),
...               (Output("y", like("x")),), doc="y = toy(x)")              # doctest: +SKIP
>>> spec.functional(x, eps=1e-5).y                                           # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from .contract import Contract
from .plan import tensor_facts
from .runtime import runtime_for
from .validate import require_tensor

REQUIRED = object()   # an Option with no default: the caller must pass it


class Tensor(NamedTuple):
    """A positional input. ``key(name, value)`` gives its TensorSpec in the contract (None: not
    part of the key); ``schema`` is its type in the operator schema."""

    name: str
    key: Callable | None = None
    schema: str = "Tensor"


class Option(NamedTuple):
    """A keyword argument. ``key(name, value)`` gives its contract entry (a flag, or a
    TensorSpec for an optional tensor operand; None: read at run time only) under ``flag``
    (default: its name); ``schema`` is its type in the operator schema (None: not an operator
    argument); ``to_plan`` False keeps it for the functional call's own hook."""

    name: str
    default: Any = REQUIRED
    key: Callable | None = None
    schema: str | None = None
    flag: str | None = None
    to_plan: bool = True


class Output(NamedTuple):
    """An output: allocated where the caller passes none and ``when(values)`` holds (None:
    always), as ``shape(values)`` of ``dtype`` (a dtype or ``dtype(values)``) on the first
    input's device, or by ``make(values)``. ``returned`` outputs are the op's result;
    ``computed``: ``make`` writes values the launch reads (such a call is never served by a
    bound call, which makes its outputs with ``torch.empty``)."""

    name: str
    shape: Callable | None = None
    dtype: Any = None
    when: Callable | None = None
    make: Callable | None = None
    returned: bool = True
    computed: bool = False


def like(name: str, dtype=None):
    """Output shape of input ``name`` (``dtype``: its dtype when None)."""
    return {"shape": lambda v: v[name].shape, "dtype": dtype or (lambda v: v[name].dtype)}


def _default_repr(option: Option) -> str:
    default = option.default
    if option.schema.endswith("?") or default is None:
        return "None"
    if isinstance(default, tuple):
        return repr(list(default))
    return repr(default)


class OpSpec:
    """One op's declaration; see the module docstring. ``extra_flags(facts, values)`` adds
    contract flags that depend on several arguments or on the device (``facts`` as
    ``tensor_facts`` returns them); ``prepare(first)`` normalizes the first input before
    anything reads it; ``before_run(rt, args, config, own)`` runs in the functional call after
    the plan lookup's checks could run and before the launch (``own``: the ``to_plan=False``
    options), and ``before_run_idle(*own)`` says where it would do nothing; ``returns``:
    'list', 'first' or 'none' (what the operator returns).

    The functional call of a plan that records launches, with no ``prepare`` and no
    ``before_run`` to run, first offers its values to the runtime's recent bound call of its
    plan class (``_BoundCall.serve_as``)."""

    def __init__(self, name: str, plan: type, inputs: tuple[Tensor, ...],
                 options: tuple[Option, ...], outputs: tuple[Output, ...], *, doc: str,
                 extra_flags: Callable | None = None, prepare: Callable | None = None,
                 before_run: Callable | None = None, before_run_idle: Callable | None = None,
                 returns: str = "list"):
        self.name, self.plan, self.doc = name, plan, doc
        self.inputs, self.options, self.outputs = inputs, options, outputs
        self.extra_flags, self.prepare, self.before_run = extra_flags, prepare, before_run
        self.before_run_idle = before_run_idle
        self.returns = returns
        self.first = inputs[0].name    # the argument that picks the device and the runtime
        self.input_names = tuple(t.name for t in inputs)
        self.defaults = {o.name: o.default for o in options if o.default is not REQUIRED}
        self.defaults.update({o.name: None for o in outputs})
        self.returned = tuple(o for o in outputs if o.returned)
        plan.spec = self
        if "contract_for" not in plan.__dict__:
            plan.contract_for = classmethod(self._make_contract_for())
        self.functional = self._make_functional()

    # -- generated code: these run on every call, so they are plain functions with the op's
    # -- own signature rather than loops over the spec
    def _signature(self, extra: str) -> str:
        options = [o.name if o.default is REQUIRED else f"{o.name}=_D[{o.name!r}]"
                   for o in self.options]
        outputs = [f"{o.name}=None" for o in self.outputs]
        return ", ".join([*self.input_names, "*", *options, *outputs, extra])

    def _header(self, name: str, leading: str, trailing: str, then: str) -> list[str]:
        """A generated function's first lines: its signature, ``prepare`` applied to the first
        input, then ``then`` with {tensor} and {label}: the tensor that picks the device (a
        list's first) and its name for messages."""
        first = self.first
        lines = [f"def {name}({leading}{self._signature(trailing)}):"]
        tensor, label = first, repr(first)
        if self.prepare is not None:
            lines.append(f"    {first} = _prepare({first})")
            tensor, label = f"{first}[0]", repr(f"{first}[0]")
        lines.append("    " + then.format(tensor=tensor, label=label))
        return lines

    def _make_contract_for(self):
        ns = {"_C": Contract, "_facts": tensor_facts, "_tensor": require_tensor, "_D": self.defaults,
              "_extra": self.extra_flags, "_prepare": self.prepare}
        specs, flags = [], []
        for arg in (*self.inputs, *self.options):
            if arg.key is None:
                continue
            ns[f"_K_{arg.name}"] = arg.key
            call = f"_K_{arg.name}({arg.name!r}, {arg.name})"
            if isinstance(arg, Tensor) or arg.schema is not None and arg.schema.startswith("Tensor"):
                specs.append(call)
            else:
                flags.append(f"({(arg.flag or arg.name)!r}, {call})")
        lines = self._header("contract_for", "cls, ", "backend=None",
                             "facts = _facts(_tensor({label}, {tensor}), backend, {label})")
        flag_tuple = "(" + "".join(f + ", " for f in flags) + ")"
        if self.extra_flags is not None:
            values = ", ".join(f"{n!r}: {n}" for n in (*self.input_names,
                                                     *(o.name for o in self.options),
                                                     *(o.name for o in self.outputs)))
            flag_tuple += f" + _extra(facts, {{{values}}})"
        spec_tuple = "(" + "".join(s + ", " for s in specs) + ")"
        lines.append(f"    return _C({self.name!r}, facts[1], facts[3], facts[2], {spec_tuple}, "
                     f"{flag_tuple})")
        exec("\n".join(lines), ns)
        return ns["contract_for"]

    def _make_functional(self):
        ns = {"_D": self.defaults, "_plan": self.plan, "_runtime_for": runtime_for,
              "_prepare": self.prepare, "_before": self.before_run,
              "_idle": self.before_run_idle}
        lines = self._header(self.name, "", "stream=None, runtime=None",
                             "rt = _runtime_for({label}, {tensor}, runtime)")
        passed = [*(o.name for o in self.options if o.to_plan), *(o.name for o in self.outputs)]
        config = f"    config = {{{', '.join(f'{n!r}: {n}' for n in passed)}}}"
        args = "(" + "".join(n + ", " for n in self.input_names) + ")"
        own = [o.name for o in self.options if not o.to_plan]
        done = "return None" if self.returns == "none" else "return result"
        served = self.prepare is None and self.plan.records_launches and (
            self.before_run is None or self.before_run_idle is not None)
        if served:   # the recent bound call first (no config dict, no Runtime.run)
            names = (*self.input_names, *passed)
            ns["_NAMES"] = names
            idle = f" and _idle({', '.join(own)})" if self.before_run is not None else ""
            lines += [f"    if stream is None{idle}:",
                      "        call = rt._thread.recent_calls.get(_plan)",
                      "        if call is not None:",
                      "            result = (call.served or call.serve_as(rt, _NAMES))"
                      f"(rt, {', '.join(names)})",
                      "            if result is not None:", f"                {done}",
                      "        " + config,
                      f"            result = rt._keyed_run(_plan, {args}, config)",
                      f"            {done}"]
        lines.append(config)
        if self.before_run is not None:
            lines.append(f"    _before(rt, {args}, config, "
                         f"{{{', '.join(f'{n!r}: {n}' for n in own)}}})")
        run = f"rt.run(_plan, {args}, config, stream)"
        lines.append(f"    {run}\n    return None" if self.returns == "none" else
                     f"    return {run}")
        exec("\n".join(lines), ns)
        fn = ns[self.name]
        fn.__doc__ = self.doc
        fn.__module__ = self.plan.__module__.rsplit(".", 1)[0]
        fn.__qualname__ = self.name
        return fn

    # -- outputs --------------------------------------------------------------------------------
    def values(self, args: tuple, kwargs: dict) -> dict:
        """Every argument by name, defaults filled in."""
        values = dict(self.defaults)
        values.update(zip(self.input_names, args))
        values.update(kwargs)
        return values

    def allocate(self, values: dict, *, fake: bool = False) -> dict[str, torch.Tensor]:
        """The outputs the caller left out, made for ``values`` (all the op's outputs, absent
        ones as empty tensors, when ``fake``: what the operator returns)."""
        wanted = [o for o in self.outputs if (fake and o.returned) or values[o.name] is None]
        # every ``when`` sees the caller's arguments, before any output is made
        active = {o.name: o.when is None or o.when(values) for o in wanted}
        first = values[self.first]
        out = {}
        for o in wanted:
            if not active[o.name]:
                if fake:
                    out[o.name] = self._empty(o, values)
                continue
            if o.make is not None:
                out[o.name] = values[o.name] = o.make(values)
            else:
                out[o.name] = values[o.name] = first.new_empty(o.shape(values),
                                                               dtype=self._dtype(o, values))
        return out

    @staticmethod
    def _dtype(output: Output, values: dict) -> torch.dtype:
        return output.dtype(values) if callable(output.dtype) else output.dtype

    def _empty(self, output: Output, values: dict) -> torch.Tensor:
        """What the operator returns for an output the call did not make."""
        return values[self.first].new_empty(0, dtype=self._dtype(output, values))

    # -- torch.library --------------------------------------------------------------------------
    def schema(self) -> str:
        """The operator schema: inputs and options (outputs are always allocated)."""
        args = [f"{t.schema} {t.name}" for t in self.inputs]
        args += [f"{o.schema} {o.name}" + ("" if o.default is REQUIRED else
                                           f"={_default_repr(o)}")
                 for o in self.options if o.schema is not None]
        returns = {"list": "Tensor[]", "first": "Tensor", "none": "()"}[self.returns]
        return f"({', '.join(args)}) -> {returns}"

    def _operator_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The functional call's (inputs, keywords) from the operator's arguments: a None
        given for an option whose default is not None means that default."""
        names = [*self.input_names, *(o.name for o in self.options if o.schema is not None)]
        values = dict(zip(names, args))
        values.update(kwargs)
        inputs = tuple(values.pop(n) for n in self.input_names)
        for name, value in list(values.items()):
            if value is None and self.defaults.get(name) is not None:
                values[name] = self.defaults[name]
            elif isinstance(value, list) and isinstance(self.defaults.get(name), tuple):
                values[name] = tuple(value)
        return inputs, values

    def _as_returned(self, outputs: dict):
        if self.returns == "none":
            return None
        if self.returns == "first":
            return outputs[self.returned[0].name]
        return [outputs[o.name] for o in self.returned]

    def register(self, lib: torch.library.Library) -> None:
        """Define ``torch.ops.graphrt.<name>`` with its implementation and fake."""
        lib.define(self.name + self.schema())

        def implementation(*args, **kwargs):
            inputs, options = self._operator_call(args, kwargs)
            result = self.functional(*inputs, **options)
            if self.returns == "none":
                return None
            got, values = result.asdict(), self.values(inputs, options)
            return self._as_returned({o.name: got[o.name] if got.get(o.name) is not None
                                      else self._empty(o, values) for o in self.returned})

        def fake(*args, **kwargs):
            inputs, options = self._operator_call(args, kwargs)
            return self._as_returned(self.allocate(self.values(inputs, options), fake=True))

        lib.impl(self.name, implementation, "CompositeExplicitAutograd")
        torch.library.register_fake(f"graphrt::{self.name}", fake, lib=lib)
