"""Captured backward passes of the example blocks, verified against eager execution."""
import pytest
import torch

import graphrt
from graphrt.models import DeepSeekBlock, HstuBlock, MhcBlock, loss_and_grads, mse
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



def test_deepseek_block_with_experts_and_q_projection_replays_bitwise(seed):
    block = DeepSeekBlock(256, 4, 4, 512, 2, device="cuda")
    params = list(block.parameters())
    cos = torch.randn(512, 64, device="cuda").to(torch.bfloat16)

    def step(x, target, offsets):
        out, q = block(x, offsets, cos, cos)
        loss = mse(out, target)
        return (loss.detach(), q.out_fp8_row.view(torch.uint8), *torch.autograd.grad(loss, params))

    def batch(i=0):
        counts = [[128, 128, 128, 128], [512, 0, 0, 0], [1, 2, 3, 506]][i % 3]
        offsets = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        return (torch.randn(128, 1024, dtype=torch.bfloat16, device="cuda"),
                torch.randn(128, 1024, dtype=torch.bfloat16, device="cuda"), offsets)

    fragment = capture(step, *batch())
    assert fragment.shape()["max_parallel_kernels"] >= 2   # expert wgrad on its side stream
    report = verify_replay(fragment, step, batch, steps=3)
    assert report.ok, str(report)


def test_hstu_block_backward_replays_with_fresh_masks(seed):
    block = HstuBlock(256, 0.1, device="cuda")
    step = loss_and_grads(block, lambda xu: block(*xu.chunk(2, dim=1)))  # padded row strides

    def batch(_step=0):
        xu = torch.randn(512, 512, dtype=torch.bfloat16, device="cuda")
        return xu, torch.randn(512, 256, dtype=torch.bfloat16, device="cuda")

    rng = graphrt.runtime("cuda").rng
    fragment = capture(step, *batch())
    before = rng.get()[1]
    fragment.replay()
    assert rng.get()[1] == before + 512 * 256      # the graph advances the offset
    report = verify_replay(fragment, step, batch, steps=3)
    assert report.ok, str(report)
