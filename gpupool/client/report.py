"""``gpupool report``: GPU-hours allocated and used, grouped (docs/admin.md, ``GET usage``).

::

    gpupool report [--since 2026-11-01] [--until 2026-12-01] --by user|queue|department|model|node|kind|day|week|month
                   [--user U] [--queue Q] [--csv | --json]

Admins see everyone; other users their own usage. Dates are UTC (``2026-11-01`` is its midnight).
Without ``--since``: the last 7 days (:data:`DEFAULT_DAYS`).
"""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from ..contract import DEFAULT_USAGE_GROUP, USAGE_GROUPS
from .cli import _client, _common, _guard, _num, _print_json, table


DEFAULT_DAYS = 7  # what `gpupool report` covers without --since


def default_since(now: float | None = None) -> str:
    """``--since`` when it is not given: 7 days before now, as the API takes it (ISO 8601, UTC)."""
    t = (time.time() if now is None else now) - DEFAULT_DAYS * 86400
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(x) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def cmd_report(args) -> int:
    params = {"since": args.since or default_since(), "until": args.until, "by": args.by, "user": args.user, "queue": args.queue}
    params = {k: v for k, v in params.items() if v}
    c = _client(args)
    if args.csv:
        resp = c.request("GET", "usage", params={**params, "format": "csv"}, raw=True)
        sys.stdout.write(resp.text)
        return 0
    doc = c.get("usage", params=params)
    if args.json:
        _print_json(doc)
        return 0
    by = doc["by"]
    print(f"GPU-hours from {doc['since']} to {doc['until']}"
          + (f" for {doc['user']}" if doc.get("user") else "") + (f" in queue {args.queue}" if args.queue else ""))
    rows = [(r[by], _hours(r["allocated_gpu_hours"]), _hours(r["used_gpu_hours"]),
             "-" if r["utilization"] is None else f"{_num(r['utilization'])}%", r["workloads"])
            for r in [*doc["rows"], doc["total"]]]
    print(table([by.upper(), "ALLOCATED", "USED", "UTILIZATION", "WORKLOADS"], rows))
    if doc["total"]["used_gpu_hours"] is None and doc["total"]["allocated_gpu_hours"]:
        print("used: unknown (no NVML utilisation readings for these GPUs)")
    elif doc["total"]["measured_gpu_hours"] < doc["total"]["allocated_gpu_hours"] - 1e-9:
        print(f"used counts only the {doc['total']['measured_gpu_hours']:.2f} allocated GPU-hours that had NVML "
              "readings; the rest is unknown")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="GPU-hours allocated and used, per user/queue/department/model/day",
                              description=__doc__.split("::")[0].strip(), parents=[_common()])
    p.add_argument("--since", help="start date (UTC), e.g. 2026-11-01 or 2026-11-01T08:00Z (default: 7 days ago)")
    p.add_argument("--until", help="end date (default: now)")
    p.add_argument("--by", choices=USAGE_GROUPS, default=DEFAULT_USAGE_GROUP,
                   help=f"grouping (default: {DEFAULT_USAGE_GROUP})")
    p.add_argument("--user", help="only this user's usage (admins)")
    p.add_argument("--queue", help="only this queue")
    p.add_argument("--csv", action="store_true", help="print CSV (for a spreadsheet)")
    p.set_defaults(func=_guard(cmd_report))
