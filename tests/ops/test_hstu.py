"""HSTU LayerNorm-Multiply-SiLU-Dropout: reference, Philox mask, contract errors, kernels."""
import itertools
import math

import pytest
import torch

import graphrt
from graphrt import ContractError
from graphrt.ops import HstuLmsdForward, hstu_lmsd_backward, hstu_lmsd_forward
from graphrt.ops.hstu import hstu_lmsd_backward_reference, hstu_lmsd_forward_reference
from graphrt.ops.hstu.philox import dropout_mask, keep_threshold, philox4x32

from ..helpers import (INTERPRETER, assert_rejected, assert_unchanged, env, needs_interpreter,
                       poison, rel_l2, snapshot)

BF16 = torch.bfloat16
FLAGS = [dict(apply_u_silu=s, concat_u=cu, concat_x=cx)
         for s, cu, cx in itertools.product((True, False), repeat=3)]


def _inputs(n, d, device="cpu", pad=0):
    def rows():
        base = torch.randn(n, d + pad, dtype=BF16, device=device)
        return base[:, :d] if pad else base
    w = (1 + 0.2 * torch.randn(d, device=device)).to(BF16)
    b = (0.1 * torch.randn(d, device=device)).to(BF16)
    return rows(), rows(), w, b


def _check_against_reference(x, u, w, b, p, flags, seed=3, offset=7, runtime=None, pad=0):
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=p, seed=seed,
                                            offset=offset, runtime=runtime, **flags)
    ref_y, ref_mean, ref_rstd, _ = hstu_lmsd_forward_reference(
        x, u, w, b, eps=1e-6, dropout_ratio=p, seed=seed, offset=offset, mask=mask, **flags)
    assert rel_l2(y, ref_y) < 1.5e-2
    assert torch.allclose(mean, ref_mean, rtol=1e-4, atol=1e-5)
    assert torch.allclose(rstd, ref_rstd, rtol=1e-4, atol=1e-5)
    segments = 1 + flags["concat_u"] + flags["concat_x"]
    dy_base = torch.randn(x.shape[0], segments * x.shape[1] + pad, dtype=BF16, device=x.device)
    dy = dy_base[:, :segments * x.shape[1]] if pad else dy_base
    dx, du, dw, db = hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, dropout_ratio=p,
                                        runtime=runtime, **flags)
    rdx, rdu, rdw, rdb = hstu_lmsd_backward_reference(dy, x, u, w, b, mean, rstd, mask,
                                                      dropout_ratio=p, **flags)
    assert rel_l2(dx, rdx) < 2.5e-2 and rel_l2(du, rdu) < 2.5e-2
    for out, ref in ((dw, rdw), (db, rdb)):   # BF16 sums over the rows: each term checked
        assert rel_l2(out, ref) < 1e-2
    return y, mask


# -- reference and Philox -------------------------------------------------------------------------
@pytest.mark.parametrize("flags", FLAGS)
def test_reference_matches_fp64_autograd(seed, flags):
    x, u, w, b = _inputs(9, 16)
    p = 0.3
    y, mean, rstd, mask = hstu_lmsd_forward_reference(x, u, w, b, eps=1e-6, dropout_ratio=p,
                                                      seed=5, offset=9, **flags)
    xd, ud, wd, bd = (t.double().requires_grad_() for t in (x, u, w, b))
    m = xd.mean(1, keepdim=True)
    xh = (xd - m) * torch.rsqrt((xd.pow(2).mean(1, keepdim=True) - m.pow(2)).clamp_min(0) + 1e-6)
    a = ud * torch.sigmoid(ud) if flags["apply_u_silu"] else ud
    scale = 1 / (1 - float(torch.tensor(p, dtype=torch.float32)))
    keep = lambda bit: ((mask.long() >> bit) & 1).double() * scale
    parts = ([a * keep(2)] if flags["concat_u"] else []) + ([xd * keep(1)] if flags["concat_x"] else [])
    full = torch.cat(parts + [(xh * wd + bd) * a * keep(0)], 1)
    dy = torch.randn_like(full)
    full.backward(dy)
    assert rel_l2(y, full.detach()) < 5e-3
    dx, du, dw, db = hstu_lmsd_backward_reference(dy.to(BF16), x, u, w, b, mean, rstd, mask,
                                                  dropout_ratio=p, **flags)
    assert rel_l2(dx, xd.grad) < 1e-2 and rel_l2(du, ud.grad) < 1e-2
    assert rel_l2(dw, wd.grad) < 1e-2 and rel_l2(db, bd.grad) < 1e-2


def test_mask_bits_rates_independence_and_reproducibility():
    n, d = 1000, 1000          # a million elements per segment
    p = 0.1
    mask = dropout_mask(n, d, p, 1234, 0, (True, True, True)).long()
    assert int(mask.max()) <= 7 and int(mask.min()) >= 0
    sigma = math.sqrt(p * (1 - p) / (n * d))
    bits = [((mask >> i) & 1).double() for i in range(3)]
    for kept in bits:
        assert abs(kept.mean().item() - (1 - p)) < 4 * sigma
    for i, j in ((0, 1), (0, 2), (1, 2)):   # independent: P(both) = P(a) P(b)
        both = (bits[i] * bits[j]).mean().item()
        assert abs(both - (1 - p) ** 2) < 6 * sigma
    assert torch.equal(dropout_mask(n, d, p, 1234, 0, (True, True, True)).long(), mask)
    assert not torch.equal(dropout_mask(n, d, p, 1234, 1, (True, True, True)).long(), mask)
    only_l = dropout_mask(50, 40, p, 1, 2, (True, False, False)).long()
    assert int((only_l & 0b110).max()) == 0           # bits of disabled segments are clear


def test_mask_layout_follows_the_documented_draws():
    """Element (row, col, segment) of the mask, recomputed one Philox call at a time from the
    layout that dropout_mask documents."""
    rows, cols, p, seed, offset = 3, 24, 0.3, -77, (1 << 33) + 5
    mask = dropout_mask(rows, cols, p, seed, offset, (True, True, True)).long()
    threshold = keep_threshold(p)
    for row, col in ((0, 0), (0, 7), (1, 9), (2, 16), (2, 23)):
        octet, j = divmod(row * cols + col, 8)
        for segment in range(3):
            draw_index = 3 * j + segment
            call, word = divmod(draw_index // 2, 4)
            counter = torch.tensor([3 * octet + call])
            words = philox4x32(seed, counter & 0xFFFFFFFF, counter >> 32,
                               torch.tensor([offset & 0xFFFFFFFF]), torch.tensor([offset >> 32]))
            value = int(words[word])
            draw = value >> 16 if draw_index % 2 else value & 0xFFFF
            assert ((int(mask[row, col]) >> segment) & 1) == int(draw >= threshold)


def test_mask_is_independent_of_the_launch_shape():
    whole = dropout_mask(64, 32, 0.5, 9, 4, (True, True, True))
    # element (row, col) depends on row * D + col only: the first 10 rows of a taller tensor agree
    assert torch.equal(dropout_mask(10, 32, 0.5, 9, 4, (True, True, True)), whole[:10])


def test_p_zero_draws_nothing_and_returns_no_mask(seed):
    x, u, w, b = _inputs(4, 16)
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b)
    assert mask is None and y.shape == (4, 48)


# -- contract errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [-0.1, 1, float("inf"), float("nan"), 0.99999999])
def test_bad_dropout_ratio_rejected(p):
    x, u, w, b = _inputs(4, 16)
    with pytest.raises(ContractError, match="dropout_ratio"):
        hstu_lmsd_forward(x, u, w, b, dropout_ratio=p)


def _forward_errors(device):
    x, u, w, b = _inputs(6, 16, device)
    y = torch.full((6, 48), float("nan"), dtype=BF16, device=device)
    mean, rstd = torch.full((6,), float("nan"), device=device), torch.full((6,), float("nan"), device=device)
    mask = torch.full((6, 16), -1, dtype=torch.int8, device=device)
    cases = [
        (dict(x=x.float()), "x: expected dtype bfloat16"),
        (dict(u=torch.randn(6, 24, dtype=BF16, device=device)), "u: expected last dim 16"),
        (dict(x=torch.randn(6, 12, dtype=BF16, device=device)), "D must be a multiple of 8"),
        (dict(x=torch.randn(16, 6, dtype=BF16, device=device).t()), "x: layout not supported"),
        (dict(weight=w.float()), "weight: expected a contiguous bfloat16"),
        (dict(eps=0.0), "eps: expected a positive finite"),
        (dict(eps=float("inf")), "eps: expected a positive finite"),
        (dict(seed=1 << 63), "seed: expected a signed 64-bit int"),
        (dict(seed=torch.zeros(2, dtype=torch.int64, device=device)), "seed: expected a one-element"),
        (dict(offset="7"), "offset: expected an int"),
        (dict(y=x), "y: expected shape|y: expected last dim"),
        (dict(mask=torch.zeros(6, 16, dtype=torch.uint8, device=device)), "mask: expected dtype int8, got uint8"),
    ]
    assert_rejected(hstu_lmsd_forward, ("x", "u", "weight", "bias"),
                    dict(x=x, u=u, weight=w, bias=b, dropout_ratio=0.2, y=y, mean=mean, rstd=rstd,
                         mask=mask), cases, (y, mean, rstd, mask))


def test_forward_errors_write_nothing_cpu():
    _forward_errors("cpu")


def test_backward_errors_write_nothing_cpu():
    x, u, w, b = _inputs(6, 16)
    _, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.2)
    flags = dict(apply_u_silu=True, concat_u=True, concat_x=True, dropout_ratio=0.2)
    dx = torch.full((6, 16), float("nan"), dtype=BF16)
    before = snapshot(dx)
    for dy, m, pattern in [(torch.randn(6, 32, dtype=BF16), mask, "dy: expected 3 segments"),
                           (torch.randn(6, 48, dtype=BF16), None, "mask: expected"),
                           (torch.randn(6, 48, dtype=BF16), mask.to("meta"), "mask: expected device"),
                           (torch.randn(6, 48), mask, "dy: expected dtype bfloat16")]:
        with pytest.raises(ContractError, match=pattern):
            hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, m, dx=dx, **flags)
        assert_unchanged(before, (dx,))


def test_plan_keys_exclude_rows_and_strides():
    x, u, w, b = _inputs(4, 16)
    k = HstuLmsdForward.contract_for(x, u, w, b, dropout_ratio=0.1)
    x2, u2, _, _ = _inputs(100, 16, pad=8)
    assert HstuLmsdForward.contract_for(x2, u2, w, b, dropout_ratio=0.1) == k
    assert HstuLmsdForward.contract_for(x, u, w, b, dropout_ratio=0.2) != k
    assert HstuLmsdForward.contract_for(x, u, w, b, dropout_ratio=0.1, concat_x=False) != k


# -- kernels under the interpreter ----------------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("n,d,pad", [(1, 8, 0), (37, 24, 8), (70, 136, 0)])
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_triton_kernels_interpreted(seed, n, d, pad, flags, p):
    x, u, w, b = _inputs(n, d, pad=pad)
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        y, mask = _check_against_reference(x, u, w, b, p, flags, runtime=rt, pad=pad)
    if p > 0:  # the kernel's Philox equals the PyTorch one bit for bit
        assert torch.equal(mask, dropout_mask(n, d, p, 3, 7, (True, flags["concat_x"], flags["concat_u"])))


@needs_interpreter
def test_triton_compute_dweight_false_and_tensor_seeds(seed):
    x, u, w, b = _inputs(20, 32)
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        seed_t, off_t = torch.tensor([3]), torch.tensor([7])
        y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.25, seed=seed_t,
                                                offset=off_t, runtime=rt)
        y2, _, _, mask2 = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.25, seed=3, offset=7,
                                            runtime=rt)
        assert torch.equal(mask, mask2) and torch.equal(y, y2)
        dx, du, dw, db = hstu_lmsd_backward(torch.randn_like(y), x, u, w, b, mean, rstd, mask,
                                            dropout_ratio=0.25, apply_u_silu=True, concat_u=True,
                                            concat_x=True, compute_dweight=False, runtime=rt)
        assert dw is None and db.shape == (32,)


def test_module_autograd_cpu(seed):
    lmsd = graphrt.nn.HstuLmsd(16, dropout_ratio=0.2)
    x = torch.randn(5, 16, dtype=BF16, requires_grad=True)
    u = torch.randn(5, 16, dtype=BF16, requires_grad=True)
    before = graphrt.runtime("cpu").rng.get()
    y = lmsd(x, u)
    assert graphrt.runtime("cpu").rng.get()[1] == before[1] + 80
    y.float().sum().backward()
    assert x.grad is not None and u.grad is not None and lmsd.weight.grad.dtype == BF16


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("d", [8, 24, 128, 264, 512, 1016, 4096])
@pytest.mark.parametrize("n", [1, 513, 65536])
def test_gpu_matches_reference(seed, n, d):
    for i, flags in enumerate(FLAGS):
        if n == 65536 and d == 4096 and i > 1:
            break  # the largest shape: two flag sets keep the run short
        x, u, w, b = _inputs(n, d, "cuda", pad=8 if i % 2 else 0)
        _check_against_reference(x, u, w, b, 0.1 if i % 3 else 0.0, flags, pad=8 if i % 2 else 0)


@pytest.mark.gpu
def test_gpu_mask_matches_pytorch_philox_and_dweight_reproducible(seed):
    x, u, w, b = _inputs(4097, 512, "cuda")
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.1, seed=-5, offset=1 << 40)
    assert torch.equal(mask.cpu(), dropout_mask(4097, 512, 0.1, -5, 1 << 40, (True, True, True)))
    dy = torch.randn_like(y)
    flags = dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)
    first = hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, **flags)
    again = hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, **flags)
    assert all(torch.equal(a, b2) for a, b2 in zip(first, again))


@pytest.mark.gpu
def test_gpu_one_compile_across_rows_and_strides(seed):
    from graphrt.ops.hstu import kernels
    rt = graphrt.Runtime("cuda")
    hstu_lmsd_forward(*_inputs(8, 256, "cuda"), dropout_ratio=0.1, runtime=rt)
    count = lambda k: sum(len(c[0]) for c in k.device_caches.values())
    before = count(kernels._hstu_fwd_kernel)
    for n, pad in ((1, 0), (513, 8), (65536, 16)):
        hstu_lmsd_forward(*_inputs(n, 256, "cuda", pad=pad), dropout_ratio=0.1, seed=n, runtime=rt)
    assert rt.plans.stats()["compiles"] == 1 and count(kernels._hstu_fwd_kernel) == before


@pytest.mark.gpu
def test_gpu_capture_fresh_masks_per_replay(seed):
    from graphrt.capture import capture
    rt = graphrt.runtime("cuda")
    x, u, w, b = _inputs(256, 128, "cuda")
    rng = rt.rng
    rng.set(77, 0)

    def fwd(x, u):
        out = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.3, seed=rng.state[0:1],
                                offset=rng.state[1:2])
        rng.advance(x.numel())
        return out

    frag = capture(fwd, x, u)
    start = rng.snapshot()
    m1 = frag(x, u, clone=True)[3]
    m2 = frag(x, u, clone=True)[3]
    assert not torch.equal(m1, m2)
    rng.restore(start)
    assert torch.equal(fwd(x, u)[3], m1) and torch.equal(fwd(x, u)[3], m2)


@pytest.mark.gpu
def test_gpu_forward_errors_write_nothing():
    _forward_errors("cuda")


@needs_interpreter
@pytest.mark.parametrize("kind", ["tiny", "large", "constant"])
def test_interpreted_kernels_where_eps_and_rstd_matter(seed, kind):
    """N(0,1) rows hide eps and rstd (both about 1); these rows do not: the kernels against
    the reference and, for the statistics, against FP64."""
    x, u, w, b = _inputs(24, 64)
    x = {"tiny": x.float() * 1e-3, "large": x.float() * 30,
         "constant": 0.5 + 1e-3 * x.float()}[kind].to(BF16)
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        _, mean, rstd, _ = hstu_lmsd_forward(x, u, w, b, runtime=rt)
        _check_against_reference(x, u, w, b, 0.0, FLAGS[0], runtime=rt)
    xd = x.double()
    ref_rstd = torch.rsqrt(xd.var(-1, unbiased=False) + 1e-6)
    assert rel_l2(rstd, ref_rstd) < 1e-4 and rel_l2(mean, xd.mean(-1)) < 1e-4


@pytest.mark.parametrize("counter,key,expected", [
    # Random123's known-answer vectors for philox4x32-10 (tests/kat_vectors)
    ("00000000 00000000 00000000 00000000", "00000000 00000000", "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ("ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff", "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ("243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0", "d16cfe09 94fdcceb 5001e420 24126ea1"),
])
def test_philox_known_answers(counter, key, expected):
    from graphrt.ops.hstu.philox import philox4x32
    c = [torch.tensor([int(w, 16)], dtype=torch.int64) for w in counter.split()]
    k0, k1 = (int(w, 16) for w in key.split())
    out = philox4x32(k0 | (k1 << 32), *c)
    assert [f"{int(v):08x}" for v in out] == expected.split()


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_module_values_and_gradients_match_fp64_autograd(seed, p):
    """nn.HstuLmsd's output and every gradient against FP64 autograd through the reference
    formula, on the module's own dropout mask (catches swapped dx/du, a backward run with
    another dropout ratio, a wrong segment order)."""
    from graphrt.ops.hstu import hstu_lmsd_forward_reference
    lmsd = graphrt.nn.HstuLmsd(16, dropout_ratio=p)
    with torch.no_grad():
        lmsd.weight.copy_(1 + 0.3 * torch.randn(16))
        lmsd.bias.copy_(0.2 * torch.randn(16))
    x = torch.randn(24, 16, dtype=BF16, requires_grad=True)
    u = torch.randn(24, 16, dtype=BF16, requires_grad=True)
    state = graphrt.runtime("cpu").rng.state.clone()
    y = lmsd(x, u)
    dy = torch.randn_like(y)
    y.backward(dy)
    mask = None
    if p > 0:   # the mask the module drew, from the same (seed, offset)
        *_, mask = hstu_lmsd_forward(x.detach(), u.detach(), lmsd.weight.detach(),
                                     lmsd.bias.detach(), dropout_ratio=p, seed=state[0:1],
                                     offset=state[1:2])
    leaves = [t.detach().double().requires_grad_() for t in (x, u, lmsd.weight, lmsd.bias)]
    ref_y, *_ = hstu_lmsd_forward_reference(*leaves, eps=1e-6, dropout_ratio=p, seed=0, offset=0,
                                           apply_u_silu=True, concat_u=True, concat_x=True,
                                           mask=mask)
    ref_y.backward(dy.double())
    assert rel_l2(y, ref_y) < 1e-2
    for name, got, ref in zip(("dx", "du", "dweight", "dbias"),
                              (x.grad, u.grad, lmsd.weight.grad, lmsd.bias.grad), leaves):
        assert rel_l2(got, ref.grad) < 2e-2, name


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_compute_dweight_false_values_match_the_full_backward(seed, backend):
    if backend == "triton" and not INTERPRETER:
        pytest.skip("the interpreted kernel runs on the CPU only with TRITON_INTERPRET=1")
    x, u, w, b = _inputs(70, 32)
    kw = dict(dropout_ratio=0.25, apply_u_silu=True, concat_u=True, concat_x=True)
    with env(GRAPHRT_BACKEND=backend):
        rt = graphrt.Runtime("cpu")
        y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.25, seed=3, offset=7,
                                                runtime=rt)
        dy = torch.randn_like(y)
        full = hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, runtime=rt, **kw)
        part = hstu_lmsd_backward(dy, x, u, w, b, mean, rstd, mask, compute_dweight=False,
                                  runtime=rt, **kw)
    assert part[2] is None
    for name, a, b_ in (("dx", part[0], full[0]), ("du", part[1], full[1]), ("dbias", part[3], full[3])):
        assert torch.equal(a, b_), name


# -- dweight and dbias summed in the backward's own launch ----------------------------------------
def _one_launch_against_two(n, d, device, runtime, compute_dweight=True, p=0.2):
    """The functional backward (its partials summed by the kernel's last programs, with the
    arena's counters) against ``plan.execute`` with a workspace of the caller's (a second
    launch sums them), poisoned outputs: bitwise equal, the FP32 sums of the partials close to
    an FP64 sum of them, and the arena's counter map zero again. Returns the functional
    call's outputs."""
    from graphrt.ops import HstuLmsdBackward
    x, u, w, b = _inputs(n, d, device)
    flags = dict(dropout_ratio=p, apply_u_silu=True, concat_u=True, concat_x=False)
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, seed=5, offset=0, runtime=runtime,
                                            **flags)
    dy = torch.randn_like(y)
    args = (dy, x, u, w, b, mean, rstd, mask)
    one = hstu_lmsd_backward(*args, compute_dweight=compute_dweight, runtime=runtime, **flags)
    plan = runtime.plan(HstuLmsdBackward, *args, compute_dweight=compute_dweight, **flags)
    outs = dict(dx=torch.empty_like(x), du=torch.empty_like(u), dbias=torch.empty_like(b),
                dweight=torch.empty_like(w) if compute_dweight else None)
    poison(*outs.values())
    workspace = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device=device)
    plan.execute(*args, **outs, workspace=workspace)
    for name, got in zip(("dx", "du", "dweight", "dbias"), one):
        if got is None:
            assert name == "dweight" and not compute_dweight
            continue
        assert torch.equal(got, outs[name]), name
    programs = plan.programs
    parts = workspace[:8 * programs * d].view(torch.float32).view(2, programs, d).double()
    sums, size = parts.sum(1), parts.abs().sum(1)
    for row, got in ((0, one[2]), (1, one[3])):
        if got is not None:   # a BF16 ulp (the interpreter truncates), FP32's error
            error = (got.double() - sums[row]).abs()
            bound = 2 ** -7 * sums[row].abs() + 1e-5 * size[row] + 1e-30
            assert (error <= bound).all(), (error - bound).max()
    table = runtime.arena.counter_map()
    assert table is not None and not table.any(), "a counter was left nonzero"
    return one


@needs_interpreter
@pytest.mark.parametrize("sms,n", [(1, 7), (20, 700), (20, 5)])
@pytest.mark.parametrize("compute_dweight", [True, False])
def test_interpreted_one_launch_sums_like_the_second_launch(seed, monkeypatch, sms, n,
                                                            compute_dweight):
    """Several groups of partials (programs = SMs x programs per SM, 16 to a group), programs
    with no rows among them (n=5), one group of fewer than 16 (sms=1)."""
    import graphrt.ops.hstu.kernels as hstu_kernels
    from graphrt.ops.hstu import spec as hstu_spec
    monkeypatch.setattr(hstu_spec, "sm_count", lambda device: sms)
    second = []
    monkeypatch.setattr(hstu_kernels, "sum_partials_in_groups",
                        lambda *a, f=hstu_kernels.sum_partials_in_groups: (second.append(1),
                                                                           f(*a))[1])
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        _one_launch_against_two(n, 24, "cpu", rt, compute_dweight)
    assert second == [1], "the functional call launched the second kernel, or execute did not"


@needs_interpreter
def test_rejected_counters_write_nothing_cpu():
    from graphrt.ops import HstuLmsdBackward
    x, u, w, b = _inputs(6, 16)
    flags = dict(apply_u_silu=True, concat_u=True, concat_x=True, dropout_ratio=0.0)
    y, mean, rstd, _ = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.0)
    dy = torch.randn_like(y)
    with env(GRAPHRT_BACKEND="triton"):
        plan = graphrt.runtime("cpu").plan(HstuLmsdBackward, dy, x, u, w, b, mean, rstd, None,
                                           **flags)
        outs = dict(dx=torch.empty_like(x), du=torch.empty_like(u), dweight=torch.empty_like(w),
                    dbias=torch.empty_like(b))
        poison(*outs.values())
        workspace = torch.empty(plan.workspace_bytes(), dtype=torch.uint8)
        words = plan.counter_words()
        assert_rejected(plan.execute, ("dy", "x", "u", "weight", "bias", "mean", "rstd", "mask"),
                        dict(dy=dy, x=x, u=u, weight=w, bias=b, mean=mean, rstd=rstd, mask=None,
                             workspace=workspace, **outs),
                        [(dict(counters=torch.zeros(words, dtype=torch.int64)), "counters: expected"),
                         (dict(counters=torch.zeros(words - 1, dtype=torch.int32)),
                          "counters: expected"),
                         (dict(counters=torch.zeros(words, 2, dtype=torch.int32)), "counters: expected"),
                         (dict(counters=outs["dx"]), "counters: expected")],
                        list(outs.values()))


@pytest.mark.gpu
@pytest.mark.parametrize("n,d", [(1, 8), (513, 264), (65536, 512), (4097, 4096)])
def test_gpu_one_launch_sums_like_the_second_launch(seed, n, d):
    """On the GPU's grid (several groups of partials), both dweight settings; then the same
    call served bound (the counters' address made from the lent region's; rows wider than
    ONE_LAUNCH_MAX_D take the second launch) and captured: its replays equal the eager call,
    and every counter is zero again."""
    from graphrt.capture import capture
    rt = graphrt.Runtime("cuda")
    for compute_dweight in (False, True):
        first = _one_launch_against_two(n, d, "cuda", rt, compute_dweight)
    x, u, w, b = _inputs(n, d, "cuda")
    flags = dict(dropout_ratio=0.2, apply_u_silu=True, concat_u=True, concat_x=False)
    y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, seed=9, offset=0, runtime=rt, **flags)
    dy = torch.randn_like(y)
    args = (dy, x, u, w, b, mean, rstd, mask)
    first = hstu_lmsd_backward(*args, runtime=rt, **flags)
    for _ in range(3):   # the second call binds, the next ones replay
        again = hstu_lmsd_backward(*args, runtime=rt, **flags)
        assert all(torch.equal(a, b_) for a, b_ in zip(first, again))
    bound = [c for c in rt._bound_calls.values() if c.plan.op == "hstu_lmsd_backward"]
    one_launch = bound[0].plan.counter_words() > 0   # rows up to ONE_LAUNCH_MAX_D
    assert one_launch == (d <= 512)
    assert all((c.n_inputs + len(c.allocations) + 1 in c.slots) == one_launch for c in bound), \
        "the bound call does not take the region's counters"
    assert len(bound[0].binding.launches) == (1 if one_launch else 2)
    fragment = capture(lambda *a: hstu_lmsd_backward(*a, runtime=rt, **flags), *args,
                       runtime=rt)
    for _ in range(3):
        replayed = fragment(*args, clone=True)
        assert all(torch.equal(a, b_) for a, b_ in zip(first, replayed))
    torch.cuda.synchronize()
    assert not rt.arena.counter_map().any(), "a counter was left nonzero"


@needs_interpreter
def test_rows_past_the_one_launch_limit_ignore_counters(monkeypatch):
    """Past ONE_LAUNCH_MAX_D the plan takes no counters: a caller that passes the arena's
    anyway (as the docstring's example does) gets the second launch, not a kernel counting in
    words it was never given."""
    from graphrt.ops import HstuLmsdBackward
    from graphrt.ops.hstu import kernels as hstu_kernels
    from graphrt.ops.hstu import plan as hstu_plan
    monkeypatch.setattr(hstu_plan, "ONE_LAUNCH_MAX_D", 8)
    finishes = []
    real = hstu_kernels.launch

    def spy(kernel, grid, *args, **kwargs):
        finishes.append(kwargs.get("FINISH"))
        return real(kernel, grid, *args, **kwargs)
    monkeypatch.setattr(hstu_kernels, "launch", spy)
    x, u, w, b = _inputs(6, 16)
    flags = dict(dropout_ratio=0.0, apply_u_silu=True, concat_u=True, concat_x=True)
    y, mean, rstd, _ = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.0)
    dy = torch.randn_like(y)
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        plan = rt.plan(HstuLmsdBackward, dy, x, u, w, b, mean, rstd, None, **flags)
        assert plan.counter_words() == 0
        with rt.arena.scope():
            ws = rt.arena.take(plan.workspace_bytes())
            assert rt.arena.counters(ws, plan.counter_words()) is None
            plan.execute(dy, x, u, w, b, mean, rstd, None, dx=torch.empty_like(x),
                         du=torch.empty_like(u), dweight=torch.empty_like(w),
                         dbias=torch.empty_like(b), counters=torch.zeros(64, dtype=torch.int32),
                         workspace=ws)
    assert finishes[0] is False, finishes
