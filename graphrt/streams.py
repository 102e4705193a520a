"""Stream resolution and cross-stream dependency tracking."""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Iterator

import torch

from .errors import ContractError


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
        return torch.cuda.current_stream(device)
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
    if stream is None or stream == torch.cuda.current_stream(stream.device):
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
        if stream is not None and tensor.is_cuda and stream != torch.cuda.current_stream(tensor.device):
            tensor.record_stream(stream)

    def __len__(self) -> int:
        return len(self._producers)


_side_streams: dict = {}


@contextlib.contextmanager
def fork(side=None) -> Iterator:
    """Run the enclosed work on a side stream that forks from the current stream and joins it
    again at the end. Eagerly the two streams overlap; inside a CUDA-graph capture the work
    becomes a parallel branch of the graph.

    >>> with fork() as side:                          # doctest: +SKIP
    ...     dw = weight_grad(...)                     # overlaps what the main stream does next

    Tensors made on the side stream and used on the main one are safe until the join; keep them
    alive past it with ``StreamTracker.keep_alive`` if the side stream is reused eagerly.
    """
    main = torch.cuda.current_stream()
    if side is None:
        side = _side_streams.get(main.device)
        if side is None:
            side = _side_streams[main.device] = torch.cuda.Stream(device=main.device)
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            yield side
    finally:
        main.wait_stream(side)
