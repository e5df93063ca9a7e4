"""Workspaces checked against JupyterHub: release the GPUs of servers the hub no longer has.

A workspace's GPUs are normally released by the spawner (``DELETE workspaces/...``) when its
server stops. That call can be lost: JupyterHub stops its managed services *before* the servers
when it shuts down, so with ``cleanup_servers`` (the default) the servers' releases cannot reach
this service, and their workspaces would hold GPUs until the same server starts again.

So, at service start and every ``c.GPUPool.workspace_reconcile_seconds``, the service asks the hub
which servers are active (``GET /hub/api/users?state=active``: running, starting or stopping) and
releases every active workspace whose server has been missing from those answers for at least
``c.GPUPool.workspace_release_grace`` seconds. A released workspace ends ``cancelled`` with the
reason (``released: the hub reports server alice/ not running ...``), and the log says so. When
the hub cannot be asked (down, restarting, token without the scopes), nothing is released.

The first check that gets an answer after the service started releases at once (no grace) every
workspace that was there before the service started and whose server the hub does not have: its
server stopped while the service was down (the hub stops its services before its servers), and no
request of it can be in flight, so there is nothing to wait for.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import select
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ...contract import format_gpus
from ..domain import lifecycle
from ..store import tables as D
from .periodic import Periodic

log = logging.getLogger("gpupool.reconcile")

PAGE = 200  # JupyterHub's largest page (api_page_max_limit's default)


class HubUnavailable(Exception):
    """The hub could not tell which servers it runs; nothing may be released on that basis."""


class WorkspaceReconciler(Periodic):
    what = "checking workspaces against JupyterHub"
    off_message = "workspace reconciliation with JupyterHub is off (c.GPUPool.workspace_reconcile_seconds = 0)"
    log = log

    def __init__(self, loop: Any, sessions: Any, api_url: str, api_token: str, interval: float, grace: float,
                 activity: dict | None = None):
        self.loop = loop  # the SchedulerLoop: its lock keeps a release out of a running cycle
        self.sessions = sessions
        self.api_url = api_url.rstrip("/")
        self.api_token = api_token
        self.interval = interval
        self.grace = grace
        self.missing_since: dict[int, float] = {}  # workspace row id -> first check that missed its server
        self.started_at = time.time()  # workspaces older than this are released at once by the first check
        self._first = True
        # (user, server) -> the hub's last_activity of that server (ISO time) at the last check
        self.activity: dict[tuple[str, str], str | None] = {} if activity is None else activity
        self._warned = False

    # ------------------------------------------------------------------ the hub's view
    async def active_servers(self) -> set[tuple[str, str]]:
        """(user, server name) of every server JupyterHub has running, starting or stopping."""
        out: set[tuple[str, str]] = set()
        activity: dict[tuple[str, str], str | None] = {}
        client = AsyncHTTPClient()
        offset = 0
        while True:
            url = f"{self.api_url}/users?" + urlencode({"state": "active", "offset": offset, "limit": PAGE})
            try:
                resp = await client.fetch(url, request_timeout=20, headers={
                    "Authorization": f"token {self.api_token}",
                    "Accept": "application/jupyterhub-pagination+json"})
                doc = json.loads(resp.body)
            except (HTTPClientError, OSError, ValueError) as e:
                raise HubUnavailable(f"GET {url}: {e}") from None
            items = doc.get("items") if isinstance(doc, dict) else doc
            if not isinstance(items, list):
                raise HubUnavailable(f"GET {url}: unexpected answer {str(doc)[:200]}")
            for user in items:
                servers = user.get("servers")
                if servers is None:  # the token lacks read:servers: the answer says nothing about servers
                    raise HubUnavailable("the hub's user list has no 'servers' field: the service's role needs "
                                         "the read:servers and list:users scopes (configure(c) grants them)")
                for name, server in servers.items():
                    out.add((user.get("name", ""), name))
                    activity[(user.get("name", ""), name)] = (server or {}).get("last_activity")
            nxt = (doc.get("_pagination") or {}).get("next") if isinstance(doc, dict) else None
            if not nxt or not items:
                self.activity.clear()
                self.activity.update(activity)
                return out
            offset = int(nxt.get("offset", offset + len(items)))

    # ------------------------------------------------------------------ one check
    async def reconcile(self) -> list[str]:
        """Check every active workspace once; returns the ids of the workspaces released."""
        asked_at = time.time()
        try:
            active = await self.active_servers()
        except HubUnavailable as e:
            if not self._warned:
                log.warning("cannot check workspaces against JupyterHub (nothing is released meanwhile): %s", e)
                self._warned = True
            return []
        if self._warned:
            log.info("JupyterHub answers again; checking workspaces against its servers")
            self._warned = False
        first, self._first = self._first, False
        released: list[str] = []
        async with self.loop._lock:  # not in the middle of a scheduling cycle
            now = time.time()
            with self.sessions() as s:
                rows = s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE,
                                                          D.Workload.status.in_(D.ACTIVE))).all()
                seen = set()
                for row in rows:
                    seen.add(row.id)
                    if (row.user, row.server) in active or row.submitted_at >= asked_at:
                        self.missing_since.pop(row.id, None)  # present (or requested after we asked)
                        continue
                    since = self.missing_since.setdefault(row.id, asked_at)
                    if now - since < self.grace and not (first and row.submitted_at < self.started_at):
                        continue
                    self._release(row, now, now - since, at_start=first)
                    released.append(row.public_id)
                if released:
                    s.commit()
            for gone in set(self.missing_since) - seen:
                del self.missing_since[gone]
        if released:
            self.loop.wake()
        return released

    def _release(self, row: D.Workload, now: float, missing_for: float, at_start: bool = False) -> None:
        where = f"{row.user}/{row.server}"
        held = row.allocation is not None
        what = format_gpus(row.gpus) if held and row.gpus else "nothing held yet"
        reason = (f"released: the hub reports server {where} not running ("
                  + ("it stopped while the gpupool service was down)" if at_start else
                     f"missing for {missing_for:.0f} s; its stop never reached the gpupool service)"))
        log.warning("released workspace %s (%s, %s, was %s): the hub reports server %s not running for %.0f s",
                    row.public_id, where, what, row.status, where, missing_for)
        lifecycle.workspace_ended(row, reason, now)
        self.missing_since.pop(row.id, None)

    async def tick(self) -> list[str]:
        return await self.reconcile()
