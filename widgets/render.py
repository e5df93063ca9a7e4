"""Pure rendering: service data (docs/api.md objects) -> HTML strings.

No I/O and no widgets here, so every view is testable from plain dicts. The HTML uses inline
styles only (works in JupyterLab, Notebook 7 and the classic notebook alike) and inline SVG for
plots; elements carry ``data-*`` attributes (``data-queue``, ``data-gpu``, ``data-workload``,
``data-own``) so tests and users can find the bars.
"""
from __future__ import annotations

import hashlib
import html
import math
from typing import Iterable, Mapping, Sequence

E = html.escape

STATUS_COLORS = {
    "queued": "#b26a00", "starting": "#1565c0", "running": "#2e7d32", "preempting": "#c62828",
    "succeeded": "#1b5e20", "failed": "#b71c1c", "cancelled": "#616161",
    "complete": "#1b5e20", "pruned": "#6d4c41", "finished": "#1b5e20", "stopped": "#616161",
    "created": "#616161",
}
_PALETTE = ["#5c6bc0", "#26a69a", "#ab47bc", "#ff7043", "#8d6e63", "#42a5f5", "#9ccc65", "#ec407a",
            "#78909c", "#ffca28"]
OWN_COLOR = "#1976d2"
FREE_COLOR = "#eceff1"
FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:12px;color:var(--jp-ui-font-color1,#222);"


def user_color(user: str | None, me: str | None = None) -> str:
    if user is not None and user == me:
        return OWN_COLOR
    h = int(hashlib.sha1((user or "?").encode()).hexdigest(), 16)
    return _PALETTE[h % len(_PALETTE)]


def fmt_num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:g}" if abs(x) >= 0.01 or x == 0 else f"{x:.2g}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return f"{int(n)}B"


def gpu_amount(d: Mapping | None) -> float:
    if not d:
        return 0.0
    v = d.get("gpu", 0) if isinstance(d, Mapping) else d
    try:
        return float(v or 0)
    except (TypeError, ValueError):
        return 0.0


def badge(status: str | None) -> str:
    s = status or "?"
    c = STATUS_COLORS.get(s, "#455a64")
    return (f'<span class="gpupool-status" data-status="{E(s)}" style="background:{c};color:white;'
            f'border-radius:3px;padding:0 5px;font-size:11px">{E(s)}</span>')


def _table(head: Sequence[str], rows: Iterable[str], cls: str) -> str:
    th = "".join(f'<th style="text-align:left;padding:2px 8px;border-bottom:1px solid #ccc">{E(h)}</th>' for h in head)
    return (f'<table class="{cls}" style="border-collapse:collapse;{FONT}"><thead><tr>{th}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _td(content: str, extra: str = "") -> str:
    return f'<td style="padding:2px 8px;vertical-align:middle;{extra}">{content}</td>'


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
            "my_running": sum(1 for j in mine if j.get("status") in ("running", "starting", "preempting")),
            "my_queued": sum(1 for j in mine if j.get("status") == "queued"),
        })
    return out


def queue_bar(row: Mapping, scale: float, width: int = 220) -> str:
    """Allocated as a filled bar; deserved (solid) and fair share (dashed) as markers."""
    scale = scale or 1.0

    def pct(x):
        return max(0.0, min(100.0, 100.0 * x / scale))

    over = row["allocated"] > row["deserved"] + 1e-9
    fill = "#ef6c00" if over else "#43a047"
    parts = [
        f'<div class="gpupool-bar-allocated" data-value="{row["allocated"]:g}" title="allocated {row["allocated"]:g} GPU" '
        f'style="position:absolute;left:0;top:0;bottom:0;width:{pct(row["allocated"]):.1f}%;background:{fill}"></div>',
        f'<div class="gpupool-bar-deserved" data-value="{row["deserved"]:g}" title="deserved {row["deserved"]:g} GPU" '
        f'style="position:absolute;top:-2px;bottom:-2px;left:{pct(row["deserved"]):.1f}%;border-left:2px solid #263238"></div>',
        f'<div class="gpupool-bar-fairshare" data-value="{row["fair_share"]:g}" title="fair share {row["fair_share"]:g} GPU" '
        f'style="position:absolute;top:-2px;bottom:-2px;left:{pct(row["fair_share"]):.1f}%;border-left:2px dashed #1e88e5"></div>',
    ]
    return (f'<div class="gpupool-queue-bar" data-queue="{E(str(row["name"]))}" style="position:relative;'
            f'width:{width}px;height:12px;background:{FREE_COLOR};border-radius:2px">{"".join(parts)}</div>')


def queues_html(queues: Sequence[Mapping], jobs: Sequence[Mapping] = (), user: str | None = None) -> str:
    rows = queue_rows(queues, jobs, user)
    if not rows:
        return f'<div style="{FONT}">No queues are configured.</div>'
    scale = max([max(r["deserved"], r["fair_share"], r["allocated"], r["limit"] or 0) for r in rows] + [1.0])
    trs = []
    for r in rows:
        own = r["my_running"] or r["my_queued"]
        you = ""
        if own:
            you = (f'<span class="gpupool-own" data-own="{E(str(r["name"]))}" style="background:#e3f2fd;color:{OWN_COLOR};'
                   f'font-weight:600;padding:0 4px;border-radius:3px">you: {r["my_running"]} running, '
                   f'{r["my_queued"]} queued</span>')
        name = E(str(r["name"]))
        if r["parent"]:
            name = f'<span style="color:#888">{E(str(r["parent"]))}/</span>{name}'
        if r["may_submit"]:
            name = f"<b>{name}</b>"
        numbers = (f'{r["allocated"]:g} / {r["deserved"]:g} deserved · fair share {r["fair_share"]:.2f}'
                   + (f' · limit {r["limit"]:g}' if r["limit"] else ""))
        pend = f'<span style="color:#b26a00;font-weight:600">{r["pending"]} pending</span>' if r["pending"] else "0 pending"
        style = "background:#f5faff" if own else ""
        trs.append(f'<tr class="gpupool-queue" data-queue="{E(str(r["name"]))}" style="{style}">'
                   + _td(name) + _td(queue_bar(r, scale)) + _td(numbers) + _td(f'{r["running"]} running · {pend}')
                   + _td(you) + "</tr>")
    legend = ('<div style="color:#666;margin-top:4px">bar: GPUs allocated (orange when over the deserved quota); '
              '<span style="border-left:2px solid #263238;padding-left:3px">deserved</span> · '
              '<span style="border-left:2px dashed #1e88e5;padding-left:3px">fair share</span>; '
              'bold: queues you may submit to</div>')
    return (_table(["queue", "GPUs", "allocated / deserved", "jobs", "yours"], trs, "gpupool-queues")
            + f'<div style="{FONT}">{legend}</div>')


# -- GPUs ----------------------------------------------------------------------------------------
def gpu_bar(gpu: Mapping, user: str | None = None, width: int = 260) -> str:
    segs = []
    used = 0.0
    for a in gpu.get("allocations") or []:
        frac = max(0.0, min(1.0 - used, float(a.get("fraction") or 0)))
        used += frac
        own = user is not None and a.get("user") == user
        color = user_color(a.get("user"), user)
        label = f'{a.get("user") or "?"} {frac:g}'
        title = f'{a.get("workload")} ({a.get("kind")}) by {a.get("user")}: {frac:g} GPU'
        segs.append(f'<div class="gpupool-alloc" data-workload="{E(str(a.get("workload")))}" data-user="{E(str(a.get("user")))}" '
                    f'data-fraction="{frac:g}" data-own="{str(own).lower()}" title="{E(title)}" '
                    f'style="width:{100 * frac:.1f}%;background:{color};color:white;overflow:hidden;white-space:nowrap;'
                    f'font-size:11px;line-height:16px;text-align:center;box-sizing:border-box;'
                    f'{"outline:2px solid #0d47a1;outline-offset:-2px;font-weight:700;" if own else "border-right:1px solid white;"}">'
                    f'{E(label)}</div>')
    free = max(0.0, 1.0 - used)
    if free > 1e-9:
        segs.append(f'<div class="gpupool-free" data-fraction="{free:g}" style="width:{100 * free:.1f}%;background:{FREE_COLOR};'
                    f'color:#90a4ae;font-size:11px;line-height:16px;text-align:center">{"free " + format(free, "g") if free >= 0.2 else ""}</div>')
    return (f'<div class="gpupool-gpu-bar" data-gpu="{E(str(gpu.get("index")))}" style="display:flex;width:{width}px;height:16px;'
            f'border:1px solid #b0bec5;border-radius:2px;overflow:hidden">{"".join(segs)}</div>')


def meter(pct: float | None, width: int = 60, color: str = "#7e57c2") -> str:
    if pct is None:
        return '<span style="color:#999">–</span>'
    p = max(0.0, min(100.0, float(pct)))
    return (f'<span style="display:inline-block;width:{width}px;height:8px;background:{FREE_COLOR};vertical-align:middle">'
            f'<span style="display:block;height:8px;width:{p:.0f}%;background:{color}"></span></span> {p:.0f}%')


def gpus_html(nodes: Sequence[Mapping], user: str | None = None) -> str:
    if not nodes:
        return f'<div style="{FONT}">No GPU nodes are registered.</div>'
    trs = []
    for n in nodes:
        gpus = n.get("gpus") or []
        nodename = E(str(n.get("name")))
        info = " ".join(x for x in (E(str(n.get("gpu_model") or "")), fmt_bytes(n.get("gpu_memory")) if n.get("gpu_memory") else "") if x)
        if n.get("schedulable") is False:
            info += ' <span style="color:#c62828">unschedulable</span>'
        if not gpus:
            trs.append(f'<tr class="gpupool-node" data-node="{nodename}">' + _td(f"<b>{nodename}</b> {info}") + _td("no GPUs")
                       + _td("") + _td("") + "</tr>")
        for i, g in enumerate(gpus):
            first = _td(f"<b>{nodename}</b><br><span style='color:#666'>{info}</span>" if i == 0 else "")
            mem = "–"
            if g.get("memory_used") is not None and g.get("memory_total"):
                mp = 100.0 * g["memory_used"] / g["memory_total"]
                mem = meter(mp, color="#26a69a") + f' {fmt_bytes(g["memory_used"])}/{fmt_bytes(g["memory_total"])}'
            util = meter(g.get("utilization"))
            trs.append(f'<tr class="gpupool-gpu" data-node="{nodename}" data-gpu="{E(str(g.get("index")))}">' + first
                       + _td(f'GPU {E(str(g.get("index")))}') + _td(gpu_bar(g, user))
                       + _td(f'{float(g.get("allocated") or 0):g}/1') + _td(util) + _td(mem) + "</tr>")
    return (_table(["node", "gpu", "allocations", "alloc", "utilization", "memory"], trs, "gpupool-gpus")
            + f'<div style="{FONT};color:#666;margin-top:4px">each bar is one GPU; segments are workloads by user '
              f'and fraction{"; outlined: yours" if user else ""}; utilization and memory are live NVML readings where available</div>')


# -- plots ---------------------------------------------------------------------------------------
def sparkline_svg(series: Mapping[str, Sequence[tuple[float, float]]] | Sequence[tuple[float, float]],
                  width: int = 240, height: int = 60, highlight: str | None = None,
                  colors: Mapping[str, str] | None = None) -> str:
    """An inline SVG line plot of one or several (step, value) series."""
    if not isinstance(series, Mapping):
        series = {"": series}
    pts_all = [(float(s), float(v)) for pts in series.values() for s, v in pts if math.isfinite(float(v))]
    if not pts_all:
        return f'<svg class="gpupool-plot" width="{width}" height="{height}"><text x="4" y="{height // 2}" font-size="11" fill="#999">no data yet</text></svg>'
    xs, ys = [p[0] for p in pts_all], [p[1] for p in pts_all]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = 4

    def X(x):
        return pad + (width - 2 * pad) * (x - x0) / (x1 - x0)

    def Y(y):
        return height - pad - (height - 2 * pad) * (y - y0) / (y1 - y0)

    lines = []
    for i, (name, pts) in enumerate(series.items()):
        pts = [(float(s), float(v)) for s, v in pts if math.isfinite(float(v))]
        if not pts:
            continue
        color = (colors or {}).get(name) or _PALETTE[i % len(_PALETTE)]
        hl = name == highlight
        coords = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in pts)
        lines.append(f'<polyline data-series="{E(str(name))}" fill="none" stroke="{color}" '
                     f'stroke-width="{2.5 if hl else 1.2}" stroke-opacity="{1 if hl or highlight is None else 0.6}" points="{coords}"/>')
        s, v = pts[-1]
        lines.append(f'<circle cx="{X(s):.1f}" cy="{Y(v):.1f}" r="{3 if hl else 2}" fill="{color}"/>')
    axis = (f'<text x="{pad}" y="10" font-size="9" fill="#777">{fmt_num(y1)}</text>'
            f'<text x="{pad}" y="{height - 1}" font-size="9" fill="#777">{fmt_num(y0)}</text>')
    return (f'<svg class="gpupool-plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'style="background:#fafafa;border:1px solid #eee">{axis}{"".join(lines)}</svg>')


# -- jobs ----------------------------------------------------------------------------------------
def _alloc_text(allocation) -> str:
    parts = []
    for a in allocation or []:
        gpus = ",".join(str(g) for g in a.get("gpus") or [])
        parts.append(f'{a.get("node")} GPU {gpus} ({float(a.get("fraction") or 0):g})')
    return "; ".join(parts)


def _workers_text(j: Mapping) -> str | None:
    """A distributed job's workers: ``2 workers: rank 0 on n1 GPU 0, rank 1 on n2 GPU 3``."""
    pods = int(j.get("pods") or 1)
    if pods < 2:
        return None
    where = [f'rank {w.get("rank")} on {w.get("node")} GPU {",".join(str(g) for g in w.get("gpus") or []) or "-"}'
             for w in j.get("workers") or [] if w.get("node")]
    return f"{pods} workers" + (": " + ", ".join(where) if where else " (started together)")


def job_html(job: Mapping, log_tail: str | None = None, rank_logs: Mapping[int, str] | None = None) -> str:
    from gpupool.client.jobs import metrics_of, request_text
    j = job
    program = None
    if j.get("script"):
        program = " ".join([str(j["script"]), *map(str, j.get("args") or [])])
    elif j.get("command"):
        program = " ".join(map(str, j["command"]))
    want = request_text(j)
    facts = [("queue", j.get("queue")), ("kind", j.get("kind")), ("asks", want), ("runs", program),
             ("workers", _workers_text(j)),
             ("position", j.get("position") if j.get("status") == "queued" else None),
             ("on", _alloc_text(j.get("allocation"))), ("parameters", j.get("parameters") or None),
             ("sweep", j.get("sweep")), ("preemptions", j.get("preemptions") or None),
             ("exit code", j.get("exit_code")), ("submitted", j.get("submitted_at")),
             ("started", j.get("started_at")), ("finished", j.get("finished_at"))]
    rows = "".join(f'<tr><td style="color:#666;padding:0 8px 0 0">{E(k)}</td><td>{E(str(v))}</td></tr>'
                   for k, v in facts if v not in (None, "", []))
    metrics = metrics_of(j.get("metrics") or {})
    plots = "".join(f'<div class="gpupool-metric" data-metric="{E(name)}" style="display:inline-block;margin-right:12px">'
                    f'<div>{E(name)} = {fmt_num(pts[-1][1]) if pts else "–"} (step {pts[-1][0] if pts else "–"})</div>'
                    f'{sparkline_svg(pts, 200, 50)}</div>' for name, pts in metrics.items())
    log = ""
    tails = [("log" if int(j.get("pods") or 1) < 2 else "log (rank 0)", log_tail)]
    tails += [(f"log (rank {r})", t) for r, t in sorted((rank_logs or {}).items())]
    for title, tail in tails:
        if tail:
            log += (f'<details><summary>{E(title)}</summary><pre style="max-height:200px;overflow:auto;'
                    f'font-size:11px">{E(tail)}</pre></details>')
    return (f'<div class="gpupool-job" data-job="{E(str(j.get("id")))}" style="{FONT}">'
            f'<div><b>{E(str(j.get("id")))}</b> {E(str(j.get("name") or ""))} {badge(j.get("status"))}</div>'
            f'<div class="gpupool-reason" style="margin:3px 0;color:#444">{E(j.get("reason") or "")}</div>'
            f'<table style="font-size:12px">{rows}</table>{plots}{log}</div>')


def jobs_html(jobs: Sequence[Mapping], user: str | None = None) -> str:
    if not jobs:
        return f'<div style="{FONT}">You have no jobs. Submit one with gpupool.submit("train.ipynb", gpus=0.5).</div>'
    from gpupool.client.jobs import request_text
    trs = []
    for j in jobs:
        want = request_text(j)
        trs.append(f'<tr class="gpupool-jobrow" data-job="{E(str(j.get("id")))}">' + _td(E(str(j.get("id"))))
                   + _td(E(str(j.get("name") or ""))) + _td(E(str(j.get("queue") or ""))) + _td(badge(j.get("status")))
                   + _td(E(want)) + _td(E(j.get("reason") or ""), "max-width:420px") + "</tr>")
    return _table(["job", "name", "queue", "status", "GPUs", "reason"], trs, "gpupool-jobs")


def workspace_html(ws: Mapping | None) -> str:
    """The notebook's own server as the scheduler sees it: status, GPUs and its reason, which says
    when it will be suspended (maximum run time, idle GPUs; docs/admin.md). Empty without one."""
    if not ws:
        return ""
    gpus = ws.get("gpus")
    want = f"{gpus:g} GPU{'s' if gpus != 1 else ''}" if isinstance(gpus, (int, float)) else "GPU memory"
    return (f'<div class="gpupool-workspace" data-status="{E(str(ws.get("status")))}" style="{FONT}">'
            f'<b>Your server</b> {badge(ws.get("status"))} {E(want)} in {E(str(ws.get("queue") or ""))}: '
            f'{E(ws.get("reason") or "")}</div>')


# -- sweeps --------------------------------------------------------------------------------------
def progress_bar(done: int, total: int, width: int = 200) -> str:
    pct = 100.0 * done / total if total else 0.0
    return (f'<span class="gpupool-progress" data-done="{done}" data-total="{total}" style="display:inline-block;'
            f'width:{width}px;height:10px;background:{FREE_COLOR};vertical-align:middle">'
            f'<span style="display:block;height:10px;width:{pct:.1f}%;background:#43a047"></span></span> {done}/{total}')


def sweep_html(summary: Mapping) -> str:
    s = summary
    best = s.get("best")
    trials = s.get("trials") or []
    best_no = str(best["number"]) if best else None
    curves = {str(t["number"]): t.get("curve") or [] for t in trials}
    colors = {str(t["number"]): ("#1b5e20" if str(t["number"]) == best_no else
                                 "#bdbdbd" if t["state"] in ("pruned", "failed") else _PALETTE[t["number"] % len(_PALETTE)])
              for t in trials}
    c = s.get("counts") or {}
    head = (f'<div><b>sweep {E(str(s.get("name")))}</b> {badge(s.get("status"))} '
            f'{s.get("direction")} <code>{E(str(s.get("objective")))}</code></div>'
            f'<div>{progress_bar(int(s.get("done") or 0), int(s.get("total") or 0))} · '
            f'{c.get("complete", 0)} complete, {c.get("pruned", 0)} pruned, {c.get("failed", 0)} failed, '
            f'{c.get("running", 0)} active</div>')
    if best:
        head += (f'<div class="gpupool-best">best: <b>{E(str(s.get("objective")))} = {fmt_num(best["value"])}</b> '
                 f'(trial {best["number"]}, {E(str(best.get("job_id")))}) with {E(str(best["params"]))}</div>')
    if s.get("error"):
        head += f'<div style="color:#b71c1c">{E(str(s["error"]))}</div>'
    if s.get("problem"):
        head += f'<div style="color:#b26a00">{E(str(s["problem"]))}</div>'
    plot = sparkline_svg(curves, 360, 110, highlight=best_no, colors=colors) if trials else ""
    trs = []
    for t in reversed(trials):
        st = t["state"] if t["state"] != "running" else (t.get("status") or "running")
        trs.append(f'<tr class="gpupool-trial" data-trial="{t["number"]}" data-state="{E(st)}">'
                   + _td(str(t["number"])) + _td(badge(st)) + _td(fmt_num(t.get("value")))
                   + _td(E(", ".join(f"{k}={fmt_num(v) if isinstance(v, float) else v}" for k, v in t["params"].items())))
                   + _td(E(str(t.get("job_id") or ""))) + _td(E(t.get("reason") or ""), "max-width:380px") + "</tr>")
    table = _table(["trial", "state", "value", "params", "job", "reason"], trs, "gpupool-trials") if trs else ""
    return (f'<div class="gpupool-sweep" data-sweep="{E(str(s.get("name")))}" style="{FONT}">{head}'
            f'<div style="margin:4px 0">{plot}</div>{table}</div>')
