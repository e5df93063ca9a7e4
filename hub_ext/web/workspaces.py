"""``workspaces``: the admission of notebook servers (the spawner asks, as an admin), and who holds
what (docs/workspaces.md)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select

from ... import contract as C
from ..domain.errors import APIError
from ..store import tables as D
from . import schemas, views
from .base import BaseHandler
from .scopes import ADMIN, SUBMIT, needs_scope


def _view(svc: Any, row: D.Workload, env: bool = True, **changes: Any) -> dict:
    return views.workspace(svc.loop.state, row, svc.server_activity, env=env, **changes)


class WorkspacesHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        with self.svc.sessions() as s:
            rows = s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE,
                                                      D.Workload.status.in_(D.ACTIVE)).order_by(D.Workload.id)).all()
        ident = self.ident
        self.send({"workspaces": [_view(self.svc, r, env=ident.admin or r.user == ident.name) for r in rows]})


class WorkspaceHandler(BaseHandler):
    def _find(self, s: Any, user: str, server: str) -> D.Workload | None:
        return s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE, D.Workload.user == user,
                                                  D.Workload.server == server,
                                                  D.Workload.status.in_(D.ACTIVE))).first()

    @needs_scope(SUBMIT)
    def get(self, user: str, server: str | None = None) -> None:
        if not (self.ident.admin or self.ident.name == user):
            raise APIError(403, f"the workspace of {user} belongs to another user")
        with self.svc.sessions() as s:
            row = self._find(s, user, server or "")
        if row is None:
            raise APIError(404, f"no workspace for {user}{'/' + server if server else ''}")
        self.send(_view(self.svc, row))

    @needs_scope(ADMIN)
    async def post(self, user: str, server: str | None = None) -> None:
        request = self.body(schemas.WorkspaceRequest)
        if server is None:
            server = request.server or ""
        row, created = await self.svc.request_workspace(user, server, request)
        self.svc.loop.wake()
        self.send(_view(self.svc, row), 201 if created else 200)

    @needs_scope(ADMIN)
    def delete(self, user: str, server: str | None = None) -> None:
        svc = self.svc
        with svc.sessions() as s:
            row = self._find(s, user, server or "")
            if row is None:
                raise APIError(404, f"no workspace for {user}{'/' + server if server else ''}")
            view = _view(svc, row, status=C.STOPPED, allocation=[], env={}, reason="stopped: its GPUs are free",
                         reason_code=None)
            s.delete(row)  # frees its GPUs at once: the server is gone
            s.commit()
        svc.loop.wake()
        self.send(view)
