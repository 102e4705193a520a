"""Grouped GEMM weight gradients against torch._grouped_mm and a loop of torch.mm (TFLOP/s)."""
from __future__ import annotations

import itertools

import torch

from ..ops import GroupedGemmWgrad
from ..ops.grouped_gemm.reference import expert_bounds
from ..ops.registry import op
from . import report
from .timing import BF16_GEMM_CEILING_TFLOPS, device_time_us, rotating, stream_time_us

CASES = op("grouped_gemm_wgrad").cases


def random_counts(experts: int, tokens: int, generator: torch.Generator) -> list[int]:
    """Token counts per expert: random multiples of 256 summing to ``tokens``, the middle expert
    empty (its tokens go to its predecessor)."""
    units = tokens // 256
    cuts = sorted(torch.randint(0, units + 1, (experts - 1,), generator=generator).tolist())
    counts = [256 * (b - a) for a, b in zip([0] + cuts, cuts + [units])]
    if experts > 1:
        middle = experts // 2
        counts[middle - 1], counts[middle] = counts[middle - 1] + counts[middle], 0
    return counts


def offsets_of(counts: list[int], device="cuda") -> torch.Tensor:
    """The int32 offsets (each expert's end, cumulative) of token ``counts`` on ``device``."""
    return torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)


# (A major, B major, input order); the first is MoE's (A the transpose of the activations)
LAYOUTS = (("m", "n", "tensor2d"), ("k", "n", "tensor2d"), ("k", "k", "tensor2d"),
           ("m", "k", "tensor2d"), ("k", "k", "tensor_ragged"))


def odd_counts(counts: list[int], generator: torch.Generator) -> list[int]:
    """``counts`` with tokens moved between non-empty neighbours so that most are not multiples
    of 8 (the sum, a multiple of 8, stays; empty experts stay empty)."""
    out = list(counts)
    for e in range(len(out) - 1):
        if counts[e] and counts[e + 1]:
            shift = min(out[e], int(torch.randint(1, 8, (1,), generator=generator)))
            out[e], out[e + 1] = out[e] - shift, out[e + 1] + shift
    return out


def _operands(tokens: int, hidden: int, inter: int, a_major: str, b_major: str):
    """A [hidden, tokens] and B [tokens, intermediate] in the given majors (A "m": the
    transpose of a [tokens, hidden] activation; B "k": the transpose of [intermediate, tokens]).
    For tensor_ragged the same K-major buffers hold the experts' blocks one after another."""
    a = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda").t()
    b = torch.randn(tokens, inter, dtype=torch.bfloat16, device="cuda")
    if a_major == "k":
        a = a.contiguous()
    if b_major == "k":
        b = b.t().contiguous().t()
    return a, b


FP8_RECIPES = (("fp8 e8m0/32", torch.uint8, 32), ("fp8 fp32/128", torch.float32, 128))


def _fp8_operands(tokens: int, hidden: int, inter: int, scale_dtype, block: int):
    """FP8 codes a (hidden, T) and b (T, intermediate), both K-major, with their scales, each
    block's contiguous along hidden and intermediate (the layout the kernel reads fastest)."""
    blocks = -(-tokens // block)
    a = torch.randn(hidden, tokens, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(inter, tokens, device="cuda").to(torch.float8_e4m3fn).t()
    if scale_dtype == torch.uint8:
        a_scale = torch.randint(120, 134, (blocks, hidden), dtype=torch.uint8, device="cuda").t()
        b_scale = torch.randint(120, 134, (blocks, inter), dtype=torch.uint8, device="cuda")
    else:
        a_scale = (torch.rand(blocks, hidden, device="cuda") + 0.5).t()
        b_scale = torch.rand(blocks, inter, device="cuda") + 0.5
    return a, b, a_scale, b_scale


def _fp8_impls(tokens, hidden, inter, offsets, out) -> dict:
    """graphrt on FP8 inputs, each recipe with its own rotating input sets."""
    impls = {}
    for name, scale_dtype, block in FP8_RECIPES:
        sets = [_fp8_operands(tokens, hidden, inter, scale_dtype, block) for _ in range(2)]
        a, b, sa, sb = sets[0]
        plan = GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb).compile()
        ws = call_workspace(plan, tokens)
        impls[f"graphrt {name}"] = rotating(
            lambda a, b, sa, sb, plan=plan, ws=ws: plan.execute(
                a, b, offsets, a_scale=sa, b_scale=sb, wgrad=out, workspace=ws), sets)
    return impls


def fp8_gemm_ceiling_tflops(progress=print) -> float | None:
    """TFLOP/s of torch._scaled_mm on 8192^3 FP8 codes (one scale per tensor): the FP8 GEMM
    ceiling measured on this device (None, said why, where torch has no FP8 GEMM here)."""
    n = 8192
    try:
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        us = stream_time_us(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                     out_dtype=torch.bfloat16))
    except Exception as err:   # any torch without this FP8 GEMM: the FP8 rows go without it
        progress(f"no FP8 GEMM ceiling: torch._scaled_mm failed ({type(err).__name__}: {err})")
        return None
    tflops = 2.0 * n ** 3 / (us * 1e-6) / 1e12
    progress(f"FP8 GEMM ceiling (torch._scaled_mm 8192^3): {tflops:.1f} TFLOP/s")
    return tflops


def call_workspace(plan, tokens: int) -> torch.Tensor | None:
    """The workspace a plan's execute takes (ragged rows, MXFP8 values; as the functional
    call allocates it), None where it has no use for one."""
    nbytes = plan.call_workspace_bytes(tokens)
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda") if nbytes else None


def layouts_in_turn(experts: int, hidden: int, inter: int, tokens: int, counts: list[int],
                    rounds: int = 5) -> dict[tuple, float]:
    """graphrt's time on every layout (LAYOUTS' keys) at ``counts``, the layouts timed in turn
    for ``rounds`` rounds, each one's median. A long product heats the GPU and its clock drifts
    within a run (the same kernel measured 1382, 1447 and 1480 us over 20 s on the H200), so
    layouts timed one after another would also compare their places in the run."""
    offsets = offsets_of(counts)
    out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
    runs = {}
    for a_major, b_major, order in LAYOUTS:
        sets = [_operands(tokens, hidden, inter, a_major, b_major) for _ in range(2)]
        plan = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets, input_order=order).compile()
        ws = call_workspace(plan, tokens)
        runs[a_major, b_major, order] = rotating(
            lambda a, b, plan=plan, ws=ws: plan.execute(a, b, offsets, wgrad=out, workspace=ws),
            sets)
    return medians_in_turn(runs, rounds)


def medians_in_turn(runs: dict, rounds: int = 5) -> dict:
    """Each run's median ``stream_time_us`` over ``rounds`` rounds, the runs timed in turn
    within each round."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, f in runs.items():
            times[name].append(stream_time_us(f))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def run(progress=print) -> list[dict]:
    rows = []
    fp8_ceiling = fp8_gemm_ceiling_tflops(progress)
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        aligned = random_counts(experts, tokens, gen)
        flops = 2.0 * hidden * inter * tokens
        for (a_major, b_major, order), (counts_name, counts) in itertools.product(
                LAYOUTS, (("x256", aligned), ("odd", odd_counts(aligned, gen)))):
            progress(f"wgrad E={experts} hidden={hidden} intermediate={inter} tokens={tokens} "
                     f"A {a_major}-major, B {b_major}-major, {order}, counts {counts_name} ...")
            offsets = offsets_of(counts)
            sets = [_operands(tokens, hidden, inter, a_major, b_major) for _ in range(2)]
            out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
            plan = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets, input_order=order).compile()
            ws = call_workspace(plan, tokens)
            impls = {"graphrt": lambda a, b: plan.execute(a, b, offsets, wgrad=out, workspace=ws)}
            if ws is not None:   # what a plan without the rows' workspace does
                impls["graphrt, no workspace"] = lambda a, b: plan.execute(a, b, offsets,
                                                                           wgrad=out)
            # each expert's gradient where its own pointer says (here the same buffer's)
            discrete = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets, input_order=order,
                                        output_mode="discrete").compile()
            ptrs = torch.tensor([w.data_ptr() for w in out], dtype=torch.int64, device="cuda")
            impls["graphrt, discrete output"] = lambda a, b: discrete.execute(
                a, b, offsets, wgrad_ptrs=ptrs, workspace=ws)
            first = (a_major, b_major, order) == LAYOUTS[0] and counts_name == "x256"
            if first:   # the loop is layout-blind; once per case
                bounds = expert_bounds(offsets, tokens)
                impls["loop of torch.mm"] = lambda a, b: [
                    torch.mm(a[:, s:e], b[s:e], out=out[i]) for i, (s, e) in enumerate(bounds)]
            # (on ragged buffers the peers compute the K-major tensor2d product: the same work)
            # torch._grouped_mm asserts on the device (it takes the process down) when a group's
            # byte size along a contiguous dim is not a multiple of 16: odd counts are ours alone
            if hasattr(torch, "_grouped_mm") and counts_name == "x256":
                impls["torch._grouped_mm"] = lambda a, b: torch._grouped_mm(a, b, offs=offsets)
            times = {k: stream_time_us(rotating(f, sets)) for k, f in impls.items()}
            if (a_major, b_major, order) == ("k", "k", "tensor2d"):   # FP8's layout
                for name, f in _fp8_impls(tokens, hidden, inter, offsets, out).items():
                    times[name] = stream_time_us(f)
            flushed = ({k: device_time_us(rotating(f, sets)) for k, f in impls.items()}
                       if first else {})
            for name, us in times.items():
                tflops = flops / (us * 1e-6) / 1e12
                rows.append({"E": experts, "hidden": hidden, "intermediate": inter,
                             "tokens": tokens, "A": a_major, "B": b_major, "order": order,
                             "counts": counts_name, "impl": name, "us": us, "TFLOP/s": tflops,
                             "of_ceiling": tflops / (fp8_ceiling or float("nan")
                                                     if "fp8" in name else
                                                     BF16_GEMM_CEILING_TFLOPS),
                             "speedup_vs": us / times["graphrt"],
                             "do_bench_us": flushed.get(name), "of_fastest": None})
        progress(f"wgrad E={experts} hidden={hidden} intermediate={inter} tokens={tokens}: "
                 f"every layout in turn, counts x256 ...")
        in_turn = layouts_in_turn(experts, hidden, inter, tokens, aligned)
        fastest = min(in_turn.values())
        for (a_major, b_major, order), us in in_turn.items():
            tflops = flops / (us * 1e-6) / 1e12
            rows.append({"E": experts, "hidden": hidden, "intermediate": inter, "tokens": tokens,
                         "A": a_major, "B": b_major, "order": order, "counts": "x256",
                         "impl": "graphrt, layouts in turn", "us": us, "TFLOP/s": tflops,
                         "of_ceiling": tflops / BF16_GEMM_CEILING_TFLOPS, "speedup_vs": None,
                         "do_bench_us": None, "of_fastest": fastest / us})
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "wgrad", run(progress), progress,
        legend="A: m = M-major (the transpose of a [tokens, hidden] activation), k = K-major "
               "(contiguous [hidden, tokens]); B: n = N-major ([tokens, intermediate]), k = "
               "K-major; order: tensor2d, or tensor_ragged (per-expert blocks, tokens "
               "unit-stride; the peers time the K-major tensor2d product on the same buffers; "
               "graphrt with the workspace in which experts off 16-byte rows are copied as "
               "rows first, as the functional call does, and without it); 'graphrt, "
               "discrete output': output_mode='discrete', one 16-byte aligned pointer per "
               "expert; counts: x256 = random multiples of 256 per expert with the middle "
               "expert empty, odd = the same moved by 1-7 tokens between non-empty neighbours "
               "(not multiples of 8); graphrt fp8: float8_e4m3fn codes with E8M0 scales per "
               "32 tokens (with the workspace for their BF16 values, as the functional call "
               "does) or FP32 scales per 128 tokens (both K-major; scales contiguous along "
               "hidden and intermediate), of_ceiling against the FP8 GEMM ceiling "
               "measured first; speedup_vs: that impl's time over graphrt BF16's in the same "
               "row group; do_bench only for the first layout; 'graphrt, layouts in turn': "
               "every layout timed in turn over five rounds (median), of_fastest the fastest "
               "layout's time over this one's")
