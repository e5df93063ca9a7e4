"""The dashboard page at ``/services/gpupool/`` (docs/admin.md).

Signed in through JupyterHub (OAuth, the service's own client; ``oauth_no_confirm``). JupyterHub
admins see everything; other users see the queues, their own workloads and their own usage.
The page is a Jinja2 template (templates/dashboard.html) with the data embedded as JSON and drawn
by Chart.js, which is vendored in ``static/`` (MIT license beside it): no CDN, works offline.

Shows: queue bars (deserved / fair share / allocated), node pools and each queue's share in each
(with its weight and past usage under fairness over time, and the share without past usage while it
counts), GPUs allocated versus used over the last day, pending workloads with their wait and reason,
running workloads, idle workloads and their holders, model endpoints (with their state, replicas,
GPUs and URL; a user sees theirs and those shared with them), the queues' workload policies, and
GPU-hours by user and by queue for the last 7 days with CSV downloads (``usage.csv?by=...``, the
same numbers as ``GET usage``). It refreshes itself every ``?refresh=`` seconds (10; 0: never) by
fetching itself again. The hub's Services menu links it.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any, Iterable

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select
from tornado import web

from ... import contract as C
from ...scheduler.model import DEFAULT_POOL
from ..domain import endpoints as E
from ..domain import usage as U
from ..store import tables as D
from ..runtime.simulated import SIMULATED
from .base import iso
from .nodes import readings_source
from .policies import effective
from .pools import pools_of, queue_entry
from .scopes import ADMIN_SCOPE, has_scope

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hub_ext/: templates/ and static/
_env = Environment(loader=FileSystemLoader(os.path.join(HERE, "templates")), autoescape=select_autoescape())
DAY = 86400.0


def _hub_oauth(service_name: str) -> Any:
    from jupyterhub.services.auth import HubOAuth

    # a managed service gets JUPYTERHUB_CLIENT_ID from the hub; an external one is service-<name>
    return HubOAuth(oauth_client_id=os.environ.get("JUPYTERHUB_CLIENT_ID") or f"service-{service_name}",
                    cache_max_age=60)


class _Page:
    """Mixed in front of HubOAuthenticated handlers: the service and the signed-in identity."""

    def initialize(self, hub_auth: Any) -> None:
        self.hub_auth = hub_auth

    @property
    def svc(self) -> Any:
        return self.application.settings["gpupool"]

    async def identity(self) -> tuple[str, bool]:
        """(name, admin): JupyterHub admins, and holders of custom:gpupool:admin (e.g. members of
        the gpupool-admin role: the sign-in token carries the user's gpupool scopes)."""
        name, admin, _ = await self.membership()
        return name, admin

    async def membership(self) -> tuple[str, bool, list[str]]:
        """(name, admin, groups) of the signed-in user."""
        user = self.current_user
        name = user["name"]
        groups, hub_admin = await self.svc.auth.user_info(name)
        admin = bool(hub_admin or user.get("admin") or has_scope(user.get("scopes") or [], ADMIN_SCOPE))
        return name, admin, list(groups or [])


def dashboard_data(svc: Any, name: str, admin: bool, now: float, groups: Iterable[str] = ()) -> dict:
    st = svc.loop.state
    queues = [{"name": q.name, "parent": q.parent, "deserved": q.deserved.get("gpu", 0),
               "fair_share": round(st.fair_share.get(q.name, {}).get("gpu", 0), 3),
               "allocated": round(st.allocated.get(q.name, {}).get("gpu", 0), 3),
               "running": st.queues[q.name].running if q.name in st.queues else 0,
               "pending": st.queues[q.name].pending if q.name in st.queues else 0} for q in svc.settings.queues]
    pools = pools_of(svc)  # node pools; each queue's share per pool, its weight and past usage (fairness)
    names = [p["name"] for p in pools["pools"]]
    for view, spec in zip(queues, svc.settings.queues):
        view.update(weight=spec.over_quota_weight, **queue_entry(svc, spec, pools))
        if view["fair_share_plain"] is not None:  # past usage counts: the share without it
            view["fair_share_plain"] = round(view["fair_share_plain"].get("gpu", 0), 3)
        if names != [DEFAULT_POOL]:  # with node pools, a queue deserves its quotas' sum over them
            view["deserved"] = sum(spec.in_pool(p).deserved.get("gpu", 0) for p in names)
    mine = None if admin else name
    with svc.sessions() as s:
        q = select(D.Workload).where(D.Workload.status.in_(D.ACTIVE)).order_by(D.Workload.id)
        if mine:
            q = q.where(D.Workload.user == mine)
        rows = list(s.scalars(q))
        step = 1800.0  # half hours, on the clock; the last one is the current, partial one
        timeline = U.timeline(s, (now - DAY) // step * step + step, now, step, now, user=mine)
        week = {by: U.report(s, now - 7 * DAY, now, by, now, user=mine) for by in ("user", "queue")}
        endpoints = endpoint_rows(s, name, admin, groups)
    pending, running = [], []
    for r in rows:
        pid = r.public_id
        ended = [a for a in r.history or [] if a.get("outcome")]  # its attempts' history: the last end says why
        view = {"id": pid, "user": r.user, "queue": r.queue, "kind": r.kind, "gpus": r.gpus, "status": r.status,
                "name": r.name if r.type == D.JOB else f"{r.user}/{r.server}" if r.server else r.user,
                "marker": C.history_marker(r.status, r.attempt) if r.type == D.JOB else "",
                "last_end": f'attempt {ended[-1]["attempt"]}: {ended[-1]["reason"]}' if ended else ""}
        if r.status == D.QUEUED and r.allocation is None:
            why = st.pending.get(pid)  # the scheduler's Pending: str() is its sentence
            view.update(wait=round(now - r.submitted_at), reason=str(why) if why is not None else r.reason,
                        code=getattr(getattr(why, "code", None), "value", None), position=st.positions.get(pid))
            pending.append(view)
        elif r.allocation is not None:
            view.update(since=iso(r.started_at), where=C.allocation_to_api(r.allocation), reason=r.reason)
            running.append(view)
    idle_checker = getattr(svc, "idle", None)
    idle = [dict(v, id=k, since=iso(v["since"])) for k, v in sorted((idle_checker.idle if idle_checker else {}).items())
            if admin or v.get("user") == name]
    total = sum(n.gpus for n in svc.settings.nodes)
    return {"user": name, "admin": admin, "now": iso(now), "gpus_total": total, "queues": queues,
            "timeline": timeline, "pending": pending, "running": running, "idle": idle, "week": week,
            "since_week": iso(now - 7 * DAY), "policies": policy_rows(svc), "idle_note": idle_note(svc),
            "readings_note": readings_note(svc),
            "pools": pools["pools"], "fairness": st.fairness_on, "plain": bool(st.fair_share_plain),
            "endpoints": endpoints}


def endpoint_rows(s: Any, name: str, admin: bool, groups: Iterable[str]) -> list[dict]:
    """The endpoints not ended (``kind: inference``) that ``name`` may see: an admin every one, a
    user their own and those shared with them (the ones they may call), with what the CLI's
    ``gpupool endpoints`` says of each."""
    q = (select(D.Workload).where(D.Workload.type == D.JOB, D.Workload.kind == C.INFERENCE,
                                  D.Workload.status.in_(D.ACTIVE)).order_by(D.Workload.id))
    rows = []
    for r in s.scalars(q):
        if not (admin or E.may_call(r, name, groups)):
            continue
        share = r.share or {}
        rows.append({"id": r.public_id, "name": r.name, "user": r.user, "queue": r.queue,
                     "url": E.url_path(r.public_id),
                     "state": C.endpoint_shown_state(r.status, r.endpoint_state), "reason": r.reason,
                     "replicas": C.endpoint_replicas(r.ready_replicas if r.status == C.RUNNING else 0, r.pods),
                     "gpus": C.format_request(r.gpus, r.gpu_memory), "restarts": r.endpoint_restarts or 0,
                     "on": C.describe_allocation(r.allocation),
                     "shared": ", ".join([*share.get("users", []), *(f"group {g}" for g in share.get("groups", []))])})
    return rows


def policy_rows(svc: Any) -> list[dict]:
    """The effective policy of every leaf queue (domain/policies.py), one row per value set."""
    rows = []
    for queue in svc.access.leaves:
        for kind, p in effective(svc.settings, queue)["kinds"].items():
            if not p["allowed"]:
                rows.append({"queue": queue, "kind": kind, "rule": "not taken", "value": "", "set_by": p["refused_by"]})
            for part in ("defaults", "limits"):
                rows += [{"queue": queue, "kind": kind, "rule": f"{part[:-1]} {field}",
                          "value": C.format_policy_value(field, v["value"]), "set_by": v["set_by"]}
                         for field, v in p[part].items()]
    return rows


def idle_note(svc: Any) -> str:
    """What the empty idle table means, as things are: no rules, rules without readings, or nothing idle."""
    if not svc.settings.idle_rules:
        return "no idle rules are configured (c.GPUPool.idle_rules, or a policy's idle_time), so no GPU is checked"
    sources = {readings_source(svc, n.name) for n in svc.settings.nodes} - {None}
    if not sources or svc.settings.pool.usage_sample_seconds <= 0:
        return ("idle rules are configured, but these GPUs have no NVML readings (a declared inventory), so none "
                "is ever found idle")
    return (f"idle rules are configured for {len(svc.settings.idle_rules)} queue and class pairs; no workload's "
            "GPUs have read 0 % for as long as its rule says")


def readings_note(svc: Any) -> str:
    """Said wherever the dashboard shows readings when some are simulated (never passed off as NVML's)."""
    if not any(readings_source(svc, n.name) == SIMULATED for n in svc.settings.nodes):
        return ""
    return ("simulated GPU readings (c.GPUPool.simulated_gpu_readings, a demo): the declared GPUs are not "
            "measured; a GPU reads busy while a running job holds it or the hub saw its workspace active, 0 % "
            "otherwise, so that the idle rules can be seen at work")


def _handlers() -> tuple[type, type, type]:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated

    class DashboardHandler(_Page, HubOAuthenticated, web.RequestHandler):
        def check_xsrf_cookie(self) -> None:
            return

        async def get(self) -> None:
            accept = self.request.headers.get("Accept", "")
            if "text/html" not in accept or self.request.headers.get("Authorization"):
                # API clients asking the service's root: where the API is (JSON, as before)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps({"service": "gpupool", "api": "api/v1/", "health": "api/v1/health",
                                        "dashboard": "./"}))
                return
            if self.current_user is None:
                self.redirect(self.get_login_url())  # JupyterHub's OAuth; back here afterwards
                return
            name, admin, groups = await self.membership()
            data = dashboard_data(self.svc, name, admin, time.time(), groups)
            prefix = self.request.path.rstrip("/") + "/"
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            self.finish(_env.get_template("dashboard.html").render(
                data=data, data_json=json.dumps(data), prefix=prefix, static=prefix + "static/"))

    class CSVHandler(_Page, HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def get(self) -> None:
            name, admin = await self.identity()
            now = time.time()
            by = self.get_argument("by", "user")
            try:
                since = U.parse_time(self.get_argument("since"), "since") if self.get_argument("since", None) \
                    else now - 7 * DAY
                with self.svc.sessions() as s:
                    doc = U.report(s, since, now, by, now, user=None if admin else name)
            except U.ReportError as e:  # a link people follow: the message as text, not a bare "Bad Request"
                self.set_status(400)
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                self.finish(f"{e}\n")
                return
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="gpupool-usage-by-{by}.csv"')
            self.finish(U.to_csv(doc))

    class Callback(_Page, HubOAuthCallbackHandler):
        pass

    return DashboardHandler, CSVHandler, Callback


def routes(prefix: str, service_name: str) -> list[tuple]:
    """The page, its CSV downloads, the OAuth callback and the vendored static files."""
    oauth = _hub_oauth(service_name)
    page, csv_handler, callback = _handlers()
    base = prefix.rstrip("/")
    kw = {"hub_auth": oauth}
    return [
        (rf"{base}/?", page, kw),
        (rf"{base}/usage\.csv", csv_handler, kw),
        (rf"{base}/oauth_callback/?", callback, kw),
        (rf"{base}/static/(.*)", web.StaticFileHandler, {"path": os.path.join(HERE, "static")}),
    ]


def cookie_secret() -> bytes:
    """Signs the dashboard's login cookie (new at each start: people sign in again, one click)."""
    return secrets.token_bytes(32)
