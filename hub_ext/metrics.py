"""Prometheus metrics of the gpupool service (``GET metrics``), on a registry of its own."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest



class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.submitted = Counter("gpupool_jobs_submitted", "Jobs accepted through the API", registry=r)
        self.finished = Counter("gpupool_jobs_finished", "Jobs that ended, by final status", ["status"], registry=r)
        self.preemptions = Counter("gpupool_preemptions", "Workloads preempted and requeued", registry=r)
        self.workloads = Gauge("gpupool_workloads", "Workloads by queue: holding GPUs or pending", ["queue", "phase"],
                               registry=r)
        self.queue_gpus = Gauge("gpupool_queue_gpus", "GPUs of a queue: deserved, fair_share, allocated",
                                ["queue", "what"], registry=r)
        self.idle_actions = Counter("gpupool_idle_actions", "Idle-GPU rule actions: suspended, requeued, flagged",
                                    ["queue", "action"], registry=r)
        self.gpus_total = Gauge("gpupool_gpus_total", "GPUs in the pool", registry=r)
        self.gpus_allocated = Gauge("gpupool_gpus_allocated", "GPUs allocated (fractions summed)", registry=r)
        self.cycle_seconds = Histogram("gpupool_cycle_seconds", "Duration of a scheduling cycle (all steps)",
                                       registry=r, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.decide_seconds = Histogram("gpupool_decide_seconds", "Scheduler decision time per cycle",
                                        registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5))

    def observe_cycle(self, loop: Any, snap: Any, result: Any, seconds: float, decide_ms: float) -> None:
        self.cycle_seconds.observe(seconds)
        self.decide_seconds.observe(decide_ms / 1000)
        for name, view in loop.state.queues.items():
            self.workloads.labels(queue=name, phase="holding").set(view.running)
            self.workloads.labels(queue=name, phase="pending").set(view.pending)
        allocated = 0.0
        for q in loop.settings.queues:
            got = result.allocated.get(q.name, {}).get("gpu", 0)
            if q.parent is None:
                allocated += got
            self.queue_gpus.labels(queue=q.name, what="deserved").set(q.deserved.get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="fair_share").set(result.fair_share.get(q.name, {}).get("gpu", 0))
            self.queue_gpus.labels(queue=q.name, what="allocated").set(got)
        self.gpus_total.set(sum(n.gpus for n in loop.settings.nodes))
        self.gpus_allocated.set(allocated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
