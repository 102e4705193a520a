"""Exceptions raised by graphrt."""


class ContractError(ValueError):
    """A tensor or argument does not meet the op's contract (dtype, shape, layout, device, overlap)."""


class UnsupportedError(NotImplementedError):
    """The request is valid in general but not supported by this backend, device or configuration."""


class ArenaExhausted(RuntimeError):
    """The workspace arena cannot satisfy a request; it never falls back to a silent allocation."""


class CaptureError(RuntimeError):
    """The code given to a CUDA-graph capture did something a graph cannot hold (a host sync, an
    allocation outside the graph's pool) or the fragment was misused; the message says what to do."""


class DeviceCheckError(ContractError):
    """A kernel found bad input where the host could not look (inside ``plan.execute`` or a CUDA
    graph) and flagged it on the device; ``graphrt.check_errors()`` raises it."""
