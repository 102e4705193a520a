"""Small models shared by the capture example, benchmark and tests."""
from __future__ import annotations

import torch

from ..nn import RMSNorm


class Block(torch.nn.Module):
    """Pre-norm MLP block: x + W2 GELU(W1 RMSNorm(x)), BF16."""

    def __init__(self, hidden: int, ffn: int, device=None):
        super().__init__()
        self.norm = RMSNorm(hidden, device=device)
        self.up = torch.nn.Linear(hidden, ffn, bias=False, device=device, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(ffn, hidden, bias=False, device=device, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(torch.nn.Sequential):
    """``layers`` Blocks and a final RMSNorm: a small transformer-like stack without attention."""

    def __init__(self, hidden: int = 512, ffn: int = 1024, layers: int = 4, device=None):
        super().__init__(*[Block(hidden, ffn, device) for _ in range(layers)],
                         RMSNorm(hidden, device=device))


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.float(), target.float())


def twin_stacks(tokens: int, hidden: int, ffn: int, layers: int, batches: int, lr: float):
    """Two identical Stacks on the GPU with capturable AdamW each (one to run eagerly, one to
    capture) and ``batches`` random (input, target) pairs."""
    import copy

    torch.manual_seed(0)
    eager_model = Stack(hidden, ffn, layers, device="cuda")
    graph_model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=lr, capturable=True)
    graph_opt = torch.optim.AdamW(graph_model.parameters(), lr=lr, capturable=True)
    data = [(torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"),
             torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"))
            for _ in range(batches)]
    return eager_model, graph_model, eager_opt, graph_opt, data


def eager_step_fn(model: torch.nn.Module, optimizer):
    """One eager training step (zero grads, MSE loss, backward, optimizer step) -> loss."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = mse(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


class MhcBlock(torch.nn.Module):
    """A DeepSeek-V4-like hyper-connection block: x holds ``streams`` residual streams side by
    side ([T, streams * hidden]); the mHC projection/RMS stage gates them, then a pre-norm MLP
    updates them. Its backward runs graphrt's mHC and RMSNorm kernels."""

    def __init__(self, hidden: int = 512, streams: int = 4, ffn: int = 1024, device=None):
        super().__init__()
        from ..nn import MhcProjection

        self.hidden, self.streams = hidden, streams
        n = (2 + streams) * streams
        self.mhc = MhcProjection(streams * hidden, n, n_pad=n, device=device)
        self.mlp = Block(hidden, ffn, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0]
        proj, r = self.mhc(x)
        gate = (torch.sigmoid(proj[:, :self.streams]) / r).to(x.dtype)
        h = x.view(tokens, self.streams, self.hidden) * gate.unsqueeze(-1)
        return self.mlp(h.reshape(tokens * self.streams, self.hidden)).view(tokens, -1)


def loss_and_grads(model: torch.nn.Module):
    """A function (x, target) -> (loss, *parameter gradients): a whole backward as one fragment."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step(x, target):
        loss = mse(model(x), target)
        return (loss.detach(), *torch.autograd.grad(loss, params))
    return step
