"""Node pools: each pool is a separate resource, divided among the queues by its own quotas.

A node belongs to one pool (``NodeSpec.pool``); a queue has a quota per pool
(``QueueSpec.in_pool``). One scheduling cycle over several pools runs the cycle of
``core.Scheduler`` once per pool, on that pool's nodes, queues-as-the-pool-sees-them and
workloads, so that every rule (division, reclaim, consolidation, reasons) holds inside a pool and
nothing is taken across pools:

* a running, releasing or reserving workload belongs to the pool of its nodes;
* a pending workload is tried in its pools in order of preference (``Workload.pools``; without one,
  the pools where its queue has the most deserved quota free come first, then the most free GPUs):
  in round 0 every pool's cycle tries the workloads that prefer it; a workload still waiting with
  no plan in motion moves to its next pool for round 1, and so on. A later round of a pool runs on
  that pool's state after its earlier rounds (their binds, evictions and reservations);
* a pending workload counts as demand in every pool it may use, in every round: fair shares do not
  depend on the round, so a fallback never makes a pool's division swing within a cycle.

Its waiting reason is the one its most preferred pool gave, naming the pool. Pure: no I/O.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .model import (DEFAULT_POOL, RESOURCES, CycleResult, Phase, QueueSpec, Snapshot, Workload)
from .reasons import IN_MOTION, Code, Pending

Vec = tuple[float, float, float]


def pool_names(snap: Snapshot) -> list[str]:
    return sorted({n.pool for n in snap.nodes}) or [DEFAULT_POOL]


def is_pooled(snap: Snapshot) -> bool:
    """Does this snapshot need the pooled cycle? (One pool named ``default`` and no workload naming
    pools: the plain cycle, exactly as before pools existed.)"""
    pools = {n.pool for n in snap.nodes}
    if pools - {DEFAULT_POOL}:
        return True
    return any(w.pools for w in snap.workloads if w.phase is Phase.PENDING)


def _amount(w: Workload, max_mem: int) -> Vec:
    if w.gpu_memory > 0:
        gpu = w.pods * min(1.0, w.gpu_memory / max_mem) if max_mem else float(w.pods)
    else:
        gpu = w.pods * w.gpus
    return (gpu, w.cpu * w.pods, float(w.memory * w.pods))


class PooledCycle:
    """One cycle over several node pools; ``run`` returns the merged ``CycleResult``.

    ``run_pool(snapshot, usage, extra_demand, pool)`` runs the plain cycle on one pool's snapshot
    (``core.Scheduler._run_one``)."""

    def __init__(self, snap: Snapshot, run_pool: Callable[..., CycleResult]):
        self.snap = snap
        self.run_pool = run_pool
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
                     pinned: dict[str, str], result: CycleResult) -> dict[str, list[str]]:
        """Each pending workload's pools, in order of preference (module doc)."""
        snap = self.snap
        by_name = {q.name: q for q in snap.queues}
        held_gpu: dict[tuple[str, str], float] = {}
        free = {}
        for p in self.pools:
            used = 0.0
            for w in held[p]:
                g = sum(len(pl.gpus) * pl.fraction for pl in w.placements)
                held_gpu[p, w.queue] = held_gpu.get((p, w.queue), 0.0) + g
                used += g
            free[p] = sum(n.gpus for n in self.nodes[p] if n.schedulable) - used
        order: dict[str, list[str]] = {}
        out: dict[str, list[str]] = {}
        known = set(self.pools)
        for w in pending:
            if w.id in pinned:
                out[w.id] = [pinned[w.id]]
                continue
            if w.pools:
                prefs = [p for p in w.pools if p in known]
                if not prefs:
                    result.pending[w.id] = Pending(Code.NO_POOL, w.queue, 1, {"pools": list(w.pools)})
                    continue
                out[w.id] = prefs
                continue
            prefs = order.get(w.queue)
            if prefs is None:
                spec = by_name.get(w.queue)

                def key(p: str) -> tuple:
                    deserved = spec.in_pool(p).deserved.get("gpu", 0.0) if spec else 0.0
                    return (-max(0.0, deserved - held_gpu.get((p, w.queue), 0.0)), -free[p], p)
                prefs = order[w.queue] = sorted(self.pools, key=key)
            out[w.id] = prefs
        return out

    def run(self) -> CycleResult:
        snap = self.snap
        result = CycleResult()
        held: dict[str, list[Workload]] = {p: [] for p in self.pools}
        pending: list[Workload] = []
        for w in snap.workloads:
            if w.phase is Phase.PENDING:
                pending.append(w)
            else:
                held[self._pool_of(w.placements)].append(w)
        reservations = {p: [] for p in self.pools}
        pinned: dict[str, str] = {}
        for r in snap.reservations:
            p = self._pool_of(r.placements)
            reservations[p].append(r)
            if r.bound_at is None:
                pinned[r.workload] = p
        prefs = self._preferences(pending, held, pinned, result)
        alive = [w for w in pending if w.id in prefs]
        amount = {w.id: {p: _amount(w, self.max_mem[p]) for p in prefs[w.id]} for w in alive}
        holders: dict[str, list[Workload]] = {p: [] for p in self.pools}  # settled: plan in motion
        first: dict[str, Pending] = {}  # the reason each workload's most preferred pool gave
        fair: dict[str, dict] = {}
        alloc: dict[str, dict] = {}
        bound_here: dict[str, set[str]] = {p: set() for p in self.pools}  # bound in an earlier round
        rnd = 0
        while True:
            cands: dict[str, list[Workload]] = {p: [] for p in self.pools}
            for w in alive:
                cands[prefs[w.id][rnd]].append(w)
            todo = self.pools if rnd == 0 else [p for p in self.pools if cands[p]]
            if not todo:
                break
            for p in todo:
                mine = {w.id for w in cands[p]}
                extra: dict[str, list[float]] = {}
                for w in alive:
                    if w.id not in mine and p in amount[w.id]:
                        a, e = amount[w.id][p], extra.setdefault(w.queue, [0.0, 0.0, 0.0])
                        e[0] += a[0]
                        e[1] += a[1]
                        e[2] += a[2]
                sub = Snapshot(snap.now, self.nodes[p], self.queues[p], [*held[p], *holders[p], *cands[p]],
                               reservations[p])
                res = self.run_pool(sub, snap.usage.get(p), {q: tuple(v) for q, v in extra.items()},
                                    frozenset(bound_here[p]))
                self._merge(p, res, result, held, holders, cands[p], first)
                bound_here[p].update(b.workload for b in res.binds)
                reservations[p] = res.reservations
                fair[p], alloc[p] = res.fair_share, res.allocated
            settled = {w.id for p in self.pools for w in holders[p]} | {b.workload for b in result.binds}
            rnd += 1
            alive = [w for w in alive if w.id not in settled and len(prefs[w.id]) > rnd]
            if not alive:
                break
        for wid, why in first.items():
            if wid not in result.pending or result.pending[wid].code not in IN_MOTION:
                result.pending[wid] = why
        for b in result.binds:
            result.pending.pop(b.workload, None)
        self._no_quota(prefs, result)
        result.reservations = [r for p in self.pools for r in reservations[p]]
        result.pool_fair_share, result.pool_allocated = fair, alloc
        result.fair_share = _sum_pools(fair)
        result.allocated = _sum_pools(alloc)
        return result

    def _merge(self, p: str, res: CycleResult, out: CycleResult, held: dict[str, list[Workload]],
               holders: dict[str, list[Workload]], cands: list[Workload], first: dict[str, Pending]) -> None:
        """Take one pool's cycle into the merged result and that pool's state for its next round."""
        now = self.snap.now
        where = f" (node pool {p})"
        out.binds.extend(dataclasses.replace(b, reason=b.reason + where) for b in res.binds)
        out.evictions.extend(dataclasses.replace(e, reason=e.reason + where) for e in res.evictions)
        out.dropped.update(res.dropped)
        for k, v in res.actions_ms.items():
            out.actions_ms[k] = out.actions_ms.get(k, 0.0) + v
        for wid, pos in res.positions.items():
            out.positions.setdefault(wid, pos)
        if res.binds or res.evictions:
            bound = {b.workload: b for b in res.binds}
            evicted = {e.workload for e in res.evictions}
            new_held = []
            for w in held[p]:
                if w.id in evicted:
                    w = dataclasses.replace(w, phase=Phase.RELEASING)
                new_held.append(w)
            for w in [*holders[p], *cands]:
                b = bound.get(w.id)
                if b is not None:
                    new_held.append(dataclasses.replace(w, phase=Phase.RUNNING, placements=b.placements,
                                                        started_at=now))
            held[p] = new_held
            holders[p] = [w for w in holders[p] if w.id not in bound]
        planned = {r.workload for r in res.reservations if r.bound_at is None}
        for w in cands:
            why = res.pending.get(w.id)
            if why is None:
                continue
            why = why._replace(detail={**why.detail, "pool": p})
            if w.id in planned:
                holders[p].append(w)
                out.pending[w.id] = why
            else:
                first.setdefault(w.id, why)
        for w in holders[p]:
            why = res.pending.get(w.id)
            if why is not None and w.id not in out.pending:
                out.pending[w.id] = why._replace(detail={**why.detail, "pool": p})

    def _no_quota(self, prefs: dict[str, list[str]], result: CycleResult) -> None:
        """A workload that waits in every pool it may use because its queue may hold nothing of
        its kind there (a limit of 0, or no deserved quota for non-preemptible work) is told so."""
        for wid, why in list(result.pending.items()):
            if why.code not in (Code.LIMIT, Code.NON_PREEMPTIBLE) or wid not in prefs:
                continue
            d = why.detail
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


def queues_in(queues: list[QueueSpec], pool: str) -> list[QueueSpec]:
    return [q.in_pool(pool) for q in queues]
