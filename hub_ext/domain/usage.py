"""Consumption reports: GPU-hours allocated and used, from the ledger and the utilisation history.

* **allocated**: for every ledger record (store/ledger.py) the part of its interval inside the
  range, times its GPUs (``len(indices) * fraction``). An open record counts up to now.
* **used**: the same interval weighted by the NVML utilisation of its GPUs (runtime/sampling.py):
  ``fraction * utilisation/100`` over each period that has a reading. **measured**: the allocated
  GPU-hours that had readings. Where no reading exists (a declared inventory, NVML missing) used
  is ``null`` (unknown), never invented; ``utilization = used / measured``.

Groups: ``user``, ``queue`` (the leaf queue), ``department`` (the top of the queue's path; a root
queue is its own), ``model`` (GPU model), ``node``, ``pool`` (the node's pool: a record from before
pools is in pool ``default``), ``kind``, and calendar periods ``day``,
``week`` (ISO, from Monday) and ``month``, in UTC. A record that spans a period boundary is split,
so the groups of any grouping add up to the same total.
"""
from __future__ import annotations

import bisect
import csv
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from sqlalchemy import or_, select

from ...contract import USAGE_GROUPS as GROUPS
from ...contract import gpu_state
from ...contract import USAGE_PERIODS as PERIODS
from ...scheduler.model import DEFAULT_POOL
from ..store import ledger as L
from ..store import samples

COLUMNS = ("allocated_gpu_hours", "used_gpu_hours", "measured_gpu_hours", "utilization", "workloads")


class ReportError(ValueError):
    """Bad report parameters; ``field`` names the one at fault, ``reason`` says what is wrong."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


# the dates a report or history may name: no GPU was used before the epoch, and up to 9999-12-01
# every instant a report shows, and the day, week and month around it, is a date Python can write
# (its calendar stops at 9999-12-31: one day later was a 500)
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=timezone.utc), datetime(9999, 12, 1, tzinfo=timezone.utc)


def parse_time(text: str, field: str) -> float:
    """``2026-11-01`` (midnight UTC), ``2026-11-01T12:00[:00][Z|+01:00]`` -> epoch seconds, between
    :data:`EARLIEST` and :data:`LATEST`."""
    t = text.strip()
    try:
        dt = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith("Z") else t)
    except ValueError:
        raise ReportError(field, f"{text!r} is not a date (use e.g. 2026-11-01 or 2026-11-01T08:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    if not EARLIEST <= dt <= LATEST:
        raise ReportError(field, f"must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC)")
    return dt.timestamp()


def period_start(t: float, period: str) -> datetime:
    d = datetime.fromtimestamp(t, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        d -= timedelta(days=d.weekday())
    elif period == "month":
        d = d.replace(day=1)
    return d


def period_key(start: datetime, period: str) -> str:
    if period == "day":
        return start.strftime("%Y-%m-%d")
    if period == "week":
        year, week, _ = start.isocalendar()
        return f"{year}-W{week:02d}"
    return start.strftime("%Y-%m")


def _next_period(start: datetime, period: str) -> datetime:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def split_by_period(a: float, b: float, period: str) -> Iterable[tuple[str, float, float]]:
    start = period_start(a, period)
    while a < b:
        nxt = _next_period(start, period).timestamp()
        yield period_key(start, period), a, min(b, nxt)
        a = nxt
        start = _next_period(start, period)


@dataclass
class Row:
    allocated: float = 0.0  # GPU-seconds
    used: float = 0.0
    measured: float = 0.0
    workloads: set = field(default_factory=set)

    def view(self, key: str, by: str) -> dict:
        h = 3600.0
        return {by: key, "allocated_gpu_hours": round(self.allocated / h, 6),
                "used_gpu_hours": round(self.used / h, 6) if self.measured else None,
                "measured_gpu_hours": round(self.measured / h, 6),
                "utilization": round(100 * self.used / self.measured, 2) if self.measured else None,
                "workloads": len(self.workloads)}


class Readings:
    """The utilisation history of the GPUs a report touches, with prefix sums per GPU so that the
    overlap of any interval costs two binary searches (a GPU's rows do not overlap in time)."""

    def __init__(self, s: Any, since: float, until: float):
        c = samples.TABLE.c
        q = (select(c.node, c.gpu, c.t, c.seconds, c.utilization)
             .where(c.utilization.is_not(None), c.t < until, c.t + c.seconds > since).order_by(c.node, c.gpu, c.t))
        # (node, gpu) -> starts, ends, utilisations, cumulative seconds, cumulative weighted seconds
        self.series: dict[tuple[str, int], tuple[list[float], ...]] = {}
        for node, gpu, t, secs, util in s.execute(q):
            starts, ends, utils, cum, cum_w = self.series.setdefault((node, gpu), ([], [], [], [0.0], [0.0]))
            starts.append(t)
            ends.append(t + secs)
            utils.append(util / 100.0)
            cum.append(cum[-1] + secs)
            cum_w.append(cum_w[-1] + secs * util / 100.0)

    def overlap(self, node: str, gpu: int, a: float, b: float) -> tuple[float, float]:
        """(seconds with a reading, utilisation-weighted seconds) of one GPU within [a, b)."""
        found = self.series.get((node, gpu))
        if not found:
            return 0.0, 0.0
        starts, ends, utils, cum, cum_w = found
        i = bisect.bisect_right(ends, a)  # the first row ending after a
        j = bisect.bisect_left(starts, b)  # rows i..j-1 start before b
        if i >= j:
            return 0.0, 0.0
        covered, weighted = cum[j] - cum[i], cum_w[j] - cum_w[i]
        for k in {i, j - 1}:  # the rows cut by the interval's edges
            cut = (ends[k] - starts[k]) - max(0.0, min(b, ends[k]) - max(a, starts[k]))
            covered -= cut
            weighted -= cut * utils[k]
        return covered, weighted


def report(s: Any, since: float, until: float, by: str, now: float, user: str | None = None,
           queue: str | None = None) -> dict:
    """GPU-hours per group of ``by`` between ``since`` and ``until`` (epoch seconds)."""
    if by not in GROUPS:
        raise ReportError("by", f"must be one of {', '.join(GROUPS)}")
    if until <= since:
        raise ReportError("until", "must be after since")

    def pieces(r: Any, a: float, b: float) -> Iterable[tuple[str, float, float]]:
        if by in PERIODS:
            return split_by_period(a, b, by)
        key = {"user": r["user"], "queue": r["queue"], "department": r["department"], "kind": r["kind"],
               "model": r["gpu_model"] or "(unknown)", "node": r["node"], "pool": r["pool"] or DEFAULT_POOL}[by]
        return [(key, a, b)]

    groups, total = accumulate(s, since, until, now, pieces, user=user, queue=queue)
    rows = [groups[k].view(k, by) for k in sorted(groups)]
    if by not in PERIODS:
        rows.sort(key=lambda x: -x["allocated_gpu_hours"])
    return {"since": _iso(since), "until": _iso(until), "by": by, "rows": rows, "total": total.view("total", by)}


def timeline(s: Any, since: float, until: float, step: float, now: float, user: str | None = None) -> list[dict]:
    """GPUs allocated and used (means over each ``step``) from ``since`` to ``until``: the
    dashboard's allocation-versus-utilisation chart. ``used`` is None where nothing was measured."""
    def pieces(_r: Any, a: float, b: float) -> Iterable[tuple[str, float, float]]:
        k = int((a - since) // step)
        while a < b:
            edge = since + (k + 1) * step
            yield str(k), a, min(b, edge)
            a, k = edge, k + 1

    groups, _ = accumulate(s, since, until, now, pieces, user=user)
    out = []
    end = min(until, now)
    for k in range(max(0, math.ceil((end - since) / step))):
        g = groups.get(str(k), Row())
        width = min(step, end - (since + k * step))  # the current step: the part that has passed
        out.append({"t": _iso(since + k * step), "allocated": round(g.allocated / width, 4),
                    "used": round(g.used / width, 4) if g.measured else None})
    return out


def accumulate(s: Any, since: float, until: float, now: float, pieces: Any, user: str | None = None,
               queue: str | None = None) -> tuple[dict[str, Row], Row]:
    """GPU-seconds allocated / measured / used of the ledger records inside [since, until), per
    key of ``pieces(record, start, end) -> [(key, start, end)]``, and in total."""
    c = L.TABLE.c
    q = select(L.TABLE).where(c.start < until, or_(c.end.is_(None), c.end > since))
    if user:
        q = q.where(c.user == user)
    if queue:
        q = q.where(c.queue == queue)
    records = s.execute(q).mappings().all()
    readings = Readings(s, since, min(until, now))
    groups: dict[str, Row] = {}
    total = Row()
    for r in records:
        a, b = max(r["start"], since), min(r["end"] if r["end"] is not None else now, until)
        if b <= a:
            continue
        for key, pa, pb in pieces(r, a, b):
            row = groups.setdefault(key, Row())
            for target in (row, total):
                target.workloads.add(r["workload"])
            alloc = r["gpus"] * (pb - pa)
            covered = weighted = 0.0
            for g in r["gpu_indices"] or []:
                cv, w = readings.overlap(r["node"], g, pa, pb)
                covered += cv * r["fraction"]
                weighted += w * r["fraction"]
            for target in (row, total):
                target.allocated += alloc
                target.measured += covered
                target.used += weighted
    return groups, total


def history(s: Any, since: float, until: float, node: str | None = None, gpu: int | None = None,
            workload: str | None = None) -> list[dict]:
    """The stored NVML readings (runtime/sampling.py) per GPU in [since, until): of one GPU, of every
    GPU, or of the GPUs a workload held while it held them (from the ledger). Each point has its
    ``state``: busy, idle, or held (0 % while holding memory; ``contract.gpu_state``)."""
    spans: dict[tuple[str, int], list[tuple[float, float]]] | None = None
    if workload is not None:
        c = L.TABLE.c
        spans = {}
        for r in s.execute(select(L.TABLE).where(c.workload == workload, c.start < until,
                                                 or_(c.end.is_(None), c.end > since))).mappings():
            for g in r["gpu_indices"] or []:
                spans.setdefault((r["node"], int(g)), []).append((max(r["start"], since),
                                                                  min(r["end"] or until, until)))
    c = samples.TABLE.c
    q = select(c.node, c.gpu, c.t, c.seconds, c.utilization, c.memory_used).where(c.t < until, c.t + c.seconds > since)
    if node is not None:
        q = q.where(c.node == node)
    if gpu is not None:
        q = q.where(c.gpu == gpu)
    series: dict[tuple[str, int], list[dict]] = {}
    for n, g, t, secs, util, mem in s.execute(q.order_by(c.node, c.gpu, c.t)):
        if spans is not None and not any(t < b and t + secs > a for a, b in spans.get((n, g), ())):
            continue
        series.setdefault((n, g), []).append({"t": _iso(t), "seconds": secs, "utilization": util,
                                              "memory_used": mem, "state": gpu_state(util, mem)})
    return [{"node": n, "gpu": g, "points": pts} for (n, g), pts in sorted(series.items())]


def to_csv(doc: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    by = doc["by"]
    w.writerow([by, *COLUMNS])
    for r in [*doc["rows"], doc["total"]]:
        w.writerow([r[by], *("" if r[k] is None else r[k] for k in COLUMNS)])
    return out.getvalue()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
