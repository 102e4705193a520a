"""How the nn modules call graphrt's ops: the functional call directly in eager mode (least host
time), the registered operator ``torch.ops.graphrt.<name>`` while torch.compile traces (an
opaque node with a fake implementation, instead of Python Dynamo cannot trace)."""
from __future__ import annotations

import torch


def call(direct, op_name: str, *args):
    """``direct(*args)`` eagerly; ``torch.ops.graphrt.<op_name>(*args)`` under torch.compile."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.graphrt, op_name)(*args)
    return direct(*args)
