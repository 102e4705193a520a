"""Static descriptions of a call: what a compiled plan depends on and nothing else.

A :class:`Contract` is the plan-store key. It holds plan-time facts only (op, backend, device
type and compute capability, dtypes, static dims, layout classes, flags); run-time extents such as
row or token counts are recorded as ``None`` in a :class:`TensorSpec` shape, so one plan serves
every value of them.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

DYNAMIC = None  # marks a run-time extent in TensorSpec.shape


class TensorSpec(NamedTuple):
    """One tensor argument as a plan sees it: name, dtype, static shape and layout class.

    ``shape`` holds ints for static dims and ``None`` for dims known only at run time.
    An optional argument that was not given is described with ``dtype=None``.

    >>> TensorSpec("x", torch.bfloat16, (None, 4096), "rows")
    TensorSpec(name='x', dtype=torch.bfloat16, shape=(None, 4096), layout='rows')
    """

    name: str
    dtype: torch.dtype | None
    shape: tuple
    layout: str

    @classmethod
    def absent(cls, name: str) -> "TensorSpec":
        spec = _ABSENT.get(name)
        if spec is None:
            spec = _ABSENT[name] = cls(name, None, (), "absent")
        return spec

    @property
    def present(self) -> bool:
        return self.dtype is not None


_ABSENT: dict[str, TensorSpec] = {}


class Contract:
    """Hashable, immutable key of a plan: ``op``, ``backend``, device facts, tensor specs, flags.

    >>> c = Contract("rmsnorm_forward", "triton", "cuda", (9, 0),
    ...              (TensorSpec("x", torch.bfloat16, (None, 4096), "rows"),), {"eps": 1e-6})
    >>> c == Contract("rmsnorm_forward", "triton", "cuda", (9, 0),
    ...               (TensorSpec("x", torch.bfloat16, (None, 4096), "rows"),), {"eps": 1e-6})
    True
    """

    __slots__ = ("op", "backend", "device_type", "capability", "tensors", "flags", "_key", "_hash")

    def __init__(self, op: str, backend: str, device_type: str, capability: tuple | None,
                 tensors: tuple[TensorSpec, ...], flags: dict[str, Any] | tuple | None = None):
        self.op = op
        self.backend = backend
        self.device_type = device_type
        self.capability = capability
        self.tensors = tuple(tensors)
        # a tuple of (name, value) pairs is taken in the order given (plans pass a fixed order)
        self.flags = flags if type(flags) is tuple else tuple(sorted((flags or {}).items()))
        self._key = (op, backend, device_type, capability, self.tensors, self.flags)
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Contract) and self._hash == other._hash and self._key == other._key

    def spec(self, name: str) -> TensorSpec:
        for s in self.tensors:
            if s.name == name:
                return s
        raise KeyError(name)

    def flag(self, name: str) -> Any:
        return dict(self.flags)[name]

    def dynamic_dims(self) -> dict[str, tuple[int, ...]]:
        """Which dims of which tensors are run-time extents."""
        return {s.name: tuple(i for i, d in enumerate(s.shape) if d is DYNAMIC)
                for s in self.tensors if s.present}

    def __repr__(self) -> str:
        specs = ", ".join(f"{s.name}:{str(s.dtype).replace('torch.', '')}{list(s.shape)}/{s.layout}"
                          for s in self.tensors if s.present)
        flags = ", ".join(f"{k}={v}" for k, v in self.flags)
        return (f"Contract({self.op}, {self.backend}, {self.device_type}{self.capability or ''}, "
                f"[{specs}], {{{flags}}})")
