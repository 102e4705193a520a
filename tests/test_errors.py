"""Bad configuration gets a ContractError (or UnsupportedError) naming the argument, before
anything runs: scalars, lifecycle misuse, nn constructors and inputs, devices."""
import pytest
import torch

import graphrt
from graphrt import ContractError, UnsupportedError
from graphrt.ops import RmsNormBackward

BF16 = torch.bfloat16


def _norm_args(rows=4, hidden=64):
    x = torch.randn(rows, hidden, dtype=BF16)
    return x, torch.ones(hidden)


@pytest.mark.parametrize("eps", ["1e-6", None, True, float("nan"), -1.0, 0.0, 1e-50, [1e-6]])
def test_bad_eps_is_named(eps):
    x, w = _norm_args()
    with pytest.raises(ContractError, match="eps: expected a positive finite float"):
        graphrt.ops.rmsnorm_forward(x, w, eps=eps)
    u, b = torch.randn_like(x), torch.zeros(64, dtype=BF16)
    with pytest.raises(ContractError, match="eps"):
        graphrt.ops.hstu_lmsd_forward(x, u, w.to(BF16), b, eps=eps)


def test_smallest_normal_eps_gives_zero_rows_on_every_backend():
    x = torch.zeros(3, 64, dtype=BF16)
    y, rstd = graphrt.ops.rmsnorm_forward(x, torch.ones(64), eps=1.1754943508222875e-38)
    assert torch.equal(y, torch.zeros_like(y)) and torch.isfinite(rstd).all()


def test_flags_and_ints_are_not_coerced():
    x = torch.randn(8, 64, dtype=BF16)
    with pytest.raises(ContractError, match="allow_tf32: expected True or False"):
        graphrt.ops.mhc_projection_backward(x, torch.randn(24, 64), torch.randn(8, 24),
                                            torch.randn(8, 1), torch.rand(8, 1) + 0.5,
                                            allow_tf32="no")
    cos = torch.randn(8, 64).to(BF16)
    with pytest.raises(ContractError, match="qk_nope_dim: expected an int"):
        graphrt.ops.gemm_proj_rope_mxfp8(x, torch.randn(2 * 192, 64, dtype=BF16), cos, cos,
                                         qk_nope_dim=32.9)
    with pytest.raises(ContractError, match="w_out_in: expected True or False"):
        graphrt.ops.gemm_proj_rope_mxfp8(x, torch.randn(2 * 192, 64, dtype=BF16), cos, cos,
                                         w_out_in=1)
    u, b = torch.randn_like(x), torch.zeros(64, dtype=BF16)
    with pytest.raises(ContractError, match="concat_u: expected True or False"):
        graphrt.ops.hstu_lmsd_forward(x, u, b + 1, b, concat_u="yes")


def test_runtime_arguments_are_named():
    with pytest.raises(ContractError, match="plan_cache_size"):
        graphrt.Runtime("cpu", plan_cache_size=0)
    with pytest.raises(ContractError, match="arena_bytes"):
        graphrt.Runtime("cpu", arena_bytes=-1)
    with pytest.raises(ContractError, match="arena_bytes"):
        graphrt.Runtime("cpu", arena_bytes=1.5)
    with pytest.raises(ContractError, match="device"):
        graphrt.Runtime("gpu0")


def test_plan_used_before_compile_says_so():
    x, w = _norm_args()
    plan = RmsNormBackward(x, x, w, torch.ones(4))
    with pytest.raises(RuntimeError, match="call compile\\(\\)"):
        plan.workspace_bytes()
    with pytest.raises(RuntimeError, match="call compile\\(\\) first"):
        plan.execute(x, x, w, torch.ones(4))
    assert plan.describe()["compiled"] is False
    plan.compile()
    assert plan.workspace_bytes() >= 0


def test_nn_constructors_check_their_arguments():
    cases = [(lambda: graphrt.nn.RMSNorm(12), "hidden_size: expected a multiple of 8"),
             (lambda: graphrt.nn.RMSNorm(64, eps="small"), "eps"),
             (lambda: graphrt.nn.RMSNorm(64, dtype=torch.float16), "dtype"),
             (lambda: graphrt.nn.HstuLmsd(64, dropout_ratio=1.5), "dropout_ratio"),
             (lambda: graphrt.nn.HstuLmsd(60), "d: expected a multiple of 8"),
             (lambda: graphrt.nn.HstuLmsd(64, concat_x=None), "concat_x"),
             (lambda: graphrt.nn.MhcProjection(64, 24, n_pad=8), "n_pad"),
             (lambda: graphrt.nn.MhcProjection(64.0, 24), "k: expected an int")]
    for make, pattern in cases:
        with pytest.raises(ContractError, match=pattern):
            make()


def test_nn_inputs_are_checked_in_forward():
    with pytest.raises(ContractError, match="x: expected last dim 64 \\(the module's hidden_size\\)"):
        graphrt.nn.RMSNorm(64)(torch.randn(4, 32, dtype=BF16))
    mhc = graphrt.nn.MhcProjection(64, 24)
    with pytest.raises(ContractError, match="x: expected a bfloat16 \\[T, 64\\]"):
        mhc(torch.randn(8, 64))                     # FP32 x: used to fail only in backward
    with pytest.raises(ContractError, match="x: expected a bfloat16 \\[T, 64\\]"):
        mhc(torch.randn(8, 32, dtype=BF16))
    lmsd = graphrt.nn.HstuLmsd(64)
    with pytest.raises(ContractError, match="x: expected a 2-D \\[N, 64\\]"):
        lmsd(torch.randn(2, 3, 64, dtype=BF16), torch.randn(2, 3, 64, dtype=BF16))
    with pytest.raises(ContractError, match="u: expected a 2-D \\[N, 64\\]"):
        lmsd(torch.randn(6, 64, dtype=BF16), torch.randn(6, 32, dtype=BF16))
    x = torch.randn(2, 3, 64, dtype=BF16)
    with pytest.raises(ContractError, match="x: expected a 2-D"):
        graphrt.ops.hstu_lmsd_forward(x, x, torch.ones(64, dtype=BF16), torch.zeros(64, dtype=BF16))


def test_meta_tensors_are_named():
    x, w = _norm_args()
    with pytest.raises(ContractError, match="x: graphrt runs on cuda and cpu tensors.*meta"):
        graphrt.ops.rmsnorm_forward(x.to("meta"), w)
    a = torch.randn(8, 16, dtype=BF16)
    with pytest.raises(ContractError, match="a: graphrt runs on cuda and cpu tensors"):
        graphrt.ops.grouped_gemm_wgrad(a.to("meta"), a.t(), torch.tensor([16], dtype=torch.int32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_only_features_say_so_without_cuda():
    from graphrt.capture import fork, uniform_
    with pytest.raises(UnsupportedError, match="CUDA"):
        graphrt.runtime("cuda")
    with pytest.raises(UnsupportedError, match="CUDA"):
        graphrt.Runtime("cpu").graph_pool()
    with pytest.raises(UnsupportedError, match="CUDA"):
        with fork():
            pass
    with pytest.raises(UnsupportedError, match="CUDA"):
        uniform_(torch.empty(8), graphrt.runtime("cpu").rng)


def test_verify_replay_checks_its_fragment():
    from graphrt.capture import verify_replay
    with pytest.raises(ContractError, match="fragment: expected a graphrt.capture.Fragment"):
        verify_replay(None, lambda x: x, lambda i: ())


def test_misspelt_execute_keywords_raise_type_error():
    """plan.execute(..., sed=1) used to run with seed 0 (the same dropout mask every step)."""
    from graphrt.ops import HstuLmsdForward, RmsNormForward
    x, w = _norm_args(8, 64)
    u, b = torch.randn_like(x), torch.zeros(64, dtype=BF16)
    fwd = HstuLmsdForward(x, u, w.to(BF16), b, dropout_ratio=0.1).compile()
    with pytest.raises(TypeError, match="sed"):
        fwd.execute(x, u, w.to(BF16), b, sed=1)
    norm = RmsNormForward(x, w).compile()
    with pytest.raises(TypeError, match="eps"):
        norm.execute(x, w, eps=1e-3)      # eps belongs to the plan's contract
    assert "seed" in HstuLmsdForward.execute_keywords and "eps" not in RmsNormForward.execute_keywords


def test_cli_version_and_gpu_bench_without_a_gpu():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "graphrt.cli", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.startswith("graphrt ")
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, "-m", "graphrt.cli", "bench", "mhc"],
                             capture_output=True, text=True)
        assert res.returncode != 0 and "needs a CUDA GPU" in res.stderr


def test_the_command_answers_help_without_importing_torch():
    """As the `graphrt` console script runs it (argv[0] named graphrt): --help parses without
    torch; the public names then load on first use, with the operators registered."""
    import subprocess
    import sys
    script = (
        "import sys, time\n"
        "sys.argv = ['graphrt', '--help']\n"
        "t0 = time.perf_counter()\n"
        "import graphrt.cli\n"
        "try:\n"
        "    graphrt.cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported for --help'\n"
        "print('help_s', time.perf_counter() - t0)\n"
        "import graphrt, torch\n"
        "assert graphrt.runtime().device.type in ('cpu', 'cuda')\n"
        "assert callable(graphrt.ops.rmsnorm_forward) and hasattr(torch.ops.graphrt, 'adamw_step')\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "usage: graphrt" in res.stdout and "help_s" in res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU demo")
def test_demo_on_the_cpu_compares_the_interpreted_kernels_with_the_reference():
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "graphrt.cli", "demo"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Triton kernels under Triton's interpreter" in res.stdout
    assert "zero by construction" not in res.stdout and "GB/s" not in res.stdout


def test_info_reports_the_fast_paths():
    from graphrt.cli import info
    lines = []
    facts = info(out=lines.append)
    assert "direct launch" in facts and "kernels" in facts and "tested Triton" in facts


def test_slower_paths_are_said_once():
    import warnings

    from graphrt.notices import SlowerPathWarning, warn_once
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            warn_once("test-key", "a slower path")
    assert [w.category for w in seen] == [SlowerPathWarning]


def test_a_hopper_module_that_fails_to_import_says_why(tmp_path, monkeypatch):
    """A kernel module whose dependency is installed but does not import (two native libraries
    that clash) warns once with the error and says why for `graphrt info`; one that imports a
    module that is not there stays quiet. Off Hopper nothing is imported."""
    import warnings

    from graphrt.notices import SlowerPathWarning
    from graphrt.plan import hopper_module, import_failure
    package = tmp_path / "fake_kernels_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "clashing.py").write_text("raise ImportError('generic_type: already registered')\n")
    (package / "absent.py").write_text("import graphrt_no_such_dependency\n")
    (package / "broken.py").write_text("import fake_kernels_pkg.no_such_part\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert hopper_module("fake_kernels_pkg", "clashing", (8, 0)) is None
        assert import_failure("fake_kernels_pkg", "clashing") is None   # not tried off Hopper
        for _ in range(2):
            assert hopper_module("fake_kernels_pkg", "clashing", (9, 0)) is None
        assert hopper_module("fake_kernels_pkg", "absent", (9, 0)) is None
    said = [str(w.message) for w in seen if issubclass(w.category, SlowerPathWarning)]
    assert len(said) == 1 and "fake_kernels_pkg.clashing" in said[0] \
        and "already registered" in said[0]
    assert "already registered" in import_failure("fake_kernels_pkg", "clashing")
    assert "graphrt_no_such_dependency" in import_failure("fake_kernels_pkg", "absent")
    # a module that is not there, inside a package that is (a Triton without Gluon): quiet,
    # but told to `graphrt info`
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hopper_module("fake_kernels_pkg", "broken", (9, 0)) is None
    assert "no_such_part" in import_failure("fake_kernels_pkg", "broken")
