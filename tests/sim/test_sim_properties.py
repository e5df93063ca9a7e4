"""Properties of the real scheduler over random small scenarios, replayed by the simulator.

At every cycle the engine checks the placements themselves (Engine.check_invariants): no GPU
above 1000 milli-GPU, every gang whole, no queue above its limit, no queue's non-preemptible
workloads above its deserved quota. On top: determinism, and reclaim liveness (a queue below its
deserved quota with pending work gets it back within the grace period and a few cycles)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.sim import parse_scenario, simulate
from gpupool.sim.engine import Engine

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def scenarios(draw):
    racks = draw(st.booleans())
    groups = draw(st.integers(1, 3))
    nodes = []
    for i in range(groups):
        node = {"name": f"g{i}", "count": draw(st.integers(1, 2)), "gpus": draw(st.sampled_from([1, 2, 4, 8])),
                "gpu_memory": "40Gi", "gpu_model": draw(st.sampled_from(["A100", "H100"]))}
        if racks:
            node["labels"] = {"rack": f"r{i % 2}"}
        nodes.append(node)
    capacity = sum(n["count"] * n["gpus"] for n in nodes)

    queues = []
    left = capacity
    if draw(st.booleans()):  # a department with two projects
        dept = draw(st.integers(0, min(left, 6)))
        a = draw(st.integers(0, dept))
        b = draw(st.integers(0, dept - a))
        queues += [{"name": "dept", "deserved": {"gpu": dept}},
                   {"name": "p1", "parent": "dept", "deserved": {"gpu": a}},
                   {"name": "p2", "parent": "dept", "deserved": {"gpu": b}}]
        left -= dept
    for i in range(draw(st.integers(1, 2))):
        d = draw(st.integers(0, max(0, min(left, 4))))
        left -= d
        q = {"name": f"q{i}", "deserved": {"gpu": d}, "over_quota_weight": draw(st.sampled_from([1, 2]))}
        if draw(st.booleans()):
            q["limit"] = {"gpu": d + draw(st.integers(0, 4))}
        queues.append(q)
    parents = {q.get("parent") for q in queues}
    leaves = [q["name"] for q in queues if q["name"] not in parents]

    workloads = []
    for i in range(draw(st.integers(1, 10))):
        w = {"name": f"w{i}", "queue": draw(st.sampled_from(leaves)),
             "kind": draw(st.sampled_from(["train", "train", "hpo-trial", "interactive", "inference"])),
             "submit_at": draw(st.integers(0, 30)) * 10, "duration": draw(st.integers(5, 60)) * 10}
        if draw(st.integers(0, 4)) == 0:
            w["gpu_memory"] = draw(st.sampled_from(["10Gi", "20Gi"]))
        else:
            w["gpus"] = draw(st.sampled_from([0.25, 0.5, 1, 1, 2, 4]))
        if w.get("gpus", 0) >= 1 and draw(st.integers(0, 3)) == 0:
            w["pods"] = 2
        if draw(st.booleans()):
            w["checkpoint_every"] = draw(st.sampled_from([30, 100]))
        w["checkpoint_on_signal"] = draw(st.booleans())
        if draw(st.integers(0, 3)) == 0:
            w["priority"] = draw(st.integers(0, 100))
        if draw(st.integers(0, 5)) == 0:
            w["node_selector"] = {"gpu_model": draw(st.sampled_from(["A100", "H100"]))}
        workloads.append(w)
    config = {"cycle": draw(st.sampled_from([1, 5, 10])), "preemption_grace": draw(st.sampled_from([0, 10, 30])),
              "min_runtime": draw(st.sampled_from([0, 0, 60])), "until": 4000}
    return {"name": "random", "config": config, "cluster": {"nodes": nodes}, "queues": queues,
            "workloads": workloads}


@SETTINGS
@given(scenarios(), st.integers(0, 3))
def test_invariants_hold_at_every_cycle(data, seed):
    sc = parse_scenario(data)
    seen = []
    report = simulate(sc, seed=seed, on_cycle=lambda eng, rec: seen.append(rec.t))
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    assert seen == sorted(seen) and len(seen) == report["metrics"]["scheduling_cycles"]
    times = [e["t"] for e in report["events"]]
    assert times == sorted(times)
    for w in report["workloads"]:
        if w["finished"] is None and not w.get("rejected") and w.get("state") == "pending":
            assert w.get("pending_reason"), w["name"]  # every waiting workload says why
        if w["finished"] is not None:
            assert w["started"] is not None and w["finished"] >= w["started"] >= w["submitted"]
        pods = next(x for x in data["workloads"] if x["name"] == w["name"]).get("pods", 1)
        by_start: dict = {}
        for p in w["placements"]:
            by_start.setdefault(p["t"], []).append(p["pod"])
        assert all(sorted(v) == list(range(pods)) for v in by_start.values())  # gangs start whole


@SETTINGS
@given(scenarios(), st.integers(0, 3))
def test_same_scenario_and_seed_same_report(data, seed):
    a = simulate(parse_scenario(data), seed=seed, timeline=True)
    b = simulate(parse_scenario(data), seed=seed, timeline=True)
    a.pop("timing"), b.pop("timing")
    assert a == b


@st.composite
def reclaim_scenarios(draw):
    """Borrowers fill the cluster with long 1-GPU jobs; at time T the owner queue (below its
    deserved quota) submits k <= deserved jobs."""
    nodes = draw(st.integers(1, 3))
    capacity = nodes * 4
    owner = draw(st.integers(1, capacity - 1))
    borrowers = draw(st.integers(1, 2))
    queues = [{"name": "owner", "deserved": {"gpu": owner}}]
    left = capacity - owner
    workloads = []
    for b in range(borrowers):
        d = draw(st.integers(0, left))
        left -= d
        queues.append({"name": f"b{b}", "deserved": {"gpu": d}, "over_quota_weight": draw(st.sampled_from([1, 2]))})
        w = {"name": f"b{b}-job", "queue": f"b{b}", "count": capacity, "gpus": 1, "duration": 100000,
             "kind": draw(st.sampled_from(["train", "hpo-trial"]))}
        ce = draw(st.sampled_from([None, 60, 300]))
        if ce:
            w["checkpoint_every"] = ce
        w["checkpoint_on_signal"] = draw(st.booleans())
        workloads.append(w)
    k = draw(st.integers(1, owner))
    t = draw(st.integers(5, 50)) * 10
    workloads.append({"name": "own", "queue": "owner", "count": k, "gpus": 1, "duration": 5000, "submit_at": t})
    cycle = draw(st.sampled_from([1, 5, 10]))
    grace = draw(st.sampled_from([0, 10, 30, 60]))
    config = {"cycle": cycle, "preemption_grace": grace, "until": t + grace + 10 * cycle + 100}
    return {"config": config, "cluster": {"nodes": [{"name": "n", "count": nodes, "gpus": 4}]},
            "queues": queues, "workloads": workloads}, k, t


@SETTINGS
@given(reclaim_scenarios(), st.integers(0, 3))
def test_owner_below_deserved_reclaims_within_grace_and_a_few_cycles(case, seed):
    data, k, submit = case
    sc = parse_scenario(data)
    cfg = sc.config
    deadline = submit + cfg.cycle + cfg.preemption_grace + 3 * cfg.cycle  # next cycle, grace, a few cycles
    borrowed_at_submit = []

    def watch(engine: Engine, rec) -> None:
        if not borrowed_at_submit and rec.t >= submit:
            alloc = engine.allocated_by_queue()
            borrowed_at_submit.append(sum(max(0.0, alloc[q.name] - q.deserved.get("gpu", 0)) for q in sc.queues))

    report = simulate(sc, seed=seed, on_cycle=watch)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    assert borrowed_at_submit and borrowed_at_submit[0] > 0  # the borrowers do borrow
    starts = [w["started"] for w in report["workloads"] if w["queue"] == "owner"]
    assert len(starts) == k
    assert all(s is not None and s <= deadline for s in starts), (starts, deadline)
    assert {e["reason"] for e in report["events"] if e["type"] == "preempt"} <= {"reclaim"}
