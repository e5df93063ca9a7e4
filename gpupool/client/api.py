"""HTTP client for the gpupool REST API (docs/api.md) and the errors it raises.

Every error from the service surfaces as a :class:`GPUPoolError` subclass carrying the service's
``message`` and ``field``; transport problems (connection refused, timeouts, a URL that is not the
gpupool service) become :class:`ConnectionFailed` naming the URL.
"""
from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import quote

import requests

from .. import contract as _contract
from . import config as _config

DEFAULT_TIMEOUT = 30.0


class GPUPoolError(Exception):
    """Base class of every error the gpupool client raises."""

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None, field: str | None = None, url: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.field = field
        self.url = url

    def __str__(self) -> str:
        return self.message


class ConfigurationError(GPUPoolError):
    """No service URL could be found (see :mod:`gpupool.client.config`)."""


class ConnectionFailed(GPUPoolError):
    """The service could not be reached or did not answer like the gpupool service."""


class BadRequest(GPUPoolError):
    """400: the request was invalid; ``field`` names the offending field when there is one."""
    status = 400


class Unauthorized(GPUPoolError):
    """401: no token or a token the hub does not accept."""
    status = 401


class Forbidden(GPUPoolError):
    """403: the token lacks a gpupool scope, or the queue/job is not yours."""
    status = 403


class QuotaError(Forbidden):
    """The request exceeds a queue limit or quota."""


class NotFound(GPUPoolError):
    """404: no such job (or no output yet)."""
    status = 404


class Conflict(GPUPoolError):
    """409: the request conflicts with the job's state."""
    status = 409


class ServiceError(GPUPoolError):
    """5xx: the service failed; the message is the service's."""


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict}
_QUOTA_WORDS = ("quota", "limit", "exceed")


def error_from_response(resp: requests.Response, login_hint: bool = True) -> GPUPoolError:
    status = resp.status_code
    message = field = None
    try:
        message, field = _contract.read_error(resp.json())
    except ValueError:
        text = (resp.text or "").strip()
        if text and len(text) < 300 and "<" not in text:
            message = text
    if not message:
        message = f"{status} {resp.reason or ''}".strip()
        if status == 404:
            message = f"not found: {resp.url} (is this the gpupool service?)"
    if status == 401 and login_hint and "gpupool login" not in message:
        message = f"{message} (the token was not accepted: run `gpupool login` for a new one)"
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServiceError if status >= 500 else GPUPoolError
    low = message.lower()
    if status in (403, 409, 422, 429) and any(w in low for w in _QUOTA_WORDS):
        cls = QuotaError
    if status in (422, 429) and cls is GPUPoolError:
        cls = BadRequest
    return cls(message, status=status, field=field, url=resp.url)


class Client:
    """A connection to the gpupool service: ``Client(url, token)`` or ``Client.from_env()``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 url_source: str = "argument", session: requests.Session | None = None, login_hint: bool = True):
        self.url = _config.api_base(url)
        self.token = token
        self.timeout = timeout
        self.url_source = url_source
        self.login_hint = login_hint  # a refused token: suggest `gpupool login` (not for the spawner's token)
        self._local = threading.local()
        self._session = session

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_env(cls, url: str | None = None, token: str | None = None, **kw) -> "Client":
        try:
            conn = _config.resolve(url, token)
        except _config.ConfigError as e:
            raise ConfigurationError(str(e)) from None
        client = cls(conn.url, conn.token, url_source=conn.url_source, **kw)
        if conn.url_source.startswith("JUPYTERHUB"):
            client._pick_hub_candidate()
        return client

    def _pick_hub_candidate(self) -> None:
        """Inside a single-user server several URLs may lead to the service; use one that answers."""
        cands = _config.hub_candidates()
        cands.append((_config.api_base("http://127.0.0.1:10101"), "the service's default local address"))
        for url, source in cands:
            try:
                r = self.session.get(url + "health", timeout=3)
                if r.ok and r.headers.get("content-type", "").startswith("application/json") and r.json().get("ok"):
                    self.url, self.url_source = url, source
                    return
            except (requests.RequestException, ValueError):
                continue

    @property
    def session(self) -> requests.Session:
        if self._session is not None:
            return self._session
        s = getattr(self._local, "session", None)  # requests.Session is not thread-safe
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def __repr__(self) -> str:
        return f"<gpupool.Client {self.url} (from {self.url_source})>"

    # -- transport ------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params: dict | None = None, json_body: Any = None,
                raw: bool = False, timeout: float | None = None):
        url = self.url + path.lstrip("/")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        try:
            resp = self.session.request(method, url, params=params, json=json_body, headers=headers,
                                        timeout=timeout or self.timeout, allow_redirects=False)
        except requests.ConnectionError as e:
            why = "connection refused" if "refused" in str(e).lower() else "cannot connect"
            raise ConnectionFailed(
                f"cannot reach the gpupool service at {self.url} ({why}; URL from {self.url_source})."
                + (" Is the hub running? `gpupool login URL` sets the URL." if self.login_hint else ""), url=url) from None
        except requests.Timeout:
            raise ConnectionFailed(f"the gpupool service at {self.url} did not answer within "
                                   f"{timeout or self.timeout:g}s", url=url) from None
        except requests.RequestException as e:
            raise ConnectionFailed(f"request to the gpupool service at {self.url} failed: {e}", url=url) from None
        if resp.status_code in (301, 302, 303, 307, 308):
            loc = resp.headers.get("Location", "")
            hint = " (redirected to a login page: the token was not accepted; run `gpupool login`)" if "login" in loc else ""
            raise ConnectionFailed(f"{url} redirected to {loc}{hint}; is {self.url} the gpupool API?", url=url)
        if resp.status_code >= 400:
            raise error_from_response(resp, self.login_hint)
        if raw:
            return resp
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise ConnectionFailed(f"{url} did not answer with JSON; is {self.url} the gpupool API?", url=url) from None

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    # -- resources ----------------------------------------------------------------------------------
    def health(self) -> dict:
        return self.get("health")

    def queues(self) -> list[dict]:
        return self.get("queues")["queues"]

    def nodes(self) -> list[dict]:
        return self.get("nodes")["nodes"]

    def pools(self) -> dict:
        """``GET pools``: ``{"pools": [...], "fairness": {...} or None}``."""
        return self.get("pools")

    def node_action(self, name: str, action: str, reason: str | None = None) -> dict:
        """``drain``, ``fail`` or ``return`` a node (admin): the node afterwards, with ``workloads``,
        the ones this stopped or asked to stop."""
        body = {"reason": reason} if reason else None
        return self.request("POST", f"nodes/{quote(name, safe='')}/{quote(action, safe='')}", json_body=body)

    def workspaces(self) -> list[dict]:
        return self.get("workspaces")["workspaces"]

    def submit(self, body: dict) -> dict:
        return self.request("POST", "jobs", json_body=body)

    def jobs(self, **filters) -> list[dict]:
        params = {k: v for k, v in filters.items() if v is not None}
        data = self.get("jobs", params=params or None)
        return data["jobs"] if isinstance(data, dict) else data

    def job(self, job_id: str) -> dict:
        return self.get(f"jobs/{quote(job_id, safe='')}")

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"jobs/{quote(job_id, safe='')}")

    def log(self, job_id: str, offset: int = 0, rank: int | None = None) -> tuple[str, int]:
        """(text, next offset) of the job's log (worker ``rank``'s) from byte ``offset``."""
        params = {k: v for k, v in (("offset", offset), ("rank", rank)) if v}
        resp = self.request("GET", f"jobs/{quote(job_id, safe='')}/log", params=params or None, raw=True)
        text = resp.content.decode("utf-8", errors="replace")
        try:
            nxt = int(resp.headers.get("X-Log-Offset", ""))
        except ValueError:
            nxt = offset + len(resp.content)
        return text, nxt

    def output(self, job_id: str) -> str:
        resp = self.request("GET", f"jobs/{quote(job_id, safe='')}/output", raw=True)
        return resp.content.decode("utf-8")

    def post_metric(self, job_id: str, name: str, value: float, step: int | None = None) -> Any:
        body: dict[str, Any] = {"name": name, "value": value}
        if step is not None:
            body["step"] = step
        return self.request("POST", f"jobs/{quote(job_id, safe='')}/metrics", json_body=body)


# -- the process-wide default client ------------------------------------------------------------
_default: Client | None = None
_default_lock = threading.Lock()


def connect(url: str | None = None, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
            check: bool = True) -> Client:
    """Set (and return) the client the module-level functions use.

    ``url`` may be the hub (``http://hub:8000``), the service or the API URL. Without arguments the
    URL and token are found as described in :mod:`gpupool.client.config`. With ``check`` the
    service is contacted once so that a wrong URL fails here, with a clear message.
    """
    global _default
    client = Client.from_env(url, token, timeout=timeout)
    if check:
        try:
            client.health()
        except NotFound:
            raise ConnectionFailed(f"{client.url} answered 404 for health: it is not the gpupool API "
                                   "(is the service called something else? set GPUPOOL_SERVICE_NAME)",
                                   url=client.url) from None
    with _default_lock:
        _default = client
    return client


def get_client(client: Client | None = None) -> Client:
    global _default
    if client is not None:
        return client
    with _default_lock:
        if _default is None:
            _default = Client.from_env()
        return _default


def _reset_default() -> None:
    global _default
    with _default_lock:
        _default = None


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)
