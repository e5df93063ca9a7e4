"""``usage``: GPU-hours allocated and used (the numbers: domain/usage.py) and the stored NVML
readings."""
from __future__ import annotations

import time

from sqlalchemy import select

from ..domain.errors import APIError
from ..domain.usage import ReportError, history, period_start, report, to_csv
from ..store import ledger
from ..store import tables as D
from . import schemas
from .base import BaseHandler, iso
from .scopes import SUBMIT, needs_scope


class UsageHandler(BaseHandler):
    """``GET usage?since=2026-11-01&until=...&by=user&user=&queue=&format=csv`` (docs/api.md)."""

    @needs_scope(SUBMIT)
    def get(self) -> None:
        now = time.time()
        args = self.query(schemas.UsageQuery)
        user = self.own_or_admin(args.user, "see your own usage (admins see everyone's)")
        until = args.until if args.until is not None else now
        # default: the current month (of until)
        since = args.since if args.since is not None else period_start(until - 1e-6, "month").timestamp()
        try:
            with self.svc.sessions() as s:
                doc = report(s, since, until, args.by, now, user=user, queue=args.queue or None)
        except ReportError as e:
            raise APIError(400, str(e), e.field) from None
        doc["user"] = user
        if args.format == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="gpupool-usage-by-{doc["by"]}.csv"')
            self.finish(to_csv(doc))
            return
        self.send(doc)


class UsageHistoryHandler(BaseHandler):
    """``GET usage/history?since=&until=&node=&gpu=&workload=``: stored utilisation readings per GPU
    (any user: GPUs are public, like GET nodes) or of one workload's GPUs (its owner or an admin)."""

    @needs_scope(SUBMIT)
    def get(self) -> None:
        args = self.query(schemas.UsageHistoryQuery)
        until = args.until if args.until is not None else time.time()
        since = args.since if args.since is not None else until - 86400
        if until <= since:
            raise APIError(400, "until: must be after since", "until")
        with self.svc.sessions() as s:
            if args.workload:
                parsed = D.parse_public_id(args.workload)
                row = s.get(D.Workload, parsed[1]) if parsed else None
                if row is not None and row.type != parsed[0]:  # j-5 is not w-5
                    row = None
                owner = row.user if row is not None else s.scalar(
                    select(ledger.TABLE.c.user).where(ledger.TABLE.c.workload == args.workload).limit(1))
                if owner is None:
                    raise APIError(404, f"no workload {args.workload!r}", "workload")
                if not (self.ident.admin or owner == self.ident.name):
                    raise APIError(403, f"workload {args.workload} belongs to another user", "workload")
            series = history(s, since, until, args.node, args.gpu, args.workload)
        self.send({"since": iso(since), "until": iso(until), "workload": args.workload, "series": series})
