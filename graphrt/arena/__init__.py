"""WorkspaceArena: one preallocated device buffer, handed out in aligned, scoped regions."""
from .workspace import ALIGNMENT, ArenaHold, WorkspaceArena, align_up

__all__ = ["ALIGNMENT", "ArenaHold", "WorkspaceArena", "align_up"]
