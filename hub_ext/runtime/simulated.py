"""Simulated GPU readings of a declared inventory (``c.GPUPool.simulated_gpu_readings``: the demo).

A declared GPU (``c.GPUPool.nodes``, not read by NVML or DCGM) has no readings, so no idle rule
ever fires on it. With this setting on, the service gives such a GPU a reading it makes up from
what it knows, in the shape of the NVML readings (runtime/sampling.py stores them, the idle rules
judge them):

* a GPU nobody holds reads 0 %;
* a running job's GPUs read busy (its fraction of 100 %);
* a workspace's GPUs read busy while the hub saw its server active in the last
  ``c.GPUPool.simulated_activity_seconds`` (the hub's ``last_activity``, which the workspace
  reconciler reads; a server that just started counts as active), 0 % otherwise.

Memory is not simulated (``memory_used`` is None), so a simulated GPU is never idle-held. Every
place that shows a reading labels these as simulated (``GET nodes``' ``readings``, the dashboard,
``gpupool top``, the idle reasons): they are never presented as NVML's.
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import select

from ...contract import decode_allocation
from ..store import tables as D

SIMULATED = "simulated"


def _epoch(text: Any) -> float | None:
    """The hub's ISO time (``2026-11-02T08:00:00.123Z``) as seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class SimulatedReadings:
    """``read()`` -> ``{node: {index: {"utilization", "memory_used", "memory_total"}}}`` of the
    declared nodes without real readings. ``activity``: (user, server) -> the hub's last_activity
    (the service's ``server_activity``, kept by the workspace reconciler)."""

    def __init__(self, settings: Any, sessions: Any, activity: dict, clock: Any = time.time):
        self.settings = settings
        self.sessions = sessions
        self.activity = activity
        self.clock = clock

    def nodes(self) -> list[Any]:
        """The nodes these readings cover: every declared node NVML does not read."""
        return [n for n in self.settings.nodes if n.name not in self.settings.gpu_uuids]

    def active(self, row: Any, now: float) -> bool:
        if row.type == D.JOB:
            return row.status == D.RUNNING
        window = self.settings.pool.simulated_activity_seconds
        seen = [t for t in (_epoch(self.activity.get((row.user, row.server))), row.started_at) if t is not None]
        return bool(seen) and max(seen) >= now - window

    def read(self) -> dict[str, dict[int, dict]]:
        nodes = self.nodes()
        if not nodes:
            return {}
        now = self.clock()
        busy: dict[tuple[str, int], float] = {}
        with self.sessions() as s:
            rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None))).all()
            for row in rows:
                if not self.active(row, now):
                    continue
                for p in decode_allocation(row.allocation):
                    for g in p.gpus:
                        busy[(p.node, g)] = busy.get((p.node, g), 0.0) + 100.0 * p.fraction
        return {n.name: {i: {"utilization": round(min(100.0, busy.get((n.name, i), 0.0)), 1), "memory_used": None,
                             "memory_total": n.gpu_memory or None}
                         for i in range(n.gpus)}
                for n in nodes}
