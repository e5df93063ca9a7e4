"""The scheduling cycle: a snapshot in, decisions out.

Modelled on KAI-Scheduler: each cycle builds a working context from the snapshot (``cycle.Cycle``:
capacity views, queue accounting, the reservations carried from the last cycle, taken in
by ``intake``) and runs named
actions in order, one module each under ``actions/`` (allocate, consolidate, reclaim, preempt).
An action makes tentative moves through a ``Statement``, records a waiting reason on the
candidates it leaves waiting (``code``, ``detail``), and calls ``ctx.wait`` for those it takes
out of the list (a plan in motion); the moves, accounting included, commit
or roll back as a unit, so a gang never half-starts and a reclaim that cannot make room evicts
nobody. Policies are small separate pieces: ``fairshare`` (the division), ``placement``
(node/GPU scoring), ``victims`` (who loses least) and the budgets of ``plan`` (who may go).

docs/scheduling.md states the promises this code keeps.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .actions.allocate import allocate
from .actions.consolidate import consolidate
from .actions.preempt import preempt
from .actions.reclaim import reclaim
from .cycle import SINCE, Candidate, Cycle
from .model import DEFAULT_POOL, RESOURCES, CycleResult, Phase, SchedulerConfig, Snapshot
from .placement import make_policy
from .pools import PooledCycle, is_pooled, naming_pools
from .reasons import Code, Pending
from .waiting import WaitingBook

Action = Callable[[Cycle, list[Candidate]], list[Candidate]]
ACTIONS: dict[str, Action] = {"allocate": allocate, "consolidate": consolidate, "reclaim": reclaim,
                              "preempt": preempt}


class Scheduler:
    """``Scheduler(config).schedule(snapshot) -> CycleResult``: one cycle, no side effects.

    ``timer``: an optional clock (e.g. ``time.perf_counter``) injected by an adapter that wants
    ``CycleResult.actions_ms`` filled; the core never reads a clock of its own."""

    def __init__(self, config: SchedulerConfig | None = None, timer: Callable[[], float] | None = None):
        self.config = config or SchedulerConfig()
        for a in self.config.actions:
            if a not in ACTIONS:
                raise ValueError(f"unknown action {a!r} (choose from {', '.join(ACTIONS)})")
        make_policy(self.config.placement)  # validate the name early
        self._policies: dict = {}  # placement policies kept across cycles (they cache per-node scores)
        self._pool_policies: dict[str, dict] = {}  # the same, one set per node pool
        # the pending workloads as the last snapshot had them, kept while snapshots say what
        # changed (``Snapshot.changes``; waiting.py); None: none kept
        self._waiting: WaitingBook | None = None
        # the same per node pool (pools.py): pool -> (its book, the ids its snapshot held)
        self._pool_books: dict[str, tuple[WaitingBook, set[str]]] = {}
        # the ids of the workloads that name node pools, kept the same way (``pools.naming_pools``)
        self._naming: set[str] | None = None
        self.book_mismatches = 0  # cycles whose kept book the snapshot's changes left wrong (made afresh)
        self.timer = timer

    def schedule(self, snapshot: Snapshot) -> CycleResult:
        kept, self._waiting = self._waiting, None  # (kept again only once this cycle is through)
        pool_books, self._pool_books = self._pool_books, {}
        self._naming = naming = naming_pools(snapshot, self._naming)
        if is_pooled(snapshot, naming):
            return PooledCycle(snapshot, self, pool_books).run()  # (it keeps them again once through)
        if any(q.pools for q in snapshot.queues):  # one pool, `default`: its quota may be in `pools`
            snapshot = dataclasses.replace(snapshot, queues=[q.in_pool(DEFAULT_POOL) for q in snapshot.queues])
        keep = snapshot.changes is not None
        ctx = self.start(snapshot, snapshot.usage.get(DEFAULT_POOL), waiting=kept if keep else None, keep=keep)
        self.act(ctx)
        result = self.finish(ctx)
        if keep:
            self._waiting = ctx.waiting
            self.book_mismatches += ctx.book_mismatch
        return result

    def start(self, snapshot: Snapshot, usage: dict | None = None, extra_demand: dict | None = None,
              pool: str | None = None, waiting: WaitingBook | None = None, keep: bool = False) -> Cycle:
        """The working context of one cycle over ``snapshot`` (all of it one node pool);
        ``waiting``, ``keep``: see ``Cycle``."""
        clock = self.timer
        t0 = clock() if clock else 0.0
        policies = self._policies if pool is None else self._pool_policies.setdefault(pool, {})
        ctx = Cycle(snapshot, self.config, policies, usage, extra_demand, waiting, keep)
        ctx.pool = pool
        if clock:
            ctx.result.actions_ms["snapshot"] = (clock() - t0) * 1e3
        return ctx

    def act(self, ctx: Cycle, pending: list | None = None) -> None:
        """Run the actions on ``ctx``: over its pending workloads, or over ``pending`` (a later
        round of a node pool's cycle: more candidates, tried on the state the earlier left)."""
        if pending is not None:
            ctx.pending = pending
        clock = self.timer
        t1 = clock() if clock else 0.0
        ms = ctx.result.actions_ms
        failed: list[Candidate] = []
        for name in self.config.actions:
            failed = ACTIONS[name](ctx, failed)
            if clock:
                t2 = clock()
                ms[name] = ms.get(name, 0.0) + (t2 - t1) * 1e3
                t1 = t2
        ctx.wait_all(failed)  # still waiting after every action: the reason the last one gave

    def finish(self, ctx: Cycle) -> CycleResult:
        snapshot = ctx.snap
        if len(ctx.workloads) < len(snapshot.workloads):
            for w in snapshot.workloads:
                if w.queue not in ctx.tree.queues and w.phase == Phase.PENDING:
                    ctx.result.pending[w.id] = Pending(Code.NO_QUEUE, w.queue)
        ctx.result.reservations = sorted([*ctx.reservations.values(), *ctx.settling.values()], key=SINCE)
        ctx.result.fair_share = ctx.fair
        if ctx.fair_plain is not None:
            ctx.result.fair_share_plain = {q: {"gpu": v.get("gpu", 0.0)} for q, v in ctx.fair_plain.items()}
        ctx.result.allocated = {q: dict(zip(RESOURCES, ctx.alloc[q])) for q in ctx.tree.queues}
        return ctx.result
