"""The endpoints' proxy: ``<prefix>endpoints/<job id>/<path>`` reaches the job's server (a model
endpoint, ``kind: inference``; docs/endpoints.md).

Access is the hub's: the caller is the user of a JupyterHub token (``Authorization: token ...``) or
of the browser's sign-in to this service (JupyterHub OAuth, as the dashboard's). No credentials:
401 (a browser is sent to sign in). The endpoint's owner may call it, and so may the users and
groups its request shared it with; anyone else gets 403. The request then goes to one of the
replicas that answered the last readiness probe (runtime/endpoints.py), in turn, through tornado's
HTTP client; the caller's token and cookies are not passed on, and the server learns the caller
from ``X-Gpupool-User``. None answers: 503 (``starting``); the server does not answer in time
(``c.GPUPool.endpoint_timeout``): 504.
"""
from __future__ import annotations

import json
from typing import Any

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ... import contract as C
from ..domain import endpoints as E
from ..store import tables as D
from .dashboard import _hub_oauth

# not passed on (RFC 9110 hop-by-hop headers, and the caller's credentials)
DROP_REQUEST = {"host", "authorization", "cookie", "connection", "keep-alive", "proxy-authorization", "te",
                "trailer", "transfer-encoding", "upgrade", "content-length", "x-gpupool-user"}
DROP_ANSWER = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date", "set-cookie"}
WITH_BODY = ("POST", "PUT", "PATCH", "DELETE")


def _handler() -> type:
    from jupyterhub.services.auth import HubOAuthenticated

    class EndpointHandler(HubOAuthenticated, web.RequestHandler):
        SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

        def initialize(self, hub_auth: Any) -> None:
            self.hub_auth = hub_auth

        @property
        def svc(self) -> Any:
            return self.application.settings["gpupool"]

        def check_xsrf_cookie(self) -> None:
            return  # tokens, or the hub's own cookie checks (HubOAuth)

        def fail(self, status: int, message: str) -> None:
            self.clear()
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(C.error_payload(status, message)))

        async def caller(self) -> tuple[str, list[str]] | None:
            """(name, groups) of the user calling; None when the answer is already sent."""
            model = await self.hub_auth.get_user(self, sync=False)
            if not model:
                if self.request.method == "GET" and "text/html" in self.request.headers.get("Accept", ""):
                    self.redirect(self.get_login_url())  # a browser signs in, then comes back
                else:
                    self.fail(401, "authentication required: send 'Authorization: token <JupyterHub API token>' "
                                   "or sign in to JupyterHub in the browser")
                return None
            if model.get("kind", "user") != "user":
                self.fail(403, "only users call endpoints")
                return None
            name = model.get("name", "")
            groups = model.get("groups")
            if groups is None:
                groups, _ = await self.svc.auth.user_info(name)
            return name, list(groups or [])

        async def _serve(self, job_id: str, path: str | None) -> None:
            who = await self.caller()
            if who is None:
                return
            parsed = C.parse_public_id(job_id)
            with self.svc.sessions() as s:
                row = s.get(D.Workload, parsed[1]) if parsed and parsed[0] == C.JOB else None
                if row is not None:
                    s.expunge(row)
            if row is None or row.kind != C.INFERENCE:
                return self.fail(404, f"no endpoint {job_id!r}")
            if not E.may_call(row, *who):
                return self.fail(403, f"endpoint {job_id} belongs to {row.user}, who has not shared it with you")
            target = self.svc.endpoint_prober.pick(row.id) if row.status == C.RUNNING else None
            if target is None:
                why = ("it is starting: no replica has answered its readiness probe yet" if row.status in C.ACTIVE
                       else f"it is {row.status}")
                self.set_header("Retry-After", "5")
                return self.fail(503, f"endpoint {job_id} cannot take requests now: {why}")
            await self.forward(target, path or "/", who[0])

        async def forward(self, target: str, path: str, user: str) -> None:
            url = target.rstrip("/") + path + (f"?{self.request.query}" if self.request.query else "")
            headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in DROP_REQUEST}
            headers["X-Gpupool-User"] = user
            headers["X-Forwarded-Prefix"] = E.url_path(self.path_args[0]).rstrip("/")
            method = self.request.method or "GET"
            body = self.request.body if method in WITH_BODY else None
            req = HTTPRequest(url, method=method, headers=headers, body=body, follow_redirects=False,
                              allow_nonstandard_methods=True, decompress_response=False,
                              request_timeout=self.svc.settings.pool.endpoint_timeout)
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
            if resp.code == 599:
                timed_out = "timeout" in str(resp.error).lower()
                return self.fail(504 if timed_out else 502, f"the endpoint's server did not answer: {resp.error}")
            self.set_status(resp.code, resp.reason)
            self.clear_header("Content-Type")
            for k, v in resp.headers.get_all():
                if k.lower() not in DROP_ANSWER:
                    self.add_header(k, v)
            self.finish(resp.body if method != "HEAD" else None)

        async def get(self, job_id: str, path: str | None = None) -> None:
            await self._serve(job_id, path)

        head = post = put = patch = delete = options = get

    return EndpointHandler


def routes(prefix: str, service_name: str) -> list[tuple]:
    """``<prefix>endpoints/<job id>[/<path>]``."""
    E.set_service_prefix(prefix)
    base = prefix.rstrip("/")
    return [(rf"{base}/{C.ENDPOINT_ROUTE}/([^/]+)(/.*)?", _handler(), {"hub_auth": _hub_oauth(service_name)})]
