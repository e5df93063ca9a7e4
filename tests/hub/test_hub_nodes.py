"""Nodes that fail, drain and return, through the real hub (the local backend): the admin API and
CLI, a drain under a checkpointing job that resumes on another node, a failure that loses only the
work since the last checkpoint, a workspace on a failed node, and a GPU that NVML no longer lists."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gpupool_cli import cli
from hub_harness import Hub, hub_leak_check, ledger  # noqa: F401 (leak check fixtures)

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parents[2]
NODES = [{"name": "a", "gpus": 1, "gpu_memory": "16Gi"}, {"name": "b", "gpus": 1, "gpu_memory": "16Gi"}]

# a training script that saves a checkpoint every `save_every` steps (gpupool.checkpoint) and records
# every step it runs with its attempt, so that the work a failure lost can be counted
TRAIN = """
import os, sys, time
from gpupool import checkpoint

steps, save_every, record = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
attempt = os.environ["GPUPOOL_ATTEMPT"]
state = checkpoint.load(default={"step": 0})
print(f"attempt {attempt}: starting at step {state['step']}", flush=True)
for step in range(state["step"], steps):
    time.sleep(0.2)
    with open(record, "a") as f:
        f.write(f"attempt={attempt} step={step}\\n")
    if (step + 1) % save_every == 0:
        checkpoint.save({"step": step + 1}, step=step + 1)
    if checkpoint.should_stop():
        checkpoint.save({"step": step + 1}, step=step + 1)
        print(f"asked to stop ({checkpoint.stop_reason()})", flush=True)
        break
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("nodes"), gpupool={"nodes": NODES, "preemption_grace": 10},
            users=["alice"], admins=["admin"], managed=False)
    with h:
        shutil.copy(ROOT / "examples" / "train_checkpoint.ipynb", h.home("alice") / "train_checkpoint.ipynb")
        (h.home("alice") / "train.py").write_text(TRAIN)
        yield h


def steps_of(path: Path) -> list[tuple[int, int]]:
    """(attempt, step) for every step a job ran, in order."""
    return [(int(a), int(s)) for a, s in re.findall(r"attempt=(\d+) step=(\d+)", path.read_text())]


def nodes(hub, token=None) -> dict[str, dict]:
    return {n["name"]: n for n in hub.api("GET", "nodes", token or hub.admin_token).json()["nodes"]}


def test_an_admin_takes_a_node_out_and_back_through_the_api_and_the_cli(hub):
    admin, alice = hub.admin_token, hub.token("alice")
    assert {n: v["state"] for n, v in nodes(hub).items()} == {"a": "up", "b": "up"}
    # only admins; an unknown node or action is a 404 naming the field; a bad body a 400
    r = hub.api("POST", "nodes/a/drain", alice)
    assert r.status_code == 403 and "custom:gpupool:admin" in r.json()["message"], r.text
    r = hub.api("POST", "nodes/nope/drain", admin)
    assert r.status_code == 404 and r.json()["field"] == "name" and "no node 'nope'" in r.json()["message"], r.text
    assert "a, b" in r.json()["message"]
    r = hub.api("POST", "nodes/a/reboot", admin)
    assert r.status_code == 404 and r.json()["field"] == "action", r.text
    r = hub.api("POST", "nodes/a/drain", admin, json={"reason": 5})
    assert r.status_code == 400 and r.json()["field"] == "reason", r.text
    # (c.GPUPool.gpu_memory_reserve: of a 16Gi GPU, 3 % stays with the driver)
    r = hub.api("POST", "jobs", alice, json={"command": ["true"], "gpu_memory": "16Gi"})
    assert r.status_code == 400 and r.json()["field"] == "gpu_memory" and "gpu_memory_reserve" in r.text, r.text

    r = hub.api("POST", "nodes/a/drain", admin, json={"reason": "kernel update"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["name"], got["state"], got["schedulable"], got["workloads"]) == ("a", "drained", False, [])
    assert got["state_reason"] == "by admin: kernel update" and got["state_source"] == "admin"
    assert got["unschedulable_reason"] == "by admin: kernel update"
    # the state is stored: a restarted service still has node a out
    hub.restart_service()
    assert nodes(hub, alice)["a"]["state"] == "drained" and not nodes(hub, alice)["a"]["schedulable"]
    # nothing new goes to a drained node
    r = hub.api("POST", "jobs", alice, json={"command": ["python", "-c", "import time; time.sleep(30)"], "gpus": 1})
    job = hub.wait_job(alice, r.json()["id"], {"running"}, 60)
    assert [p["node"] for p in job["allocation"]] == ["b"], job
    r = hub.api("POST", "jobs", alice, json={"command": ["python", "-c", "print(1)"], "gpus": 1})
    second = r.json()["id"]
    cycles = hub.api("GET", "health").json()["cycles"]
    hub.wait_for(lambda: hub.api("GET", "health").json()["cycles"] >= cycles + 3, 30)
    assert hub.api("GET", f"jobs/{second}", alice).json()["status"] == "queued"

    # the CLI: a clear message, never a traceback
    res = cli(hub, "node", "return", "a", token=admin)
    assert res.returncode == 0 and res.stdout.splitlines() == ["node a: up"], (res.stdout, res.stderr)
    assert hub.wait_job(alice, second, {"succeeded"}, 60)["allocation"] == []  # a is used again
    res = cli(hub, "node", "drain", "nope", token=admin)
    assert res.returncode == 1 and "no node 'nope' in the pool" in res.stderr, res.stderr
    res = cli(hub, "node", "fail", "a", token=alice)
    assert res.returncode == 1 and "this needs the custom:gpupool:admin scope" in res.stderr, res.stderr
    res = cli(hub, "node", "drain", "b", "--reason", "new PSU", token=admin)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["node b: draining (by admin: new PSU)",
                                       f"asked to checkpoint and leave it: {job['id']}"], res.stdout
    listing = cli(hub, "nodes", token=alice).stdout
    assert re.search(r"^b .* no +draining \(by admin: new PSU\)$", listing, re.M), listing
    hub.api("DELETE", f"jobs/{job['id']}", alice)
    hub.wait_for(lambda: nodes(hub)["b"]["state"] == "drained", 30, message="b did not end drained")
    assert cli(hub, "node", "return", "b", token=admin).returncode == 0
    assert {n: v["state"] for n, v in nodes(hub).items()} == {"a": "up", "b": "up"}


def test_draining_a_node_under_a_checkpointing_job_resumes_it_elsewhere(hub):
    admin, alice = hub.admin_token, hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"notebook": "train_checkpoint.ipynb", "gpus": 1, "parameters": {
        "steps": 40, "step_seconds": 0.25, "steps_file": "drain-steps.txt"}})
    jid = r.json()["id"]
    first = hub.wait_job(alice, jid, {"running"}, 60)
    [node] = [p["node"] for p in first["allocation"]]
    other = "b" if node == "a" else "a"
    record = hub.home("alice") / "drain-steps.txt"
    hub.wait_for(lambda: record.exists() and len(steps_of(record)) >= 4, 60)

    r = hub.api("POST", f"nodes/{node}/drain", admin, json={"reason": "maintenance"})
    assert r.status_code == 200 and r.json()["workloads"] == [jid] and r.json()["state"] == "draining", r.text
    job = hub.api("GET", f"jobs/{jid}", alice).json()
    assert job["status"] == "preempting", job
    assert job["reason"].startswith(f"its node {node} is being drained (by admin: maintenance); it has 10 s to save")

    moved = hub.wait_job(alice, jid, {"running"}, 60)
    hub.wait_for(lambda: hub.api("GET", f"jobs/{jid}", alice).json()["attempts"] == 2, 60)
    moved = hub.api("GET", f"jobs/{jid}", alice).json()
    assert [p["node"] for p in moved["allocation"]] == [other], moved
    assert nodes(hub)[node]["state"] == "drained"
    final = hub.wait_job(alice, jid, {"succeeded", "failed"}, 90)
    assert final["status"] == "succeeded" and final["preemptions"] == 1 and final["attempts"] == 2, final
    # every step ran exactly once: attempt 2 began where attempt 1 saved when it was asked to stop
    steps = steps_of(record)
    assert [s for _, s in steps] == list(range(40)), steps
    one, two = [s for a, s in steps if a == 1], [s for a, s in steps if a == 2]
    assert one and two and two[0] == one[-1] + 1
    assert [r["end_reason"] for r in ledger(hub, jid)] == ["drain", "succeeded"]
    log = hub.api("GET", f"jobs/{jid}/log", alice).text
    assert f"asked to stop (its node {node} is being drained (by admin: maintenance)" in log
    assert f"resuming from" in log and f"attempt 2: starting at step {two[0]}" in log
    assert hub.api("POST", f"nodes/{node}/return", admin).json()["state"] == "up"


def test_a_failed_node_loses_only_the_work_since_the_last_checkpoint(hub):
    admin, alice = hub.admin_token, hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "train.py", "args": ["40", "5", "fail-steps.txt"], "gpus": 1})
    jid = r.json()["id"]
    first = hub.wait_job(alice, jid, {"running"}, 60)
    [node] = [p["node"] for p in first["allocation"]]
    other = "b" if node == "a" else "a"
    record = hub.home("alice") / "fail-steps.txt"
    hub.wait_for(lambda: record.exists() and len(steps_of(record)) >= 8, 60)  # saved at 5, and more since

    r = hub.api("POST", f"nodes/{node}/fail", admin)
    assert r.status_code == 200 and r.json()["workloads"] == [jid] and r.json()["state"] == "failed", r.text
    job = hub.api("GET", f"jobs/{jid}", alice).json()  # at once: no grace
    assert job["status"] in ("queued", "starting", "running") and job["allocation"] != first["allocation"], job
    assert f"its node {node} failed (by admin)" in job["reason"] or job["attempts"] == 2, job
    final = hub.wait_job(alice, jid, {"succeeded", "failed"}, 90)
    assert final["status"] == "succeeded" and final["attempts"] == 2 and final["preemptions"] == 1, final
    steps = steps_of(record)
    one, two = [s for a, s in steps if a == 1], [s for a, s in steps if a == 2]
    # attempt 2 resumed from attempt 1's last checkpoint (a multiple of 5): only the steps run after
    # it were lost and run again, fewer than one checkpoint interval; none before it
    assert two[0] % 5 == 0 and two[0] >= 5 and two == list(range(two[0], 40)), steps
    lost = [s for s in one if s >= two[0]]
    assert one == list(range(one[-1] + 1)) and len(lost) < 5, steps
    log = hub.api("GET", f"jobs/{jid}/log", alice).text
    assert "asked to stop" not in log  # a failure gives no chance to save
    assert f"attempt 2 of {jid} on {other} GPU 0; resuming from" in log, log
    assert hub.api("POST", f"nodes/{node}/return", admin).json()["state"] == "up"


def test_a_workspace_on_a_failed_node_is_suspended_and_its_gpu_released(hub):
    admin, alice = hub.admin_token, hub.token("alice")
    r = hub.api("POST", "workspaces/alice", admin, json={"gpus": 1, "preemptible": True})  # as the spawner asks
    assert r.status_code == 201, r.text
    ws = hub.wait_for(lambda: (lambda w: w if w["status"] == "running" else None)(
        hub.api("GET", "workspaces/alice", alice).json()), 30,
        message=str(hub.api("GET", "workspaces/alice", alice).json()))
    [node] = [p["node"] for p in ws["allocation"]]
    r = hub.api("POST", f"nodes/{node}/fail", admin, json={"reason": "PSU"})
    assert r.json()["workloads"] == [ws["id"]] and r.json()["gpus"][0]["allocations"] == [], r.text
    assert hub.api("GET", "workspaces/alice", alice).status_code == 404  # gone: the spawner stops its server
    [sus] = hub.api("GET", "suspensions", alice).json()["suspensions"]
    assert sus["workload"] == ws["id"] and sus["options"]["gpus"] == 1
    assert sus["reason"].startswith(f"suspended: its node {node} failed (by admin: PSU); its GPU went back")
    assert hub.api("POST", f"nodes/{node}/return", admin).json()["state"] == "up"


def test_a_gang_with_one_worker_on_a_failed_node_leaves_whole(hub):
    admin, alice = hub.admin_token, hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"pods": 2, "gpus": 1, "command": [
        "python", "-c", "import time; time.sleep(120)"]})
    jid = r.json()["id"]
    job = hub.wait_job(alice, jid, {"running"}, 60)
    assert sorted(p["node"] for p in job["allocation"]) == ["a", "b"], job
    hub.wait_for(lambda: len(hub.job_pids()) >= 2, 30)
    res = cli(hub, "node", "fail", "b", "--reason", "fan", token=admin)
    assert res.returncode == 0 and res.stdout.splitlines() == [
        "node b: failed (by admin: fan)", f"stopped and requeued (or suspended): {jid}"], res.stdout
    job = hub.api("GET", f"jobs/{jid}", alice).json()
    assert job["status"] == "queued" and job["allocation"] == [], job  # both workers, not only b's
    hub.wait_for(lambda: not hub.job_pids(), 30, message="the gang's worker on node a was not stopped")
    assert nodes(hub)["a"]["gpus"][0]["allocations"] == []
    assert hub.api("POST", "nodes/b/return", admin).json()["state"] == "up"
    assert hub.wait_job(alice, jid, {"running"}, 60)["attempts"] == 2  # whole again, on both nodes
    hub.api("DELETE", f"jobs/{jid}", alice)
    hub.wait_job(alice, jid, {"cancelled"}, 30)
    hub.wait_for(lambda: hub.api("GET", f"jobs/{jid}", alice).json()["allocation"] == [], 30)


# -- a GPU that NVML no longer lists (the local backend) -----------------------------------------

def test_a_gpu_that_nvml_no_longer_lists_fails_its_node_until_it_is_back(tmp_path):
    import nvml_standin

    # (and a department whose projects deserve more than it does: a warning in the service's log, no more)
    queues = [{"name": "d", "deserved": {"gpu": 2}}, {"name": "p", "parent": "d", "deserved": {"gpu": 2}},
              {"name": "q", "parent": "d", "deserved": {"gpu": 2}}]
    gp = {"nodes": None, "nvml_module": "nvml_standin", "usage_sample_seconds": 0, "preemption_grace": 5,
          "queues": queues}
    with nvml_standin.for_services(tmp_path / "nvml.json", [0.0, 0.0]) as readings, \
            Hub(tmp_path, gpupool=gp, users=["alice"], admins=["admin"], managed=False) as hub:
        admin, alice = hub.admin_token, hub.token("alice")
        assert "the children of 'd' deserve 4 GPUs in all, more than its 2 (over-committed" in hub.service_log()
        [box] = nodes(hub).values()
        assert len(box["gpus"]) == 2 and box["state"] == "up"
        r = hub.api("POST", "jobs", alice, json={"command": ["python", "-c", "import time; time.sleep(120)"],
                                                 "gpus": 2, "queue": "p"})
        jid = r.json()["id"]
        hub.wait_job(alice, jid, {"running"}, 60)

        nvml_standin.write(readings, [0.0])  # GPU 1 fell off the bus
        hub.wait_job(alice, jid, {"queued"}, 30)
        why = "NVML no longer lists GPU 1 (GPU-00000001-0000)"
        # the usage record says why it ended (the job's reason is the scheduler's again by now)
        [record] = ledger(hub, jid)
        assert (record["end_reason"], record["end_detail"]) == (
            "node-failure", f"requeued: its node {box['name']} failed ({why}); it restarts from the beginning "
                            "(it saved no checkpoint)"), record
        node = nodes(hub)[box["name"]]
        assert (node["state"], node["state_reason"], node["state_source"], node["schedulable"]) == (
            "failed", why, "local", False)
        hub.wait_for(lambda: not hub.job_pids(), 30, message="the run on the failed node was not killed")
        r = hub.api("POST", f"nodes/{box['name']}/return", admin)
        assert r.status_code == 409 and r.json()["field"] == "name" and why in r.json()["message"], r.text

        nvml_standin.write(readings, [0.0, 0.0])  # back: the node returns by itself, the job runs again
        job = hub.wait_job(alice, jid, {"running"}, 60)
        assert job["attempts"] == 2 and nodes(hub)[box["name"]]["state"] == "up"
        hub.api("DELETE", f"jobs/{jid}", alice)
        hub.wait_job(alice, jid, {"cancelled"}, 30)
