"""Flatten nested tuples, lists and dicts of tensors (and constants) and rebuild them."""
from __future__ import annotations

from typing import Any

from ..result import Result


def flatten(obj: Any) -> tuple[list, Any]:
    """(leaves, spec): leaves in a fixed order, spec to rebuild ``obj`` with ``unflatten``."""
    leaves: list = []

    def walk(o):
        if isinstance(o, Result):
            return (Result, (o.names, [walk(v) for v in o]))
        if isinstance(o, tuple) and hasattr(o, "_make"):  # a namedtuple
            return (type(o), [walk(v) for v in o])
        if isinstance(o, (tuple, list)):
            return (tuple if isinstance(o, tuple) else list, [walk(v) for v in o])
        if isinstance(o, dict):
            return (dict, [(k, walk(v)) for k, v in o.items()])
        leaves.append(o)
        return None

    return leaves, walk(obj)


def unflatten(leaves: list, spec: Any) -> Any:
    it = iter(leaves)

    def build(s):
        if s is None:
            return next(it)
        kind, items = s
        if kind is dict:
            return {k: build(v) for k, v in items}
        if kind is Result:
            names, values = items
            return Result(names, [build(v) for v in values])
        values = [build(v) for v in items]
        return kind(values) if kind in (tuple, list) else kind(*values)

    return build(spec)
