"""REST handlers of the gpupool service (docs/api.md)."""
from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from tornado import web

from .. import contract as C
from ..backends.base import worker_file
from ..scheduler.spec import SpecError
from . import db as D
from . import schemas as S
from .auth import AuthError, Identity


class APIError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class BaseHandler(web.RequestHandler):
    auth_required = True

    @property
    def svc(self) -> Any:
        return self.application.settings["gpupool"]

    def check_xsrf_cookie(self) -> None:  # token auth only; no cookies
        return

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        self.ident: Identity | None = None
        if self.auth_required:
            try:
                self.ident = await self.svc.auth.identify(self)
            except AuthError as e:
                raise APIError(e.status, e.message) from None

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, S.Invalid):
            e = APIError(400, e.message, e.field)
        if isinstance(e, APIError):
            if not self._finished:
                self.set_status(e.status)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(C.error_payload(e.status, e.message, e.field)))
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info")
        if exc and isinstance(exc[1], web.HTTPError) and exc[1].log_message:
            message = exc[1].log_message
        elif status_code >= 500:
            message = "internal error in the gpupool service (see its log)"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(C.error_payload(status_code, message)))

    def send(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(obj))

    def body(self, model: type[S.BaseModel] | None = None) -> Any:
        """The JSON body as ``model`` (a 400 naming the field when it is not one). Without a model:
        the JSON object as a dict (give new endpoints a model in schemas.py instead)."""
        data: Any = {}
        if self.request.body:
            try:
                data = json.loads(self.request.body)
            except (ValueError, RecursionError) as e:
                raise APIError(400, f"body: not valid JSON ({e})", "body") from None
            _check_text(data)
        if model is None:
            if not isinstance(data, dict):
                raise APIError(400, "body: must be a JSON object", "body")
            return data
        return S.parse(model, data)

    def query(self, model: type[S.BaseModel]) -> Any:
        """The query arguments as ``model`` (the last value of a repeated argument)."""
        args = {k: self.get_argument(k) for k in self.request.query_arguments}
        return S.parse(model, args)

    def require_admin(self) -> None:
        if not (self.ident and self.ident.admin):
            raise APIError(403, "this needs the custom:gpupool:admin scope")

    def require_user_token(self) -> None:
        if self.ident is not None and self.ident.kind == "job":
            raise APIError(403, "a job token may only read its own job and post its metrics")

    def rank(self, row: D.Workload) -> int:
        """The ``rank`` query argument (a worker of a distributed job; default 0)."""
        rank = self.query(S.RankQuery).rank
        pods = int(row.pods or 1)
        if rank >= pods:
            raise APIError(400, f"rank: must be a worker's rank, 0 to {pods - 1} ({row.public_id} has {pods} "
                                f"worker{'s' if pods != 1 else ''})", "rank")
        return rank

    def load_job(self, s: Any, job_id: str) -> D.Workload:
        parsed = C.parse_public_id(job_id)
        row = s.get(D.Workload, parsed[1]) if parsed and parsed[0] == D.JOB else None
        if row is None or row.type != D.JOB:
            raise APIError(404, f"no job {job_id!r}")
        if not self.ident.owns(row):
            raise APIError(403, f"job {job_id} belongs to another user")
        return row


def _text_ok(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(data: Any) -> None:
    """JSON may escape a lone surrogate (``"\\ud800"``), which no database stores as text: a 400."""
    if _text_ok(data):
        return
    field = next((str(k) for k, v in data.items() if not (_text_ok(k) and _text_ok(v))), "body") \
        if isinstance(data, dict) else "body"
    raise APIError(400, f"{field}: must be valid Unicode text (a lone surrogate such as \\ud800 is not)", field)


# ---------------------------------------------------------------------------------- views

def job_view(svc: Any, row: D.Workload, metrics: dict | None = None) -> dict:
    st = svc.loop.state
    pid = row.public_id
    queued = row.status == D.QUEUED
    why = st.pending.get(pid) if queued else None
    reason = str(why) if why is not None else row.reason
    ckpt = None
    if row.checkpoint_path or row.last_checkpoint_at:
        ckpt = {"latest": row.checkpoint_path, "at": iso(row.last_checkpoint_at)}
    return {
        "id": pid, "name": row.name, "user": row.user, "queue": row.queue, "kind": row.kind,
        "status": row.status, "reason": reason, "reason_code": C.reason_code(why),
        "position": st.positions.get(pid) if queued else None,
        "gpus": row.gpus, "gpu_memory": row.gpu_memory or None, "cpu": row.cpu, "memory": row.memory,
        "priority": row.priority, "preemptible": row.preemptible, "checkpoint_on_signal": row.checkpoint_on_signal,
        "notebook": row.notebook, "parameters": row.parameters or {}, "sweep": row.sweep,
        "submitted_at": iso(row.submitted_at), "started_at": iso(row.started_at), "finished_at": iso(row.finished_at),
        "preemptions": row.preemptions, "restarts": row.restarts, "attempts": row.attempt,
        "allocation": C.allocation_to_api(row.allocation), "exit_code": row.exit_code,
        "metrics": metrics if metrics is not None else {}, "checkpoint": ckpt,
        "script": row.script, "args": row.args, "command": row.command, "pods": int(row.pods or 1),
        "workers": workers_view(row),
    }


def workers_view(row: Any) -> list[dict]:
    """The workers of a job (one for a plain job): rank, where it runs, its log (``?rank=``)."""
    placed = {int(p.get("pod", 0)): p for p in (row.allocation or [])}
    out = []
    for rank in range(int(row.pods or 1)):
        p = placed.get(rank)
        out.append({"rank": rank, "node": p["node"] if p else None, "gpus": list(p.get("gpus", [])) if p else [],
                    "fraction": p.get("fraction", 1.0) if p else None,
                    "log": f"jobs/{row.public_id}/log" + (f"?rank={rank}" if rank else "")})
    return out


def workspace_view(svc: Any, row: D.Workload, env: bool = True) -> dict:
    st = svc.loop.state
    pid = row.public_id
    queued = row.status == D.QUEUED
    why = st.pending.get(pid) if queued else None
    reason = str(why) if why is not None else row.reason
    out = {"id": pid, "user": row.user, "server": row.server, "status": row.status, "queue": row.queue,
           "gpus": row.gpus, "gpu_memory": row.gpu_memory or None, "cpu": row.cpu, "memory": row.memory,
           "preemptible": row.preemptible, "priority": row.priority, "reason": reason,
           "reason_code": C.reason_code(why),
           "position": st.positions.get(pid) if queued else None,
           "allocation": C.allocation_to_api(row.allocation),
           "submitted_at": iso(row.submitted_at), "started_at": iso(row.started_at),
           "last_activity": getattr(svc, "server_activity", {}).get((row.user, row.server))}
    if env:
        out["env"] = row.env or {} if row.status == D.RUNNING else {}
    return out


def metrics_for(s: Any, ids: list[int]) -> dict[int, dict[str, list]]:
    out: dict[int, dict[str, list]] = {i: {} for i in ids}
    if not ids:
        return out
    for chunk in range(0, len(ids), 500):
        part = ids[chunk:chunk + 500]
        q = select(D.Metric).where(D.Metric.workload_id.in_(part)).order_by(D.Metric.id)
        for m in s.scalars(q):
            out[m.workload_id].setdefault(m.name, []).append({"step": m.step, "value": m.value, "t": iso(m.t)})
    return out


# ---------------------------------------------------------------------------------- handlers

class HealthHandler(BaseHandler):
    auth_required = False

    def get(self) -> None:
        self.send({"ok": True, "cycles": self.svc.loop.state.cycles})


class OpenAPIHandler(BaseHandler):
    """The OpenAPI 3.1 description of this API; no token needed (it holds no data, only shapes)."""

    auth_required = False

    def get(self) -> None:
        from .openapi import document

        self.send(document(self.settings["gpupool_api_path"], tuple(self.svc.leaves)))


class MetricsHandler(BaseHandler):
    @property
    def auth_required(self) -> bool:  # type: ignore[override]
        return self.svc.settings.pool.metrics_require_auth

    def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(self.svc.metrics.render())


class QueuesHandler(BaseHandler):
    async def get(self) -> None:
        self.require_user_token()
        args = self.query(S.QueuesQuery)
        svc = self.svc
        who = self.ident  # may_submit is the caller's, or with ?user= (an admin: the spawner) that user's
        if args.user and args.user != who.name:
            if not who.admin:
                raise APIError(403, "user: you may only ask which queues you may use", "user")
            groups, admin = await svc.auth.user_info(args.user)
            who = Identity(name=args.user, groups=groups, admin=admin)
        st = svc.loop.state
        out = []
        for q in svc.settings.queues:
            view = st.queues.get(q.name)
            acc = svc.settings.access.get(q.name, {})
            out.append({
                "name": q.name, "parent": q.parent, "deserved": q.deserved, "limit": q.limit,
                "over_quota_weight": q.over_quota_weight, "priority": q.priority,
                "fair_share": st.fair_share.get(q.name, {}), "allocated": st.allocated.get(q.name, {}),
                "running": view.running if view else 0, "pending": view.pending if view else 0,
                "users": acc.get("users", []), "groups": acc.get("groups", []),
                "may_submit": svc.may_use(who, q.name),
            })
        self.send({"queues": out})


class NodesHandler(BaseHandler):
    def get(self) -> None:
        self.require_user_token()
        svc = self.svc
        with svc.sessions() as s:
            rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None))).all()
        per_gpu: dict[tuple[str, int], list[dict]] = {}
        for row in rows:
            for p in row.allocation or []:
                for g in p.get("gpus", []):
                    per_gpu.setdefault((p["node"], g), []).append(
                        {"workload": row.public_id, "kind": row.kind, "user": row.user,
                         "fraction": p.get("fraction", 1.0)})
        readings = svc.gpu_readings()
        out = []
        for n in svc.settings.nodes:
            uuids = svc.settings.gpu_uuids.get(n.name) or []
            live = readings.get(n.name, {})
            gpus = []
            for i in range(n.gpus):
                allocs = per_gpu.get((n.name, i), [])
                r = live.get(i, {})
                gpus.append({"index": i, "uuid": uuids[i] if i < len(uuids) else None,
                             "allocated": round(sum(a["fraction"] for a in allocs), 3),
                             "utilization": r.get("utilization"), "memory_used": r.get("memory_used"),
                             "memory_total": r.get("memory_total") or n.gpu_memory or None,
                             "allocations": allocs})
            node = {"name": n.name, "gpu_model": n.gpu_model, "gpu_memory": n.gpu_memory,
                    "schedulable": n.schedulable, "labels": n.labels, "gpus": gpus}
            if not n.schedulable:
                node["unschedulable_reason"] = svc.loop.node_reasons.get(n.name) or "marked unschedulable"
            out.append(node)
        self.send({"nodes": out})


class JobsHandler(BaseHandler):
    def get(self) -> None:
        self.require_user_token()
        ident = self.ident
        args = self.query(S.JobListQuery)
        q = select(D.Workload).where(D.Workload.type == D.JOB)
        user = args.user
        if user and not ident.admin and user != ident.name:
            raise APIError(403, "user: you may only list your own jobs", "user")
        if not ident.admin:
            user = ident.name
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
            ms = metrics_for(s, [r.id for r in rows])
        self.send({"jobs": [job_view(self.svc, r, ms[r.id]) for r in rows]})

    async def post(self) -> None:
        self.require_user_token()
        request = self.body(S.JobRequest)
        row = await self.svc.new_job(self.ident, request)
        self.svc.loop.wake()
        self.send(job_view(self.svc, row, {}), 201)


class JobHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        with self.svc.sessions() as s:
            row = self.load_job(s, job_id)
            ms = metrics_for(s, [row.id])
        self.send(job_view(self.svc, row, ms[row.id]))

    async def delete(self, job_id: str) -> None:
        self.require_user_token()
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
            who = self.ident.name
            now = time.time()
            if row.status == D.QUEUED and row.allocation is None:
                row.status = D.CANCELLED
                row.finished_at = now
                row.reason = f"cancelled by {who} before it started"
                s.commit()
                svc.metrics.finished.labels(status=D.CANCELLED).inc()
            elif row.allocation is not None and row.stop_cause != "cancel":
                await svc.loop.request_stop(row, "cancel", f"cancelled by {who}", now, session=s)
            ms = metrics_for(s, [row.id])
        svc.loop.wake()
        self.send(job_view(svc, row, ms[row.id]))


class JobLogHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
        offset = self.query(S.LogQuery).offset
        rank = self.rank(row)
        path = worker_file(os.path.join(svc.settings.pool.job_root, row.public_id, "log.txt"), rank)
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
    def get(self, job_id: str) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self.load_job(s, job_id)
        if row.script or row.command:
            raise APIError(404, f"{row.public_id} is a {'script' if row.script else 'command'} job: it writes no output "
                                f"notebook (its output is in the log: jobs/{row.public_id}/log)")
        path = worker_file(os.path.join(svc.settings.pool.job_root, row.public_id, "output.ipynb"), self.rank(row))
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
    def post(self, job_id: str) -> None:
        with self.svc.sessions() as s:
            row = self.load_job(s, job_id)  # an unknown job is a 404 whatever the body
            metric = self.body(S.MetricRequest)
            m = D.Metric(workload_id=row.id, name=metric.name, step=metric.step, value=metric.value, t=time.time())
            s.add(m)
            s.commit()
        self.send({"job": row.public_id, "name": m.name, "step": m.step, "value": m.value, "t": iso(m.t)}, 201)


class WorkspacesHandler(BaseHandler):
    def get(self) -> None:
        self.require_user_token()
        with self.svc.sessions() as s:
            rows = s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE,
                                                      D.Workload.status.in_(D.ACTIVE)).order_by(D.Workload.id)).all()
        ident = self.ident
        self.send({"workspaces": [workspace_view(self.svc, r, env=ident.admin or r.user == ident.name) for r in rows]})


class WorkspaceHandler(BaseHandler):
    def _find(self, s: Any, user: str, server: str) -> D.Workload | None:
        return s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE, D.Workload.user == user,
                                                  D.Workload.server == server,
                                                  D.Workload.status.in_(D.ACTIVE))).first()

    def get(self, user: str, server: str | None = None) -> None:
        self.require_user_token()
        if not (self.ident.admin or self.ident.name == user):
            raise APIError(403, f"the workspace of {user} belongs to another user")
        with self.svc.sessions() as s:
            row = self._find(s, user, server or "")
        if row is None:
            raise APIError(404, f"no workspace for {user}{'/' + server if server else ''}")
        self.send(workspace_view(self.svc, row))

    async def post(self, user: str, server: str | None = None) -> None:
        self.require_admin()
        request = self.body(S.WorkspaceRequest)
        if server is None:
            server = request.server or ""
        row, created = await self.svc.request_workspace(user, server, request)
        self.svc.loop.wake()
        self.send(workspace_view(self.svc, row), 201 if created else 200)

    def delete(self, user: str, server: str | None = None) -> None:
        self.require_admin()
        svc = self.svc
        with svc.sessions() as s:
            row = self._find(s, user, server or "")
            if row is None:
                raise APIError(404, f"no workspace for {user}{'/' + server if server else ''}")
            view = workspace_view(svc, row)
            s.delete(row)  # frees its GPUs at once: the server is gone
            s.commit()
        svc.loop.wake()
        view.update(status=C.STOPPED, allocation=[], env={}, reason="stopped: its GPUs are free", reason_code=None)
        self.send(view)


class NotFoundHandler(BaseHandler):
    auth_required = False

    def prepare(self) -> None:  # type: ignore[override]
        raise APIError(404, f"no such endpoint: {self.request.method} {self.request.path}")


class RootHandler(BaseHandler):
    auth_required = False

    def get(self) -> None:
        self.send({"service": "gpupool", "api": "api/v1/", "health": "api/v1/health"})


def routes(prefix: str) -> list[tuple]:
    api = prefix.rstrip("/") + "/api/v1"
    return [
        (rf"{api}/health/?", HealthHandler),
        (rf"{api}/openapi.json", OpenAPIHandler),
        (rf"{api}/metrics/?", MetricsHandler),
        (rf"{api}/queues/?", QueuesHandler),
        (rf"{api}/nodes/?", NodesHandler),
        (rf"{api}/jobs/?", JobsHandler),
        (rf"{api}/jobs/([^/]+)/?", JobHandler),
        (rf"{api}/jobs/([^/]+)/log/?", JobLogHandler),
        (rf"{api}/jobs/([^/]+)/output/?", JobOutputHandler),
        (rf"{api}/jobs/([^/]+)/metrics/?", JobMetricsHandler),
        (rf"{api}/workspaces/?", WorkspacesHandler),
        (rf"{api}/workspaces/([^/]+)/?", WorkspaceHandler),
        (rf"{api}/workspaces/([^/]+)/([^/]*)/?", WorkspaceHandler),
        (rf"{prefix.rstrip('/')}/?", RootHandler),
        (r".*", NotFoundHandler),
    ]


def spec_error(e: SpecError) -> APIError:
    field = e.path.split(".", 1)[1] if "." in e.path else e.path
    return APIError(400, f"{field}: {e.message}", field)


__all__ = ["routes", "APIError", "spec_error"]
