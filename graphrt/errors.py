"""Exceptions raised by graphrt."""


class ContractError(ValueError):
    """A tensor or argument does not meet the op's contract (dtype, shape, layout, device, overlap)."""


class UnsupportedError(NotImplementedError):
    """The request is valid in general but not supported by this backend, device or configuration."""


class ArenaExhausted(RuntimeError):
    """The workspace arena cannot satisfy a request; it never falls back to a silent allocation."""
