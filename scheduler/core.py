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
from typing import Callable, Iterable

import numpy as np

from .cluster import ClusterState, PodRequest
from .fairshare import EPS, QueueTree, fair_shares
from .model import (MILLI, RESOURCES, Bind, CycleResult, Evict, Phase, PodPlacement, SchedulerConfig, Snapshot,
                    Workload)
from .placement import FirstFit, make_policy
from .units import format_amount
from .victims import lost_gpu_seconds, victim_key

Vec = tuple[float, float, float]  # gpu, cpu, memory
PROBE = FirstFit()  # feasibility probes: "would it fit?" needs no scoring


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


class Candidate:
    """A workload being tried this cycle, with its request resolved."""

    __slots__ = ("w", "req", "amount", "mask", "shape", "failure", "reason")

    def __init__(self, w: Workload, req: PodRequest, amount: Vec, mask: np.ndarray | None):
        self.w, self.req, self.amount, self.mask = w, req, amount, mask
        # workloads with the same shape place identically: a failure for one is a failure for all
        sel = w.node_selector
        self.shape = (req, w.pods, tuple(sorted(sel.items())) if sel else ())
        self.failure = ""  # "quota" | "capacity" | "fragmented"
        self.reason = ""

    def like(self, w: Workload) -> "Candidate":
        """The same request, failure and reason for another workload of the same shape."""
        c = Candidate.__new__(Candidate)
        c.w, c.req, c.amount, c.mask, c.shape = w, self.req, self.amount, self.mask, self.shape
        c.failure, c.reason = self.failure, self.reason
        return c


def raw_key(w: Workload) -> tuple:
    """The request of a pending workload as plain values (cheaper than a Candidate)."""
    sel = w.node_selector
    return (w.gpus, w.gpu_memory, w.cpu, w.memory, w.pods, tuple(sorted(sel.items())) if sel else ())


class Cycle:
    """Working context of one scheduling cycle."""

    def __init__(self, snap: Snapshot, cfg: SchedulerConfig, policies: dict | None = None):
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
        self._reqs: dict[tuple, PodRequest] = {}
        self._masks: dict[tuple, np.ndarray | None] = {}
        self._pending_amounts: dict[tuple, Vec] = {}
        self._topology: list[tuple[str, np.ndarray]] | None = None
        self.amounts: dict[str, Vec] = {}
        leaf_alloc: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        leaf_rel: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        leaf_nonpre: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        demand_leaf: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        shape_count: dict[PodRequest, float] = {}
        self.pending: list[Workload] = []
        self.running: list[Workload] = []
        releasing: list[Workload] = []
        held: list[Workload] = []
        for w in self.workloads:
            amt = self.amounts[w.id] = self.amount(w)
            d = demand_leaf[w.queue]
            d[0] += amt[0]
            d[1] += amt[1]
            d[2] += amt[2]
            rkey = (w.gpus, w.gpu_memory, w.cpu, w.memory)
            shape_count[rkey] = shape_count.get(rkey, 0.0) + w.pods
            if w.phase == Phase.PENDING:
                self.pending.append(w)
                continue
            held.append(w)
            for acc, on in ((leaf_alloc, True), (leaf_nonpre, not w.preemptible),
                            (leaf_rel, w.phase == Phase.RELEASING)):
                if on:
                    v = acc[w.queue]
                    v[0] += amt[0]
                    v[1] += amt[1]
                    v[2] += amt[2]
            (releasing if w.phase == Phase.RELEASING else self.running).append(w)
        # Queue accounting, rolled up to departments. alloc: held (running + releasing + bound this
        # cycle); releasing: part of alloc on its way out; nonpre: held by non-preemptible workloads.
        self.alloc = self._rollup(leaf_alloc)
        self.releasing = self._rollup(leaf_rel)
        self.nonpre = self._rollup(leaf_nonpre)
        self._take_all(held)
        self.future = self.now.copy()
        for w in releasing:
            for p in w.placements:
                self.future.give_placement(p, w)
        self.future_version = 0  # bumped whenever the future view gains room
        cap = (float(self.now.num_gpus[self.now.schedulable].sum()),
               self._capacity(self.now.cpu_total) / MILLI, self._capacity(self.now.mem_total))
        self.capacity = dict(zip(RESOURCES, cap))
        demand = {n: dict(zip(RESOURCES, v)) for n, v in demand_leaf.items()}
        self.fair = fair_shares(self.tree, demand, self.capacity)
        gpu_shapes = {}
        for rkey, count in shape_count.items():
            req = self._req_for(rkey)
            if req.num_gpus:
                gpu_shapes[req] = gpu_shapes.get(req, 0.0) + count
        total = sum(gpu_shapes.values()) or 1.0
        self.shapes = sorted(((r, c / total) for r, c in gpu_shapes.items()), key=lambda rc: rc[0].shape)
        # one policy instance per capacity view (fragmentation-aware policies cache per-node scores
        # and would recompute every row that differs each time the view switched); the Scheduler
        # reuses them across cycles while the workload's shapes are unchanged
        self.policies = policies if policies is not None else {}
        if self.policies.get("shapes") != self.shapes:
            self.policies.clear()
            self.policies["shapes"] = self.shapes
        self.policy = self._policy("now")
        self.failed_shapes: set[tuple] = set()
        self.failed_requests: dict[tuple, Candidate] = {}  # raw request -> the candidate that failed
        self.reasons: dict[tuple, tuple[str, str]] = {}  # capacity reasons by shape, reset on binds
        self.evicted: set[str] = set()
        self.reserved: dict[str, float] = {n: 0.0 for n in names}
        self._vnodes: dict[str, list[tuple[int, int]]] = {}
        self._vcost: dict[str, float] = {}
        self._vkeys: dict[str, tuple] = {}
        self.no_room: set[tuple] = set()  # (shape, future_version) that did not fit the future view
        self.limited = {q: any(self.tree.queues[x].limit for x in self.tree.path(q)) for q in names}

    def _policy(self, view: str):
        pol = self.policies.get(view)
        if pol is None:
            pol = self.policies[view] = make_policy(self.cfg.placement, shapes=self.shapes, seed=self.cfg.seed)
        return pol

    def _take_all(self, held: list[Workload]) -> None:
        """Take every held workload's resources from the ``now`` view in one vectorised step."""
        st = self.now
        nodes, gpus, milli, pod_nodes, cpu, mem = [], [], [], [], [], []
        for w in held:
            c, m = int(round(w.cpu * MILLI)), w.memory
            for p in w.placements:
                n = st.index.get(p.node)
                if n is None:
                    continue
                pod_nodes.append(n)
                cpu.append(c)
                mem.append(m)
                for g in p.gpus:
                    nodes.append(n)
                    gpus.append(g)
                    milli.append(p.milli)
        if nodes:
            np.subtract.at(st.gpu_free, (np.array(nodes), np.array(gpus)), np.array(milli, dtype=np.int64))
        if pod_nodes:
            idx = np.array(pod_nodes)
            np.subtract.at(st.cpu_free, idx, np.array(cpu, dtype=np.int64))
            np.subtract.at(st.mem_free, idx, np.array(mem, dtype=np.int64))

    def _rollup(self, leaf: dict[str, list[float]]) -> dict[str, Vec]:
        out = {n: [0.0, 0.0, 0.0] for n in self.tree.queues}
        for q, v in leaf.items():
            if v[0] or v[1] or v[2]:
                for x in self.tree.path(q):
                    o = out[x]
                    o[0] += v[0]
                    o[1] += v[1]
                    o[2] += v[2]
        return {n: (v[0], v[1], v[2]) for n, v in out.items()}

    def request(self, w: Workload) -> PodRequest:
        return self._req_for((w.gpus, w.gpu_memory, w.cpu, w.memory))

    def _req_for(self, key: tuple) -> PodRequest:
        r = self._reqs.get(key)
        if r is None:
            gpus, gpu_memory, cpu, memory = key
            r = self._reqs[key] = PodRequest.for_workload(Workload("", "", gpus=gpus, gpu_memory=gpu_memory,
                                                                   cpu=cpu, memory=memory))
        return r

    def mask(self, selector: dict[str, str]) -> np.ndarray | None:
        if not selector:
            return None
        key = tuple(sorted(selector.items()))
        if key not in self._masks:
            self._masks[key] = self.now.node_mask(selector)
        return self._masks[key]

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
            return (gpu, w.cpu * w.pods, float(w.memory * w.pods))
        key = (w.pods, w.gpus, w.gpu_memory, w.cpu, w.memory)
        amt = self._pending_amounts.get(key)
        if amt is None:
            amt = self._pending_amounts[key] = self._pending_amount(w)
        return amt

    def _pending_amount(self, w: Workload) -> Vec:
        if w.gpu_memory > 0:
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
        """GPUs above fair share (negative: below), counting room reserved for its pending
        workloads that wait for preempted ones to release."""
        return self.effective(q)[0] + self.reserved[q] + extra - self.fair[q].get("gpu", 0.0)

    def claim(self, c: "Candidate") -> None:
        """``c`` will take room in the future view: count it against its queues' fair share."""
        for q in self.tree.path(c.w.queue):
            self.reserved[q] += c.amount[0]

    # -- placement -------------------------------------------------------------------------------
    def candidate(self, w: Workload) -> Candidate:
        return Candidate(w, self.request(w), self.amounts.get(w.id) or self.amount(w), self.mask(w.node_selector))

    def place(self, c: Candidate, st: Statement, probe: bool = False) -> tuple[PodPlacement, ...] | None:
        """Place every pod of ``c`` on ``st.state`` (all or none; a gang prefers one topology
        domain). On success the pods are placed through ``st``; on failure nothing changed.
        ``probe``: only the answer matters (does it fit?), so take the first feasible node
        instead of scoring every node with the placement policy."""
        policy = PROBE if probe else (self._policy("future") if st.state is self.future else self.policy)
        domains = self._domains(c) if c.w.pods > 1 else [None]
        for dmask in domains:
            mask = c.mask if dmask is None else (dmask if c.mask is None else (dmask & c.mask))
            mark = len(st.ops)
            placements = []
            for i in range(c.w.pods):
                choice = policy.choose(st.state, c.req, mask)
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
        """Topology domains to try for a gang: those with enough free GPU milli in all, tightest
        first (bin-packing across domains), then the whole cluster."""
        if self._topology is None:
            key = self.cfg.topology_key
            labels = [n.labels.get(key) for n in self.now.nodes]
            values = sorted({v for v in labels if v is not None})
            arr = np.array([v if v is not None else "" for v in labels], dtype=object)
            self._topology = [(v, arr == v) for v in values] if len(values) >= 2 else []
        if not self._topology:
            return [None]
        need = c.req.gpu_milli_total * c.w.pods
        free = [(int(self.now.gpu_free[d].sum()), v, d) for v, d in self._topology]
        return [d for f, v, d in sorted(free, key=lambda t: (t[0], t[1])) if f >= need] + [None]

    # -- quota checks ----------------------------------------------------------------------------
    def quota_block(self, c: Candidate) -> str:
        """Why quota alone stops ``c`` now (empty: quota allows it)."""
        w, amt = c.w, c.amount
        for q in self.tree.path(w.queue) if self.limited[w.queue] else ():
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
        key = c.shape
        hit = self.reasons.get(key)
        if hit is None:
            hit = self.reasons[key] = self._capacity_reason(c)
        return hit

    def _capacity_reason(self, c: Candidate) -> tuple[str, str]:
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
        off = int((~self.now.schedulable & (self.now.num_gpus > 0)).sum())
        aside = f" ({off} node{'s' if off != 1 else ''} with GPUs not schedulable)" if off else ""
        return "capacity", f"waiting for {what}{gang}: {free:g} free in the cluster{aside}"

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
        self.reasons.clear()  # free capacity changed

    def victim_nodes(self, v: Workload) -> list[tuple[int, int]]:
        """(node index, milli held there) for each node the workload runs on (cached)."""
        hit = self._vnodes.get(v.id)
        if hit is None:
            per: dict[int, int] = {}
            for p in v.placements:
                n = self.future.index.get(p.node)
                if n is not None:
                    per[n] = per.get(n, 0) + p.milli * len(p.gpus)
            hit = self._vnodes[v.id] = sorted(per.items())
        return hit

    def victim_cost(self, v: Workload) -> float:
        hit = self._vcost.get(v.id)
        if hit is None:
            hit = self._vcost[v.id] = lost_gpu_seconds(v, self.now_t, self.amounts[v.id][0])
        return hit

    def victim_order(self, workloads: Iterable[Workload]) -> list[Workload]:
        """``victims.victim_order`` with the per-workload keys computed once per cycle."""
        keys = self._vkeys
        out = list(workloads)
        for v in out:
            if v.id not in keys:
                keys[v.id] = victim_key(v, self.now_t, self.amounts[v.id][0], self.over(v.queue))
        out.sort(key=lambda v: keys[v.id])
        return out

    def future_place(self, c: Candidate, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.future.take_placement(p, c.w)

    def evict(self, v: Workload, cause: str, reason: str, by: str | None) -> None:
        self.evicted.add(v.id)
        self.future_version += 1
        amt = self.amounts[v.id]
        for q in self.tree.path(v.queue):
            self.releasing[q] = _add(self.releasing[q], amt)
        self.result.evictions.append(Evict(v.id, cause, reason, by))


# ---------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------

def _queue_order(ctx: Cycle) -> Callable[[str], tuple]:
    """Hierarchical order: compare the queues' ancestries level by level from the root. At each
    level queues below their deserved quota come first (guarantees before borrowing), then by GPUs
    held above fair share (furthest below first), then queue priority. These are the measures
    reclaim's rules use, so what a reclaim frees ranks the reclaimer first, never the victim."""
    const = {x: (spec.deserved.get("gpu", 0.0) - EPS, ctx.fair[x].get("gpu", 0.0), -spec.priority)
             for x, spec in ctx.tree.queues.items()}
    alloc, releasing, reserved = ctx.alloc, ctx.releasing, ctx.reserved

    def key(q: str) -> tuple:
        out = []
        for x in ctx.tree.path(q):
            deserved, fair, prio = const[x]
            held = alloc[x][0] - releasing[x][0] + reserved[x]  # == ctx.effective(x)[0] + reserved
            out.append((held >= deserved, held - fair, prio, x))
        return tuple(out)
    return key


def _by_queue(ctx: Cycle, workloads: Iterable[Workload]) -> dict[str, list[Workload]]:
    out: dict[str, list[Workload]] = {}
    for w in workloads:
        out.setdefault(w.queue, []).append(w)
    for lst in out.values():
        lst.sort(key=lambda w: (-w.priority, w.submit_time, w.id))
    return out


def allocate(ctx: Cycle) -> list[Candidate]:
    """Bind pending workloads where they fit now. Returns the candidates that did not fit.

    Two passes. The first binds only workloads that keep their queue, at every level, within its
    fair share; the second lends what is still idle to the rest (work-conserving borrowing).
    So GPUs freed by a reclaim go to the queue that is owed them, never back to the victim's
    queue (which would then be reclaimed again). In each pass queues are served furthest below
    their fair share first (hierarchically), and within a queue by priority, then submit time."""
    queues = _by_queue(ctx, ctx.pending)
    positions = ctx.result.positions
    for lst in queues.values():
        for pos, w in enumerate(lst, 1):
            positions[w.id] = pos
    failed: list[Candidate] = []
    deferred: dict[str, list[Workload]] = {}
    _allocate_pass(ctx, queues, failed, deferred)
    _allocate_pass(ctx, deferred, failed, None)
    for c in failed:
        ctx.result.pending[c.w.id] = f"queued in {c.w.queue}: position {positions[c.w.id]}, {c.reason}"
    return failed


def _allocate_pass(ctx: Cycle, queues: dict[str, list[Workload]], failed: list[Candidate],
                   deferred: dict[str, list[Workload]] | None) -> None:
    """One allocate pass. With ``deferred``, workloads that would take their queue above its fair
    share are set aside there instead of tried.

    A queue keeps its turn through consecutive failures (the order between queues only changes
    when something binds), and a shape that failed to place is not tried again this cycle:
    capacity only shrinks during allocate."""
    key = _queue_order(ctx)
    heap = [(key(q), q, 0) for q in queues]
    heapq.heapify(heap)
    dead = ctx.failed_shapes
    dead_raw = ctx.failed_requests
    while heap:
        k, q, i = heapq.heappop(heap)
        fresh = key(q)
        if fresh > k:  # binds elsewhere in its department raised its key: requeue lazily
            heapq.heappush(heap, (fresh, q, i))
            continue
        lst = queues[q]
        n = len(lst)
        check_quota = ctx.limited[q]
        path = ctx.tree.path(q)
        bound = False
        while i < n and not bound:
            w = lst[i]
            i += 1
            if not check_quota and w.preemptible:  # quota cannot stop it: only capacity can
                template = dead_raw.get(raw_key(w))
                if template is not None:
                    failed.append(template.like(w))
                    continue
            c = ctx.candidate(w)
            block = ctx.quota_block(c) if (check_quota or not w.preemptible) else ""
            if block:
                c.failure, c.reason = "quota", f"waiting: {block}"
                failed.append(c)
                continue
            if deferred is not None and c.amount[0] > 0 and any(ctx.over(x, c.amount[0]) > EPS for x in path):
                deferred.setdefault(q, []).append(w)  # beyond its fair share: only if still idle later
                continue
            shape = c.shape
            if shape not in dead:
                st = Statement(ctx, ctx.now)
                placements = ctx.place(c, st)
                if placements is not None:
                    st.commit()
                    ctx.future_place(c, placements)
                    ctx.bind(c, placements)
                    bound = True
                    continue
                dead.add(shape)
            c.failure, c.reason = ctx.capacity_reason(c)
            dead_raw.setdefault(raw_key(w), c)
            failed.append(c)
        if i < n:
            heapq.heappush(heap, (key(q), q, i))


def _pipeline(ctx: Cycle, c: Candidate) -> bool:
    """If ``c`` fits once releasing workloads have stopped, reserve that room and say so."""
    key = (c.shape, ctx.future_version)
    if key in ctx.no_room:
        return False
    st = Statement(ctx, ctx.future)
    placements = None
    if ctx.place(c, st, probe=True) is not None:  # cheap feasibility first, then score
        st.rollback()
        placements = ctx.place(c, st)
    if placements is None:
        ctx.no_room.add(key)
        return False
    st.commit()
    ctx.claim(c)
    ctx.result.pending[c.w.id] = (f"queued in {c.w.queue}: position {ctx.result.positions.get(c.w.id, 1)}, "
                                  f"waiting for preempted workloads to release "
                                  f"{format_amount('gpu', c.amount[0])} (grace period up to "
                                  f"{ctx.cfg.preemption_grace:g}s)")
    return True


class Budget:
    """Which victims a plan may take. The default takes any (priority preemption in a queue)."""

    def reset(self) -> None:
        pass

    def allows(self, v: Workload) -> bool:
        return True

    def take(self, v: Workload) -> None:
        pass


class ReclaimBudget(Budget):
    """Which borrowers a reclaim may take, checked in O(1) per victim. Queues are compared where
    their ancestries split (the reclaimer's side and the victim's side). Either rule suffices:

    * guarantee: the reclaimer's side ends within its deserved quota, and the victim's side still
      holds more than its own deserved quota before this victim goes (only borrowed capacity is
      taken back, even if a whole gang must go);
    * fair share: the victim's side ends strictly better off, relative to its fair share, than
      the reclaimer's side was before, and keeps its deserved quota.

    Neither allows the reverse move afterwards, and allocation ranks queues by the same measures
    (below deserved first, then GPUs above fair share), so what a reclaim frees goes to the
    reclaimer and capacity never ping-pongs. Victims already taken in the plan
    count against their side. ``refused`` names the last side a victim was refused for."""

    def __init__(self, ctx: Cycle, reclaimer: str, amount: float):
        self.ctx, self.reclaimer, self.amount = ctx, reclaimer, amount
        self.sides: dict[str, tuple] = {}  # victim queue -> (side, its over, its held, its deserved,
        #                                    reclaimer side's over, reclaimer side within deserved after)
        self.gone: dict[str, float] = {}
        self.refused = ""

    def _side(self, queue: str) -> tuple:
        hit = self.sides.get(queue)
        if hit is None:
            ctx = self.ctx
            aq, ap = ctx.tree.split(self.reclaimer, queue)
            held_q = ctx.effective(aq)[0] + ctx.reserved[aq] + self.amount
            hit = self.sides[queue] = (
                ap, ctx.over(ap), ctx.effective(ap)[0] + ctx.reserved[ap],
                ctx.tree.queues[ap].deserved.get("gpu", 0.0), ctx.over(aq),
                held_q <= ctx.tree.queues[aq].deserved.get("gpu", 0.0) + EPS)
        return hit

    def candidate_side(self, queue: str) -> bool:
        """Could any workload of ``queue`` be a victim (before any is taken)?"""
        _, over, held, deserved, _, guaranteed = self._side(queue)
        return over > EPS or (guaranteed and held > deserved + EPS)

    def reset(self) -> None:
        self.gone.clear()

    def allows(self, v: Workload) -> bool:
        side, over, held, deserved, reclaimer_before, guaranteed = self._side(v.queue)
        gone = self.gone.get(side, 0.0)
        amt = self.ctx.amounts[v.id][0]
        if guaranteed and held - gone > deserved + EPS:
            return True  # guarantee: take borrowed capacity back
        if over - gone - amt > reclaimer_before + EPS and held - gone - amt >= deserved - EPS:
            return True  # fair share: rebalance over-quota capacity, never the victim's guarantee
        self.refused = side
        return False

    def take(self, v: Workload) -> None:
        side = self._side(v.queue)[0]
        self.gone[side] = self.gone.get(side, 0.0) + self.ctx.amounts[v.id][0]


def _fits(ctx: Cycle, c: Candidate, mask: np.ndarray | None = None) -> bool:
    probe = Statement(ctx, ctx.future)
    cand = c if mask is None else Candidate(c.w, c.req, c.amount, mask if c.mask is None else (mask & c.mask))
    if ctx.place(cand, probe, probe=True) is None:
        return False
    probe.rollback()
    return True


def _make_room(ctx: Cycle, c: Candidate, victims: list[Workload],
               budget: Budget) -> list[Workload] | None:
    """The victims (from ``victims``, in preference order, each accepted by ``budget``) whose
    removal from the future view lets ``c`` fit, losing the least work. On success the victims are
    removed and ``c`` is placed in the future view; on failure the view is unchanged.

    A single-pod workload is planned node by node (its pod needs room on one node): the cheapest
    victim set of each node is found and the node that loses the least work wins. A gang is
    planned greedily over the whole cluster, then unnecessary victims are pruned."""
    plan = _plan_single(ctx, c, victims, budget) if c.w.pods == 1 else _plan_gang(ctx, c, victims, budget)
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


def fits_on(state: ClusterState, n: int, req: PodRequest) -> bool:
    """Does one pod of ``req`` fit on node ``n`` now? (O(GPUs), no scoring.)"""
    if state.cpu_free[n] < req.cpu_milli or state.mem_free[n] < req.memory:
        return False
    if req.num_gpus == 0:
        return True
    milli = state.milli_on(n, req)
    return milli <= MILLI and int((state.gpu_free[n] >= milli).sum()) >= req.num_gpus


def _plan_single(ctx: Cycle, c: Candidate, victims: list[Workload],
                 budget: Budget) -> tuple[list[Workload], np.ndarray] | None:
    fut = ctx.future
    on_node: dict[int, list[Workload]] = {}
    room: dict[int, int] = {}  # milli the node's candidates hold there
    for v in victims:  # already in victim order, so each node's list is too
        for n, milli in ctx.victim_nodes(v):
            on_node.setdefault(n, []).append(v)
            room[n] = room.get(n, 0) + milli
    need = c.req.gpu_milli_total if not c.req.gpu_memory else 1
    best: tuple[tuple, list[Workload], int] | None = None
    free = fut.gpu_free.sum(axis=1)
    for n in sorted(on_node):
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        if int(free[n]) + room[n] < need:  # even evicting all of them is not enough
            continue
        st = Statement(ctx, fut)
        chosen: list[Workload] = []
        budget.reset()
        for v in on_node[n]:
            if not budget.allows(v):
                continue
            st.remove(v, v.placements)
            budget.take(v)
            chosen.append(v)
            if fits_on(fut, n, c.req):
                cost = (sum(ctx.victim_cost(x) for x in chosen), -min(ctx.over(x.queue) for x in chosen),
                        len(chosen), fut.nodes[n].name)
                if best is None or cost < best[0]:
                    best = (cost, list(chosen), n)
                break
        st.rollback()
    if best is None:
        return None
    only = np.zeros(len(fut.nodes), dtype=bool)
    only[best[2]] = True
    return best[1], only


def _fits_without(ctx: Cycle, c: Candidate, gone: list[Workload]) -> bool:
    st = Statement(ctx, ctx.future)
    for v in gone:
        st.remove(v, v.placements)
    ok = _fits(ctx, c)
    st.rollback()
    return ok


def _plan_gang(ctx: Cycle, c: Candidate, victims: list[Workload],
               budget: Budget) -> tuple[list[Workload], None] | None:
    st = Statement(ctx, ctx.future)
    chosen: list[Workload] = []
    need = c.amount[0]
    freed = float(ctx.future.gpu_free[ctx.future.schedulable].sum()) / MILLI
    found = False
    budget.reset()
    for v in victims:
        if not budget.allows(v):
            continue
        st.remove(v, v.placements)
        budget.take(v)
        chosen.append(v)
        freed += ctx.amounts[v.id][0]
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
    """A queue below its fair share takes back borrowed capacity, comparing queues where their
    ancestries split; ``ReclaimBudget`` says which borrowers may go (no ping-pong)."""
    left: list[Candidate] = []
    pool: dict[str, list[Workload]] = {}
    for v in _preemptible_running(ctx):
        pool.setdefault(v.queue, []).append(v)
    tried: dict[tuple, str] = {}  # (shape, queue) that found no victims this cycle -> why not
    headroom: dict[str, float] = {}  # GPUs a queue may still take up to its fair share
    groups: dict[str, list[Candidate]] = {}
    for c in failed:
        groups.setdefault(c.w.queue, []).append(c)
    todo: list[Candidate] = []
    for q, lst in groups.items():
        headroom[q] = -ctx.over(q)
        if headroom[q] > EPS:
            todo.extend(lst)
        else:  # at or above its fair share: nothing to reclaim for this queue
            left.extend(lst)
    for c in todo:
        w = c.w
        room = headroom[w.queue]
        if c.failure == "quota" or c.amount[0] <= 0 or c.amount[0] > room + EPS:
            left.append(c)  # quota-bound, or the reclaimer would end above its fair share
            continue
        if _pipeline(ctx, c):
            headroom[w.queue] = room - c.amount[0]
            continue
        key = (c.shape, w.queue)
        if key in tried:
            _explain_refusal(ctx, c, tried[key])
            left.append(c)
            continue
        budget = ReclaimBudget(ctx, w.queue, c.amount[0])
        cands = []
        for p, vs in pool.items():
            if p != w.queue and budget.candidate_side(p):
                cands.extend(v for v in vs if v.id not in ctx.evicted)
        cands = ctx.victim_order(cands)
        victims = _make_room(ctx, c, cands, budget) if cands else None
        if victims is None:
            why = ""
            if budget.refused:
                why = (f"not reclaiming: the borrowed GPUs that would make room belong to {budget.refused}, "
                       f"and taking them would leave it further below its fair share than {w.queue} is")
            tried[key] = why
            _explain_refusal(ctx, c, why)
            left.append(c)
            continue
        ctx.claim(c)
        headroom[w.queue] = room - c.amount[0]
        fair = format_amount("gpu", ctx.fair[w.queue].get("gpu", 0.0))
        for v in victims:
            ap, _, held, deserved = budget.sides[v.queue][:4]
            ctx.evict(v, "reclaim", (f"preempted: reclaimed by queue {w.queue}, which is below its fair share "
                                     f"({fair}); {ap} holds {held:g} GPUs (deserved {deserved:g}, fair share "
                                     f"{ctx.fair[ap].get('gpu', 0.0):g})"), w.id)
        ctx.result.pending[w.id] = (f"queued in {w.queue}: position {ctx.result.positions.get(w.id, 1)}, "
                                    f"reclaiming {format_amount('gpu', c.amount[0])} from other queues; "
                                    f"starts when the preempted workloads have checkpointed")
    return left


def _explain_refusal(ctx: Cycle, c: Candidate, why: str) -> None:
    if why:
        ctx.result.pending[c.w.id] = (f"queued in {c.w.queue}: position {ctx.result.positions.get(c.w.id, 1)}, "
                                      f"{c.reason}; {why}")


def preempt(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    """Within a queue, a higher-priority workload preempts lower-priority preemptible ones."""
    left: list[Candidate] = []
    by_queue: dict[str, list[Workload]] = {}
    for v in _preemptible_running(ctx):
        by_queue.setdefault(v.queue, []).append(v)
    lowest = {q: min(v.priority for v in vs) for q, vs in by_queue.items()}
    tried: set[tuple] = set()
    for c in failed:
        w = c.w
        if (c.failure == "quota" or (c.amount[0] <= 0 and c.amount[1] <= 0)
                or lowest.get(w.queue, w.priority) >= w.priority):
            left.append(c)
            continue
        if _pipeline(ctx, c):
            continue
        key = (c.shape, w.queue, w.priority)
        if key in tried:
            left.append(c)
            continue
        cands = [v for v in by_queue[w.queue] if v.priority < w.priority and v.id not in ctx.evicted]
        cands = ctx.victim_order(cands)
        victims = _make_room(ctx, c, cands, Budget()) if cands else None
        if victims is None:
            tried.add(key)
            left.append(c)
            continue
        ctx.claim(c)
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
    on_node: dict[str, list[Workload]] = {}
    for w in _preemptible_running(ctx):
        if w.pods == 1 and w.placements:
            on_node.setdefault(w.placements[0].node, []).append(w)
    tried: set[tuple] = set()
    for c in failed:
        if c.failure != "fragmented" or c.w.pods != 1 or c.req.num_gpus == 0:
            left.append(c)
            continue
        if _pipeline(ctx, c):
            continue
        key = (c.shape, ctx.future_version)
        if key in tried or not _consolidate_one(ctx, c, on_node):
            tried.add(key)
            left.append(c)
    return left


def _consolidate_one(ctx: Cycle, c: Candidate, on_node: dict[str, list[Workload]]) -> bool:
    fut = ctx.future
    need = c.amount[0]
    nodes = []
    for name, movers in on_node.items():
        n = fut.index[name]
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        movers = [v for v in movers if v.id not in ctx.evicted]
        room = fut.gpu_free[n].sum() / MILLI + sum(ctx.amounts[v.id][0] for v in movers)
        if movers and room + EPS >= need:
            nodes.append((-float(fut.gpu_free[n].sum()), name, n, movers))
    for _, name, n, movers in sorted(nodes):
        victims = ctx.victim_order(movers)
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
        ok = True  # every moved workload must fit elsewhere (not on n)
        for v in chosen:
            vc = ctx.candidate(v)
            vc.mask = ~only_n if vc.mask is None else (vc.mask & ~only_n)
            if ctx.place(vc, st) is None:
                ok = False
                break
        if not ok:
            st.rollback()
            continue
        st.commit()
        ctx.claim(c)
        for v in chosen:
            ctx.evict(v, "consolidation", (f"preempted: moved to another node to make room for {c.w.id} "
                                           f"({format_amount('gpu', need)} on one node); "
                                           f"restarts from its checkpoint"), c.w.id)
        ctx.result.pending[c.w.id] = (f"queued in {c.w.queue}: position {ctx.result.positions.get(c.w.id, 1)}, "
                                      f"consolidating: moving {len(chosen)} workload(s) off node {name} to fit it")
        return True
    return False


ACTIONS = {"allocate": allocate, "consolidate": consolidate, "reclaim": reclaim, "preempt": preempt}


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
        self.timer = timer

    def schedule(self, snapshot: Snapshot) -> CycleResult:
        clock = self.timer
        t0 = clock() if clock else 0.0
        ctx = Cycle(snapshot, self.config, self._policies)
        if clock:
            t1 = clock()
            ctx.result.actions_ms["snapshot"] = (t1 - t0) * 1e3
        failed: list[Candidate] = []
        for name in self.config.actions:
            if name == "allocate":
                failed = allocate(ctx)
            else:
                failed = ACTIONS[name](ctx, failed)
            if clock:
                t2 = clock()
                ctx.result.actions_ms[name] = (t2 - t1) * 1e3
                t1 = t2
        for w in snapshot.workloads:
            if w.queue not in ctx.tree.queues and w.phase == Phase.PENDING:
                ctx.result.pending[w.id] = f"waiting: queue {w.queue!r} does not exist"
        ctx.result.fair_share = ctx.fair
        ctx.result.allocated = {q: dict(zip(RESOURCES, ctx.alloc[q])) for q in ctx.tree.queues}
        return ctx.result
