"""graphrt bench --plot: a PNG per table, drawn from the rows the benchmark saves."""
import pytest

from graphrt.bench import report

pytest.importorskip("matplotlib")


def test_publish_draws_a_png_beside_the_json(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHRT_BENCH_DIR", str(tmp_path))
    monkeypatch.setenv("GRAPHRT_BENCH_PLOT", "1")
    rows = [{"direction": d, "N": n, "D": 256, "impl": impl, "us": us, "TB/s": tbs}
            for d in ("forward", "backward") for n, us, tbs in ((1024, 10.0, 3.0), (4096, 35.0, 3.4))
            for impl in ("graphrt", "torch.compile")]
    said = []
    report.publish("lmsd", rows, said.append)
    pngs = list(tmp_path.glob("lmsd-*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(line.startswith("drew ") for line in said)


def test_rows_without_timings_draw_nothing(tmp_path):
    from graphrt.bench.plot import plot
    assert plot("plan_store", [{"case": "hit", "host_us": 1.0}], tmp_path / "x.png") is None
