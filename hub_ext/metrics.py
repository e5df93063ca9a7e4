"""Prometheus metrics of the gpupool service (``GET metrics``), on a registry of its own."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..scheduler.model import Phase


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.submitted = Counter("gpupool_jobs_submitted", "Jobs accepted through the API", registry=r)
        self.finished = Counter("gpupool_jobs_finished", "Jobs that ended, by final status", ["status"], registry=r)
        self.preemptions = Counter("gpupool_preemptions", "Workloads preempted and requeued", registry=r)
        self.workloads = Gauge("gpupool_workloads", "Active workloads by queue and phase", ["queue", "phase"],
                               registry=r)
        self.queue_gpus = Gauge("gpupool_queue_gpus", "GPUs of a queue: deserved, fair_share, allocated",
                                ["queue", "what"], registry=r)
        self.gpus_total = Gauge("gpupool_gpus_total", "GPUs in the pool", registry=r)
        self.gpus_allocated = Gauge("gpupool_gpus_allocated", "GPUs allocated (fractions summed)", registry=r)
        self.cycle_seconds = Histogram("gpupool_cycle_seconds", "Duration of a scheduling cycle (all steps)",
                                       registry=r, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.decide_seconds = Histogram("gpupool_decide_seconds", "Scheduler decision time per cycle",
                                        registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))

    def observe_cycle(self, loop: Any, snap: Any, result: Any, seconds: float, decide_ms: float) -> None:
        self.cycle_seconds.observe(seconds)
        self.decide_seconds.observe(decide_ms / 1000)
        counts: dict[tuple[str, str], int] = {}
        for q in loop.settings.queues:
            for ph in Phase:
                counts[(q.name, ph.value)] = 0
        allocated = 0.0
        for w in snap.workloads:
            counts[(w.queue, w.phase.value)] = counts.get((w.queue, w.phase.value), 0) + 1
            if w.phase != Phase.PENDING:
                allocated += sum(len(p.gpus) * p.fraction for p in w.placements)
        for (q, ph), n in counts.items():
            self.workloads.labels(queue=q, phase=ph).set(n)
        for q in loop.settings.queues:
            self.queue_gpus.labels(queue=q.name, what="deserved").set(q.deserved.get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="fair_share").set(result.fair_share.get(q.name, {}).get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="allocated").set(result.allocated.get(q.name, {}).get("gpu", 0))
        self.gpus_total.set(sum(n.gpus for n in loop.settings.nodes))
        self.gpus_allocated.set(allocated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
