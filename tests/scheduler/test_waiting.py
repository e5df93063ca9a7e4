"""What the Scheduler keeps of the pending workloads across cycles changes no decision.

A snapshot that names its changes (``Snapshot.changes``: the ids added, removed or changed since
the last one) lets the Scheduler keep its book of the pending workloads (``scheduler/waiting.py``:
amounts, each queue's demand, the request shapes, each queue's order and positions) and update it
for those alone. The simulator names them. Here: a kept book always equals a fresh one, bit for
bit, over random sequences of changes; whole simulations of random contended scenarios (node
events, pools and fairness over time included) give byte-identical reports with the changes named
and with them withheld; and the Scheduler drops its book whenever it cannot be brought up to date.
"""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler import Scheduler
from gpupool.scheduler.cycle import Cycle
from gpupool.scheduler.model import MILLI, NodeSpec, Phase, PodPlacement, QueueSpec, Snapshot, Workload
from gpupool.scheduler.reasons import Code
from gpupool.scheduler.waiting import WaitingBook, by_queue, facts_of
from gpupool.sim import parse_scenario, simulate
from guarantee_scenarios import example_settings as _settings, scenarios
from sim_harness import report_text

NAMES = ("a", "b", "c")
SHAPES = [dict(gpus=1), dict(gpus=2, pods=2), dict(gpus=0.3), dict(gpu_memory=10 << 30), dict(gpus=0, cpu=0.7),
          dict(gpus=1, node_selector={"gpu_model": "A100"}), dict(gpus=1, preemptible=False)]


def _book_facts(book: WaitingBook) -> tuple:
    lists = {q: [w.id for w in lst] for q, lst in book.lists.items()}
    assert all(book.facts[q] == facts_of(lst, book.by_request) for q, lst in book.lists.items())
    assert all(f[0] == book.amounts[w.id][0] for q, lst in book.lists.items() for w, f in zip(lst, book.facts[q]))
    return (dict(book.amounts), dict(book.demand), dict(book.shapes), lists, dict(book.positions),
            sorted(w.id for w in book.pending), book.facts)


def _fresh(pending: list[Workload], max_mem: int) -> WaitingBook:
    return WaitingBook.fresh(pending, max_mem, NAMES, keep=True)


@given(st.integers(0, 10_000), st.integers(5, 60))
@_settings(60)
def test_a_kept_book_equals_a_fresh_one(seed, steps):
    """Random arrivals, binds, removals and changed priorities or requests, applied as changes to a
    kept book, leave it equal to a book made afresh from the pending workloads of that moment:
    amounts, demand (exactly: fractional requests sum in any order), shapes, order, positions."""
    rng = random.Random(seed)
    live: dict[str, Workload] = {}
    max_mem = 40 << 30
    book = None
    n = 0
    for _ in range(steps):
        changed: set[str] = set()
        for _ in range(rng.randint(0, 12)):
            op = rng.random()
            if op < 0.45 or not live:  # an arrival (often the same submit time, ties broken by id)
                n += 1
                w = Workload(f"w{n:04d}", rng.choice(NAMES), priority=rng.choice([10, 50, 50, 90]),
                             submit_time=float(rng.randint(0, 5)), **rng.choice(SHAPES))
                live[w.id] = w
                changed.add(w.id)
            else:
                w = live[rng.choice(sorted(live))]
                changed.add(w.id)
                if op < 0.6:
                    del live[w.id]  # ended
                elif op < 0.75:  # bound, or back to pending
                    w.phase = Phase.RUNNING if w.phase is Phase.PENDING else Phase.PENDING
                elif op < 0.9:
                    w.priority = rng.choice([10, 50, 90])
                else:
                    new = Workload(w.id, rng.choice(NAMES), priority=w.priority, submit_time=w.submit_time,
                                   **rng.choice(SHAPES))
                    live[w.id] = new  # (a changed workload may be a new object)
        pending = [w for w in live.values() if w.phase is Phase.PENDING]
        rng.shuffle(pending)  # the order a snapshot lists them in does not matter
        if book is None:
            book = _fresh(pending, max_mem)
        else:
            book.update(frozenset(changed), dict(live))
        assert _book_facts(book) == _book_facts(_fresh(pending, max_mem))
        for q, lst in book.lists.items():
            assert lst == by_queue(lst)[q]


def _same_with_and_without_changes(data: dict, seed: int) -> None:
    real = Scheduler.schedule

    def checked(self, snapshot):
        # the simulator's index of its workloads is the snapshot's, object for object
        assert snapshot.by_id is not None and len(snapshot.by_id) == len(snapshot.workloads)
        assert all(snapshot.by_id[w.id] is w for w in snapshot.workloads)
        out = real(self, snapshot)
        assert self.book_mismatches == 0  # the simulator named every change
        # the ids that name pools, kept from the changes alone, are those a full look finds
        assert self._naming == {w.id for w in snapshot.workloads if w.pools}
        return out
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "schedule", checked)
        kept = report_text(data, seed)

    def blind(self, snapshot):
        return real(self, dataclasses.replace(snapshot, changes=None, by_id=None))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "schedule", blind)
        fresh = report_text(data, seed)
    assert kept == fresh


@_settings(60)
@given(scenarios(), st.integers(0, 2))
def test_named_changes_change_no_decision(data, seed):
    _same_with_and_without_changes(data, seed)


@_settings(40)
@given(scenarios(extended=True, pooled=True), st.integers(0, 2))
def test_named_changes_change_no_decision_with_events_and_pools(data, seed):
    _same_with_and_without_changes(data, seed)


def test_the_simulator_names_what_changed():
    """The simulator's snapshots name every workload submitted, bound, evicted, requeued, ended or
    checkpointed since the previous one; the Scheduler then keeps its book."""
    seen: list[frozenset] = []
    kept: list[bool] = []
    real = Scheduler.schedule

    def spy(self, snapshot):
        seen.append(snapshot.changes)
        out = real(self, snapshot)
        kept.append(self._waiting is not None)
        return out
    data = {"config": {"cycle": 5, "preemption_grace": 10, "until": 300},
            "cluster": {"nodes": [{"name": "n", "gpus": 4}]},
            "queues": [{"name": "a", "deserved": {"gpu": 2}}, {"name": "b", "deserved": {"gpu": 2}}],
            "workloads": [{"name": "b1", "queue": "b", "gpus": 4, "duration": 200, "submit_at": 0},
                          {"name": "a1", "queue": "a", "gpus": 2, "duration": 40, "submit_at": 20}]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "schedule", spy)
        simulate(parse_scenario(data))
    assert all(kept)
    # submitted; bound by the first cycle; a1 submitted; b1 evicted for a1 (reclaim), ...
    assert seen[:4] == [{"b1"}, {"b1"}, {"a1"}, {"b1"}]


def _snap(workloads, changes=None, queues=NAMES, gpu_memory=40 << 30) -> Snapshot:
    return Snapshot(0.0, [NodeSpec("n", gpus=2, gpu_memory=gpu_memory)], [QueueSpec(q) for q in queues],
                    workloads, changes=changes)


def test_the_scheduler_drops_its_book_when_it_cannot_be_kept():
    """Kept only while every snapshot names its changes and the queues and the largest GPU stay
    the same (amounts depend on them); a pooled cycle keeps its own, one per pool."""
    s = Scheduler()
    w = [Workload("x", "a", gpus=1), Workload("y", "b", gpu_memory=10 << 30)]
    s.schedule(_snap(w, frozenset({"x", "y"})))
    book = s._waiting
    assert book is not None and set(book.amounts) == {"x", "y"}
    s.schedule(_snap(w, frozenset()))
    assert s._waiting is book  # brought up to date in place
    s.schedule(_snap(w, None))
    assert s._waiting is None
    s.schedule(_snap(w, frozenset()))
    assert s._waiting is not None and s._waiting is not book  # made afresh, to keep
    book = s._waiting
    s.schedule(_snap(w, frozenset(), gpu_memory=80 << 30))  # a GPU-memory request's amount changes
    assert s._waiting is not book and s._waiting.amounts["y"][0] == pytest.approx(0.125)
    book = s._waiting
    s.schedule(_snap(w, frozenset(), queues=NAMES + ("d",)))
    assert s._waiting is not book
    pooled = dataclasses.replace(_snap(w, frozenset()), nodes=[NodeSpec("n", gpus=2, pool="p1")])
    s.schedule(pooled)
    assert s._waiting is None and set(s._pool_books) == {"p1"}
    s.schedule(_snap(w, frozenset()))  # not pooled: the pools' books go
    assert s._pool_books == {}


def test_a_pooled_cycle_keeps_each_pools_book_and_names_what_moved_between_pools():
    """Each pool's book is brought up to date in place while snapshots name their changes; a
    workload whose pools of this cycle change (it is tried elsewhere) is named to the pools it
    comes into or leaves, so every pool's book holds what its snapshot holds."""
    nodes = [NodeSpec("n1", gpus=1, pool="p1"), NodeSpec("n2", gpus=1, pool="p2")]
    s = Scheduler()
    x = Workload("x", "a", gpus=1, pools=("p1",))
    y = Workload("y", "a", gpus=1, pools=("p2",))
    z = Workload("z", "b", gpus=1, pools=("p1",))
    s.schedule(dataclasses.replace(_snap([x, y, z], frozenset({"x", "y", "z"})), nodes=nodes))
    books = {p: b for p, (b, _) in s._pool_books.items()}
    assert set(books) == {"p1", "p2"}
    z2 = dataclasses.replace(z, pools=("p2",))  # z now asks for the other pool
    result = s.schedule(dataclasses.replace(_snap([x, y, z2], frozenset({"z"})), nodes=nodes))
    assert all(s._pool_books[p][0] is books[p] for p in books)  # kept, not made afresh
    assert s.book_mismatches == 0
    for p, (book, ids) in s._pool_books.items():
        assert set(book.ws) <= ids and ("z" in ids) == (p == "p2")
    fresh = Scheduler().schedule(dataclasses.replace(_snap([x, y, z2], None), nodes=nodes))
    assert result.pending == fresh.pending and result.binds == fresh.binds


def test_a_change_left_unnamed_is_caught_by_the_pending_count():
    """An adapter that forgets to name a new pending workload leaves the kept book one short: the
    cycle sees the count differ, makes the book afresh (so the workload is scheduled all the
    same) and counts the mismatch."""
    s = Scheduler()
    a = Workload("a", "a", gpus=1)
    s.schedule(_snap([a], frozenset({"a"})))
    b = Workload("b", "b", gpus=1)
    result = s.schedule(_snap([a, b], frozenset()))  # b not named
    assert s.book_mismatches == 1
    assert {x.workload for x in result.binds} == {"a", "b"}
    assert set(s._waiting.amounts) == {"a", "b"}


def test_a_workload_of_an_unknown_queue_is_left_out_with_a_kept_book():
    """With a kept book the snapshot's workloads are taken whole while every one is in a known
    queue; one that names another queue, when named as changed or (against the contract) not
    named at all, is still left out, waiting with its reason, and the others are scheduled."""
    s = Scheduler()
    a = Workload("a", "a", gpus=1)
    s.schedule(_snap([a], frozenset({"a"})))
    assert s._waiting.all_known
    stray = Workload("s", "nowhere", gpus=1)
    result = s.schedule(_snap([a, stray], frozenset({"s"})))
    assert result.pending["s"].code == Code.NO_QUEUE and not s._waiting.all_known
    assert "s" not in s._waiting.amounts
    b = Workload("b", "b", gpus=1)
    result = s.schedule(_snap([a, stray, b], frozenset({"b"})))  # the stray is looked for again
    assert result.pending["s"].code == Code.NO_QUEUE and {x.workload for x in result.binds} == {"a", "b"}
    s.schedule(_snap([a, b], frozenset({"s"})))  # gone: all known again
    assert s._waiting.all_known
    other = Workload("o", "elsewhere", gpus=1)
    result = s.schedule(_snap([a, b, other], frozenset()))  # not named: the count catches it
    assert result.pending["o"].code == Code.NO_QUEUE and s.book_mismatches == 1


@given(st.integers(0, 10_000), st.integers(3, 30))
@_settings(40)
def test_the_kept_held_sums_equal_a_fresh_take(seed, steps):
    """Held workloads that start, move, end or change shape, named as changes cycle after cycle:
    the now view a kept ``HeldBook`` gives (capacity less its kept sums) is the one taken afresh
    from every held workload, and so are the cycle's results (placements on a node the snapshot
    does not know take nothing either way)."""
    rng = random.Random(seed)
    nodes = [NodeSpec(f"n{i}", gpus=rng.choice([2, 4]), gpu_memory=40 << 30, cpu=32, memory=256 << 30)
             for i in range(3)]
    live: dict[str, Workload] = {}
    kept, n = Scheduler(), 0
    for step in range(steps):
        changed: set[str] = set()
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5 or not live:
                n += 1
                node = rng.choice(nodes + [NodeSpec("gone", gpus=1)])
                gpus = tuple(sorted(rng.sample(range(node.gpus), rng.randint(1, node.gpus))))
                w = Workload(f"h{n}", rng.choice(NAMES), gpus=len(gpus), cpu=rng.choice([1, 2.5]),
                             memory=rng.choice([0, 1 << 30]),
                             phase=rng.choice([Phase.RUNNING, Phase.RUNNING, Phase.RELEASING]), started_at=0.0,
                             placements=(PodPlacement(0, node.name, gpus, rng.choice([1.0, 0.5])),))
                live[w.id] = w
                changed.add(w.id)
            else:
                wid = rng.choice(sorted(live))
                changed.add(wid)
                op = rng.random()
                if op < 0.4:
                    del live[wid]
                elif op < 0.7:  # moved (consolidation): a new object on other GPUs
                    node = rng.choice(nodes)
                    gpus = tuple(sorted(rng.sample(range(node.gpus), rng.randint(1, node.gpus))))
                    live[wid] = dataclasses.replace(live[wid], gpus=len(gpus),
                                                    placements=(PodPlacement(0, node.name, gpus),))
                else:
                    live[wid].phase = Phase.RELEASING
        snap = Snapshot(float(step), nodes, [QueueSpec(q) for q in NAMES], list(live.values()),
                        changes=frozenset(changed))
        got = kept.schedule(snap)
        want = Scheduler().schedule(dataclasses.replace(snap, changes=None))
        assert got == want
        assert kept.book_mismatches == 0
        book = kept._waiting.held
        fresh = Cycle(dataclasses.replace(snap, changes=None), kept.config)
        capacity = np.where(fresh.now.gpu_exists, MILLI, 0).reshape(-1)
        assert np.array_equal(fresh.now.gpu_free.reshape(-1), capacity - book.gpu)
        assert set(book.facts) == set(live)


def test_a_held_workload_gone_unnamed_is_caught():
    """A held workload that leaves the snapshot without being named leaves its take in the kept
    sums: the count of held workloads catches it, and the sums are put right."""
    s = Scheduler()
    node = NodeSpec("n", gpus=2, gpu_memory=40 << 30)
    a = Workload("a", "a", gpus=1, phase=Phase.RUNNING, started_at=0.0, placements=(PodPlacement(0, "n", (0,)),))
    b = Workload("b", "b", gpus=1, phase=Phase.RUNNING, started_at=0.0, placements=(PodPlacement(0, "n", (1,)),))
    queues = [QueueSpec(q) for q in NAMES]
    s.schedule(Snapshot(0.0, [node], queues, [a, b], changes=frozenset({"a", "b"})))
    p = Workload("p", "a", gpus=1)
    result = s.schedule(Snapshot(1.0, [node], queues, [a, p], changes=frozenset({"p"})))  # b gone, not named
    assert s.book_mismatches == 1
    assert [x.workload for x in result.binds] == ["p"] and result.binds[0].placements[0].gpus == (1,)
    assert set(s._waiting.held.facts) == {"a"}
