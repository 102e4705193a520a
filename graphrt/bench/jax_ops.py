"""graphrt's JAX entry points against XLA on the same work, all under ``jax.jit``: the grouped
weight gradient against ``jax.lax.ragged_dot_general`` (the tokens as the ragged contracting
dimension), and the projection GEMM + RoPE + dual MXFP8 against ``x @ w.T`` with the RoPE and
both quantizations written in jnp. Each pair is first checked to agree on the benchmark inputs.

Times are wall time per call of the jitted function, host included: calls back to back, the
last one waited for.
"""
from __future__ import annotations

import itertools
import os
import time

import numpy as np
import torch

from . import report
from .proj import HEADS, K, NOPE, ROPE, TOKENS
from .timing import BF16_GEMM_CEILING_TFLOPS
from .wgrad import CASES as WGRAD_CASES
from .wgrad import random_counts

SMALL = {"wgrad": [(4, 64, 48, 512)], "proj": (64, 64, 2, 32, 32)}


def _jax():
    import jax
    import jax.numpy as jnp

    import graphrt.jax as gjax
    return jax, jnp, gjax


def xla_wgrad(a, b, counts):
    """wgrad[e] = a[:, tokens of e] @ b[tokens of e, :] by XLA's ragged dot: a [hidden, T],
    b [T, intermediate], counts int32 [E]."""
    jax, jnp, _ = _jax()
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1],
        rhs_group_dimensions=[])
    return jax.lax.ragged_dot_general(a, b, counts, numbers,
                                      preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def _quantize(jnp, jax, values, axis: int):
    """MXFP8 along ``axis`` in jnp, as graphrt defines it for finite values: E8M0 exponent
    ceil(log2(amax / 448)) per block of 32, codes round-to-nearest-even after the scale."""
    v = jnp.moveaxis(values, axis, -1)
    blocks = v.reshape(*v.shape[:-1], v.shape[-1] // 32, 32)
    ratio = jnp.maximum(jnp.abs(blocks).max(axis=-1), 1e-30) / 448.0
    bits = jax.lax.bitcast_convert_type(ratio, jnp.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).astype(jnp.int32)
    exponent = jnp.clip(exponent, -127, 127)
    scaled = blocks * jnp.exp2(-exponent.astype(jnp.float32))[..., None]
    codes = jnp.clip(scaled, -448.0, 448.0).astype(jnp.float8_e4m3fn).reshape(v.shape)
    return (jnp.moveaxis(codes, -1, axis),
            jnp.moveaxis((exponent + 127).astype(jnp.uint8), -1, axis))


def xla_projection(x, w, cos, sin, nope: int):
    """The projection pipeline in jnp: FP32-accumulated GEMM, RoPE (interleaved in, halves
    out) on each head's trailing features, MXFP8 along the features and along the tokens."""
    jax, jnp, _ = _jax()
    tokens, rope = x.shape[0], cos.shape[1]
    y = jnp.dot(x, w.T, preferred_element_type=jnp.float32).reshape(tokens, -1, nope + rope)
    pe, half = y[..., nope:], rope // 2
    x1, x2 = pe[..., 0::2], pe[..., 1::2]
    c, s = cos.astype(jnp.float32)[:, None, :], sin.astype(jnp.float32)[:, None, :]
    pe = jnp.concatenate((x1 * c[..., :half] - x2 * s[..., :half],
                          x2 * c[..., half:] + x1 * s[..., half:]), axis=-1)
    y = jnp.concatenate((y[..., :nope], pe), axis=-1)
    return (*_quantize(jnp, jax, y, 2), *_quantize(jnp, jax, y, 0))


def wall_us(fn, *args, calls: int = 20) -> float:
    """Wall time per call of ``fn(*args)`` (jitted), back to back, host included."""
    jax, _, _ = _jax()
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def _as_float(array) -> np.ndarray:
    return np.asarray(array.astype("float32"))


def wgrad_rows(cases, progress=print, calls: int = 20) -> list[dict]:
    jax, jnp, gjax = _jax()
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    rows = []
    for experts, hidden, inter, tokens in cases:
        progress(f"jax wgrad E={experts} hidden={hidden} intermediate={inter} tokens={tokens} ...")
        counts = random_counts(experts, tokens, gen) if tokens >= 256 * experts else \
            [tokens // experts] * experts
        counts[0], counts[-1] = counts[0] + counts[-1], 0   # an empty expert in every case
        a = jnp.asarray(rng.standard_normal((hidden, tokens), np.float32), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal((tokens, inter), np.float32), jnp.bfloat16)
        group_sizes = jnp.asarray(counts, jnp.int32)
        offsets = jnp.asarray(list(itertools.accumulate(counts)), jnp.int32)
        impls = {
            "XLA ragged_dot_general": (jax.jit(xla_wgrad), (a, b, group_sizes)),
            "graphrt (jit)": (jax.jit(lambda a, b, o: gjax.grouped_gemm_wgrad(a, b, o)[0]),
                              (a, b, offsets)),
            "graphrt (jit, check_offsets=False)": (jax.jit(
                lambda a, b, o: gjax.grouped_gemm_wgrad(a, b, o, check_offsets=False)[0]),
                (a, b, offsets)),
        }
        ours = _as_float(impls["graphrt (jit)"][0](*impls["graphrt (jit)"][1]))
        theirs = _as_float(impls["XLA ragged_dot_general"][0](a, b, group_sizes))
        error = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))
        if error > 1e-2:
            raise AssertionError(f"graphrt and XLA disagree on the wgrad: relative L2 {error:.2e}")
        times = {name: wall_us(fn, *args, calls=calls) for name, (fn, args) in impls.items()}
        rows += _rows("wgrad", f"E{experts} {hidden}x{inter} T{tokens}", times,
                      2.0 * hidden * inter * tokens, "XLA ragged_dot_general",
                      rel_l2_vs_xla=error)
    return rows


def _rows(op: str, case: str, times: dict, flops: float, xla: str, **checks) -> list[dict]:
    """One row per implementation: time, TFLOP/s, fraction of the GEMM ceiling, speed-up
    over XLA's implementation ``xla``, and the agreement ``checks``."""
    rows = []
    for name, us in times.items():
        tflops = flops / (us * 1e-6) / 1e12
        rows.append({"op": op, "case": case, "impl": name, "us": us, "TFLOP/s": tflops,
                     "of_ceiling": tflops / BF16_GEMM_CEILING_TFLOPS,
                     "speedup_vs_xla": times[xla] / us, **checks})
    return rows


def projection_rows(shape, progress=print, calls: int = 20) -> list[dict]:
    jax, jnp, gjax = _jax()
    tokens, k, heads, nope, rope = shape
    progress(f"jax proj tokens={tokens} K={k} heads={heads}x{nope + rope} ...")
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((tokens, k), np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((heads * (nope + rope), k), np.float32) / k ** 0.5,
                    jnp.bfloat16)
    cos, sin = (jnp.asarray(rng.standard_normal((tokens, rope), np.float32), jnp.bfloat16)
                for _ in range(2))
    impls = {
        "XLA (jnp pipeline)": jax.jit(lambda x, w, c, s: xla_projection(x, w, c, s, nope)),
        "graphrt (jit)": jax.jit(lambda x, w, c, s: gjax.gemm_proj_rope_mxfp8(
            x, w, c, s, qk_nope_dim=nope, qk_rope_dim=rope)),
    }
    ours = impls["graphrt (jit)"](x, w, cos, sin)
    theirs = impls["XLA (jnp pipeline)"](x, w, cos, sin)
    # the GEMMs accumulate in different orders: a code may differ by one step where a value
    # sits on a rounding boundary; the scales are compared exactly
    scales_equal = all(np.array_equal(np.asarray(o), np.asarray(t))
                       for o, t in zip(ours[1::2], theirs[1::2]))
    codes_off = max(float(np.mean(_as_float(o) != _as_float(t)))
                    for o, t in zip(ours[0::2], theirs[0::2]))
    if codes_off > 0.01:
        raise AssertionError(f"graphrt and XLA disagree on {codes_off:.1%} of the codes")
    times = {name: wall_us(fn, x, w, cos, sin, calls=calls) for name, fn in impls.items()}
    return _rows("proj", f"T{tokens} K{k} {heads}x{nope + rope}", times,
                 2.0 * tokens * k * heads * (nope + rope), "XLA (jnp pipeline)",
                 codes_differing=codes_off, scales_equal=scales_equal)


def run(progress=print, small: bool = False) -> list[dict]:
    """The benchmark cases, or (``small``) tiny ones that check the harness anywhere."""
    calls = 3 if small else 20
    wgrad_cases = SMALL["wgrad"] if small else WGRAD_CASES
    proj_shape = SMALL["proj"] if small else (TOKENS, K, HEADS, NOPE, ROPE)
    return wgrad_rows(wgrad_cases, progress, calls) + projection_rows(proj_shape, progress, calls)


def main(progress=print) -> list[dict]:
    small = os.environ.get("GRAPHRT_BENCH_JAX_SMALL") == "1"
    return report.publish(
        "jax", run(progress, small), progress,
        legend="us: wall time per jitted call, back to back, host included; speedup_vs_xla: "
               "XLA's time over this one (above 1: faster than XLA)")
