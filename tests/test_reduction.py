"""The grouped order of graphrt.reduction, in FP32 so that any other order shows: the sums made
by the last programs to arrive (``finish_in_groups``) and by a second launch
(``sum_partials_in_groups``) against the same additions made by torch one after the other."""
import pytest
import torch
import triton
import triton.language as tl

from graphrt.reduction import (PARTS_PER_GROUP, finish_in_groups, grouped_counter_words,
                               groups_of, sum_partials_in_groups)

from .conftest import INTERPRETER


@triton.jit
def _finish_only(PARTIAL, COUNTERS, OUT_A, OUT_B, COLS: tl.constexpr, BLOCK: tl.constexpr,
                 TWO: tl.constexpr, UNROLL: tl.constexpr):
    """Every program arrives with its partial rows already written (by the host)."""
    cols = tl.arange(0, BLOCK)
    finish_in_groups(PARTIAL, COUNTERS, OUT_A, OUT_B, tl.program_id(0), tl.num_programs(0),
                     cols, cols < COLS, COLS, BLOCK, TWO, UNROLL)


def _grouped_order(partial: torch.Tensor) -> torch.Tensor:
    """partial [matrices, parts, cols] summed in the grouped order by torch, in FP32."""
    total = torch.zeros(partial.shape[0], partial.shape[2], dtype=torch.float32,
                        device=partial.device)
    for first in range(0, partial.shape[1], PARTS_PER_GROUP.value):
        group = torch.zeros_like(total)
        for part in range(first, min(first + PARTS_PER_GROUP.value, partial.shape[1])):
            group = group + partial[:, part]
        total = total + group
    return total


DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(
               not INTERPRETER, reason="the kernels run on the CPU only with TRITON_INTERPRET=1")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("parts,cols,two", [(1, 8, True), (16, 24, False), (17, 40, True),
                                            (40, 24, True), (264, 512, True)])
def test_both_ways_sum_in_the_grouped_order(device, parts, cols, two):
    if device == "cpu" and parts * cols > 40 * 40:
        pytest.skip("the interpreter runs it slowly; the GPU covers the large case")
    gen = torch.Generator(device=device).manual_seed(parts * cols)
    matrices = 1 + two
    # magnitudes over six decades: another order of additions changes FP32 bits
    scale = 10.0 ** torch.empty(matrices, parts, cols, device=device).uniform_(-3, 3,
                                                                                 generator=gen)
    values = torch.randn(matrices, parts, cols, device=device, generator=gen) * scale
    expected = _grouped_order(values)
    # the partials, then the group sums' rows, as the kernels lay them out
    scratch = torch.full((matrices * (parts + groups_of(parts)) * cols,), float("nan"),
                         device=device)
    scratch[:values.numel()] = values.flatten()
    counters = torch.zeros(grouped_counter_words(parts) + 3, dtype=torch.int32, device=device)
    for unroll in (1, 4, 16):
        one = [torch.full((cols,), float("nan"), device=device) for _ in range(matrices)]
        _finish_only[(parts,)](scratch, counters, one[0], one[-1], COLS=cols,
                               BLOCK=triton.next_power_of_2(cols), TWO=two, UNROLL=unroll)
        for m in range(matrices):
            assert torch.equal(one[m], expected[m]), (unroll, m)
        assert not counters.any(), "a counter was left nonzero"
    two_launch = [torch.full((cols,), float("nan"), device=device) for _ in range(matrices)]
    sum_partials_in_groups(scratch, two_launch, parts)
    for m in range(matrices):
        assert torch.equal(two_launch[m], expected[m]), m
