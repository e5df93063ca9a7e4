"""Prometheus metrics of the gpupool service (``GET metrics``), on a registry of its own."""
from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ...scheduler.fairshare import QueueTree



class Metrics:
    """``clock``: the time a scrape brings the GPU-hours allocated up to (the loop's, time.time)."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self.registry = r = CollectorRegistry()
        self.submitted = Counter("gpupool_jobs_submitted", "Jobs accepted through the API", registry=r)
        self.finished = Counter("gpupool_jobs_finished", "Jobs that ended, by final status", ["status"], registry=r)
        self.preemptions = Counter("gpupool_preemptions", "Workloads preempted and requeued", registry=r)
        self.workloads = Gauge("gpupool_workloads", "Workloads by queue: holding GPUs or pending", ["queue", "phase"],
                               registry=r)
        self.queue_gpus = Gauge("gpupool_queue_gpus", "GPUs of a queue: deserved, fair_share, allocated; "
                                "fair_share_plain: its fair share without past usage (fairness over time, only "
                                "while past usage counts)", ["queue", "what"], registry=r)
        self.idle_actions = Counter("gpupool_idle_actions", "Idle-GPU rule actions: suspended, requeued, flagged",
                                    ["queue", "action"], registry=r)
        # accounting (docs/admin.md): GPU-hours since the service started, idle GPUs, utilisation
        self.gpu_hours_allocated = Counter("gpupool_gpu_hours_allocated", "GPU-hours allocated, per leaf queue",
                                           ["queue"], registry=r)
        self.gpu_hours_used = Counter("gpupool_gpu_hours_used", "GPU-hours used (allocation weighted by NVML "
                                      "utilisation; only GPUs with readings), per leaf queue", ["queue"], registry=r)
        self.idle_gpus = Gauge("gpupool_idle_gpus", "GPUs held by workloads that are idle by the idle rules",
                               ["queue"], registry=r)
        self.evictions = Counter("gpupool_evictions", "Workloads asked to stop by the scheduler or a rule, by cause "
                                 "(reclaim, priority, consolidation, idle, max-runtime)", ["cause"], registry=r)
        self.gpu_utilization = Gauge("gpupool_gpu_utilization", "NVML utilisation of a GPU (percent)",
                                     ["node", "gpu"], registry=r)
        self.gpu_memory_used = Gauge("gpupool_gpu_memory_used_bytes", "NVML memory used on a GPU", ["node", "gpu"],
                                     registry=r)
        self._queue_tree: tuple[list, QueueTree] | None = None
        self._held: dict[str, float] = {}
        self._held_at: float | None = None
        self.gpus_total = Gauge("gpupool_gpus_total", "GPUs in the pool", registry=r)
        # node pools: each pool's GPUs, and each queue's quota, share, allocation and usage in it
        self.pool_gpus = Gauge("gpupool_pool_gpus", "GPUs of a node pool: total, allocated, free; workloads "
                               "queued for it", ["pool", "what"], registry=r)
        self.pool_queue_gpus = Gauge("gpupool_pool_queue_gpus", "GPUs of a queue in a node pool: deserved, "
                                     "fair_share, allocated; usage: its past usage (fairness over time, a share of "
                                     "the pool's capacity); fair_share_plain: its fair share without past usage "
                                     "(only while past usage counts)", ["pool", "queue", "what"], registry=r)
        self.gpus_allocated = Gauge("gpupool_gpus_allocated", "GPUs allocated (fractions summed)", registry=r)
        self.cycle_seconds = Histogram("gpupool_cycle_seconds", "Duration of a scheduling cycle (all steps)",
                                       registry=r, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.decide_seconds = Histogram("gpupool_decide_seconds", "Scheduler decision time per cycle",
                                        registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))

    def observe_cycle(self, loop: Any, now: float, held: dict[str, float], result: Any, seconds: float,
                      decide_ms: float) -> None:
        """One cycle at ``now``: ``held`` is queue -> GPUs held from now on (fractions summed): by the
        workloads holding GPUs at the snapshot and by the cycle's binds."""
        self.cycle_seconds.observe(seconds)
        for ev in result.evictions:
            self.evictions.labels(cause=ev.cause).inc()
        # GPU-hours allocated: what was held up to this cycle (the start of the binds it makes, as in
        # the usage ledger), then what is held from now on (``held``: the workloads holding GPUs and
        # the cycle's binds)
        self._accrue(now)
        self._held = dict(held)
        self.decide_seconds.observe(decide_ms / 1000)
        for name, view in loop.state.queues.items():
            self.workloads.labels(queue=name, phase="holding").set(view.running)
            self.workloads.labels(queue=name, phase="pending").set(view.pending)
        allocated = 0.0
        tree = self._tree(loop.settings.queues)
        for q in loop.settings.queues:
            got = result.allocated.get(q.name, {}).get("gpu", 0)
            if q.parent is None:
                allocated += got
            self.queue_gpus.labels(queue=q.name, what="deserved").set(q.deserved.get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="fair_share").set(result.fair_share.get(q.name, {}).get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="allocated").set(got)
            _plain(self.queue_gpus, result.fair_share_plain, q.name, {"queue": q.name})
            if tree.is_leaf(q.name):
                self.gpu_hours_allocated.labels(queue=q.name)  # a leaf queue's series exists from the start, at 0
        self.gpus_total.set(sum(n.gpus for n in loop.settings.nodes))
        self.gpus_allocated.set(allocated)
        self._observe_pools(loop, result)

    def _observe_pools(self, loop: Any, result: Any) -> None:
        """Per node pool (the ``pool`` label): its GPUs and what waits for it; each queue's share there."""
        st = loop.state
        pools: dict[str, float] = {}
        for n in loop.settings.nodes:
            pools[n.pool] = pools.get(n.pool, 0.0) + (n.gpus if n.schedulable else 0)
        single = list(pools) in ([], ["default"])
        for p, total in pools.items():
            c = st.pools.get(p, {})
            self.pool_gpus.labels(pool=p, what="total").set(total)
            self.pool_gpus.labels(pool=p, what="allocated").set(c.get("allocated", 0.0))
            self.pool_gpus.labels(pool=p, what="free").set(max(0.0, total - c.get("allocated", 0.0)))
            self.pool_gpus.labels(pool=p, what="queued").set(c.get("queued", 0))
            fair = result.fair_share if single else result.pool_fair_share.get(p, {})
            plain = result.fair_share_plain if single else result.pool_fair_share_plain.get(p, {})
            alloc = result.allocated if single else result.pool_allocated.get(p, {})
            for q in loop.settings.queues:
                mine = q.in_pool(p)
                self.pool_queue_gpus.labels(pool=p, queue=q.name, what="deserved").set(mine.deserved.get("gpu", 0))
                self.pool_queue_gpus.labels(pool=p, queue=q.name, what="fair_share").set(
                    fair.get(q.name, {}).get("gpu", 0))
                self.pool_queue_gpus.labels(pool=p, queue=q.name, what="allocated").set(
                    alloc.get(q.name, {}).get("gpu", 0))
                if st.fairness_on:
                    self.pool_queue_gpus.labels(pool=p, queue=q.name, what="usage").set(
                        st.usage.get(p, {}).get(q.name, 0.0))
                _plain(self.pool_queue_gpus, plain, q.name, {"pool": p, "queue": q.name})

    def _tree(self, queues: list) -> QueueTree:
        if self._queue_tree is None or self._queue_tree[0] is not queues:
            self._queue_tree = (queues, QueueTree(queues))
        return self._queue_tree[1]

    def observe_readings(self, readings: dict, seconds: float, holders: dict) -> None:
        """One round of NVML readings (runtime/sampling.py): per-GPU gauges, and the GPU-hours used
        by the queues holding those GPUs (``holders``: (node, gpu) -> [(queue, fraction)])."""
        for node, gpus in readings.items():
            for index, r in gpus.items():
                util, mem = r.get("utilization"), r.get("memory_used")
                if util is not None:
                    self.gpu_utilization.labels(node=node, gpu=str(index)).set(util)
                    for queue, fraction in holders.get((node, int(index)), ()):
                        self.gpu_hours_used.labels(queue=queue).inc(fraction * util / 100 * seconds / 3600)
                if mem is not None:
                    self.gpu_memory_used.labels(node=node, gpu=str(index)).set(mem)

    def observe_idle(self, idle: dict, queues: list[str]) -> None:
        per_queue = {q: 0.0 for q in queues}
        for w in idle.values():
            per_queue[w["queue"]] = per_queue.get(w["queue"], 0.0) + float(w.get("gpus") or 0)
        for queue, gpus in per_queue.items():
            self.idle_gpus.labels(queue=queue).set(gpus)

    def _accrue(self, now: float) -> None:
        """Add what the queues held since the last call to ``gpupool_gpu_hours_allocated``."""
        if self._held_at is not None and now > self._held_at:
            for queue, gpus in self._held.items():
                self.gpu_hours_allocated.labels(queue=queue).inc(gpus * (now - self._held_at) / 3600)
        if self._held_at is None or now > self._held_at:
            self._held_at = now

    def render(self) -> bytes:
        self._accrue(self.clock())  # a scrape between cycles sees the GPU-hours up to now, as GET usage does
        return generate_latest(self.registry)


def _plain(gauge: Any, plain: dict, name: str, labels: dict[str, str]) -> None:
    """The ``what="fair_share_plain"`` series of queue ``name`` (``labels``: its labels but ``what``,
    in the gauge's order): its share without past usage while past usage counts (``plain`` not
    empty); no series otherwise (removed when it had one)."""
    if plain:
        gauge.labels(**labels, what="fair_share_plain").set(plain.get(name, {}).get("gpu", 0))
    else:
        try:
            gauge.remove(*labels.values(), "fair_share_plain")
        except KeyError:
            pass  # it had none (older prometheus_client versions raise then)
