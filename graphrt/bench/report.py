"""Benchmark tables and JSON results."""
from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch


def environment() -> dict:
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "python": platform.python_version()}
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, sms=p.multi_processor_count,
                   capability=f"{p.major}.{p.minor}")
    else:
        env["device"] = "cpu"
    return env


def format_table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)
    body = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(b) for b in body]
    return "\n".join(out)


def save(name: str, rows: list[dict], directory: str | os.PathLike | None = None) -> Path:
    """Write ``rows`` with the environment to bench/results/<name>-<timestamp>.json."""
    directory = Path(directory or os.environ.get("GRAPHRT_BENCH_DIR") or "bench/results")
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = directory / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"env": environment(), "rows": rows}, indent=1, default=str))
    return path


def publish(name: str, rows: list[dict], progress=print, columns: list[str] | None = None,
            legend: str | None = None) -> list[dict]:
    """Print ``rows`` as a table (with a legend line), save them as JSON, return them."""
    progress(format_table(rows, columns or list(rows[0])))
    if legend:
        progress(legend)
    saved = save(name, rows)
    progress(f"saved {saved}")
    if os.environ.get("GRAPHRT_BENCH_PLOT") == "1":
        from .plot import plot
        picture = plot(name, rows, saved.with_suffix(".png"))
        progress(f"drew {picture}" if picture else f"{name}: nothing to draw")
    return rows
