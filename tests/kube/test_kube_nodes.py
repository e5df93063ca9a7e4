"""Nodes that fail and drain on Kubernetes, through the real service (kmock + tests/support/kube_fixture.py,
whose kubelet runs each job pod's command as a local process): a cordoned node is drained (its
job's pod is deleted with the grace period, the job checkpoints and resumes on another node), a
NotReady one has failed (its job's pod is deleted at once, the job resumes from its checkpoint)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hub, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kube_hub(tmp_path_factory):
    from hub_harness import Hub
    from kube_fixture import KubeCluster, service_config

    tmp = tmp_path_factory.mktemp("kubenodes")
    with KubeCluster(run_jobs=True) as cluster:
        for name in ("n1", "n2"):
            cluster.add_node(name, 1, product="NVIDIA-L4", memory_mib=16384)
        extra = service_config(cluster, tmp, "bob")
        hub = Hub(tmp, gpupool={"nodes": [], "preemption_grace": 10,
                                "backend": "gpupool.backends.kubernetes.KubeJobBackend"}, users=["bob"],
                  extra_config=extra)
        with hub:
            shutil.copy(ROOT / "examples" / "train_checkpoint.ipynb", hub.home("bob") / "train_checkpoint.ipynb")
            yield hub, cluster


def _steps(path: Path) -> list[tuple[int, int]]:
    return [(int(a), int(s)) for a, s in re.findall(r"attempt=(\d+) step=(\d+)", path.read_text())]


def test_a_cordoned_node_is_drained_and_a_notready_one_has_failed(kube_hub):
    hub, cluster = kube_hub
    bob = hub.token("bob")

    def node_view(name):
        return {n["name"]: n for n in hub.api("GET", "nodes", hub.admin_token).json()["nodes"]}[name]

    def on():
        return [p["node"] for p in hub.api("GET", f"jobs/{jid}", bob).json()["allocation"]]

    def attempt(n):
        return hub.wait_for(lambda: (lambda j: j if j["attempts"] == n and j["status"] == "running" else None)(
            hub.api("GET", f"jobs/{jid}", bob).json()), 90, message=f"attempt {n} did not run")

    record = hub.home("bob") / "kube-steps.txt"
    r = hub.api("POST", "jobs", bob, json={"notebook": "train_checkpoint.ipynb", "gpus": 1, "parameters": {
        "steps": 60, "step_seconds": 0.25, "steps_file": record.name}})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    first = attempt(1)
    [x] = on()
    y = "n2" if x == "n1" else "n1"
    hub.wait_for(lambda: record.exists() and len(_steps(record)) >= 4, 90)
    try:
        # cordoned: drained. The pod is deleted with the grace period (10 s + kill_after 2 s), the job
        # saves when it sees the stop request, and it resumes on the other node
        cluster.patch_node(x, {"spec": {"unschedulable": True}})
        preempting = hub.wait_job(bob, jid, {"preempting"}, 30)
        assert preempting["reason"].startswith(f"its node {x} is being drained (cordoned in Kubernetes); it has 10 s")
        second = attempt(2)
        assert on() == [y] and second["preemptions"] == 1, second
        view = node_view(x)
        assert (view["state"], view["state_reason"], view["state_source"]) == ("drained", "cordoned in Kubernetes",
                                                                               "kubernetes")
        gone = [d for d in cluster.deletions if d["labels"].get("gpupool.io/job-id") == jid]
        assert [d["grace"] for d in gone] == [12], gone
        cluster.patch_node(x, {"spec": {"unschedulable": False}})
        hub.wait_for(lambda: node_view(x)["state"] == "up", 30)

        # NotReady: failed. The pod is deleted at once and the job requeued without waiting for it
        hub.wait_for(lambda: len([s for a, s in _steps(record) if a == 2]) >= 2, 90)
        steps_before = len(_steps(record))
        cluster.patch_node(y, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        third = attempt(3)
        assert on() == [x] and third["preemptions"] == 2, third
        assert node_view(y)["state"] == "failed" and node_view(y)["state_reason"] == "NotReady in Kubernetes"
        gone = [d for d in cluster.deletions if d["labels"].get("gpupool.io/job-id") == jid]
        assert [d["grace"] for d in gone][1:] == [0], gone
        r = hub.api("POST", f"nodes/{y}/return", hub.admin_token)
        assert r.status_code == 409 and "NotReady in Kubernetes" in r.json()["message"], r.text
        final = hub.wait_job(bob, jid, {"succeeded", "failed"}, 150)
        assert final["status"] == "succeeded" and final["attempts"] == 3, final
        steps = _steps(record)
        assert len(steps) > steps_before and sorted({s for _, s in steps}) == list(range(60)), steps
        # only the step in progress can run twice (the notebook saves after every step)
        three = [s for a, s in steps if a == 3]
        assert three[0] >= max(s for a, s in steps if a == 2), steps
        assert len(steps) - 60 <= 1, steps
        log = hub.api("GET", f"jobs/{jid}/log", bob).text
        assert f"asked to stop (its node {x} is being drained (cordoned in Kubernetes)" in log
    finally:
        cluster.patch_node(x, {"spec": {"unschedulable": False}})
        cluster.patch_node(y, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert first["allocation"] != second["allocation"]
