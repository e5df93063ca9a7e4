"""Fairness over time in the service: past usage from the usage ledger, read incrementally.

``c.GPUPool.fairness`` on, the loop asks :meth:`UsageTracker.usage` before each cycle for the
``Snapshot.usage`` (pool -> queue -> usage over the window as a share of the pool's capacity) and
hands the core ``fairness_k``. The numbers are the core's (``scheduler/usage.py``: a
``UsageHistory`` keeps the decayed, windowed sums); what this module adds is where they come from:

* each cycle feeds the history the GPUs every queue (and every department above it: a record's
  ``queue_path``) held in each pool since the last cycle, from the ledger records open during that
  interval, and the pool's capacity (the GPUs of its schedulable nodes now);
* the ledger is never rescanned: the tracker keeps the records still open in memory and reads
  only the records added since its last read (``id`` above the last one seen) and the end of
  those it holds open (by id), so a cycle costs O(records open + records new);
* at a (re)start the history is rebuilt once from the ledger over one window (the records that
  overlap it, in ``REBUILD_STEPS`` slices), with today's capacity standing for the window's.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable

from sqlalchemy import func, or_, select

from ...scheduler.model import DEFAULT_POOL, NodeSpec
from ...scheduler.usage import FairnessConfig, UsageHistory
from ..store import ledger as L

log = logging.getLogger("gpupool.loop")

REBUILD_STEPS = 96  # slices of the window a restart replays the ledger in
_COLUMNS = [L.TABLE.c[k] for k in ("id", "pool", "queue", "queue_path", "gpus", "start", "end")]


def capacity(nodes: Iterable[NodeSpec]) -> dict[str, float]:
    """GPUs of the schedulable nodes, per pool."""
    out: dict[str, float] = {}
    for n in nodes:
        if n.schedulable and n.gpus:
            out[n.pool] = out.get(n.pool, 0.0) + n.gpus
    return out


def _keys(r: Any) -> list[tuple[str, str]]:
    """The (pool, queue) keys a record counts for: its queue and every department above it."""
    pool = r.pool or DEFAULT_POOL
    path = (r.queue_path or r.queue).split("/")
    return [(pool, q) for q in path]


class UsageTracker:
    """Past usage per pool and queue for fairness over time (module doc). ``config`` None: off,
    and :meth:`usage` gives ``{}``."""

    def __init__(self, sessions: Any, config: FairnessConfig | None):
        self.sessions = sessions
        self.config = config
        self.history = UsageHistory(config) if config is not None else None
        self._open: dict[int, Any] = {}  # record id -> the record (open at the last read)
        self._last_id = 0  # the highest record id read
        self._since: float | None = None  # the end of what the history holds
        self.last: dict[str, dict[str, float]] = {}  # the last usage handed out (what the API shows)

    @property
    def on(self) -> bool:
        return self.history is not None

    def rebuild(self, now: float, nodes: Iterable[NodeSpec]) -> None:
        """Fill the history from the ledger over one window before ``now`` (a restart)."""
        if self.history is None:
            return
        cfg = self.config
        assert cfg is not None
        start = now - cfg.window
        if cfg.window_type == "tumbling":
            start = max(start, math.floor(now / cfg.window + 1e-12) * cfg.window)
        c = L.TABLE.c
        with self.sessions() as s:
            rows = s.execute(select(*_COLUMNS).where(c.start < now, or_(c.end.is_(None), c.end > start))).all()
            self._last_id = s.execute(select(func.max(c.id))).scalar() or 0
        self._open = {r.id: r for r in rows if r.end is None}
        cap = capacity(nodes)
        if now > start:
            step = (now - start) / REBUILD_STEPS
            used: list[dict] = [{} for _ in range(REBUILD_STEPS)]
            for r in rows:
                a, b = max(r.start, start), min(r.end if r.end is not None else now, now)
                if b <= a:
                    continue
                for k in range(int((a - start) // step), min(REBUILD_STEPS, math.ceil((b - start) / step))):
                    t0, t1 = start + k * step, start + (k + 1) * step
                    share = r.gpus * (min(b, t1) - max(a, t0)) / step
                    for key in _keys(r):
                        used[k][key] = used[k].get(key, 0.0) + share
            for k in range(REBUILD_STEPS):
                self.history.record(start + k * step, start + (k + 1) * step, used[k], cap)
        self._since = now
        log.info("fairness over time: usage rebuilt from %d ledger records over the last %g s", len(rows), now - start)

    def usage(self, now: float, nodes: Iterable[NodeSpec]) -> dict[str, dict[str, float]]:
        """``Snapshot.usage`` at ``now``, after feeding the history what was held since the last call."""
        if self.history is None:
            return {}
        if self._since is None:
            self.rebuild(now, nodes)
        since = self._since if self._since is not None else now
        if now > since:
            self.history.record(since, now, self._held(since, now), capacity(nodes))
            self._since = now
        self.last = self.history.by_pool(now)
        return self.last

    def _held(self, since: float, now: float) -> dict[tuple[str, str], float]:
        """GPUs held on average over [since, now] per (pool, queue), from the records open then:
        those open at the last read (their end read by id) and those added since."""
        c = L.TABLE.c
        with self.sessions() as s:
            fresh = s.execute(select(*_COLUMNS).where(c.id > self._last_id).order_by(c.id)).all()
            ended = []
            if self._open:
                ids = list(self._open)
                for i in range(0, len(ids), 500):
                    ended += s.execute(select(*_COLUMNS).where(c.id.in_(ids[i:i + 500]), c.end.is_not(None))).all()
        if fresh:
            self._last_id = fresh[-1].id
        records = {**self._open, **{r.id: r for r in fresh}, **{r.id: r for r in ended}}
        self._open = {i: r for i, r in records.items() if r.end is None}
        out: dict[tuple[str, str], float] = {}
        span = now - since
        for r in records.values():
            a, b = max(r.start, since), min(r.end if r.end is not None else now, now)
            if b > a:
                for key in _keys(r):
                    out[key] = out.get(key, 0.0) + r.gpus * (b - a) / span
        return out
