"""Gluon builtins whose names moved between the Triton releases graphrt's Hopper kernels run on.

Triton 3.6 spells the CTA-wide barrier ``gl.thread_barrier`` and the TMA copies into and out of
shared memory ``tma.async_copy_global_to_shared`` and ``tma.async_copy_shared_to_global``;
Triton 3.9 calls them ``gl.barrier``, ``tma.async_load`` and ``tma.async_store`` (the old names
are gone or raise). The kernels call the names below, which are the installed
Triton's own builtins, so each Triton compiles the code it did before.

>>> from graphrt.gluon_api import cta_barrier, tma_load          # doctest: +SKIP
>>> tma_load(desc, [m0, k0], ready_bar, smem)                       # inside a gluon.jit kernel
"""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
