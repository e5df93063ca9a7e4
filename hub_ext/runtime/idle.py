"""The idle check: every window, workloads whose GPUs stayed idle for their rule's time, or that
reached their maximum run time, are acted on (the rules: domain/idle_rules.py). A workspace is
suspended, a job flagged or requeued (asked to checkpoint and stop like a preempted one)."""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from sqlalchemy import select

from ...contract import GPU_BUSY, GPU_HELD, GPU_IDLE, StopCause, decode_allocation, gpu_state
from ...protocol import write_warning
from ..domain import lifecycle
from ..domain.idle_rules import REQUEUE, SUSPEND, Rule, clock_words, human, suspend, workload_class
from ..store import samples
from ..store import tables as D
from .periodic import Periodic

log = logging.getLogger("gpupool.idle")


class IdleChecker(Periodic):
    """Every window: find workloads whose GPUs stayed idle for their rule's time and act."""

    what = "checking for idle GPUs"
    log = log

    def __init__(self, loop: Any, sessions: Any, rules: dict[tuple[str, str], Rule], window: float,
                 metrics: Any = None, clock: Any = time.time, limits: dict[tuple[str, str], Rule] | None = None,
                 warning: float = 600.0, simulated: Any = ()):
        self.loop = loop
        self.simulated = frozenset(simulated)  # nodes whose readings are made up (runtime/simulated.py)
        self.sessions = sessions
        self.rules = rules
        self.limits = limits or {}
        self.warning = warning
        self.interval = window if rules or self.limits else 0.0
        self.window = window
        self.metrics = metrics
        self.clock = clock
        self.idle: dict[str, dict] = {}  # public id -> {"since", "action", "rule"} (dashboard, metrics)

    def idle_since(self, s: Any, row: Any, now: float, after: float) -> str | None:
        """``idle`` when every window of the last ``after`` seconds had readings of its GPUs, all
        0 %; ``held`` when besides they held GPU memory (``contract.HELD_MEMORY``) all along (an
        open notebook keeping a tensor); None otherwise (busy, or a window without a reading)."""
        n = max(1, math.ceil(after / self.window))
        start = now - n * self.window
        gpus = [(p.node, g) for p in decode_allocation(row.allocation) for g in p.gpus]
        if not gpus:
            return None
        c = samples.TABLE.c
        seen = [False] * n
        held = True
        for node, gpu in gpus:
            q = select(c.t, c.seconds, c.utilization, c.memory_used).where(
                c.node == node, c.gpu == gpu, c.t < now, c.t + c.seconds > start, c.utilization.is_not(None))
            for t, secs, util, mem in s.execute(q):
                state = gpu_state(util, mem)
                if state == GPU_BUSY:
                    return None
                held = held and state == GPU_HELD
                first = max(0, int((t - start) // self.window))
                last = min(n - 1, int((t + secs - start - 1e-9) // self.window))
                for k in range(first, last + 1):
                    seen[k] = True
        if not all(seen):
            return None
        return GPU_HELD if held else GPU_IDLE

    async def tick(self) -> list[str]:
        acted: list[str] = []
        async with self.loop._lock:  # not in the middle of a scheduling cycle
            now = self.clock()
            with self.sessions() as s:
                rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None),
                                                          D.Workload.status == D.RUNNING,
                                                          D.Workload.stop_requested_at.is_(None))).all()
                current: dict[str, dict] = {}
                for row in rows:
                    ran = now - (row.started_at or now)
                    limit = self.limits.get((row.queue, workload_class(row)))
                    if limit is not None and ran >= limit.after:
                        why = f"it ran for its maximum run time of {human(limit.after)} ({limit.source})"
                        if await self.act(s, row, limit, now, why, cause="max-runtime"):
                            acted.append(row.public_id)
                            continue
                    elif limit is not None and ran >= limit.after - self.warning:
                        self.warn(row, limit)
                    rule = self.rules.get((row.queue, workload_class(row)))
                    state = None if rule is None or ran < rule.after else self.idle_since(s, row, now, rule.after)
                    if state is None:
                        continue
                    pid = row.public_id
                    current[pid] = self.idle.get(pid) or {"since": now - rule.after, "action": rule.action,
                                                          "rule": rule.source, "user": row.user, "queue": row.queue,
                                                          "gpus": row.gpus}
                    current[pid]["state"] = state
                    gpu_words = "GPU" if row.gpus == 1 else "GPUs"
                    held = " while holding GPU memory (idle-held)" if state == GPU_HELD else ""
                    reading = ("0 % simulated utilisation: no activity seen" if self.simulated and any(
                        p.node in self.simulated for p in decode_allocation(row.allocation)) else "0 % utilisation")
                    why = f"its {gpu_words} stayed idle ({reading}){held} for {human(rule.after)} ({rule.source})"
                    if await self.act(s, row, rule, now, why):
                        acted.append(pid)
                        current.pop(pid, None)
                s.commit()
            self.idle = current
            if self.metrics is not None:
                self.metrics.observe_idle(current, [q for q, _ in self.rules])
        if acted:
            self.loop.wake()
        return acted

    def warn(self, row: Any, limit: Rule) -> None:
        """Before the maximum run time: the reason says when and what happens (the widgets and the
        API show it); a job also finds it through ``gpupool.checkpoint.warning()``."""
        then = "suspended" if row.type == D.WORKSPACE else "asked to checkpoint and requeued"
        msg = (f"reaches its maximum run time of {human(limit.after)} at {clock_words(row.started_at + limit.after)} "
               f"({limit.source}); it will then be {then}")
        if not lifecycle.warn(row, msg):
            return
        log.info("%s %s", row.public_id, msg)
        if row.type == D.JOB:
            try:
                write_warning(self.loop.job_dir(row).stop_file, msg, row.started_at + limit.after)
            except OSError as e:
                log.warning("could not write the run time warning of %s: %s", row.public_id, e)

    async def act(self, s: Any, row: Any, rule: Rule, now: float, why: str, cause: str = "idle") -> bool:
        gpu_words = "GPU" if row.gpus == 1 else "GPUs"
        if rule.action == SUSPEND:
            suspend(s, row, why, now)
            log.warning("suspended workspace %s (%s/%s, %g %s): %s", row.public_id, row.user, row.server, row.gpus,
                        gpu_words, why)
            self._count("suspended", row)
            return True
        if rule.action == REQUEUE:
            log.warning("requeueing job %s: %s", row.public_id, why)
            await self.loop.request_stop(row, StopCause.PREEMPT, f"requeued: {why}", now, session=s)
            self._count("requeued", row)
            if self.metrics is not None:
                self.metrics.evictions.labels(cause=cause).inc()
            return True
        if lifecycle.flag_idle(row, why):
            log.info("flagged idle %s: %s", row.public_id, why)
            self._count("flagged", row)
        return False

    def _count(self, action: str, row: Any) -> None:
        counter = getattr(self.metrics, "idle_actions", None)
        if counter is not None:
            counter.labels(queue=row.queue, action=action).inc()
