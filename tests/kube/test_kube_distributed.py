"""Distributed jobs on the Kubernetes backend: one pod per worker pinned to the scheduler's
placement, a headless Service for the rendezvous, the torch.distributed environment, against the
test API (kmock) with the fixture kubelet running the ranks as local processes."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import kubernetes_validate
import pytest
from kube_fixture import KubeCluster
from kube_harness import GANG, K8S_VERSION, Settings, env_of, job_spec, live_services, wait_for

from gpupool.backends import kube_manifests as km
from gpupool.backends.base import EXITED, RUNNING, worker_run_id
from gpupool.backends.kubernetes import GPUPoolKubernetes, KubeJobBackend
from gpupool.scheduler.model import PodPlacement
from hub_harness import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def gang(tmp_path):
    """A test API whose kubelet runs job pods' commands, two 2-GPU nodes, and the backend; the
    rendezvous address is this machine (the ranks run here)."""
    with KubeCluster(run_jobs=True) as cluster:
        cluster.add_node("n1", 2)
        cluster.add_node("n2", 2)
        (tmp_path / "home").mkdir()
        b = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(
            api_host=cluster.url, namespace="jobs", image="lab/notebook:1", python=sys.executable, home_claim="",
            home_mount=str(tmp_path / "home"), jobs_claim="", rendezvous_host="127.0.0.1",
            rendezvous_port=free_port()))
        await b.start_watching()
        try:
            yield b, cluster
        finally:
            await b.close()


def _spec(tmp_path, command, job_id="j-000007"):
    spec = job_spec(tmp_path / "jobs", job_id=job_id, attempt=1, placements=GANG)
    spec.command, spec.pods = command, 2
    spec.worker_env = [{"GPUPOOL_GPUS": "1"}, {"GPUPOOL_GPUS": "0"}]
    return spec


def test_worker_pods_and_headless_service_are_valid_kubernetes(tmp_path):
    from gpupool.distributed import worker_env

    b = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(discovery="declared", namespace="jobs", image="img",
                                                          home_claim="", jobs_claim=""))
    spec = _spec(tmp_path, ["python", "train.py", "--lr", "3e-4"])
    service = km.gang_service_name(spec.run_id)
    master = b.kube.rendezvous_host.format(pod=km.job_pod_name(spec.run_id), service=service, namespace="jobs")
    assert master == "gpupool-j-000007-1.gpupool-j-000007-1.jobs.svc"
    pods = [km.job_pod_manifest(b.pod_spec(spec, "img", rank, worker_env(GANG, rank, master, 29500), service))
            for rank in (0, 1)]
    for pod in pods:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert [p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"] for p in pods] == [["n1"], ["n2"]]
    assert [p["metadata"]["name"] for p in pods] == ["gpupool-j-000007-1", "gpupool-j-000007-1-r1"]
    assert {p["spec"]["subdomain"] for p in pods} == {"gpupool-j-000007-1"}
    assert [p["spec"]["hostname"] for p in pods] == [p["metadata"]["name"] for p in pods]
    args = pods[1]["spec"]["containers"][0]["args"]
    assert args[args.index("--") + 1:] == ["python3", "train.py", "--lr", "3e-4"]  # the image's python
    assert args[args.index("--exit-file") + 1] == f"{spec.job_dir}/runs/1/exit-rank1.json"
    assert args[args.index("--log") + 1] == f"{spec.job_dir}/log-rank1.txt"
    assert [env_of(p)["MASTER_ADDR"] for p in pods] == [master, master] and env_of(pods[1])["RANK"] == "1"
    created = dict(pods[0], metadata=dict(pods[0]["metadata"], uid="0b5a3f9e-8d6c-4a1e-9f3b-2c7d1e0a4b6f"))
    svc = km.gang_service_manifest(created, spec.run_id, 29500)
    kubernetes_validate.validate(svc, K8S_VERSION, strict=True)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["metadata"]["name"] == "gpupool-j-000007-1"
    assert all(p["metadata"]["labels"][k] == v for p in pods for k, v in svc["spec"]["selector"].items())


async def test_gang_runs_one_pod_per_worker_with_the_torch_contract(gang, tmp_path):
    """Two DDP workers (gloo) as two pods: each pinned to its placement's node, with the
    rendezvous environment; the kubelet runs them, they all-reduce and train, both succeed."""
    backend, cluster = gang
    record = tmp_path / "record"
    record.mkdir()
    spec = _spec(tmp_path, ["python", str(ROOT / "examples" / "ddp_train.py"), "--steps", "3", "--record", str(record)])
    handle = await backend.start(spec)
    assert len(handle["workers"]) == 1

    async def bound():
        found = cluster.pods("jobs", "gpupool.io/managed=true")
        return found if len(found) == 2 and all(p["spec"].get("nodeName") for p in found) else None
    pods = sorted(await wait_for(bound, 30), key=lambda p: p["metadata"]["labels"]["gpupool.io/rank"])
    assert [p["spec"]["nodeName"] for p in pods] == ["n1", "n2"]  # the scheduler's placement, pod by pod
    envs = [env_of(p) for p in pods]
    port = str(backend.kube.rendezvous_port)
    for rank, env in enumerate(envs):
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == (
            str(rank), "2", "0", "1", str(rank))
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == port
        assert env["GPUPOOL_GPUS"] == str(GANG[rank]["gpus"][0]) and env["GPUPOOL_NODE"] == GANG[rank]["node"]
        assert "GPUPOOL_API_TOKEN" in str(env["GPUPOOL_API_TOKEN"])  # from the worker's own Secret
    services = live_services(cluster)
    assert [s["metadata"]["name"] for s in services] == [pods[0]["spec"]["subdomain"]]
    assert services[0]["spec"]["clusterIP"] == "None"

    async def ended():
        st = await backend.poll(handle)
        return st if st.state != RUNNING else None
    state = await wait_for(ended, 120)
    logs = [Path(spec.worker_log(r)).read_text() for r in (0, 1)]
    assert state.state == EXITED and state.exit_code == 0, (state, logs)
    for rank, log in enumerate(logs):
        assert f"rank {rank}/2: all-reduce 3 == 3" in log and f"rank {rank}: finished 3 steps" in log
    assert Path(spec.checkpoint_dir, "LATEST").exists()  # rank 0 saved


async def test_gang_fails_as_a_unit_and_is_stopped_as_a_unit(gang, tmp_path):
    backend, cluster = gang
    script = tmp_path / "home" / "worker.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1' and sys.argv[1] == 'fail':\n    raise RuntimeError('bad shard')\n"
                      "time.sleep(120)\n")
    failing = _spec(tmp_path, ["python", str(script), "fail"])
    handle = await backend.start(failing)

    async def ended():
        st = await backend.poll(handle)
        return st if st.state != RUNNING else None
    state = await wait_for(ended, 60)
    assert state.state == EXITED and state.exit_code == 1 and state.rank == 1, state
    assert "worker 1 of 2" in state.detail
    # rank 0 (sleeping) was deleted because rank 1 failed
    deleted = {d["name"] for d in cluster.deletions}
    assert "gpupool-j-000007-1" in deleted
    assert "RuntimeError: bad shard" in Path(failing.worker_log(1)).read_text()

    sleeping = _spec(tmp_path, ["python", str(script), "ok"], job_id="j-000008")
    handle = await backend.start(sleeping)
    await wait_for(lambda: _running(cluster, 2), 30)
    await backend.request_checkpoint(handle, sleeping, "preempted: reclaimed by queue vision")
    assert Path(sleeping.stop_file).exists()
    grace = [d["grace"] for d in cluster.deletions if d["labels"].get("gpupool.io/job-id") == "j-000008"]
    assert grace == [4, 4]  # every worker: preemption_grace 3 + kill_after 1
    await backend.terminate(handle, force=True)
    state = await wait_for(ended, 30)
    assert state.state == EXITED and "asked to stop" in state.detail, state
    await wait_for(lambda: _running(cluster, 0), 30)


async def _running(cluster, n):
    return len([p for p in cluster.pods("jobs", "gpupool.io/managed=true")
                if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]) == n
