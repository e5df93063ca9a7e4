"""``jobs``: submit, list, read and cancel jobs; a job's log, output notebook and metrics
(docs/api.md)."""
from __future__ import annotations

import time

from sqlalchemy import select

from ...contract import StopCause
from ...protocol import JobDir
from ..domain import lifecycle
from ..domain.errors import APIError
from ..store import tables as D
from . import schemas, views
from .base import BaseHandler
from .scopes import JOB, SUBMIT, needs_scope


class JobsHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        args = self.query(schemas.JobListQuery)
        q = select(D.Workload).where(D.Workload.type == D.JOB)
        user = self.own_or_admin(args.user, "list your own jobs")
        if user:
            q = q.where(D.Workload.user == user)
        if args.statuses():
            q = q.where(D.Workload.status.in_(args.statuses()))
        for arg in ("sweep", "queue", "kind", "name"):
            val = getattr(args, arg)
            if val:
                q = q.where(getattr(D.Workload, arg) == val)
        q = q.order_by(D.Workload.id)
        if args.limit:
            q = q.order_by(None).order_by(D.Workload.id.desc()).limit(args.limit)
        with self.svc.sessions() as s:
            rows = list(s.scalars(q))
            if args.limit:
                rows.reverse()
            ms = views.metrics_for(s, [r.id for r in rows])
        st = self.svc.loop.state
        self.send({"jobs": [views.job(st, r, ms[r.id]) for r in rows]})

    @needs_scope(SUBMIT)
    async def post(self) -> None:
        request = self.body(schemas.JobRequest)
        row = await self.svc.new_job(self.ident, request)
        self.svc.loop.wake()
        self.send(views.job(self.svc.loop.state, row, {}), 201)


class JobHandler(BaseHandler):
    @needs_scope(JOB)
    def get(self, job_id: str) -> None:
        with self.svc.sessions() as s:
            row = self.load_job(s, job_id)
            ms = views.metrics_for(s, [row.id])
        self.send(views.job(self.svc.loop.state, row, ms[row.id]))

    @needs_scope(SUBMIT)
    async def delete(self, job_id: str) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
            who = self.ident.name
            now = time.time()
            if row.status == D.QUEUED and row.allocation is None:
                lifecycle.cancel_queued(row, who, now)
                s.commit()
                svc.metrics.finished.labels(status=D.CANCELLED).inc()
            elif row.allocation is not None and row.stop_cause != StopCause.CANCEL:
                await svc.loop.request_stop(row, StopCause.CANCEL, f"cancelled by {who}", now, session=s)
            ms = views.metrics_for(s, [row.id])
        svc.loop.wake()
        self.send(views.job(svc.loop.state, row, ms[row.id]))


class JobLogHandler(BaseHandler):
    @needs_scope(JOB)
    def get(self, job_id: str) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
        offset = self.query(schemas.LogQuery).offset
        rank = self.rank(row)
        path = JobDir.of(svc.settings.pool.job_root, row.public_id).worker_log(rank)
        data = b""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                limit = svc.settings.pool.max_log_bytes
                data = f.read(limit) if limit else f.read()
        except FileNotFoundError:
            offset = 0
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Log-Offset", str(offset + len(data)))
        self.finish(data)


class JobOutputHandler(BaseHandler):
    @needs_scope(JOB)
    def get(self, job_id: str) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
        if row.script or row.command:
            raise APIError(404, f"{row.public_id} is a {'script' if row.script else 'command'} job: it writes no output "
                                f"notebook (its output is in the log: jobs/{row.public_id}/log)")
        path = JobDir.of(svc.settings.pool.job_root, row.public_id).worker_output(self.rank(row))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            why = ("it has not started yet" if row.status == D.QUEUED and not row.attempt
                   else "papermill has not written it yet" if row.status in D.ACTIVE
                   else "it never ran" if not row.attempt else "papermill wrote none")
            raise APIError(404, f"no output notebook for {row.public_id}: {why}") from None
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.finish(data)


class JobMetricsHandler(BaseHandler):
    @needs_scope(JOB)
    def post(self, job_id: str) -> None:
        with self.svc.sessions() as s:
            row = self.load_job(s, job_id)  # an unknown job is a 404 whatever the body
            metric = self.body(schemas.MetricRequest)
            m = D.Metric(workload_id=row.id, name=metric.name, step=metric.step, value=metric.value, t=time.time())
            s.add(m)
            s.commit()
        self.send(views.metric(row.public_id, m), 201)
