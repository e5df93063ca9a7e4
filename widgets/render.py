"""Pure rendering: service data (docs/api.md objects) -> HTML strings, from the Jinja2 templates in
``widgets/templates/`` (autoescaped: every value is escaped once, where it is written).

No I/O and no widgets here, so every view is testable from plain dicts. Python computes the numbers
(bar widths, plot coordinates); the templates lay them out. The HTML uses inline styles only (works
in JupyterLab, Notebook 7 and the classic notebook alike) and inline SVG for plots; elements carry
``data-*`` attributes (``data-queue``, ``data-gpu``, ``data-workload``, ``data-own``) so tests and
users can find the bars.
"""
from __future__ import annotations

import hashlib
import math
import os
from typing import Mapping, Sequence

from .. import contract as C
from ..templating import environment

STATUS_COLORS = {
    C.QUEUED: "#b26a00", C.STARTING: "#1565c0", C.RUNNING: "#2e7d32", C.PREEMPTING: "#c62828",
    C.EndpointState.READY.value: "#2e7d32", C.SUCCEEDED: "#1b5e20", C.FAILED: "#b71c1c", C.CANCELLED: "#616161", C.STOPPED: "#616161",
    # a sweep's and its trials' states (gpupool.client.sweep)
    "complete": "#1b5e20", "pruned": "#6d4c41", "finished": "#1b5e20", "created": "#616161",
}
_PALETTE = ["#5c6bc0", "#26a69a", "#ab47bc", "#ff7043", "#8d6e63", "#42a5f5", "#9ccc65", "#ec407a",
            "#78909c", "#ffca28"]
OWN_COLOR = "#1976d2"
FREE_COLOR = "#eceff1"
FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:12px;color:var(--jp-ui-font-color1,#222);"

_ENV = environment(os.path.dirname(os.path.abspath(__file__)))
_ENV.globals.update(font=FONT, free_color=FREE_COLOR, own_color=OWN_COLOR, status_colors=STATUS_COLORS)


def _render(name: str, **context) -> str:
    return _ENV.get_template(name).render(**context).strip()


def user_color(user: str | None, me: str | None = None) -> str:
    if user is not None and user == me:
        return OWN_COLOR
    h = int(hashlib.sha1((user or "?").encode()).hexdigest(), 16)
    return _PALETTE[h % len(_PALETTE)]


def fmt_num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:g}" if abs(x) >= 0.01 or x == 0 else f"{x:.2g}"


def gpu_amount(d: Mapping | None) -> float:
    if not d:
        return 0.0
    v = d.get("gpu", 0) if isinstance(d, Mapping) else d
    try:
        return float(v or 0)
    except (TypeError, ValueError):
        return 0.0


def status_line(text: str, color: str = "#999") -> str:
    """A one-line note under a view (an error, when it was updated)."""
    return _render("status.html", text=text, color=color, loading=False)


def loading() -> str:
    return _render("status.html", loading=True)


# -- queues --------------------------------------------------------------------------------------
def queue_rows(queues: Sequence[Mapping], jobs: Sequence[Mapping] = (), user: str | None = None) -> list[dict]:
    """Per queue: the numbers the queue view draws (also handy for tests)."""
    out = []
    for q in queues:
        name = q.get("name")
        mine = [j for j in jobs if j.get("queue") == name and (user is None or j.get("user") == user)]
        out.append({
            "name": name, "parent": q.get("parent"),
            "deserved": gpu_amount(q.get("deserved")), "fair_share": gpu_amount(q.get("fair_share")),
            "allocated": gpu_amount(q.get("allocated")),
            "limit": gpu_amount(q.get("limit")) if q.get("limit") else None,
            "running": int(q.get("running") or 0), "pending": int(q.get("pending") or 0),
            "may_submit": bool(q.get("may_submit")),
            "my_running": sum(1 for j in mine if j.get("status") in C.HOLDING),
            "my_queued": sum(1 for j in mine if j.get("status") == C.QUEUED),
            "weight": q.get("over_quota_weight"), "usage": q.get("usage"),  # usage: fairness over time
            "fair_share_plain": _plain(q),  # None unless past usage counts (fairness over time)
            "pools": pool_cells(q),
        })
    return out


def pool_cells(q: Mapping) -> list[dict]:
    """A queue's node pools (``GET queues``' ``pools``) as the queue view shows them: allocated /
    deserved and fair share per pool; [] with one pool named ``default``."""
    pools = q.get("pools") or {}
    if list(pools) in ([], ["default"]):
        return []
    return [{"name": name, "allocated": gpu_amount(p.get("allocated")), "deserved": gpu_amount(p.get("deserved")),
             "fair_share": gpu_amount(p.get("fair_share")), "fair_share_plain": _plain(p), "usage": p.get("usage")}
            for name, p in pools.items() if p.get("may_use", True)]


def _plain(q: Mapping) -> float | None:
    """Fairness over time: the share without past usage (``fair_share_plain``), None when not given."""
    return None if q.get("fair_share_plain") is None else gpu_amount(q.get("fair_share_plain"))


def queues_html(queues: Sequence[Mapping], jobs: Sequence[Mapping] = (), user: str | None = None,
                width: int = 220) -> str:
    """Allocated as a filled bar (orange over the deserved quota); deserved (solid) and fair share
    (dashed) as markers; all on one scale, the largest number drawn."""
    rows = queue_rows(queues, jobs, user)
    scale = max([max(r["deserved"], r["fair_share"], r["allocated"], r["limit"] or 0) for r in rows] + [1.0])

    def pct(x: float) -> float:
        return max(0.0, min(100.0, 100.0 * x / scale))

    for r in rows:
        r.update(own=bool(r["my_running"] or r["my_queued"]), over=r["allocated"] > r["deserved"] + 1e-9,
                 pct_allocated=pct(r["allocated"]), pct_deserved=pct(r["deserved"]),
                 pct_fair_share=pct(r["fair_share"]))
    return _render("queues.html", rows=rows, width=width)


# -- GPUs ----------------------------------------------------------------------------------------
def _gpu(gpu: Mapping, user: str | None) -> dict:
    segments, used = [], 0.0
    for a in gpu.get("allocations") or []:
        frac = max(0.0, min(1.0 - used, float(a.get("fraction") or 0)))
        used += frac
        segments.append({"workload": str(a.get("workload")), "user": str(a.get("user")), "fraction": frac,
                         "own": user is not None and a.get("user") == user, "color": user_color(a.get("user"), user),
                         "label": f'{a.get("user") or "?"} {frac:g}',
                         "title": f'{a.get("workload")} ({a.get("kind")}) by {a.get("user")}: {frac:g} GPU'})
    memory_pct = None
    if gpu.get("memory_used") is not None and gpu.get("memory_total"):
        memory_pct = max(0.0, min(100.0, 100.0 * gpu["memory_used"] / gpu["memory_total"]))
    util = gpu.get("utilization")
    return {"index": str(gpu.get("index")), "segments": segments, "free": max(0.0, 1.0 - used),
            "allocated": float(gpu.get("allocated") or 0),
            "utilization": None if util is None else max(0.0, min(100.0, float(util))),
            "memory_pct": memory_pct, "memory_used": gpu.get("memory_used"), "memory_total": gpu.get("memory_total")}


def gpus_html(nodes: Sequence[Mapping], user: str | None = None, width: int = 260) -> str:
    rows = [{"name": str(n.get("name")), "unschedulable": n.get("schedulable") is False,
             "info": " ".join(x for x in (str(n.get("gpu_model") or ""),
                                          C.format_bytes(n["gpu_memory"]) if n.get("gpu_memory") else "") if x),
             "gpus": [_gpu(g, user) for g in n.get("gpus") or []]} for n in nodes]
    return _render("gpus.html", nodes=rows, user=user, width=width)


# -- plots ---------------------------------------------------------------------------------------
def sparkline(series: Mapping[str, Sequence[tuple[float, float]]] | Sequence[tuple[float, float]],
              width: int = 240, height: int = 60, highlight: str | None = None,
              colors: Mapping[str, str] | None = None) -> dict:
    """The numbers of a line plot of one or several (step, value) series (the macro draws it)."""
    if not isinstance(series, Mapping):
        series = {"": series}
    plot: dict = {"width": width, "height": height, "lines": []}
    pts_all = [(float(s), float(v)) for pts in series.values() for s, v in pts if math.isfinite(float(v))]
    if not pts_all:
        return plot
    xs, ys = [p[0] for p in pts_all], [p[1] for p in pts_all]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = 4

    def xy(x: float, y: float) -> tuple[str, str]:
        return (f"{pad + (width - 2 * pad) * (x - x0) / (x1 - x0):.1f}",
                f"{height - pad - (height - 2 * pad) * (y - y0) / (y1 - y0):.1f}")

    for i, (name, pts) in enumerate(series.items()):
        pts = [(float(s), float(v)) for s, v in pts if math.isfinite(float(v))]
        if not pts:
            continue
        hl = name == highlight
        plot["lines"].append({
            "name": str(name), "color": (colors or {}).get(name) or _PALETTE[i % len(_PALETTE)],
            "width": 2.5 if hl else 1.2, "opacity": 1 if hl or highlight is None else 0.6, "r": 3 if hl else 2,
            "points": " ".join(",".join(xy(s, v)) for s, v in pts), "last": xy(*pts[-1])})
    plot.update(top=fmt_num(y1), bottom=fmt_num(y0))
    return plot


# -- jobs ----------------------------------------------------------------------------------------
def _workers_text(j: Mapping) -> str | None:
    """A distributed job's workers: ``2 workers: rank 0 on n1 GPU 0, rank 1 on n2 GPU 3``."""
    pods = int(j.get("pods") or 1)
    if pods < 2:
        return None
    where = [f'rank {w.get("rank")} on {C.Placement(str(w["node"]), tuple(w.get("gpus") or ())).describe()}'
             for w in j.get("workers") or [] if w.get("node")]
    return f"{pods} workers" + (": " + ", ".join(where) if where else " (started together)")


def job_html(job: Mapping, log_tail: str | None = None, rank_logs: Mapping[int, str] | None = None) -> str:
    """One job; ``log_tail`` is (rank 0's) log, ``rank_logs`` the other workers' of a distributed job."""
    from gpupool.client.jobs import attempt_words, marker, metrics_of
    j = job
    program = None
    if j.get("script"):
        program = " ".join([str(j["script"]), *map(str, j.get("args") or [])])
    elif j.get("command"):
        program = " ".join(map(str, j["command"]))
    serving = j.get("kind") == C.INFERENCE
    asks = (f'{C.format_request(j.get("gpus"), j.get("gpu_memory"))} per replica, {int(j.get("pods") or 1)} '
            f'replica{"s" if int(j.get("pods") or 1) > 1 else ""}' if serving
            else C.format_request(j.get("gpus"), j.get("gpu_memory"), j.get("pods")))
    facts = [("queue", j.get("queue")), ("kind", j.get("kind")), ("asks", asks), ("runs", program),
             ("workers", None if serving else _workers_text(j)), ("pools", ", ".join(j.get("pools") or []) or None),
             ("position", j.get("position") if j.get("status") == C.QUEUED else None),
             ("on", C.describe_allocation(j.get("allocation"))), ("parameters", j.get("parameters") or None),
             ("sweep", j.get("sweep")), ("preemptions", j.get("preemptions") or None),
             ("exit code", j.get("exit_code") if j.get("status") in C.ENDED else None),
             ("submitted", j.get("submitted_at")),
             ("started", j.get("started_at")), ("finished", j.get("finished_at"))]
    metrics = [{"name": name, "last": fmt_num(pts[-1][1]) if pts else "–", "step": pts[-1][0] if pts else "–",
                "plot": sparkline(pts, 200, 50)} for name, pts in metrics_of(j.get("metrics") or {}).items()]
    logs = [("log" if int(j.get("pods") or 1) < 2 else "log (rank 0)", log_tail)]
    logs += [(f"log (rank {r})", t) for r, t in sorted((rank_logs or {}).items())]
    history = [{"attempt": a.get("attempt"), "started": a.get("started_at"), "ended": a.get("ended_at") or "",
                "why": a.get("reason") if a.get("outcome") else "", **attempt_words(a)} for a in j.get("history") or []]
    endpoint = endpoint_row(j) if serving and j.get("endpoint") else None
    return _render("job.html", job={k: j.get(k) for k in ("id", "name", "status", "reason")}, marker=marker(j),
                   endpoint=endpoint,
                   facts=[(k, str(v)) for k, v in facts if v not in (None, "", [])], metrics=metrics,
                   logs=[(title, tail) for title, tail in logs if tail], history=history if len(history) > 1 else [])


def jobs_html(jobs: Sequence[Mapping], user: str | None = None) -> str:
    from gpupool.client.jobs import marker
    rows = [{**{k: j.get(k) for k in ("id", "name", "queue", "status", "reason")}, "marker": marker(j),
             "want": C.format_request(j.get("gpus"), j.get("gpu_memory"), j.get("pods"))} for j in jobs]
    return _render("jobs.html", jobs=rows)


def endpoint_row(j: Mapping) -> dict:
    """What the widgets say of one endpoint (``kind: inference``): its state as ``gpupool
    endpoints`` says it, replicas ready of those asked for, GPUs per replica, and its URL (``url``:
    the whole URL the client added, else the ``endpoint`` path)."""
    return {**{k: j.get(k) for k in ("id", "name", "user")},
            "state": C.endpoint_shown_state(j.get("status"), j.get("endpoint_state")),
            "replicas": C.endpoint_replicas(j.get("ready_replicas") if j.get("status") == C.RUNNING else 0,
                                            j.get("pods")),
            "want": C.format_request(j.get("gpus"), j.get("gpu_memory")),
            "restarts": int(j.get("endpoint_restarts") or 0), "url": j.get("url") or j.get("endpoint") or ""}


def endpoints_html(endpoints: Sequence[Mapping]) -> str:
    """A table of endpoints: state, replicas, GPUs, restarts and the URL as a link."""
    return _render("endpoints.html", endpoints=[endpoint_row(j) for j in endpoints])


def wait_html(title: str, status: str, text: str, elapsed: str = "") -> str:
    """What ``job.wait()`` shows in a notebook: the id whole, the status as a badge, the time
    waited, and the reason in full, wrapped to the cell's width (gpupool/client/progress.py)."""
    return _render("wait.html", title=title, status=status, text=text, elapsed=elapsed)


def workspace_html(ws: Mapping | None) -> str:
    """The notebook's own server as the scheduler sees it: status, GPUs and its reason, which says
    when it will be suspended (maximum run time, idle GPUs; docs/admin.md). Empty without one."""
    if not ws:
        return ""
    return _render("workspace.html", ws={k: ws.get(k) for k in ("status", "queue", "reason")},
                   want=C.format_request(ws.get("gpus"), ws.get("gpu_memory")))


# -- sweeps --------------------------------------------------------------------------------------
def sweep_html(summary: Mapping) -> str:
    s = summary
    best = s.get("best")
    trials = s.get("trials") or []
    best_no = str(best["number"]) if best else None
    curves = {str(t["number"]): t.get("curve") or [] for t in trials}
    # trial states are the sweep's own (gpupool.client.sweep); a running trial shows its job's status
    colors = {str(t["number"]): ("#1b5e20" if str(t["number"]) == best_no else "#bdbdbd"
                                 if t["state"] in ("pruned", "failed") else _PALETTE[t["number"] % len(_PALETTE)])
              for t in trials}
    rows = [{"number": t["number"], "state": t["state"] if t["state"] != "running" else (t.get("status") or "running"),
             "value": fmt_num(t.get("value")), "job_id": str(t.get("job_id") or ""), "reason": t.get("reason") or "",
             "params": ", ".join(f"{k}={fmt_num(v) if isinstance(v, float) else v}" for k, v in t["params"].items())}
            for t in reversed(trials)]
    head = {k: s.get(k) for k in ("name", "status", "direction", "objective", "error", "problem")}
    return _render("sweep.html", s=head,
                   done=int(s.get("done") or 0), total=int(s.get("total") or 0), counts=s.get("counts") or {},
                   best=best, best_value=fmt_num(best["value"]) if best else None,
                   plot=sparkline(curves, 360, 110, highlight=best_no, colors=colors) if trials else None, trials=rows)
