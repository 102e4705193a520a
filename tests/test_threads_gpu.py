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


def _run_threads(worker, n: int, errors: list) -> None:
    """worker(0) .. worker(n - 1) on threads of their own, joined; no error may escape."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def _live_not_kept() -> int:
    """Live regions of the default runtime's arena but those bound calls keep (one per kind
    of call and stream, for as long as the runtime keeps the call)."""
    stats = graphrt.runtime().arena.stats()
    return stats["live_regions"] - stats["kept_regions"]


def test_threads_on_their_own_streams_share_one_runtime_bitwise():
    # different row counts make the workspaces differ in size, so regions interleave
    cases = [_case(100 + i, 512 * (1 + i % 4) + 17 * i, 4096) for i in range(THREADS)]
    expected = [graphrt.ops.rmsnorm_backward(*c) for c in cases]
    torch.cuda.synchronize()
    live_before = _live_not_kept()   # fragments of other tests
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

    _run_threads(worker, THREADS, errors)
    torch.cuda.synchronize()
    wrong = [(i, r) for i in range(THREADS) for r, out in enumerate(results[i])
             if not (torch.equal(out.dx, expected[i].dx) and torch.equal(out.dw, expected[i].dw))]
    assert len(results[0]) == ROUNDS and not wrong, f"{len(wrong)} of {THREADS * ROUNDS} wrong"
    assert _live_not_kept() == live_before


def _descriptor_and_flag_cases(seed: int):
    """Calls whose bound launches rebuild TMA descriptors (mHC, the projection) or pass the
    device's error flags (wgrad), as (function, args, kwargs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)
    t = 256 + 32 * (seed % 3)
    mhc = (graphrt.ops.mhc_projection_backward,
           (randn(t, 2048).bfloat16(), randn(24, 2048) / 45, randn(t, 32), randn(t, 1),
            randn(t, 1).abs() + 0.5), dict(allow_tf32=True))
    proj = (graphrt.ops.gemm_proj_rope_mxfp8,
            (randn(t, 1024).bfloat16(), (randn(4 * 192, 1024) / 32).bfloat16(),
             randn(t, 64).bfloat16(), randn(t, 64).bfloat16()),
            dict(qk_nope_dim=128, qk_rope_dim=64))
    counts = torch.randint(0, 2 * t // 4, (4,), generator=torch.Generator().manual_seed(seed))
    offsets = torch.cumsum(counts, 0).to(torch.int32).cuda()
    tokens = int(offsets[-1])
    wgrad = (graphrt.ops.grouped_gemm_wgrad,
             (randn(256, tokens).bfloat16(), randn(tokens, 128).bfloat16(), offsets),
             dict(check_offsets=False))
    return [mhc, proj, wgrad]


def _calls_on_own_streams_match_alone(cases, rounds: int = 10) -> None:
    """Each list of calls in ``cases`` (function, args, kwargs) made ``rounds`` times on a
    thread and stream of its own, all threads at once: every output bitwise equal to the same
    call made alone first."""
    expected = [[fn(*args, **kw) for fn, args, kw in c] for c in cases]
    torch.cuda.synchronize()
    results = [[] for _ in cases]
    errors = []
    start = threading.Barrier(len(cases))

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            start.wait(30)
            with torch.cuda.stream(stream):
                for _ in range(rounds):
                    results[i].append([fn(*args, **kw) for fn, args, kw in cases[i]])
            stream.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    _run_threads(worker, len(cases), errors)
    torch.cuda.synchronize()
    for i, made in enumerate(results):
        assert len(made) == rounds
        for outs in made:
            for call, (got, want) in enumerate(zip(outs, expected[i])):
                assert all(torch.equal(g.view(torch.uint8), e.view(torch.uint8))
                           for g, e in zip(got, want) if e is not None), (i, call)


def test_threads_share_bound_descriptor_and_flag_launches_bitwise():
    _calls_on_own_streams_match_alone([_descriptor_and_flag_cases(200 + i) for i in range(4)])


def _workspace_and_seeded_cases(seed: int):
    """Calls with scratch made per call on Hopper (ragged wgrad at odd counts: the padded
    copy; MXFP8: the codes' BF16 values), the 1x128 FP8 wgrad, HSTU's seeded dropout forward
    and its backward, as (function, args, kwargs); sizes differ per seed."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def fp8_scales(rows, blocks, e8m0: bool):
        if e8m0:
            return torch.randint(120, 134, (rows, blocks), dtype=torch.uint8, device="cuda",
                                 generator=gen)
        return torch.rand(rows, blocks, device="cuda", generator=gen) + 0.5

    hidden, inter = 256, 128
    counts = [37 + 16 * seed, 0, 91, 250 - 8 * seed]   # off multiples of 8, an empty expert
    tokens = sum(counts)
    offsets = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    ragged = (graphrt.ops.grouped_gemm_wgrad,
              (randn(hidden, tokens).bfloat16(), randn(tokens, inter).bfloat16(), offsets),
              dict(input_order="tensor_ragged", check_offsets=False))
    fp8_tokens = 512 + 128 * seed   # a multiple of 16: the Gluon 1x128 kernel on Hopper
    fp8_offsets = torch.tensor([fp8_tokens // 4, fp8_tokens // 4, fp8_tokens], device="cuda",
                               dtype=torch.int32)
    a = (randn(hidden, fp8_tokens) * 4).to(torch.float8_e4m3fn)
    b = (randn(inter, fp8_tokens) * 4).to(torch.float8_e4m3fn).t()
    fp8 = [(graphrt.ops.grouped_gemm_wgrad, (a, b, fp8_offsets),
            dict(a_scale=fp8_scales(hidden, fp8_tokens // block, block == 32),
                 b_scale=fp8_scales(inter, fp8_tokens // block, block == 32).t(),
                 check_offsets=False))
           for block in (32, 128)]
    n, d = 300 + 40 * seed, 256
    x, u = randn(n, d).bfloat16(), randn(n, d).bfloat16()
    w, bias = (1 + 0.1 * randn(d)).bfloat16(), (0.1 * randn(d)).bfloat16()
    forward = (graphrt.ops.hstu_lmsd_forward, (x, u, w, bias),
               dict(dropout_ratio=0.1, seed=1000 + seed, offset=0))
    mean, rstd = randn(n), torch.rand(n, device="cuda", generator=gen) + 0.5
    mask = (torch.rand(n, d, device="cuda", generator=gen) > 0.1).to(torch.int8)
    backward = (graphrt.ops.hstu_lmsd_backward,
                (randn(n, 3 * d).bfloat16(), x, u, w, bias, mean, rstd, mask),
                dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True))
    return [ragged, *fp8, forward, backward]


def test_threads_share_workspace_and_seeded_calls_bitwise():
    cases = [_workspace_and_seeded_cases(i) for i in range(4)]
    torch.cuda.synchronize()
    live_before = _live_not_kept()
    _calls_on_own_streams_match_alone(cases)
    assert _live_not_kept() == live_before
    torch.cuda.synchronize()   # HSTU backward counted in the regions' words: all zero again
    assert not graphrt.runtime().arena.counter_map().any()
