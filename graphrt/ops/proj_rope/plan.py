"""Plan for projection GEMM + YaRN RoPE + dual-direction MXFP8 quantize (DeepSeek MLA Q)."""
from __future__ import annotations

from functools import partial

import torch

from ...arena import align_up
from ...errors import ContractError
from ...notices import warn_once
from ...plan import hopper_module, Plan, write_reference
from ...streams import on_stream
from ...validate import (compact_operand, dtype_name, require_disjoint,
                         require_tensor, workspace_as, workspace_operand)
from .reference import FP8, gemm_proj_rope_mxfp8_reference

BF16 = torch.bfloat16
X_CHUNK = 4096   # tokens of x dequantized per step on the MXFP8 path (a multiple of 32)


class GemmProjRopeMxfp8(Plan):
    """out = MXFP8(RoPE(x @ W)) in both directions: rowwise blocks of 32 along head_dim and
    columnwise blocks of 32 along tokens, quantized from the FP32 values (on Hopper with
    nvidia-cutlass-dsl installed, by the CuTe DSL kernel for W [N, K]). The path follows x's
    dtype: BF16 x and w, or float8_e4m3fn codes with E8M0 scales (x_scale, w_scale); the MXFP8
    path takes ``workspace_bytes()`` of scratch for BF16 copies of W and of a chunk of x.

    >>> plan = GemmProjRopeMxfp8(x, w, cos, sin).compile()                       # doctest: +SKIP
    >>> plan.execute(x, w, cos, sin, out_fp8_row=r, out_scales_row=rs,
    ...              out_fp8_col=c, out_scales_col=cs)                           # doctest: +SKIP
    """

    op = "gemm_proj_rope_mxfp8"
    output_names = ("out_fp8_row", "out_scales_row", "out_fp8_col", "out_scales_col")
    records_launches = True

    def _check_support(self) -> None:
        c = self.contract
        x, w = c.spec("x"), c.spec("w")
        nope, rope = c.flag("qk_nope_dim"), c.flag("qk_rope_dim")
        head_dim = nope + rope
        if rope <= 0 or rope % 2 or nope < 0 or head_dim % 32:
            raise ContractError(f"qk_nope_dim, qk_rope_dim: the head dim must be a multiple of 32 "
                                f"with an even, positive rope dim, got {nope} + {rope}")
        if x.dtype not in (BF16, FP8):
            raise ContractError(f"x: expected dtype bfloat16 or float8_e4m3fn, got {dtype_name(x.dtype)}")
        if w.dtype != x.dtype:
            raise ContractError(f"w: expected dtype {dtype_name(x.dtype)} (like x), got {dtype_name(w.dtype)}")
        for name in ("x", "w", "cos", "sin"):
            spec = c.spec(name)
            if len(spec.shape) != 2 or spec.layout != "contiguous":
                raise ContractError(f"{name}: expected a compact row-major 2-D tensor, got "
                                    f"{spec.shape} ({spec.layout})")
        k = x.shape[1]
        n_total, wk = w.shape if c.flag("w_out_in") else w.shape[::-1]
        if wk != k:
            raise ContractError(f"w: expected K={k} (x's inner dim) along its "
                                f"{'second' if c.flag('w_out_in') else 'first'} dim, got shape {w.shape}")
        if n_total % head_dim:
            raise ContractError(f"w: {n_total} output features are not a whole number of heads of "
                                f"{head_dim}")
        for name in ("cos", "sin"):
            spec = c.spec(name)
            if spec.dtype != BF16 or spec.shape[1] != rope:
                raise ContractError(f"{name}: expected bfloat16 [tokens, {rope}], got "
                                    f"{dtype_name(spec.dtype)} {spec.shape}")
        mx = x.dtype == FP8
        for name in ("x_scale", "w_scale"):
            spec = c.spec(name)
            if spec.present and not mx:
                raise ContractError(f"{name}: scales belong to the MXFP8 path; x is bfloat16")
            if mx and not spec.present:
                raise ContractError(f"{name}: the MXFP8 path needs E8M0 scales")
        if mx:
            if k % 32:
                raise ContractError(f"x: K must be a multiple of 32 on the MXFP8 path, got {k}")
            want_ws = (n_total, k // 32) if c.flag("w_out_in") else (k // 32, n_total)
            for name, want in (("x_scale", (None, k // 32)), ("w_scale", want_ws)):
                spec = c.spec(name)
                if spec.dtype != torch.uint8 or spec.shape != want or spec.layout != "contiguous":
                    raise ContractError(f"{name}: expected a compact uint8 {want} tensor, got "
                                        f"{dtype_name(spec.dtype)} {spec.shape} ({spec.layout})")
        self.k, self.n_total, self.heads, self.head_dim = k, n_total, n_total // head_dim, head_dim
        self.mx = mx

    def _compile(self) -> None:
        self.config, self.kernel = None, None
        if self.backend == "triton":
            from .kernels import fits_head_kernel, head_config, launch_block, launch_head
            c = self.contract
            nope, rope = c.flag("qk_nope_dim"), c.flag("qk_rope_dim")
            self.dot_fp32 = c.device_type != "cuda"
            kw = dict(k=self.k, heads=self.heads, nope=nope, rope=rope, w_out_in=c.flag("w_out_in"))
            # hopper_module imports a module only when the device is a Hopper GPU.
            cute, ws = hopper_module(__package__, "kernels_cute", c.capability), None
            if cute is not None and cute.fits_cute_kernel(self.k, nope, rope, c.flag("w_out_in")):
                cute.compiled(torch.cuda.current_device())  # compile now, not in the first call
                self.kernel = "CuTe DSL (W multicast, epilogue warpgroup)"
                self._gemm = partial(cute.launch_cute, heads=self.heads)
            elif ((ws := hopper_module(__package__, "kernels_ws", c.capability)) is not None
                  and ws.fits_ws_kernel(self.k, nope, rope)):
                self.config, self.kernel = ws.WS_CONFIG, "warp-specialized (Gluon)"
                self._gemm = partial(ws.launch_ws, ws.WS_CONFIG, **kw)
            elif fits_head_kernel(self.k, nope, rope):
                self.config, self.kernel = head_config(self.dot_fp32), "head"
                self._gemm = partial(launch_head, self.config, dot_fp32=self.dot_fp32, **kw)
            else:
                self.kernel = "block (32 x 32 per program)"
                self._gemm = partial(launch_block, dot_fp32=self.dot_fp32, **kw)
            if c.capability is not None and c.capability[0] == 9 and cute is None and ws is None:
                from ...kernel_utils import TESTED_TRITONS_TEXT
                warn_once("proj-hopper", "graphrt: gemm_proj_rope_mxfp8 runs its portable Triton "
                          f"kernel ({self.kernel}) on this Hopper GPU: its fast kernels need "
                          "nvidia-cutlass-dsl (installed with graphrt on Linux x86-64) or "
                          f"Triton {TESTED_TRITONS_TEXT} (Gluon)")

    def workspace_bytes(self) -> int:
        """MXFP8 path: BF16 copies of W and of X_CHUNK tokens of x."""
        if self.backend != "triton" or not self.mx:
            return 0
        return align_up(self.n_total * self.k * 2) + X_CHUNK * self.k * 2

    def describe(self) -> dict:
        return {**super().describe(), "kernel": getattr(self, "kernel", None),
                "config": getattr(self, "config", None)}

    def execute(self, x, w, cos, sin, *, x_scale=None, w_scale=None, out_fp8_row=None,
                out_scales_row=None, out_fp8_col=None, out_scales_col=None, workspace=None,
                stream=None) -> None:
        c = self.contract
        device = require_tensor("x", x).device
        t = x.shape[0]
        if t % 32:
            raise ContractError(f"x: the token count must be a multiple of 32, got {t}")
        h, d = self.heads, self.head_dim
        expected = {"x": ((t, self.k), c.spec("x").dtype), "w": (tuple(c.spec("w").shape), c.spec("w").dtype),
                    "cos": ((t, c.flag("qk_rope_dim")), BF16), "sin": ((t, c.flag("qk_rope_dim")), BF16),
                    "out_fp8_row": ((t, h, d), FP8), "out_scales_row": ((t, h, d // 32), torch.uint8),
                    "out_fp8_col": ((t, h, d), FP8), "out_scales_col": ((t // 32, h, d), torch.uint8)}
        if self.mx:
            expected["x_scale"] = ((t, self.k // 32), torch.uint8)
            expected["w_scale"] = (tuple(c.spec("w_scale").shape), torch.uint8)
        elif x_scale is not None or w_scale is not None:
            raise ContractError("x_scale, w_scale: scales belong to the MXFP8 path; x is bfloat16")
        given = {"x": x, "w": w, "cos": cos, "sin": sin, "x_scale": x_scale, "w_scale": w_scale,
                 "out_fp8_row": out_fp8_row, "out_scales_row": out_scales_row,
                 "out_fp8_col": out_fp8_col, "out_scales_col": out_scales_col}
        for name, (shape, dtype) in expected.items():
            compact_operand(name, given[name], (dtype,), shape, device)
        workspace = workspace_operand(workspace, self.workspace_bytes(), device)
        outputs = {n: given[n] for n in self.output_names}
        require_disjoint(outputs, {n: given[n] for n in ("x", "w", "cos", "sin", "x_scale", "w_scale")})
        if self.backend == "reference":
            ref = gemm_proj_rope_mxfp8_reference(
                x, w, cos, sin, x_scale=x_scale, w_scale=w_scale, w_out_in=c.flag("w_out_in"),
                qk_nope_dim=c.flag("qk_nope_dim"), qk_rope_dim=c.flag("qk_rope_dim"))
            write_reference(outputs.values(), ref)
            return
        from .kernels import launch_dequant
        gemm, dot_fp32 = self._gemm, self.dot_fp32
        row, col = out_fp8_row.view(torch.uint8), out_fp8_col.view(torch.uint8)
        with on_stream(stream):
            if not self.mx:
                gemm(x, w, cos, sin, row, out_scales_row, col, out_scales_col, tokens=t)
                return
            w_bytes = align_up(self.n_total * self.k * 2)
            w16 = workspace_as(workspace, self.n_total * self.k * 2, BF16).view(w.shape)
            x16 = workspace[w_bytes:w_bytes + X_CHUNK * self.k * 2].view(BF16).view(X_CHUNK, self.k)
            w_operand = (w.view(torch.uint8), w_scale, w16, c.flag("w_out_in"))
            for t0 in range(0, t, X_CHUNK):
                t1 = min(t, t0 + X_CHUNK)
                x_operand = (x.view(torch.uint8)[t0:t1], x_scale[t0:t1], x16[:t1 - t0], True)
                launch_dequant([w_operand, x_operand] if t0 == 0 else [x_operand],
                               dot_fp32=dot_fp32)
                gemm(x16[:t1 - t0], w16, cos[t0:t1], sin[t0:t1], row[t0:t1], out_scales_row[t0:t1],
                     col[t0:t1], out_scales_col[t0 // 32:t1 // 32], tokens=t1 - t0)
