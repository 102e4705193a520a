"""kernel_utils.launch: the direct launch picks the kernel Triton would, for every specialization,
and steps aside for launch hooks."""
import pytest
import torch
import triton

from graphrt.kernel_utils import launch
from graphrt.reduction import _sum_partials_kernel, partial_blocks

pytestmark = pytest.mark.gpu


def _reduce(partial, out, n_parts, cols):
    block_p, block_c = partial_blocks(n_parts, cols)
    return launch(_sum_partials_kernel, (triton.cdiv(cols, block_c), 1), partial, out, out,
                  n_parts, COLS=cols, BLOCK_P=block_p, BLOCK_C=block_c, NUM_STAGES=2,
                  AFTER_PRIMARY=False, num_warps=4)


# n_parts 1 and multiples of 16 are specializations of their own; an odd offset into the
# partials loses the 16-byte pointer alignment, another specialization
@pytest.mark.parametrize("n_parts, cols, offset", [(1, 64, 0), (16, 64, 0), (17, 1000, 0),
                                                   (17, 1000, 1), (32, 48, 3)])
def test_direct_launch_matches_the_reference_on_every_specialization(seed, n_parts, cols, offset):
    storage = torch.randn(n_parts * cols + offset, device="cuda")
    partial = storage[offset:]
    expected = partial.view(n_parts, cols).double().sum(0)
    out = torch.empty(cols, device="cuda")
    for _ in range(3):  # the first call may compile; the others launch directly
        out.fill_(float("nan"))
        compiled = _reduce(partial, out, n_parts, cols)
        torch.cuda.synchronize()
        assert torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(compiled, triton.compiler.CompiledKernel)


def test_launch_hooks_see_every_launch(seed):
    from triton import knobs
    partial, out = torch.randn(4 * 64, device="cuda"), torch.empty(64, device="cuda")
    _reduce(partial, out, 4, 64)  # compiled before the hook is added
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _reduce(partial, out, 4, 64)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen == ["_sum_partials_kernel"]
