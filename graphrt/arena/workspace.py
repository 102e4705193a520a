"""The workspace arena: scratch memory for plans without allocation on the execute path."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..errors import ArenaExhausted, ContractError
from ..streams import is_capturing

ALIGNMENT = 256
KEPT_SHARE = 8   # regions kept across calls (``keep``) take at most 1/KEPT_SHARE of an arena


def align_up(n: int, a: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``a`` (the arena's 256-byte alignment by default)."""
    return (n + a - 1) // a * a


@dataclass(eq=False, slots=True)   # told apart by identity: list.remove finds the one given
class _Region:
    start: int
    end: int
    stream: object
    hold: "ArenaHold | None"
    released: bool = False
    kept: bool = False   # from ``keep``: counted in the arena's kept bytes until given back
    # a kept region's calls under way (each appends on entry and pops on exit), and whether
    # the arena took it back for a take that did not fit beside it (see ``_reclaim_kept``)
    users: list | None = None
    reclaimed: bool = False


class _Scope:
    """``WorkspaceArena.scope()``: a context manager class (a generator-based one costs twice
    the host time on every call that takes workspace)."""

    __slots__ = ("arena", "scopes", "mine")

    def __init__(self, arena: "WorkspaceArena"):
        self.arena = arena

    def __enter__(self) -> "WorkspaceArena":
        self.scopes = self.arena._scopes()
        self.mine: list[_Region] = []
        self.scopes.append(self.mine)
        return self.arena

    def __exit__(self, *exc) -> None:
        scopes, mine = self.scopes, self.mine
        # by identity: an empty list equals any other empty scope's, an outer one's included
        for i in range(len(scopes) - 1, -1, -1):
            if scopes[i] is mine:
                del scopes[i]
                break
        self.arena._release(mine)


@dataclass(eq=False)   # holds are told apart by identity: two empty ones of a thread are equal
class ArenaHold:
    """Regions taken while a hold is active; they outlive scopes until ``release()``.

    A captured CUDA graph keeps its workspace this way, so replays see stable addresses. On a
    CUDA arena a hold takes the regions taken on a capturing stream, from any thread (autograd
    runs a captured backward on its device thread), never eager work; on a CPU arena, those its
    own thread takes.
    """

    arena: "WorkspaceArena"
    thread: int = field(default_factory=threading.get_ident)
    regions: list = field(default_factory=list)
    released: bool = False

    @property
    def nbytes(self) -> int:
        return sum(r.end - r.start for r in self.regions)

    def release(self, last_stream=None, *, from_finalizer: bool = False) -> None:
        """Give the regions back; ``last_stream`` is where their last user ran (a graph's
        replays), so that a later taker on another stream waits for it. ``from_finalizer``:
        called by the garbage collector, which may run anywhere, inside the arena's lock too,
        so the regions may go back at the arena's next take instead."""
        if not self.released:
            self.released = True
            if last_stream is not None:
                for r in self.regions:
                    r.stream = last_stream
            if from_finalizer:
                self.arena._release_soon(self.regions)
            else:
                self.arena._release(self.regions)
            self.regions = []


class WorkspaceArena:
    """One buffer allocated up front; ``take`` returns aligned uint8 views of it, at the lowest
    free gap that fits.

    Regions are released when the ``scope()`` that took them closes; a scope owns only the
    regions its own thread took inside it, so any number of threads (each on its own stream or
    not) can share one arena. A region reused on a different stream than its last user first
    makes the new stream wait for the old one. Exhaustion raises :class:`ArenaExhausted`; the
    arena never allocates anything else.

    >>> arena = WorkspaceArena(1 << 20, torch.device("cpu"))
    >>> with arena.scope():
    ...     ws = arena.take(1000)
    ...     ws.numel(), ws.data_ptr() % 256
    (1000, 0)
    >>> arena.stats()["in_use"]
    0
    """

    def __init__(self, nbytes: int, device: torch.device | str):
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ContractError(f"arena_bytes: expected a size in bytes >= 0, got {nbytes!r}")
        self.device = torch.device(device)
        self._on_cuda = self.device.type == "cuda"
        self.capacity = int(nbytes)
        # one spare alignment unit lets every region start on a 256-byte boundary
        self._buffer = torch.empty(self.capacity + ALIGNMENT, dtype=torch.uint8, device=self.device)
        self._base = align_up(self._buffer.data_ptr()) - self._buffer.data_ptr()
        self._address = self._buffer.data_ptr() + self._base   # offset 0's address
        self._lock = threading.Lock()   # never taken twice by one thread
        self._regions: list[_Region] = []   # live regions in address order; the last is the top
        self._last_use: list[tuple[int, int, object]] = []
        self._holds: list[ArenaHold] = []
        # regions taken while a stream captures with no hold open (a plain torch.cuda.graph
        # around graphrt calls): the graph may replay any time, so they are never given back
        self._pinned = ArenaHold(self)
        self._deferred: list = []   # region lists given back by finalizers, for the next take
        self._local = threading.local()     # .scopes: this thread's open scopes, innermost last
        self._high_water = 0
        self._takes = 0
        self._kept_bytes = 0   # live regions from ``keep``
        self._counter_map: torch.Tensor | None = None   # see ``counters``

    def _scopes(self) -> list[list[_Region]]:
        scopes = getattr(self._local, "scopes", None)
        if scopes is None:
            scopes = self._local.scopes = []
        return scopes

    def _active_hold(self) -> ArenaHold | None:
        if self._on_cuda:
            if not torch._C._cuda_isCurrentStreamCapturing():   # is_capturing, one call deep
                return None
            return self._holds[-1] if self._holds else self._pinned
        me = threading.get_ident()
        for h in reversed(self._holds):
            if h.thread == me:
                return h
        return None

    # -- taking and releasing ------------------------------------------------------------------
    def take(self, nbytes: int, stream=None) -> torch.Tensor:
        """An aligned (256-byte) uint8 region of ``nbytes`` bytes, valid until its scope closes."""
        region = self._take(int(nbytes), stream)
        return self._buffer[self._base + region.start:self._base + region.end]

    def lend(self, nbytes: int, stream) -> tuple[int, _Region]:
        """(address, region) of a region that the caller gives back itself with ``give_back``
        once its work is enqueued, with no scope: what a bound functional call takes around
        its launches (a scope and a tensor view cost microseconds of host time each call)."""
        region = self._take(int(nbytes), stream, scoped=False)
        return self._address + region.start, region

    def keep(self, nbytes: int, stream) -> tuple[int, _Region] | None:
        """``lend``'s (address, region) for a caller that uses the region again and again on
        ``stream`` (a bound functional call: no lend a call) and gives it back with
        ``give_back`` (or ``give_back_soon`` from a finalizer). None, and nothing taken, while
        a hold takes regions (a capture: its graph must own what it uses, so the caller lends
        instead), when kept regions would pass 1/KEPT_SHARE of the arena, or when it does not
        fit.

        A take that fits only without the kept regions takes them back, so keeping never makes
        a take fail that would fit otherwise. So the caller appends to ``region.users`` before
        it tests ``region.reclaimed``, uses the region only where that is False, and pops after
        its launches: a region in use then is not taken back."""
        region = self._take(int(nbytes), stream, scoped=False, kept=True)
        return None if region is None else (self._address + region.start, region)

    def holding(self) -> bool:
        """Whether a region taken now would go to a hold (on a CUDA arena: the current stream
        captures): a kept region must not be used then."""
        return self._active_hold() is not None

    def give_back(self, region: _Region) -> None:
        """Releases a region from ``lend`` or ``keep``, unless a hold (a capture) keeps it."""
        if region.hold is None:
            with self._lock:
                self._release_locked((region,))

    def give_back_soon(self, region: _Region) -> None:
        """``give_back`` for a finalizer (see ``ArenaHold.release``)."""
        if region.hold is None:
            self._release_soon([region])

    def _take(self, nbytes: int, stream, scoped: bool = True, kept: bool = False
              ) -> _Region | None:
        """A new region (see ``take``), in this thread's innermost scope when ``scoped``; for
        ``kept``, None where ``keep`` gives none."""
        if nbytes < 0:
            raise ContractError(f"nbytes: expected a size >= 0, got {nbytes}")
        scopes = self._scopes() if scoped else None
        with self._lock:
            if self._deferred:
                self._release_deferred()
            if kept and (self._kept_bytes + nbytes > self.capacity // KEPT_SHARE
                         or self._active_hold() is not None):
                return None
            index, start = self._last_fit(nbytes) if kept else self._first_fit(nbytes)
            if index is None and not kept and self._kept_bytes and self._reclaim_kept():
                index, start = self._first_fit(nbytes)
            if index is None:
                if kept:
                    return None
                live = sum(r.end - r.start for r in self._regions)
                raise ArenaExhausted(
                    f"workspace arena on {self.device}: request of {nbytes} bytes does not fit "
                    f"(capacity {self.capacity}, {live} bytes live in {len(self._regions)} "
                    f"regions up to {self._top}, bound calls keeping {self._kept_bytes} bytes, "
                    f"high water {self._high_water}); make a Runtime with a larger arena_bytes")
            end = start + nbytes
            self._wait_for_other_streams(start, end, stream)
            hold = self._active_hold()
            region = _Region(start, end, stream, hold, kept=kept, users=[] if kept else None)
            if kept:
                self._kept_bytes += nbytes
            self._regions.insert(index, region)
            if hold is not None:
                hold.regions.append(region)
            elif scopes:
                scopes[-1].append(region)
            if end > self._high_water and not kept:
                self._high_water = end
            self._takes += 1
        return region

    def _reclaim_kept(self) -> bool:
        """Under the lock: gives back the kept regions that no call is using now, marked
        ``reclaimed`` so that their calls lend from then on; whether any went. Each region is
        marked before its users are read, and a user appends before it reads the mark, so of
        a call and a reclaim that meet, at least one sees the other: the call lends, or the
        region stays."""
        idle = []
        for region in self._regions:
            if region.kept:
                region.reclaimed = True
                if region.users:
                    region.reclaimed = False
                else:
                    idle.append(region)
        self._release_locked(idle)
        return bool(idle)

    @property
    def _top(self) -> int:
        """The end of the highest live region that is not kept (0 when there is none)."""
        for region in reversed(self._regions):
            if not region.kept:
                return region.end
        return 0

    def _first_fit(self, nbytes: int) -> tuple[int | None, int]:
        """(index in the address-ordered live regions, aligned start) of the lowest gap that
        holds ``nbytes``, or (None, 0). Threads release in any order, so gaps open below live
        regions; a stack that only grew from the top crept up to exhaustion under 8 threads."""
        if not self._regions:   # an idle arena, the usual eager case: no pass
            return (0, 0) if nbytes <= self.capacity else (None, 0)
        if nbytes <= self._regions[0].start:   # below every live one (kept ones sit at the top)
            return 0, 0
        previous_end = 0
        for index, region in enumerate(self._regions):
            start = align_up(previous_end)
            if start + nbytes <= region.start:
                return index, start
            previous_end = max(previous_end, region.end)
        start = align_up(previous_end)
        return (len(self._regions), start) if start + nbytes <= self.capacity else (None, 0)

    def _last_fit(self, nbytes: int) -> tuple[int | None, int]:
        """``_first_fit``'s (index, start) for the highest gap that holds ``nbytes``: kept
        regions pack down from the arena's top, so lent ones below still fit at the first try."""
        limit = self.capacity
        for index in range(len(self._regions), -1, -1):
            floor = self._regions[index - 1].end if index else 0
            start = (limit - nbytes) // ALIGNMENT * ALIGNMENT
            if start >= floor:
                return index, start
            if index:   # regions are in address order and never overlap
                limit = self._regions[index - 1].start
        return None, 0

    def _wait_for_other_streams(self, start: int, end: int, stream) -> None:
        if stream is None or not self._on_cuda or not self._last_use:
            return
        keep = []
        for (lo, hi, prior) in self._last_use:
            if lo < end and start < hi:
                if (prior is not None and prior is not stream and prior != stream
                        and not is_capturing(self.device)):
                    # an event recorded now covers all the earlier user's work on its stream
                    event = torch.cuda.Event()
                    event.record(prior)
                    stream.wait_event(event)
            else:
                keep.append((lo, hi, prior))
        self._last_use = keep

    # -- zeroed counters -----------------------------------------------------------------------
    def counters(self, workspace: torch.Tensor, words: int) -> torch.Tensor | None:
        """``words`` int32 counters that are zero now and belong to the region ``workspace``
        (taken from this arena, over at least ``words`` units of ALIGNMENT bytes), or None
        where it cannot give them (the map is made outside a capture, the first time).

        They come from a map of one word per 256-byte unit of the arena, zeroed once. A region
        owns the words of its units, so calls on other streams, and graphs that hold regions,
        never share a word; each kernel that counts in its words leaves them zero, and the next
        user of the region waits for it like for the region itself."""
        offset = workspace.data_ptr() - self._address
        # the next region starts on the next unit: a region owns the units it touches
        if words <= 0 or align_up(workspace.numel()) < words * ALIGNMENT \
                or not 0 <= offset < self.capacity:
            return None
        table = self.counter_map()
        if table is None:
            return None
        first = offset // ALIGNMENT
        return table[first:first + words]

    def counter_map(self) -> torch.Tensor | None:
        """The zeroed int32 map behind ``counters`` (made at the first call outside a capture;
        None before that): a bound call finds a region's words at ``counter_address``."""
        table = self._counter_map
        if table is None and not is_capturing(self.device):
            with self._lock:
                if self._counter_map is None:
                    made = torch.zeros(self.capacity // ALIGNMENT + 1, dtype=torch.int32,
                                       device=self.device)
                    if self._on_cuda:   # zero before any stream's kernel counts in it
                        torch.cuda.synchronize(self.device)
                    self._counter_map = made
                table = self._counter_map
        return table

    def counter_address(self, address: int) -> int:
        """The address of the first counter word of the region at ``address``."""
        return self._counter_map.data_ptr() + (address - self._address) // ALIGNMENT * 4

    def scope(self) -> "_Scope":
        """Regions this thread takes inside are released when the block ends (unless a hold
        keeps them); other threads' regions are theirs to release."""
        return _Scope(self)

    @contextlib.contextmanager
    def hold(self) -> Iterator[ArenaHold]:
        """Regions taken inside on a capturing stream (on a CPU arena: by this thread) belong to
        the returned hold and outlive their scopes."""
        h = ArenaHold(self)
        with self._lock:
            self._holds.append(h)
        try:
            yield h
        finally:
            with self._lock:
                self._holds.remove(h)

    def _release(self, regions: list[_Region]) -> None:
        if regions:
            with self._lock:
                self._release_locked(regions)

    def _release_soon(self, regions: list[_Region]) -> None:
        """``_release`` for a finalizer, which the garbage collector may run on a thread that
        holds the lock (inside ``_take``, between finding a gap and filling it): the regions go
        back now if the lock is free, else at the next take."""
        self._deferred.append(regions)   # one list operation: atomic without the lock
        if self._lock.acquire(blocking=False):
            try:
                self._release_deferred()
            finally:
                self._lock.release()

    def _release_deferred(self) -> None:
        """Under the lock: the regions that ``_release_soon`` could not give back at once."""
        while self._deferred:
            self._release_locked(self._deferred.pop())

    def _release_locked(self, regions) -> None:
        for r in regions:
            if not r.released:
                r.released = True
                self._regions.remove(r)
                if r.kept:
                    self._kept_bytes -= r.end - r.start
                # a later taker on another stream waits for this one (no stream: nothing to
                # wait for, and nothing kept)
                if r.stream is not None:
                    self._last_use.append((r.start, r.end, r.stream))

    # -- reporting -----------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            if self._deferred:
                self._release_deferred()
            return {"device": str(self.device), "capacity": self.capacity, "in_use": self._top,
                    "high_water": self._high_water, "takes": self._takes,
                    "live_regions": sum(not r.released for r in self._regions),
                    "held_bytes": sum(h.nbytes for h in self._holds),
                    "pinned_bytes": self._pinned.nbytes, "kept_bytes": self._kept_bytes,
                    "kept_regions": sum(r.kept and not r.released for r in self._regions)}

    def __repr__(self) -> str:
        s = self.stats()
        return (f"WorkspaceArena({s['device']}, capacity={s['capacity']}, in_use={s['in_use']}, "
                f"high_water={s['high_water']})")
