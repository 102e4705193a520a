"""Token-count buckets: one captured fragment per padded token count, so variable token counts
replay graphs instead of running eagerly."""
from __future__ import annotations

import bisect
from typing import Callable, Sequence

import torch

from ..errors import ContractError
from ..runtime import Runtime
from .fragment import Fragment, capture
from .tree import flatten, unflatten

DEFAULT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def bucket_for(tokens: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``tokens``."""
    if tokens < 1:
        raise ContractError(f"tokens: expected at least 1, got {tokens}")
    i = bisect.bisect_left(buckets, tokens)
    if i == len(buckets):
        raise ContractError(f"tokens: {tokens} exceeds the largest bucket {buckets[-1]}; "
                            f"add a larger bucket or split the batch")
    return buckets[i]


def bucket_key(args: tuple, tokens: int, bucket: int, token_dim: int) -> tuple:
    """Cache key: every tensor's shape with the token dim padded to the bucket, dtype, device."""
    key = [bucket]
    for a in flatten(args)[0]:
        if isinstance(a, torch.Tensor):
            shape = list(a.shape)
            if a.dim() > token_dim and shape[token_dim] == tokens:
                shape[token_dim] = bucket
            key.append((tuple(shape), a.dtype, a.device))
        else:
            key.append(a)
    return tuple(key)


class TokenBuckets:
    """Replays ``fn`` through a graph per bucket of token counts.

    Tensor arguments whose ``token_dim`` equals the call's token count (read from the first tensor)
    are copied into zero-padded static inputs of the bucket's size; outputs whose ``token_dim`` is
    the bucket size come back sliced to the token count. ``fn`` must treat tokens independently
    (padding rows must not change real rows), as per-token layers do.

    >>> layer = TokenBuckets(block_forward, buckets=(256, 1024, 8192))   # doctest: +SKIP
    >>> y = layer(x)          # x: [tokens, hidden], any tokens <= 8192
    >>> layer.memory_report()                                            # doctest: +SKIP
    """

    def __init__(self, fn: Callable, buckets: Sequence[int] = DEFAULT_BUCKETS, token_dim: int = 0,
                 warmup: int = 2, runtime: Runtime | None = None):
        buckets = tuple(sorted(set(int(b) for b in buckets)))
        if not buckets or buckets[0] < 1:
            raise ContractError(f"buckets: expected positive token counts, got {buckets}")
        self.fn, self.buckets, self.token_dim = fn, buckets, token_dim
        self.warmup, self.runtime = warmup, runtime
        self.fragments: dict[tuple, Fragment] = {}
        self.replays = 0

    def _tokens(self, args) -> int:
        for a in flatten(args)[0]:
            if isinstance(a, torch.Tensor) and a.dim() > self.token_dim:
                return a.shape[self.token_dim]
        raise ContractError("args: expected a tensor with a token dim")

    def _padded(self, a, tokens: int, bucket: int):
        if not isinstance(a, torch.Tensor) or a.dim() <= self.token_dim or \
                a.shape[self.token_dim] != tokens:
            return a
        shape = list(a.shape)
        shape[self.token_dim] = bucket
        static = torch.zeros(shape, dtype=a.dtype, device=a.device)
        static.narrow(self.token_dim, 0, tokens).copy_(a)
        return static

    def __call__(self, *args):
        tokens = self._tokens(args)
        bucket = bucket_for(tokens, self.buckets)
        key = bucket_key(args, tokens, bucket, self.token_dim)
        frag = self.fragments.get(key)
        leaves, spec = flatten(args)
        if frag is None:
            static = unflatten([self._padded(a, tokens, bucket) for a in leaves], spec)
            frag = self.fragments[key] = capture(self.fn, *static, warmup=self.warmup,
                                                 runtime=self.runtime)
        else:
            for a, s in zip(leaves, flatten(frag.inputs)[0]):
                if isinstance(s, torch.Tensor) and s is not a:
                    if s.shape == a.shape:
                        s.copy_(a)
                    else:
                        s.narrow(self.token_dim, 0, tokens).copy_(a)
                        s.narrow(self.token_dim, tokens, bucket - tokens).zero_()
        frag.replay()
        self.replays += 1
        out_leaves, out_spec = flatten(frag.outputs)
        return unflatten([o.narrow(self.token_dim, 0, tokens)
                          if isinstance(o, torch.Tensor) and o.dim() > self.token_dim
                          and o.shape[self.token_dim] == bucket else o
                          for o in out_leaves], out_spec)

    def memory_report(self) -> list[dict]:
        """Per captured graph: its bucket, pool memory it added and arena workspace it holds."""
        return [{"bucket": key[0], "memory_bytes": f.memory_bytes,
                 "workspace_bytes": f.workspace_bytes, "replays": f.replays}
                for key, f in sorted(self.fragments.items(), key=lambda kv: kv[0][0])]

    def release(self) -> None:
        for f in self.fragments.values():
            f.release()
        self.fragments.clear()
