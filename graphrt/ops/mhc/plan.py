"""Plan for the mHC projection/RMS backward (DeepSeek manifold-constrained hyper-connections)."""
from __future__ import annotations

import torch

from ...errors import ContractError, UnsupportedError
from ...plan import Plan, write_reference
from ...streams import on_stream
from ...validate import (compact_operand, dtype_name, require_disjoint, require_tensor,
                         workspace_as, workspace_operand)
from .reference import mhc_projection_backward_reference

MAX_N = 64
_INPUTS = ("x", "weight", "grad_proj", "grad_r", "r")
_DTYPES = {"x": torch.bfloat16, "weight": torch.float32, "grad_proj": torch.float32,
           "grad_r": torch.float32, "r": torch.float32}


class MhcProjectionBackward(Plan):
    """dx = P @ W + grad_r / (r K) * x and dweight = P^T @ x, with P = grad_proj[:, :N].

    x: BF16 [T, K]; weight: FP32 [N, K]; grad_proj: FP32 [T, Npad] (columns from N on ignored);
    grad_r, r: FP32 [T, 1]. The products round their FP32 operands (``allow_tf32=True`` is
    required to accept that): each is split into two BF16 halves for the tensor cores, about 16
    mantissa bits, more than TF32 keeps; accumulation is FP32. dx is BF16, dweight FP32,
    reduced over rows in a fixed order (bitwise reproducible); T is a run-time extent.

    >>> plan = MhcProjectionBackward(x, w, gp, gr, r, allow_tf32=True).compile()     # doctest: +SKIP
    >>> plan.execute(x, w, gp, gr, r, dx=dx, dweight=dw, workspace=ws)               # doctest: +SKIP
    """

    op = "mhc_projection_backward"
    output_names = ("dx", "dweight")
    records_launches = True

    def _check_support(self) -> None:
        c = self.contract
        if not c.flag("allow_tf32"):
            raise UnsupportedError("allow_tf32: the matrix products round their FP32 operands "
                                   "(to at least TF32 precision, FP32 accumulation); pass "
                                   "allow_tf32=True to accept that")
        specs = {name: c.spec(name) for name in _INPUTS}
        for name, spec in specs.items():
            if spec.dtype != _DTYPES[name]:
                raise ContractError(f"{name}: expected dtype {dtype_name(_DTYPES[name])}, got "
                                    f"{dtype_name(spec.dtype)}")
            if len(spec.shape) != 2:
                raise ContractError(f"{name}: expected a 2-D tensor, got shape {spec.shape}")
            if spec.layout != "contiguous":
                raise ContractError(f"{name}: expected a compact row-major tensor, got {spec.layout}")
        k = specs["x"].shape[1]
        n, wk = specs["weight"].shape
        if wk != k:
            raise ContractError(f"weight: expected [N, {k}] (K of x), got {specs['weight'].shape}")
        if k % 8 or k == 0:
            raise ContractError(f"x: K must be a positive multiple of 8, got {k}")
        if not 1 <= n <= MAX_N:
            raise ContractError(f"weight: N must be in [1, {MAX_N}], got {n}")
        if specs["grad_proj"].shape[1] < n:
            raise ContractError(f"grad_proj: expected at least N={n} columns, got "
                                f"{specs['grad_proj'].shape[1]}")
        for name in ("grad_r", "r"):
            if specs[name].shape[1] != 1:
                raise ContractError(f"{name}: expected shape [T, 1], got {specs[name].shape}")
        self.k, self.n = k, n

    def _compile(self) -> None:
        self.slots = self.contract.flag("slots")
        if self.backend == "triton":
            from .kernels import TILE
            self.config = TILE

    def workspace_bytes(self) -> int:
        if self.backend != "triton":
            return 0
        from .kernels import MAX_GROUPS
        return MAX_GROUPS * self.n * self.k * 4

    def execute(self, x, weight, grad_proj, grad_r, r, *, dx=None, dweight=None, workspace=None,
                stream=None) -> None:
        inputs = {"x": x, "weight": weight, "grad_proj": grad_proj, "grad_r": grad_r, "r": r}
        device = require_tensor("x", x).device
        rows = x.shape[0] if x.dim() == 2 else -1
        expected = {"x": (rows, self.k), "weight": (self.n, self.k),
                    "grad_proj": (rows, self.contract.spec("grad_proj").shape[1]),
                    "grad_r": (rows, 1), "r": (rows, 1), "dx": (rows, self.k),
                    "dweight": (self.n, self.k)}
        dtypes = {**_DTYPES, "dx": torch.bfloat16, "dweight": torch.float32}
        for name, t in {**inputs, "dx": dx, "dweight": dweight}.items():
            compact_operand(name, t, (dtypes[name],), expected[name], device)
        require_disjoint({"r": r}, {"grad_r": grad_r})
        workspace = workspace_operand(workspace, self.workspace_bytes(), device)
        require_disjoint({"dx": dx, "dweight": dweight, "workspace": workspace}, inputs)
        if self.backend == "reference":
            write_reference((dx, dweight), mhc_projection_backward_reference(
                x, weight, grad_proj, grad_r, r, dtype=torch.float32))
            return
        from .kernels import launch_backward
        partial = workspace_as(workspace, self.workspace_bytes(), torch.float32)
        with on_stream(stream):
            launch_backward(self.config, self.slots, x, weight, grad_proj, grad_r, r, dx,
                            dweight, partial, rows)
