"""Plans for RMSNorm train forward and backward."""
from __future__ import annotations

import math

import torch

from ...contract import Contract, check_row_spec
from ...errors import ContractError
from ...plan import Plan, write_reference
from ...streams import on_stream
from ...validate import (dtype_name, require_disjoint, require_tensor, rows_operand,
                         sm_count, vector_operand, workspace_as, workspace_operand)
from .reference import rmsnorm_backward_reference, rmsnorm_forward_reference

ACT_DTYPES = (torch.bfloat16,)
WEIGHT_DTYPES = (torch.bfloat16, torch.float32)
MIN_HIDDEN, MAX_HIDDEN = 8, 32768


def _check_hidden_and_weight(contract: Contract) -> int:
    x = contract.spec("x")
    hidden = x.shape[1]
    if hidden % 8 or not MIN_HIDDEN <= hidden <= MAX_HIDDEN:
        raise ContractError(f"x: hidden size H must be a multiple of 8 in [{MIN_HIDDEN}, "
                            f"{MAX_HIDDEN}], got {hidden}")
    w = contract.spec("w")
    if w.dtype not in WEIGHT_DTYPES:
        raise ContractError(f"w: expected dtype bfloat16 or float32, got {dtype_name(w.dtype)}")
    if w.shape != (hidden,) or w.layout != "contiguous":
        raise ContractError(f"w: expected a contiguous [{hidden}] tensor, got shape {w.shape} "
                            f"({w.layout})")
    return hidden


_programs_cache: dict = {}


def backward_programs_for(device: torch.device, hidden: int) -> int:
    """Programs of the backward grid on ``device`` (cached: it is read on every plan lookup)."""
    key = (device, hidden)
    programs = _programs_cache.get(key)
    if programs is None:
        from .kernels import backward_programs
        programs = _programs_cache[key] = backward_programs(hidden, sm_count(device))
    return programs


def _check_x_and_w(plan: Plan, x, w) -> tuple[torch.device, int, int]:
    """Run-time checks shared by both plans: (device, rows, x's row stride)."""
    device = require_tensor("x", x).device
    rows = x.numel() // plan.hidden
    stride = rows_operand("x", x, ACT_DTYPES, plan.hidden, rows, device)
    vector_operand("w", w, (plan.contract.spec("w").dtype,), plan.hidden, device)
    return device, rows, stride


class RmsNormForward(Plan):
    """RMSNorm train forward: y = h * rstd * w, rstd = 1/sqrt(mean(h^2) + eps), h = x (+ residual).

    >>> plan = RmsNormForward(x, w, eps=1e-6)                        # doctest: +SKIP
    >>> plan.compile()                                               # doctest: +SKIP
    >>> plan.execute(x, w, y=y, rstd=rstd)                           # doctest: +SKIP
    """

    op = "rmsnorm_forward"
    records_launches = True

    @property
    def output_names(self):
        return ("y", "rstd", "h_new") if self.contract.spec("residual").present else ("y", "rstd")

    def _check_support(self) -> None:
        hidden = _check_hidden_and_weight(self.contract)
        for name in ("x", "residual"):
            check_row_spec(self.contract.spec(name), ACT_DTYPES, hidden)
        eps = self.contract.flag("eps")
        if not (math.isfinite(eps) and eps > 0):
            raise ContractError(f"eps: expected a positive finite float, got {eps}")
        self.hidden = hidden

    def _compile(self) -> None:
        if self.backend == "triton":
            from .kernels import forward_config
            self.config = forward_config(self.hidden)

    def execute(self, x, w, *, residual=None, y=None, rstd=None, h_new=None, workspace=None,
                stream=None) -> None:
        c, hidden = self.contract, self.hidden
        device, rows, sx = _check_x_and_w(self, x, w)
        with_residual = c.spec("residual").present
        if (residual is not None) != with_residual:
            raise ContractError(f"residual: this plan was built {'with' if with_residual else 'without'} "
                                f"a residual")
        sr = sh = 0
        if residual is not None:
            sr = rows_operand("residual", residual, ACT_DTYPES, hidden, rows, device)
            if h_new is None:
                raise ContractError("h_new: expected an output tensor with a residual, got None")
            sh = rows_operand("h_new", h_new, ACT_DTYPES, hidden, rows, device)
        elif h_new is not None:
            raise ContractError("h_new: given without a residual")
        sy = rows_operand("y", y, ACT_DTYPES, hidden, rows, device)
        vector_operand("rstd", rstd, (torch.float32,), rows, device)
        require_disjoint({"y": y, "rstd": rstd, "h_new": h_new},
                         {"x": x, "w": w, "residual": residual})
        if self.backend == "reference":
            ref_y, ref_rstd, ref_h = rmsnorm_forward_reference(x, w, c.flag("eps"), residual)
            write_reference((y, rstd, h_new), (ref_y, ref_rstd.reshape(rstd.shape), ref_h))
            return
        from .kernels import launch_forward
        with on_stream(stream):
            launch_forward(self.config, sm_count(device), x, residual, w, y, rstd, h_new, rows,
                           (sx, sr, sy, sh), c.flag("eps"))


class RmsNormBackward(Plan):
    """RMSNorm train backward: dx (BF16, + g_residual) and dw = sum over rows of g * x * rstd.

    dw is reduced in a fixed order without atomics (bitwise reproducible); its FP32 partials live
    in the workspace (``workspace_bytes()``).

    >>> plan = RmsNormBackward(g, x, w, rstd).compile()              # doctest: +SKIP
    >>> ws = graphrt.runtime().arena.take(plan.workspace_bytes())    # doctest: +SKIP
    >>> plan.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)      # doctest: +SKIP
    """

    op = "rmsnorm_backward"
    records_launches = True
    output_names = ("dx", "dw")

    def _check_support(self) -> None:
        c = self.contract
        hidden = _check_hidden_and_weight(c)
        for name in ("g", "x", "g_residual"):
            check_row_spec(c.spec(name), ACT_DTYPES, hidden)
        dw_dtype = c.flag("dw_dtype")
        if dw_dtype not in (torch.float32, c.spec("w").dtype):
            raise ContractError(f"dw: expected dtype float32 or w's dtype, got {dtype_name(dw_dtype)}")
        self.hidden = hidden

    def _compile(self) -> None:
        self.n_programs = self.contract.flag("programs")
        if self.backend == "triton":
            from .kernels import backward_config
            self.config = backward_config(self.hidden)

    def workspace_bytes(self) -> int:
        return self.n_programs * self.hidden * 4 if self.backend == "triton" else 0

    def execute(self, g, x, w, rstd, *, g_residual=None, dx=None, dw=None, workspace=None,
                stream=None) -> None:
        c, hidden = self.contract, self.hidden
        device, rows, sx = _check_x_and_w(self, x, w)
        sg = rows_operand("g", g, ACT_DTYPES, hidden, rows, device)
        vector_operand("rstd", rstd, (torch.float32,), rows, device)
        with_residual = c.spec("g_residual").present
        if (g_residual is not None) != with_residual:
            raise ContractError(f"g_residual: this plan was built "
                                f"{'with' if with_residual else 'without'} g_residual")
        sgr = 0
        if g_residual is not None:
            sgr = rows_operand("g_residual", g_residual, ACT_DTYPES, hidden, rows, device)
        sdx = rows_operand("dx", dx, ACT_DTYPES, hidden, rows, device)
        vector_operand("dw", dw, (c.flag("dw_dtype"),), hidden, device)
        workspace = workspace_operand(workspace, self.workspace_bytes(), device)
        inputs = {"g": g, "x": x, "w": w, "rstd": rstd, "g_residual": g_residual}
        require_disjoint({"dx": dx, "dw": dw, "workspace": workspace}, inputs)
        if self.backend == "reference":
            write_reference((dx, dw), rmsnorm_backward_reference(g, x, w, rstd, g_residual))
            return
        from .kernels import launch_backward
        partial = workspace_as(workspace, self.workspace_bytes(), torch.float32)
        with on_stream(stream):
            launch_backward(self.config, self.n_programs, g, x, w, rstd, g_residual, dx, dw,
                            partial, rows, (sg, sx, sgr, sdx))

