"""Why a capture failed, said in terms of the user's code: which line, which call."""
from __future__ import annotations

import os
import sysconfig
import traceback

import torch

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the graphrt package
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"])
_LIBRARIES = tuple(p + os.sep for p in (_HERE, _TORCH, _STDLIB))

HINT = (
    "A CUDA graph cannot hold a host synchronization (.item(), .cpu(), .tolist(), printing a CUDA "
    "tensor, torch.nonzero or another data-dependent shape, a non-capturable optimizer step) or "
    "memory taken outside the graph's pool (pinned host memory, another device, a library's own "
    "cudaMalloc, torch.cuda.empty_cache()). Move that work out of the captured function, make it "
    "device-side (optimizers: capturable=True), or skip it while "
    "torch.cuda.is_current_stream_capturing() is True; graphrt.capture.graph_modules captures a "
    "model layer by layer when the code between layers must stay eager.")

# torch >= 2.9 runs a parameter's gradient accumulation on the stream its AccumulateGrad node was
# made on; a node kept alive from an eager backward (by a live loss tensor, say) sits on the
# default stream, which a capture cannot make wait
STALE_GRAPH_MARKER = "legacy stream depend on a capturing"
STALE_GRAPH_HINT = (
    "An autograd graph from an earlier eager step is still alive (often through the loss tensor "
    "or an output kept for logging), and its gradient accumulators run on the default stream. "
    "Drop it first (del loss, or keep loss.detach()) and capture again.")
SYNC_MARKERS = ("synchronizing cuda operation", "synchronizing operation")
CAPTURE_MARKERS = ("captur",)


def _is_site_package(filename: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in filename or f"{os.sep}dist-packages{os.sep}" in filename


def user_frames(err: BaseException) -> tuple[traceback.FrameSummary | None,
                                              traceback.FrameSummary | None]:
    """(the innermost frame outside torch, graphrt and the standard library: the line that made
    the failing call; the innermost frame outside any installed package, when that differs: the
    user's own line that led there). Either may be None."""
    frames = traceback.extract_tb(err.__traceback__)
    caller = own = None
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(_LIBRARIES) or frame.filename.startswith("<"):
            continue
        if caller is None:
            caller = frame
        if not _is_site_package(path):
            own = frame
            break
    return caller, (own if own is not caller else None)


def _describe(frame: traceback.FrameSummary) -> str:
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"


def where(err: BaseException) -> str:
    """' at FILE:LINE in FUNC: CODE (reached from FILE:LINE ...)', or '' when no frame is found
    (an error raised on another thread, or at the end of the capture)."""
    caller, own = user_frames(err)
    if caller is None:
        return ""
    text = f" at {_describe(caller)}"
    if own is not None:
        text += f" (reached from {_describe(own)})"
    return text


def advice(err: BaseException) -> str:
    """What to do about ``err``: the specific fix where the error says which, else the hint."""
    if STALE_GRAPH_MARKER in str(err).lower():
        return STALE_GRAPH_HINT
    return HINT


def classify(err: BaseException) -> str | None:
    """'sync' for a host synchronization, 'capture' for another operation a graph cannot hold,
    None for an ordinary error of the user's code (re-raised as it is)."""
    if not isinstance(err, RuntimeError):
        return None
    text = str(err).lower()
    if any(m in text for m in SYNC_MARKERS):
        return "sync"
    if any(m in text for m in CAPTURE_MARKERS):
        return "capture"
    return None
