"""Past usage for fairness over time: GPU-seconds per queue over a window, decayed, normalised.

An adapter records, after each cycle, how many GPUs every queue held over the time since the
last record (``record``), and hands ``normalised(now)`` to the next ``Snapshot.usage``. The
number for a queue is its usage as a share of the capacity over the same window, both weighed by
the same decay, as KAI-Scheduler computes it (its Prometheus query divides the queue's decayed
allocation by the cluster's decayed capacity):

    usage(q) = sum over the window of 2^(-(now - s) / half_life) * allocated(q, s) ds
               / the same sum of capacity(s)

``window_type`` ``sliding``: the last ``window`` seconds, and the capacity is the whole window's
(before the first record the capacity first recorded is assumed, with no usage: a young cluster
is not a full one); ``tumbling``: since the start of the current window
(``floor(now / window) * window``), both usage and capacity, so usage resets at each window's
start. Without ``half_life`` nothing decays. Keys are whatever the adapter uses (the simulator and the
hub use ``(pool, queue)``, departments included), and each key is normalised by the capacity
recorded for its pool (``pool_of(key)``).

Cost: ``record`` is O(keys held), ``normalised`` O(keys); expired records are dropped as time
passes, so a cycle never rescans history. Pure: the caller passes the times.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Hashable, Mapping

WINDOW_TYPES = ("sliding", "tumbling")


@dataclass(frozen=True)
class FairnessConfig:
    """``config.fairness`` of a scenario / ``c.GPUPool.fairness`` of the hub."""

    window: float = 3600.0
    window_type: str = "sliding"
    half_life: float | None = None
    k: float = 1.0

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError("window must be > 0 seconds")
        if self.window_type not in WINDOW_TYPES:
            raise ValueError(f"window_type must be one of {', '.join(WINDOW_TYPES)}")
        if self.half_life is not None and not self.half_life > 0:
            raise ValueError("half_life must be > 0 seconds (or absent: no decay)")
        if not self.k >= 0:
            raise ValueError("k must be >= 0")


class UsageHistory:
    """Decayed usage over a window, kept as running sums (see the module doc)."""

    def __init__(self, config: FairnessConfig):
        self.config = config
        self._rate = math.log(2) / config.half_life if config.half_life else 0.0
        self._t = 0.0  # the time the sums are valid at
        self._used: dict[Hashable, float] = {}
        self._cap: dict[Hashable, float] = {}  # per pool
        self._chunks: deque[tuple[float, dict, dict]] = deque()  # (end, used, capacity) at their end
        self._period: int | None = None  # tumbling: the index of the current window
        self._first: dict[Hashable, tuple[float, float]] = {}  # pool -> (first record's start, capacity)

    def _decay(self, dt: float) -> float:
        return math.exp(-self._rate * dt) if self._rate and dt > 0 else 1.0

    def _advance(self, t: float) -> None:
        f = self._decay(t - self._t)
        if f != 1.0:
            for d in (self._used, self._cap):
                for k in d:
                    d[k] *= f
        self._t = max(self._t, t)

    def _weight(self, t0: float, t1: float) -> float:
        """The decayed length of [t0, t1] as seen at t1."""
        if not self._rate:
            return t1 - t0
        return (1.0 - math.exp(-self._rate * (t1 - t0))) / self._rate

    def _reset_if_new_period(self, t: float) -> None:
        if self.config.window_type != "tumbling":
            return
        period = math.floor(t / self.config.window + 1e-12)
        if period != self._period:
            self._period = period
            self._used.clear()
            self._cap.clear()
            self._chunks.clear()
            self._t = t

    def record(self, t0: float, t1: float, used: Mapping[Hashable, float], capacity: Mapping[Hashable, float]) -> None:
        """Over [t0, t1], each key held ``used[key]`` GPUs and each pool had ``capacity[pool]``."""
        if t1 <= t0:
            return
        if self.config.window_type == "tumbling":
            start = math.floor(t1 / self.config.window + 1e-12) * self.config.window
            self._reset_if_new_period(t1)
            t0 = max(t0, start)
            if t1 <= t0:
                return
        for k, v in capacity.items():
            self._first.setdefault(k, (t0, v))
        self._advance(t1)
        w = self._weight(t0, t1)
        u = {k: v * w for k, v in used.items() if v}
        c = {k: v * w for k, v in capacity.items() if v}
        for k, v in u.items():
            self._used[k] = self._used.get(k, 0.0) + v
        for k, v in c.items():
            self._cap[k] = self._cap.get(k, 0.0) + v
        self._chunks.append((t1, u, c))

    def _expire(self, now: float) -> None:
        if self.config.window_type == "tumbling":
            self._reset_if_new_period(now)
            return
        edge = now - self.config.window
        while self._chunks and self._chunks[0][0] <= edge:
            end, u, c = self._chunks.popleft()
            f = self._decay(self._t - end)
            for d, sub in ((self._used, u), (self._cap, c)):
                for k, v in sub.items():
                    left = d.get(k, 0.0) - v * f
                    if left <= 1e-9 * max(1.0, v):
                        d.pop(k, None)
                    else:
                        d[k] = left

    def normalised(self, now: float, pool_of=lambda key: key[0]) -> dict[Hashable, float]:
        """Each key's usage as a share of its pool's capacity over the window (0 to 1)."""
        self._expire(now)
        cap = dict(self._cap)  # as of self._t; used is too, so the ratio needs no decay to ``now``
        if self.config.window_type == "sliding":
            start = now - self.config.window
            for k, (t0, c) in self._first.items():
                if start < t0:  # the part of the window before the first record: idle capacity
                    f = self._decay(self._t - t0)
                    cap[k] = cap.get(k, 0.0) + c * self._weight(start, t0) * f
        out = {}
        for k, v in self._used.items():
            c = cap.get(pool_of(k), 0.0)
            if c > 0:
                out[k] = min(1.0, v / c)
        return out

    def by_pool(self, now: float) -> dict[str, dict[str, float]]:
        """``normalised`` for ``(pool, queue)`` keys, shaped as ``Snapshot.usage``."""
        out: dict[str, dict[str, float]] = {}
        for (pool, queue), v in self.normalised(now).items():
            out.setdefault(pool, {})[queue] = v
        return out
