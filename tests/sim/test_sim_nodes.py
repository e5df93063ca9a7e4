"""Nodes that fail, drain and return (``cluster.events``) in the simulator: each action, a gang
across a failed node, a failure and a return, a drain against a failure of a workload that saves on
signal, the capacity accounting, validation through the real command, and determinism."""
from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from gpupool.sim import load_scenario, parse_scenario, simulate
from sim_harness import ROOT, SCENARIOS, data, replay, run_cli, without_timing, write


def wl(report: dict, name: str) -> dict:
    return next(w for w in report["workloads"] if w["name"] == name)


def preempts(report: dict, name: str | None = None) -> list[dict]:
    return [e for e in report["events"] if e["type"] == "preempt" and (name is None or e["workload"] == name)]


def alloc_at(report: dict, queue: str, t: float) -> float:
    """The queue's allocation after the last cycle at or before ``t``."""
    return [c for c in report["timeline"] if c["t"] <= t][-1]["queues"][queue]["allocated_gpu"]


def test_a_failed_node_stops_its_workloads_at_once_and_they_resume_from_their_checkpoint():
    r = replay(data("node_fail"))
    (ev,) = preempts(r, "t-1")
    assert (ev["t"], ev["reason"], ev["node"], ev["signalled_at"]) == (250, "node-failure", "a-1", 250)
    assert ev["lost_seconds"] == 40  # ran 10..250, last periodic checkpoint at 210
    t1 = wl(r, "t-1")
    assert [p["node"] for p in t1["placements"]] == ["a-1", "a-0"]  # resumed elsewhere
    assert t1["placements"][1]["t"] == 500  # once t-0 finished: a-1 never came back
    assert t1["finished"] == 500 + (1000 - 200) and t1["preemptions"] == 1
    # the non-preemptible notebook was requeued too, and lost its whole run (no checkpoints)
    nb = wl(r, "nb")
    (ev,) = preempts(r, "nb")
    assert ev["reason"] == "node-failure" and ev["lost_seconds"] == 240 and nb["finished"] == 500 + 500
    assert wl(r, "t-0")["preemptions"] == 0
    m = r["metrics"]
    assert m["preemptions"] == 2 and m["preemptions_by_reason"] == {"node-failure": 2}
    assert m["lost_gpu_seconds"] == 40 * 3 + 240 * 1 == m["lost_gpu_seconds_by_reason"]["node-failure"]
    assert r["node_events"] == [{"t": 250, "node": "a-1", "action": "fail", "workloads": ["t-1", "nb"]}]
    # capacity: 8 GPUs until 250, then 4; the scheduler's fair share follows the capacity
    assert m["gpu_capacity"] == 8 and m["gpu_available_seconds"] == 8 * 250 + 4 * (1300 - 250)
    assert m["gpu_utilization"] == round(m["gpu_allocated_seconds"] / m["gpu_available_seconds"], 4)
    cap = {c["t"]: c["capacity_gpu"] for c in r["timeline"]}
    assert cap[10] == 8 and cap[250] == 4 and max(t for t, c in cap.items() if c == 8) < 250
    assert all(c["queues"]["lab"]["fair_share_gpu"] <= c["capacity_gpu"] for c in r["timeline"])


def test_a_gang_with_one_pod_on_a_failed_node_stops_whole_and_restarts_whole_on_return():
    r = replay(data("node_fail_return"))
    gang = wl(r, "gang")
    (ev,) = preempts(r, "gang")
    assert (ev["t"], ev["reason"], ev["lost_seconds"]) == (350, "node-failure", 50)
    assert r["metrics"]["lost_gpu_seconds"] == 50 * 8  # both pods' work since the checkpoint at 300
    assert alloc_at(r, "lab", 400) == 0  # the pod on a-0 stopped too: no partial gang
    starts = {p["t"]: set() for p in gang["placements"]}
    for p in gang["placements"]:
        starts[p["t"]].add(p["node"])
    assert starts == {0: {"a-0", "a-1"}, 600: {"a-0", "a-1"}}  # restarted whole when a-1 returned
    assert gang["finished"] == 600 + (1000 - 300)
    assert [e["action"] for e in r["node_events"]] == ["fail", "return"]
    assert r["node_events"][1]["workloads"] == []  # a failed node comes back empty
    # while a-1 was out, the gang waited for capacity and its reason said a node is not schedulable
    out = {c["t"]: c["capacity_gpu"] for c in r["timeline"]}
    assert out[350] == 4 and out[600] == 8


def test_the_gang_waits_with_a_reason_while_the_node_is_out():
    d = data("node_fail_return")
    d["cluster"]["events"] = d["cluster"]["events"][:1]  # it never returns
    d["config"]["until"] = 1000
    r = replay(d)
    gang = wl(r, "gang")
    assert gang["finished"] is None and gang["state"] == "pending"
    # the code is the scheduler's to choose (capacity, or fair-share while the quotas over-commit
    # what is left); the sentence says that a node is out
    assert "1 node with GPUs not schedulable" in gang["pending_reason"]
    m = r["metrics"]
    assert m["end"] == "stalled"  # nothing can change any more: no event is left
    assert m["gpu_available_seconds"] == 8 * 350 + 4 * (m["makespan"] - 350)


def test_a_drain_lets_a_checkpointing_workload_save_and_a_failure_does_not():
    drained = replay(data("node_drain"))
    (ev,) = preempts(drained, "saver")
    assert (ev["reason"], ev["node"], ev["signalled_at"], ev["t"]) == ("drain", "first", 300, 330)
    assert ev["lost_seconds"] == 0 and drained["metrics"]["lost_gpu_seconds"] == 0
    saver = wl(drained, "saver")
    assert [p["node"] for p in saver["placements"]] == ["first", "spare"]  # first stays cordoned
    assert saver["placements"][1]["t"] == 500 and saver["finished"] == 500 + (1000 - 295)
    assert drained["metrics"]["preemptions_by_reason"] == {"drain": 1}
    # during the grace period the drained node still counts: its GPUs are held
    assert drained["metrics"]["gpu_available_seconds"] == 8 * 330 + 4 * (saver["finished"] - 330)

    d = data("node_drain")
    d["cluster"]["events"][0]["action"] = "fail"
    failed = replay(d)
    (ev,) = preempts(failed, "saver")
    assert (ev["reason"], ev["t"], ev["lost_seconds"]) == ("node-failure", 300, 295)  # no chance to save
    assert wl(failed, "saver")["finished"] == 500 + 1000
    assert failed["metrics"]["lost_gpu_seconds"] == 295 * 4

    d["workloads"][1]["checkpoint_every"] = 100  # periodic checkpoints bound the loss
    (ev,) = preempts(replay(d), "saver")
    assert ev["lost_seconds"] == 95  # ran 5..300, last checkpoint at 205


def test_a_drained_workload_that_does_not_save_on_signal_runs_through_the_grace_period():
    d = data("node_drain")
    d["workloads"][1]["checkpoint_on_signal"] = False
    d["workloads"][1]["checkpoint_every"] = 100
    (ev,) = preempts(replay(d), "saver")
    assert (ev["reason"], ev["t"], ev["lost_seconds"]) == ("drain", 330, 25)  # checkpoint at 305


def test_a_failure_during_a_drains_grace_period_keeps_what_was_saved_on_signal():
    d = data("node_drain")
    d["cluster"]["events"].append({"t": 310, "node": "first", "action": "fail"})
    r = replay(d)
    (ev,) = preempts(r, "saver")
    assert (ev["reason"], ev["t"], ev["lost_seconds"], ev["interrupted"]) == ("node-failure", 310, 0, "drain")
    assert ev["signalled_at"] == 300 and wl(r, "saver")["preemptions"] == 1
    assert [e["workloads"] for e in r["node_events"]] == [["saver"], ["saver"]]


def test_a_returned_node_takes_work_again():
    d = data("node_drain")
    d["cluster"]["events"].append({"t": 400, "node": "first", "action": "return"})
    r = replay(d)
    saver = wl(r, "saver")
    assert [(p["t"], p["node"]) for p in saver["placements"]] == [(5, "first"), (400, "first")]
    assert saver["finished"] == 400 + (1000 - 295)


def test_node_events_at_the_same_time_keep_their_file_order_and_repeat_harmlessly():
    d = data("node_fail_return")
    d["cluster"]["events"] = [{"t": 600, "node": "a-1", "action": "return"},  # listed first, happens last
                              {"t": 350, "node": "a-1", "action": "drain"},
                              {"t": 350, "node": "a-1", "action": "fail"},
                              {"t": 360, "node": "a-1", "action": "fail"},
                              {"t": 600, "node": "a-0", "action": "return"}]  # never out: nothing
    r = replay(d)
    assert [(e["t"], e["action"]) for e in r["node_events"]] == [
        (350, "drain"), (350, "fail"), (360, "fail"), (600, "return"), (600, "return")]
    (ev,) = preempts(r, "gang")
    assert ev["reason"] == "node-failure" and ev["interrupted"] == "drain"  # the fail cut the drain's grace short
    assert wl(r, "gang")["finished"] == 600 + (1000 - 300)


def test_node_events_keep_the_report_deterministic():
    d = data("node_fail")
    d["cluster"]["events"] += [{"t": 700, "node": "a-1", "action": "return"},
                               {"t": 800, "node": "a-0", "action": "drain"}]
    for seed in (0, 3):
        a, b = (without_timing(simulate(parse_scenario(d), seed=seed, timeline=True)) for _ in range(2))
        assert json.dumps(a) == json.dumps(b)


def test_the_command_replays_node_events(tmp_path):
    res = run_cli(str(SCENARIOS / "node_fail.yaml"))
    assert res.returncode == 0, res.stderr
    assert "a-1 fail: stopped t-1, nb" in res.stdout and "node-failure of a-1" in res.stdout
    res = run_cli(str(SCENARIOS / "node_drain.yaml"), "--timeline")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["node_events"][0]["action"] == "drain" and "capacity_gpu" in report["timeline"][0]


@pytest.mark.parametrize("events, message", [
    ([{"t": 1, "node": "a-0", "action": "fail"}, {"t": 2, "node": "a-0", "action": "drain"},
      {"t": 3, "node": "x", "action": "fail"}], "cluster.events[2].node: no node 'x'"),
    ([{"t": 1, "node": "a-0", "action": "reboot"}], "cluster.events[0].action: must be one of fail, drain, return"),
    ([{"t": -5, "node": "a-0", "action": "fail"}], "cluster.events[0].t: must be >= 0"),
    ([{"t": "soon", "node": "a-0", "action": "fail"}], "cluster.events[0].t: must be a number"),
    ([{"node": "a-0", "action": "fail"}], "cluster.events[0].t: is required"),
    ([{"t": 1, "node": "a-0", "action": "fail", "why": "x"}], "cluster.events[0].why: unknown field"),
    ([{"t": 1, "node": ["a-0"], "action": "fail"}], "cluster.events[0].node: must be a node name"),
    ([["a-0", "fail"]], "cluster.events[0]: must be a mapping"),
    ({"t": 1}, "cluster.events: must be a list"),
])
def test_malformed_node_events_exit_2_naming_the_field(tmp_path, events, message):
    d = data("node_fail")
    d["cluster"]["events"] = events
    res = run_cli(str(write(tmp_path, d, "bad.yaml")))
    assert res.returncode == 2, res.stdout
    assert message in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1


def test_a_scenario_without_events_reports_as_before():
    r = simulate(load_scenario(SCENARIOS / "reclaim.yaml"), timeline=True)
    m = r["metrics"]
    assert "node_events" not in r and "capacity_gpu" not in r["timeline"][0]
    assert m["gpu_available_seconds"] == m["gpu_capacity"] * m["makespan"]
    assert m["gpu_utilization"] == round(m["gpu_allocated_seconds"] / (m["gpu_capacity"] * m["makespan"]), 4)
    assert sum(m["preemptions_by_reason"].values()) == m["preemptions"]


def test_the_simulator_doc_example_of_node_events_runs_as_described():
    text = (ROOT / "docs" / "simulator.md").read_text()
    section = text[text.index("## Nodes that fail, drain and return"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    r = replay(yaml.safe_load(example))
    pre = {e["workload"]: e for e in preempts(r)}
    assert pre["train-a"]["reason"] == "node-failure" and pre["train-a"]["lost_seconds"] == 120
    assert pre["train-b"]["reason"] == "drain" and pre["train-b"]["lost_seconds"] == 0
    assert pre["notebook"]["reason"] == "node-failure"
    assert [(e["t"], e["node"], e["action"]) for e in r["node_events"]] == [
        (600, "a-1", "fail"), (600, "a-2", "drain"), (1800, "a-1", "return")]
    assert pre["notebook"]["lost_seconds"] == 600
    assert all(w["finished"] is not None for w in r["workloads"])
    cap = {c["t"]: c["capacity_gpu"] for c in r["timeline"]}
    assert cap[0] == 12 and cap[600] == 4 and cap[1800] == 8
    assert r["metrics"]["gpu_available_seconds"] == 12 * 600 + 8 * 60 + 4 * (1800 - 660) + 8 * (
        r["metrics"]["makespan"] - 1800)
    resumed = {e["workload"]: e["t"] for e in r["events"] if e["type"] == "resume"}
    assert resumed["train-a"] == resumed["notebook"] == 1800 and resumed["train-b"] >= 2400

