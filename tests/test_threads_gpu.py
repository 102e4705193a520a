"""Many threads, each on its own stream, sharing the default runtime: every result bitwise equal
to the same call made alone (GPU)."""
import threading

import pytest
import torch

import graphrt

pytestmark = pytest.mark.gpu

THREADS, ROUNDS = 8, 30


def _case(seed: int, rows: int, hidden: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = 1 + 0.5 * torch.randn(hidden, device="cuda", generator=gen)
    g = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    _, rstd = graphrt.ops.rmsnorm_forward(x, w)
    return g, x, w, rstd


def test_threads_on_their_own_streams_share_one_runtime_bitwise():
    # different row counts make the workspaces differ in size, so regions interleave
    cases = [_case(100 + i, 512 * (1 + i % 4) + 17 * i, 4096) for i in range(THREADS)]
    expected = [graphrt.ops.rmsnorm_backward(*c) for c in cases]
    torch.cuda.synchronize()
    live_before = graphrt.runtime().arena.stats()["live_regions"]   # fragments of other tests
    results = [[] for _ in range(THREADS)]
    errors = []
    start = threading.Barrier(THREADS)

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            start.wait(30)
            with torch.cuda.stream(stream):
                for _ in range(ROUNDS):
                    results[i].append(graphrt.ops.rmsnorm_backward(*cases[i]))
            stream.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    torch.cuda.synchronize()
    wrong = [(i, r) for i in range(THREADS) for r, out in enumerate(results[i])
             if not (torch.equal(out.dx, expected[i].dx) and torch.equal(out.dw, expected[i].dw))]
    assert len(results[0]) == ROUNDS and not wrong, f"{len(wrong)} of {THREADS * ROUNDS} wrong"
    assert graphrt.runtime().arena.stats()["live_regions"] == live_before
