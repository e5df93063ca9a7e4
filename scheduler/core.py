"""The scheduling cycle: a snapshot in, decisions out.

Modelled on KAI-Scheduler: each cycle builds a working context from the snapshot and runs named
actions in order (allocate, consolidate, reclaim, preempt). An action makes tentative moves through
a ``Statement``; the moves commit or roll back as a unit, so a gang never half-starts and a
reclaim that cannot make room evicts nobody. Policies are small separate pieces:
``fairshare`` (the division), ``placement`` (node/GPU scoring) and ``victims`` (who loses least).

Two capacity views are kept per cycle:

* ``now``: what is physically held (running and releasing workloads); allocate binds here.
* ``future``: what will be held once every releasing workload has stopped; reclaim, preempt and
  consolidate plan here, and a pending workload that fits in ``future`` waits for the release
  ("pipelined") instead of evicting anyone else.

docs/scheduling.md states the promises this code keeps.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from .cluster import ClusterState, PodRequest
from .fairshare import EPS, QueueTree, fair_shares
from .model import (MILLI, RESOURCES, Bind, CycleResult, Evict, Phase, PodPlacement, SchedulerConfig, Snapshot,
                    Workload)
from .placement import make_policy
from .units import format_amount
from .victims import lost_gpu_seconds, victim_order

Vec = tuple[float, float, float]  # gpu, cpu, memory
ZERO: Vec = (0.0, 0.0, 0.0)


def _add(a: Vec, b: Vec, sign: float = 1.0) -> Vec:
    return (a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2])


class Statement:
    """Tentative moves on one capacity view and the queue accounting; ``rollback`` undoes them."""

    def __init__(self, ctx: "Cycle", state: ClusterState):
        self.ctx = ctx
        self.state = state
        self.ops: list[tuple[str, Workload, tuple[PodPlacement, ...]]] = []

    def place(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.state.take_placement(p, w)
        self.ops.append(("place", w, placements))

    def remove(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.state.give_placement(p, w)
        self.ops.append(("remove", w, placements))

    def rollback(self, to: int = 0) -> None:
        """Undo the moves made after the first ``to`` (all of them by default)."""
        while len(self.ops) > to:
            op, w, placements = self.ops.pop()
            for p in placements:
                if op == "place":
                    self.state.give_placement(p, w)
                else:
                    self.state.take_placement(p, w)

    def commit(self) -> list[tuple[str, Workload, tuple[PodPlacement, ...]]]:
        ops, self.ops = self.ops, []
        return ops


@dataclass
class Candidate:
    w: Workload
    req: PodRequest
    amount: Vec
    mask: np.ndarray | None
    failure: str = ""  # "quota" | "capacity" | "fragmented" | ""
    reason: str = ""


class Cycle:
    """Working context of one scheduling cycle."""

    def __init__(self, snap: Snapshot, cfg: SchedulerConfig):
        self.snap = snap
        self.cfg = cfg
        self.now_t = snap.now
        self.tree = QueueTree(snap.queues)
        self.now = ClusterState(snap.nodes)
        self.result = CycleResult()
        self.max_gpu_mem = int(self.now.gpu_mem.max()) if len(self.now.gpu_mem) else 0
        self.workloads = [w for w in snap.workloads if w.queue in self.tree.queues]
        self.by_id = {w.id: w for w in self.workloads}
        # Queue accounting, rolled up to departments. alloc: held (running + releasing + bound this
        # cycle); releasing: part of alloc on its way out; nonpre: held by non-preemptible workloads.
        names = list(self.tree.queues)
        self.alloc: dict[str, Vec] = {n: ZERO for n in names}
        self.releasing: dict[str, Vec] = {n: ZERO for n in names}
        self.nonpre: dict[str, Vec] = {n: ZERO for n in names}
        demand_leaf: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        self.pending: list[Workload] = []
        self.running: list[Workload] = []
        for w in self.workloads:
            amt = self.amount(w)
            d = demand_leaf[w.queue]
            d[0] += amt[0]
            d[1] += amt[1]
            d[2] += amt[2]
            if w.phase == Phase.PENDING:
                self.pending.append(w)
                continue
            for p in w.placements:
                self.now.take_placement(p, w)
            self._account(w, amt, +1)
            if w.phase == Phase.RELEASING:
                for q in self.tree.path(w.queue):
                    self.releasing[q] = _add(self.releasing[q], amt)
            else:
                self.running.append(w)
        self.future = self.now.copy()
        for w in self.workloads:
            if w.phase == Phase.RELEASING:
                for p in w.placements:
                    self.future.give_placement(p, w)
        cap = (float(self.now.num_gpus[self.now.schedulable].sum()),
               self._capacity(self.now.cpu_total) / MILLI, self._capacity(self.now.mem_total))
        self.capacity = dict(zip(RESOURCES, cap))
        demand = {n: dict(zip(RESOURCES, v)) for n, v in demand_leaf.items()}
        self.fair = fair_shares(self.tree, demand, self.capacity)
        self.shapes = self._shapes()
        self.policy = make_policy(cfg.placement, shapes=self.shapes, seed=cfg.seed)
        self.failed_shapes: set[tuple] = set()
        self.evicted: set[str] = set()

    # -- accounting ------------------------------------------------------------------------------
    def _capacity(self, totals: np.ndarray) -> float:
        sched = totals[self.now.schedulable]
        if (sched >= np.int64(2**59)).any():
            return float("inf")
        return float(sched.sum())

    def amount(self, w: Workload) -> Vec:
        """What the workload holds (or, pending, is expected to hold): GPUs, cores, bytes."""
        if w.placements:
            gpu = sum(len(p.gpus) * p.fraction for p in w.placements)
        elif w.gpu_memory > 0:
            gpu = w.pods * min(1.0, w.gpu_memory / self.max_gpu_mem) if self.max_gpu_mem else float(w.pods)
        else:
            gpu = w.pods * w.gpus
        return (gpu, w.cpu * w.pods, float(w.memory * w.pods))

    def _account(self, w: Workload, amt: Vec, sign: int) -> None:
        for q in self.tree.path(w.queue):
            self.alloc[q] = _add(self.alloc[q], amt, sign)
            if not w.preemptible:
                self.nonpre[q] = _add(self.nonpre[q], amt, sign)

    def effective(self, q: str) -> Vec:
        """Held and staying: allocation less what is being released."""
        return _add(self.alloc[q], self.releasing[q], -1)

    def over(self, q: str, extra: float = 0.0) -> float:
        """GPUs above fair share (negative: below)."""
        return self.effective(q)[0] + extra - self.fair[q].get("gpu", 0.0)

    def _shapes(self) -> list[tuple[PodRequest, float]]:
        counts: dict[PodRequest, float] = {}
        for w in self.workloads:
            r = PodRequest.for_workload(w)
            if r.num_gpus:
                counts[r] = counts.get(r, 0.0) + w.pods
        total = sum(counts.values()) or 1.0
        return sorted(((r, c / total) for r, c in counts.items()), key=lambda rc: rc[0].shape)

    # -- placement -------------------------------------------------------------------------------
    def candidate(self, w: Workload) -> Candidate:
        mask = self.now.node_mask(w.node_selector)
        return Candidate(w, PodRequest.for_workload(w), self.amount(w), mask)

    def place(self, c: Candidate, st: Statement) -> tuple[PodPlacement, ...] | None:
        """Place every pod of ``c`` on ``st.state`` (all or none; a gang prefers one topology
        domain). On success the pods are placed through ``st``; on failure nothing changed."""
        domains = self._domains(c) if c.w.pods > 1 else [None]
        for dmask in domains:
            mask = c.mask if dmask is None else (dmask if c.mask is None else (dmask & c.mask))
            mark = len(st.ops)
            placements = []
            for i in range(c.w.pods):
                choice = self.policy.choose(st.state, c.req, mask)
                if choice is None:
                    break
                node, gpus, milli = choice
                p = PodPlacement(i, st.state.nodes[node].name, tuple(int(g) for g in gpus),
                                 milli / MILLI if c.req.num_gpus else 0.0)
                st.place(c.w, (p,))
                placements.append(p)
            if len(placements) == c.w.pods:
                return tuple(placements)
            st.rollback(mark)  # undo this domain's partial gang
        return None

    def _domains(self, c: Candidate) -> list[np.ndarray | None]:
        key = self.cfg.topology_key
        labels = [n.labels.get(key) for n in self.now.nodes]
        values = sorted({v for v in labels if v is not None})
        if len(values) < 2:
            return [None]
        arr = np.array([v if v is not None else "" for v in labels], dtype=object)
        doms = [arr == v for v in values]
        # tightest domain that could hold the gang first (bin-packing across domains)
        free = [int(self.now.gpu_free[d].sum()) for d in doms]
        order = sorted(range(len(values)), key=lambda i: (free[i], values[i]))
        return [doms[i] for i in order] + [None]

    # -- quota checks ----------------------------------------------------------------------------
    def quota_block(self, c: Candidate) -> str:
        """Why quota alone stops ``c`` now (empty: quota allows it)."""
        w, amt = c.w, c.amount
        for q in self.tree.path(w.queue):
            spec = self.tree.queues[q]
            for i, res in enumerate(RESOURCES):
                lim = spec.limit.get(res)
                if lim is not None and amt[i] > 0 and self.alloc[q][i] + amt[i] > lim + EPS:
                    return (f"queue {q} at its limit {format_amount(res, lim)} "
                            f"({format_amount(res, self.alloc[q][i])} in use)")
        if not w.preemptible:
            spec = self.tree.queues[w.queue]
            for i, res in enumerate(RESOURCES):
                if amt[i] <= 0 or (res != "gpu" and res not in spec.deserved):
                    continue
                deserved = spec.deserved.get(res, 0.0)
                if self.nonpre[w.queue][i] + amt[i] > deserved + EPS:
                    return (f"{w.kind} workloads run only within the deserved quota: {w.queue} deserves "
                            f"{format_amount(res, deserved)} and {format_amount(res, self.nonpre[w.queue][i])} "
                            f"of it is held by non-preemptible workloads")
        return ""

    def capacity_reason(self, c: Candidate) -> tuple[str, str]:
        need = c.amount[0]
        if c.mask is not None and not c.mask.any():
            sel = ", ".join(f"{k}={v}" for k, v in c.w.node_selector.items())
            return "capacity", f"no node matches node_selector {sel}"
        if need <= 0:
            return "capacity", "waiting for CPU or memory on a node"
        free = self.now.gpu_free[self.now.schedulable & (c.mask if c.mask is not None else True)].sum() / MILLI
        what = format_amount("gpu", need)
        gang = f" ({c.w.pods} pods started together)" if c.w.pods > 1 else ""
        if free + EPS >= need:
            return "fragmented", (f"waiting for {what}{gang}: {free:g} GPUs are free but not on one node "
                                  f"in the shape requested")
        return "capacity", f"waiting for {what}{gang}: {free:g} free in the cluster"

    # -- binding ---------------------------------------------------------------------------------
    def bind(self, c: Candidate, placements: tuple[PodPlacement, ...]) -> None:
        w = c.w
        before = self.alloc[w.queue][0]
        deserved = self.tree.queues[w.queue].deserved.get("gpu", 0.0)
        amt = (sum(len(p.gpus) * p.fraction for p in placements), c.amount[1], c.amount[2])
        self._account(w, amt, +1)
        over = w.preemptible and before + amt[0] > deserved + EPS and amt[0] > 0
        if over:
            reason = (f"borrowing idle GPUs beyond {w.queue}'s deserved {format_amount('gpu', deserved)}; "
                      f"may be preempted when their owners need them")
        else:
            reason = f"within the deserved quota of {w.queue}"
        self.result.binds.append(Bind(w.id, placements, reason, over_quota=over))
        self.result.pending.pop(w.id, None)

    def future_place(self, c: Candidate, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.future.take_placement(p, c.w)

    def evict(self, v: Workload, cause: str, reason: str, by: str | None) -> None:
        self.evicted.add(v.id)
        amt = self.amount(v)
        for q in self.tree.path(v.queue):
            self.releasing[q] = _add(self.releasing[q], amt)
        self.result.evictions.append(Evict(v.id, cause, reason, by))


# ---------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------

def _queue_order(ctx: Cycle) -> Callable[[str], tuple]:
    def key(q: str) -> tuple:
        fair = ctx.fair[q].get("gpu", 0.0)
        eff = ctx.effective(q)[0]
        ratio = eff / fair if fair > EPS else (0.0 if eff <= EPS else float("inf"))
        return (ratio, -ctx.tree.queues[q].priority, q)
    return key


def _by_queue(ctx: Cycle, workloads: Iterable[Workload]) -> dict[str, list[Workload]]:
    out: dict[str, list[Workload]] = {}
    for w in workloads:
        out.setdefault(w.queue, []).append(w)
    for lst in out.values():
        lst.sort(key=lambda w: (-w.priority, w.submit_time, w.id))
    return out


def allocate(ctx: Cycle) -> list[Candidate]:
    """Bind pending workloads where they fit now, queues furthest below their fair share first;
    within a queue by priority, then submit time. Returns the candidates that did not fit."""
    queues = _by_queue(ctx, ctx.pending)
    for lst in queues.values():
        for pos, w in enumerate(lst, 1):
            ctx.result.positions[w.id] = pos
    key = _queue_order(ctx)
    heap = [(key(q), q, 0) for q in queues]
    heapq.heapify(heap)
    failed: list[Candidate] = []
    while heap:
        _, q, i = heapq.heappop(heap)
        lst = queues[q]
        w = lst[i]
        c = ctx.candidate(w)
        block = ctx.quota_block(c)
        if block:
            c.failure, c.reason = "quota", f"waiting: {block}"
        else:
            shape = (c.req.shape, w.pods, tuple(sorted(w.node_selector.items())))
            placements = None
            if shape not in ctx.failed_shapes:
                st = Statement(ctx, ctx.now)
                placements = ctx.place(c, st)
                if placements is not None:
                    st.commit()
                    ctx.future_place(c, placements)
                    ctx.bind(c, placements)
                else:
                    ctx.failed_shapes.add(shape)
            if placements is None:
                c.failure, c.reason = ctx.capacity_reason(c)
        if c.failure:
            failed.append(c)
            ctx.result.pending[w.id] = f"queued in {q}: position {ctx.result.positions[w.id]}, {c.reason}"
        if i + 1 < len(lst):
            heapq.heappush(heap, (key(q), q, i + 1))
    return failed


def _pipeline(ctx: Cycle, c: Candidate) -> bool:
    """If ``c`` fits once releasing workloads have stopped, reserve that room and say so."""
    st = Statement(ctx, ctx.future)
    placements = ctx.place(c, st)
    if placements is None:
        return False
    st.commit()
    ctx.result.pending[c.w.id] = (f"queued in {c.w.queue}: position {ctx.result.positions.get(c.w.id, 1)}, "
                                  f"waiting for preempted workloads to release "
                                  f"{format_amount('gpu', c.amount[0])} (grace period up to "
                                  f"{ctx.cfg.preemption_grace:g}s)")
    return True


def _fits(ctx: Cycle, c: Candidate, mask: np.ndarray | None = None) -> bool:
    probe = Statement(ctx, ctx.future)
    cand = c if mask is None else Candidate(c.w, c.req, c.amount, mask if c.mask is None else (mask & c.mask))
    if ctx.place(cand, probe) is None:
        return False
    probe.rollback()
    return True


def _make_room(ctx: Cycle, c: Candidate, victims: list[Workload],
               allowed: Callable[[list[Workload], Workload], bool]) -> list[Workload] | None:
    """The victims (from ``victims``, in preference order, each accepted by ``allowed``) whose
    removal from the future view lets ``c`` fit, losing the least work. On success the victims are
    removed and ``c`` is placed in the future view; on failure the view is unchanged.

    A single-pod workload is planned node by node (its pod needs room on one node): the cheapest
    victim set of each node is found and the node that loses the least work wins. A gang is
    planned greedily over the whole cluster, then unnecessary victims are pruned."""
    plan = _plan_single(ctx, c, victims, allowed) if c.w.pods == 1 else _plan_gang(ctx, c, victims, allowed)
    if plan is None:
        return None
    chosen, mask = plan
    st = Statement(ctx, ctx.future)
    for v in chosen:
        st.remove(v, v.placements)
    cand = c if mask is None else Candidate(c.w, c.req, c.amount, mask if c.mask is None else (mask & c.mask))
    if ctx.place(cand, st) is None:  # cannot happen: the plan was probed
        st.rollback()
        return None
    st.commit()
    return chosen


def _plan_single(ctx: Cycle, c: Candidate, victims: list[Workload],
                 allowed: Callable[[list[Workload], Workload], bool]) -> tuple[list[Workload], np.ndarray] | None:
    fut = ctx.future
    on_node: dict[int, list[Workload]] = {}
    for v in victims:
        for n in sorted({fut.index[p.node] for p in v.placements if p.node in fut.index}):
            on_node.setdefault(n, []).append(v)
    best: tuple[tuple, list[Workload], np.ndarray] | None = None
    for n, vs in sorted(on_node.items()):
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        only = np.zeros(len(fut.nodes), dtype=bool)
        only[n] = True
        st = Statement(ctx, fut)
        chosen: list[Workload] = []
        for v in vs:
            if not allowed(chosen, v):
                continue
            st.remove(v, v.placements)
            chosen.append(v)
            if _fits(ctx, c, only):
                cost = (sum(lost_gpu_seconds(x, ctx.now_t, ctx.amount(x)[0]) for x in chosen), len(chosen),
                        fut.nodes[n].name)
                if best is None or cost < best[0]:
                    best = (cost, list(chosen), only)
                break
        st.rollback()
    return None if best is None else (best[1], best[2])


def _fits_without(ctx: Cycle, c: Candidate, gone: list[Workload]) -> bool:
    st = Statement(ctx, ctx.future)
    for v in gone:
        st.remove(v, v.placements)
    ok = _fits(ctx, c)
    st.rollback()
    return ok


def _plan_gang(ctx: Cycle, c: Candidate, victims: list[Workload],
               allowed: Callable[[list[Workload], Workload], bool]) -> tuple[list[Workload], None] | None:
    st = Statement(ctx, ctx.future)
    chosen: list[Workload] = []
    need = c.amount[0]
    freed = float(ctx.future.gpu_free[ctx.future.schedulable].sum()) / MILLI
    found = False
    for v in victims:
        if not allowed(chosen, v):
            continue
        st.remove(v, v.placements)
        chosen.append(v)
        freed += ctx.amount(v)[0]
        if freed + EPS >= need and _fits(ctx, c):
            found = True
            break
    st.rollback()
    if not found:
        return None
    for v in list(reversed(chosen)):  # prune victims that turned out unnecessary (latest first)
        rest = [x for x in chosen if x is not v]
        if _fits_without(ctx, c, rest):
            chosen = rest
    return chosen, None


def _preemptible_running(ctx: Cycle) -> list[Workload]:
    t = ctx.now_t
    return [w for w in ctx.running
            if w.preemptible and w.id not in ctx.evicted
            and (w.started_at is None or t - w.started_at >= ctx.cfg.min_runtime)]


def reclaim(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    """A queue below its fair share takes back borrowed capacity from queues above theirs,
    compared where their ancestries split; the victim side never ends further below its fair
    share than the reclaimer (no ping-pong)."""
    left: list[Candidate] = []
    pool = _preemptible_running(ctx)
    tried: set[tuple] = set()
    for c in failed:
        w = c.w
        if c.failure == "quota" or c.amount[0] <= 0:
            left.append(c)
            continue
        if _pipeline(ctx, c):
            continue
        if ctx.over(w.queue, c.amount[0]) > EPS:  # would end above its fair share
            left.append(c)
            continue
        shape = (c.req.shape, w.pods, w.queue, tuple(sorted(w.node_selector.items())))
        if shape in tried:
            left.append(c)
            continue
        cands = [v for v in pool if v.id not in ctx.evicted and v.queue != w.queue]
        cands = [v for v in cands if ctx.over(ctx.tree.split(w.queue, v.queue)[1]) > EPS]
        cands = victim_order(cands, ctx.now_t, ctx.amount)
        removed: dict[str, float] = {}

        def allowed(chosen: list[Workload], v: Workload) -> bool:
            aq, ap = ctx.tree.split(w.queue, v.queue)
            gone = sum(ctx.amount(x)[0] for x in chosen if ctx.tree.split(w.queue, x.queue)[1] == ap)
            victim_after = ctx.over(ap) - gone - ctx.amount(v)[0]
            reclaimer_after = ctx.over(aq, c.amount[0])
            return victim_after >= reclaimer_after - EPS

        victims = _make_room(ctx, c, cands, allowed)
        if victims is None:
            tried.add(shape)
            left.append(c)
            continue
        for v in victims:
            ap = ctx.tree.split(w.queue, v.queue)[1]
            ctx.evict(v, "reclaim", (f"preempted: reclaimed by queue {w.queue} (below its fair share of "
                                     f"{format_amount('gpu', ctx.fair[w.queue].get('gpu', 0.0))}; "
                                     f"{ap} is above its own)"), w.id)
            removed[v.id] = 1
        ctx.result.pending[w.id] = (f"queued in {w.queue}: position {ctx.result.positions.get(w.id, 1)}, "
                                    f"reclaiming {format_amount('gpu', c.amount[0])} from other queues; "
                                    f"starts when the preempted workloads have checkpointed")
    return left


def preempt(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    """Within a queue, a higher-priority workload preempts lower-priority preemptible ones."""
    left: list[Candidate] = []
    pool = _preemptible_running(ctx)
    for c in failed:
        w = c.w
        if c.failure == "quota" or (c.amount[0] <= 0 and c.amount[1] <= 0):
            left.append(c)
            continue
        if _pipeline(ctx, c):
            continue
        cands = [v for v in pool if v.queue == w.queue and v.priority < w.priority and v.id not in ctx.evicted]
        cands = victim_order(cands, ctx.now_t, ctx.amount)
        victims = _make_room(ctx, c, cands, lambda chosen, v: True) if cands else None
        if victims is None:
            left.append(c)
            continue
        for v in victims:
            ctx.evict(v, "priority", (f"preempted: higher-priority {w.kind} workload {w.id} (priority "
                                      f"{w.priority}) needs the GPUs in queue {w.queue}"), w.id)
        ctx.result.pending[w.id] = (f"queued in {w.queue}: position {ctx.result.positions.get(w.id, 1)}, "
                                    f"preempting lower-priority workloads; starts when they have checkpointed")
    return left


def consolidate(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    """A pending single-pod workload that fits the free GPUs but not on any one node: move
    preemptible workloads (checkpoint, restart elsewhere) to open one node for it."""
    left: list[Candidate] = []
    for c in failed:
        if c.failure != "fragmented" or c.w.pods != 1 or c.req.num_gpus == 0:
            left.append(c)
            continue
        if _pipeline(ctx, c):
            continue
        if not _consolidate_one(ctx, c):
            left.append(c)
    return left


def _consolidate_one(ctx: Cycle, c: Candidate) -> bool:
    fut = ctx.future
    movable = [w for w in _preemptible_running(ctx) if w.pods == 1 and w.placements]
    on_node: dict[str, list[Workload]] = {}
    for w in movable:
        on_node.setdefault(w.placements[0].node, []).append(w)
    order = sorted(range(len(fut.nodes)), key=lambda n: (-int(fut.gpu_free[n].sum()), fut.nodes[n].name))
    for n in order:
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        name = fut.nodes[n].name
        victims = victim_order(on_node.get(name, []), ctx.now_t, ctx.amount)
        if not victims:
            continue
        st = Statement(ctx, fut)
        only_n = np.zeros(len(fut.nodes), dtype=bool)
        only_n[n] = True
        chosen: list[Workload] = []
        placed = None
        for v in victims:
            st.remove(v, v.placements)
            chosen.append(v)
            cn = Candidate(c.w, c.req, c.amount, only_n if c.mask is None else (only_n & c.mask))
            placed = ctx.place(cn, st)
            if placed is not None:
                break
        if placed is None:
            st.rollback()
            continue
        # every moved workload must fit elsewhere (not on n)
        ok = True
        for v in chosen:
            vc = ctx.candidate(v)
            elsewhere = ~only_n if vc.mask is None else (vc.mask & ~only_n)
            vc.mask = elsewhere
            if ctx.place(vc, st) is None:
                ok = False
                break
        if not ok:
            st.rollback()
            continue
        st.commit()
        for v in chosen:
            ctx.evict(v, "consolidation", (f"preempted: moved to another node to make room for {c.w.id} "
                                           f"({format_amount('gpu', c.amount[0])} on one node); "
                                           f"restarts from its checkpoint"), c.w.id)
        ctx.result.pending[c.w.id] = (f"queued in {c.w.queue}: position {ctx.result.positions.get(c.w.id, 1)}, "
                                      f"consolidating: moving {len(chosen)} workload(s) off node {name} to fit it")
        return True
    return False


ACTIONS = {"allocate": allocate, "consolidate": consolidate, "reclaim": reclaim, "preempt": preempt}


class Scheduler:
    """``Scheduler(config).schedule(snapshot) -> CycleResult``: one cycle, no side effects."""

    def __init__(self, config: SchedulerConfig | None = None):
        self.config = config or SchedulerConfig()
        for a in self.config.actions:
            if a not in ACTIONS:
                raise ValueError(f"unknown action {a!r} (choose from {', '.join(ACTIONS)})")
        make_policy(self.config.placement)  # validate the name early

    def schedule(self, snapshot: Snapshot) -> CycleResult:
        ctx = Cycle(snapshot, self.config)
        failed: list[Candidate] = []
        for name in self.config.actions:
            if name == "allocate":
                failed = allocate(ctx)
            else:
                failed = ACTIONS[name](ctx, failed)
        for w in snapshot.workloads:
            if w.queue not in ctx.tree.queues and w.phase == Phase.PENDING:
                ctx.result.pending[w.id] = f"waiting: queue {w.queue!r} does not exist"
        ctx.result.fair_share = ctx.fair
        ctx.result.allocated = {q: dict(zip(RESOURCES, ctx.alloc[q])) for q in ctx.tree.queues}
        return ctx.result
