"""graphrt: fused training kernels and CUDA-graph capture of whole backward passes for PyTorch."""
import os as _os
import sys as _sys

__version__ = "0.1.0"

__all__ = ["ArenaExhausted", "CaptureError", "Contract", "ContractError", "DeviceCheckError",
           "Plan", "PlanStore", "Result",
           "Runtime", "TensorSpec", "UnsupportedError", "WorkspaceArena", "capture", "check_errors",
           "nn", "ops", "optim", "runtime"]


def _load() -> None:
    """Bind the public names (importing torch and registering torch.ops.graphrt.<name>)."""
    from . import _public
    globals().update({name: getattr(_public, name) for name in __all__})


# The `graphrt` command imports this package before it parses its arguments, and --help and
# --version need nothing of torch (1.5 s to import): there the names load on first use (the
# commands call _load). Every other import loads them now, which registers the operators.
if _os.path.basename((getattr(_sys, "argv", None) or [""])[0]) == "graphrt":
    def __getattr__(name):
        if name in __all__:
            _load()
            return globals()[name]
        raise AttributeError(f"module 'graphrt' has no attribute {name!r}")
else:
    _load()
