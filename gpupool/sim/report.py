"""The simulator's report: the JSON document of ../shared/spec/scenario.md and a human summary.

Everything but ``timing`` is a pure function of the scenario and the seed, so two runs give
byte-identical JSON once ``timing`` is removed (tests check it). Numbers are rounded to 6 decimals
so that float noise never shows.
"""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from gpupool.scheduler.model import KINDS

from .engine import Engine


def _r(x: float | None, nd: int = 6):
    if x is None:
        return None
    v = round(float(x), nd)
    return int(v) if v == int(v) and abs(v) < 2**53 else v


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p95": None}
    a = np.asarray(values, dtype=float)
    return {"mean": _r(a.mean(), 3), "p50": _r(np.percentile(a, 50), 3), "p95": _r(np.percentile(a, 95), 3)}


def _timing_stats(values: list[float]) -> dict:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0}
    a = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p95": round(float(np.percentile(a, 95)), 3),
            "max": round(float(a.max()), 3)}


def build_report(engine: Engine, *, timeline: bool = False, wall_seconds: float = 0.0) -> dict:
    sc = engine.scenario
    makespan = engine.end_time
    capacity = sum(n.gpus for n in sc.nodes)  # the declared inventory
    available = engine.available_gpu_seconds  # capacity x makespan, less what node events took out
    queue_seconds = engine._roll_up(engine.leaf_gpu_seconds)
    allocated_seconds = sum(engine.leaf_gpu_seconds.values())
    sims = engine.sims

    wait: dict[str, dict] = {}
    for kind in KINDS:
        of_kind = [s for s in sims if s.w.kind == kind and s.rejected is None]
        if not of_kind:
            continue
        waits = [s.first_start - s.w.submit_time for s in of_kind if s.first_start is not None]
        wait[kind] = {**_stats(waits), "count": len(waits),
                      "never_started": sum(1 for s in of_kind if s.first_start is None)}

    preempted_by_queue: dict[str, int] = {}
    for s in sims:
        if s.preemptions:
            preempted_by_queue[s.w.queue] = preempted_by_queue.get(s.w.queue, 0) + s.preemptions

    def per_time(x: float) -> float:
        return x / makespan if makespan > 0 else 0.0

    queues = []
    for q in sc.queues:
        queues.append({
            "name": q.name, "parent": q.parent,
            "deserved_gpu": _r(q.deserved.get("gpu", 0.0)),
            "limit_gpu": _r(q.limit["gpu"]) if "gpu" in q.limit else None,
            "gpu_seconds": _r(queue_seconds[q.name]),
            "mean_fair_share_gpu": _r(per_time(engine.fair_integral[q.name])),
            "mean_allocated_gpu": _r(per_time(queue_seconds[q.name])),
            "preemptions": preempted_by_queue.get(q.name, 0),
        })
        if engine.pooled:
            pool_seconds = {p: engine._roll_up({lq: v for (pp, lq), v in engine.pool_gpu_seconds.items() if pp == p})
                            for p in engine.pools}
            queues[-1]["pools"] = {p: {
                "deserved_gpu": _r(q.in_pool(p).deserved.get("gpu", 0.0)),
                "mean_allocated_gpu": _r(per_time(pool_seconds[p][q.name])),
                "mean_fair_share_gpu": _r(per_time(engine.pool_fair_integral.get((p, q.name), 0.0))),
            } for p in engine.pools}

    workloads = []
    for s in sims:
        item = {
            "name": s.name, "queue": s.w.queue, "kind": s.w.kind, "user": s.w.user,
            "submitted": _r(s.w.submit_time), "started": _r(s.first_start), "finished": _r(s.finished_at),
            "preemptions": s.preemptions, "lost_seconds": _r(s.lost_seconds),
            "placements": [{**p, "t": _r(p["t"]), "fraction": round(float(p["fraction"]), 6)}
                           for p in s.placements_log],
        }
        if s.rejected is not None:
            item["rejected"] = s.rejected
        elif s.finished_at is None:
            item["state"] = s.state
            if s.state == "pending":
                item["pending_reason"] = None if s.pending is None else str(s.pending)
                item["pending_code"] = None if s.pending is None else s.pending.code.value
                if s.position is not None:
                    item["position"] = s.position
        workloads.append(item)

    events = []
    for e in engine.events:
        ev = {k: (_r(v) if isinstance(v, float) else v) for k, v in e.items()}
        events.append(ev)

    report = {
        "scenario": sc.name,
        "seed": engine.seed,
        "config": asdict(sc.config),
        "metrics": {
            "makespan": _r(makespan),
            "gpu_capacity": capacity,
            "gpu_allocated_seconds": _r(allocated_seconds),
            "gpu_available_seconds": _r(available),
            "gpu_utilization": _r(allocated_seconds / available, 4) if available > 0 else 0.0,
            "preemptions": sum(s.preemptions for s in sims),
            "preemptions_by_reason": dict(sorted(engine.cause_counts.items())),
            "lost_gpu_seconds": _r(engine.lost_gpu_seconds),
            "lost_gpu_seconds_by_reason": {k: _r(v) for k, v in sorted(engine.cause_lost.items())},
            "scheduling_cycles": engine.cycles,
            "wait": wait,
            "workloads": len(sims),
            "finished": sum(1 for s in sims if s.finished_at is not None),
            "rejected": sum(1 for s in sims if s.rejected is not None),
            "end": engine.end_reason,
            "invariant_violations": len(engine.violations),
        },
        "queues": queues,
        "workloads": workloads,
        "events": events,
    }
    if sc.events:
        report["node_events"] = [{**e, "t": _r(e["t"])} for e in engine.node_log]
    if engine.violations:
        report["violations"] = engine.violations[:100]
    if timeline:
        report["timeline"] = engine.timeline
    timing = {"wall_seconds": round(wall_seconds, 3), "cycle_ms": _timing_stats(engine.cycle_ms)}
    if engine.actions_ms:
        timing["actions_ms"] = {a: _timing_stats(v) for a, v in sorted(engine.actions_ms.items())}
    report["timing"] = timing
    return report


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=False)


# -- human summary ------------------------------------------------------------------------------
def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 60:
        return f"{s:.0f}s" if s == int(s) else f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return [fmt(headers), *(fmt(r) for r in rows)]


def format_summary(report: dict) -> str:
    m = report["metrics"]
    lines = [
        f"Scenario {report['scenario']} (seed {report['seed']}): {m['workloads']} workloads, "
        f"{m['finished']} finished, {m['rejected']} rejected; ended: {m['end']}",
        f"Makespan {_dur(m['makespan'])}   GPUs {m['gpu_capacity']}   utilization {100 * m['gpu_utilization']:.1f}%   "
        f"preemptions {m['preemptions']}   lost {m['lost_gpu_seconds'] / 3600:.2f} GPU-h   "
        f"cycles {m['scheduling_cycles']}",
        "",
    ]
    depth: dict[str, int] = {}
    for q in report["queues"]:
        depth[q["name"]] = depth[q["parent"]] + 1 if q["parent"] else 0
    rows = [["  " * depth[q["name"]] + q["name"], f"{q['deserved_gpu']:g}",
             "-" if q["limit_gpu"] is None else f"{q['limit_gpu']:g}",
             f"{q['mean_fair_share_gpu']:.2f}", f"{q['mean_allocated_gpu']:.2f}",
             f"{q['gpu_seconds'] / 3600:.2f}", str(q["preemptions"])] for q in report["queues"]]
    lines += _table(["queue", "deserved", "limit", "mean fair share", "mean allocated", "GPU-h", "preempted"], rows)
    lines.append("")
    if any("pools" in q for q in report["queues"]):  # node pools: the same per pool
        rows = [["  " * depth[q["name"]] + q["name"], pool, f"{p['deserved_gpu']:g}", f"{p['mean_fair_share_gpu']:.2f}",
                 f"{p['mean_allocated_gpu']:.2f}"] for q in report["queues"] for pool, p in q["pools"].items()]
        lines += ["Per node pool (the table above: deserved is the quota in pool default):"]
        lines += _table(["queue", "pool", "deserved", "mean fair share", "mean allocated"], rows)
        lines.append("")
    rows = [[kind, str(w["count"]), _dur(w["mean"]), _dur(w["p50"]), _dur(w["p95"]), str(w["never_started"])]
            for kind, w in m["wait"].items()]
    if rows:
        lines += _table(["wait", "started", "mean", "p50", "p95", "never started"], rows)
        lines.append("")
    nodes = report.get("node_events", [])
    if nodes:
        lines.append(f"Node events ({len(nodes)}):")
        for e in nodes[:20]:
            hit = f": stopped {', '.join(e['workloads'])}" if e["action"] == "fail" and e["workloads"] else (
                f": asked {', '.join(e['workloads'])} to checkpoint and stop" if e["workloads"] else "")
            lines.append(f"  {_dur(e['t']):>8}  {e['node']} {e['action']}{hit}")
        if len(nodes) > 20:
            lines.append(f"  ... and {len(nodes) - 20} more (see --json)")
        avail = m["gpu_available_seconds"] / m["makespan"] if m["makespan"] else 0
        lines.append(f"  GPUs in service: {avail:.2f} on average of {m['gpu_capacity']}")
        lines.append("")
    pre = [e for e in report["events"] if e["type"] == "preempt"]
    if pre:
        lines.append(f"Preemptions ({len(pre)}):")
        for e in pre[:20]:
            by = f" for {e['by']}" if e.get("by") else f" of {e['node']}" if e.get("node") else ""
            lines.append(f"  {_dur(e['t']):>8}  {e['workload']}: {e['reason']}{by}, lost {_dur(e.get('lost_seconds', 0))}")
        if len(pre) > 20:
            lines.append(f"  ... and {len(pre) - 20} more (see --json)")
        lines.append("")
    odd = [w for w in report["workloads"] if w.get("rejected") or w.get("pending_reason") or
           (w["finished"] is None and w.get("state"))]
    if odd:
        lines.append("Did not finish:")
        for w in odd[:20]:
            why = w.get("rejected") and f"rejected: {w['rejected']}" or w.get("pending_reason") or w.get("state", "")
            lines.append(f"  {w['name']} ({w['queue']}): {why}")
        if len(odd) > 20:
            lines.append(f"  ... and {len(odd) - 20} more (see --json)")
        lines.append("")
    if report.get("violations"):
        lines.append(f"SCHEDULER BROKE ITS PROMISES {m['invariant_violations']} times (a bug; please report it):")
        lines += [f"  {v}" for v in report["violations"][:10]]
        lines.append("")
    c = report["timing"]["cycle_ms"]
    lines.append(f"Scheduler decision time per cycle: p50 {c['p50']:.2f} ms, p95 {c['p95']:.2f} ms, max {c['max']:.2f} ms "
                 f"(replay took {report['timing']['wall_seconds']:.2f} s)")
    return "\n".join(lines)
