"""Nodes out of service without a hub: the rules (hub_ext/domain/nodes.py), what each backend finds
by itself (a GPU NVML no longer lists; a Kubernetes node cordoned or NotReady), and the two settings
that came with them (the driver's GPU memory reserve, over-committed departments)."""
from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from kube_fixture import kube  # noqa: F401  (fixture)

from gpupool.contract import NODE_DRAINED, NODE_DRAINING, NODE_FAILED, NODE_UP
from gpupool.hub_ext.domain import nodes as N


def test_fail_outranks_drain_and_a_workload_leaves_whole():
    admin = {"a": N.Out("drain", "by alice"), "b": N.Out("fail", "by alice")}
    found = {"a": N.Out("fail", "NotReady in Kubernetes", "kubernetes"), "b": N.Out("drain", "cordoned", "kubernetes"),
             "c": N.Out("drain", "cordoned", "kubernetes")}
    out = N.merged(admin, found)
    assert {k: (v.action, v.source) for k, v in out.items()} == {
        "a": ("fail", "kubernetes"), "b": ("fail", "admin"), "c": ("drain", "kubernetes")}
    assert N.merged({"c": N.Out("drain", "by bob")}, found)["c"].why == "by bob"  # a tie: the admin's words
    # a gang with one pod on a drained node and one on a failed node leaves for the failure
    gang = [{"pod": 0, "node": "c", "gpus": [0]}, {"pod": 1, "node": "a", "gpus": [0]}]
    assert N.leaving(gang, out) == ("a", out["a"])
    assert N.leaving([{"pod": 0, "node": "z", "gpus": [0]}], out) is None
    assert [N.state(None, True), N.state(out["c"], True), N.state(out["c"], False), N.state(out["a"], False)] == [
        NODE_UP, NODE_DRAINING, NODE_DRAINED, NODE_FAILED]
    assert out["a"].words("a") == "node a failed (NotReady in Kubernetes)"


def test_an_admins_action_is_stored_and_replaced(tmp_path):
    from gpupool.hub_ext import store as D

    sessions = D.make_sessionmaker(D.make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    with sessions() as s:
        N.take_out(s, "a", "drain", "alice", "kernel update", 10.0)
        N.take_out(s, "b", "fail", "", "", 11.0)
        s.commit()
    with sessions() as s:
        got = N.load(s)
        assert got == {"a": N.Out("drain", "by alice: kernel update", "admin", 10.0),
                       "b": N.Out("fail", "by an admin", "admin", 11.0)}
        N.take_out(s, "a", "fail", "bob", "", 20.0)  # a fail after a drain: since when it failed
        assert N.bring_back(s, "b") and not N.bring_back(s, "b")
        s.commit()
    with sessions() as s:
        assert N.load(s) == {"a": N.Out("fail", "by bob", "admin", 20.0)}


async def test_the_local_backend_fails_a_node_whose_gpu_nvml_no_longer_lists(tmp_path, monkeypatch):
    import nvml_standin

    from gpupool.backends.local import LocalBackend

    path = tmp_path / "nvml.json"
    nvml_standin.write(path, [0.0, 0.0])
    monkeypatch.setenv(nvml_standin.ENV, str(path))
    uuids = ["GPU-00000000-0000", "GPU-00000001-0000"]
    backend = LocalBackend(SimpleNamespace(pool=SimpleNamespace(nvml_module="nvml_standin"),
                                           gpu_uuids={"box": uuids}))
    assert await backend.node_conditions() == {}
    nvml_standin.write(path, [0.0])
    assert await backend.node_conditions() == {}  # one reading is not a failure
    fail = {"box": ("fail", "NVML no longer lists GPU 1 (GPU-00000001-0000)")}
    assert await backend.node_conditions() == fail
    assert await backend.node_conditions() == fail
    path.write_text("not json")  # NVML gone altogether: both GPUs, after two readings
    assert await backend.node_conditions() == fail
    assert await backend.node_conditions() == {"box": ("fail", "NVML no longer lists GPU 0 (GPU-00000000-0000), "
                                                               "GPU 1 (GPU-00000001-0000)")}
    nvml_standin.write(path, [0.0, 0.0])
    assert await backend.node_conditions() == {}  # back at once
    # a declared inventory (no GPU found through NVML) is never failed this way
    assert await LocalBackend(SimpleNamespace(pool=None, gpu_uuids={})).node_conditions() == {}


async def test_kubernetes_fails_a_notready_node_and_drains_a_cordoned_one(kube):  # noqa: F811
    from gpupool.backends.kubernetes import GPUPoolKubernetes, KubeJobBackend

    kube.add_node("n1", 2)
    kube.add_node("n2", 2)
    b = KubeJobBackend(None, kube=GPUPoolKubernetes(api_host=kube.url, namespace="jobs", image="img"))
    try:
        await b.start_watching()
        assert await b.node_conditions() == {}

        async def until(want):
            for _ in range(250):
                got = await b.node_conditions()
                if got == want:
                    return
                await asyncio.sleep(0.02)
            assert got == want

        kube.patch_node("n1", {"spec": {"unschedulable": True}})
        await until({"n1": ("drain", "cordoned in Kubernetes")})
        kube.patch_node("n2", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        await until({"n1": ("drain", "cordoned in Kubernetes"), "n2": ("fail", "NotReady in Kubernetes")})
        kube.patch_node("n1", {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
        await until({"n1": ("fail", "NotReady in Kubernetes"), "n2": ("fail", "NotReady in Kubernetes")})
        kube.patch_node("n1", {"spec": {"unschedulable": False},
                               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        kube.patch_node("n2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        await until({})
    finally:
        await b.close()


def test_the_gpu_memory_reserve_reaches_the_scheduler_and_the_submission_check(tmp_path):
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import GPUPoolConfigError, load
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    base = {"nodes": [{"name": "box", "gpus": 1, "gpu_memory": "16Gi"}], "db_url": f"sqlite:///{tmp_path / 'db'}",
            "job_root": str(tmp_path / "jobs")}
    settings = load(base)
    assert (settings.pool.gpu_memory_reserve, settings.pool.gpu_memory_reserve_min) == (0.03, "256Mi")
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    loop = SchedulerLoop(settings, sessions, LocalBackend(settings))
    core = loop.decider.config.scheduler
    assert (core.gpu_memory_reserve, core.gpu_memory_reserve_min) == (0.03, 256 * 2**20)
    from gpupool.hub_ext.domain.submission import Submissions
    assert Submissions.max_gpu_memory.fget(SimpleNamespace(settings=settings)) == 16 * 2**30 - math.ceil(0.03 * 16 * 2**30)
    small = load({**base, "nodes": [{"name": "box", "gpus": 1, "gpu_memory": "4Gi"}], "gpu_memory_reserve": 0.01,
                  "gpu_memory_reserve_min": "1Gi"})
    assert Submissions.max_gpu_memory.fget(SimpleNamespace(settings=small)) == 3 * 2**30  # the minimum wins
    core = SchedulerLoop(small, sessions, LocalBackend(small)).decider.config.scheduler
    assert (core.gpu_memory_reserve, core.gpu_memory_reserve_min) == (0.01, 2**30)
    with pytest.raises(GPUPoolConfigError) as e:
        load({**base, "gpu_memory_reserve": 1.0, "gpu_memory_reserve_min": "lots"})
    assert str(e.value).splitlines() == [
        "c.GPUPool.gpu_memory_reserve: must be a fraction, at least 0 and below 1 (e.g. 0.03)",
        "c.GPUPool.gpu_memory_reserve_min: 'lots' is not a quantity such as 24Gi"]


def test_departments_deserving_less_than_their_projects_are_a_warning_not_an_error():
    from gpupool.hub_ext.config import check

    queues = [{"name": "d", "deserved": {"gpu": 8}}, {"name": "p", "parent": "d", "deserved": {"gpu": 6}},
              {"name": "q", "parent": "d", "deserved": {"gpu": 10}}, {"name": "e", "deserved": {"gpu": 4}}]
    errors, warnings = check({"queues": queues, "nodes": [{"name": "n", "gpus": 8}]})
    tail = ("(over-committed: when every queue wants its share, the guarantees shrink in proportion and some get "
            "less than they deserve; the hub starts)")
    assert errors == [] and warnings == [
        f"c.GPUPool.queues: the top-level queues deserve 12 GPUs but there are 8 {tail}",
        f"c.GPUPool.queues: the children of 'd' deserve 16 GPUs in all, more than its 8 {tail}"]
    # the nodes not known yet (NVML, before the hub runs): the departments are still checked
    errors, warnings = check({"queues": queues}, discover=False)
    assert errors == [] and warnings == [f"c.GPUPool.queues: the children of 'd' deserve 16 GPUs in all, more than "
                                         f"its 8 {tail}"]



def test_the_cli_shows_a_nodes_state():
    from gpupool.client.cli import _node_state, gpu_map

    drained = {"name": "a", "state": "draining", "state_reason": "by alice: kernel update", "schedulable": False,
               "unschedulable_reason": "by alice: kernel update", "gpus": [{"index": 0, "allocated": 1}]}
    cordoned = {"name": "k", "schedulable": False, "unschedulable_reason": "cordoned", "gpus": []}  # an older service
    assert [_node_state(n) for n in (drained, cordoned, {"name": "u", "state": "up"})] == [
        "draining (by alice: kernel update)", "unschedulable (cordoned)", "up"]
    lines = gpu_map([drained, cordoned]).splitlines()
    assert lines[1].startswith("a (draining) ") and lines[2].startswith("k (unschedulable) ")
