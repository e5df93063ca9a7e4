"""What every handler of the REST API shares: the service, the caller's identity and the scope
its method declared (web/scopes.py), JSON bodies and query arguments through the request models
(web/schemas.py), and errors as the contract's payload."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from tornado import web

from ... import contract as C
from ..domain.errors import APIError
from ..domain.identity import Identity
from ..store import tables as D
from . import schemas
from .validation import Invalid, parse
from .auth import AuthError
from .scopes import ADMIN_SCOPE, Need, need_of


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class BaseHandler(web.RequestHandler):
    @property
    def svc(self) -> Any:
        return self.application.settings["gpupool"]

    def check_xsrf_cookie(self) -> None:  # token auth only; no cookies
        return

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    def need(self) -> Need:
        need = need_of(self, self.request.method or "")
        if need is None:  # a method without a declaration is a bug (tests/hub/test_layers.py checks every route)
            raise web.HTTPError(405)
        return need

    async def prepare(self) -> None:
        """Who is calling, and whether the method's declared scope lets them."""
        self.ident: Identity | None = None
        need = self.need()
        if need.scope is None or (need.unless and not getattr(self.svc.settings.pool, need.unless)):
            return
        try:
            self.ident = await self.svc.auth.identify(self)
        except AuthError as e:
            raise APIError(e.status, e.message) from None
        if self.ident.kind == "job" and not need.job_token:
            raise APIError(403, "a job token may only read its own job and post its metrics")
        if need.scope == ADMIN_SCOPE and not self.ident.admin:
            raise APIError(403, f"this needs the {ADMIN_SCOPE} scope")

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, Invalid):
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

    def body(self, model: type[schemas.BaseModel]) -> Any:
        """The JSON body as ``model`` (a 400 naming the field when it is not one)."""
        data: Any = {}
        if self.request.body:
            try:
                data = json.loads(self.request.body)
            except (ValueError, RecursionError) as e:
                raise APIError(400, f"body: not valid JSON ({e})", "body") from None
            _check_text(data)
        return parse(model, data)

    def query(self, model: type[schemas.BaseModel]) -> Any:
        """The query arguments as ``model`` (the last value of a repeated argument)."""
        args = {k: self.get_argument(k) for k in self.request.query_arguments}
        return parse(model, args)

    def own_or_admin(self, user: str | None, what: str) -> str | None:
        """``?user=`` of a listing: admins may name anyone (None: everyone), others only themselves."""
        if self.ident.admin:
            return user
        if user and user != self.ident.name:
            raise APIError(403, f"user: you may only {what}", "user")
        return self.ident.name

    def rank(self, row: D.Workload) -> int:
        """The ``rank`` query argument (a worker of a distributed job; default 0)."""
        rank = self.query(schemas.RankQuery).rank
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


__all__ = ["APIError", "BaseHandler", "iso"]
