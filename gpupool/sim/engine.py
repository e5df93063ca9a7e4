"""Discrete-event replay of a scenario through the real scheduler.

Only the clock and the backend are simulated; every decision comes from
``gpupool.scheduler.Scheduler.schedule(snapshot)``, driven through the same adapter contract the hub
and the Kubernetes backend keep (see scheduler/model.py):

* a cycle every ``config.cycle`` seconds on the simulated clock (cycle times are multiples of it);
  when a cycle decided nothing (no bind, no eviction), nothing can change until the next event
  (a submission, a finish, the end of a grace period, the end of a ``min_runtime`` protection),
  so the replay jumps to the first cycle at or after that event. ``scheduling_cycles`` counts the
  cycles actually run.
* ``Bind``: the workload starts on exactly those placements (RUNNING, ``started_at`` = now).
* ``Evict``: the workload is asked to checkpoint (RELEASING); it keeps its resources for
  ``preemption_grace`` seconds and is then stopped, freed and requeued (PENDING, its original
  submit time keeps its place in line). What it keeps is its progress at its latest checkpoint:

  - ``checkpoint_on_signal: true``: it saves the moment it is asked and stops working, so it
    loses nothing (if its remaining work fits in the grace period it simply finishes instead);
  - otherwise it keeps running until it is stopped (it may finish, or pass a periodic checkpoint,
    within the grace period); the work lost is the run time since its latest periodic checkpoint
    (every ``checkpoint_every`` seconds of run time), or the whole run if it has none.

* Node events (``cluster.events``) happen at their time, before that moment's cycle; the node
  stays in the snapshot with ``schedulable=False`` while it is out (the scheduler counts only
  schedulable nodes' capacity, so every fair share shrinks with it, and drops reservations on it):

  - ``fail``: every workload with a pod on the node (a gang: all its pods) stops at once and is
    requeued; it keeps only its latest periodic checkpoint (a failure gives no chance to save on
    signal; one that had already saved on an earlier signal keeps that). Its ``preempt`` event
    says ``reason: node-failure``.
  - ``drain``: the node is cordoned; its running workloads are evicted as the scheduler evicts
    (``checkpoint_on_signal`` saves, ``preemption_grace`` later they are stopped and requeued) with
    ``reason: drain``; one already releasing keeps its own eviction.
  - ``return``: schedulable again (a failed node comes back empty). Non-preemptible workloads are
    stopped and requeued like the others.

* A workload that can never run (a pod larger than any matching node, a gang larger than the
  matching cluster, a non-preemptible request above its queue's deserved quota, a request above
  a queue's limit) is rejected at submission with the reason, and never shown to the scheduler.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpupool.scheduler.model import (DEFAULT_POOL, MILLI, Bind, CycleResult, Evict, Phase, SchedulerConfig, Snapshot,
                                     Workload)
from gpupool.scheduler.reasons import Cause
from gpupool.scheduler.usage import UsageHistory

from ..gcpause import paused_gc
from .scenario import NodeEvent, Scenario, WorkloadEntry, fresh_workloads

EPS = 1e-9


class SimulationError(RuntimeError):
    """The scheduler returned a decision that breaks the adapter contract (a core bug)."""


@dataclass
class SimWorkload:
    entry: WorkloadEntry
    index: int
    w: Workload = field(init=False)
    state: str = "future"  # future | pending | running | releasing | finished | rejected
    progress_base: float = 0.0  # work saved when the current run started (seconds)
    run_start: float | None = None
    frozen_progress: float | None = None  # set when it saved on signal and stopped working
    signalled_at: float | None = None
    evict: Evict | None = None
    evict_node: str | None = None  # the node whose drain asked it to stop
    version: int = 0  # invalidates stale finish/release events
    gpu_share: float = 0.0  # GPUs held now (sum over pods of GPUs x fraction)
    first_start: float | None = None
    finished_at: float | None = None
    rejected: str | None = None
    preemptions: int = 0
    lost_seconds: float = 0.0
    placements_log: list[dict] = field(default_factory=list)
    pending: Any = None  # the scheduler's reasons.Pending (the report renders it)
    position: int | None = None

    def __post_init__(self) -> None:
        self.w = self.entry.workload

    @property
    def name(self) -> str:
        return self.w.id

    @property
    def duration(self) -> float:
        return self.entry.duration

    def progress(self, t: float) -> float:
        if self.frozen_progress is not None:
            return self.frozen_progress
        if self.run_start is None:
            return self.progress_base
        return self.progress_base + (t - self.run_start)

    def last_checkpoint(self, t: float) -> tuple[float | None, float]:
        """(time, progress) of the latest periodic checkpoint of the current run at ``t``."""
        ce = self.entry.checkpoint_every
        if self.run_start is None or not ce:
            return None, self.progress_base
        k = math.floor((t - self.run_start) / ce + EPS)
        if k <= 0:
            return None, self.progress_base
        return self.run_start + k * ce, self.progress_base + k * ce


@dataclass
class CycleRecord:
    t: float
    result: CycleResult
    ms: float


def _matches(node, selector: dict[str, str]) -> bool:
    for key, want in selector.items():
        have = node.gpu_model if key == "gpu_model" else node.name if key == "name" else node.labels.get(key)
        if have != want:
            return False
    return True


def _fmt(x: float) -> str:
    return f"{x:g}"


def never_runs(w: Workload, scenario: Scenario, cache: dict | None = None) -> str | None:
    """Why ``w`` can never run in this cluster and queue tree, or None. Decided from the specs
    alone (capacity of matching nodes, quotas and limits), never from the current load. With node
    pools: when it can run in none of the pools it may use (the reason its first pool gives).
    ``cache``: a dict kept by the caller for one scenario, where the nodes' part of the answer is
    kept per request and pool (it does not depend on the queue)."""
    pools = sorted({n.pool for n in scenario.nodes})
    cache = {} if cache is None else cache
    if len(pools) <= 1 and not w.pools and not any(q.pools for q in scenario.queues):
        return _never_runs_in(w, scenario.nodes, scenario.queues, cache, None)
    allowed = [p for p in w.pools if p in pools] if w.pools else pools
    if not allowed:
        return f"no node in node pool {', '.join(w.pools)}"
    first = None
    for p in allowed:
        specs = cache.get(("pool", p))
        if specs is None:
            specs = cache["pool", p] = ([n for n in scenario.nodes if n.pool == p], [q.in_pool(p) for q in scenario.queues])
        why = _never_runs_in(w, *specs, cache, p)
        if why is None:
            return None
        first = first or f"in node pool {p}: {why}"
    return first


def _never_runs_in(w: Workload, all_nodes: list, queue_specs: list, cache: dict, pool: str | None) -> str | None:
    key = (pool, w.gpus, w.gpu_memory, w.cpu, w.memory, w.pods, tuple(sorted(w.node_selector.items())))
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _on_nodes(w, all_nodes)
    why, share = hit
    if why is not None:
        return why
    return _in_queues(w, queue_specs, share * w.pods)


def _on_nodes(w: Workload, all_nodes: list) -> tuple[str | None, float]:
    """Why ``w`` fits none of ``all_nodes`` (empty), else None and the least GPU share one of its
    pods takes. Nodes of one shape are judged once (a large cluster has a few shapes)."""
    shapes: dict[tuple, list] = {}  # (cpu, memory, gpus, gpu memory) -> [a node of it, how many]
    for n in all_nodes:
        if n.schedulable and _matches(n, w.node_selector):
            hit = shapes.get((n.cpu, n.memory, n.gpus, n.gpu_memory))
            if hit is None:
                shapes[(n.cpu, n.memory, n.gpus, n.gpu_memory)] = [n, 1]
            else:
                hit[1] += 1
    nodes = [n for n, _ in shapes.values()]
    if not nodes:
        sel = ", ".join(f"{k}={v}" for k, v in w.node_selector.items())
        return f"node_selector {sel} matches no node", 0.0

    def pods_fit(n) -> tuple[int, float]:
        """How many of w's pods node n could hold when empty, and the GPU share one pod takes."""
        limit = 10**9
        if w.cpu > 0:
            limit = min(limit, int((n.cpu if n.cpu is not None else 1e18) // w.cpu))
        if w.memory > 0:
            limit = min(limit, int((n.memory if n.memory is not None else 10**30) // w.memory))
        if w.gpu_memory > 0:
            if n.gpus < 1 or n.gpu_memory <= 0 or n.gpu_memory < w.gpu_memory:
                return 0, 0.0
            milli = -(-w.gpu_memory * MILLI // n.gpu_memory)
            return min(limit, n.gpus * (MILLI // milli)), milli / MILLI
        if w.gpus <= 0:
            return limit, 0.0
        if w.gpus < 1:
            milli = int(round(w.gpus * MILLI))
            return min(limit, n.gpus * (MILLI // milli)), milli / MILLI
        return min(limit, n.gpus // int(w.gpus)), float(w.gpus)

    fits = [(n, *pods_fit(n), count) for n, count in shapes.values()]
    usable = [(n, k, share, count) for n, k, share, count in fits if k > 0]
    if not usable:
        if w.gpu_memory > 0:
            biggest = max(n.gpu_memory for n in nodes)
            return (f"needs a GPU with {w.gpu_memory / 2**30:g}Gi of memory per pod; the largest matching "
                    f"GPU has {biggest / 2**30:g}Gi" if biggest else "needs GPU memory but no matching node declares gpu_memory"), 0.0
        if w.gpus >= 1 and max(n.gpus for n in nodes) < w.gpus:
            return (f"needs {_fmt(w.gpus)} GPUs per pod; the largest matching node has "
                    f"{max(n.gpus for n in nodes)}"), 0.0
        if 0 < w.gpus < 1 and max(n.gpus for n in nodes) < 1:
            return "needs a GPU but no matching node has one", 0.0
        return "no matching node has enough CPU or memory for one pod", 0.0
    most = sum(k * count for _, k, _, count in usable)
    if most < w.pods:
        return (f"a gang of {w.pods} pods that must start together; the matching nodes can hold at most "
                f"{most} of them"), 0.0
    return None, min(s for _, _, s, _ in usable)  # the least GPU share one pod can take


def _in_queues(w: Workload, queue_specs: list, total: float) -> str | None:
    """Why ``w``, taking ``total`` GPUs at least, can never run under its queue's quota and the
    limits above it, or None."""
    queues = {q.name: q for q in queue_specs}
    q = queues[w.queue]
    if not w.preemptible:
        deserved = q.deserved.get("gpu", 0.0)
        if total > deserved + EPS:
            return (f"non-preemptible and asks {_fmt(total)} GPUs, more than queue {q.name}'s deserved "
                    f"{_fmt(deserved)} (a non-preemptible workload never borrows)")
    cur = q
    while cur is not None:
        lim = cur.limit.get("gpu")
        if lim is not None and total > lim + EPS:
            return f"asks {_fmt(total)} GPUs, more than queue {cur.name}'s limit of {_fmt(lim)}"
        for res, amount in (("cpu", w.cpu * w.pods), ("memory", w.memory * w.pods)):
            lim = cur.limit.get(res)
            if lim is not None and amount > lim + EPS:
                return f"asks more {res} than queue {cur.name}'s limit"
        cur = queues.get(cur.parent) if cur.parent else None
    return None


class Engine:
    """One replay. ``run()`` returns the raw state; :mod:`gpupool.sim.report` turns it into the
    report. ``on_cycle(engine, record)`` is called after each cycle's decisions are applied (tests
    use it to check invariants at every step)."""

    def __init__(self, scenario: Scenario, seed: int = 0, *, scheduler=None,
                 on_cycle: Callable[["Engine", CycleRecord], None] | None = None, max_cycles: int = 1_000_000):
        self.scenario = scenario
        self.seed = seed
        cfg = scenario.config
        if scheduler is None:
            from gpupool.scheduler import Scheduler  # the real core

            scheduler = Scheduler(SchedulerConfig(min_runtime=cfg.min_runtime, preemption_grace=cfg.preemption_grace,
                                                  placement=cfg.placement, topology_key=cfg.topology_key, seed=seed,
                                                  gpu_memory_reserve=cfg.gpu_memory_reserve,
                                                  gpu_memory_reserve_min=cfg.gpu_memory_reserve_min,
                                                  fairness_k=cfg.fairness.k if cfg.fairness else 0.0),
                                  timer=time.perf_counter)  # per-action timing for the report
        self.scheduler = scheduler
        self.on_cycle = on_cycle
        self.max_cycles = max_cycles  # a safety valve against a scheduler that never settles
        self.sims = [SimWorkload(e, i) for i, e in enumerate(fresh_workloads(scenario))]
        self.reservations: list = []  # the last cycle's, for the next snapshot
        self._never: dict[tuple, str | None] = {}
        self._never_nodes: dict[tuple, tuple] = {}  # ``never_runs``'s cache of the nodes' part
        self.by_name = {s.name: s for s in self.sims}
        self.node_names = {n.name: n for n in scenario.nodes}
        # the inventory as the scheduler sees it now: a node that failed or is drained stays
        # listed with schedulable=False until it returns
        self.nodes = list(scenario.nodes)
        self._node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.node_state = {n.name: "up" for n in self.nodes}  # up | drained | failed
        # node pools: the report and the timeline say what happened per pool when there are pools
        self._node_pool = {n.name: n.pool for n in self.nodes}
        self.pools = sorted({n.pool for n in self.nodes}) or [DEFAULT_POOL]
        self.pooled = self.pools != [DEFAULT_POOL] or any(q.pools for q in scenario.queues)
        self.pool_gpu_seconds: dict[tuple[str, str], float] = {}  # (pool, leaf queue) -> GPU-seconds
        self.pool_fair_integral: dict[tuple[str, str], float] = {}  # (pool, queue) -> fair share x time
        self._pool_fair_now: dict[tuple[str, str], float] = {}
        # fairness over time: usage accumulates as the replay goes (scheduler/usage.py)
        self.usage = UsageHistory(cfg.fairness) if cfg.fairness else None
        self._usage_since = 0.0
        self._out_since: dict[str, float] = {}  # node -> when it left service
        self.node_log: list[dict] = []  # the node events carried out (the report's node_events)
        self.cause_counts: dict[str, int] = {}  # preemptions per cause (scheduler's and node events')
        self.cause_lost: dict[str, float] = {}  # lost GPU-seconds per cause
        # GPU capacity in service over time, as (since, GPUs) steps: a node counts while up; while
        # out, only the GPUs its leaving (releasing) workloads still hold (see docs/simulator.md)
        self._available: list[tuple[float, float]] = [(0.0, float(sum(n.gpus for n in self.nodes)))]
        self.available_gpu_seconds = 0.0
        self.now = 0.0
        self.events: list[dict] = []
        self.cycles = 0
        self.cycle_ms: list[float] = []
        self.timeline: list[dict] = []
        self.leaf_gpu_seconds = {q: 0.0 for q in scenario.leaves}
        self.fair_integral = {q.name: 0.0 for q in scenario.queues}
        self._fair_now = {q.name: 0.0 for q in scenario.queues}
        self._fair_since = 0.0
        self.lost_gpu_seconds = 0.0
        self.end_time = 0.0
        self.end_reason = ""
        self.actions_ms: dict[str, list[float]] = {}
        self.violations: list[str] = []  # broken promises of the scheduler (see check_invariants)
        self._heap: list[tuple] = []
        self._seq = 0
        self._active: dict[int, SimWorkload] = {}  # submitted, not ended, in submit order
        self._by_id: dict[str, Workload] = {}  # their workloads by id (handed to the scheduler: Snapshot.by_id)
        # ids of the workloads submitted, ended or changed since the last snapshot: the snapshot's
        # ``changes``, so that the scheduler updates what it keeps of the pending ones for these alone
        self._changed: set[str] = set()
        self._ended = 0  # finished or rejected

    # -- event queue -----------------------------------------------------------------------------
    def _push(self, t: float, kind: str, sw: SimWorkload | None) -> None:
        # at equal times: releases and finishes before submissions, so freed capacity is visible
        # then node events (a workload that finished at that moment is not hit by them)
        if t == math.inf:  # a workload without a duration never finishes
            return
        order = {"finish": 0, "release": 0, "node": 1, "submit": 2, "wake": 3}[kind]
        self._seq += 1
        heapq.heappush(self._heap, (t, order, self._seq, kind, sw.index if sw else -1, sw.version if sw else 0))

    def _push_node_event(self, i: int, ev: NodeEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (ev.t, 1, self._seq, "node", i, 0))

    def _valid(self, item) -> bool:
        _, _, _, kind, idx, version = item
        if kind in ("submit", "node"):
            return True
        sw = self.sims[idx]
        if kind == "finish":
            return sw.version == version and sw.state in ("running", "releasing")
        if kind == "release":
            return sw.version == version and sw.state == "releasing"
        return sw.version == version and sw.state == "running"  # wake (min_runtime expiry)

    def _next_event_time(self) -> float | None:
        while self._heap and not self._valid(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def _event(self, t: float, etype: str, sw: SimWorkload, reason: str, **extra) -> None:
        ev = {"t": t, "type": etype, "workload": sw.name, "reason": reason}
        ev.update(extra)
        self.events.append(ev)

    # -- state changes ---------------------------------------------------------------------------
    def _pool_of(self, sw: SimWorkload) -> str:
        pl = sw.w.placements
        return self._node_pool.get(pl[0].node, DEFAULT_POOL) if pl else DEFAULT_POOL

    def _free(self, sw: SimWorkload, t: float) -> None:
        if sw.run_start is not None:
            self.leaf_gpu_seconds[sw.w.queue] += (t - sw.run_start) * sw.gpu_share
            if self.pooled:
                key = (self._pool_of(sw), sw.w.queue)
                self.pool_gpu_seconds[key] = self.pool_gpu_seconds.get(key, 0.0) + (t - sw.run_start) * sw.gpu_share
        out = self._out_since and any(p.node in self._out_since for p in sw.w.placements)
        sw.w.placements = ()
        self._changed.add(sw.w.id)
        sw.gpu_share = 0.0
        if out:
            self._available_changed(t)

    def _requeue(self, sw: SimWorkload, t: float, reason: str, **extra) -> None:
        """Stop ``sw`` now and requeue it (keeping its submit time) from its latest checkpoint:
        what it saved on signal, else its latest periodic checkpoint of this run."""
        if sw.frozen_progress is not None:
            kept = sw.frozen_progress
            lost = 0.0
        else:
            done = sw.progress(t)
            _, kept = sw.last_checkpoint(t)
            lost = max(0.0, done - kept)
        sw.lost_seconds += lost
        lost_gpu = lost * sw.gpu_share
        self.lost_gpu_seconds += lost_gpu
        self.cause_counts[reason] = self.cause_counts.get(reason, 0) + 1
        self.cause_lost[reason] = self.cause_lost.get(reason, 0.0) + lost_gpu
        self._free(sw, t)
        sw.state = "pending"
        sw.w.phase = Phase.PENDING
        sw.w.started_at = None
        sw.w.last_checkpoint_at = None
        self._changed.add(sw.w.id)
        sw.progress_base, sw.run_start, sw.frozen_progress = kept, None, None
        sw.preemptions += 1
        sw.version += 1
        self._event(t, "preempt", sw, reason, **extra, lost_seconds=lost)
        sw.evict = sw.signalled_at = sw.evict_node = None

    def _process(self, item) -> None:
        t, _, _, kind, idx, _ = item
        if kind == "node":
            self._node_event(t, self.scenario.events[idx])
            return
        sw = self.sims[idx]
        if kind == "submit":
            w = sw.w
            key = (w.gpus, w.gpu_memory, w.cpu, w.memory, w.pods, w.preemptible, w.queue,
                   tuple(sorted(w.node_selector.items())))
            why = self._never.get(key, ())  # decided from the specs alone: the same request, the same answer
            if why == ():
                why = self._never[key] = never_runs(w, self.scenario, self._never_nodes)
            if why:
                sw.state, sw.rejected = "rejected", why
                sw.finished_at = None
                self._ended += 1
                self._event(t, "reject", sw, why)
                return
            sw.state = "pending"
            self._active[sw.index] = sw
            self._by_id[w.id] = w
            self._changed.add(w.id)
        elif kind == "finish":
            self._free(sw, t)
            sw.state, sw.finished_at = "finished", t
            sw.w.phase = Phase.PENDING
            sw.run_start = None
            sw.version += 1
            del self._active[sw.index]
            del self._by_id[sw.w.id]
            self._changed.add(sw.w.id)
            self._ended += 1
            self._event(t, "finish", sw, "completed")
        elif kind == "release":
            ev = sw.evict
            extra = {"node": sw.evict_node} if sw.evict_node else {}
            self._requeue(sw, t, ev.cause if ev else "preempted", detail=ev.reason if ev else "",
                          by=ev.by if ev else None, signalled_at=sw.signalled_at, **extra)
        # "wake" only ends a min_runtime protection: nothing to change, the cycle will see it

    # -- node events -----------------------------------------------------------------------------
    def _node_event(self, t: float, ev: NodeEvent) -> None:
        name, action = ev.node, ev.action
        state = self.node_state[name]
        on_node = [sw for sw in self._active.values()
                   if sw.state in ("running", "releasing") and any(p.node == name for p in sw.w.placements)]
        hit: list[str] = []
        if action == "return":
            if state != "up":
                self.node_state[name] = "up"
                del self._out_since[name]
                self._set_schedulable(name, True)
        elif action == "fail":
            if state == "up":
                self._out_since[name] = t
                self._set_schedulable(name, False)
            self.node_state[name] = "failed"
            for sw in on_node:  # a failure gives no chance to save: each keeps its latest checkpoint
                extra = {}
                if sw.state == "releasing" and sw.evict is not None:
                    extra["interrupted"] = sw.evict.cause  # the eviction under way when it failed
                self._requeue(sw, t, Cause.NODE_FAILURE.value, detail=f"node {name} failed", by=None,
                              signalled_at=sw.signalled_at if sw.signalled_at is not None else t, node=name,
                              **extra)
                hit.append(sw.name)
        elif action == "drain":
            if state == "up":
                self._out_since[name] = t
                self._set_schedulable(name, False)
                self.node_state[name] = "drained"
            for sw in on_node:
                if sw.state == "running":  # one already releasing keeps its own eviction
                    self._apply_evict(Evict(sw.name, Cause.DRAIN.value, f"node {name} drained"), t)
                    sw.evict_node = name
                    hit.append(sw.name)
        self._available_changed(t)
        self.node_log.append({"t": t, "node": name, "action": action, "workloads": hit})

    def _set_schedulable(self, name: str, schedulable: bool) -> None:
        i = self._node_index[name]
        self.nodes[i] = dataclasses.replace(self.nodes[i], schedulable=schedulable)

    def _available_changed(self, t: float) -> None:
        """Record the GPUs in service from ``t`` on: every node that is up, and on a node that is
        out the GPU share its leaving workloads still hold."""
        rate = float(sum(n.gpus for n in self.nodes if n.name not in self._out_since))
        if self._out_since:
            for sw in self._active.values():
                if sw.state in ("running", "releasing"):
                    for p in sw.w.placements:
                        if p.node in self._out_since:
                            rate += len(p.gpus) * p.fraction
        steps = self._available
        if steps[-1][0] == t:
            steps.pop()
        if not steps or steps[-1][1] != rate:
            steps.append((t, rate))

    def _apply_bind(self, b: Bind, t: float) -> None:
        sw = self.by_name.get(b.workload)
        if sw is None or sw.state != "pending":
            raise SimulationError(f"scheduler bound {b.workload!r}, which is "
                                  f"{'unknown' if sw is None else sw.state}, not pending")
        if len(b.placements) != sw.w.pods:
            raise SimulationError(f"scheduler bound {sw.name!r} with {len(b.placements)} placements for "
                                  f"{sw.w.pods} pods (a gang starts whole or not at all)")
        share = 0.0
        for p in b.placements:
            node = self.node_names.get(p.node)
            if node is None:
                raise SimulationError(f"scheduler bound {sw.name!r} to unknown node {p.node!r}")
            if any(g < 0 or g >= node.gpus for g in p.gpus) or len(set(p.gpus)) != len(p.gpus):
                raise SimulationError(f"scheduler bound {sw.name!r} to GPUs {list(p.gpus)} of {p.node} "
                                      f"(it has {node.gpus})")
            share += len(p.gpus) * p.fraction
        resumed = sw.first_start is not None
        sw.state = "running"
        sw.w.phase = Phase.RUNNING
        self._changed.add(sw.w.id)
        sw.w.placements = tuple(b.placements)
        sw.w.started_at = t
        sw.w.last_checkpoint_at = None
        sw.run_start = t
        sw.gpu_share = share
        sw.version += 1
        sw.pending = None
        if not resumed:
            sw.first_start = t
        for p in b.placements:
            sw.placements_log.append({"t": t, "pod": p.pod, "node": p.node, "gpus": list(p.gpus),
                                      "fraction": p.fraction})
        self._event(t, "resume" if resumed else "start", sw, b.reason, over_quota=b.over_quota)
        self._push(t + max(0.0, sw.duration - sw.progress_base), "finish", sw)
        cfg = self.scenario.config
        if sw.w.preemptible and cfg.min_runtime > 0:
            self._push(t + cfg.min_runtime, "wake", sw)

    def _apply_evict(self, e: Evict, t: float) -> None:
        sw = self.by_name.get(e.workload)
        if sw is None or sw.state not in ("running", "releasing"):
            raise SimulationError(f"scheduler evicted {e.workload!r}, which is "
                                  f"{'unknown' if sw is None else sw.state}, not running")
        if sw.state == "releasing":
            return  # already leaving; a repeated ask changes nothing
        sw.state = "releasing"
        sw.w.phase = Phase.RELEASING
        self._changed.add(sw.w.id)
        sw.evict = e
        sw.signalled_at = t
        grace = self.scenario.config.preemption_grace
        sw.version += 1  # re-stamp its events below
        if sw.w.checkpoint_on_signal and sw.duration - sw.progress(t) > grace + EPS:
            # saves now and stops working: it loses nothing, and cannot finish before it is stopped
            sw.frozen_progress = sw.progress(t)
        else:
            # keeps running through the grace period: it finishes if its work ends before then
            self._push(sw.run_start + (sw.duration - sw.progress_base), "finish", sw)
        self._push(t + grace, "release", sw)

    # -- the loop --------------------------------------------------------------------------------
    def _snapshot(self, t: float) -> Snapshot:
        changed = self._changed
        for sw in self._active.values():
            if sw.state in ("running", "releasing"):
                ct, _ = sw.last_checkpoint(t)
                if ct != sw.w.last_checkpoint_at:
                    sw.w.last_checkpoint_at = ct
                    changed.add(sw.w.id)
        usage = {}
        if self.usage is not None:
            self._record_usage(t)
            usage = self.usage.by_pool(t)
        self._changed = set()  # (each snapshot is handed to the scheduler: see _cycle)
        return Snapshot(now=t, nodes=self.nodes, queues=self.scenario.queues,
                        workloads=[sw.w for sw in self._active.values()], reservations=self.reservations,
                        usage=usage, changes=frozenset(changed), by_id=self._by_id)

    def allocated_by_pool(self) -> dict[str, dict[str, float]]:
        """GPUs held right now per pool and queue, departments summing their children."""
        leaf: dict[str, dict[str, float]] = {p: {} for p in self.pools}
        for sw in self._active.values():
            if sw.state in ("running", "releasing") and sw.w.placements:
                lp = leaf.setdefault(self._pool_of(sw), {})
                lp[sw.w.queue] = lp.get(sw.w.queue, 0.0) + sw.gpu_share
        return {p: self._roll_up(v) for p, v in leaf.items()}

    def _record_usage(self, t: float) -> None:
        """What every queue held since the last cycle, and each pool's capacity, into the history."""
        if t > self._usage_since:
            used = {(p, q): v for p, qs in self.allocated_by_pool().items() for q, v in qs.items() if v}
            cap: dict[str, float] = {}
            for n in self.nodes:
                if n.schedulable:
                    cap[n.pool] = cap.get(n.pool, 0.0) + n.gpus
            self.usage.record(self._usage_since, t, used, cap)
        self._usage_since = t

    def _accumulate_fair(self, t: float) -> None:
        dt = t - self._fair_since
        if dt > 0:
            for q, v in self._fair_now.items():
                self.fair_integral[q] += v * dt
            for k, v in self._pool_fair_now.items():
                self.pool_fair_integral[k] = self.pool_fair_integral.get(k, 0.0) + v * dt
        self._fair_since = t

    def _cycle(self, t: float) -> bool:
        snap = self._snapshot(t)
        t0 = time.perf_counter()
        with paused_gc():  # see gpupool/gcpause.py
            result = self.scheduler.schedule(snap)
        ms = (time.perf_counter() - t0) * 1000.0
        self.cycles += 1
        self.cycle_ms.append(ms)
        for action, v in (result.actions_ms or {}).items():
            self.actions_ms.setdefault(action, []).append(v)
        for e in result.evictions:
            self._apply_evict(e, t)
        for b in result.binds:
            self._apply_bind(b, t)
        # a cycle whose plans in motion differ from those it was handed (made, dropped, bound)
        # decided something too: the next cycle starts from them (a dropped reservation frees
        # the room it held, and unpins its workload from a node pool)
        replanned = result.reservations != self.reservations
        self.reservations = result.reservations  # handed back unchanged next cycle
        for sw in self._active.values():
            if sw.state == "pending":
                sw.pending = result.pending.get(sw.name, sw.pending)
                sw.position = result.positions.get(sw.name, sw.position)
        self._accumulate_fair(t)
        self._fair_now = {q: float(result.fair_share.get(q, {}).get("gpu", 0.0)) for q in self._fair_now}
        if self.pooled:
            self._pool_fair_now = {(p, q): float(v.get("gpu", 0.0))
                                   for p, shares in (result.pool_fair_share or {DEFAULT_POOL: result.fair_share}).items()
                                   for q, v in shares.items()}
        if result.binds:  # only a bind can break them (evictions keep resources, releases free them)
            self.violations.extend(f"t={t:g}: {v}" for v in self.check_invariants())
        record = CycleRecord(t, result, ms)
        entry = {"t": t, "queues": self._queue_state()}
        if self.pooled:
            by_pool = self.allocated_by_pool()
            entry["pools"] = {p: {q.name: {"allocated_gpu": round(by_pool.get(p, {}).get(q.name, 0.0), 6),
                                           "fair_share_gpu": round(self._pool_fair_now.get((p, q.name), 0.0), 6)}
                                  for q in self.scenario.queues} for p in self.pools}
        if self.usage is not None:
            for p, qs in snap.usage.items():
                for q, v in qs.items():
                    if self.pooled:
                        entry["pools"][p][q]["usage"] = round(v, 6)
                    elif q in entry["queues"]:
                        entry["queues"][q]["usage"] = round(v, 6)
        if self.scenario.events:
            entry["capacity_gpu"] = sum(n.gpus for n in self.nodes if n.schedulable)
        self.timeline.append(entry)
        if self.on_cycle is not None:
            self.on_cycle(self, record)
        return bool(result.binds or result.evictions or replanned)

    def check_invariants(self) -> list[str]:
        """What the scheduler promises at every moment, checked on the placements themselves:
        no GPU above 1000 milli, no node above its CPU/memory, every gang whole, no queue above its
        limit, no queue's non-preemptible workloads above its deserved quota."""
        out: list[str] = []
        gpu_use: dict[tuple[str, int], int] = {}
        cpu_use: dict[str, float] = {}
        mem_use: dict[str, int] = {}
        pool_of = self._node_pool
        leaf: dict[str, dict[str, float]] = {}  # pool -> leaf queue -> GPUs
        fixed: dict[str, dict[str, float]] = {}
        for sw in self._active.values():
            if sw.state not in ("running", "releasing"):
                continue
            w = sw.w
            if len(w.placements) != w.pods or len({p.pod for p in w.placements}) != w.pods:
                out.append(f"{w.id}: gang of {w.pods} pods holds {len(w.placements)} placements")
            share = 0.0
            for p in w.placements:
                for g in p.gpus:
                    gpu_use[(p.node, g)] = gpu_use.get((p.node, g), 0) + p.milli
                cpu_use[p.node] = cpu_use.get(p.node, 0.0) + w.cpu
                mem_use[p.node] = mem_use.get(p.node, 0) + w.memory
                share += len(p.gpus) * p.fraction
            pool = pool_of.get(w.placements[0].node, DEFAULT_POOL) if w.placements else DEFAULT_POOL
            lp = leaf.setdefault(pool, {})
            lp[w.queue] = lp.get(w.queue, 0.0) + share
            if not w.preemptible:
                fp = fixed.setdefault(pool, {})
                fp[w.queue] = fp.get(w.queue, 0.0) + share
        for (node, g), milli in sorted(gpu_use.items()):
            if milli > MILLI:
                out.append(f"GPU {g} of {node} holds {milli} milli-GPU (more than one GPU)")
        for name, used in sorted(cpu_use.items()):
            n = self.node_names[name]
            if n.cpu is not None and used > n.cpu + EPS:
                out.append(f"node {name} holds {used:g} cores of {n.cpu:g}")
            if n.memory is not None and mem_use[name] > n.memory:
                out.append(f"node {name} holds {mem_use[name]} bytes of memory of {n.memory}")
        for pool, held in sorted(leaf.items()):
            total = self._roll_up(held)
            where = f" in node pool {pool}" if self.pooled else ""
            for spec in self.scenario.queues:
                q = spec.in_pool(pool)
                lim = q.limit.get("gpu")
                if lim is not None and total[q.name] > lim + EPS:
                    out.append(f"queue {q.name} holds {total[q.name]:g} GPUs{where}, above its limit {lim:g}")
                nonpre = fixed.get(pool, {}).get(q.name)
                if nonpre is not None and nonpre > q.deserved.get("gpu", 0.0) + EPS:
                    out.append(f"queue {q.name}'s non-preemptible workloads hold {nonpre:g} GPUs{where}, "
                               f"above its deserved {q.deserved.get('gpu', 0.0):g}")
        return out

    def allocated_by_queue(self) -> dict[str, float]:
        """GPUs held right now per queue, departments summing their children."""
        leaf = {q: 0.0 for q in self.scenario.leaves}
        for sw in self._active.values():
            if sw.state in ("running", "releasing"):
                leaf[sw.w.queue] += sw.gpu_share
        return self._roll_up(leaf)

    def _roll_up(self, leaf: dict[str, float]) -> dict[str, float]:
        out = {q.name: 0.0 for q in self.scenario.queues}
        parent = {q.name: q.parent for q in self.scenario.queues}
        for q, v in leaf.items():
            cur: str | None = q
            while cur is not None:
                out[cur] += v
                cur = parent[cur]
        return out

    def _queue_state(self) -> dict[str, dict[str, float]]:
        alloc = self.allocated_by_queue()
        return {q.name: {"allocated_gpu": round(alloc[q.name], 6), "fair_share_gpu": round(self._fair_now[q.name], 6)}
                for q in self.scenario.queues}

    def run(self) -> "Engine":
        cfg = self.scenario.config
        until = cfg.until
        for sw in self.sims:
            self._push(sw.w.submit_time, "submit", sw)
        for i, ev in enumerate(self.scenario.events):
            self._push_node_event(i, ev)
        k = 0  # cycle index: cycle k runs at k * cfg.cycle
        last_end = 0.0
        last_decision = 0.0
        while True:
            t = k * cfg.cycle
            if until is not None and t > until + EPS:
                self._drain(until)
                self.end_time, self.end_reason = until, "until"
                break
            last_end = max(last_end, self._drain(t))
            if self._ended == len(self.sims):
                self.end_time, self.end_reason = last_end, "all workloads ended"
                break
            if self.cycles >= self.max_cycles:
                self.end_time, self.end_reason = t, f"cycle limit ({self.max_cycles} cycles) reached"
                break
            self.now = t
            decided = self._cycle(t)
            if decided:
                last_decision = t
            # past usage moves shares as time passes: with fairness over time, cycles go on
            # while something may still change (up to a window after the last decision)
            if decided or (self.usage is not None and t < last_decision + cfg.fairness.window):
                k += 1
                continue
            nxt = self._next_event_time()
            if nxt is None:
                self.end_time, self.end_reason = t, "stalled"
                break
            k = max(k + 1, math.ceil(nxt / cfg.cycle - EPS))
        self._finish_accounting()
        return self

    def _drain(self, t: float) -> float:
        """Process every event at or before ``t``; return the time of the last end (finish/reject)."""
        last = 0.0
        while True:
            nxt = self._next_event_time()
            if nxt is None or nxt > t + EPS:
                return last
            item = heapq.heappop(self._heap)
            self._process(item)
            if item[3] in ("finish", "submit"):
                last = max(last, item[0])

    def _finish_accounting(self) -> None:
        end = self.end_time
        steps = self._available
        self.available_gpu_seconds = sum(rate * (min(end, nxt) - since)
                                         for (since, rate), (nxt, _) in zip(steps, [*steps[1:], (end, 0.0)])
                                         if since < end)
        for sw in self._active.values():
            if sw.state in ("running", "releasing") and sw.run_start is not None:
                self.leaf_gpu_seconds[sw.w.queue] += (end - sw.run_start) * sw.gpu_share
                if self.pooled:
                    key = (self._pool_of(sw), sw.w.queue)
                    self.pool_gpu_seconds[key] = self.pool_gpu_seconds.get(key, 0.0) + (end - sw.run_start) * sw.gpu_share
        self._accumulate_fair(end)
