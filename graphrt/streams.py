"""Stream resolution and cross-stream dependency tracking."""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Iterator

import torch

from .errors import ContractError, UnsupportedError


_stream_objects: dict = {}


def current_stream(device: torch.device):
    """``torch.cuda.current_stream(device)`` for a device with an index, without its argument
    handling (3 us a call on the H200 host, against 0.1 us for the raw lookup): one Stream
    object is kept per (stream id, device index, device type) triple."""
    key = torch._C._cuda_getCurrentStream(device.index)
    stream = _stream_objects.get(key)
    if stream is None:
        if len(_stream_objects) >= 256:  # streams made and dropped: forget the old wrappers
            _stream_objects.clear()
        stream = _stream_objects[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                          device_type=key[2])
    return stream


def resolve_stream(stream, device: torch.device):
    """The stream to launch on: None means the current stream of ``device``.

    Accepts None, a ``torch.cuda.Stream`` or a raw CUDA stream handle (int). CPU devices have no
    streams and resolve to None.
    """
    if device.type != "cuda":
        if stream is not None:
            raise ContractError(f"stream: {device} tensors take no stream, got {stream!r}")
        return None
    if stream is None:
        return current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        if stream.device != device:
            raise ContractError(f"stream: expected a stream of {device}, got one of {stream.device}")
        return stream
    if isinstance(stream, int):
        return torch.cuda.ExternalStream(stream, device=device)
    raise ContractError(f"stream: expected None, a torch.cuda.Stream or a raw handle (int), "
                        f"got {type(stream).__name__}")


@contextlib.contextmanager
def on_stream(stream) -> Iterator[None]:
    """Make ``stream`` current for the enclosed launches (no-op for None or the current stream)."""
    if stream is None or stream == current_stream(stream.device):
        yield
        return
    with torch.cuda.stream(stream):
        yield


def is_capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class StreamTracker:
    """Remembers which stream last produced a tensor and makes consumers on other streams wait.

    >>> tracker = StreamTracker()                       # doctest: +SKIP
    >>> tracker.produced(grad, side_stream)             # doctest: +SKIP
    >>> tracker.consume(grad, torch.cuda.current_stream())  # waits on side_stream's event
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._producers: dict[int, tuple[weakref.ref, object, torch.cuda.Event]] = {}

    def produced(self, tensor: torch.Tensor, stream) -> None:
        """Record that ``stream`` wrote ``tensor`` (an event is recorded on the stream)."""
        if stream is None:
            return
        event = torch.cuda.Event()
        event.record(stream)
        with self._lock:
            self._producers[tensor.data_ptr()] = (weakref.ref(tensor), stream, event)

    def consume(self, tensor: torch.Tensor, stream) -> None:
        """Make ``stream`` wait for the last producer of ``tensor`` if that was another stream."""
        if stream is None:
            return
        with self._lock:
            entry = self._producers.get(tensor.data_ptr())
        if entry is None:
            return
        ref, producer, event = entry
        if ref() is None:
            with self._lock:
                self._producers.pop(tensor.data_ptr(), None)
            return
        if producer != stream:
            stream.wait_event(event)

    @staticmethod
    def keep_alive(tensor: torch.Tensor, stream) -> None:
        """Tell the caching allocator that ``tensor`` is in use on ``stream`` too."""
        if stream is not None and tensor.is_cuda and stream != current_stream(tensor.device):
            tensor.record_stream(stream)

    def __len__(self) -> int:
        return len(self._producers)


_side_streams: dict = {}
_open_branches = threading.local()


class Branch:
    """Work forked onto a side stream; ``join()`` makes the main stream wait for it."""

    def __init__(self, main, side):
        self.main, self.side, self.joined = main, side, False

    def join(self) -> None:
        if not self.joined:
            self.main.wait_stream(self.side)
            self.joined = True
            pending = getattr(_open_branches, "items", [])
            if self in pending:
                pending.remove(self)


@contextlib.contextmanager
def fork(side=None) -> Iterator[Branch]:
    """Enqueue the enclosed work on a side stream forked from the current stream; the caller
    goes on enqueueing main-stream work after the block and calls ``branch.join()`` where the
    side results are needed. Eagerly the streams overlap; inside a CUDA-graph capture the side
    work is a parallel branch of the graph (graphrt's capture joins branches left open).

    >>> with fork() as branch:                        # doctest: +SKIP
    ...     dw = grad_out.t() @ x                     # weight gradient on the side stream
    >>> dx = grad_out @ w                             # input gradient on the main stream
    >>> branch.join()

    Tensors made on the side stream and used on the main one are safe after the join; keep them
    alive past it with ``StreamTracker.keep_alive`` if the side stream is reused eagerly.
    """
    if not torch.cuda.is_available():
        raise UnsupportedError("fork: side streams need a CUDA device; this machine has none "
                               "(run the work inline)")
    main = torch.cuda.current_stream()
    if side is None:
        side = _side_streams.get(main.device)
        if side is None:
            side = _side_streams[main.device] = torch.cuda.Stream(device=main.device)
    side.wait_stream(main)
    branch = Branch(main, side)
    if not hasattr(_open_branches, "items"):
        _open_branches.items = []
    _open_branches.items.append(branch)
    with torch.cuda.stream(side):
        yield branch


def join_open_branches() -> None:
    """Join every branch this thread forked and has not joined yet."""
    for branch in list(getattr(_open_branches, "items", [])):
        branch.join()
