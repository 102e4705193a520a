"""Core: contract, result, plan store, arena, streams, runtime (no GPU needed)."""
import threading

import pytest
import torch

import graphrt
from graphrt import ArenaExhausted, Contract, ContractError, PlanStore, Result, TensorSpec
from graphrt.arena import WorkspaceArena
from graphrt.plan import Plan, select_backend
from graphrt.streams import resolve_stream
from graphrt.validate import require_disjoint, row_layout

from .helpers import env


# -- contract -----------------------------------------------------------------------------------
def test_contract_equality_hash_and_dynamic_dims():
    spec = TensorSpec("x", torch.bfloat16, (None, 64), "rows")
    a = Contract("op", "triton", "cuda", (9, 0), (spec,), {"eps": 1e-6, "flag": True})
    b = Contract("op", "triton", "cuda", (9, 0), (spec,), {"flag": True, "eps": 1e-6})
    c = Contract("op", "triton", "cuda", (10, 0), (spec,), {"eps": 1e-6, "flag": True})
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert a.dynamic_dims() == {"x": (0,)}
    assert a.flag("eps") == 1e-6
    assert "x:bfloat16[None, 64]/rows" in repr(a)


# -- result -------------------------------------------------------------------------------------
def test_result_by_name_index_and_unpacking():
    r = Result(("dx", "dw"), ("a", "b"))
    assert r.dx == "a" and r["dw"] == "b" and r[0] == "a"
    dx, dw = r
    assert (dx, dw) == ("a", "b")
    assert r.asdict() == {"dx": "a", "dw": "b"}
    with pytest.raises(AttributeError):
        r.nope
    with pytest.raises(KeyError):
        r["nope"]


def test_results_of_bound_calls_answer_alike_and_copy_and_pickle():
    """A bound call's Result (``result_maker``: its names on its class) answers as one made
    with ``Result``; both copy, deep-copy and pickle to equal Results."""
    import copy
    import pickle

    from graphrt.result import result_maker
    made = result_maker(("dx", "dw"))(("a", "b"))
    plain = Result(("dx", "dw"), ("a", "b"))
    assert isinstance(made, Result) and made == plain and made.names == plain.names
    assert (made.dx, made["dw"], made[0], made.asdict(), repr(made)) == \
        (plain.dx, plain["dw"], plain[0], plain.asdict(), repr(plain))
    for r in (made, plain):
        for again in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
            assert type(again) is Result and again == r and again.names == ("dx", "dw")


# -- plan store ---------------------------------------------------------------------------------
class _Toy(Plan):
    op = "toy"
    output_names = ("y",)
    built = 0

    @classmethod
    def contract_for(cls, x, *, scale=1.0):
        return Contract(cls.op, "reference", x.device.type, None,
                        (TensorSpec("x", x.dtype, (None,) + tuple(x.shape[1:]), "rows"),),
                        {"scale": scale})

    def _compile(self):
        type(self).built += 1


def test_plan_store_hits_misses_and_lru_eviction():
    store = PlanStore(maxsize=2)
    a = store.get(_Toy, torch.zeros(3, 4), scale=1.0)
    assert store.get(_Toy, torch.zeros(9, 4), scale=1.0) is a  # row count is not in the key
    store.get(_Toy, torch.zeros(3, 8), scale=1.0)
    store.get(_Toy, torch.zeros(3, 4), scale=2.0)                # evicts the oldest (4, 1.0)
    s = store.stats()
    assert (s["hits"], s["misses"], s["compiles"], s["evictions"], s["size"]) == (1, 3, 3, 1, 2)
    assert store.get(_Toy, torch.zeros(3, 4), scale=1.0) is not a
    store.clear()
    assert len(store) == 0


def test_plan_store_hit_and_lookup_make_a_plan_recent():
    store = PlanStore(maxsize=2)
    a = store.get(_Toy, torch.zeros(3, 4))
    b = store.get(_Toy, torch.zeros(3, 8))
    assert store.get(_Toy, torch.zeros(5, 4)) is a                # a is now the most recent
    store.get(_Toy, torch.zeros(3, 16))                           # so b is evicted
    assert store.lookup(_Toy.contract_for(torch.zeros(1, 8))) is None
    assert store.lookup(_Toy.contract_for(torch.zeros(1, 4))) is a  # a refreshed again
    store.get(_Toy, torch.zeros(3, 32))                           # evicts the 16-wide plan
    assert store.lookup(_Toy.contract_for(torch.zeros(1, 4))) is a
    assert store.stats()["evictions"] == 2 and b is not a


def test_plan_store_thread_safe():
    store = PlanStore(maxsize=8)
    plans = []

    def work():
        for _ in range(200):
            plans.append(store.get(_Toy, torch.zeros(2, 16)))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(p) for p in plans}) == 1
    s = store.stats()
    assert s["compiles"] == 1 and s["hits"] + s["misses"] == 800


def test_plan_lifecycle_requires_compile():
    plan = _Toy.from_contract(_Toy.contract_for(torch.zeros(1, 2)))
    with pytest.raises(RuntimeError, match="compile"):
        plan._require_compiled()
    plan.compile()
    plan.compile()
    assert plan.compiled and plan.compile_count == 1


def test_backend_selection():
    cpu = torch.device("cpu")
    with env(GRAPHRT_BACKEND=None):
        assert select_backend(cpu) == "reference"
    with env(GRAPHRT_BACKEND="bogus"):
        with pytest.raises(graphrt.UnsupportedError, match="backend"):
            select_backend(cpu)
    with env(GRAPHRT_BACKEND="triton", TRITON_INTERPRET=None):
        with pytest.raises(graphrt.UnsupportedError, match="CUDA"):
            select_backend(cpu)


# -- arena --------------------------------------------------------------------------------------
def test_arena_alignment_scopes_and_stats():
    arena = WorkspaceArena(1 << 16, "cpu")
    with arena.scope():
        a = arena.take(100)
        with arena.scope():
            b = arena.take(1000)
            assert b.data_ptr() % 256 == 0 and b.numel() == 1000
            assert b.data_ptr() >= a.data_ptr() + 256
            inner_top = arena.stats()["in_use"]
        assert arena.stats()["in_use"] == 100
        c = arena.take(10)
        assert c.data_ptr() == b.data_ptr()  # LIFO reuse
    s = arena.stats()
    assert s["in_use"] == 0 and s["high_water"] == inner_top and s["takes"] == 3
    assert a.data_ptr() % 256 == 0
    with arena.scope():   # a lent address: the same region a view would have had
        first, region = arena.lend(100, None)
        second = arena.take(1000)
        assert first == a.data_ptr() and second.data_ptr() == first + 256
        assert arena.stats()["in_use"] == 256 + 1000
    assert arena.stats()["in_use"] == 100 and arena.stats()["takes"] == 5   # lent: not scoped
    arena.give_back(region)
    assert arena.stats()["in_use"] == 0 and arena.stats()["live_regions"] == 0


def test_arena_lent_regions_are_given_back_by_their_caller_unless_a_capture_holds_them():
    """``lend`` takes a region outside any scope: it stays live until ``give_back``, which
    leaves one taken inside a hold (a capture's workspace) to the hold."""
    arena = WorkspaceArena(1 << 16, "cpu")
    address, region = arena.lend(300, None)
    assert address % 256 == 0 and arena.stats()["live_regions"] == 1
    with arena.scope():
        assert arena.take(10).data_ptr() == address + 512   # the lent bytes stay out of reach
    arena.give_back(region)
    assert arena.stats()["live_regions"] == 0
    with arena.hold() as hold:
        _, held = arena.lend(100, None)
        arena.give_back(held)
    assert arena.stats()["live_regions"] == 1 and hold.nbytes == 100
    hold.release()
    assert arena.stats()["live_regions"] == 0


def test_arena_kept_regions_stay_under_their_share_and_never_go_to_a_hold():
    """``keep`` lends a region for reuse across calls: never while a hold takes regions (a
    capture's graph must own its workspace), at most 1/KEPT_SHARE of the arena in all, and
    None (nothing taken) where it does not fit; given back, now or from a finalizer, it
    leaves the kept bytes."""
    from graphrt.arena.workspace import KEPT_SHARE
    arena = WorkspaceArena(KEPT_SHARE * 1024, "cpu")
    address, region = arena.keep(600, "stream")
    assert address % 256 == 0 and region.stream == "stream"
    assert arena.stats()["kept_bytes"] == 600 and not arena.holding()
    with arena.hold() as hold:
        assert arena.holding() and arena.keep(1, None) is None
    assert hold.nbytes == 0 and arena.stats()["live_regions"] == 1
    assert arena.keep(1024 - 600 + 1, None) is None   # over the share
    second = arena.keep(1024 - 600, None)
    assert second is not None and arena.stats()["kept_bytes"] == 1024
    arena.give_back(region)
    arena.give_back_soon(second[1])
    s = arena.stats()
    assert s["kept_bytes"] == 0 and s["live_regions"] == 0 and s["in_use"] == 0
    with arena.scope():
        arena.take(KEPT_SHARE * 1024 - 100)
        assert arena.keep(200, None) is None   # does not fit: no ArenaExhausted either
    assert arena.stats()["live_regions"] == 0


def test_arena_takes_back_idle_kept_regions_for_a_take_that_needs_their_room():
    """Keeping never makes a take fail that would fit without it: a take that does not fit
    beside the kept regions takes back those no call is using (marked ``reclaimed``: their
    calls lend from then on). One in use stays, and the take then raises ArenaExhausted; a
    take that fits beside them leaves them all."""
    from graphrt.arena.workspace import KEPT_SHARE
    size = KEPT_SHARE * 1024
    arena = WorkspaceArena(size, "cpu")
    _, kept = arena.keep(600, None)
    with arena.scope():
        arena.take(size - 2048)
    assert not kept.reclaimed and arena.stats()["kept_bytes"] == 600
    _, busy = arena.keep(300, "stream")
    busy.users.append(None)   # a call using its region now
    with arena.scope(), pytest.raises(ArenaExhausted, match="bound calls keeping 300 bytes"):
        arena.take(size - 200)
    assert kept.reclaimed and kept.released and not busy.reclaimed and not busy.released
    assert arena.stats()["kept_bytes"] == 300 and arena.stats()["live_regions"] == 1
    busy.users.pop()
    with arena.scope():
        assert arena.take(size - 200).data_ptr() == arena._address
    assert busy.reclaimed and arena.stats()["kept_bytes"] == 0
    arena.give_back(kept)   # the calls give them back later: nothing goes back twice
    arena.give_back_soon(busy)
    assert arena.stats()["live_regions"] == 0 and arena.stats()["kept_bytes"] == 0


def test_arena_kept_regions_pack_down_from_the_top_and_lends_fit_below_them():
    """Kept regions take the highest gap that holds them, so the lent and scoped regions of
    every call still fit at offset 0 on the first try; ``in_use`` and ``high_water`` count
    only those (the kept ones are ``kept_bytes``)."""
    arena = WorkspaceArena(64 * 1024, "cpu")
    _, first = arena.keep(1000, None)
    assert first.start == 64 * 1024 - 1024 and first.end == first.start + 1000
    _, second = arena.keep(300, None)
    assert second.start == first.start - 512 and second.end <= first.start
    with arena.scope():
        lent = arena.take(5000)
        assert lent.data_ptr() == arena._address
        assert arena.stats()["in_use"] == 5000 and arena.stats()["high_water"] == 5000
    assert arena.stats()["in_use"] == 0 and arena.stats()["kept_bytes"] == 1300
    arena.give_back(first)
    with arena.scope():   # a lent region between the kept one and the top
        arena.take(60 * 1024)
        _, third = arena.keep(700, None)
        assert third.start == 64 * 1024 - 768 and third.start >= second.end
    arena.give_back(second)
    arena.give_back(third)
    assert arena.stats()["live_regions"] == 0 and arena.stats()["kept_bytes"] == 0


def test_arena_hold_released_by_the_garbage_collector_inside_a_take():
    """A fragment's finalizer gives its hold back; the garbage collector may run it on a thread
    that is inside the arena's lock, between finding a gap and filling it. The regions then go
    back at the next take: the take neither hangs nor fills a gap that moved under it (which
    later let a region overlap a live one)."""
    arena = WorkspaceArena(1 << 16, "cpu")
    a = arena.lend(256, None)[1]                       # [0, 256)
    with arena.hold() as hold:
        arena.lend(256, None)                          # [256, 512), the hold's
    filler = arena.lend(512, None)[1]                  # [512, 1024)
    b = arena.lend(256, None)[1]                       # [1024, 1280)
    arena.give_back(filler)
    active_hold = arena._active_hold

    def collector_runs_the_finalizer():   # as fragment.py's finalizer does
        arena._active_hold = active_hold
        hold.release(from_finalizer=True)
        return active_hold()
    arena._active_hold = collector_runs_the_finalizer
    taken = []
    worker = threading.Thread(target=lambda: taken.append(arena.lend(256, None)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "a finalizer inside the arena's lock hung the take"
    address, n = taken[0]
    assert (n.start, n.end) == (512, 768) and arena.stats()["live_regions"] == 3   # hold's gone
    m = arena.lend(600, None)[1]                       # the hold's bytes, free again, too few
    live = [a, n, b, m]
    assert all(x.end <= y.start or y.end <= x.start for x in live for y in live if x is not y)
    assert [r.start for r in arena._regions] == sorted(r.start for r in arena._regions)
    for region in live:
        arena.give_back(region)
    assert arena.stats()["live_regions"] == 0


def test_arena_nested_scopes_release_their_own_regions():
    """An inner scope that took nothing closes itself, not the outer one (both lists are
    empty and equal then): the outer scope's later region is released when it closes."""
    arena = WorkspaceArena(1 << 16, "cpu")
    with arena.scope():
        with arena.scope():
            pass
        arena.take(100)
        with arena.scope():
            arena.take(100)
        assert arena.stats()["in_use"] == 100
    assert arena.stats()["in_use"] == 0 and arena.stats()["live_regions"] == 0
    with pytest.raises(RuntimeError, match="inside"):   # and on an exception, too
        with arena.scope():
            arena.take(10)
            raise RuntimeError("inside")
    assert arena.stats()["in_use"] == 0


def test_arena_keeps_no_record_per_call_without_a_stream():
    """Regions taken with no stream (every CPU call) leave nothing behind once released: the
    arena's record of last users stays empty however many calls run."""
    arena = WorkspaceArena(1 << 16, "cpu")
    for _ in range(1000):
        with arena.scope():
            arena.give_back(arena.lend(512, None)[1])
            arena.take(100)
    assert arena._last_use == [] and arena.stats()["live_regions"] == 0


def test_arena_counters_are_zero_words_that_only_their_region_owns():
    arena = WorkspaceArena(1 << 16, "cpu")
    with arena.scope():
        a, b = arena.take(1000), arena.take(600)   # a owns 4 units of 256 bytes, b 3
        ca, cb = arena.counters(a, 4), arena.counters(b, 2)
        assert ca.dtype == torch.int32 and ca.numel() == 4 and not ca.any() and not cb.any()
        assert ca.data_ptr() + 4 * 4 <= cb.data_ptr()   # no word shared
        assert arena.counter_address(a.data_ptr()) == ca.data_ptr()
        assert arena.counter_address(b.data_ptr()) == cb.data_ptr()
        assert arena.counters(a, 5) is None   # more words than the region has units
        assert arena.counters(torch.empty(4096, dtype=torch.uint8), 1) is None   # not its own
    assert arena.counter_map().numel() == (1 << 16) // 256 + 1


def test_arena_nested_holds_keep_their_own_regions():
    """An inner hold that took nothing closes itself, not an equal-looking outer one: regions
    the outer block takes afterwards belong to the outer hold."""
    arena = WorkspaceArena(1 << 16, "cpu")
    with arena.hold() as outer:
        with arena.hold() as inner:
            pass
        with arena.scope():
            arena.take(100)
    assert inner.nbytes == 0 and outer.nbytes == 100
    outer.release()
    assert arena.stats()["in_use"] == 0


def test_arena_exhaustion_names_request_and_high_water():
    arena = WorkspaceArena(4096, "cpu")
    with arena.scope():
        arena.take(3000)
        with pytest.raises(ArenaExhausted, match=r"request of 2000 bytes.*high water 3000"):
            arena.take(2000)
    with arena.scope():  # still usable afterwards
        assert arena.take(4096).numel() == 4096
    with pytest.raises(ContractError):
        arena.take(-1)


def test_arena_hold_outlives_scope_and_release_frees():
    arena = WorkspaceArena(1 << 14, "cpu")
    with arena.hold() as hold:
        with arena.scope():
            kept = arena.take(512)
            temp_owner = arena.stats()["live_regions"]
    assert temp_owner == 1 and hold.nbytes == 512
    with arena.scope():
        other = arena.take(16)
        assert other.data_ptr() >= kept.data_ptr() + 512  # held region not reused
    hold.release()
    assert arena.stats()["in_use"] == 0
    with arena.scope():
        assert arena.take(16).data_ptr() == kept.data_ptr()


def test_arena_scope_releases_only_its_own_threads_regions():
    """Thread A's scope closes while thread B still uses its region: B's bytes stay reserved, and
    the next take (from A) lands above them, never on them."""
    import threading

    arena = WorkspaceArena(1 << 16, "cpu")
    b_took, a_closed, b_may_close = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_b():
        with arena.scope():
            seen["b"] = arena.take(1024)
            b_took.set()
            b_may_close.wait(10)
            seen["b_live_after_a"] = arena.stats()["live_regions"]

    with arena.scope():
        a = arena.take(512)
        worker = threading.Thread(target=thread_b)
        worker.start()
        assert b_took.wait(10)
    a_closed.set()
    with arena.scope():
        again = arena.take(2048)
        b = seen["b"]
        assert not (again.data_ptr() < b.data_ptr() + b.numel()
                    and b.data_ptr() < again.data_ptr() + again.numel()), "B's region handed out"
    b_may_close.set()
    worker.join(10)
    assert seen["b_live_after_a"] == 1 and a.numel() == 512
    s = arena.stats()
    assert s["in_use"] == 0 and s["live_regions"] == 0


def test_arena_reuses_gaps_that_threads_leave_below_live_regions():
    """Two threads in turn, each closing its scope and taking again while the other's region is
    live: a stack allocator puts every new region above the other's and creeps up to
    ArenaExhausted (after four turns here); takes must reuse the gap, never the live region."""
    import threading

    arena = WorkspaceArena(4 * 1024, "cpu")
    turns = [threading.Semaphore(0), threading.Semaphore(0)]
    live = {}
    errors = []

    def worker(me: int):
        other, scope = 1 - me, None
        try:
            for _ in range(20):
                turns[me].acquire()
                if scope is not None:
                    scope.__exit__(None, None, None)
                    del live[me]
                scope = arena.scope()
                scope.__enter__()
                mine = arena.take(1000).data_ptr()
                theirs = live.get(other)
                if theirs is not None and abs(mine - theirs) < 1000:
                    errors.append("overlap")
                live[me] = mine
                turns[other].release()
            turns[me].acquire()
            scope.__exit__(None, None, None)
        except Exception as exc:            # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            turns[other].release()

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    turns[0].release()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert arena.stats()["high_water"] <= 3 * 1024 and arena.stats()["in_use"] == 0


def test_arena_hold_keeps_only_its_own_threads_regions():
    import threading

    arena = WorkspaceArena(1 << 16, "cpu")
    with arena.hold() as hold:
        def other():
            with arena.scope():
                arena.take(256)
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        with arena.scope():
            arena.take(128)
    assert hold.nbytes == 128 and arena.stats()["live_regions"] == 1
    hold.release()
    assert arena.stats()["in_use"] == 0


# -- validation ---------------------------------------------------------------------------------
def test_row_layout_accepts_padded_rows_and_rejects_others():
    base = torch.zeros(4, 3, 80, dtype=torch.bfloat16)
    assert row_layout("x", base) == (12, 80)
    assert row_layout("x", base[..., :64]) == (12, 80)          # padded rows, 160 bytes
    with pytest.raises(ContractError, match="x: layout not supported.*unit stride"):
        row_layout("x", base.transpose(1, 2))
    with pytest.raises(ContractError, match="multiple of 16 bytes"):
        row_layout("x", torch.zeros(4, 20, dtype=torch.bfloat16)[:, :12])
    with pytest.raises(ContractError, match="do not collapse"):
        row_layout("x", base[:, :2, :])
    assert row_layout("x", torch.zeros(64, dtype=torch.bfloat16)) == (1, 64)


def test_require_disjoint_finds_overlap():
    buf = torch.zeros(100)
    require_disjoint({"out": buf[50:]}, {"x": buf[:50]})
    with pytest.raises(ContractError, match="out: memory overlaps x"):
        require_disjoint({"out": buf[40:]}, {"x": buf[:50]})


def test_resolve_stream_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_stream(None, cpu) is None
    with pytest.raises(ContractError, match="stream"):
        resolve_stream(123, cpu)


def test_runtime_defaults_and_own_runtime():
    assert graphrt.runtime("cpu") is graphrt.runtime(torch.device("cpu"))
    rt = graphrt.Runtime("cpu", arena_bytes=1 << 12, plan_cache_size=3)
    s = rt.stats()
    assert s["arena"]["capacity"] == 4096 and s["plans"]["maxsize"] == 3


# -- kernel launch helpers ----------------------------------------------------------------------
@pytest.mark.parametrize("max_programs", [1, 7, 264, 528])
def test_persistent_grid_keeps_the_steps_and_evens_the_tiles(max_programs):
    from graphrt.kernel_utils import persistent_grid
    for tiles in (1, 5, 100, 263, 264, 265, 527, 529, 16384, 16385):
        programs = persistent_grid(tiles, max_programs)
        assert 1 <= programs <= max_programs
        steps = -(-tiles // max_programs)
        assert -(-tiles // programs) == steps          # no more steps than the full grid takes
        assert programs <= tiles                        # no program is left without a tile


def test_no_dependent_launch_off_the_gpu():
    from graphrt.kernel_utils import use_pdl
    assert use_pdl(torch.zeros(2)) is False


@pytest.mark.gpu
def test_default_backend_on_cuda_is_triton():
    from graphrt.ops import RmsNormForward
    with env(GRAPHRT_BACKEND=None):
        assert select_backend(torch.device("cuda")) == "triton"
        x = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda")
        plan = graphrt.Runtime("cuda").plan(RmsNormForward, x, torch.ones(64, device="cuda"))
        assert plan.backend == "triton" and plan.describe()["backend"] == "triton"


def test_arena_hold_release_points_later_takers_at_the_last_stream():
    arena = WorkspaceArena(1 << 14, "cpu")
    with arena.hold() as hold:
        with arena.scope():
            arena.take(512, stream="capture stream")
    hold.release(last_stream="replay stream")
    assert arena._last_use == [(0, 512, "replay stream")] and arena.stats()["in_use"] == 0


def test_arena_take_belongs_to_its_own_threads_scope_whatever_the_interleaving():
    """A takes while B's scope (opened later) is still open, then B closes first: A's region
    must stay reserved until A's own scope closes."""
    import threading

    arena = WorkspaceArena(1 << 16, "cpu")
    b_open, a_took, b_closed = threading.Event(), threading.Event(), threading.Event()

    def thread_b():
        with arena.scope():
            arena.take(256)
            b_open.set()
            a_took.wait(10)
        b_closed.set()

    with arena.scope():
        worker = threading.Thread(target=thread_b)
        worker.start()
        assert b_open.wait(10)
        a = arena.take(1024)
        a_took.set()
        assert b_closed.wait(10)
        later = arena.take(1024)
        assert later.data_ptr() >= a.data_ptr() + a.numel(), "A's region was handed out again"
    worker.join(10)
    assert arena.stats()["in_use"] == 0


def test_no_tensor_allocation_sees_tensor_methods_too():
    from .helpers import no_tensor_allocation
    x = torch.zeros(3)
    with no_tensor_allocation():
        for make in (lambda: x.new_empty(2), lambda: x.new_zeros(2), lambda: torch.empty(2)):
            with pytest.raises(AssertionError, match="on the execute path"):
                make()
    assert x.new_empty(2).shape == (2,)


def test_settings_read_every_call_follow_the_environment(monkeypatch):
    """env_reader reads the raw mapping, which setenv, os.environ[...] and delenv update: the
    backend and the wgrad's host validation follow each change."""
    from graphrt.ops.grouped_gemm.plan import GroupedGemmWgrad
    from graphrt.plan import env_backend, env_reader
    read = env_reader("GRAPHRT_TEST_SETTING")
    monkeypatch.delenv("GRAPHRT_TEST_SETTING", raising=False)
    assert read() is None
    monkeypatch.setenv("GRAPHRT_TEST_SETTING", "caf\u00e9")
    assert read() == "caf\u00e9"
    monkeypatch.setenv("GRAPHRT_BACKEND", "")
    assert env_backend() is None
    monkeypatch.setenv("GRAPHRT_BACKEND", "reference")
    assert env_backend() == "reference"
    monkeypatch.setenv("GRAPHRT_VALIDATE_OFFSETS", "1")
    assert not GroupedGemmWgrad.bindable()
    monkeypatch.setenv("GRAPHRT_VALIDATE_OFFSETS", "0")
    assert GroupedGemmWgrad.bindable()
    monkeypatch.delenv("GRAPHRT_VALIDATE_OFFSETS")
    assert GroupedGemmWgrad.bindable()
