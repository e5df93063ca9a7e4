"""Fairness over time: the usage history (scheduler/usage.py), the division it adjusts
(scheduler/fairshare.py), and replays: queues taking turns, deserved quotas untouched, k = 0,
tumbling windows, the reason that names past usage, and the fields refused with their names."""
from __future__ import annotations

import copy
import math

import pytest

from gpupool.scheduler import Scheduler
from gpupool.scheduler.fairshare import QueueTree, fair_shares
from gpupool.scheduler.model import NodeSpec, PoolQuota, QueueSpec, SchedulerConfig, Snapshot, Workload
from gpupool.scheduler.usage import FairnessConfig, UsageHistory
from gpupool.sim import parse_scenario, simulate

from sim_harness import data, replay, run_cli, write


# -- the usage history ---------------------------------------------------------------------------
def test_usage_without_decay_is_the_share_of_the_windows_capacity():
    h = UsageHistory(FairnessConfig(window=100, k=1))
    h.record(0, 50, {("p", "a"): 8}, {"p": 8})  # a held the whole pool for 50 s
    got = h.normalised(50)
    assert got[("p", "a")] == pytest.approx(0.5)  # of the window's 100 s x 8 GPUs (the first 50 s idle)
    h.record(50, 100, {("p", "b"): 4}, {"p": 8})
    got = h.normalised(100)
    assert got[("p", "a")] == pytest.approx(0.5) and got[("p", "b")] == pytest.approx(0.25)
    h.record(100, 160, {("p", "b"): 4}, {"p": 8})  # a's record left the sliding window
    got = h.normalised(160)
    assert ("p", "a") not in got and got[("p", "b")] == pytest.approx(0.5, abs=0.1)


def test_usage_decays_with_its_half_life():
    h = UsageHistory(FairnessConfig(window=10_000, half_life=100, k=1))
    h.record(0, 1, {("p", "old"): 1}, {"p": 1})
    h.record(1, 101, {}, {"p": 1})
    h.record(101, 102, {("p", "new"): 1}, {"p": 1})
    got = h.normalised(102)
    assert got[("p", "old")] / got[("p", "new")] == pytest.approx(0.5, rel=0.02)  # 100 s older: half


def test_a_tumbling_window_resets_at_its_start():
    h = UsageHistory(FairnessConfig(window=100, window_type="tumbling", k=1))
    h.record(0, 90, {("p", "a"): 2}, {"p": 2})
    assert h.normalised(90)[("p", "a")] == pytest.approx(1.0)  # the elapsed part of the window
    h.record(90, 110, {("p", "b"): 2}, {"p": 2})
    got = h.normalised(110)
    assert ("p", "a") not in got and got[("p", "b")] == pytest.approx(1.0)  # only [100, 110] counts


def test_fairness_config_refuses_nonsense():
    for bad in ({"window": 0}, {"window_type": "cron"}, {"half_life": -1}, {"k": -1}):
        with pytest.raises(ValueError):
            FairnessConfig(**bad)


# -- the division ----------------------------------------------------------------------------------
def test_past_usage_moves_only_the_share_beyond_deserved_quotas():
    tree = QueueTree([QueueSpec("a", deserved={"gpu": 4}), QueueSpec("b", deserved={"gpu": 4}), QueueSpec("c")])
    demand = {q: {"gpu": 100.0} for q in "abc"}
    plain = fair_shares(tree, demand, {"gpu": 16.0}, ("gpu",))
    assert [plain[q]["gpu"] for q in "abc"] == pytest.approx([20 / 3, 20 / 3, 8 / 3])
    moved = fair_shares(tree, demand, {"gpu": 16.0}, ("gpu",), usage={"a": 0.6, "b": 0.0, "c": 0.0}, k=1.0)
    assert moved["a"]["gpu"] >= 4 and moved["a"]["gpu"] < plain["a"]["gpu"]  # never below deserved
    assert moved["b"]["gpu"] > plain["b"]["gpu"] and moved["c"]["gpu"] > plain["c"]["gpu"]
    assert sum(moved[q]["gpu"] for q in "abc") == pytest.approx(16)
    # KAI's formula for the three over-quota weights of 1/3: max(0, w + k (w - u))
    wa, wb = max(0, 1 / 3 + (1 / 3 - 0.6)), 1 / 3 + 1 / 3
    assert (moved["a"]["gpu"] - 4) / (moved["b"]["gpu"] - 4) == pytest.approx(wa / wb)
    assert fair_shares(tree, demand, {"gpu": 16.0}, ("gpu",), usage={"a": 0.6}, k=0.0) == plain


# -- replays ---------------------------------------------------------------------------------------
def test_two_queues_take_turns_and_end_with_equal_gpu_seconds():
    report = replay(data("fairness_turns"))
    gs = {q["name"]: q["gpu_seconds"] for q in report["queues"]}
    window = 3600
    assert abs(gs["a"] - gs["b"]) <= 16 * window  # within one window of each other
    starts = [e for e in report["events"] if e["type"] in ("start", "resume")]
    assert len(starts) >= 6 and len({e["workload"][:2] for e in starts}) == 2
    # the queue that waits is told why: its share was lowered by its past usage
    codes = {c["queues"]["a"].get("usage", 0) > 0 for c in report["timeline"]}
    assert codes == {True, False}


def test_with_k_zero_past_usage_changes_nothing():
    d = copy.deepcopy(data("fairness_turns"))
    plain = copy.deepcopy(d)
    d["config"]["fairness"]["k"] = 0
    del plain["config"]["fairness"]
    a = simulate(parse_scenario(d), seed=0)
    b = simulate(parse_scenario(plain), seed=0)
    assert a["metrics"]["preemptions"] == 0 and a["events"] == b["events"]


def test_past_usage_never_lowers_a_deserved_quota():
    report = replay(data("fairness_deserved_holds"))
    for c in report["timeline"]:
        if c["t"] >= 3600:
            assert c["queues"]["a"]["fair_share_gpu"] >= 8 - 1e-6
            assert c["queues"]["a"]["allocated_gpu"] >= 8  # and a keeps them
    soon = [c for c in report["timeline"] if 3600 + 60 <= c["t"] <= 3600 + 300]
    assert soon and all(c["queues"]["b"]["allocated_gpu"] == 8 for c in soon)  # b took all a had lent


def test_a_waiting_workload_is_told_that_past_usage_lowered_its_share():
    d = copy.deepcopy(data("fairness_turns"))
    d["config"]["until"] = 2000
    report = simulate(parse_scenario(d), seed=0)
    waiting = [w for w in report["workloads"] if w.get("pending_code")]
    codes = {w["pending_code"] for w in waiting}
    assert "fair-share-lowered-by-usage" in codes
    w = next(w for w in waiting if w["pending_code"] == "fair-share-lowered-by-usage")
    assert "lowered from" in w["pending_reason"] and "past usage" in w["pending_reason"]


def test_the_cycle_result_says_the_share_a_queue_would_have_without_its_past_usage():
    """Two queues deserving 2 GPUs each of 8, both wanting all 8: past usage moves only the 4
    borrowed; ``fair_share_plain`` is the share before it moved, summed over node pools."""
    queues = [QueueSpec("a", deserved={"gpu": 2}), QueueSpec("b", deserved={"gpu": 2})]
    want = [Workload(f"{q}{i}", q, gpus=1, submit_time=i) for q in "ab" for i in range(8)]

    def shares(pooled: bool, usage: dict | None, k: float = 1.0):
        nodes = [NodeSpec(f"n{i}", gpus=4, pool="p0" if pooled and i == 0 else ("p1" if pooled else "default"))
                 for i in range(2)]
        qs = [QueueSpec(q.name, pools={"p0": PoolQuota({"gpu": 1}), "p1": PoolQuota({"gpu": 1})})
              for q in queues] if pooled else queues
        snap = Snapshot(now=0.0, nodes=nodes, queues=qs, workloads=[Workload(**{f: getattr(w, f) for f in
                        ("id", "queue", "gpus", "submit_time")}) for w in want], usage=usage or {})
        return Scheduler(SchedulerConfig(fairness_k=k)).schedule(snap)

    plain = shares(False, None)
    assert plain.fair_share_plain == {}  # no past usage: nothing moved
    moved = shares(False, {"default": {"a": 0.5, "b": 0.0}})
    assert moved.fair_share["a"]["gpu"] < 4 < moved.fair_share["b"]["gpu"]
    assert moved.fair_share_plain == {"a": {"gpu": 4.0}, "b": {"gpu": 4.0}}
    assert shares(False, {"default": {"a": 0.5}}, k=0.0).fair_share_plain == {}  # k = 0: usage moves nothing
    pooled = shares(True, {"p0": {"a": 0.5, "b": 0.0}})  # usage in pool p0 only
    assert pooled.pool_fair_share_plain["p0"] == {"a": {"gpu": 2.0}, "b": {"gpu": 2.0}}
    assert pooled.pool_fair_share_plain["p1"] == {q: {"gpu": v["gpu"]} for q, v in pooled.pool_fair_share["p1"].items()}
    assert pooled.fair_share_plain == {"a": {"gpu": 4.0}, "b": {"gpu": 4.0}}
    assert pooled.fair_share["a"]["gpu"] < 4


@pytest.mark.parametrize("field, value, message", [
    ("window", 0, "config.fairness.window: must be > 0"),
    ("window_type", "cron", "config.fairness.window_type: must be one of sliding, tumbling"),
    ("half_life", -5, "config.fairness.half_life: must be > 0"),
    ("k", -1, "config.fairness.k: must be >= 0"),
    ("horizon", 5, "config.fairness.horizon: unknown field"),
])
def test_malformed_fairness_is_refused_naming_the_field(tmp_path, field, value, message):
    d = copy.deepcopy(data("fairness_turns"))
    d["config"]["fairness"][field] = value
    proc = run_cli(str(write(tmp_path, d)))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
