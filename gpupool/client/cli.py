"""``gpupool login | submit | serve | endpoints | list | describe | logs | output | delete | queues | nodes | node | top | sweep``
(docs/cli.md).

Tables are plain aligned text for people; ``--json`` prints the service's objects for scripts.
Exit codes: 0 ok, 1 the service refused or failed (its message is printed), 2 usage error,
130 interrupted. Never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Sequence
from urllib.parse import quote

from .api import Client, ConnectionFailed, GPUPoolError, NotFound, connect
from ..contract import (ACTIVE, ENDED, ENFORCEMENT_WORDS, JOB_KINDS, NODE_ACTIONS, STATUSES, SUCCEEDED,
                        describe_allocation, format_bytes, parse_bytes)
from .jobs import Job, attempt_words, build_body, marker, metrics_of, post_job, request_text, status_line


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


# -- output helpers ------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(out)


def _num(x) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x):g}"
    except (TypeError, ValueError):
        return str(x)


def _gpu(d) -> str:
    if isinstance(d, dict):
        return _num(d.get("gpu", 0))
    return _num(d)


def _bytes(n) -> str:
    return "-" if n is None else format_bytes(parse_bytes(n))


def _utf8() -> bool:
    return (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _want(j: dict) -> str:
    """What a job asks for in a table cell: ``0.5``, ``8Gi``; ``2x4`` for two workers of four GPUs each."""
    want = _bytes(j["gpu_memory"]) if j.get("gpu_memory") else _num(j.get("gpus") or 0)
    return f'{j["pods"]}x{want}' if (j.get("pods") or 1) > 1 else want


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _alloc(j: dict) -> str:
    """A table cell: ``box GPU 0,1; b2 GPU 3 (0.5)`` (contract.describe_allocation)."""
    return describe_allocation(j.get("allocation"))


def _cut(text: str, width: int = 100) -> str:
    """``text`` in at most ``width`` characters, cut at a word with an ellipsis (``describe``
    shows it whole)."""
    if len(text) <= width:
        return text
    head = text[:width - 1]
    space = head.rfind(" ")
    return (head[:space] if space > width // 2 else head).rstrip(" ,;:") + "…"


def parse_params(items: Sequence[str] | None) -> dict:
    from .sweep import parse_value
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"-p {item!r}: expected NAME=VALUE, e.g. -p lr=0.001")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k.isidentifier():
            raise UsageError(f"-p {item!r}: {k!r} is not a valid parameter name")
        out[k] = parse_value(v)
    return out


# -- commands ------------------------------------------------------------------------------------
def _client(args) -> Client:
    return connect(url=args.url, token=args.token, check=False)


def cmd_submit(args) -> int:
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not args.command_form and not args.notebook.endswith(".py") and rest:
        # a notebook takes no arguments: what follows it are options (gpupool submit nb.ipynb --gpus 1)
        try:
            args = args._options.parse_args(rest, namespace=args)
        except SystemExit:
            raise UsageError(f"{' '.join(rest)!r}: not options of gpupool submit (only a script (.py) or --command "
                             "PROGRAM takes arguments after it)") from None
        rest = []
    if args.gpus is not None and args.gpu_memory is not None:
        raise UsageError("give either -g/--gpus or --gpu-memory, not both")
    target, prog_args = args.notebook, None
    if args.command_form:
        target = [args.notebook, *rest]
    elif args.notebook.endswith(".py"):
        prog_args = list(rest)
    elif rest:
        raise UsageError(f"{' '.join(rest)!r}: only a script (.py) or --command takes arguments after it; "
                         "give a notebook's parameters with -p NAME=VALUE")
    if args.param and (args.command_form or prog_args is not None):
        raise UsageError("-p/--param sets a notebook's parameters; a script or command takes its arguments "
                         "after its name")
    if args.pods is not None and args.pods < 1:
        raise UsageError("--pods: must be at least 1")
    body = build_body(target, gpus=args.gpus, gpu_memory=args.gpu_memory,
                      parameters=parse_params(args.param) if args.param else None,
                      queue=args.queue, kind=args.kind, priority=args.priority, name=args.name,
                      checkpoint_on_signal=True if args.checkpoint_on_signal else None,
                      preemptible=False if args.non_preemptible else None, cpu=args.cpu, memory=args.memory,
                      args=prog_args, pods=args.pods, pools=args.pools)
    c = _client(args)
    job = post_job(body, args.notebook, c)
    if args.json and not args.wait:
        _print_json(job.data)
        return 0
    if not args.json:
        if job.local_notebook is not None:
            print(f"sent the content of the local file {job.local_notebook}")
        print(f"submitted {job.id} ({job.data.get('name')}) to queue {job.data.get('queue')} "
              f"asking for {request_text(job.data)}: {status_line(job.data)}")
    if args.wait:
        job.wait(progress=not args.json and sys.stderr.isatty())
        if args.json:
            _print_json(job.data)
        else:
            print(f"{job.id} {status_line(job.data)}")
        return 0 if job.data.get("status") == SUCCEEDED else 1
    return 0


def _since(iso: str | None) -> str:
    """How long ago an ISO time was: ``45s``, ``12m``, ``3h``, ``2d`` (``-`` when unknown)."""
    if not iso:
        return "-"
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    secs = max(0, int((datetime.now(timezone.utc) - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _is_workspace(ident: str) -> bool:
    return ident.startswith("w-")


def _workspace(c: Client, ws_id: str) -> dict:
    for w in c.workspaces():
        if w.get("id") == ws_id:
            return w
    raise NotFound(f"no workspace {ws_id!r} (a notebook server that holds or waits for GPUs; `gpupool list` shows them)")


def cmd_list(args) -> int:
    c = _client(args)
    jobs = c.jobs(status=args.status, user=args.user, sweep=args.sweep)
    if not args.all and not args.status:
        jobs = [j for j in jobs if j.get("status") in ACTIVE]
    if args.json:
        _print_json(jobs)
        return 0
    spaces = [] if args.sweep else [w for w in c.workspaces() if (not args.user or w.get("user") == args.user)
                                     and (not args.status or w.get("status") == args.status)]
    if not jobs:
        print("no jobs" + ("" if args.all else " running or queued (use --all for finished ones)"))
    else:
        rows = [(j.get("id"), j.get("name"), j.get("user"), j.get("queue"), j.get("kind"),
                 f'{j.get("status")} ({marker(j)})' if marker(j) else j.get("status"), _want(j), _alloc(j),
                 _cut(j.get("reason") or "")) for j in jobs]
        print(table(["ID", "NAME", "USER", "QUEUE", "KIND", "STATUS", "GPUS", "ON", "REASON"], rows))
    if spaces:
        rows = [(w.get("id"), w.get("user"), w.get("server") or "-", w.get("queue"), w.get("status"), _want(w),
                 _alloc(w), _since(w.get("last_activity")), _cut(w.get("reason") or "")) for w in spaces]
        print("\nnotebook servers (workspaces):")
        print(table(["ID", "USER", "SERVER", "QUEUE", "STATUS", "GPUS", "ON", "IDLE", "REASON"], rows))
    return 0


def _print_fields(fields: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        if v is not None and v != "":
            print(f"{k + ':':<{width + 1}} {v}")


def _describe_workspace(c: Client, args) -> int:
    w = _workspace(c, args.job)
    if args.json:
        _print_json(w)
        return 0
    idle = _since(w.get("last_activity"))
    _print_fields([("id", w.get("id")), ("kind", "workspace (a notebook server)"), ("user", w.get("user")),
                   ("server", w.get("server") or "(default)"), ("queue", w.get("queue")), ("status", w.get("status")),
                   ("reason", w.get("reason")), ("position", w.get("position")), ("gpus", request_text(w)),
                   ("preemptible", w.get("preemptible")), ("allocation", _alloc(w) or None),
                   ("memory cap", ENFORCEMENT_WORDS.get(w.get("enforcement"))), ("submitted", w.get("submitted_at")), ("started", w.get("started_at")),
                   ("last activity", f"{w['last_activity']} (idle {idle})" if w.get("last_activity") else None)])
    return 0


def cmd_describe(args) -> int:
    c = _client(args)
    if _is_workspace(args.job):
        return _describe_workspace(c, args)
    j = c.job(args.job)
    if args.json:
        _print_json(j)
        return 0
    fields: list[tuple[str, Any]] = [("id", j.get("id")), ("name", j.get("name")), ("user", j.get("user")), ("queue", j.get("queue")),
              ("kind", j.get("kind")), ("status", j.get("status")), ("reason", j.get("reason")),
              ("position", j.get("position")), ("gpus", request_text(j)), ("priority", j.get("priority")),
              ("preemptible", j.get("preemptible")), ("notebook", j.get("notebook")),
              ("script", " ".join([j["script"], *(j.get("args") or [])]) if j.get("script") else None),
              ("command", " ".join(j["command"]) if j.get("command") else None),
              ("workers", j.get("pods") if (j.get("pods") or 1) > 1 else None),
              ("pools", ", ".join(j["pools"]) if j.get("pools") else None),  # node pools, most preferred first
              ("parameters", json.dumps(j.get("parameters") or {})), ("sweep", j.get("sweep")),
              ("endpoint", _endpoint(c, j)),
              ("allocation", _alloc(j) or None), ("memory cap", ENFORCEMENT_WORDS.get(j.get("enforcement"))),
              ("submitted", j.get("submitted_at")),
              ("started", j.get("started_at")), ("finished", j.get("finished_at")),
              ("preemptions", j.get("preemptions")), ("restarts", j.get("restarts")),
              ("exit code", j.get("exit_code") if j.get("status") in ENDED else None),
              ("checkpoint", (j.get("checkpoint") or {}).get("latest") if j.get("checkpoint") else None)]
    _print_fields(fields)
    if (j.get("pods") or 1) > 1:
        print("workers:" + (" (where they ran)" if j.get("status") in ENDED else ""))
        for w in j.get("workers") or []:
            where = f'{w.get("node")} GPUs {",".join(map(str, w.get("gpus") or [])) or "-"}' if w.get("node") else "(not running)"
            print(f'  rank {w.get("rank")}: {where}  (gpupool logs {j.get("id")} --rank {w.get("rank")})')
    _print_history(j.get("history") or [])
    metrics = metrics_of(j.get("metrics") or {})
    if metrics:
        print("metrics:")
        for name, pts in metrics.items():
            tail = ", ".join(f"{s}:{v:g}" for s, v in pts[-5:])
            print(f"  {name}: {len(pts)} points, last {pts[-1][1]:g} at step {pts[-1][0]} ({tail})")
    return 0


def _endpoint(c: Client, j: dict) -> str | None:
    """An endpoint's URL, state and ready replicas (None for other jobs)."""
    from .serving import endpoint_url

    url = endpoint_url(j, c)
    return url and f'{url} ({j.get("endpoint_state")}, {j.get("ready_replicas", 0)} of {j.get("pods") or 1} replicas ready)'


def _print_history(history: list[dict]) -> None:
    """Each attempt: when, how it ended, where each rank ran, why, and what it resumed from."""
    if not history:
        return
    print("attempts:")
    for a in history:
        words = attempt_words(a)
        print(f'  {a.get("attempt")}. {a.get("started_at")} - {a.get("ended_at") or "now"}: {words["end"]}')
        print(f'     on: {words["on"]}')
        if words["resumed"]:
            print(f'     resumed from: {words["resumed"]}')
        if a.get("reason") and a.get("outcome"):
            print(f'     why: {a["reason"]}')


def cmd_logs(args) -> int:
    c = _client(args)
    job = Job({"id": args.job}, client=c)
    if not args.follow:
        text, _ = c.log(args.job, rank=args.rank)
        sys.stdout.write(text)
        return 0
    for chunk in job.follow_logs(poll=1.0, rank=args.rank):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    print(f"\n[{job.id} {status_line(job.data)}]", file=sys.stderr)
    return 0


def notebook_text(nb: dict) -> str:
    """What a person reads in an executed notebook: each code cell's printed text, results and errors."""
    out = []
    for i, cell in enumerate(nb.get("cells") or []):
        if cell.get("cell_type") != "code":
            continue
        parts = []
        for o in cell.get("outputs") or []:
            kind = o.get("output_type")
            if kind == "stream":
                parts.append("".join(o.get("text") or ""))
            elif kind in ("execute_result", "display_data"):
                text = (o.get("data") or {}).get("text/plain")
                if text:
                    parts.append("".join(text) + "\n")
            elif kind == "error":
                parts.append(f"{o.get('ename')}: {o.get('evalue')}\n")
        if parts:
            out.append(f"--- cell {i} ---\n" + "".join(parts))
    return "".join(out)


def cmd_output(args) -> int:
    c = _client(args)
    text = c.output(args.job)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote the executed notebook of {args.job} to {args.output}")
        return 0
    if args.json:
        sys.stdout.write(text)
        return 0
    sys.stdout.write(notebook_text(json.loads(text)) or f"{args.job}: the executed notebook has no outputs\n")
    return 0


def cmd_delete(args) -> int:
    c = _client(args)
    rc = 0
    out = []
    for job_id in args.jobs:
        try:
            if _is_workspace(job_id):
                w = _workspace(c, job_id)
                server = f"{w.get('user')}/{w.get('server') or ''}"
                raise GPUPoolError(f"{job_id} is the notebook server {server}: stop it from the hub's control panel "
                                   "(File > Hub Control Panel, or /hub/home) and its GPUs go back to the pool at once")
            j = c.cancel(job_id)
            out.append(j)
            if not args.json:
                print(f"{j.get('id')} {status_line(j)}")
        except GPUPoolError as e:
            if isinstance(e, ConnectionFailed):
                raise
            print(f"gpupool: error: {job_id}: {e}", file=sys.stderr)
            rc = 1
    if args.json:
        _print_json(out)
    return rc


def cmd_queues(args) -> int:
    qs = _client(args).queues()
    if args.json:
        _print_json(qs)
        return 0
    fairness = any(q.get("usage") is not None for q in qs)  # fairness over time: usage next to the weight
    plain = any(q.get("fair_share_plain") is not None for q in qs)  # and the share without it
    pooled = any(list(q.get("pools") or {}) not in ([], ["default"]) for q in qs)

    def share(d) -> tuple:  # FAIR-SHARE, and WITHOUT-USAGE while past usage counts
        without = "-" if d.get("fair_share_plain") is None else _gpu(d["fair_share_plain"])
        return (_gpu(d.get("fair_share")), *((without,) if plain else ()))
    shares = ("FAIR-SHARE", *(("WITHOUT-USAGE",) if plain else ()))
    rows = [(("  " if q.get("parent") else "") + str(q.get("name")), q.get("parent") or "-", _gpu(q.get("deserved")),
             *share(q), _gpu(q.get("allocated")), _gpu(q.get("limit")) if q.get("limit") else "-",
             q.get("over_quota_weight", "-"), *((_pct(q.get("usage")),) if fairness else ()), q.get("priority", "-"),
             q.get("running", 0), q.get("pending", 0), "yes" if q.get("may_submit") else "no") for q in qs]
    print(table(["QUEUE", "PARENT", "DESERVED", *shares, "ALLOCATED", "LIMIT", "WEIGHT",
                 *(("USAGE",) if fairness else ()), "PRIORITY", "RUNNING", "PENDING", "YOU-MAY-SUBMIT"], rows)
          if rows else "no queues configured")
    if pooled:  # each queue in each node pool: its quota there, share, allocation (and usage)
        rows = [(str(q.get("name")), name, _gpu(p.get("deserved")), *share(p),
                 _gpu(p.get("allocated")), _gpu(p.get("limit")) if p.get("limit") else "-",
                 p.get("over_quota_weight", "-"), *((_pct(p.get("usage")),) if fairness else ()),
                 _num(p.get("free")), p.get("queued", 0)) for q in qs for name, p in (q.get("pools") or {}).items()]
        print("\nby node pool:")
        print(table(["QUEUE", "POOL", "DESERVED", *shares, "ALLOCATED", "LIMIT", "WEIGHT",
                     *(("USAGE",) if fairness else ()), "POOL-FREE", "POOL-QUEUED"], rows))
    if fairness:
        print("\nUSAGE: past GPU usage over the fairness window, as a share of the capacity; the over-quota share "
              "(FAIR-SHARE beyond DESERVED) goes by WEIGHT adjusted for it (c.GPUPool.fairness)")
    if plain:
        print("WITHOUT-USAGE: the fair share it would have without past usage (a queue that used more than its "
              "weight's share gets less of the GPUs lent beyond deserved quotas, one that used less gets more)")
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{100 * float(x):.0f}%"


def cmd_nodes(args) -> int:
    ns = _client(args).nodes()
    if args.json:
        _print_json(ns)
        return 0
    rows = []
    for n in ns:
        gpus = n.get("gpus") or []
        alloc = sum(float(g.get("allocated") or 0) for g in gpus)
        rows.append((n.get("name"), n.get("gpu_model") or "-", len(gpus), _num(alloc), _num(len(gpus) - alloc),
                     _bytes(n.get("gpu_memory")), "yes" if n.get("schedulable", True) else "no",
                     _node_state(n)))
    print(table(["NODE", "MODEL", "GPUS", "ALLOCATED", "FREE", "GPU-MEMORY", "SCHEDULABLE", "STATE"], rows)
          if rows else "no nodes registered")
    return 0


def _node_state(n: dict) -> str:
    """``up``, ``draining (by alice: kernel update)``, ``failed (NotReady in Kubernetes)``."""
    state = n.get("state") or ("up" if n.get("schedulable", True) else "unschedulable")
    why = n.get("state_reason") or (n.get("unschedulable_reason") if not n.get("schedulable", True) else None)
    return f"{state} ({why})" if why else state


NODE_DONE = {"drain": "asked to checkpoint and leave it", "fail": "stopped and requeued (or suspended)",
             "return": ""}


def cmd_node(args) -> int:
    """``gpupool node drain|fail|return NAME``: take a node out of service and back (admins)."""
    node = _client(args).node_action(args.name, args.action, args.reason)
    if args.json:
        _print_json(node)
        return 0
    print(f"node {node.get('name')}: {_node_state(node)}")
    moved = node.get("workloads") or []
    if moved and NODE_DONE.get(args.action):
        print(f"{NODE_DONE[args.action]}: {', '.join(moved)}")
    elif node.get("state") == "draining":
        print("its workloads are leaving it (gpupool nodes shows 'drained' once it is empty)")
    return 0


def gpu_map(nodes: list[dict], width: int = 20, me: str | None = None) -> str:
    """Nodes x GPUs with their fractional allocations, as text (``gpupool top``)."""
    full, empty = ("█", "░") if _utf8() else ("#", ".")
    rows = []
    for n in nodes:
        gpus = n.get("gpus") or []
        out = n.get("state") not in (None, "up")  # drained, draining, failed
        state = f" ({n['state']})" if out else "" if n.get("schedulable", True) else " (unschedulable)"
        for i, g in enumerate(gpus):
            allocated = min(1.0, float(g.get("allocated") or 0))
            k = int(round(allocated * width))
            bar = "[" + full * k + empty * (width - k) + "]"
            who = " ".join(f'{a.get("user")}:{a.get("workload")}({_num(a.get("fraction"))})' for a in g.get("allocations") or [])
            util = "-" if g.get("utilization") is None else f'{float(g["utilization"]):.0f}%'
            if util != "-" and n.get("readings") == "simulated":  # the demo's made-up readings, never passed off as NVML's
                util += " (simulated)"
            mem = "-"
            if g.get("memory_used") is not None:
                mem = f'{_bytes(g["memory_used"])}/{_bytes(g.get("memory_total"))}'
            rows.append((f'{n.get("name")}{state}' if i == 0 else "", g.get("index"), bar, _num(allocated), util, mem, who))
        if not gpus:
            rows.append((f'{n.get("name")}{state}', "-", "(no GPUs)", "", "", "", ""))
    if not rows:
        return "no nodes registered"
    return table(["NODE", "GPU", "ALLOCATION", "USED", "UTIL", "MEMORY", "WORKLOADS (user:job(fraction))"], rows)


def cmd_top(args) -> int:
    c = _client(args)
    if args.json:
        _print_json(c.nodes())
        return 0
    if not args.watch:
        print(gpu_map(c.nodes()))
        return 0
    try:
        while True:
            text = gpu_map(c.nodes())
            sys.stdout.write("\x1b[2J\x1b[H" + time.strftime("%H:%M:%S ") + c.url + "\n" + text + "\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def cmd_sweep(args) -> int:
    from .sweep import Sweep, SweepError, parse_space_item
    c = _client(args)
    if not args.space:
        raise UsageError("give the search space with --space, e.g. --space 'lr=loguniform(1e-5,1e-1)' --space 'layers=2,4,8'")
    try:
        space = dict(parse_space_item(s) for s in args.space)
    except SweepError as e:
        raise UsageError(str(e)) from None
    pruner = None if args.pruner == "none" else args.pruner
    s = Sweep(args.notebook, space, args.objective, direction=args.direction, trials=args.trials,
              parallel=args.parallel, gpus=args.gpus, gpu_memory=args.gpu_memory, queue=args.queue,
              sampler=args.sampler, pruner=pruner, name=args.name, storage=args.storage,
              parameters=parse_params(args.param), seed=args.seed, poll=args.poll, client=c, pods=args.pods)
    log = sys.stderr if args.json else sys.stdout
    print(f"sweep {s.name}: {'resumed' if s.resumed else 'started'} ({s.trials_total} trials, {s.parallel} at a time; "
          f"state in {s.storage})", file=log)
    s.start()
    seen: dict[int, str] = {}
    try:
        while True:
            alive = s._thread is not None and s._thread.is_alive()
            summ = s.summary()
            for t in summ["trials"]:
                st = t["state"] if t["state"] != "running" else (t.get("status") or "running")
                if seen.get(t["number"]) != st and t.get("job_id"):
                    seen[t["number"]] = st
                    val = f" {args.objective}={t['value']:.6g}" if t.get("value") is not None else ""
                    reason = f" ({t['reason']})" if t.get("reason") and t["state"] in ("pruned", "failed") else ""
                    print(f"  trial {t['number']:>3} {t.get('job_id') or '':<10} {st:<10}{val} "
                          f"{json.dumps(t['params'])}{reason}", file=log, flush=True)
            if not alive:
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        s.stop()
        print(f"\ninterrupted: running trial jobs keep running; resume with --name {s.name}", file=sys.stderr)
        return 130
    summ = s.summary()
    if args.json:
        _print_json(summ)
    else:
        b = summ["best"]
        counts = ", ".join(f"{n} {state}" for state, n in summ["counts"].items() if n)
        print(f"sweep {s.name} {summ['status']}: {summ['done']} of {summ['total']} trials done"
              + (f" ({counts})" if counts else ""))
        if b:
            print(f"best: {args.objective}={b['value']:.6g} trial {b['number']} ({b['job_id']}) {json.dumps(b['params'])}")
    if summ["status"] == "failed":
        print(f"gpupool: error: sweep {s.name} failed: {s.error}", file=sys.stderr)
        return 1
    return 0


def _ask(prompt: str, secret: bool = False) -> str:
    """A line from the terminal (hidden for secrets), or from stdin when it is not a terminal."""
    if sys.stdin.isatty():
        import getpass

        return (getpass.getpass(prompt) if secret else input(prompt)).strip()
    print(prompt, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip()


def cmd_login(args) -> int:
    import getpass
    import platform

    import requests

    from . import config as cfg

    given = args.hub or args.url
    url = given or os.environ.get("GPUPOOL_URL") or cfg._read_config_file()[0].get("url")
    if not url:
        raise UsageError("give the hub's URL, e.g. `gpupool login https://hub.example.org`")
    hub = cfg.hub_base(url)
    token, user = args.token, args.user
    if not token:
        user = user or _ask(f"{hub} user name [{getpass.getuser()}]: ") or getpass.getuser()
        password = _ask(f"password for {user} (empty: paste a token from {hub}hub/token instead): ", secret=True)
        if password:
            api = f"{hub}hub/api/users/{quote(user, safe='')}/tokens"
            body = {"auth": {"username": user, "password": password}, "scopes": ["custom:gpupool:submit"],
                    "note": f"gpupool login on {platform.node() or 'this machine'}"}
            try:
                r = requests.post(api, json=body, timeout=30, allow_redirects=False)
            except requests.RequestException as e:
                raise ConnectionFailed(f"cannot reach the hub at {hub} ({type(e).__name__}). Is the URL right and "
                                       "the hub running?", url=api) from None
            if r.status_code in (401, 403):
                raise GPUPoolError(f"the hub at {hub} refused user {user!r} with that password (if it logs in "
                                   f"through another site, paste a token from {hub}hub/token instead)", status=403)
            if r.status_code != 201:
                raise GPUPoolError(f"the hub at {hub} did not create a token ({r.status_code} {r.reason} from {api}); "
                                   f"paste one from {hub}hub/token instead", status=r.status_code)
            token = r.json()["token"]
        else:
            token = _ask(f"token (from {hub}hub/token): ", secret=True)
            if not token:
                raise UsageError("no password and no token given")
    c = Client(hub, token, url_source="gpupool login")
    c.queues()  # the token works for the gpupool service (else Unauthorized / Forbidden with the reason)
    path = cfg.save_config(hub, token, user)
    who = f" as {user}" if user else ""
    print(f"logged in to {hub}{who}; the URL and token are in {path} (readable by you only)")
    return 0


# -- registration --------------------------------------------------------------------------------
def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--url", help="hub or gpupool service URL (default: $GPUPOOL_URL, the config file, "
                                 "or the JupyterHub environment)")
    g.add_argument("--token", help="JupyterHub API token (default: $GPUPOOL_TOKEN / $JUPYTERHUB_API_TOKEN)")
    g.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    return p


def _float_gpus(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs (e.g. 1, 2 or 0.5)") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (e.g. 1, 2 or 0.5)")
    return v


def _guard(fn: Callable) -> Callable:
    def run(args) -> int:
        try:
            return fn(args)
        except UsageError as e:
            print(f"gpupool {args.command}: error: {e}", file=sys.stderr)
            return 2
        except GPUPoolError as e:
            field = f" [{e.field}]" if getattr(e, "field", None) and e.field not in str(e) else ""
            print(f"gpupool: error: {e}{field}", file=sys.stderr)
            return 1
        except (TypeError, ValueError) as e:  # bad values passed through to client helpers
            print(f"gpupool {args.command}: error: {e}", file=sys.stderr)
            return 2
        except TimeoutError as e:
            print(f"gpupool: error: {e}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            return 0
    return run


def _submit_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--command", dest="command_form", action="store_true",
                   help="run PROGRAM ARGS... as a command, e.g. --command python -m mypkg.train --lr 3e-4")
    p.add_argument("--pods", "--workers", type=int, dest="pods", metavar="N",
                   help="run N workers (a distributed job), each with --gpus; they start together")
    p.add_argument("-g", "--gpus", type=_float_gpus, help="GPUs: whole (1, 2), a fraction (0.5) or 0 for a "
                                                          "CPU-only job (the default)")
    p.add_argument("--gpu-memory", help="GPU memory instead of --gpus, e.g. 8Gi")
    p.add_argument("-q", "--queue", help="queue (default: your first queue)")
    p.add_argument("--pool", action="append", dest="pools", metavar="NAME",
                   help="a node pool it may run in (repeatable, most preferred first; default: the hub's "
                        "preference for its kind)")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="papermill parameter (repeatable)")
    p.add_argument("--kind", choices=JOB_KINDS, help="workload kind (default train)")
    p.add_argument("--priority", type=int, help="priority within the queue")
    p.add_argument("--name", help="display name (default: the notebook's name)")
    p.add_argument("--checkpoint-on-signal", action="store_true", help="the notebook saves a checkpoint when asked to stop")
    p.add_argument("--non-preemptible", action="store_true", help="ask not to be preempted (within quota)")
    p.add_argument("--cpu", type=float, help="CPU cores")
    p.add_argument("--memory", help="memory, e.g. 16Gi")
    p.add_argument("--wait", action="store_true", help="wait until the job finishes; exit 1 unless it succeeded")

    return p


def register(subparsers) -> None:
    common = _common()

    def add(name, fn, help, **kw):
        p = subparsers.add_parser(name, help=help, description=help, parents=[common], **kw)
        p.set_defaults(func=_guard(fn))
        return p

    p = add("login", cmd_login, "log in to a hub: store its URL and a token in the client config file")
    p.add_argument("hub", nargs="?", metavar="URL", help="the hub's URL (default: $GPUPOOL_URL or the stored one)")
    p.add_argument("--user", "-u", help="your hub user name (asked for when not given)")

    p = add("submit", cmd_submit, "submit a notebook (papermill), a Python script or a command as a GPU job",
            epilog="Options go before the notebook/script; everything after a script (or after --command PROGRAM) "
                   "is passed to it: gpupool submit --pods 2 --gpus 4 train.py --lr 3e-4")
    p.add_argument("notebook", metavar="notebook|script",
                   help="a notebook (.ipynb): a file on this machine is sent, any other path names one in your "
                        "working directory on the hub; a Python script (.py), relative to your home on the hub; "
                        "with --command, the program to run (e.g. python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script or command")
    _submit_options(p)
    p.set_defaults(_options=_submit_options(argparse.ArgumentParser(prog="gpupool submit", add_help=False,
                                                                    parents=[common])))

    p = add("list", cmd_list, "list your jobs (running and queued; --all for finished ones) and the notebook "
                               "servers holding or waiting for GPUs")
    p.add_argument("--all", "-A", action="store_true", help="include finished jobs")
    p.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    p.add_argument("--user", help="only this user's jobs (admins)")
    p.add_argument("--sweep", help="only the trials of this sweep")

    p = add("describe", cmd_describe, "show a job (status, reason, allocation, metrics) or a workspace")
    p.add_argument("job", help="job id, e.g. j-000042, or workspace id, e.g. w-000007")

    p = add("logs", cmd_logs, "print a job's log (papermill's, or the script's output)")
    p.add_argument("job", help="job id")
    p.add_argument("--rank", type=int, help="a worker of a distributed job (default: rank 0)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job finishes")

    p = add("output", cmd_output, "print what a job's executed notebook printed (its cell outputs), or save it")
    p.add_argument("job", help="job id")
    p.add_argument("-o", "--output", metavar="FILE", help="save the executed notebook (.ipynb) to FILE")

    p = add("delete", cmd_delete, "cancel jobs (a running job stops with the grace period)")
    p.add_argument("jobs", nargs="+", metavar="JOB", help="job ids")

    add("queues", cmd_queues, "queues with deserved quota, fair share, allocation and pending jobs")
    add("nodes", cmd_nodes, "nodes and their GPUs, and whether each is in service")

    p = add("node", cmd_node, "take a node out of service and back (admins): drain (its workloads checkpoint and "
                              "leave), fail (they stop at once and are requeued) or return")
    p.add_argument("action", choices=NODE_ACTIONS, help="drain, fail or return")
    p.add_argument("name", help="the node's name (gpupool nodes lists them)")
    p.add_argument("--reason", help="why, in words (shown in gpupool nodes and in the stopped workloads' reasons)")

    p = add("top", cmd_top, "GPU map: every node's GPUs with their fractional allocations")
    p.add_argument("-w", "--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")

    from .cli_endpoints import register as register_endpoints

    register_endpoints(add, _float_gpus)  # gpupool serve, gpupool endpoints

    p = add("sweep", cmd_sweep, "run a hyperparameter sweep: each trial is a notebook job")
    p.add_argument("notebook", help="the trial notebook (logs the objective with gpupool.log_metric)")
    p.add_argument("--space", action="append", metavar="NAME=SPEC",
                   help="search space entry (repeatable): lr=loguniform(1e-5,1e-1), x=uniform(0,1), "
                        "n=intuniform(2,8), opt=choice(adam,sgd) or layers=2,4,8")
    p.add_argument("--objective", required=True, help="metric name the notebook logs")
    p.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    p.add_argument("--trials", type=int, default=20, help="number of trials (default 20)")
    p.add_argument("--parallel", type=int, default=4, help="trials running at a time (default 4)")
    p.add_argument("-g", "--gpus", type=_float_gpus, help="GPUs per trial (per worker with --pods)")
    p.add_argument("--pods", "--workers", type=int, dest="pods", metavar="N",
                   help="every trial is a distributed job of N workers")
    p.add_argument("--gpu-memory", help="GPU memory per trial instead of --gpus")
    p.add_argument("-q", "--queue", help="queue")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="fixed papermill parameter")
    p.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe")
    p.add_argument("--pruner", choices=("median", "hyperband", "successive_halving", "percentile", "none"),
                   default="median")
    p.add_argument("--name", help="sweep name; run again with the same name to resume")
    p.add_argument("--storage", help="optuna storage: a sqlite file or an RDB URL (default ./.gpupool-sweeps.db)")
    p.add_argument("--seed", type=int, help="sampler seed")
    p.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)
