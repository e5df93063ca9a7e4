"""Idle-GPU rules and maximum run times per queue and class (the check that acts on them is
runtime/idle.py; suspensions are answered by web/suspensions.py).

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

A workload is idle when every one of its GPUs read 0 % utilisation (NVML, runtime/sampling.py)
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

import re
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from ...contract import INTERACTIVE, JOB_KINDS
from ...scheduler.fairshare import QueueTree
from ..store import tables as D
from . import lifecycle

CLASSES = (INTERACTIVE, f"{INTERACTIVE}-preemptible", *JOB_KINDS)  # the kinds (gpupool.contract), workspaces split
SUSPEND, FLAG, REQUEUE = "suspend", "flag", "requeue"
ACTIONS = {"interactive": (SUSPEND, FLAG), "interactive-preemptible": (SUSPEND, FLAG)}
JOB_ACTIONS = (FLAG, REQUEUE)
STRENGTH = {FLAG: 0, REQUEUE: 1, SUSPEND: 1}


class RuleError(ValueError):
    pass


@dataclass(frozen=True)
class Rule:
    after: float
    action: str
    source: str  # "queue research's rule for interactive workspaces"


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
    tree = QueueTree(queues)
    for q in queues:
        path = tree.path(q.name)
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
    if row.pools and len(row.pools) == 1:  # the one node pool it was limited to (chosen, or its policy's)
        opts["pool"] = row.pools[0]
    return opts


def suspend(s: Any, row: Any, why: str, now: float) -> Any:
    """Suspend a workspace holding GPUs (an idle rule, its maximum run time, its node drained or
    failed): its GPUs go back at once, its row ends cancelled (the spawner then stops the server)
    and a suspension record keeps what it asked for, so that it can be resumed. Returns the record."""
    gpu_words = "GPU" if row.gpus == 1 else "GPUs"
    sus = D.Suspension(user=row.user, server=row.server, workload=row.public_id, options=start_options(row),
                       reason="", suspended_at=now)
    s.add(sus)
    s.flush()
    sus.reason = (f"suspended: {why}; its {gpu_words} went back to the pool and its files are kept. Resume it "
                  f"with the same options: start the server again, or POST suspensions/{sus.id}/resume")
    lifecycle.workspace_ended(row, sus.reason, now, suspended=True)
    return sus


def on_workspace_request(s: Any, row: Any, now: float) -> None:
    """A new request for a server that was suspended: say so in its first reason, and close the
    suspension (the user resumed it by starting the server)."""
    pending = s.scalars(select(D.Suspension).where(D.Suspension.user == row.user, D.Suspension.server == row.server,
                                                   D.Suspension.resumed_at.is_(None))).all()
    for sus in pending:
        sus.resumed_at = now
        sus.resumed_by = sus.resumed_by or row.user
    if pending:
        last = pending[-1]
        lifecycle.resuming(row, f"this server was suspended at {clock_words(last.suspended_at)} "
                                f"({last.reason.split(';')[0]})")


def clock_words(t: float) -> str:
    """A time as people read it in a reason: ``2026-11-02 08:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
