"""Scenario files: validation (exit 2 naming the field), YAML and JSON, count expansion,
determinism and the report's schema. Runs the real `gpupool simulate` command where it matters."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpupool.scheduler.spec import SpecError
from gpupool.sim import load_scenario, parse_scenario, simulate
from sim_harness import ROOT, run_cli, without_timing, write

BASE = {
    "name": "base",
    "config": {"cycle": 10, "preemption_grace": 30},
    "cluster": {"nodes": [{"name": "a", "count": 2, "gpus": 4, "gpu_model": "A100", "gpu_memory": "40Gi",
                           "labels": {"rack": "r1"}}]},
    "queues": [
        {"name": "research", "deserved": {"gpu": 6}},
        {"name": "vision", "parent": "research", "deserved": {"gpu": 4}},
        {"name": "nlp", "parent": "research", "deserved": {"gpu": 2}},
        {"name": "robotics", "deserved": {"gpu": 2}},
    ],
    "workloads": [
        {"name": "train", "queue": "vision", "gpus": 2, "duration": 600, "count": 3, "submit_every": 60,
         "checkpoint_every": 120},
        {"name": "ws", "queue": "nlp", "kind": "interactive", "gpus": 0.5, "duration": 900, "submit_at": 30},
        {"name": "hpo", "queue": "robotics", "kind": "hpo-trial", "gpus": 1, "duration": 300, "count": 4},
    ],
}


# -- the real command ----------------------------------------------------------------------------
def test_cli_malformed_field_exits_2_naming_it(tmp_path):
    bad = copy.deepcopy(BASE)
    bad["workloads"][1]["gpus"] = 0
    res = run_cli(str(write(tmp_path, bad)))
    assert res.returncode == 2
    assert res.stderr.strip().endswith("workloads[1].gpus: must be > 0")
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_cli_missing_file_exits_2(tmp_path):
    res = run_cli(str(tmp_path / "nope.yaml"))
    assert res.returncode == 2
    assert "nope.yaml: no such file" in res.stderr and "Traceback" not in res.stderr


def test_cli_invalid_yaml_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("queues:\n  - name: a\n   deserved: {gpu: 1}\n")
    res = run_cli(str(p))
    assert res.returncode == 2
    assert "not valid YAML (line 3" in res.stderr and "Traceback" not in res.stderr


def test_cli_unknown_top_level_key_refused(tmp_path):
    bad = copy.deepcopy(BASE)
    bad["nodes"] = []
    res = run_cli(str(write(tmp_path, bad)))
    assert res.returncode == 2
    assert "nodes: unknown top-level field" in res.stderr


def test_cli_needs_a_scenario_or_a_trace():
    res = run_cli()
    assert res.returncode == 2 and "give a SCENARIO file" in res.stderr
    res = run_cli("--trace-nodes", "x.csv")
    assert res.returncode == 2 and "--trace-pods: required" in res.stderr


def test_cli_trace_missing_file_exits_2(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,8,V100M32\n")
    res = run_cli("--trace-nodes", str(nodes), "--trace-pods", str(tmp_path / "pods.csv"))
    assert res.returncode == 2
    assert "--trace-pods" in res.stderr and "no such file" in res.stderr


def test_cli_trace_fill_tiny_trace(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,8,V100M32\nn1,32000,262144,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,500,\n"
                    "p1,1000,1024,2,1000,V100M32\np2,1000,1024,1,1000,T4\n")
    res = run_cli("--trace-nodes", str(nodes), "--trace-pods", str(pods), "--fill", "1.0", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["gpu_capacity_milli"] == 10000 and report["seed"] == 42 and report["fill"] == 1.0
    m = report["metrics"]
    assert m["placed_pods"] > 0 and m["placed_pods"] + m["failed_pods"] >= 3
    assert report["curve"] and all(0 < p["alloc_pct"] <= p["arrived_pct"] + 0.5 for p in report["curve"])
    res = run_cli("--trace-nodes", str(nodes), "--trace-pods", str(pods), "--policy", "magic")
    assert res.returncode == 2 and "--policy: unknown placement policy 'magic'" in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\np0,1\n")
    res = run_cli("--trace-nodes", str(nodes), "--trace-pods", str(bad))
    assert res.returncode == 2 and "bad.csv: missing column(s)" in res.stderr and "Traceback" not in res.stderr


def test_cli_summary_and_json(tmp_path):
    p = write(tmp_path, BASE)
    res = run_cli(str(p))
    assert res.returncode == 0, res.stderr
    for word in ("research", "vision", "robotics", "preemptions", "utilization", "wait"):
        assert word in res.stdout
    res = run_cli(str(p), "--json", "--seed", "7")
    report = json.loads(res.stdout)
    assert report["seed"] == 7 and report["scenario"] == "base"


# -- validation (functions) ----------------------------------------------------------------------
def mutate(path: str, value):
    """A copy of BASE with the dotted/indexed ``path`` set to ``value`` (DELETE removes it)."""
    data = copy.deepcopy(BASE)
    parts = path.replace("]", "").replace("[", ".").split(".")
    cur = data
    for part in parts[:-1]:
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    last = parts[-1]
    key = int(last) if isinstance(cur, list) else last
    if value is DELETE:
        del cur[key]
    else:
        cur[key] = value
    return data


DELETE = object()

MALFORMED = [
    ("config.cycle", 0, "config.cycle: must be > 0"),
    ("config.preemption_grace", -1, "config.preemption_grace: must be >= 0"),
    ("config.until", "soon", "config.until: must be a number"),
    ("config.speed", 2, "config.speed: unknown field"),
    ("config.placement", "magic", "config.placement: unknown placement policy"),
    ("config.gpu_memory_reserve", {"fraction": 1.5}, "config.gpu_memory_reserve.fraction: must be below 1"),
    ("config.gpu_memory_reserve", {"min": "lots"}, "config.gpu_memory_reserve.min"),
    ("config.gpu_memory_reserve", 0.03, "config.gpu_memory_reserve: must be a mapping"),
    ("cluster", DELETE, "cluster: is required"),
    ("cluster.nodes", [], "cluster.nodes: must list at least one node"),
    ("cluster.racks", 2, "cluster.racks: unknown field"),
    ("cluster.nodes[0].gpus", -1, "cluster.nodes[0].gpus: must be >= 0"),
    ("cluster.nodes[0].count", 0, "cluster.nodes[0].count: must be >= 1"),
    ("cluster.nodes[0].gpu_memory", "lots", "cluster.nodes[0].gpu_memory"),
    ("queues", DELETE, "queues: is required"),
    ("queues[1].parent", "nowhere", "queues[1].parent: unknown queue 'nowhere'"),
    ("queues[1].limit", {"gpu": 1}, "queues[1].limit.gpu: limit 1 is below deserved 4"),
    ("queues[3].name", "vision", "queues[3].name: duplicate queue name 'vision'"),
    ("workloads", {"a": 1}, "workloads: must be a list"),
    ("workloads[0].queue", "research", "workloads[0].queue: 'research' is a department"),
    ("workloads[0].queue", "nowhere", "workloads[0].queue: unknown queue 'nowhere'"),
    ("workloads[0].duration", 0, "workloads[0].duration: must be > 0"),
    ("workloads[0].count", 0, "workloads[0].count: must be an integer >= 1"),
    ("workloads[1].submit_every", 5, "workloads[1].submit_every: only makes sense with count"),
    ("workloads[1].kind", "batch", "workloads[1].kind: must be one of"),
    ("workloads[0].gpus", 1.5, "workloads[0].gpus: above 1 must be a whole number"),
    ("workloads[1].gpu_memory", "10Gi", "workloads[1].gpu_memory: give either gpus or gpu_memory"),
    ("workloads[2].pods", 0, "workloads[2].pods: must be >= 1"),
    ("workloads[2].preemptible", "yes", "workloads[2].preemptible: must be true or false"),
    ("workloads[2].checkpoint_every", -5, "workloads[2].checkpoint_every: must be > 0"),
    ("workloads[2].submit_at", -1, "workloads[2].submit_at: must be >= 0"),
    ("workloads[2].colour", "red", "workloads[2].colour: unknown field"),
    ("workloads[1].name", "train-1", "workloads[1].name: duplicate workload name 'train-1'"),
]


@pytest.mark.parametrize("path,value,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_scenarios_name_the_field(path, value, message):
    with pytest.raises(SpecError) as err:
        parse_scenario(mutate(path, value))
    assert message in str(err.value)


def test_top_level_must_be_a_mapping():
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_scenario([1, 2])


def test_duplicate_yaml_key_refused(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False) + "config: {cycle: 5}\n")
    with pytest.raises(SpecError, match=r"config: given twice"):
        load_scenario(p)


def test_invalid_json_names_the_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"queues": [\n  {"name": "a",}\n]}')
    with pytest.raises(SpecError, match=r"bad.json: not valid JSON \(line 2"):
        load_scenario(p)


# -- loading -------------------------------------------------------------------------------------
def test_count_expansion():
    sc = parse_scenario(BASE)
    assert [n.name for n in sc.nodes] == ["a-0", "a-1"]
    assert all(n.labels == {"rack": "r1"} and n.gpu_memory == 40 * 2**30 for n in sc.nodes)
    names = [e.workload.id for e in sc.workloads]
    assert names == ["train-0", "train-1", "train-2", "ws", "hpo-0", "hpo-1", "hpo-2", "hpo-3"]
    assert [e.workload.submit_time for e in sc.workloads[:3]] == [0, 60, 120]
    assert all(e.workload.submit_time == 0 for e in sc.workloads[4:])
    assert sc.workloads[0].checkpoint_every == 120 and sc.workloads[0].duration == 600
    assert sc.leaves == ["vision", "nlp", "robotics"]
    ws = sc.workloads[3].workload
    assert ws.preemptible is False and ws.priority == 100 and ws.gpus == 0.5


def test_yaml_and_json_give_the_same_report(tmp_path):
    y = simulate(load_scenario(write(tmp_path, BASE, "base.yaml")), seed=3)
    j = simulate(load_scenario(write(tmp_path, BASE, "base.json")), seed=3)
    assert without_timing(y) == without_timing(j)
    assert y["metrics"]["finished"] == 8


# -- determinism and schema ----------------------------------------------------------------------
def test_same_scenario_and_seed_give_identical_json(tmp_path):
    p = write(tmp_path, BASE)
    outs = []
    for _ in range(2):
        res = run_cli(str(p), "--json", "--timeline", "--seed", "5")
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        report.pop("timing")
        outs.append(json.dumps(report, indent=2))
    assert outs[0] == outs[1]


def test_report_schema():
    r = simulate(parse_scenario(BASE), seed=0, timeline=True)
    assert set(r) >= {"scenario", "seed", "metrics", "queues", "workloads", "events", "timing", "timeline"}
    m = r["metrics"]
    for key in ("makespan", "gpu_capacity", "gpu_allocated_seconds", "gpu_utilization", "preemptions",
                "lost_gpu_seconds", "scheduling_cycles", "wait"):
        assert key in m, key
    assert m["gpu_capacity"] == 8
    assert set(m["wait"]) == {"train", "interactive", "hpo-trial"}
    for w in m["wait"].values():
        assert set(w) >= {"mean", "p50", "p95"} and w["p50"] <= w["p95"]
    assert 0 < m["gpu_utilization"] <= 1
    assert m["gpu_utilization"] == pytest.approx(m["gpu_allocated_seconds"] / (8 * m["makespan"]), abs=1e-4)
    assert [q["name"] for q in r["queues"]] == ["research", "vision", "nlp", "robotics"]
    for q in r["queues"]:
        assert set(q) >= {"name", "deserved_gpu", "gpu_seconds", "mean_fair_share_gpu", "mean_allocated_gpu"}
    research = r["queues"][0]
    assert research["gpu_seconds"] == pytest.approx(r["queues"][1]["gpu_seconds"] + r["queues"][2]["gpu_seconds"])
    assert sum(q["gpu_seconds"] for q in r["queues"] if q["parent"] is None) == pytest.approx(m["gpu_allocated_seconds"])
    for w in r["workloads"]:
        assert set(w) >= {"name", "queue", "submitted", "started", "finished", "preemptions", "lost_seconds",
                          "placements"}
        for p in w["placements"]:
            assert set(p) == {"t", "pod", "node", "gpus", "fraction"}
    ws = next(w for w in r["workloads"] if w["name"] == "ws")
    assert ws["placements"][0]["fraction"] == 0.5
    times = [e["t"] for e in r["events"]]
    assert times == sorted(times)
    assert {e["type"] for e in r["events"]} <= {"start", "preempt", "resume", "finish", "reject"}
    assert all(e["reason"] for e in r["events"])
    assert set(r["timing"]) >= {"wall_seconds", "cycle_ms"}
    assert set(r["timing"]["cycle_ms"]) == {"p50", "p95", "max"}
    assert len(r["timeline"]) == m["scheduling_cycles"]
    first = r["timeline"][0]
    assert set(first["queues"]) == {"research", "vision", "nlp", "robotics"}
    assert set(first["queues"]["vision"]) == {"allocated_gpu", "fair_share_gpu"}


def test_impossible_workloads_are_rejected_with_a_reason():
    data = copy.deepcopy(BASE)
    data["workloads"] = [
        {"name": "huge", "queue": "vision", "gpus": 8, "duration": 10},
        {"name": "big-ws", "queue": "nlp", "kind": "interactive", "gpus": 3, "duration": 10},
        {"name": "wide-gang", "queue": "vision", "gpus": 4, "pods": 3, "duration": 10},
        {"name": "no-node", "queue": "vision", "gpus": 1, "duration": 10, "node_selector": {"gpu_model": "H100"}},
        {"name": "fat-share", "queue": "vision", "gpu_memory": "80Gi", "duration": 10},
        {"name": "ok", "queue": "vision", "gpus": 4, "duration": 10},
    ]
    data["queues"][3]["limit"] = {"gpu": 3}
    data["workloads"].append({"name": "over-limit", "queue": "robotics", "gpus": 4, "duration": 10})
    r = simulate(parse_scenario(data))
    rejected = {e["workload"]: e["reason"] for e in r["events"] if e["type"] == "reject"}
    assert set(rejected) == {"huge", "big-ws", "wide-gang", "no-node", "fat-share", "over-limit"}
    assert "largest matching node has 4" in rejected["huge"]
    assert "non-preemptible" in rejected["big-ws"] and "deserved 2" in rejected["big-ws"]
    assert "gang of 3 pods" in rejected["wide-gang"]
    assert "matches no node" in rejected["no-node"]
    assert "limit of 3" in rejected["over-limit"]
    assert r["metrics"]["rejected"] == 6 and r["metrics"]["finished"] == 1
    assert next(w for w in r["workloads"] if w["name"] == "huge")["rejected"] == rejected["huge"]


def test_until_stops_the_replay():
    data = copy.deepcopy(BASE)
    data["config"]["until"] = 100
    r = simulate(parse_scenario(data))
    assert r["metrics"]["makespan"] == 100 and r["metrics"]["end"] == "until"
    assert all(e["t"] <= 100 for e in r["events"])
    assert any(w["finished"] is None for w in r["workloads"])


def test_examples_load_and_run():
    examples = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
    assert len(examples) >= 2
    for path in examples:
        r = simulate(load_scenario(path))
        assert r["metrics"]["finished"] + r["metrics"]["rejected"] == r["metrics"]["workloads"], path.name


def test_cycle_limit_stops_a_replay_that_never_settles():
    r = simulate(parse_scenario(BASE), max_cycles=3)
    assert r["metrics"]["scheduling_cycles"] == 3
    assert r["metrics"]["end"].startswith("cycle limit")
    res = run_cli(str(ROOT / "examples" / "scenarios" / "reclaim.yaml"), "--max-cycles", "0")
    assert res.returncode == 2 and "--max-cycles: must be >= 1" in res.stderr


def test_the_scenario_doc_example_runs_as_written_and_docs_stay_in_the_repository():
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "scenario.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    report = simulate(parse_scenario(yaml.safe_load(example), name="doc-example"), seed=0)
    done = {w["name"]: w for w in report["workloads"]}
    assert set(done) == {"train-1", "notebook"} and all(w["finished"] is not None for w in done.values())
    # the format is described in docs/, not in material outside the repository
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        assert "spec/scenario.md" not in doc.read_text(), doc


def test_driver_reserved_memory_sizes_memory_fractions():
    """config.gpu_memory_reserve: a 24Gi request fits a 24Gi GPU only when the driver keeps nothing."""
    def run(config):
        data = {"config": {"until": 5, **config}, "cluster": {"nodes": [{"name": "a", "gpus": 1, "gpu_memory": "24Gi"}]},
                "queues": [{"name": "q", "deserved": {"gpu": 1}}],
                "workloads": [{"name": "w", "queue": "q", "gpu_memory": "24Gi", "duration": 10}]}
        report = simulate(parse_scenario(data))
        return report["workloads"][0]["started"]

    assert run({}) == 0
    assert run({"gpu_memory_reserve": {"fraction": 0.03, "min": "256Mi"}}) is None
