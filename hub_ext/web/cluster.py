"""The pool as a whole: health, Prometheus metrics, queues (nodes: nodes.py); the service's root and
the answer for any other path."""
from __future__ import annotations

from ..domain.errors import APIError
from ..domain.identity import Identity
from . import schemas
from .base import BaseHandler
from .pools import pools_of, queue_entry
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
        pools = pools_of(svc)  # each queue's quota, share, allocation and usage per node pool
        for q in svc.settings.queues:
            view = st.queues.get(q.name)
            acc = svc.settings.access.get(q.name, {})
            out.append({
                "name": q.name, "parent": q.parent, "deserved": q.deserved, "limit": q.limit,
                "over_quota_weight": q.over_quota_weight, "priority": q.priority,
                "fair_share": st.fair_share.get(q.name, {}), "allocated": st.allocated.get(q.name, {}),
                "running": view.running if view else 0, "pending": view.pending if view else 0,
                "users": acc.get("users", []), "groups": acc.get("groups", []),
                "may_submit": svc.access.may_use(who, q.name), **queue_entry(svc, q, pools),
            })
        self.send({"queues": out})


class RootHandler(BaseHandler):
    @needs_scope(PUBLIC)
    def get(self) -> None:
        self.send({"service": "gpupool", "api": "api/v1/", "health": "api/v1/health"})


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:  # type: ignore[override]
        raise APIError(404, f"no such endpoint: {self.request.method} {self.request.path}")
