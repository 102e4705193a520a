"""The public names of the graphrt package, imported with torch (graphrt/__init__.py re-exports
them; the command line defers that until a command needs them)."""
from .contract import Contract, TensorSpec
from .errors import ArenaExhausted, CaptureError, ContractError, DeviceCheckError, UnsupportedError
from .device_checks import check_errors
from .plan import Plan, PlanStore
from .result import Result
from .runtime import Runtime, runtime
from .arena import WorkspaceArena
from . import capture, nn, ops, optim

