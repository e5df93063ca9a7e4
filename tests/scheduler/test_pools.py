"""Node pools: each pool divided by its own quotas, reclaims that never cross pools, preferences
and fallbacks, a department's per-pool bound, the per-pool report and timeline, the reasons, and
the same decisions as before for a cluster that is one pool."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpupool.scheduler import Scheduler
from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Snapshot, Workload
from gpupool.scheduler.reasons import Code
from gpupool.scheduler.spec import SpecError, over_committed, parse_queues
from gpupool.sim import parse_scenario, simulate

from sim_harness import data, replay, run_cli, without_timing, write

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def nodes_of(report: dict, name: str) -> set[str]:
    w = next(w for w in report["workloads"] if w["name"] == name)
    return {p["node"] for p in w["placements"]}


def pool_alloc(report: dict, pool: str, queue: str, t: float) -> float:
    return [c for c in report["timeline"] if c["t"] <= t][-1]["pools"][pool][queue]["allocated_gpu"]


def test_the_spec_example_runs_as_written_and_starts_in_the_preferred_pool(tmp_path):
    """The format's own example (no durations: t1 runs until the replay ends) through the command."""
    proc = run_cli(str(SCENARIOS / "pools_spec_example.yaml"), "--json", "--timeline")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    t1 = report["workloads"][0]
    assert t1["started"] == 0 and {p["node"] for p in t1["placements"]} <= {"h-0", "h-1"}
    vision = report["queues"][0]
    assert set(vision["pools"]) == {"h100", "a100"}
    assert vision["pools"]["h100"]["deserved_gpu"] == 4 and vision["pools"]["a100"]["deserved_gpu"] == 8
    first = report["timeline"][0]
    assert first["pools"]["h100"]["vision"]["allocated_gpu"] == 2
    assert first["pools"]["a100"]["vision"]["allocated_gpu"] == 0


def test_a_reclaim_never_takes_gpus_in_another_pool():
    report = replay(data("pools_reclaim_stays_in_its_pool"))
    pre = [e for e in report["events"] if e["type"] == "preempt"]
    assert pre, "nlp had to reclaim its H100s"
    for e in pre:
        assert e["reason"] == "reclaim" and "node pool h100" in e["detail"]
        assert nodes_of(report, e["workload"]) & {"h-0", "h-1"}
    # vision keeps its A100s the whole time; nlp holds its 8 H100s once the grace period is over
    for c in report["timeline"]:
        if 5 <= c["t"] < 2000:  # until its jobs there finish
            assert c["pools"]["a100"]["vision"]["allocated_gpu"] == 8
    assert pool_alloc(report, "h100", "nlp", 100 + 20 + 10) == 8
    assert all(nodes_of(report, f"n-{i}") <= {"h-0", "h-1"} for i in range(4))
    q = {x["name"]: x for x in report["queues"]}
    assert q["vision"]["pools"]["a100"]["mean_allocated_gpu"] == pytest.approx(8 * 2000 / 2520, abs=1e-3)
    assert q["nlp"]["pools"]["a100"]["mean_allocated_gpu"] == 0


def test_a_department_quota_in_a_pool_bounds_its_projects_there():
    report = replay(data("pools_department_bound"))
    at = report["timeline"][0]
    assert at["pools"]["h100"]["research"]["allocated_gpu"] == 4  # its limit in h100
    assert at["pools"]["a100"]["research"]["allocated_gpu"] == 8  # the rest borrowed in a100
    assert sum(1 for w in report["workloads"] if w["started"] == 0) == 12


def test_a_workload_falls_back_to_its_next_pool_when_the_first_is_full():
    d = data("pools_reclaim_stays_in_its_pool")
    d["workloads"] = [
        {"name": "n", "queue": "nlp", "gpus": 4, "count": 2, "duration": 1000, "pools": ["h100"]},
        {"name": "x", "queue": "nlp", "gpus": 2, "duration": 100, "pools": ["h100", "a100"], "submit_at": 5},
    ]
    report = replay(d)
    x = next(w for w in report["workloads"] if w["name"] == "x")
    assert x["started"] == 5 and nodes_of(report, "x") <= {"a-0", "a-1"}
    assert "node pool a100" in next(e for e in report["events"] if e["workload"] == "x")["reason"]


def test_without_a_preference_a_workload_goes_where_its_queue_has_deserved_quota_free():
    d = data("pools_reclaim_stays_in_its_pool")
    d["workloads"] = [{"name": "v", "queue": "vision", "gpus": 1, "duration": 100},
                      {"name": "n", "queue": "nlp", "gpus": 1, "duration": 100}]
    report = replay(d)
    assert nodes_of(report, "v") <= {"a-0", "a-1"} and nodes_of(report, "n") <= {"h-0", "h-1"}


def test_a_pool_named_by_no_node_is_refused_with_the_reason():
    d = data("pools_reclaim_stays_in_its_pool")
    d["workloads"] = [{"name": "t", "queue": "nlp", "gpus": 1, "duration": 10, "pools": ["t4"]}]
    report = replay(d)
    assert report["workloads"][0]["rejected"] == "no node in node pool t4"


def _snap(workloads, queues=None, nodes=None, reservations=()):
    nodes = nodes or [NodeSpec("h", 4, pool="h100"), NodeSpec("a", 4, pool="a100")]
    queues = queues or [QueueSpec("vision", pools={})]
    return Snapshot(now=100.0, nodes=nodes, queues=queues, workloads=workloads, reservations=list(reservations))


def test_the_core_gives_typed_reasons_for_pools():
    """No node in its pools; no quota in any pool it may use for a non-preemptible workload; and a
    capacity wait that names the pool it waits in."""
    from gpupool.scheduler.model import PoolQuota

    queues = [QueueSpec("vision", pools={"h100": PoolQuota(deserved={"gpu": 2})})]
    ws = [Workload("ghost", "vision", gpus=1, pools=("t4",)),
          Workload("nb", "vision", kind="interactive", gpus=1, pools=("a100",)),
          Workload("big", "vision", gpus=4, pools=("h100",),),
          Workload("run", "vision", gpus=2, phase=Phase.RUNNING, placements=(PodPlacement(0, "h", (0, 1)),),
                   started_at=0.0, preemptible=False)]
    res = Scheduler().schedule(_snap(ws, queues))
    assert res.pending["ghost"].code is Code.NO_POOL and "no node in node pool t4" in str(res.pending["ghost"])
    assert res.pending["nb"].code is Code.NO_POOL_QUOTA
    assert "node pool a100" in str(res.pending["nb"])
    assert res.pending["big"].detail["pool"] == "h100" and str(res.pending["big"]).endswith("(node pool h100)")
    assert res.pool_allocated["h100"]["vision"]["gpu"] == 2 and res.allocated["vision"]["gpu"] == 2
    assert res.pool_fair_share["h100"]["vision"]["gpu"] >= 2


def _into_one_pool(d: dict, pool: str) -> dict:
    """The same scenario as one node pool named ``pool``, with each queue's quota moved there."""
    d = copy.deepcopy(d)
    for n in d["cluster"]["nodes"]:
        n["pool"] = pool
    for q in d["queues"]:
        quota = {k: q.pop(k) for k in ("deserved", "limit", "over_quota_weight") if k in q}
        q["pools"] = {pool: quota}
    return d


@pytest.mark.parametrize("name", ["reclaim", "hierarchy", "consolidation", "priority", "gang_rack", "fractions",
                                  "borrow_weights", "limit", "nonpreemptible", "node_fail_return"])
def test_one_pool_of_another_name_decides_exactly_as_the_plain_cluster(name):
    """A cluster that is one pool, with the quotas given per pool, goes through the pooled cycle
    and must decide exactly what the plain cycle decides."""
    plain = simulate(parse_scenario(data(name)), seed=1)
    pooled = simulate(parse_scenario(_into_one_pool(data(name), "gpu")), seed=1)
    strip = lambda r: [{k: v for k, v in e.items() if k not in ("reason", "detail")} for e in r["events"]]  # noqa: E731
    assert strip(pooled) == strip(plain)
    assert [q["gpu_seconds"] for q in pooled["queues"]] == [q["gpu_seconds"] for q in plain["queues"]]


def test_pool_fields_are_validated_naming_the_field(tmp_path):
    bad = [
        ({"cluster": {"nodes": [{"name": "a", "gpus": 1, "pool": ""}]}}, "cluster.nodes[0].pool"),
        ({"queues": [{"name": "q", "pools": {"h100": {"deserved": {"gpu": 4}, "limit": {"gpu": 2}}}}]},
         "queues[0].pools.h100.limit.gpu: limit 2 is below deserved 4"),
        ({"queues": [{"name": "q", "pools": {"h100": {"weight": 2}}}]}, "queues[0].pools.h100.weight: unknown field"),
        ({"workloads": [{"name": "w", "queue": "q", "gpus": 1, "duration": 1, "pools": ["a", "a"]}]},
         "workloads[0].pools: lists a pool twice"),
    ]
    for patch, message in bad:
        d = {"cluster": {"nodes": [{"name": "a", "gpus": 1}]}, "queues": [{"name": "q"}],
             "workloads": [{"name": "w", "queue": "q", "gpus": 1, "duration": 1}]}
        d.update(patch)
        with pytest.raises(SpecError) as err:
            parse_scenario(d)
        assert message in str(err.value)
        proc = run_cli(str(write(tmp_path, d)))
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_over_committed_quotas_are_reported_per_pool():
    queues = parse_queues([{"name": "d", "pools": {"h100": {"deserved": {"gpu": 2}}}},
                           {"name": "a", "parent": "d", "pools": {"h100": {"deserved": {"gpu": 2}}}},
                           {"name": "b", "parent": "d", "pools": {"h100": {"deserved": {"gpu": 1}}}}])
    assert over_committed(queues) == ["in node pool h100: the children of 'd' deserve 3 gpu in all, more than its 2"]


def test_the_summary_has_a_table_per_node_pool():
    proc = run_cli(str(SCENARIOS / "pools_reclaim_stays_in_its_pool.yaml"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Per node pool" in out
    rows = [line.split() for line in out[out.index("Per node pool"):].splitlines()[2:6]]
    assert ["nlp", "h100", "8"] == rows[3][:3] and ["vision", "a100", "8"] == rows[0][:3]


def test_pooled_reports_are_deterministic():
    d = data("pools_reclaim_stays_in_its_pool")
    a = without_timing(simulate(parse_scenario(d), seed=3, timeline=True))
    b = without_timing(simulate(parse_scenario(d), seed=3, timeline=True))
    assert a == b
