"""graphrt bench hf's row handling (no GPU: each variant's process is stubbed)."""
import json
import types

from graphrt.bench import hf

from .helpers import env


def test_paired_rows_join_the_table_without_peak_memory(monkeypatch):
    """eager_paired prints a row per model and no peak memory (both share a process): run()
    keeps both rows and compares memory only for rows that have it."""
    printed = {
        "eager": [{"variant": "eager", "tokens": "1x512", "ms_per_step": 20.0,
                   "peak_reserved_MiB": 3000.0}],
        "eager_paired": [{"variant": "eager (paired)", "tokens": "1x512", "ms_per_step": 21.0},
                         {"variant": "eager_graphrt_norms (paired)", "tokens": "1x512",
                          "ms_per_step": 20.5}]}

    def one_variant(cmd, **_):
        lines = "\n".join(json.dumps(r) for r in printed[cmd[3]])
        return types.SimpleNamespace(returncode=0, stdout="noise\n" + lines, stderr="")
    monkeypatch.setattr(hf.subprocess, "run", one_variant)
    with env(GRAPHRT_BENCH_HF_VARIANTS="eager,eager_paired", GRAPHRT_BENCH_HF_SIZES="1x512"):
        rows = hf.run(progress=lambda *_: None)
    assert [r["variant"] for r in rows] == ["eager", "eager (paired)",
                                            "eager_graphrt_norms (paired)"]
    assert rows[0]["memory_vs_eager"] == 1.0
    assert all("memory_vs_eager" not in r for r in rows[1:])
