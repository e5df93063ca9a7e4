"""GPUPoolKubeSpawner end to end: a real gpupool service (in a real JupyterHub, tests/support/hub_harness.py)
admits the server, real KubeSpawner 7 creates the pod on the test Kubernetes API (kmock + the
fake kubelet of tests/support/kube_fixture.py), polls it and deletes it; the pod is pinned to the node the
scheduler chose, with the right GPU resources, environment and labels."""
from __future__ import annotations

import asyncio
import json

import kubernetes_validate
import pytest
from hub_harness import Hub
from jupyterhub.objects import Hub as HubObject
from jupyterhub.objects import Server
from jupyterhub.spawner import SpawnException
from kube_fixture import kube  # noqa: F401  (fixture)
from traitlets.config import Config

from gpupool.spawner.kube import GPUPoolKubeSpawner

pytestmark = [pytest.mark.hub, pytest.mark.slow]

NODES = [{"name": "n1", "gpus": 4, "gpu_memory": "80Gi", "gpu_model": "A100"},
         {"name": "n2", "gpus": 2, "gpu_memory": "80Gi", "gpu_model": "A100"}]
QUEUES = [{"name": "vision", "deserved": {"gpu": 4}, "users": ["alice"]},
          {"name": "nlp", "deserved": {"gpu": 2}, "users": ["bob"]}]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with Hub(tmp_path_factory.mktemp("kubehub"), gpupool={"nodes": NODES, "queues": QUEUES},
             users=["alice", "bob"]) as h:
        yield h


class User:
    def __init__(self, name: str):
        self.name = name
        self.id = 7
        self.admin = False
        self.groups = []
        self.url = f"/user/{name}/"
        self.escaped_name = name
        self.server = Server()
        self.orm_user = None

    def __repr__(self) -> str:
        return f"User({self.name})"


def make_spawner(hub, kube, user="alice", **traits) -> GPUPoolKubeSpawner:
    c = Config()
    c.GPUPoolKubeSpawner.gpupool_url = hub.service_url
    c.GPUPoolKubeSpawner.gpupool_token = hub.service_token
    c.GPUPoolKubeSpawner.admission_poll_interval = 0.1
    c.GPUPoolKubeSpawner.admission_timeout = 20
    c.KubeSpawner.k8s_api_host = kube.url
    c.KubeSpawner.namespace = "hub"
    c.KubeSpawner.storage_pvc_ensure = False
    c.KubeSpawner.start_timeout = 30
    c.KubeSpawner.http_timeout = 10
    for k, v in traits.items():
        setattr(c.GPUPoolKubeSpawner, k, v)
    sp = GPUPoolKubeSpawner(config=c, user=User(user), hub=HubObject(), api_token="tok", oauth_client_id="client",
                            _mock=False)
    return sp


async def stop_reflectors() -> None:
    for key, reflector in list(GPUPoolKubeSpawner.reflectors.items()):
        await reflector.stop()
        GPUPoolKubeSpawner.reflectors.pop(key, None)


def created_pods(kube) -> list[dict]:
    return [r.data for r in kube.requests if r.method == "POST" and r.url.path.endswith("/pods")]


def env_of(pod: dict) -> dict:
    c = next(c for c in pod["spec"]["containers"] if c["name"] == "notebook")
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def workspace(hub, user="alice") -> dict | None:
    r = hub.api("GET", "workspaces", hub.service_token)
    return next((w for w in r.json()["workspaces"] if w["user"] == user), None)


async def test_whole_gpus_pinned_start_poll_stop(hub, kube):
    kube.add_node("n1", 4)
    kube.add_node("n2", 2)
    sp = make_spawner(hub, kube)
    sp.user_options = {"gpus": 2, "queue": "vision"}
    try:
        url = await asyncio.wait_for(sp.start(), 40)
        assert url.startswith("http://10.0.0.")
        ws = workspace(hub)
        assert ws["status"] == "running" and ws["gpus"] == 2
        node = ws["allocation"][0]["node"]
        pod = kube.pod(sp.pod_name, "hub")
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == node
        sent = created_pods(kube)[-1]
        kubernetes_validate.validate(sent, "1.32.0", strict=True)
        terms = sent["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        nb = next(c for c in sent["spec"]["containers"] if c["name"] == "notebook")
        assert nb["resources"]["limits"]["nvidia.com/gpu"] == "2"
        env = env_of(sent)
        assert "CUDA_VISIBLE_DEVICES" not in env and "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin's job
        assert env["GPUPOOL_GPUS"] == ",".join(str(g) for g in ws["allocation"][0]["gpus"])
        labels = sent["metadata"]["labels"]
        assert labels["gpupool.io/managed"] == "true" and labels["gpupool.io/queue"] == "vision"
        assert labels["gpupool.io/component"] == "workspace" and labels["gpupool.io/user"] == "alice"
        assert labels["component"] == "singleuser-server"  # KubeSpawner's own labels are kept
        assert json.loads(sent["metadata"]["annotations"]["gpupool.io/placement"])[0]["node"] == node
        assert any(t["key"] == "nvidia.com/gpu" for t in sent["spec"]["tolerations"])

        assert await sp.poll() is None
        await asyncio.wait_for(sp.stop(), 30)
        assert kube.pod(sp.pod_name, "hub") is None
        assert workspace(hub) is None  # the GPUs are free again
        assert any(d["name"] == sp.pod_name for d in kube.deletions)
    finally:
        if sp.gpupool_workspace:
            await sp.release()
        await stop_reflectors()


async def test_fraction_profile_pins_the_gpu_uuid(hub, kube):
    kube.add_node("n1", 4, uuids=["GPU-n1-0", "GPU-n1-1", "GPU-n1-2", "GPU-n1-3"])
    kube.add_node("n2", 2, uuids=["GPU-n2-0", "GPU-n2-1"])
    profiles = [
        {"display_name": "CPU only", "slug": "cpu", "default": True},
        {"display_name": "Half a GPU (vision)", "slug": "half",
         "kubespawner_override": {"gpupool": {"gpus": 0.5, "queue": "vision"}, "image": "lab/pytorch:2.4"}},
    ]
    sp = make_spawner(hub, kube, profile_list=profiles, gpu_runtime_class="nvidia")
    sp.user_options = {"profile": "half"}
    try:
        await asyncio.wait_for(sp.start(), 40)
        ws = workspace(hub)
        alloc = ws["allocation"][0]
        assert alloc["fraction"] == 0.5 and ws["queue"] == "vision", ws
        sent = created_pods(kube)[-1]
        kubernetes_validate.validate(sent, "1.32.0", strict=True)
        nb = next(c for c in sent["spec"]["containers"] if c["name"] == "notebook")
        assert nb["image"] == "lab/pytorch:2.4"  # the profile's other overrides still apply
        assert "nvidia.com/gpu" not in json.dumps(nb.get("resources") or {})
        env = env_of(sent)
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{alloc['node']}-{alloc['gpus'][0]}"
        assert env["GPUPOOL_GPU_FRACTION"] == "0.5" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.500"
        assert "CUDA_VISIBLE_DEVICES" not in env
        assert sent["spec"]["runtimeClassName"] == "nvidia"
        assert sent["metadata"]["annotations"]["gpupool.io/gpu-ids"] == env["NVIDIA_VISIBLE_DEVICES"]
        await asyncio.wait_for(sp.stop(), 30)
        assert workspace(hub) is None

        # the CPU profile does not go through the scheduler and gets no GPU
        sp.user_options = {"profile": "cpu"}
        await asyncio.wait_for(sp.start(), 40)
        sent = created_pods(kube)[-1]
        assert "gpupool.io/managed" not in sent["metadata"]["labels"]
        assert env_of(sent)["CUDA_VISIBLE_DEVICES"] == "" and env_of(sent)["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert workspace(hub) is None
        await asyncio.wait_for(sp.stop(), 30)
    finally:
        if sp.gpupool_workspace:
            await sp.release()
        await stop_reflectors()


async def test_bad_requests_are_refused_with_the_field(hub, kube):
    kube.add_node("n1", 4)
    profiles = [{"display_name": "Broken", "slug": "broken", "kubespawner_override": {"gpupool": {"gpu": 1}}},
                {"display_name": "Ok", "slug": "ok", "default": True},
                {"display_name": "GPU (vision)", "slug": "gpu", "kubespawner_override": {"gpupool": {"queue": "vision"}},
                 "profile_options": {"size": {"display_name": "GPUs", "choices": {
                     "half": {"display_name": "half", "kubespawner_override": {"gpupool": {"gpus": 0.5}}},
                     "one": {"display_name": "one", "default": True, "kubespawner_override": {"gpupool": {"gpus": 1}}}}}}}]
    sp = make_spawner(hub, kube, profile_list=profiles)
    try:
        with pytest.raises(SpawnException, match="kubespawner_override.gpupool.gpu: unknown key"):
            await sp.validate_gpu_options({"profile": "broken"})
        with pytest.raises(SpawnException, match="profile: No such profile: nope"):
            await sp.validate_gpu_options({"profile": "nope"})
        req = await sp.validate_gpu_options({"profile": "ok"})
        assert not req.wants_gpu
        # a profile option's choice carries the GPU count; the profile the queue
        req = await sp.validate_gpu_options({"profile": "gpu", "size": "half"})
        assert (req.gpus, req.queue) == (0.5, "vision")
        assert (await sp.validate_gpu_options({"profile": "gpu"})).gpus == 1  # the default choice
        plain = make_spawner(hub, kube)
        with pytest.raises(SpawnException) as e:
            await plain.validate_gpu_options({"gpus": 1, "queue": "nlp"})  # bob's queue
        assert "queue" in str(e.value)
    finally:
        await stop_reflectors()
