"""``gpupool simulate``: replay a scenario through the real scheduler, or measure placement quality
on the Alibaba GPU-sharing trace.

    gpupool simulate SCENARIO.yaml [--seed N] [--json] [--timeline] [--policy NAME]
    gpupool simulate --trace-nodes NODES.csv --trace-pods PODS.csv [--fill 1.3] [--seed 42] [--policy NAME] [--json]

Exit status: 0 done; 2 bad input (the message names the field or file); 1 the scheduler broke
the adapter contract (a bug to report). Never a traceback, unless GPUPOOL_DEBUG=1.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

USAGE_ERROR = 2


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a scenario (or a public trace) through the real scheduler",
        description=("Replay SCENARIO (YAML or JSON, see docs/simulator.md) in simulated time through the real "
                     "scheduler and report waits, fair shares, preemptions and utilization. With --trace-nodes and "
                     "--trace-pods, measure placement quality on the Alibaba GPU-sharing trace instead."),
    )
    p.add_argument("scenario", nargs="?", metavar="SCENARIO", help="scenario file (.yaml, .yml or .json)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed for the scheduler's tie-breaking (default 0; 42 in trace mode)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    p.add_argument("--timeline", action="store_true",
                   help="add each queue's allocated GPUs and fair share per cycle to the report (implies --json)")
    p.add_argument("--policy", default=None,
                   help="placement policy (scenario mode: overrides config.placement; trace mode: default, or the "
                        "paper's baselines random and bestfit)")
    p.add_argument("--max-cycles", type=int, default=1_000_000,
                   help="stop a replay that runs more scheduling cycles than this (default 1000000)")
    g = p.add_argument_group("trace fill mode")
    g.add_argument("--trace-nodes", metavar="NODES.csv", help="node list of the Alibaba GPU trace")
    g.add_argument("--trace-pods", metavar="PODS.csv", help="pod list of the Alibaba GPU trace")
    g.add_argument("--fill", type=float, default=1.3,
                   help="arrive pods until this multiple of the cluster's GPU capacity is requested (default 1.3)")
    p.set_defaults(func=run)


def _fail(message: str, code: int = USAGE_ERROR) -> int:
    print(f"gpupool simulate: {message}", file=sys.stderr)
    return code


def _emit(text: str) -> None:
    """Print to stdout; a reader that went away (``| head``) is not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet


def _debug() -> bool:
    return os.environ.get("GPUPOOL_DEBUG", "") not in ("", "0")


def run(args: argparse.Namespace) -> int:
    trace = args.trace_nodes is not None or args.trace_pods is not None
    if trace:
        if args.scenario:
            return _fail("give either a SCENARIO file or --trace-nodes/--trace-pods, not both")
        if args.trace_nodes is None:
            return _fail("--trace-nodes: required with --trace-pods")
        if args.trace_pods is None:
            return _fail("--trace-pods: required with --trace-nodes")
        if args.timeline:
            return _fail("--timeline: only for scenario mode")
        return _run_trace(args)
    if not args.scenario:
        return _fail("give a SCENARIO file (see docs/simulator.md), or --trace-nodes and --trace-pods")
    return _run_scenario(args)


def _run_scenario(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from gpupool.scheduler.placement import POLICIES
    from gpupool.scheduler.spec import SpecError

    from .scenario import load_scenario

    try:
        scenario = load_scenario(args.scenario)
    except SpecError as e:
        return _fail(str(e))
    if args.policy is not None:
        if args.policy not in POLICIES:
            return _fail(f"--policy: unknown placement policy {args.policy!r} (choose from {', '.join(POLICIES)})")
        scenario.config = dataclasses.replace(scenario.config, placement=args.policy)
    seed = 0 if args.seed is None else args.seed
    if args.max_cycles < 1:
        return _fail("--max-cycles: must be >= 1")

    from .engine import Engine, SimulationError
    from .report import build_report, dumps, format_summary

    t0 = time.perf_counter()
    try:
        engine = Engine(scenario, seed, max_cycles=args.max_cycles).run()
    except SimulationError as e:
        if _debug():
            raise
        return _fail(f"the scheduler broke the adapter contract: {e}", 1)
    except Exception as e:  # a bug in the core: say so in one line, keep the traceback for GPUPOOL_DEBUG=1
        if _debug():
            raise
        return _fail(f"internal error in the scheduler: {type(e).__name__}: {e} "
                     "(run with GPUPOOL_DEBUG=1 for the traceback)", 1)
    report = build_report(engine, timeline=args.timeline, wall_seconds=time.perf_counter() - t0)
    _emit(dumps(report) if args.json or args.timeline else format_summary(report))
    return 0


def _run_trace(args: argparse.Namespace) -> int:
    import json

    for flag, path in (("--trace-nodes", args.trace_nodes), ("--trace-pods", args.trace_pods)):
        p = Path(path)
        if not p.is_file():
            return _fail(f"{flag}: {path}: no such file")
    if not args.fill > 0:
        return _fail("--fill: must be > 0")
    seed = 42 if args.seed is None else args.seed
    policy = args.policy or "default"
    from gpupool.scheduler.placement import POLICIES

    if policy not in POLICIES:
        return _fail(f"--policy: unknown placement policy {policy!r} (choose from {', '.join(POLICIES)})")
    try:
        from .tracefill import format_trace_report, run_trace_fill
    except ImportError as e:
        return _fail(f"trace fill mode is not available: {e}", 1)
    try:
        report = run_trace_fill(args.trace_nodes, args.trace_pods, args.fill, seed, policy)
    except FileNotFoundError as e:
        return _fail(f"{e.filename or e}: no such file")
    except (ValueError, KeyError) as e:  # SpecError is a ValueError and names the field
        if _debug():
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return _fail(f"{msg}" if not isinstance(e, KeyError) else f"missing column {msg!r}")
    _emit(json.dumps(report, indent=2) if args.json else format_trace_report(report))
    return 0
