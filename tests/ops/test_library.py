"""Every functional op is torch.ops.graphrt.<name>: the same answer as the functional call, a
fake implementation that agrees with the real one, and torch.library.opcheck's checks."""
import itertools

import pytest
import torch

import graphrt
from graphrt.ops.library import SPECS

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def _cases():
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)          # noqa: E731
    x, g = r(6, 64).to(BF16), r(6, 64).to(BF16)
    w = 1 + 0.1 * r(64)
    _, rstd = graphrt.ops.rmsnorm_forward(x, w)
    u, wb, bb = r(6, 64).to(BF16), (1 + 0.1 * r(64)).to(BF16), (0.1 * r(64)).to(BF16)
    seed, offset = torch.tensor([3]), torch.tensor([7])
    y, mean, hrstd, mask = graphrt.ops.hstu_lmsd_forward(x, u, wb, bb, dropout_ratio=0.2,
                                                         seed=seed, offset=offset)
    counts = [3, 0, 5]
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)
    cos = r(32, 64).to(BF16)
    adam = ([[r(6, 8).to(BF16), r(5)] for _ in range(3)] + [[r(6, 8).abs().to(BF16), r(5).abs()]]
            + [[torch.full((), 3.0), torch.full((), 3.0)]])   # params, grads, m, v, steps
    return {
        "adamw_step": [(*adam, 1e-2, [0.9, 0.999], 1e-8, 0.1, False)],
        "rmsnorm_forward": [(x, w, 1e-6, None), (x, w, 1e-5, g)],
        "rmsnorm_backward": [(g, x, w, rstd, None), (g, x, w, rstd, g)],
        "mhc_projection_backward": [(x, r(24, 64) / 8, r(6, 32), r(6, 1), r(6, 1).abs() + 0.5,
                                     True)],
        "hstu_lmsd_forward": [(x, u, wb, bb, 1e-6, 0.2, seed, offset, True, True, True),
                              (x, u, wb, bb, 1e-6, 0.0, None, None, False, True, False)],
        "hstu_lmsd_backward": [(torch.randn_like(y), x, u, wb, bb, mean, hrstd, mask, 0.2, True,
                                True, True, True),
                               (torch.randn_like(y), x, u, wb, bb, mean, hrstd, mask, 0.2, True,
                                True, True, False)],
        "grouped_gemm_wgrad": [(r(16, 8).to(BF16), r(8, 24).to(BF16), offsets, BF16, "tensor2d"),
                               (r(16, 8).to(BF16), r(8, 24).to(BF16), offsets, torch.float32,
                                "tensor2d"),
                               # FP8 codes with FP32 scales per 128 tokens, both K-major
                               (r(16, 8).to(FP8), r(24, 8).to(FP8).t(), offsets, torch.float32,
                                "tensor2d", r(16, 1).abs(), r(24, 1).abs().t())],
        "gemm_proj_rope_mxfp8": [(r(32, 64).to(BF16), (r(2 * 192, 64) / 8).to(BF16), cos, cos,
                                  None, None, True, 128, 64)],
    }


CASES = _cases()


def test_every_functional_op_is_registered():
    assert {spec.name for spec in SPECS} == set(CASES)
    for spec in SPECS:
        assert getattr(graphrt.ops, spec.name) is spec.functional
        assert hasattr(torch.ops.graphrt, spec.name)


@pytest.mark.parametrize("name,case", [(n, i) for n in CASES for i in range(len(CASES[n]))])
def test_operator_matches_functional_and_passes_opcheck(name, case):
    args = CASES[name][case]
    op = getattr(torch.ops.graphrt, name)
    got = op(*args)
    got = [] if got is None else got if isinstance(got, list) else [got]
    # the fake implementation agrees with the real outputs' shapes and dtypes
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    fake = [] if fake is None else fake if isinstance(fake, list) else [fake]
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in got]
    # torch's schema check compares inputs with arithmetic that FP8 tensors lack on the CPU
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == FP8 for a in args)
    torch.library.opcheck(op, args, test_utils=(() if fp8 else ("test_schema",)) +
                          ("test_faketensor", "test_autograd_registration"))
