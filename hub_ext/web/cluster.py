"""The pool as a whole: health, Prometheus metrics, queues, nodes; the service's root and the
answer for any other path."""
from __future__ import annotations

from sqlalchemy import select

from ...contract import decode_allocation
from ..domain.errors import APIError
from ..domain.identity import Identity
from ..store import tables as D
from . import schemas
from .base import BaseHandler
from .scopes import METRICS, PUBLIC, SUBMIT, needs_scope


class HealthHandler(BaseHandler):
    @needs_scope(PUBLIC)
    def get(self) -> None:
        self.send({"ok": True, "cycles": self.svc.loop.state.cycles})


class MetricsHandler(BaseHandler):
    @needs_scope(METRICS)
    def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(self.svc.metrics.render())


class QueuesHandler(BaseHandler):
    @needs_scope(SUBMIT)
    async def get(self) -> None:
        args = self.query(schemas.QueuesQuery)
        svc = self.svc
        who = self.ident  # may_submit is the caller's, or with ?user= (an admin: the spawner) that user's
        if args.user and args.user != who.name:
            if not who.admin:
                raise APIError(403, "user: you may only ask which queues you may use", "user")
            groups, hub_admin = await svc.auth.user_info(args.user)
            who = Identity(name=args.user, groups=groups, admin=hub_admin)
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
                "may_submit": svc.access.may_use(who, q.name),
            })
        self.send({"queues": out})


class NodesHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        svc = self.svc
        with svc.sessions() as s:
            rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None))).all()
        per_gpu: dict[tuple[str, int], list[dict]] = {}
        for row in rows:
            for p in decode_allocation(row.allocation):
                for g in p.gpus:
                    per_gpu.setdefault((p.node, g), []).append(
                        {"workload": row.public_id, "kind": row.kind, "user": row.user, "fraction": p.fraction})
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


class RootHandler(BaseHandler):
    @needs_scope(PUBLIC)
    def get(self) -> None:
        self.send({"service": "gpupool", "api": "api/v1/", "health": "api/v1/health"})


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:  # type: ignore[override]
        raise APIError(404, f"no such endpoint: {self.request.method} {self.request.path}")
