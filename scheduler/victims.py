"""Victim order: among workloads that may be preempted, who goes first.

Checkpoint-aware: the workload that loses the least GPU-work goes first. Lost work is the run
time since its last checkpoint (zero when it saves on signal within the grace period), weighted by
the GPUs it holds. Ties: the workload whose queue is furthest above its fair share (``excess``,
GPUs; taking from it rebalances most), then lower priority, then the most recently started (it
has the least invested), then by id for determinism.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .model import Workload


def lost_gpu_seconds(w: Workload, now: float, gpus: float) -> float:
    return w.lost_work(now) * max(gpus, 1e-3)


def lost_gpu_seconds_all(now: float, gpus: np.ndarray, signal: Sequence[bool], started: Sequence[float | None],
                         last: Sequence[float | None]) -> np.ndarray:
    """``lost_gpu_seconds`` of many workloads at once, from their GPUs and the fields
    ``Workload.lost_work`` reads (``checkpoint_on_signal``, ``started_at``, ``last_checkpoint_at``),
    in order: the same arithmetic on the same doubles, so the same values, bit for bit."""
    started_a = np.array(started, dtype=float)  # (None: nan)
    last_a = np.array(last, dtype=float)
    since = np.where(last_a > started_a, last_a, started_a)  # (a comparison with nan is false)
    zero = np.array(signal, dtype=bool) | np.isnan(started_a)
    with np.errstate(invalid="ignore"):
        lost = np.where(zero, 0.0, np.maximum(0.0, now - since))
    return lost * np.maximum(gpus, 1e-3)


def victim_key(w: Workload, now: float, gpus: float, excess: float = 0.0) -> tuple:
    started = w.started_at if w.started_at is not None else now
    return (lost_gpu_seconds(w, now, gpus), -excess, w.priority, -started, w.id)
