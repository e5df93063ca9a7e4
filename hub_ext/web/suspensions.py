"""``suspensions``: workspaces suspended by an idle rule or their maximum run time (runtime/idle.py),
and resuming one: the service asks the hub to start the server again with the same options."""
from __future__ import annotations

import json
import re
import time
from urllib.parse import quote

from sqlalchemy import select
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ...contract import ID_DIGITS
from ..domain.errors import APIError
from ..domain.idle_rules import clock_words
from ..store import tables as D
from . import schemas, views
from .base import BaseHandler
from .scopes import SUBMIT, needs_scope

SUSPENSION_ID = rf"[0-9]{{1,{ID_DIGITS}}}"  # as job ids: what a database integer holds for sure


class SuspensionsHandler(BaseHandler):
    """``GET suspensions[?user=U&all=1]``: own (admins: everyone's); not yet resumed unless all=1."""

    @needs_scope(SUBMIT)
    def get(self) -> None:
        args = self.query(schemas.SuspensionsQuery)
        q = select(D.Suspension).order_by(D.Suspension.id)
        user = self.own_or_admin(args.user, "see your own suspensions")
        if user:
            q = q.where(D.Suspension.user == user)
        if not args.all:
            q = q.where(D.Suspension.resumed_at.is_(None))
        with self.svc.sessions() as s:
            self.send({"suspensions": [views.suspension(x) for x in s.scalars(q)]})


class ResumeHandler(BaseHandler):
    """``POST suspensions/{id}/resume``: start the suspended server again with the same options."""

    @needs_scope(SUBMIT)
    async def post(self, sid: str) -> None:
        with self.svc.sessions() as s:
            sus = s.get(D.Suspension, int(sid)) if re.fullmatch(SUSPENSION_ID, sid) else None
            if sus is None:
                raise APIError(404, f"no suspension {sid!r}")
            if not (self.ident.admin or self.ident.name == sus.user):
                raise APIError(403, f"suspension {sid} belongs to another user")
            if sus.resumed_at is not None:
                raise APIError(409, f"suspension {sid} was already resumed at {clock_words(sus.resumed_at)}")
            auth = self.svc.auth
            path = f"/users/{quote(sus.user, safe='')}/" + (f"servers/{quote(sus.server, safe='')}" if sus.server
                                                             else "server")
            try:
                await AsyncHTTPClient().fetch(auth.api_url + path, method="POST", body=json.dumps(sus.options),
                                              headers={"Authorization": f"token {auth.api_token}"},
                                              request_timeout=30)
            except HTTPClientError as e:
                body = e.response.body.decode(errors="replace")[:300] if e.response is not None else str(e)
                try:
                    body = json.loads(body).get("message", body)
                except (ValueError, AttributeError):
                    pass
                status = 409 if e.code == 400 else 502
                raise APIError(status, f"the hub did not start {sus.user}/{sus.server}: {body}") from None
            except OSError as e:
                raise APIError(502, f"cannot reach the hub to start {sus.user}/{sus.server}: {e}") from None
            # the spawner's admission request closes the suspension (domain/idle_rules.py on_workspace_request); if it
            # has not arrived yet, close it here
            s.refresh(sus)
            if sus.resumed_at is None:
                sus.resumed_at = time.time()
            sus.resumed_by = self.ident.name
            s.commit()
            self.send(views.suspension(sus), 202)
