"""Every `example:` block of docs/scheduling.md runs here, so the promises and the code agree."""
import re
from pathlib import Path

import pytest
import yaml

from gpupool.scheduler import (Phase, PodPlacement, Scheduler, SchedulerConfig, Snapshot, parse_nodes,
                               parse_queues, parse_workload)
from gpupool.scheduler.fairshare import QueueTree, fair_shares, guarantees

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def examples():
    out = []
    for text in BLOCK.findall(DOC.read_text()):
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "example" in data:
            out.append(pytest.param(data, id=data["example"]))
    return out


def test_doc_has_examples():
    kinds = [p.values[0].get("kind", "fair_share") for p in examples()]
    assert kinds.count("fair_share") >= 5 and kinds.count("cycle") >= 3


RUN_FIELDS = ("started_at", "last_checkpoint_at", "node", "gpu_ids")


def build_snapshot(ex):
    queues = parse_queues(ex["queues"])
    nodes = parse_nodes(ex["nodes"])
    qmap = {q.name: q for q in queues}
    workloads = []
    for i, e in enumerate(ex.get("running", [])):
        w = parse_workload({k: v for k, v in e.items() if k not in RUN_FIELDS}, f"running[{i}]", qmap)
        w.phase = Phase.RUNNING
        w.started_at = e["started_at"]
        w.last_checkpoint_at = e.get("last_checkpoint_at")
        frac = w.gpus if w.gpus < 1 else 1.0
        w.placements = (PodPlacement(0, e["node"], tuple(e["gpu_ids"]), frac),)
        workloads.append(w)
    for i, e in enumerate(ex.get("pending", [])):
        workloads.append(parse_workload(e, f"pending[{i}]", qmap))
    return Snapshot(ex.get("now", 0), nodes, queues, workloads, usage=ex.get("usage_by_pool", {}))


def check(result, expect: dict) -> None:
    if "binds" in expect:
        assert sorted(b.workload for b in result.binds) == sorted(expect["binds"])
    if "evictions" in expect:
        assert {e.workload: e.cause for e in result.evictions} == expect["evictions"]
    for wid, text in expect.get("pending_reason", {}).items():
        assert text in str(result.pending[wid]), str(result.pending[wid])
    for wid, code in expect.get("reason_code", {}).items():
        assert result.pending[wid].code.value == code, str(result.pending[wid])
    for wid, text in expect.get("dropped", {}).items():  # reservations dropped, with their reasons
        assert text in result.dropped.get(wid, ""), result.dropped
    bound = {b.workload: b for b in result.binds}
    for wid, gpus in expect.get("gpus", {}).items():  # per pod: [node, [gpu ids]]
        assert [[p.node, list(p.gpus)] for p in bound[wid].placements] == gpus, bound[wid].placements
    for b in result.binds:
        assert b.reason


def carry_out(snap: Snapshot, result) -> None:
    """The adapter's part between two cycles: binds run, evictions start releasing."""
    by = {w.id: w for w in snap.workloads}
    for e in result.evictions:
        by[e.workload].phase = Phase.RELEASING
    for b in result.binds:
        w = by[b.workload]
        w.phase, w.placements, w.started_at = Phase.RUNNING, b.placements, snap.now
    snap.reservations = result.reservations


@pytest.mark.parametrize("ex", examples())
def test_example(ex):
    if ex.get("kind", "fair_share") == "fair_share":
        tree = QueueTree(parse_queues(ex["queues"]))
        got = fair_shares(tree, ex["demand"], ex["capacity"], resources=list(ex["capacity"]),
                          usage=ex.get("usage"), k=ex.get("k", 0.0))
        for q, want in ex["expect_fair_share"].items():
            for res, v in want.items():
                assert got[q][res] == pytest.approx(v, abs=1e-3), (q, res, got[q])
        if "expect_guarantee" in ex:
            g = guarantees(tree, ex["demand"], ex["capacity"]["gpu"])
            assert {q: round(g[q], 3) for q in ex["expect_guarantee"]} == ex["expect_guarantee"]
        return
    sched = Scheduler(SchedulerConfig(**ex.get("config", {})))
    snap = build_snapshot(ex)
    result = sched.schedule(snap)
    check(result, ex["expect"])
    qmap = {q.name: q for q in snap.queues}
    for i, step in enumerate(ex.get("then", [])):  # later cycles: releases, arrivals, new quotas
        carry_out(snap, result)
        if "queues" in step:  # an admin's edit, the service restarted with it
            snap.queues = parse_queues(step["queues"])
            qmap = {q.name: q for q in snap.queues}
        by = {w.id: w for w in snap.workloads}
        for name in step.get("released", []):
            w = by[name]
            w.phase, w.placements, w.started_at = Phase.PENDING, (), None
        for j, e in enumerate(step.get("submit", [])):
            snap.workloads.append(parse_workload(e, f"then[{i}].submit[{j}]", qmap))
        snap.now = step["now"]
        result = sched.schedule(snap)
        check(result, step["expect"])
