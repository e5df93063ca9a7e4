"""``gpupool submit | list | describe | logs | delete | queues | nodes | top | sweep`` (docs/cli.md).

Tables are plain aligned text for people; ``--json`` prints the service's objects for scripts.
Exit codes: 0 ok, 1 the service refused or failed (its message is printed), 2 usage error,
130 interrupted. Never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

from .api import Client, ConnectionFailed, GPUPoolError, connect
from .jobs import ACTIVE, TERMINAL, KINDS, Job, build_body, metrics_of


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
    if n is None:
        return "-"
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(f".0{unit}", unit)
    return f"{n}B"


def _utf8() -> bool:
    return (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _want(j: dict) -> str:
    """What a job asks for: ``0.5``, ``8Gi``; ``2x4`` for two workers of four GPUs each."""
    want = str(j.get("gpu_memory")) if j.get("gpu_memory") else _num(j.get("gpus"))
    return f'{j["pods"]}x{want}' if (j.get("pods") or 1) > 1 else want


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _alloc(j: dict) -> str:
    return "; ".join(f'{a.get("node")}:{",".join(str(g) for g in a.get("gpus") or [])}({_num(a.get("fraction"))})'
                     for a in j.get("allocation") or [])


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
                      args=prog_args, pods=args.pods)
    c = _client(args)
    job = Job(c.submit(body), client=c)
    if args.json and not args.wait:
        _print_json(job.data)
        return 0
    if not args.json:
        print(f"submitted {job.id} ({job.data.get('name')}) to queue {job.data.get('queue')}: "
              f"{job.data.get('status')}: {job.data.get('reason') or ''}")
    if args.wait:
        job.wait(progress=not args.json and sys.stderr.isatty())
        if args.json:
            _print_json(job.data)
        else:
            print(f"{job.id} {job.data.get('status')}: {job.data.get('reason') or ''}")
        return 0 if job.data.get("status") == "succeeded" else 1
    return 0


def cmd_list(args) -> int:
    c = _client(args)
    jobs = c.jobs(status=args.status, user=args.user, sweep=args.sweep)
    if not args.all and not args.status:
        jobs = [j for j in jobs if j.get("status") in ACTIVE]
    if args.json:
        _print_json(jobs)
        return 0
    if not jobs:
        print("no jobs" + ("" if args.all else " running or queued (use --all for finished ones)"))
        return 0
    rows = [(j.get("id"), j.get("name"), j.get("user"), j.get("queue"), j.get("kind"), j.get("status"), _want(j),
             _alloc(j), (j.get("reason") or "")[:100]) for j in jobs]
    print(table(["ID", "NAME", "USER", "QUEUE", "KIND", "STATUS", "GPUS", "ON", "REASON"], rows))
    return 0


def cmd_describe(args) -> int:
    c = _client(args)
    j = c.job(args.job)
    if args.json:
        _print_json(j)
        return 0
    fields: list[tuple[str, Any]] = [("id", j.get("id")), ("name", j.get("name")), ("user", j.get("user")), ("queue", j.get("queue")),
              ("kind", j.get("kind")), ("status", j.get("status")), ("reason", j.get("reason")),
              ("position", j.get("position")), ("gpus", _want(j)), ("priority", j.get("priority")),
              ("preemptible", j.get("preemptible")), ("notebook", j.get("notebook")),
              ("script", " ".join([j["script"], *(j.get("args") or [])]) if j.get("script") else None),
              ("command", " ".join(j["command"]) if j.get("command") else None),
              ("workers", j.get("pods") if (j.get("pods") or 1) > 1 else None),
              ("parameters", json.dumps(j.get("parameters") or {})), ("sweep", j.get("sweep")),
              ("allocation", _alloc(j) or None), ("submitted", j.get("submitted_at")),
              ("started", j.get("started_at")), ("finished", j.get("finished_at")),
              ("preemptions", j.get("preemptions")), ("restarts", j.get("restarts")),
              ("exit code", j.get("exit_code")),
              ("checkpoint", (j.get("checkpoint") or {}).get("latest") if j.get("checkpoint") else None)]
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        if v is not None and v != "":
            print(f"{k + ':':<{width + 1}} {v}")
    if (j.get("pods") or 1) > 1:
        print("workers:")
        for w in j.get("workers") or []:
            where = f'{w.get("node")} GPUs {",".join(map(str, w.get("gpus") or [])) or "-"}' if w.get("node") else "(not running)"
            print(f'  rank {w.get("rank")}: {where}  (gpupool logs {j.get("id")} --rank {w.get("rank")})')
    metrics = metrics_of(j.get("metrics") or {})
    if metrics:
        print("metrics:")
        for name, pts in metrics.items():
            tail = ", ".join(f"{s}:{v:g}" for s, v in pts[-5:])
            print(f"  {name}: {len(pts)} points, last {pts[-1][1]:g} at step {pts[-1][0]} ({tail})")
    return 0


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
    print(f"\n[{job.id} {job.data.get('status')}: {job.data.get('reason') or ''}]", file=sys.stderr)
    return 0


def cmd_delete(args) -> int:
    c = _client(args)
    rc = 0
    out = []
    for job_id in args.jobs:
        try:
            j = c.cancel(job_id)
            out.append(j)
            if not args.json:
                print(f"{j.get('id')} {j.get('status')}: {j.get('reason') or ''}")
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
    rows = [(("  " if q.get("parent") else "") + str(q.get("name")), q.get("parent") or "-", _gpu(q.get("deserved")),
             _gpu(q.get("fair_share")), _gpu(q.get("allocated")), _gpu(q.get("limit")) if q.get("limit") else "-",
             q.get("over_quota_weight", "-"), q.get("priority", "-"), q.get("running", 0), q.get("pending", 0),
             "yes" if q.get("may_submit") else "no") for q in qs]
    print(table(["QUEUE", "PARENT", "DESERVED", "FAIR-SHARE", "ALLOCATED", "LIMIT", "WEIGHT", "PRIORITY", "RUNNING",
                 "PENDING", "YOU-MAY-SUBMIT"], rows) if rows else "no queues configured")
    return 0


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
                     _bytes(n.get("gpu_memory")), "yes" if n.get("schedulable", True) else "no"))
    print(table(["NODE", "MODEL", "GPUS", "ALLOCATED", "FREE", "GPU-MEMORY", "SCHEDULABLE"], rows)
          if rows else "no nodes registered")
    return 0


def gpu_map(nodes: list[dict], width: int = 20, me: str | None = None) -> str:
    """Nodes x GPUs with their fractional allocations, as text (``gpupool top``)."""
    full, empty = ("█", "░") if _utf8() else ("#", ".")
    rows = []
    for n in nodes:
        gpus = n.get("gpus") or []
        state = "" if n.get("schedulable", True) else " (unschedulable)"
        for i, g in enumerate(gpus):
            allocated = min(1.0, float(g.get("allocated") or 0))
            k = int(round(allocated * width))
            bar = "[" + full * k + empty * (width - k) + "]"
            who = " ".join(f'{a.get("user")}:{a.get("workload")}({_num(a.get("fraction"))})' for a in g.get("allocations") or [])
            util = "-" if g.get("utilization") is None else f'{float(g["utilization"]):.0f}%'
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
        print(f"sweep {s.name} {summ['status']}: {summ['counts']}")
        if b:
            print(f"best: {args.objective}={b['value']:.6g} trial {b['number']} ({b['job_id']}) {json.dumps(b['params'])}")
    if summ["status"] == "failed":
        print(f"gpupool: error: sweep {s.name} failed: {s.error}", file=sys.stderr)
        return 1
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
    p.add_argument("-g", "--gpus", type=_float_gpus, help="GPUs: whole (1, 2) or a fraction (0.5)")
    p.add_argument("--gpu-memory", help="GPU memory instead of --gpus, e.g. 8Gi")
    p.add_argument("-q", "--queue", help="queue (default: your first queue)")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="papermill parameter (repeatable)")
    p.add_argument("--kind", choices=KINDS, help="workload kind (default train)")
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

    p = add("submit", cmd_submit, "submit a notebook (papermill), a Python script or a command as a GPU job",
            epilog="Options go before the notebook/script; everything after a script (or after --command PROGRAM) "
                   "is passed to it: gpupool submit --pods 2 --gpus 4 train.py --lr 3e-4")
    p.add_argument("notebook", metavar="notebook|script",
                   help="a notebook (.ipynb) or a Python script (.py), relative to your home on the hub; with "
                        "--command, the program to run (e.g. python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script or command")
    _submit_options(p)
    p.set_defaults(_options=_submit_options(argparse.ArgumentParser(prog="gpupool submit", add_help=False,
                                                                    parents=[common])))

    p = add("list", cmd_list, "list your jobs (running and queued; --all for finished ones)")
    p.add_argument("--all", "-A", action="store_true", help="include finished jobs")
    p.add_argument("--status", choices=ACTIVE + TERMINAL, help="only jobs in this status")
    p.add_argument("--user", help="only this user's jobs (admins)")
    p.add_argument("--sweep", help="only the trials of this sweep")

    p = add("describe", cmd_describe, "show a job: status, reason, allocation, metrics")
    p.add_argument("job", help="job id, e.g. j-000042")

    p = add("logs", cmd_logs, "print a job's log (papermill's, or the script's output)")
    p.add_argument("job", help="job id")
    p.add_argument("--rank", type=int, help="a worker of a distributed job (default: rank 0)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job finishes")

    p = add("delete", cmd_delete, "cancel jobs (a running job stops with the grace period)")
    p.add_argument("jobs", nargs="+", metavar="JOB", help="job ids")

    add("queues", cmd_queues, "queues with deserved quota, fair share, allocation and pending jobs")
    add("nodes", cmd_nodes, "nodes and their GPUs")

    p = add("top", cmd_top, "GPU map: every node's GPUs with their fractional allocations")
    p.add_argument("-w", "--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")

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
