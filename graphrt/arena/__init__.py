"""WorkspaceArena: one preallocated device buffer, handed out in aligned, scoped regions."""
from .workspace import WorkspaceArena, ArenaHold

__all__ = ["WorkspaceArena", "ArenaHold"]
