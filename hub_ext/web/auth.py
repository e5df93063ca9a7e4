"""Who is calling: JupyterHub tokens (via ``HubAuth``) and per-job tokens.

* A JupyterHub token (``Authorization: token ...`` or ``Bearer ...``) is resolved by the Hub
  (``HubAuth.user_for_token``, cached for a minute). It must carry ``custom:gpupool:submit`` or
  ``custom:gpupool:admin`` (else 403). ``admin`` comes from the ``admin`` scope (unfiltered:
  web/scopes.py), or from being a JupyterHub admin calling with a token that carries a gpupool scope.
* A job token (``gpj_...``, in a job's ``GPUPOOL_API_TOKEN``) is minted by the service at each
  start of a job and only grants reading that job and posting its metrics.

A user's JupyterHub groups (for queue access) are looked up with the service's own token and
cached for ``c.GPUPool.group_cache_seconds``.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..domain.identity import Identity
from ..domain.tokens import hash_token, is_job_token
from ..store import tables as D
from .scopes import ADMIN_SCOPE, SUBMIT_SCOPE, has_scope, unfiltered

log = logging.getLogger("gpupool.auth")


class AuthError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def token_from(handler: Any) -> str | None:
    header = handler.request.headers.get("Authorization", "")
    parts = header.split(None, 1)
    if len(parts) == 2 and parts[0].lower() in ("token", "bearer") and parts[1].strip():
        return parts[1].strip()
    return None


class Authenticator:
    def __init__(self, hub_auth: Any, sessions: Any, api_url: str, api_token: str, cache_seconds: float = 30.0):
        self.hub_auth = hub_auth
        self.sessions = sessions
        self.api_url = api_url.rstrip("/")
        self.api_token = api_token
        self.cache_seconds = cache_seconds
        self._users: dict[str, tuple[float, list[str], bool]] = {}

    async def identify(self, handler: Any) -> Identity:
        token = token_from(handler)
        if token is None:
            raise AuthError(401, "authentication required: send 'Authorization: token <JupyterHub API token>'")
        if is_job_token(token):
            with self.sessions() as s:
                row = s.execute(select(D.Workload.id, D.Workload.user).where(
                    D.Workload.token_hash == hash_token(token))).first()
            if row is None:
                raise AuthError(401, "invalid or expired job token")
            return Identity(name=row.user, kind="job", job_id=row.id)
        model = await self.hub_auth.user_for_token(token, sync=False)
        if not model:
            raise AuthError(401, "invalid or expired token")
        scopes = model.get("scopes") or []
        admin = has_scope(scopes, ADMIN_SCOPE)
        if not admin and not has_scope(scopes, SUBMIT_SCOPE):
            raise AuthError(403, f"this token lacks the {SUBMIT_SCOPE} scope (or {ADMIN_SCOPE})")
        kind = model.get("kind", "user")
        name = model.get("name", "")
        ident = Identity(name=name, kind=kind, admin=admin)
        if kind == "user" and not admin:  # groups for queue access; JupyterHub admins are gpupool admins
            groups, hub_admin = await self.user_info(name, model)
            ident.groups = groups
            # a JupyterHub admin is a gpupool admin with a gpupool scope, not with a filtered one only
            ident.admin = admin or (hub_admin and unfiltered(scopes))
        return ident

    async def user_info(self, name: str, model: dict | None = None) -> tuple[list[str], bool]:
        """(groups, is JupyterHub admin) of a user, cached."""
        now = time.monotonic()
        hit = self._users.get(name)
        if hit and now - hit[0] < self.cache_seconds:
            return hit[1], hit[2]
        groups: list[str] = list((model or {}).get("groups") or [])
        admin = bool((model or {}).get("admin"))
        if model is None or "groups" not in model or "admin" not in model:
            try:
                resp = await AsyncHTTPClient().fetch(
                    f"{self.api_url}/users/{quote(name, safe='')}",
                    headers={"Authorization": f"token {self.api_token}"}, request_timeout=10)
                info = json.loads(resp.body)
                groups, admin = list(info.get("groups") or []), bool(info.get("admin"))
            except (HTTPClientError, OSError, ValueError) as e:
                log.warning("could not look up JupyterHub user %s: %s", name, e)
                if hit:
                    return hit[1], hit[2]
        self._users[name] = (now, groups, admin)
        return groups, admin
