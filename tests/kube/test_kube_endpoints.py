"""Endpoints on the Kubernetes backend: each replica a pod serving on ``$PORT`` with a readiness
probe, a ClusterIP Service in front of them that the gpupool service proxies to, the runner's
bounded restarts; against the test API (kmock)."""
from __future__ import annotations

import kubernetes_validate
import pytest
from kube_fixture import KubeCluster
from kube_harness import GANG, K8S_VERSION, Settings, env_of, job_spec, live_services, wait_for

from gpupool.backends import kube_manifests as km
from gpupool.backends.base import endpoint_targets
from gpupool.backends.kubernetes import GPUPoolKubernetes, KubeJobBackend


def _spec(tmp_path, pods=2):
    spec = job_spec(tmp_path / "jobs", job_id="j-000009", attempt=1, placements=GANG[:pods])
    spec.command, spec.pods, spec.kind = ["python", "serve.py"], pods, "inference"
    spec.endpoint, spec.max_restarts = True, 3
    return spec


def test_replica_pods_and_their_service_are_valid_kubernetes(tmp_path):
    b = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(discovery="declared", namespace="jobs", image="img",
                                                          home_claim="", jobs_claim=""))
    spec = _spec(tmp_path)
    pods = [km.job_pod_manifest(b.pod_spec(spec, "img", rank)) for rank in (0, 1)]
    for pod in pods:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        container = pod["spec"]["containers"][0]
        assert env_of(pod)["PORT"] == "8000" and container["ports"][0]["containerPort"] == 8000
        assert container["readinessProbe"]["httpGet"] == {"path": "/", "port": 8000}
        args = container["args"]
        assert args[args.index("--restarts") + 1] == "3"
        assert "MASTER_ADDR" not in env_of(pod)  # replicas are independent: no rendezvous
    assert pods[1]["spec"]["containers"][0]["args"][pods[1]["spec"]["containers"][0]["args"].index(
        "--restarts-file") + 1] == f"{spec.job_dir}/runs/1/restarts-rank1"
    created = dict(pods[0], metadata=dict(pods[0]["metadata"], uid="0b5a3f9e-8d6c-4a1e-9f3b-2c7d1e0a4b6f"))
    svc = km.endpoint_service_manifest(created, spec.run_id, 8000)
    kubernetes_validate.validate(svc, K8S_VERSION, strict=True)
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["ports"][0]["targetPort"] == 8000
    assert all(p["metadata"]["labels"][k] == v for p in pods for k, v in svc["spec"]["selector"].items())


@pytest.fixture
async def backend(tmp_path):
    with KubeCluster() as cluster:
        cluster.add_node("n1", 2)
        cluster.add_node("n2", 2)
        b = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(api_host=cluster.url, namespace="jobs", image="img",
                                                              home_claim="", jobs_claim=""))
        await b.start_watching()
        try:
            yield b, cluster
        finally:
            await b.close()


async def test_an_endpoint_starts_its_replicas_behind_one_service(backend, tmp_path):
    b, cluster = backend
    spec = _spec(tmp_path)
    handle = await b.start(spec)

    async def both():
        found = cluster.pods("jobs", "gpupool.io/managed=true")
        return found if len(found) == 2 else None
    pods = await wait_for(both, 30)
    services = live_services(cluster)
    assert [s["metadata"]["name"] for s in services] == [km.endpoint_service_name(spec.run_id)]
    assert all(p["metadata"]["labels"][k] == v for p in pods for k, v in services[0]["spec"]["selector"].items())
    assert endpoint_targets(handle) == [f"http://{km.endpoint_service_name(spec.run_id)}.jobs.svc:8000"]
    assert len(handle["workers"]) == 1
    await b.terminate(handle, force=True)
