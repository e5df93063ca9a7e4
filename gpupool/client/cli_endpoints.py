"""``gpupool serve FILE`` and ``gpupool endpoints`` (docs/endpoints.md, docs/cli.md)."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from ..contract import endpoint_replicas, endpoint_shown_state
from .serving import endpoint_url, endpoints, serve, wait_ready


def cmd_serve(args: Any) -> int:
    from .cli import UsageError, _client, _print_json

    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    if args.gpus is not None and args.gpu_memory is not None:
        raise UsageError("give either -g/--gpus or --gpu-memory, not both")
    if args.replicas is not None and args.replicas < 1:
        raise UsageError("--replicas: must be at least 1")
    program = [args.program, *rest] if args.command_form else args.program
    if not args.command_form and not args.program.endswith(".py"):
        raise UsageError(f"{args.program!r}: give a Python script (.py), or --command PROGRAM ARGS...")
    c = _client(args)
    job = serve(program, gpus=args.gpus, gpu_memory=args.gpu_memory, replicas=args.replicas,
                share_users=args.share_users, share_groups=args.share_groups,
                args=None if args.command_form else list(rest), queue=args.queue, name=args.name, cpu=args.cpu,
                memory=args.memory, preemptible=True if args.preemptible else None, pools=args.pools, client=c)
    if args.wait:
        wait_ready(job, args.timeout)
    if args.json:
        _print_json(job.data)
        return 0
    print(f"serving {job.id} ({job.data.get('name')}) in queue {job.data.get('queue')}: "
          f"{job.data.get('endpoint_state')}")
    print(f"URL: {endpoint_url(job.data, c)}")
    print(f"call it with your token: curl -H \"Authorization: token $GPUPOOL_TOKEN\" {endpoint_url(job.data, c)}")
    return 0


def cmd_endpoints(args: Any) -> int:
    from .cli import _client, _print_json, _want, table

    c = _client(args)
    found = endpoints(all=args.all, user=args.user, client=c)
    if args.json:
        _print_json([j.data for j in found])
        return 0
    if not found:
        print("no endpoints" + ("" if args.all else " running or queued (use --all for ended ones)"))
        return 0
    rows = []
    for j in found:
        d = j.data
        state = endpoint_shown_state(d.get("status"), d.get("endpoint_state"))
        rows.append((d.get("id"), d.get("name"), d.get("user"), state,
                     endpoint_replicas(d.get("ready_replicas"), d.get("pods")), _want(d), d.get("endpoint_restarts", 0),
                     endpoint_url(d, c)))
    print(table(["ID", "NAME", "USER", "STATE", "READY", "GPUS", "RESTARTS", "URL"], rows))
    return 0


def register(add: Callable[..., argparse.ArgumentParser], float_gpus: Callable[[str], float]) -> None:
    p = add("serve", cmd_serve, "serve a model: run a script that listens on $PORT as an endpoint behind a URL "
                                "of the hub", epilog="Everything after the script is passed to it: "
                                                     "gpupool serve -g 0.5 serve.py --model model.pt")
    p.add_argument("program", metavar="script", help="a Python script (.py) relative to your home on the hub; with "
                                                     "--command, the program to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script or command")
    p.add_argument("--command", dest="command_form", action="store_true", help="run PROGRAM ARGS... as a command")
    p.add_argument("-g", "--gpus", type=float_gpus, help="GPUs per replica: whole, a fraction (0.5) or 0 (default)")
    p.add_argument("--gpu-memory", help="GPU memory per replica instead of --gpus, e.g. 8Gi")
    p.add_argument("--replicas", type=int, help="copies of the server behind the one URL (default 1)")
    p.add_argument("--share-user", action="append", dest="share_users", metavar="USER",
                   help="another user who may call it (repeatable)")
    p.add_argument("--share-group", action="append", dest="share_groups", metavar="GROUP",
                   help="a JupyterHub group whose members may call it (repeatable)")
    p.add_argument("-q", "--queue", help="queue (default: your first queue)")
    p.add_argument("--pool", action="append", dest="pools", metavar="NAME", help="a node pool it may run in")
    p.add_argument("--name", help="display name (default: the script's name)")
    p.add_argument("--cpu", type=float, help="CPU cores per replica")
    p.add_argument("--memory", help="memory per replica, e.g. 16Gi")
    p.add_argument("--preemptible", action="store_true", help="let it be preempted (it may then run over quota)")
    p.add_argument("--wait", action="store_true", help="return once it is ready")
    p.add_argument("--timeout", type=float, default=300.0, help=argparse.SUPPRESS)

    p = add("endpoints", cmd_endpoints, "list your endpoints with their state and URL")
    p.add_argument("--all", "-A", action="store_true", help="include ended ones")
    p.add_argument("--user", help="only this user's endpoints (admins)")
