"""Benchmark harness: one module per op, shared timing (timing.py) and reporting (report.py)."""
