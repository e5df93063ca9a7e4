"""Node pools: each pool is a separate resource, divided among the queues by its own quotas.

A node belongs to one pool (``NodeSpec.pool``); a queue has a quota per pool
(``QueueSpec.in_pool``). One scheduling cycle over several pools runs the cycle of
``core.Scheduler`` once per pool, on that pool's nodes, queues-as-the-pool-sees-them and
workloads, so that every rule (division, reclaim, consolidation, reasons) holds inside a pool and
nothing is taken across pools:

* a running, releasing or reserving workload belongs to the pool of its nodes;
* a pending workload is tried in its pools in order of preference (``Workload.pools``; without one,
  the pools where its queue has the most deserved quota free come first, then the most free GPUs),
  in at most two per cycle: the first *promising* one (free GPUs enough for it, or deserved quota
  of its queue free for it), then the first other one where its queue's deserved quota has room
  for it (else the next promising one). In round 0 every pool's cycle tries the workloads whose
  first try it is; a workload still waiting with no plan in motion moves to its second for round
  1, which runs on that pool's state after round 0 (its binds, evictions and reservations). Two
  tries bound the cost of a cycle over many pools; the pool where its queue is entitled to the
  workload is among them, so what its guarantee promises is tried every cycle;
* a pending workload counts as demand in every pool it may use, in every round: fair shares do not
  depend on the round, so a fallback never makes a pool's division swing within a cycle.

Its waiting reason is the one its most preferred pool gave, naming the pool. Pure: no I/O.
"""
from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from typing import Collection

from .fairshare import EPS
from .model import DEFAULT_POOL, RESOURCES, CycleResult, Phase, Snapshot, Workload
from .reasons import IN_MOTION, Code, Pending

Vec = tuple[float, float, float]
_REQUEST = operator.attrgetter("queue", "pods", "gpus", "gpu_memory", "cpu", "memory")
_POOLS = operator.attrgetter("pools")
_ID = operator.attrgetter("id")


def pool_names(snap: Snapshot) -> list[str]:
    return sorted({n.pool for n in snap.nodes}) or [DEFAULT_POOL]


def is_pooled(snap: Snapshot, naming: Collection[str] | None = None) -> bool:
    """Does this snapshot need the pooled cycle? (One pool named ``default`` and no workload naming
    pools: the plain cycle, exactly as before pools existed.) ``naming``: the ids of the workloads
    that name pools, when they are known (``naming_pools``); else every workload is looked at."""
    pools = {n.pool for n in snap.nodes}
    if pools - {DEFAULT_POOL}:
        return True
    if naming is not None:
        by_id = snap.by_id
        return any(by_id[wid].phase is Phase.PENDING for wid in naming)
    if not any(map(_POOLS, snap.workloads)):  # (read in C: no workload names pools, the usual case)
        return False
    return any(w.pools for w in snap.workloads if w.phase is Phase.PENDING)


def naming_pools(snap: Snapshot, kept: set[str] | None) -> set[str] | None:
    """The ids of the workloads of ``snap`` that name node pools, worked out from ``kept`` (those
    of the last snapshot; None: not known) and the changes alone, when the snapshot names its
    changes and indexes its workloads (``Snapshot.by_id``); else None. ``kept`` is updated."""
    if snap.changes is None or snap.by_id is None:
        return None
    if kept is None:
        return {w.id for w in snap.workloads if w.pools}
    by_id = snap.by_id
    for wid in snap.changes:
        w = by_id.get(wid)
        if w is not None and w.pools:
            kept.add(wid)
        else:
            kept.discard(wid)
    return kept


def _amount(w: Workload, max_mem: int) -> Vec:
    return _amount_of(w.pods, w.gpus, w.gpu_memory, w.cpu, w.memory, max_mem)


def _amount_of(pods: int, gpus: float, gpu_memory: int, cpu: float, memory: int, max_mem: int) -> Vec:
    """What a workload of this request takes of a pool whose largest GPU has ``max_mem``."""
    if gpu_memory > 0:
        gpu = pods * min(1.0, gpu_memory / max_mem) if max_mem else float(pods)
    else:
        gpu = pods * gpus
    return (gpu, cpu * pods, float(memory * pods))


class PooledCycle:
    """One cycle over several node pools; ``run`` returns the merged ``CycleResult``.

    ``scheduler`` is the ``core.Scheduler`` whose ``start``/``act``/``finish`` run the plain
    cycle on each pool: one working context per pool, kept across the rounds."""

    def __init__(self, snap: Snapshot, scheduler, books: dict | None = None):
        self.snap = snap
        self.scheduler = scheduler
        self.books = books or {}  # pool -> (its kept book, the ids its snapshot held): ``run``
        self.pools = pool_names(snap)
        self.nodes = {p: [n for n in snap.nodes if n.pool == p] for p in self.pools}
        self.node_pool = {n.name: n.pool for n in snap.nodes}
        self.queues = {p: [q.in_pool(p) for q in snap.queues] for p in self.pools}
        self.max_mem = {p: max((n.gpu_memory for n in self.nodes[p]), default=0) for p in self.pools}

    def _pool_of(self, placements) -> str:
        for pl in placements:
            p = self.node_pool.get(pl.node)
            if p is not None:
                return p
        return self.pools[0]

    def _preferences(self, pending: list[Workload], held: dict[str, list[Workload]],
                     pinned: dict[str, str], result: CycleResult) -> tuple[dict, dict]:
        """Each pending workload's pools in order of preference (``may``: where it counts as
        demand), and the pools it is tried in this cycle (``tries``, at most two; module doc)."""
        snap = self.snap
        by_name = {q.name: q for q in snap.queues}
        held_gpu: dict[tuple[str, str], float] = {}
        free = {}
        for p in self.pools:
            used = 0.0
            for w in held[p]:
                g = sum(len(pl.gpus) * pl.fraction for pl in w.placements)
                held_gpu[p, w.queue] = held_gpu.get((p, w.queue), 0.0) + g
                if w.phase is Phase.RUNNING:  # a releasing workload's GPUs are as good as free
                    used += g
            free[p] = sum(n.gpus for n in self.nodes[p] if n.schedulable) - used
        deserved: dict[tuple[str, str], float] = {}

        def room(p: str, q: str) -> float:
            """Deserved quota of leaf queue ``q`` in pool ``p`` that it does not hold."""
            key = (p, q)
            if key not in deserved:
                spec = by_name.get(q)
                deserved[key] = spec.in_pool(p).deserved.get("gpu", 0.0) if spec else 0.0
            return deserved[key] - held_gpu.get(key, 0.0)

        order: dict[str, list[str]] = {}
        may: dict[str, list[str]] = {}
        tries: dict[str, list[str]] = {}
        known = set(self.pools)
        max_mem = max(self.max_mem.values())
        memo: dict[tuple, tuple[list[str], list[str]] | None] = {}  # by queue, pools and request
        for w in pending:
            if w.id in pinned:
                may[w.id] = tries[w.id] = [pinned[w.id]]
                continue
            key = (w.queue, w.pools, w.pods, w.gpus, w.gpu_memory)
            hit = memo.get(key, False)
            if hit is False:
                hit = memo[key] = self._tries(w, known, order, room, free, max_mem)
            if hit is None:
                result.pending[w.id] = Pending(Code.NO_POOL, w.queue, 1, {"pools": list(w.pools)})
                continue
            may[w.id], tries[w.id] = hit
        return may, tries

    def _tries(self, w: Workload, known: set[str], order: dict, room, free: dict, max_mem: int):
        """(the pools ``w`` may use, the pools it is tried in this cycle), or None: no such pool."""
        if w.pools:
            prefs = [p for p in w.pools if p in known]
            if not prefs:
                return None
        else:
            prefs = order.get(w.queue)
            if prefs is None:
                prefs = order[w.queue] = sorted(self.pools, key=lambda p: (-max(0.0, room(p, w.queue)), -free[p], p))
        if len(prefs) == 1:
            return prefs, prefs
        # promising pools: free GPUs enough for it, or deserved quota of its queue free for it
        # (a reclaim is due there); the first of them, then the first other one where its queue
        # is entitled to it (so a pool it is entitled in is tried every cycle), else the next
        # promising one
        gpu = _amount(w, max_mem)[0]
        entitled = [p for p in prefs if room(p, w.queue) + EPS >= gpu]
        promising = [p for p in prefs if free[p] + EPS >= gpu or p in entitled]
        if not promising:
            return prefs, prefs[:1]
        second = [p for p in promising[1:] if p in entitled] or promising[1:2]
        return prefs, promising[:1] + second[:1]

    def run(self) -> CycleResult:
        snap, sched = self.snap, self.scheduler
        result = CycleResult()
        held: dict[str, list[Workload]] = {p: [] for p in self.pools}
        pending: list[Workload] = []
        for w in snap.workloads:
            if w.phase is Phase.PENDING:
                pending.append(w)
            else:
                held[self._pool_of(w.placements)].append(w)
        reservations: dict[str, list] = {p: [] for p in self.pools}
        pinned: dict[str, str] = {}
        for r in snap.reservations:
            p = self._pool_of(r.placements)
            reservations[p].append(r)
            if r.bound_at is None:
                pinned[r.workload] = p
        may, tries = self._preferences(pending, held, pinned, result)
        # one context per pool: its held workloads and every pending workload it may try this
        # cycle (they count as its demand); those that only may use it count as extra demand
        mine: dict[str, list[Workload]] = {p: [] for p in self.pools}
        only_may: dict[str, list[tuple]] = {p: [] for p in self.pools}  # their requests (``_REQUEST``)
        for w in pending:
            t = tries.get(w.id)
            if t is None:
                continue
            for p in t:
                mine[p].append(w)
            m = may[w.id]
            if len(m) > len(t):
                rk = _REQUEST(w)  # (read once, not once per pool: most may use several)
                for p in m:
                    if p not in t:
                        only_may[p].append(rk)
        ctxs = {}
        # each pool's pending workloads kept from one cycle to the next as the plain cycle keeps
        # them (waiting.py, held.py), while snapshots name what changed: a pool's snapshot
        # names those and the workloads that came into it or left it
        keep = snap.changes is not None
        books = self.books if keep else {}
        members: dict[str, set[str]] = {}
        for p in self.pools:
            extra: dict[str, list[float]] = {}
            for (q, pods, gpus, gpu_memory, cpu, memory), k in Counter(only_may[p]).items():
                a = _amount_of(pods, gpus, gpu_memory, cpu, memory, self.max_mem[p])
                e = extra.setdefault(q, [0.0, 0.0, 0.0])
                e[0] += k * a[0]
                e[1] += k * a[1]
                e[2] += k * a[2]
            ws = [*held[p], *mine[p]]
            waiting, changes = None, None
            if keep:  # this pool's book from the last cycle, if any: what changed here is named
                ids = members[p] = set(map(_ID, ws))
                book, before = books.get(p, (None, None))
                if book is not None:  # (the changes of its workloads now or before, and those in or out of it)
                    waiting, changes = book, (snap.changes & (ids | before)) | (ids ^ before)
            sub = Snapshot(snap.now, self.nodes[p], self.queues[p], ws, reservations[p], changes=changes)
            ctxs[p] = sched.start(sub, snap.usage.get(p), {q: tuple(v) for q, v in extra.items()}, pool=p,
                                  waiting=waiting, keep=keep)
        # each pool's candidates per round, in its context's order (read before a round narrows
        # ctx.pending)
        rounds: dict[str, tuple[list[Workload], list[Workload]]] = {}
        for p in self.pools:
            r0: list[Workload] = []
            r1: list[Workload] = []
            for w in ctxs[p].pending:
                t = tries[w.id]
                if t[0] == p:
                    r0.append(w)
                elif len(t) > 1 and t[1] == p:
                    r1.append(w)
            rounds[p] = (r0, r1)
        settled: dict[str, str] = {}  # bound, or with a plan in motion: where
        first: dict[str, Pending] = {}  # the reason each workload's first try gave
        for rnd in (0, 1):
            for p in self.pools:
                ctx = ctxs[p]
                cands = rounds[p][rnd]
                if rnd:
                    cands = [w for w in cands if w.id not in settled]
                    if not cands:
                        continue
                    ctx.hold_new_reservations()  # round 0's plans: nobody binds into their room
                sched.act(ctx, cands)
                waiting = ctx.result.pending
                for w in cands:
                    why = waiting.get(w.id)
                    if why is None or w.id in ctx.reservations:
                        settled[w.id] = p  # bound, or a plan in motion
                    elif w.id not in first:
                        first[w.id] = why
        for p in self.pools:
            res = sched.finish(ctxs[p])
            self._merge(p, res, result)
        if keep:
            sched._pool_books = {p: (ctxs[p].waiting, members[p]) for p in self.pools}
            sched.book_mismatches += sum(ctxs[p].book_mismatch for p in self.pools)
        for wid, why in first.items():
            if wid not in settled:
                result.pending[wid] = why
        for wid, p in settled.items():
            why = ctxs[p].result.pending.get(wid)
            if why is None:
                result.pending.pop(wid, None)  # bound
            else:
                result.pending[wid] = why
        self._no_quota(may, result)
        result.pool_fair_share = {p: ctxs[p].result.fair_share for p in self.pools}
        result.pool_allocated = {p: ctxs[p].result.allocated for p in self.pools}
        result.fair_share = _sum_pools(result.pool_fair_share)
        plain = {p: ctxs[p].result.fair_share_plain for p in self.pools if ctxs[p].result.fair_share_plain}
        if plain:  # a pool without usage moves no share: its plain share is its share
            result.pool_fair_share_plain = {p: plain.get(p) or {q: {"gpu": v.get("gpu", 0.0)} for q, v in
                                                                 result.pool_fair_share[p].items()} for p in self.pools}
            result.fair_share_plain = {q: {"gpu": v["gpu"]} for q, v in _sum_pools(result.pool_fair_share_plain).items()}
        result.allocated = _sum_pools(result.pool_allocated)
        return result

    def _merge(self, p: str, res: CycleResult, out: CycleResult) -> None:
        """Take one pool's cycle (all its rounds) into the merged result."""
        where = f" (node pool {p})"
        out.binds.extend(dataclasses.replace(b, reason=b.reason + where) for b in res.binds)
        out.evictions.extend(dataclasses.replace(e, reason=e.reason + where) for e in res.evictions)
        out.dropped.update(res.dropped)
        out.reservations.extend(res.reservations)
        for k, v in res.actions_ms.items():
            out.actions_ms[k] = out.actions_ms.get(k, 0.0) + v
        for wid, pos in res.positions.items():
            out.positions.setdefault(wid, pos)
        out.pending.update(res.pending)  # plans in motion and what waits here only (run() settles the rest)

    def _no_quota(self, prefs: dict[str, list[str]], result: CycleResult) -> None:
        """A workload that waits in every pool it may use because its queue may hold nothing of
        its kind there (a limit of 0, or no deserved quota for non-preemptible work) is told so."""
        specs = None
        for wid, why in list(result.pending.items()):
            if why.code not in (Code.LIMIT, Code.NON_PREEMPTIBLE) or wid not in prefs:
                continue
            d = why.detail
            if specs is None:
                specs = {q.name: q for q in self.snap.queues}
            pools = prefs[wid]
            if why.code is Code.NON_PREEMPTIBLE:
                spec = specs.get(why.queue)
                zero = spec is not None and all(spec.in_pool(p).deserved.get("gpu", 0.0) == 0 for p in pools)
            else:
                spec = specs.get(d.get("at", ""))
                zero = spec is not None and all(spec.in_pool(p).limit.get(d.get("resource", "gpu")) == 0
                                                for p in pools)
            if zero:
                result.pending[wid] = Pending(Code.NO_POOL_QUOTA, why.queue, why.position,
                                              {"pools": pools, "kind": d.get("kind", "")})


def _sum_pools(per_pool: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for shares in per_pool.values():
        for q, amounts in shares.items():
            o = out.setdefault(q, dict.fromkeys(RESOURCES, 0.0))
            for r, v in amounts.items():
                o[r] = o.get(r, 0.0) + v
    return out

