"""CUDA-graph capture of training-step fragments and whole steps, with replay verification.

- ``capture(fn, *sample_args)`` -> :class:`Fragment`: one graph, static inputs and outputs.
- ``graph_step(model, loss_fn, batch, optimizer)``: forward, loss, backward, optimizer step;
  with ``process_group``, gradients averaged over data-parallel ranks inside the graph
  (``GradientReducer``).
- ``graph_modules(model, modules, sample_args)``: per-module capture (forward and backward
  graphs of each listed submodule) for models that cannot be captured whole.
- ``TokenBuckets``: a fragment per padded token count.
- ``verify_replay``: replay against eager with NaN-poisoned outputs and in-place input mutation.
- ``fork()``: a side-stream branch (e.g. weight gradients), joined with ``branch.join()``.
- ``uniform_``: a graph-safe random kernel on the runtime's device-side (seed, offset).

Fragments captured on one runtime share a memory pool, so a later-captured fragment may place its
outputs in memory that an earlier one uses for temporaries. The rule: replay fragments in the
order they were captured (forward, then backward), and consume a fragment's outputs before
replaying any fragment captured before it.
"""
from ..streams import Branch, fork
from .buckets import TokenBuckets, bucket_for
from .data_parallel import GradientReducer
from .fragment import Fragment, capture
from .modules import GraphedModules, graph_modules
from .step import StepGraph, graph_step
from .verify import ReplayReport, verify_replay

__all__ = ["Branch", "Fragment", "GradientReducer", "GraphedModules", "ReplayReport", "StepGraph",
           "TokenBuckets", "bucket_for", "capture", "fork", "graph_modules", "graph_step",
           "uniform_", "verify_replay"]


def __getattr__(name):
    if name == "uniform_":  # needs Triton; imported on first use
        from .random import uniform_
        return uniform_
    raise AttributeError(name)
