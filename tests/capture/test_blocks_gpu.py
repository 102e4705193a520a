"""Captured backward passes of the example blocks, verified against eager execution."""
import pytest
import torch

from graphrt.bench.models import MhcBlock, loss_and_grads
from graphrt.capture import capture, verify_replay

pytestmark = pytest.mark.gpu


def test_mhc_block_backward_replays_bitwise(seed):
    block = MhcBlock(256, 4, 512, device="cuda")
    step = loss_and_grads(block)

    def batch(_step=0):
        return (torch.randn(128, 1024, dtype=torch.bfloat16, device="cuda"),
                torch.randn(128, 1024, dtype=torch.bfloat16, device="cuda"))

    fragment = capture(step, *batch())
    assert fragment.nodes()["kernel"] > 10
    report = verify_replay(fragment, step, batch, steps=3)
    assert report.ok, str(report)
    assert torch.isfinite(fragment.outputs[0]) and block.mhc.weight.shape == (24, 1024)

