"""Small models for examples, tests and benchmarks: a pre-norm MLP stack, an MoE and mHC block, and
the eager training step they are compared against."""
from __future__ import annotations

import torch

from .nn import RMSNorm


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


def eager_step_fn(model, optimizer, loss_fn=mse):
    """One eager training step (zero grads, ``loss_fn(model(x), y)``, backward, optimizer step)
    -> the loss, detached. ``model`` may be any callable (a compiled model, say)."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
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
        from .nn import MhcProjection

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


def loss_and_grads(model: torch.nn.Module, forward=None):
    """A function (x, target) -> (loss, *parameter gradients): a whole backward as one fragment.
    ``forward`` (default: the model itself) maps x to the model's output."""
    params = [p for p in model.parameters() if p.requires_grad]
    forward = forward or model

    def step(x, target):
        loss = mse(forward(x), target)
        return (loss.detach(), *torch.autograd.grad(loss, params))
    return step


class DeepSeekBlock(torch.nn.Module):
    """A DeepSeek-V4-like block: the mHC stage gates ``streams`` residual streams; each stream's
    tokens (routed to experts, sorted by expert) go through RMSNorm and an MoE MLP of grouped
    expert weights, whose weight gradients run on a side stream; the forward also produces the
    MLA Q projection fused with RoPE and MXFP8 quantization (no gradient)."""

    def __init__(self, hidden: int = 256, streams: int = 4, experts: int = 4, ffn: int = 512,
                 heads: int = 2, device=None):
        super().__init__()
        from .nn import GroupedLinear, MhcProjection, RMSNorm

        self.hidden, self.streams = hidden, streams
        n = (2 + streams) * streams
        self.mhc = MhcProjection(streams * hidden, n, n_pad=n, device=device)
        self.norm = RMSNorm(hidden, device=device)
        self.up = GroupedLinear(experts, hidden, ffn, device=device, wgrad_on_side_stream=True)
        self.down = GroupedLinear(experts, ffn, hidden, device=device, wgrad_on_side_stream=True)
        self.register_buffer("wq", (torch.randn(heads * 192, hidden, device=device)
                                    / hidden ** 0.5).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor):
        from .ops import gemm_proj_rope_mxfp8

        tokens = x.shape[0]
        proj, r = self.mhc(x)
        gate = (torch.sigmoid(proj[:, :self.streams]) / r).to(x.dtype)
        h = (x.view(tokens, self.streams, self.hidden) * gate.unsqueeze(-1)).reshape(-1, self.hidden)
        normed = self.norm(h)
        q = gemm_proj_rope_mxfp8(normed.detach(), self.wq, cos, sin)
        mlp = self.down(torch.nn.functional.gelu(self.up(normed, offsets)), offsets)
        return (h + mlp).view(tokens, -1), q


class HstuBlock(torch.nn.Module):
    """An HSTU-style block: the fused LayerNorm-Multiply-SiLU-Dropout stage over (x, u) and an
    output projection of its three concatenated segments."""

    def __init__(self, d: int = 256, dropout_ratio: float = 0.1, device=None):
        super().__init__()
        from .nn import HstuLmsd

        self.lmsd = HstuLmsd(d, dropout_ratio=dropout_ratio, device=device)
        self.out = torch.nn.Linear(3 * d, d, bias=False, device=device, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return x + self.out(self.lmsd(x, u))


def lm_loss(out, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a causal LM's logits (``out.logits``, as Hugging Face models return
    them) against ``labels``, in FP32: the loss of the HF examples, tests and benchmark."""
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten())
