"""Idle GPUs: rules per queue and kind, workspaces suspended (and resumed), idle jobs flagged or requeued.

``c.GPUPool.idle_rules`` maps a queue name (``"*"``: the whole pool) to rules per workload class::

    c.GPUPool.idle_rules = {
        "*": {"interactive": {"after": "2h"}, "train": {"after": "1h", "action": "flag"}},
        "research": {"interactive": {"after": "1h"}},            # tightens the pool's rule
        "vision": {"train": {"after": "30m", "action": "requeue"}},
    }

Classes: ``interactive`` (non-preemptible workspaces), ``interactive-preemptible`` (preemptible
ones; falls back to ``interactive`` at the same level), and the job kinds ``train``,
``hpo-trial``, ``inference``. ``after``: seconds, or ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``.
``action``: ``suspend`` (workspaces, the default for them) or ``flag``; ``flag`` (jobs, the
default) or ``requeue``. Rules are inherited down the queue tree and a child may only tighten:
a shorter ``after``, a stronger action (flag < requeue / suspend); a looser child stops the hub
with the entry named.

A workload is idle when every one of its GPUs read 0 % utilisation (NVML, hub_ext/sampling.py)
in every ``c.GPUPool.idle_window_seconds`` window (30 s) of the last ``after`` seconds, and it
held them all that time. A window without any reading is not idle (unknown): a declared
inventory without NVML is never acted on. A busy kernel shows as utilisation and counts as
active.

* a **suspended** workspace gives its GPUs back at once (its row ends ``cancelled`` with the
  reason; the spawner sees it gone and stops the server, its files stay) and a suspension record
  keeps what it asked for. ``POST suspensions/{id}/resume`` (the owner or an admin) starts the
  server again through the hub with the same options; a plain new start of the same server is
  told it was suspended, and why, in its first progress message.
* a **flagged** job keeps running; its reason says it is idle (and since when).
* a **requeued** job is asked to checkpoint and stop like a preempted one, and waits again.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sqlalchemy import JSON, Float, Integer, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from . import db as D
from . import ledger as L
from . import sampling as S
from .periodic import Periodic
from ..contract import ID_DIGITS, INTERACTIVE, JOB_KINDS

log = logging.getLogger("gpupool.idle")

CLASSES = (INTERACTIVE, f"{INTERACTIVE}-preemptible", *JOB_KINDS)  # the kinds (gpupool.contract), workspaces split
SUSPEND, FLAG, REQUEUE = "suspend", "flag", "requeue"
ACTIONS = {"interactive": (SUSPEND, FLAG), "interactive-preemptible": (SUSPEND, FLAG)}
JOB_ACTIONS = (FLAG, REQUEUE)
STRENGTH = {FLAG: 0, REQUEUE: 1, SUSPEND: 1}
SUSPENDED = L.SUSPENDED  # the ledger's end reason of a suspended workspace's interval


class RuleError(ValueError):
    pass


@dataclass(frozen=True)
class Rule:
    after: float
    action: str
    source: str  # "queue research's rule for interactive workspaces"


class Suspension(D.Base):
    __tablename__ = "suspensions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    workload: Mapped[str] = mapped_column(String(32))
    options: Mapped[Any] = mapped_column(JSON, default=dict)  # the start options to resume with
    reason: Mapped[str] = mapped_column(Text)
    suspended_at: Mapped[float] = mapped_column(Float)
    resumed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    resumed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)


# ---------------------------------------------------------------------------------- the rules
def parse_duration(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise RuleError(f"{where}: must be seconds or a duration such as '30m'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(value))
        if not m:
            raise RuleError(f"{where}: {value!r} is not a duration (use seconds or e.g. '90s', '30m', '2h', '1d')")
        seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if seconds <= 0:
        raise RuleError(f"{where}: must be > 0")
    return seconds


def _class_words(cls: str) -> str:
    return {"interactive": "interactive workspaces", "interactive-preemptible": "preemptible workspaces"}.get(
        cls, f"{cls} jobs")


def resolve_limits(raw: dict, queues: list[Any]) -> dict[tuple[str, str], Rule]:
    """``c.GPUPool.max_runtime`` ({queue: {class: duration}}) as rules: past it a workspace is
    suspended and a job requeued (asked to checkpoint first)."""
    if not isinstance(raw, dict):
        raise RuleError("c.GPUPool.max_runtime: must map queue names to {class: duration}")
    shaped = {q: ({c: {"after": d} for c, d in v.items()} if isinstance(v, dict) else v) for q, v in raw.items()}
    return resolve_rules(shaped, queues, knob="max_runtime", default_actions={"interactive": SUSPEND,
                                                                             "interactive-preemptible": SUSPEND})


def resolve_rules(raw: dict, queues: list[Any], knob: str = "idle_rules",
                  default_actions: dict[str, str] | None = None) -> dict[tuple[str, str], Rule]:
    """The effective rule of every (queue, class): the pool's (``"*"``), tightened down the tree."""
    names = {q.name for q in queues}
    parents = {q.name: q.parent for q in queues}
    parsed: dict[str, dict[str, dict]] = {}
    suffix, noun = (".after", "rule") if knob == "idle_rules" else ("", "maximum run time")
    for queue, rules in (raw or {}).items():
        where = f"c.GPUPool.{knob}[{queue!r}]"
        if queue != "*" and queue not in names:
            raise RuleError(f"{where}: unknown queue (queues: {', '.join(sorted(names))}; '*' is the whole pool)")
        if not isinstance(rules, dict):
            raise RuleError(f"{where}: must map a class ({', '.join(CLASSES)}) to a rule")
        parsed[queue] = {}
        for cls, rule in rules.items():
            w = f"{where}[{cls!r}]"
            if cls not in CLASSES:
                raise RuleError(f"{w}: unknown class (use {', '.join(CLASSES)})")
            if not isinstance(rule, dict) or set(rule) - {"after", "action"} or "after" not in rule:
                raise RuleError(f"{w}: must be {{'after': duration, 'action': ...}}")
            allowed = ACTIONS.get(cls, JOB_ACTIONS)
            action = rule.get("action", (default_actions or {}).get(cls, allowed[0] if default_actions is None
                                                                      else REQUEUE))
            if action not in allowed:
                raise RuleError(f"{w}.action: must be one of {', '.join(allowed)} for {_class_words(cls)}")
            parsed[queue][cls] = {"after": parse_duration(rule["after"], f"{w}{suffix}"), "action": action}

    def own(level: str, cls: str) -> dict | None:
        rules = parsed.get(level, {})
        if cls in rules:
            return rules[cls]
        return rules.get("interactive") if cls == "interactive-preemptible" else None

    out: dict[tuple[str, str], Rule] = {}
    for q in queues:
        path = [q.name]
        while parents.get(path[0]):
            path.insert(0, parents[path[0]])
        for cls in CLASSES:
            current: Rule | None = None
            for level in ["*", *path]:
                r = own(level, cls)
                if r is None:
                    continue
                src = f"the pool's {noun}" if level == "*" else f"queue {level}'s {noun}"
                if current is not None:
                    w = f"c.GPUPool.{knob}[{level!r}][{cls!r}]"
                    if r["after"] > current.after:
                        raise RuleError(f"{w}{suffix}: {r['after']:g} s is looser than the {current.after:g} s of "
                                        f"{current.source.split(' for ')[0]} (a queue may only tighten its parent's rule)")
                    if STRENGTH[r["action"]] < STRENGTH[current.action]:
                        raise RuleError(f"{w}.action: {r['action']!r} is weaker than {current.action!r} of "
                                        f"{current.source.split(' for ')[0]} (a queue may only tighten its parent's rule)")
                current = Rule(r["after"], r["action"], f"{src} for {_class_words(cls)}")
            if current is not None:
                out[(q.name, cls)] = current
    return out


def workload_class(row: Any) -> str:
    if row.type == D.WORKSPACE:
        return "interactive-preemptible" if row.preemptible else "interactive"
    return row.kind


def human(seconds: float) -> str:
    if seconds >= 3600:
        h, m = divmod(round(seconds / 60), 60)
        return f"{h} h" + (f" {m} min" if m else "")
    if seconds >= 60:
        m, s = divmod(round(seconds), 60)
        return f"{m} min" + (f" {s} s" if s else "")
    return f"{seconds:g} s"


def start_options(row: Any) -> dict:
    """The spawner options (spawner/form.py) that ask for what this workspace had."""
    opts: dict[str, Any] = {"queue": row.queue, "preemptible": bool(row.preemptible)}
    if row.gpu_memory:
        opts["gpu_memory"] = int(row.gpu_memory)
    else:
        opts["gpus"] = row.gpus
    return opts


# ---------------------------------------------------------------------------------- the check
class IdleChecker(Periodic):
    """Every window: find workloads whose GPUs stayed idle for their rule's time and act."""

    what = "checking for idle GPUs"
    log = log

    def __init__(self, loop: Any, sessions: Any, rules: dict[tuple[str, str], Rule], window: float,
                 metrics: Any = None, clock: Any = time.time, limits: dict[tuple[str, str], Rule] | None = None,
                 warning: float = 600.0):
        self.loop = loop
        self.sessions = sessions
        self.rules = rules
        self.limits = limits or {}
        self.warning = warning
        self.interval = window if rules or self.limits else 0.0
        self.window = window
        self.metrics = metrics
        self.clock = clock
        self.idle: dict[str, dict] = {}  # public id -> {"since", "action", "rule"} (dashboard, metrics)

    def idle_since(self, s: Any, row: Any, now: float, after: float) -> bool:
        """Whether every window of the last ``after`` seconds had readings of its GPUs, all 0 %."""
        n = max(1, math.ceil(after / self.window))
        start = now - n * self.window
        gpus = [(p["node"], int(g)) for p in row.allocation or [] for g in p.get("gpus", [])]
        if not gpus:
            return False
        c = S.TABLE.c
        seen = [False] * n
        for node, gpu in gpus:
            q = select(c.t, c.seconds, c.utilization).where(c.node == node, c.gpu == gpu, c.t < now,
                                                            c.t + c.seconds > start, c.utilization.is_not(None))
            for t, secs, util in s.execute(q):
                if util > 0:
                    return False
                first = max(0, int((t - start) // self.window))
                last = min(n - 1, int((t + secs - start - 1e-9) // self.window))
                for k in range(first, last + 1):
                    seen[k] = True
        return all(seen)

    async def tick(self) -> list[str]:
        acted: list[str] = []
        async with self.loop._lock:  # not in the middle of a scheduling cycle
            now = self.clock()
            with self.sessions() as s:
                rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None),
                                                          D.Workload.status == D.RUNNING,
                                                          D.Workload.stop_requested_at.is_(None))).all()
                current: dict[str, dict] = {}
                for row in rows:
                    ran = now - (row.started_at or now)
                    limit = self.limits.get((row.queue, workload_class(row)))
                    if limit is not None and ran >= limit.after:
                        why = f"it ran for its maximum run time of {human(limit.after)} ({limit.source})"
                        if await self.act(s, row, limit, now, why, cause="max-runtime"):
                            acted.append(row.public_id)
                            continue
                    elif limit is not None and ran >= limit.after - self.warning:
                        self.warn(row, limit)
                    rule = self.rules.get((row.queue, workload_class(row)))
                    if rule is None or ran < rule.after or not self.idle_since(s, row, now, rule.after):
                        continue
                    pid = row.public_id
                    current[pid] = self.idle.get(pid) or {"since": now - rule.after, "action": rule.action,
                                                          "rule": rule.source, "user": row.user, "queue": row.queue,
                                                          "gpus": row.gpus}
                    gpu_words = "GPU" if row.gpus == 1 else "GPUs"
                    why = f"its {gpu_words} stayed idle (0 % utilisation) for {human(rule.after)} ({rule.source})"
                    if await self.act(s, row, rule, now, why):
                        acted.append(pid)
                        current.pop(pid, None)
                s.commit()
            self.idle = current
            if self.metrics is not None:
                self.metrics.observe_idle(current, [q for q, _ in self.rules])
        if acted:
            self.loop.wake()
        return acted

    def warn(self, row: Any, limit: Rule) -> None:
        """Before the maximum run time: the reason says when and what happens (the widgets and the
        API show it); a job also finds it through ``gpupool.checkpoint.warning()``."""
        then = "suspended" if row.type == D.WORKSPACE else "asked to checkpoint and requeued"
        msg = (f"reaches its maximum run time of {human(limit.after)} at {_iso(row.started_at + limit.after)} "
               f"({limit.source}); it will then be {then}")
        mark = "; warning: "
        if row.reason.endswith(mark + msg):
            return
        row.reason = row.reason.split(mark)[0] + mark + msg
        log.info("%s %s", row.public_id, msg)
        if row.type == D.JOB:
            path = os.path.join(self.loop.job_dir(row), "control", "warning")
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + ".tmp", "w") as f:
                    json.dump({"message": msg, "at": row.started_at + limit.after}, f)
                os.replace(path + ".tmp", path)
            except OSError as e:
                log.warning("could not write the run time warning of %s: %s", row.public_id, e)

    async def act(self, s: Any, row: Any, rule: Rule, now: float, why: str, cause: str = "idle") -> bool:
        gpu_words = "GPU" if row.gpus == 1 else "GPUs"
        if rule.action == SUSPEND:
            sus = Suspension(user=row.user, server=row.server, workload=row.public_id, options=start_options(row),
                             reason="", suspended_at=now)
            s.add(sus)
            s.flush()
            where = f"{row.user}/{row.server}"
            sus.reason = (f"suspended: {why}; its {gpu_words} went back to the pool and its files are kept. Resume it "
                          f"with the same options: start the server again, or POST suspensions/{sus.id}/resume")
            row._gpupool_end_reason = SUSPENDED  # the ledger's end reason for this interval
            row.status = D.CANCELLED
            row.reason = sus.reason
            row.allocation = None
            row.env = None
            row.finished_at = now
            log.warning("suspended workspace %s (%s, %g %s): %s", row.public_id, where, row.gpus, gpu_words, why)
            self._count("suspended", row)
            return True
        if rule.action == REQUEUE:
            log.warning("requeueing job %s: %s", row.public_id, why)
            await self.loop.request_stop(row, "preempt", f"requeued: {why}", now, session=s)
            self._count("requeued", row)
            if self.metrics is not None:
                self.metrics.evictions.labels(cause=cause).inc()
            return True
        flag = f"; idle: {why}"
        if not row.reason.endswith(flag):
            row.reason = row.reason.split("; idle: ")[0] + flag
            log.info("flagged idle %s: %s", row.public_id, why)
            self._count("flagged", row)
        return False

    def _count(self, action: str, row: Any) -> None:
        counter = getattr(self.metrics, "idle_actions", None)
        if counter is not None:
            counter.labels(queue=row.queue, action=action).inc()


def on_workspace_request(s: Any, row: Any, now: float) -> None:
    """A new request for a server that was suspended: say so in its first reason, and close the
    suspension (the user resumed it by starting the server)."""
    pending = s.scalars(select(Suspension).where(Suspension.user == row.user, Suspension.server == row.server,
                                                 Suspension.resumed_at.is_(None))).all()
    for sus in pending:
        sus.resumed_at = now
        sus.resumed_by = sus.resumed_by or row.user
    if pending:
        last = pending[-1]
        row.reason = (f"resuming: this server was suspended at {_iso(last.suspended_at)} ({last.reason.split(';')[0]}); "
                      f"{row.reason}")


def home_notices(user: Any) -> list[dict]:
    """``gpupool_notices`` of the hub's home page (``c.JupyterHub.template_vars``): one per server of
    ``user`` that is stopped because it was suspended, with a link that starts it again with the
    same options (``/hub/spawn/...?opt-gpus=1&opt-queue=...``: one click). The spawner noted the
    suspension when it stopped the server (spawner/mixin.py); nothing here does I/O."""
    from urllib.parse import urlencode

    out = []
    for name, spawner in sorted((getattr(user, "spawners", None) or {}).items()):
        sus = getattr(spawner, "gpupool_suspension", None)
        if not sus or spawner.active:
            continue
        opts = {f"opt-{k}": ("on" if v is True else v) for k, v in (sus.get("options") or {}).items() if v is not False}
        base = getattr(user, "base_url", "/").split("/user/")[0].rstrip("/")  # the hub's base URL
        path = f"{base}/hub/spawn/{quote(user.name, safe='')}" + (f"/{quote(name, safe='')}" if name else "")
        label = f"server {name}" if name else "your server"
        out.append({"server": name, "title": f"{label[0].upper()}{label[1:]} was suspended at "
                                              f"{_iso(_epoch(sus.get('suspended_at')))}",
                    "reason": sus.get("reason", ""), "resume_url": f"{path}?{urlencode(opts)}",
                    "button": f"Resume {label} with the same options"})
    return out


def _epoch(text: Any) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


# ---------------------------------------------------------------------------------- the API
from .api import APIError, BaseHandler  # noqa: E402 (handlers; api.py does not import this module)
from . import schemas as Q  # noqa: E402


def suspension_view(sus: Suspension) -> dict:
    from .api import iso

    return {"id": sus.id, "user": sus.user, "server": sus.server, "workload": sus.workload, "options": sus.options,
            "reason": sus.reason, "suspended_at": iso(sus.suspended_at), "resumed_at": iso(sus.resumed_at),
            "resumed_by": sus.resumed_by}


SUSPENSION_ID = rf"[0-9]{{1,{ID_DIGITS}}}"  # as job ids: what a database integer holds for sure


class SuspensionsHandler(BaseHandler):
    """``GET suspensions[?user=U&all=1]``: own (admins: everyone's); not yet resumed unless all=1."""

    def get(self) -> None:
        self.require_user_token()
        args = self.query(Q.SuspensionsQuery)
        q = select(Suspension).order_by(Suspension.id)
        user = args.user
        if not self.ident.admin:
            if user and user != self.ident.name:
                raise APIError(403, "user: you may only see your own suspensions", "user")
            user = self.ident.name
        if user:
            q = q.where(Suspension.user == user)
        if not args.all:
            q = q.where(Suspension.resumed_at.is_(None))
        with self.svc.sessions() as s:
            self.send({"suspensions": [suspension_view(x) for x in s.scalars(q)]})


class ResumeHandler(BaseHandler):
    """``POST suspensions/{id}/resume``: start the suspended server again with the same options."""

    async def post(self, sid: str) -> None:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        self.require_user_token()
        with self.svc.sessions() as s:
            sus = s.get(Suspension, int(sid)) if re.fullmatch(SUSPENSION_ID, sid) else None
            if sus is None:
                raise APIError(404, f"no suspension {sid!r}")
            if not (self.ident.admin or self.ident.name == sus.user):
                raise APIError(403, f"suspension {sid} belongs to another user")
            if sus.resumed_at is not None:
                raise APIError(409, f"suspension {sid} was already resumed at {_iso(sus.resumed_at)}")
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
            # the spawner's admission request closes the suspension (on_workspace_request); if it
            # has not arrived yet, close it here
            s.refresh(sus)
            if sus.resumed_at is None:
                sus.resumed_at = time.time()
            sus.resumed_by = self.ident.name
            s.commit()
            self.send(suspension_view(sus), 202)


def routes(prefix: str) -> list[tuple]:
    api = prefix.rstrip("/") + "/api/v1"
    return [(rf"{api}/suspensions/?", SuspensionsHandler), (rf"{api}/suspensions/([^/]+)/resume/?", ResumeHandler)]
