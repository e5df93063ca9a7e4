"""The heavy, pure part of a scheduling cycle, kept off the service's event loop.

A cycle of the loop (runtime/loop.py) has parts that need the event loop (polling runs, starting
and stopping them through the backend) and a part that does not: reading every active workload
from the database, building the scheduler's :class:`Snapshot`, ``Scheduler.schedule`` and the
pending reasons it gives. On a large pool (1000 nodes, 20,000 workloads) that part is a second of
pure-Python work. Run on the event loop, or in a thread (the GIL), it stalls every API request
for that long; so by default it runs in a worker process of its own (``c.GPUPool.cycle_in_process``),
which keeps its caches warm from one cycle to the next. The same :class:`CycleWorker` code runs in
a thread of the service when ``cycle_in_process`` is False, and as the fallback for a cycle whose
worker process died, or hung and was killed after ``c.GPUPool.cycle_timeout`` seconds (a new one
is started for the next cycle; no cycle is lost).

What crosses the process boundary is small in and plain data out: the cycle's time, the node list
and the last reservations go in; a :class:`Decision` (the ``CycleResult``, queue counts, GPUs held
per queue, warnings) comes back. The worker reads the database on its own connection (SQLite in WAL
mode lets it read while the service writes) after the loop has committed its reconcile step, and it
writes the pending reasons itself (one UPDATE of the rows whose reason changed, only while they are
still queued), so the event loop never handles the 20,000 rows. Binds and evictions stay with the
loop: they go through the backend.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from ...contract import decode_allocation
from ...gcpause import paused_gc
from ...scheduler import Scheduler
from ...scheduler.model import (CycleResult, NodeSpec, Phase, QueueSpec, Reservation, SchedulerConfig,
                                Snapshot, Workload as SWorkload)
from ...scheduler.reasons import Code, Pending
from ..domain import lifecycle
from ..domain.pools import pool_counts
from ..store import tables as D
from ..store.engine import make_engine, make_sessionmaker

log = logging.getLogger("gpupool.loop")

REMOVED_QUEUE = "(removed from config)"
MAX_DEATHS = 3  # worker processes dying one after the other before cycles stay in a thread
STOP_GRACE = 5.0  # seconds a worker's cycle under way gets to finish when the service stops

# the scheduler's view of a workload is its row: every field of the core's Workload that is also a
# column is read and handed over by name (a new request field the scheduler reads needs no change here)
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(SWorkload)
                     if f.name in D.Workload.__table__.c and f.name not in ("id", "queue", "started_at"))
_FIELDS = tuple(dict.fromkeys(("id", "type", "queue", "submitted_at", "started_at", "reason", "status", *MODEL_FIELDS)))
QUEUED_COLUMNS = [getattr(D.Workload, c) for c in _FIELDS]
HOLDING_COLUMNS = QUEUED_COLUMNS + [D.Workload.allocation, D.Workload.stop_requested_at]


@dataclass
class QueueView:
    running: int = 0
    pending: int = 0


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to know of the service (plain data: it is sent to the worker process)."""

    db_url: str
    queues: list[QueueSpec]
    scheduler: SchedulerConfig
    live_nodes: bool = False  # the backend keeps a live inventory (Kubernetes): see CycleWorker.snapshot


class PendingView(Mapping):
    """``CycleResult.pending`` as it crosses from the worker process: each ``Pending`` as a plain
    tuple (a fraction of the cost to pickle and unpickle: the service unpickles while the API
    waits for the GIL), made into a ``Pending`` again when it is looked at."""

    def __init__(self, pending: Mapping[str, Pending]):
        self._raw = {wid: (why.code.value, why.queue, why.position, why.detail) for wid, why in pending.items()}

    def __getitem__(self, wid: str) -> Pending:
        code, queue, position, detail = self._raw[wid]
        return Pending(Code(code), queue, position, detail)

    def __contains__(self, wid: object) -> bool:
        return wid in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@dataclass
class Decision:
    """One cycle's decisions and what the loop shows of them."""

    result: CycleResult
    queues: dict[str, QueueView]  # queue -> workloads holding / waiting
    held: dict[str, float]  # queue -> GPUs held from now on (holders and binds, fractions summed): metrics
    warnings: list[str] = field(default_factory=list)  # for the service's log
    read_ms: float = 0.0  # reading the database and building the snapshot
    decide_ms: float = 0.0  # Scheduler.schedule alone
    explain_ms: float = 0.0  # the pending reasons, stored
    reasons: int = 0  # pending reasons that changed (rows updated)
    seconds: float = 0.0  # the whole of CycleWorker.decide
    pid: int = 0  # the process that decided
    done_at: float = 0.0  # when it was decided (time.time())
    lost_seconds: float = 0.0  # waited for a worker process starting, or one that hung (then killed): no work of the service
    pools: dict[str, dict[str, float]] = field(default_factory=dict)  # domain/pools.py pool_counts


def _model(row: Any, queue: str, **state: Any) -> SWorkload:
    """The core's Workload of a row (``state``: phase, placements, start of a workload holding GPUs)."""
    fields = {name: getattr(row, name) for name in MODEL_FIELDS}
    fields["pods"] = int(fields.get("pods") or 1)
    if "pools" in fields:
        fields["pools"] = tuple(fields["pools"] or ())  # JSON: a list, or NULL for any pool
    return SWorkload(id=D.public_id(row.type, row.id), queue=queue, submit_time=row.submitted_at, **fields, **state)


class CycleWorker:
    """Database -> Snapshot -> ``Scheduler.schedule`` -> pending reasons, for one service. Keeps the
    model objects of waiting workloads (they do not change while they wait) and the last sentence
    of each pending reason from one cycle to the next."""

    def __init__(self, config: WorkerConfig, sessions: Any = None):
        self.config = config
        self.queue_names = {q.name for q in config.queues}
        if sessions is None:
            sessions = make_sessionmaker(make_engine(config.db_url))
        self.sessions = sessions
        self.scheduler = Scheduler(config.scheduler)
        self._pending_cache: dict[int, SWorkload] = {}
        # holders' model objects, kept while their row is unchanged: row id -> (row, queue, model)
        self._held_cache: dict[int, tuple[tuple, str, SWorkload]] = {}
        self._nodes: dict[str, NodeSpec] = {}  # the last snapshot's node objects, reused while equal
        # what the last snapshot the scheduler decided held (ids), or None: the next snapshot then
        # names no changes (``Snapshot.changes``) and the scheduler works everything out afresh
        self._held_ids: set[str] | None = None
        self._held_now: set[str] = set()  # the same, of the last snapshot made
        self._said: dict[str, tuple[Pending, str]] = {}  # last reason per queued workload, as words

    def decide(self, now: float, nodes: list[NodeSpec], reservations: list[Reservation],
               usage: dict | None = None) -> Decision:
        """``usage``: past usage for fairness over time (``Snapshot.usage``; runtime/fairness.py)."""
        t0 = time.perf_counter()
        warnings: list[str] = []
        with self.sessions() as s:
            holding = s.execute(select(*HOLDING_COLUMNS).where(D.Workload.allocation.is_not(None))
                                .order_by(D.Workload.id)).all()
            queued = s.execute(select(*QUEUED_COLUMNS).where(D.Workload.status == D.QUEUED,
                                                             D.Workload.allocation.is_(None))
                               .order_by(D.Workload.id)).all()
            snap, by_id, views = self.snapshot(holding, queued, now, nodes, reservations, warnings)
            snap.usage = usage or {}
            held_ids, self._held_ids = self._held_now, None  # (known again once this one is decided)
            missed = self.scheduler.book_mismatches
            t1 = time.perf_counter()
            with paused_gc():  # see gpupool/gcpause.py
                result = self.scheduler.schedule(snap)
            self._held_ids = held_ids
            if self.scheduler.book_mismatches > missed:  # decided all the same, on a book made afresh
                log.warning("cycle at %.0f: the snapshot did not name a change of the workloads; "
                            "the scheduler worked them out afresh (no decision is affected; please report it)",
                            now)
            decide_ms = (time.perf_counter() - t1) * 1000
            t2 = time.perf_counter()
            reasons = self.explain(s, result, by_id)
            s.commit()
            explain_ms = (time.perf_counter() - t2) * 1000
        # GPUs held from now on per queue (the metrics): by the holders and by the cycle's binds
        held: dict[str, float] = {}
        queue_of = {w.id: w.queue for w in snap.workloads}
        holding = [(w.queue, w.placements or ()) for w in snap.workloads]
        holding += [(queue_of[b.workload], b.placements) for b in result.binds if b.workload in queue_of]
        for queue, placements in holding:
            for p in placements:
                held[queue] = held.get(queue, 0.0) + len(p.gpus) * p.fraction
        if not isinstance(result.pending, PendingView):
            result.pending = PendingView(result.pending)
        return Decision(result=result, queues=views, held=held, warnings=warnings, decide_ms=decide_ms,
                        pools=pool_counts(snap, result.binds),
                        read_ms=(t1 - t0) * 1000, explain_ms=explain_ms, reasons=reasons,
                        seconds=time.perf_counter() - t0, pid=os.getpid(), done_at=time.time())

    def snapshot(self, holding: list[Any], queued: list[Any], now: float, nodes_list: list[NodeSpec],
                 reservations: list[Reservation], warnings: list[str]
                 ) -> tuple[Snapshot, dict[str, Any], dict[str, QueueView]]:
        """Workloads holding GPUs and queued ones (database rows) as the scheduler's model. Queued
        workloads do not change while they wait, so their model objects are reused across cycles
        (a long queue costs little per cycle): by row id and submission time, since a database
        may hand a deleted row's id to a new row."""
        queues = list(self.config.queues)
        workloads: list[SWorkload] = []
        by_id: dict[str, Any] = {}
        models: dict[str, SWorkload] = {}  # the same workloads by id, for the core (``Snapshot.by_id``)
        # what changed since the last snapshot the scheduler decided (none known if it decided
        # none): the workloads made afresh (holders whose row changed, queued ones), those that
        # held GPUs then and do not now, those no longer queued
        changes: set[str] = set()
        held_now: set[str] = set()
        orphaned = False
        views: dict[str, QueueView] = {q.name: QueueView() for q in queues}
        nodes = {n.name: n for n in nodes_list}
        held_cache, held_kept = self._held_cache, {}
        for row in holding:
            queue = row.queue
            values = tuple(row)
            hit = held_cache.get(row.id)
            same = hit is not None and hit[0] == values
            placements = hit[2].placements if same else decode_allocation(row.allocation)
            if self.config.live_nodes:
                # A live inventory counts free GPUs (others' pods subtracted): a run placed on GPU 3
                # of a node that now shows 3 keeps counting (the node is widened for this cycle),
                # rather than its GPUs looking free. A node that is gone drops its runs (their
                # pods are gone too; the backend reports them lost and they are requeued).
                for p in placements:
                    node = nodes.get(p.node)
                    if node is not None and p.gpus and max(p.gpus) >= node.gpus:
                        nodes[p.node] = dataclasses.replace(node, gpus=max(p.gpus) + 1)
            if any(p.node not in nodes or any(g >= nodes[p.node].gpus for g in p.gpus) for p in placements):
                warnings.append(f"{D.public_id(row.type, row.id)} holds GPUs that are no longer configured "
                                f"({row.allocation}); not counted")
                continue
            if queue not in self.queue_names:
                queue, orphaned = REMOVED_QUEUE, True
            if same and hit[1] == queue:
                w = hit[2]  # unchanged: the same object (``Snapshot.changes``)
            else:
                w = _model(row, queue, phase=Phase.RELEASING if row.stop_requested_at is not None else Phase.RUNNING,
                           placements=placements, started_at=row.started_at)
                changes.add(w.id)
            held_kept[row.id] = (values, queue, w)
            workloads.append(w)
            models[w.id] = w
            by_id[w.id] = row
            held_now.add(w.id)
            views.setdefault(row.queue, QueueView()).running += 1
        cache, fresh = self._pending_cache, {}
        for row in queued:
            w = cache.get(row.id)
            if w is None or w.submit_time != row.submitted_at:  # a reused id (SQLite without AUTOINCREMENT)
                w = _model(row, row.queue)
                changes.add(w.id)
                if row.id in cache:
                    changes.add(cache[row.id].id)
            fresh[row.id] = w
            workloads.append(w)
            models[w.id] = w
            by_id[w.id] = row
            views.setdefault(row.queue, QueueView()).pending += 1
        changes.update(w.id for rid, w in cache.items() if rid not in fresh)  # no longer queued
        changes.update((self._held_ids or set()) - held_now)  # held then, not now
        self._held_now = held_now
        self._pending_cache = fresh
        self._held_cache = held_kept
        if orphaned:
            queues.append(QueueSpec(name=REMOVED_QUEUE))
        # the same node objects while a node is unchanged (the core keeps what it worked out of
        # the held workloads for one node list)
        last = self._nodes
        node_list = [n if (o := last.get(n.name)) is None or o != n else o for n in nodes.values()]
        self._nodes = {n.name: n for n in node_list}
        return Snapshot(now=now, nodes=node_list, queues=queues, workloads=workloads,
                        reservations=list(reservations),
                        changes=frozenset(changes) if self._held_ids is not None else None,
                        by_id=models), by_id, views

    def explain(self, s: Any, result: CycleResult, by_id: dict[str, Any]) -> int:
        """Store each waiting workload's reason (the sentence is made only when its reason changed);
        returns how many changed."""
        changes = []
        bound = {b.workload for b in result.binds}
        said, self._said = self._said, {}
        for wid, why in result.pending.items():
            row = by_id.get(wid)
            if row is None or wid in bound:
                continue
            hit = said.get(wid)
            reason = hit[1] if hit is not None and hit[0] == why else str(why)
            self._said[wid] = (why, reason)
            if reason != row.reason:
                changes.append({"id": row.id, "reason": reason})
        lifecycle.store_pending_reasons(s, changes)
        return len(changes)


# ---------------------------------------------------------------------- the worker process
_worker: CycleWorker | None = None


def _start(config: WorkerConfig, parent: int) -> None:
    global _worker
    _worker = CycleWorker(config)
    threading.Thread(target=_orphan_watch, args=(parent,), name="gpupool-parent-watch", daemon=True).start()


def _orphan_watch(parent: int) -> None:
    """A worker whose service died (SIGKILL: no shutdown message comes) exits rather than wait
    for work forever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _decide(now: float, nodes: list[NodeSpec], reservations: list[Reservation], usage: dict | None = None) -> Decision:
    assert _worker is not None
    return _worker.decide(now, nodes, reservations, usage)


def _ready() -> int:
    return os.getpid()


class Decider:
    """Runs :meth:`CycleWorker.decide` in a worker process (``in_process``) or in a thread of the
    service. A worker process that dies (killed, out of memory) costs no cycle: that cycle is
    decided in a thread of the service and a new worker process is started for the next. A worker
    that gives no decision within ``timeout`` seconds (hung) is killed and counts as one that died;
    whatever it would have answered is never looked at. Should ``MAX_DEATHS`` workers die one
    after the other (one that cannot start at all), cycles stay in a thread, with an error in the
    log saying so."""

    def __init__(self, config: WorkerConfig, sessions: Any, in_process: bool, timeout: float = 60.0):
        self.config = config
        self.in_process = in_process
        self.timeout = timeout  # c.GPUPool.cycle_timeout
        self.local = CycleWorker(config, sessions)  # the thread path, and the fallback
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ready: concurrent.futures.Future | None = None  # the worker process has started
        self.restarts = 0  # worker processes started again after one died
        self.deaths = 0  # worker processes that died since one last decided a cycle

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn: a fresh interpreter, not a fork of a process running an event loop and threads
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                      initializer=_start, initargs=(self.config, os.getpid()))
        self._ready = pool.submit(_ready)  # the worker starts (imports, opens the database) now, not in the next cycle
        return pool

    def start(self) -> None:
        if self.in_process and self._pool is None:
            self._pool = self._new_pool()

    @staticmethod
    def _kill(pool: concurrent.futures.ProcessPoolExecutor, grace: float = 0.0) -> None:
        """The worker goes: after ``grace`` seconds to finish what it does (it was told to exit),
        SIGTERM, then SIGKILL (a stopped process ignores SIGTERM until it runs again). Whatever
        transaction it had open is rolled back by SQLite (WAL: frames without a commit are never
        read), and its write lock goes with it."""
        procs = list((getattr(pool, "_processes", None) or {}).values())  # no public view of them
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(grace)
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()

    async def decide(self, now: float, nodes: list[NodeSpec], reservations: list[Reservation],
                     usage: dict | None = None) -> Decision:
        loop = asyncio.get_running_loop()
        lost = 0.0
        if self.in_process:
            self.start()
            pool = self._pool
            assert pool is not None
            ready = self._ready
            if ready is not None and not ready.done():
                # a worker process still starting (imports): waiting for it is no work of the
                # service, so it does not lengthen the loop's gap before the next cycle
                t0 = time.perf_counter()
                starting = asyncio.wrap_future(ready)
                starting.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen by the submit below
                await asyncio.wait([starting], timeout=self.timeout)
                lost = time.perf_counter() - t0
            try:  # submit raises too when the worker died while idle
                decision = await asyncio.wait_for(asyncio.wrap_future(pool.submit(_decide, now, nodes, reservations,
                                                                                   usage)),
                                                  max(self.timeout - lost, 0.001))
            except concurrent.futures.process.BrokenProcessPool as e:
                pool.shutdown(wait=False, cancel_futures=True)
                self._lost(f"died ({e})")
            except asyncio.TimeoutError:
                # the awaited future is cancelled (a late answer would land nowhere) and the worker
                # killed: its decision, were it to come, is never applied
                t0 = time.perf_counter()
                await loop.run_in_executor(None, self._kill, pool)
                lost = self.timeout + time.perf_counter() - t0
                self._lost(f"gave no decision in {self.timeout:g} s (c.GPUPool.cycle_timeout) and was killed",
                           error=True)
            else:
                self.deaths = 0
                decision.lost_seconds = lost
                return decision
        decision = await loop.run_in_executor(None, self.local.decide, now, nodes, reservations, usage)
        decision.lost_seconds = lost
        return decision

    def _lost(self, why: str, error: bool = False) -> None:
        """The worker process is gone (died, or killed when hung): this cycle is decided in a
        thread, and a new worker process is started unless MAX_DEATHS went one after the other."""
        self._pool = None
        self.deaths += 1
        # this thread's caches are from before the worker process took over: start afresh
        self.local = CycleWorker(self.config, self.local.sessions)
        if self.deaths >= MAX_DEATHS:
            self.in_process = False
            log.error("the scheduling worker process died %d times in a row (the last %s); cycles run in a "
                      "thread of the service from now on (c.GPUPool.cycle_in_process)", self.deaths, why)
        else:
            (log.error if error else log.warning)("the scheduling worker process %s; this cycle is decided in the "
                                                  "service, and a new worker process is started", why)
            self._pool = self._new_pool()
            self.restarts += 1

    def close(self) -> None:
        """Stop the worker process: an idle one exits at once, a cycle under way gets a few seconds
        (``STOP_GRACE``, or ``timeout`` if shorter) to finish, then it is killed (its decision has
        no one to take it: a hung worker does not hold the service's stop)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            self._kill(pool, grace=min(self.timeout, STOP_GRACE))
