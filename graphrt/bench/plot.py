"""Pictures of benchmark rows: time or throughput against shape, one line per implementation,
the measured ceiling drawn. Needs matplotlib (the [bench] extra)."""
from __future__ import annotations

from pathlib import Path

METRICS = (("TB/s", 4.25, "copy ceiling 4.25 TB/s"), ("TFLOP/s", 679.0, "bf16 GEMM ceiling 679 TFLOP/s"))
NOT_SHAPE = {"impl", "us", "TB/s", "TFLOP/s", "of_ceiling", "of_floor", "floor_us", "speedup_vs",
             "do_bench_us", "do_bench_speedup_vs", "error"}


def _shape_keys(rows: list[dict]) -> list[str]:
    keys = []
    for r in rows:
        for k, v in r.items():
            if k not in NOT_SHAPE and k not in keys and not isinstance(v, (dict, list)):
                keys.append(k)
    return keys


def plot(name: str, rows: list[dict], path: str | Path) -> Path | None:
    """Write ``rows`` (a benchmark's JSON rows, each with ``impl`` and ``us``) as a PNG at
    ``path``: one panel per value of a ``direction`` column, shapes along x. None when the rows
    have no ``impl`` / ``us`` columns to draw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "impl" in r and "us" in r]
    if not rows:
        return None
    metric = next(((m, c, label) for m, c, label in METRICS if any(m in r for r in rows)), None)
    ykey = metric[0] if metric else "us"
    panels = sorted({str(r.get("direction", "")) for r in rows})
    shape_keys = [k for k in _shape_keys(rows) if k != "direction"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        sub = [r for r in rows if str(r.get("direction", "")) == panel]
        shapes = list(dict.fromkeys(" x ".join(str(r[k]) for k in shape_keys if k in r) for r in sub))
        for impl in dict.fromkeys(r["impl"] for r in sub):
            points = {" x ".join(str(r[k]) for k in shape_keys if k in r): r.get(ykey)
                      for r in sub if r["impl"] == impl}
            ax.plot(range(len(shapes)), [points.get(s) for s in shapes], marker="o", label=impl)
        if metric:
            ax.axhline(metric[1], color="gray", linestyle="--", label=metric[2])
        ax.set_xticks(range(len(shapes)), shapes, rotation=20)
        ax.set_ylabel(ykey if metric else "us (lower is better)")
        ax.set_title(f"{name} {panel}".strip())
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
