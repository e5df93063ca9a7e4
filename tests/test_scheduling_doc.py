"""Every `example:` block of docs/scheduling.md runs here, so the promises and the code agree."""
import re
from pathlib import Path

import pytest
import yaml

from gpupool.scheduler import (Phase, PodPlacement, Scheduler, SchedulerConfig, Snapshot, parse_nodes,
                               parse_queues, parse_workload)
from gpupool.scheduler.fairshare import QueueTree, fair_shares

DOC = Path(__file__).resolve().parents[1] / "docs" / "scheduling.md"
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
    return Snapshot(ex.get("now", 0), nodes, queues, workloads)


@pytest.mark.parametrize("ex", examples())
def test_example(ex):
    if ex.get("kind", "fair_share") == "fair_share":
        tree = QueueTree(parse_queues(ex["queues"]))
        got = fair_shares(tree, ex["demand"], ex["capacity"], resources=list(ex["capacity"]))
        for q, want in ex["expect_fair_share"].items():
            for res, v in want.items():
                assert got[q][res] == pytest.approx(v, abs=1e-3), (q, res, got[q])
        return
    result = Scheduler(SchedulerConfig()).schedule(build_snapshot(ex))
    expect = ex["expect"]
    if "binds" in expect:
        assert sorted(b.workload for b in result.binds) == sorted(expect["binds"])
    if "evictions" in expect:
        assert {e.workload: e.cause for e in result.evictions} == expect["evictions"]
    for wid, text in expect.get("pending_reason", {}).items():
        assert text in str(result.pending[wid]), str(result.pending[wid])
    for b in result.binds:
        assert b.reason
