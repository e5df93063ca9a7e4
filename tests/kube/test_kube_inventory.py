"""The Kubernetes inventory against a real HTTP Kubernetes API (kmock + tests/support/kube_fixture.py):
nodes and GPUs from the API, cordoned / NotReady nodes, foreign GPU pods subtracted, and watches
(not polling) keeping it current."""
from __future__ import annotations

import asyncio

from kube_fixture import kube  # noqa: F401  (fixture)

from gpupool.backends.kubernetes import GPUPoolKubernetes, KubeInventory, build_inventory, client_configuration
from gpupool.scheduler import Scheduler
from gpupool.scheduler.model import QueueSpec, SchedulerConfig, Snapshot, Workload


async def _inventory(kube, **settings) -> tuple[KubeInventory, object]:
    from kubernetes_asyncio.client import ApiClient

    s = GPUPoolKubernetes(api_host=kube.url, **settings)
    api = ApiClient(configuration=await client_configuration(s))
    inv = KubeInventory(s, api)
    await inv.start()
    return inv, api


async def _changed(inv: KubeInventory, timeout: float = 5.0) -> None:
    await asyncio.wait_for(inv.changed.wait(), timeout)
    inv.changed.clear()


async def _until(pred, timeout: float = 5.0, inv: KubeInventory | None = None) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        if inv is not None:
            try:
                await asyncio.wait_for(inv.changed.wait(), max(0.01, end - loop.time()))
            except asyncio.TimeoutError:
                pass
            inv.changed.clear()
        else:
            await asyncio.sleep(0.02)


async def test_nodes_gpus_topology_and_exclusions(kube):
    kube.add_node("a100-0", 4, labels={"topology.kubernetes.io/zone": "z1", "topology.gpupool.io/rack": "r1"},
                  uuids=["GPU-0", "GPU-1", "GPU-2", "GPU-3"])
    kube.add_node("a100-1", 4, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, labels={"topology.gpupool.io/rack": "r2"})
    kube.add_node("cordoned", 2, unschedulable=True)
    kube.add_node("broken", 2, ready=False)
    kube.add_node("cpu-only", 0)
    inv, api = await _inventory(kube)
    try:
        snap = inv.snapshot()
        by = {n.name: n for n in snap.nodes}
        assert sorted(by) == ["a100-0", "a100-1", "broken", "cordoned"]  # the CPU-only node is left out
        a = by["a100-0"]
        assert (a.gpus, a.gpu_model, a.gpu_memory) == (4, "NVIDIA-A100-SXM4-80GB", 81920 * 2**20)
        assert a.labels["zone"] == "z1" and a.labels["rack"] == "r1" and a.schedulable
        assert by["a100-1"].gpu_model == "NVIDIA-H100-80GB-HBM3" and by["a100-1"].labels["rack"] == "r2"
        assert not by["cordoned"].schedulable and snap.why_unschedulable["cordoned"] == "cordoned"
        assert not by["broken"].schedulable and snap.why_unschedulable["broken"] == "NotReady"
        assert snap.gpu_uuids == {"a100-0": ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]}
        assert a.cpu == 32.0 and a.memory == 256 * 2**30

        # the scheduler never binds to the excluded nodes
        sched = Scheduler(SchedulerConfig())
        work = [Workload(id=f"w{i}", queue="q", gpus=1) for i in range(12)]
        res = sched.schedule(Snapshot(now=0, nodes=snap.nodes, queues=[QueueSpec("q", deserved={"gpu": 8})],
                                      workloads=work))
        used = {p.node for b in res.binds for p in b.placements}
        assert used == {"a100-0", "a100-1"} and len(res.binds) == 8
    finally:
        await inv.stop()
        await api.close()


async def test_foreign_pods_are_subtracted_and_watched(kube):
    kube.add_node("n1", 4)
    kube.add_node("n2", 2)
    inv, api = await _inventory(kube)
    try:
        assert {n.name: n.gpus for n in inv.nodes()} == {"n1": 4, "n2": 2}
        # another scheduler's GPU pod on n1: seen through the watch, without a new list
        kube.add_pod("other-training", namespace="ml", node="n1", gpus=3, cpu="4", phase="Running")
        await _until(lambda: {n.name: n.gpus for n in inv.nodes()}["n1"] == 1, inv=inv)
        snap = inv.snapshot()
        assert snap.reserved["n1"]["gpu"] == 3 and snap.reserved["n1"]["cpu"] == 4
        assert next(n for n in snap.nodes if n.name == "n1").cpu == 28.0
        # gpupool's own pods are not "foreign": the scheduler accounts for them itself
        kube.add_pod("gpupool-j-1-0", node="n2", gpus=1, labels={"gpupool.io/managed": "true"}, phase="Running")
        # a finished foreign pod holds nothing
        kube.add_pod("done", node="n2", gpus=1, phase="Succeeded")
        kube.add_pod("marker", node="n2")  # a change we can wait for
        await _until(lambda: any(p.get("metadata", {}).get("name") == "marker" for p in inv._pods.items.values()), inv=inv)
        assert {n.name: n.gpus for n in inv.nodes()}["n2"] == 2
        # cordon n2, then the foreign pod goes away
        kube.patch_node("n2", {"spec": {"unschedulable": True}})
        await _until(lambda: not next(n for n in inv.nodes() if n.name == "n2").schedulable, inv=inv)
        kube.delete_pod("other-training", namespace="ml")
        await _until(lambda: {n.name: n.gpus for n in inv.nodes()}["n1"] == 4, inv=inv)
        assert "n1" not in inv.snapshot().reserved
        lists = [r for r in kube.requests if r.url.path == "/api/v1/nodes" and r.params.get("watch") is None]
        assert len(lists) == 1, "changes must come from the watch, not from listing again"
    finally:
        await inv.stop()
        await api.close()


async def test_a_nodes_pool_is_its_pool_label_and_follows_a_relabel(kube):
    """The node label ``c.GPUPoolKubernetes.pool_label`` (``gpupool.io/pool``) names a node's pool;
    without it the node is in pool ``default``; a relabel reaches the inventory through the watch,
    and the scheduler keeps a workload to its pools."""
    kube.add_node("t4-0", 2, product="Tesla-T4", labels={"gpupool.io/pool": "build"})
    kube.add_node("h100-0", 4, product="NVIDIA-H100-80GB-HBM3", labels={"gpupool.io/pool": "train"})
    kube.add_node("plain", 2)
    inv, api = await _inventory(kube)
    try:
        assert {n.name: n.pool for n in inv.nodes()} == {"t4-0": "build", "h100-0": "train", "plain": "default"}
        kube.patch_node("plain", {"metadata": {"labels": {"gpupool.io/pool": "build"}}})
        await _until(lambda: {n.name: n.pool for n in inv.nodes()}["plain"] == "build", inv=inv)
        sched = Scheduler(SchedulerConfig())
        work = [Workload(id=f"w{i}", queue="q", gpus=1, pools=("build",)) for i in range(6)]
        res = sched.schedule(Snapshot(now=0, nodes=inv.nodes(), queues=[QueueSpec("q", deserved={"gpu": 8})],
                                      workloads=work))
        assert {p.node for b in res.binds for p in b.placements} == {"t4-0", "plain"} and len(res.binds) == 4
    finally:
        await inv.stop()
        await api.close()
    # another label, or none (every node in pool default)
    nodes = [{"metadata": {"name": "n", "labels": {"gpupool.io/pool": "build", "site/pool": "a"}},
              "status": {"allocatable": {"nvidia.com/gpu": "1"}, "conditions": [{"type": "Ready", "status": "True"}]}}]
    assert build_inventory(nodes, [], GPUPoolKubernetes(pool_label="site/pool")).nodes[0].pool == "a"
    assert build_inventory(nodes, [], GPUPoolKubernetes(pool_label="")).nodes[0].pool == "default"


async def test_watch_continues_after_server_timeout(kube):
    """The watch ends after timeoutSeconds (as the API server ends it); the inventory continues
    from the last resourceVersion and sees later changes without listing again."""
    kube.add_node("n1", 2)
    inv, api = await _inventory(kube, watch_timeout=1)
    try:
        await asyncio.sleep(1.5)  # the first watch has ended and a second one is running
        kube.add_node("n2", 8)
        await _until(lambda: any(n.name == "n2" for n in inv.nodes()), inv=inv)
        watches = [r for r in kube.requests if r.url.path == "/api/v1/nodes" and r.params.get("watch")]
        assert len(watches) >= 2 and watches[-1].params.get("resourceVersion") not in (None, "", "0")
        lists = [r for r in kube.requests if r.url.path == "/api/v1/nodes" and r.params.get("watch") is None]
        assert len(lists) == 1
    finally:
        await inv.stop()
        await api.close()


def test_build_inventory_edge_cases():
    nodes = [
        {"metadata": {"name": "gfd-only", "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "T4",
                                                     "nvidia.com/gpu.memory": "15360"}},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "capacity-only"}, "status": {"capacity": {"nvidia.com/gpu": "8"},
                                                          "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "no-ready-condition"}, "status": {"allocatable": {"nvidia.com/gpu": "1"}}},
    ]
    pods = [{"metadata": {"name": "init-heavy"}, "spec": {"nodeName": "capacity-only",
             "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
             "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}}]
    inv = build_inventory(nodes, pods, GPUPoolKubernetes(track_cpu_memory=False))
    by = {n.name: n for n in inv.nodes}
    assert by["gfd-only"].gpus == 2 and by["gfd-only"].gpu_memory == 15360 * 2**20 and by["gfd-only"].gpu_model == "T4"
    assert by["capacity-only"].gpus == 5 and inv.reserved["capacity-only"] == {"gpu": 3.0}
    assert by["capacity-only"].cpu is None and by["capacity-only"].memory is None
    assert not by["no-ready-condition"].schedulable  # no Ready condition: not known to be ready


async def test_backend_exposes_the_live_inventory(kube):
    from gpupool.backends.kubernetes import KubeJobBackend

    kube.add_node("n1", 2, uuids=["GPU-x", "GPU-y"])
    b = KubeJobBackend(None, kube=GPUPoolKubernetes(api_host=kube.url, namespace="jobs", image="img"))
    try:
        assert b.nodes() is None  # not watching yet
        await b.start_watching()
        assert [(n.name, n.gpus) for n in b.nodes()] == [("n1", 2)] and b.gpu_uuids() == {"n1": ["GPU-x", "GPU-y"]}
        b.inventory.changed.clear()
        kube.add_node("n2", 4)
        await _until(lambda: len(b.nodes()) == 2, inv=b.inventory)
    finally:
        await b.close()
