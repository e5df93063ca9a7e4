"""Against a real cluster (opt-in): ``KUBECONFIG=... pytest -m kubernetes tests/kube/test_kube_real.py``.

Skipped unless KUBECONFIG is set. Uses the namespace $GPUPOOL_TEST_NAMESPACE (default
``gpupool-test``), which it creates and deletes. $GPUPOOL_TEST_IMAGE (default
``python:3.12-slim``) is the job image: without gpupool in it the job pod fails at once, which
still exercises create / schedule / poll / logs / delete; with gpupool (e.g. the chart's hub image)
the notebook of the job runs for real if $GPUPOOL_TEST_JOBS_CLAIM names a PVC that is also
mounted here at the same path (rarely the case on a laptop).
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

pytestmark = [pytest.mark.kubernetes,
              pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster")]

NS = os.environ.get("GPUPOOL_TEST_NAMESPACE", "gpupool-test")
IMAGE = os.environ.get("GPUPOOL_TEST_IMAGE", "python:3.12-slim")


@pytest.fixture(scope="module")
def namespace():
    from kubernetes import client, config

    config.load_kube_config()
    core = client.CoreV1Api()
    try:
        core.create_namespace({"metadata": {"name": NS, "labels": {"gpupool.io/test": "true"}}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    yield NS
    core.delete_namespace(NS)


def _settings(**kw):
    from gpupool.backends.kubernetes import GPUPoolKubernetes

    return GPUPoolKubernetes(kubeconfig=os.environ["KUBECONFIG"], namespace=NS, image=IMAGE, home_claim="",
                             jobs_claim=os.environ.get("GPUPOOL_TEST_JOBS_CLAIM", ""), image_from_workspace=False,
                             pending_timeout=120, **kw)


async def test_inventory_matches_the_api(namespace):
    from kubernetes import client, config
    from kubernetes_asyncio.client import ApiClient

    from gpupool.backends.kubernetes import KubeInventory, client_configuration

    config.load_kube_config()
    names = {n.metadata.name for n in client.CoreV1Api().list_node().items}
    s = _settings(gpu_nodes_only=False)
    api = ApiClient(configuration=await client_configuration(s))
    inv = KubeInventory(s, api)
    try:
        await inv.start()
        snap = inv.snapshot()
        assert {n.name for n in snap.nodes} == names
        for n in snap.nodes:
            assert n.gpus >= 0 and (n.schedulable or n.name in snap.why_unschedulable)
    finally:
        await inv.stop()
        await api.close()


class _Pool:
    preemption_grace = 5.0
    kill_after = 2.0


class _Settings:
    def __init__(self):
        self.pool = _Pool()
        self.nodes = []
        self.gpu_uuids = {}


async def test_job_pod_lifecycle_on_a_real_node(namespace, tmp_path):
    from gpupool.backends.base import EXITED, LOST, RUNNING, JobSpec
    from gpupool.backends.kubernetes import KubeJobBackend

    settings = _Settings()
    backend = KubeJobBackend(settings, kube=_settings())
    ready = [n for n in settings.nodes if n.schedulable] or settings.nodes
    if not ready:
        pytest.skip("the cluster has no GPU node (the backend's inventory lists GPU nodes only)")
    node = ready[0].name
    job = f"j-test{uuid.uuid4().hex[:6]}"
    jdir = str(tmp_path / job)
    spec = JobSpec(job_id=job, run_id=f"{job}.0", attempt=0, user="tester", notebook=f"{jdir}/input.ipynb",
                   output=f"{jdir}/output.ipynb", log=f"{jdir}/log.txt", parameters={}, workdir="/tmp", job_dir=jdir,
                   checkpoint_dir=f"{jdir}/checkpoints", stop_file=f"{jdir}/control/stop",
                   placements=[{"pod": 0, "node": node, "gpus": [0], "fraction": 0.5}])
    try:
        handle = await backend.start(spec)
        deadline = time.monotonic() + 180
        while True:  # scheduled onto the chosen node (the pod may already have ended: no gpupool in the image)
            state = await backend.poll(handle)
            pod = await backend._current(handle) or backend._last.get(spec.run_id) or {}
            if pod.get("spec", {}).get("nodeName") or state.state != RUNNING:
                break
            assert time.monotonic() < deadline, f"the pod was not scheduled: {state.detail}"
            await asyncio.sleep(1)
        assert pod["spec"]["nodeName"] == node
        other = KubeJobBackend(_Settings(), kube=_settings(discovery="declared"))
        try:
            adopted, st = await other.adopt(spec, None)
            assert st.state in (RUNNING, EXITED, LOST)
            if adopted:
                assert adopted["pod"] == handle["pod"]
        finally:
            await other.close()
        await backend.request_checkpoint(handle, spec, reason="test")
        while (await backend.poll(handle)).state == RUNNING:
            assert time.monotonic() < deadline + 60
            await asyncio.sleep(1)
    finally:
        try:
            await backend.terminate(handle, force=True)
        except Exception:
            pass
        await backend.close()
