"""How long one scheduling cycle takes on a large cluster: Scheduler.schedule() only.

Builds 1000 nodes x 8 GPUs (racks of 20), 200 queues (20 departments x 9 projects), 20000
workloads: running ones (whole GPUs, gangs, halves and quarters; each queue within its deserved
quota) packed onto ~90% of the GPUs and the rest pending, then times schedule() on that snapshot. Two shapes are timed:

* ``busy``: ~90% of the GPUs held, every other workload of the 20000 pending (the worst case:
  allocate, reclaim and preempt try them all);
* ``steady``: the same running set, 1% as many pending (what a live cluster sees most cycles).

* ``churn``: the cluster of issue 13 replayed through the simulator: 200 queues (20 departments
  x 10 projects), 20,000 train workloads (0.25 to 8 GPUs, every 50th interactive, a few 4-pod
  gangs, checkpoint every 60 s and on signal) arriving over 30 s with durations of 20-600 s,
  replayed for 60 s (cycle 1 s, grace 30 s): what a busy live cluster sees, with evictions,
  releases and arrivals between cycles (goals: p50 <= 250 ms, p95 <= 500 ms, max <= 1 s).

* ``scale``: the churn at the size given (``--nodes``, ``--queues``, ``--workloads``) and at
  ``--scale`` times as large (4: 4,000 nodes x 8 GPUs, 1,000 queues, 80,000 arrivals, the size
  of a large site), each replayed for ``--until`` seconds, printed side by side with the ratio of
  their CPU time per cycle: goals, the large cycle p50 <= 500 ms and p95 <= 1 s, and at most
  ``--scale`` + 1 times the small one's p50 (cost that grows at most linearly with the cluster).

* ``pooled``: the same churn with 8 node pools (every queue's quota split over them; half the
  workloads name two pools in order of preference, the rest any) and fairness over time on
  (window 600 s, half-life 300 s, k 1): goal, its cycle within 20% of ``churn``'s (printed side
  by side, with the ratio).

Goal: p50 <= 100 ms per cycle (steady: <= 50 ms). Prints one line per shape, then the cost per action: from
``CycleResult.actions_ms`` when the core fills it, otherwise measured by re-running the cycle
with a growing prefix of the action list (allocate; + consolidate; + reclaim; + preempt).

    .venv/bin/python benchmarks/cycle_speed.py [--nodes 1000] [--queues 200] [--workloads 20000]
                                               [--cycles 7] [--seed 0] [--json]
                                               [--shapes busy,steady,churn,pooled,scale] [--until 60]
                                               [--scale 4] [--repeat 1]

``--repeat N`` replays the churn, pooled and scale shapes N times each, taking turns, and prints
the median of every figure with each run's p50 beside it: on a shared machine whole runs of the
same code differ by up to 20%, more than most changes a session makes.

``--split`` (scale) also times the parts of the cycle (``SPLIT``: the context and its intake of
reservations, allocate with its holders and its pass over the pending workloads, reclaim with its
plans, preempt, ``wait_all``), CPU ms a cycle over the whole replay, at both sizes with the ratio
of each: the parts whose ratio is above ``--scale`` + 1 are where the cycle outgrows the cluster.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from gpupool.scheduler import Scheduler
from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot, Workload

SHAPES = [  # (per-pod gpus, pods, weight): mostly small, as in a lab (cf. the Alibaba GPU trace)
    (0.25, 1, 25), (0.5, 1, 25), (1, 1, 30), (2, 1, 9), (4, 1, 6), (8, 1, 3), (8, 2, 2),
]


def build(nodes: int, queues: int, workloads: int, seed: int, pending: int | None):
    """Nodes, a 2-level queue tree, and workloads: running ones packed node by node onto ~90% of
    the GPUs, each queue kept within its deserved quota (a settled cluster), then pending ones
    (``pending``, default: the rest of ``workloads``) in random queues."""
    rng = np.random.default_rng(seed)
    node_specs = [NodeSpec(name=f"node-{i:04d}", gpus=8, gpu_memory=80 * 2**30, gpu_model="H100", cpu=128,
                           memory=1024 * 2**30, labels={"rack": f"r{i // 20:02d}"}) for i in range(nodes)]
    depts = max(1, queues // 10)
    per_dept = max(1, queues // depts - 1)
    capacity = nodes * 8
    qs: list[QueueSpec] = []
    leaves: list[str] = []
    deserved: dict[str, float] = {}
    for d in range(depts):
        dname = f"dept{d:02d}"
        dq = capacity / depts
        qs.append(QueueSpec(dname, deserved={"gpu": dq}, over_quota_weight=1 + d % 3))
        for p in range(per_dept):
            name = f"{dname}-p{p}"
            qs.append(QueueSpec(name, parent=dname, deserved={"gpu": dq / per_dept},
                                limit={"gpu": 3 * dq / per_dept} if p % 4 == 0 else {},
                                over_quota_weight=1 + p % 2))
            leaves.append(name)
            deserved[name] = dq / per_dept

    weights = np.array([s[2] for s in SHAPES], dtype=float)
    free = np.full((nodes, 8), 1000, dtype=np.int64)
    held = {q: 0.0 for q in leaves}
    out: list[Workload] = []
    cursor, rr = 0, 0  # first node with room; round-robin queue pointer

    def new_workload(i: int, queue: str, k: int) -> Workload:
        gpus, pods, _ = SHAPES[k]
        kind = "hpo-trial" if gpus < 1 and rng.random() < 0.5 else ("interactive" if pods == 1 and gpus <= 1 and
                                                                     rng.random() < 0.2 else "train")
        return Workload(id=f"w{i:05d}", queue=queue, user=f"u{i % 97}", kind=kind, gpus=float(gpus), cpu=4.0,
                        memory=16 * 2**30, pods=pods, submit_time=float(i),
                        checkpoint_on_signal=bool(rng.random() < 0.3))

    # running: pack until 90% of the GPUs are taken
    used_milli, target = 0, int(0.9 * capacity * 1000)
    misses = 0
    while used_milli < target and misses < 50:
        k = int(rng.choice(len(SHAPES), p=weights / weights.sum()))
        gpus, pods, _ = SHAPES[k]
        size = gpus * pods
        queue = None
        for step in range(len(leaves)):
            q = leaves[(rr + step) % len(leaves)]
            if held[q] + size <= deserved[q] + 1e-9:
                queue, rr = q, (rr + step + 1) % len(leaves)
                break
        if queue is None:
            misses += 1
            continue
        milli = int(gpus * 1000) if gpus < 1 else 1000
        need = 1 if gpus < 1 else int(gpus)
        placements: list[PodPlacement] = []
        for pod in range(pods):
            for n in range(cursor, nodes):
                ok = np.flatnonzero(free[n] >= milli)
                if len(ok) >= need:
                    g = tuple(int(x) for x in ok[:need])
                    free[n, list(g)] -= milli
                    placements.append(PodPlacement(pod, node_specs[n].name, g, 1.0 if gpus >= 1 else gpus))
                    break
        if len(placements) < pods:
            for p in placements:
                free[int(p.node.split("-")[1]), list(p.gpus)] += milli
            misses += 1
            continue
        while cursor < nodes and free[cursor].max() < 250:
            cursor += 1
        w = new_workload(len(out), queue, k)
        w.phase, w.placements, w.started_at = Phase.RUNNING, tuple(placements), float(len(out))
        w.last_checkpoint_at = float(len(out)) + 600 if rng.random() < 0.5 else None
        held[queue] += size
        used_milli += milli * need * pods
        out.append(w)
    n_pending = max(0, workloads - len(out)) if pending is None else pending
    for _ in range(n_pending):
        k = int(rng.choice(len(SHAPES), p=weights / weights.sum()))
        out.append(new_workload(len(out), leaves[int(rng.integers(len(leaves)))], k))
    return node_specs, qs, out


def time_cycles(snapshot: Snapshot, config: SchedulerConfig, cycles: int,
                cpu: list[float] | None = None) -> tuple[list[float], object]:
    """Wall-clock ms per schedule() call (and CPU ms into ``cpu``: on a shared machine the wall
    clock includes time spent waiting for a core)."""
    sched = Scheduler(config, timer=time.perf_counter)
    times, result = [], None
    for _ in range(cycles):
        c0, t0 = time.process_time(), time.perf_counter()
        result = sched.schedule(snapshot)
        times.append((time.perf_counter() - t0) * 1000)
        if cpu is not None:
            cpu.append((time.process_time() - c0) * 1000)
    return times, result


def churn_scenario(nodes: int, queues: int, workloads: int, seed: int, until: float) -> dict:
    """Issue 13's churning cluster in the public scenario format."""
    rng = np.random.default_rng(seed)
    depts = max(1, queues // 10)
    capacity = nodes * 8
    qs = []
    leaves = []
    for d in range(depts):
        dname = f"dept{d:02d}"
        qs.append({"name": dname, "deserved": {"gpu": capacity / depts}, "over_quota_weight": 1 + d % 3})
        for p in range(10):
            qs.append({"name": f"{dname}-p{p}", "parent": dname, "deserved": {"gpu": capacity / depts / 10},
                       "over_quota_weight": 1 + (d + p) % 3})
            leaves.append(f"{dname}-p{p}")
    sizes = [0.25, 0.5, 1, 1, 1, 2, 4, 8]
    ws = []
    for i in range(workloads):
        w = {"name": f"w{i:05d}", "queue": leaves[int(rng.integers(len(leaves)))], "kind": "train",
             "submit_at": round(float(rng.uniform(0, 30)), 3), "duration": int(rng.integers(20, 601)),
             "gpus": sizes[int(rng.integers(len(sizes)))], "checkpoint_every": 60, "checkpoint_on_signal": True}
        if i % 50 == 0:
            w["kind"] = "interactive"
            w["gpus"] = min(w["gpus"], 1)
        elif i % 500 == 7:
            w["gpus"], w["pods"] = 2, 4
        ws.append(w)
    return {"config": {"cycle": 1, "preemption_grace": 30, "until": until},
            "cluster": {"nodes": [{"name": "node", "count": nodes, "gpus": 8, "gpu_memory": "80Gi", "cpu": 128,
                                   "memory": "1Ti", "labels": {"rack": "r0"}}]},
            "queues": qs, "workloads": ws}


POOLS = 8


def pooled_scenario(data: dict, seed: int) -> dict:
    """The churn scenario with ``POOLS`` node pools and fairness over time (the module doc)."""
    rng = np.random.default_rng(seed + 1)
    node = data["cluster"]["nodes"][0]
    per = node["count"] // POOLS
    data["cluster"]["nodes"] = [{**node, "name": f"pool{p}", "count": per, "pool": f"pool{p}"} for p in range(POOLS)]
    for q in data["queues"]:
        d = q.pop("deserved")["gpu"] * per * POOLS / (node["count"])  # the nodes that the split left
        q["pools"] = {f"pool{p}": {"deserved": {"gpu": d / POOLS}} for p in range(POOLS)}
    for w in data["workloads"]:
        if rng.random() < 0.5:
            w["pools"] = [f"pool{int(p)}" for p in rng.choice(POOLS, size=2, replace=False)]
    data["config"]["fairness"] = {"window": 600, "window_type": "sliding", "half_life": 300, "k": 1.0}
    return data


# the parts ``--split`` times: name -> (module, attribute path) of the function wrapped where the
# core looks it up
SPLIT = {
    "context": ("gpupool.scheduler.core", "Scheduler.start"),
    "intake": ("gpupool.scheduler.cycle", "take_in"),
    "allocate": ("gpupool.scheduler.core", "ACTIONS.allocate"),
    "holders": ("gpupool.scheduler.actions.allocate", "_bind_holders"),
    "allocate pass": ("gpupool.scheduler.actions.allocate", "_allocate_pass"),
    "reclaim": ("gpupool.scheduler.core", "ACTIONS.reclaim"),
    "plans": ("gpupool.scheduler.actions.reclaim", "plan"),
    "preempt": ("gpupool.scheduler.core", "ACTIONS.preempt"),
    "wait_all": ("gpupool.scheduler.cycle", "Cycle.wait_all"),
}


@contextlib.contextmanager
def split_timer():
    """While open, the ``SPLIT`` functions add their CPU seconds to the dict it yields."""
    spent: dict[str, float] = {}
    undo = []
    for name, (module, path) in SPLIT.items():
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = _get(owner, part)
        real = _get(owner, attr)

        def timed(*a, _real=real, _name=name, **kw):
            c0 = time.process_time()
            try:
                return _real(*a, **kw)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.process_time() - c0
        _put(owner, attr, timed)
        undo.append((owner, attr, real))
    try:
        yield spent
    finally:
        for owner, attr, real in reversed(undo):
            _put(owner, attr, real)


def _get(owner, name: str):
    """An entry of a dict (``ACTIONS``) or an attribute of a module or class."""
    return owner[name] if isinstance(owner, dict) else getattr(owner, name)


def _put(owner, name: str, value) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


class _CpuTimed(Scheduler):
    """The real scheduler, also noting the CPU time of each cycle (on a shared machine the wall
    time of a cycle includes waiting for a core)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.cpu_ms: list[float] = []

    def schedule(self, snapshot: Snapshot):
        c0 = time.process_time()
        try:
            return super().schedule(snapshot)
        finally:
            self.cpu_ms.append((time.process_time() - c0) * 1e3)


def run_churn(args, pooled: bool = False) -> dict:
    from gpupool.sim import parse_scenario
    from gpupool.sim.engine import Engine
    from gpupool.sim.report import build_report

    data = churn_scenario(args.nodes, args.queues, args.workloads, args.seed, args.until)
    if pooled:
        data = pooled_scenario(data, args.seed)
    engine = Engine(parse_scenario(data, "pooled" if pooled else "churn"), args.seed)
    scheduler = engine.scheduler = _CpuTimed(engine.scheduler.config, timer=engine.scheduler.timer)
    split = getattr(args, "split", False)
    c0, t0 = time.process_time(), time.perf_counter()
    with split_timer() if split else contextlib.nullcontext({}) as spent:
        engine.run()
    report = build_report(engine, wall_seconds=time.perf_counter() - t0)
    timing = report["timing"]
    cpu = scheduler.cpu_ms
    return {"nodes": args.nodes, "gpus": args.nodes * 8, "queues": len(data["queues"]), "workloads": args.workloads,
            "cycles": report["metrics"]["scheduling_cycles"], "preemptions": report["metrics"]["preemptions"],
            "cycle_ms": timing["cycle_ms"], "actions_ms": timing.get("actions_ms", {}),
            "cycle_cpu_ms": {"p50": round(pct(cpu, 50), 1), "p95": round(pct(cpu, 95), 1), "max": round(max(cpu), 1)},
            "cpu_seconds": round(time.process_time() - c0, 1),
            **({"split_ms": {k: round(spent.get(k, 0.0) * 1e3 / len(cpu), 1) for k in SPLIT}} if split else {})}


def median_run(runs: list[dict]) -> dict:
    """One replay's figures from several runs of it: each timing the median over the runs (the
    decisions, preemptions included, are the same in every run); ``runs_p50`` keeps every run's
    CPU p50 so that the spread shows."""
    out = dict(runs[0])
    if len(runs) > 1:
        med = lambda vals: round(float(np.median(vals)), 1)  # noqa: E731
        for field in ("cycle_ms", "cycle_cpu_ms"):
            out[field] = {k: med([r[field][k] for r in runs]) for k in runs[0][field]}
        out["actions_ms"] = {a: {k: med([r["actions_ms"][a][k] for r in runs if a in r["actions_ms"]]) for k in v}
                             for a, v in runs[0]["actions_ms"].items()}
        out["cpu_seconds"] = med([r["cpu_seconds"] for r in runs])
        if "split_ms" in runs[0]:
            out["split_ms"] = {k: med([r["split_ms"][k] for r in runs]) for k in runs[0]["split_ms"]}
    out["runs_p50"] = [r["cycle_cpu_ms"]["p50"] for r in runs]
    return out


def _spread(r: dict) -> str:
    """The runs behind a median figure, when there were several."""
    p50s = r.get("runs_p50", [])
    if len(p50s) < 2:
        return ""
    return f" (median of {len(p50s)} runs; their p50: {' / '.join(f'{v:.1f}' for v in p50s)} ms)"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--queues", type=int, default=200)
    ap.add_argument("--workloads", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shapes", default="busy,steady,churn,pooled", help="which shapes to time (comma-separated)")
    ap.add_argument("--until", type=float, default=60.0, help="churn: seconds of simulated time")
    ap.add_argument("--scale", type=int, default=4, help="scale: how many times as large the second size is")
    ap.add_argument("--split", action="store_true",
                    help="scale: also time the parts of the cycle at both sizes, with the ratio of each")
    ap.add_argument("--repeat", type=int, default=1,
                    help="churn, pooled, scale: replay each this many times, the shapes (or sizes) taking turns, "
                         "and report the median of each figure over the runs (a shared machine's runs differ by 20%%)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    shapes = set(args.shapes.split(","))

    config = SchedulerConfig(seed=args.seed)
    results = {}
    for shape, pending in (("busy", None), ("steady", max(1, args.workloads // 100))):
        if shape not in shapes:
            continue
        t0 = time.perf_counter()
        nodes, queues, workloads = build(args.nodes, args.queues, args.workloads, args.seed, pending)
        build_s = time.perf_counter() - t0
        snap = Snapshot(now=100000.0, nodes=nodes, queues=queues, workloads=workloads)
        running = sum(1 for w in workloads if w.phase == Phase.RUNNING)
        used = sum(len(p.gpus) * p.fraction for w in workloads for p in w.placements)
        cpu: list[float] = []
        times, result = time_cycles(snap, config, args.cycles, cpu)
        actions: dict[str, float] = {}
        if result.actions_ms:
            actions = {a: round(v, 1) for a, v in result.actions_ms.items()}
            source = "CycleResult.actions_ms"
        else:  # cost of each action = time with it minus time without it (median of 3)
            source = "prefix timing"
            prev = 0.0
            for i, action in enumerate(config.actions):
                sub = replace(config, actions=config.actions[: i + 1])
                med = statistics.median(time_cycles(snap, sub, 3)[0])
                actions[action] = round(max(0.0, med - prev), 1)
                prev = med
        results[shape] = {
            "nodes": len(nodes), "gpus": len(nodes) * 8, "queues": len(queues), "workloads": len(workloads),
            "running": running, "pending": len(workloads) - running, "gpus_in_use": round(used, 2),
            "binds": len(result.binds), "evictions": len(result.evictions), "cycles": args.cycles,
            "cycle_ms": {"p50": round(pct(times, 50), 1), "p95": round(pct(times, 95), 1),
                         "max": round(max(times), 1)},
            "cycle_cpu_ms": {"p50": round(pct(cpu, 50), 1), "p95": round(pct(cpu, 95), 1)},
            "actions_ms": actions, "actions_source": source, "build_seconds": round(build_s, 2),
        }
    replays = {}  # name -> what to replay; the shapes take turns, run after run
    if "churn" in shapes:
        replays["churn"] = lambda: run_churn(args)
    if "pooled" in shapes:
        replays["pooled"] = lambda: run_churn(args, pooled=True)
    if "scale" in shapes:
        big = argparse.Namespace(**{**vars(args), "nodes": args.nodes * args.scale,
                                    "queues": args.queues * (args.scale + 1), "workloads": args.workloads * args.scale})
        replays["scale-small"] = lambda: run_churn(args)
        replays["scale-large"] = lambda: run_churn(big)
    runs: dict[str, list[dict]] = {name: [] for name in replays}
    for _ in range(args.repeat):
        for name, replay in replays.items():
            runs[name].append(replay())
    merged = {name: median_run(rs) for name, rs in runs.items()}
    for name in ("churn", "pooled"):
        if name in merged:
            results[name] = merged[name]
    if "scale" in shapes:
        results["scale"] = {"small": merged["scale-small"], "large": merged["scale-large"]}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for shape, r in results.items():
        if shape == "scale":
            _print_scale(r, args.scale)
            continue
        c = r["cycle_ms"]
        if shape in ("churn", "pooled"):
            goals = (("p50", 250), ("p95", 500), ("max", 1000))
            if shape == "pooled" and "churn" in results:  # the goal: within 20% of the plain churn
                base = results["churn"]["cycle_cpu_ms"]
                goals = tuple((k, round(1.2 * base[k], 1)) for k in ("p50", "p95", "max"))
            print(f"{shape:7} {POOLS if shape == 'pooled' else 1} pool(s), {r['nodes']} nodes / {r['gpus']} GPUs, {r['queues']} queues, {r['workloads']} arrivals "
                  f"over 30 s, {r['cycles']} cycles, {r['preemptions']} preemptions, {r['cpu_seconds']} s CPU{_spread(r)}")
            cc = r["cycle_cpu_ms"]
            if shape == "pooled" and "churn" in results:
                print("        cycle_ms: " + ", ".join(f"{k} {c[k]:.1f} ms" for k, _ in goals))
                print("        CPU time per cycle: " + ", ".join(
                    f"{k} {cc[k]:.1f} ms [goal <= 1.2 x churn = {g}: {'OK' if cc[k] <= g else 'ABOVE GOAL'}; "
                    f"ratio {cc[k] / max(results['churn']['cycle_cpu_ms'][k], 1e-9):.2f}]" for k, g in goals))
            else:
                print("        cycle_ms: " + ", ".join(
                    f"{k} {c[k]:.1f} ms [goal <= {g}: {'OK' if c[k] <= g else 'ABOVE GOAL'}]" for k, g in goals))
                print("        CPU time per cycle: " + ", ".join(f"{k} {cc[k]:.1f} ms" for k, _ in goals)
                      + "  (wall minus waiting for a core on a shared machine)")
            print("        per action p50/p95/max: " + ", ".join(
                f"{a} {v['p50']:.0f}/{v['p95']:.0f}/{v['max']:.0f}" for a, v in r["actions_ms"].items()))
            continue
        goal = 50 if shape == "steady" else 100
        verdict = "OK" if c["p50"] <= goal else "ABOVE GOAL"
        print(f"{shape:6}  {r['nodes']} nodes / {r['gpus']} GPUs, {r['queues']} queues, {r['workloads']} workloads "
              f"({r['running']} running on {r['gpus_in_use']:.0f} GPUs, {r['pending']} pending)")
        print(f"        schedule(): p50 {c['p50']:.1f} ms  p95 {c['p95']:.1f} ms  max {c['max']:.1f} ms over "
              f"{r['cycles']} cycles  [goal p50 <= {goal} ms: {verdict}]  ({r['binds']} binds, {r['evictions']} evictions)")
        print(f"        CPU time per cycle: p50 {r['cycle_cpu_ms']['p50']:.1f} ms  p95 {r['cycle_cpu_ms']['p95']:.1f} ms"
              "  (wall minus waiting for a core on a shared machine)")
        print("        per action (" + r["actions_source"] + "): " +
              ", ".join(f"{a} {v:.1f} ms" for a, v in r["actions_ms"].items()))
    return 0


def _print_scale(r: dict, scale: int) -> None:
    small, large = r["small"], r["large"]
    for name, x in (("small", small), ("large", large)):
        cc = x["cycle_cpu_ms"]
        print(f"scale   {name}: {x['nodes']} nodes / {x['gpus']} GPUs, {x['queues']} queues, {x['workloads']} arrivals, "
              f"{x['cycles']} cycles, {x['preemptions']} preemptions: CPU per cycle p50 {cc['p50']:.1f} ms, "
              f"p95 {cc['p95']:.1f} ms, max {cc['max']:.1f} ms{_spread(x)}")
        print("        per action p50/p95/max: " + ", ".join(
            f"{a} {v['p50']:.0f}/{v['p95']:.0f}/{v['max']:.0f}" for a, v in x["actions_ms"].items()))
    if "split_ms" in large:
        ls, ss = large["split_ms"], small["split_ms"]
        print(f"        parts, CPU ms a cycle (small / large, ratio; goal <= {scale + 1}): " + ", ".join(
            f"{k} {ss[k]:.1f} / {ls[k]:.1f} ({ls[k] / ss[k]:.1f})" if ss[k] else f"{k} {ss[k]:.1f} / {ls[k]:.1f}"
            for k in SPLIT))
    lc, sc = large["cycle_cpu_ms"], small["cycle_cpu_ms"]
    ratio = lc["p50"] / max(sc["p50"], 1e-9)
    verdict = lambda ok: "OK" if ok else "ABOVE GOAL"  # noqa: E731
    print(f"        large p50 {lc['p50']:.1f} ms [goal <= 500: {verdict(lc['p50'] <= 500)}], "
          f"p95 {lc['p95']:.1f} ms [goal <= 1000: {verdict(lc['p95'] <= 1000)}]; "
          f"ratio large/small at p50 {ratio:.2f} [goal <= {scale + 1}: {verdict(ratio <= scale + 1)}], "
          f"at p95 {lc['p95'] / max(sc['p95'], 1e-9):.2f}")


if __name__ == "__main__":
    sys.exit(main())
