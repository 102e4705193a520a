"""graphrt: fused training kernels and CUDA-graph capture of whole backward passes for PyTorch."""
from .contract import Contract, TensorSpec
from .errors import ArenaExhausted, CaptureError, ContractError, DeviceCheckError, UnsupportedError
from .device_checks import check_errors
from .plan import Plan, PlanStore
from .result import Result
from .runtime import Runtime, runtime
from .arena import WorkspaceArena
from . import capture, nn, ops, optim

__version__ = "0.1.0"

__all__ = ["ArenaExhausted", "CaptureError", "Contract", "ContractError", "DeviceCheckError",
           "Plan", "PlanStore", "Result",
           "Runtime", "TensorSpec", "UnsupportedError", "WorkspaceArena", "capture", "check_errors",
           "nn", "ops", "optim", "runtime"]
