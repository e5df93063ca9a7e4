"""GPU utilisation history: NVML readings per GPU, stored in the service's database, downsampled.

Every ``c.GPUPool.usage_sample_seconds`` the service reads NVML (``gpupool.backends.nvml
.utilization``) for the GPUs of the node it discovered through NVML, and on a cluster the DCGM
exporter's readings through Prometheus (``c.GPUPool.prometheus_url``, ``gpupool.backends.dcgm``),
and stores one row per GPU:
mean utilisation (percent) and memory used over the period the row covers (``[t, t + seconds)``).
Raw rows are kept for ``usage_raw_retention`` seconds, then merged into rows of
``usage_rollup_seconds`` (time-weighted means), which are kept for ``usage_rollup_retention``.
A declared inventory (``c.GPUPool.nodes``) has no readings: nothing is stored for its GPUs, and
reports say "unknown" for their use instead of inventing a number.

The table is store/samples.py. The per-workload view is the ledger (store/ledger.py) joined with these rows: a workload's
used GPU-hours are its allocation weighted by the utilisation of its GPUs while it held them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sqlalchemy import Integer, case, cast, delete, func, select

from ..store.samples import TABLE, holders
from .periodic import Periodic

log = logging.getLogger("gpupool.sampling")


class Sampler(Periodic):
    """Reads NVML every ``interval`` seconds and keeps the history downsampled.

    ``read`` returns ``{node: {index: {"utilization": %, "memory_used": bytes}}}`` (the service's
    ``gpu_readings``); ``clock`` gives the time (tests pass their own)."""

    def __init__(self, sessions: Any, read: Any, interval: float, raw_retention: float, rollup_seconds: float,
                 rollup_retention: float, clock: Any = time.time, metrics: Any = None):
        self.sessions = sessions
        self.read = read
        self.interval = interval
        self.raw_retention = raw_retention
        self.rollup_seconds = rollup_seconds
        self.rollup_retention = rollup_retention
        self.clock = clock
        self.metrics = metrics
        self.last: dict[tuple[str, int], dict] = {}  # latest reading per GPU (the idle rules read it)
        self._last_t: float | None = None
        self._last_rollup = 0.0

    what = "GPU utilisation sampling"
    log = log

    def sample(self, readings: dict | None = None) -> int:
        """Store one reading of every GPU (``readings``, else ``read()`` now); returns the number
        of rows written."""
        now = self.clock()
        readings = self.read() if readings is None else readings
        seconds = self.interval if self._last_t is None else min(max(now - self._last_t, 0.0), 3 * self.interval)
        self._last_t = now
        rows = []
        for node, gpus in readings.items():
            for index, r in gpus.items():
                self.last[(node, int(index))] = dict(r, t=now)
                if r.get("utilization") is None and r.get("memory_used") is None:
                    continue
                # the reading stands for the period since the previous one
                rows.append(dict(node=node, gpu=int(index), t=now - seconds, seconds=seconds,
                                 utilization=r.get("utilization"), memory_used=r.get("memory_used"), resolution=0))
        if rows or self.metrics is not None:
            with self.sessions() as s:
                if rows:
                    s.execute(TABLE.insert(), rows)
                    s.commit()
                if self.metrics is not None:
                    self.metrics.observe_readings(readings, seconds, holders(s))
        return len(rows)

    def downsample(self) -> tuple[int, int]:
        """Merge raw rows older than the raw retention into rollup rows; drop rollups past theirs.
        Returns (raw rows merged, rollup rows dropped)."""
        now = self.clock()
        step = self.rollup_seconds
        cutoff = (now - self.raw_retention) // step * step  # whole rollup periods only
        merged = dropped = 0
        with self.sessions() as s:
            c = TABLE.c
            bucket = cast(c.t / step, Integer)  # t > 0: truncation is floor
            weighted = [func.sum(col * c.seconds) for col in (c.utilization, c.memory_used)]
            covered = [func.sum(case((col.is_not(None), c.seconds), else_=0.0)) for col in (c.utilization, c.memory_used)]
            q = (select(c.node, c.gpu, bucket.label("b"), func.sum(c.seconds), *weighted, *covered, func.count())
                 .where(c.resolution == 0, c.t < cutoff).group_by(c.node, c.gpu, bucket))
            out = []
            for node, gpu, b, secs, uw, mw, us, ms, n in s.execute(q):
                out.append(dict(node=node, gpu=gpu, t=float(b) * step, seconds=float(secs),
                                utilization=uw / us if uw is not None and us else None,
                                memory_used=mw / ms if mw is not None and ms else None, resolution=int(step)))
                merged += n
            if out:
                s.execute(TABLE.insert(), out)
                s.execute(delete(TABLE).where(c.resolution == 0, c.t < cutoff))
            dropped = s.execute(delete(TABLE).where(c.resolution != 0, c.t < now - self.rollup_retention)).rowcount
            s.commit()
        return merged, dropped

    async def tick(self) -> None:
        self.sample(await asyncio.to_thread(self.read))  # a reading may wait on Prometheus: not on the loop
        if time.monotonic() - self._last_rollup >= min(self.rollup_seconds, 600):
            self.downsample()
            self._last_rollup = time.monotonic()
