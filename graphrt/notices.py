"""One-time warnings for slower paths that a version or a missing extra forces on a user."""
from __future__ import annotations

import threading
import warnings

_said: set[str] = set()
_lock = threading.Lock()


class SlowerPathWarning(UserWarning):
    """graphrt takes a slower path than it could (an untested Triton, a missing extra)."""


def warn_once(key: str, message: str) -> None:
    """Warn ``message`` the first time ``key`` is seen in this process."""
    with _lock:
        if key in _said:
            return
        _said.add(key)
    warnings.warn(message, SlowerPathWarning, stacklevel=3)
