"""Victim order: among workloads that may be preempted, who goes first.

Checkpoint-aware: the workload that loses the least GPU-work goes first. Lost work is the run
time since its last checkpoint (zero when it saves on signal within the grace period), weighted by
the GPUs it holds. Ties: the workload whose queue is furthest above its fair share (``excess``,
GPUs; taking from it rebalances most), then lower priority, then the most recently started (it
has the least invested), then by id for determinism.
"""
from __future__ import annotations

from .model import Workload


def lost_gpu_seconds(w: Workload, now: float, gpus: float) -> float:
    return w.lost_work(now) * max(gpus, 1e-3)


def victim_key(w: Workload, now: float, gpus: float, excess: float = 0.0) -> tuple:
    started = w.started_at if w.started_at is not None else now
    return (lost_gpu_seconds(w, now, gpus), -excess, w.priority, -started, w.id)
