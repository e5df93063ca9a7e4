"""Simulated GPU readings of a declared inventory (hub_ext/runtime/simulated.py): a running job's
GPUs read busy, a workspace's while the hub saw its server active lately, everything else 0 %; they
feed the idle rules, whose reasons say they are simulated. (Through the real hub: test_hub_demo_idle.py.)"""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

QUEUES = [{"name": "vision", "deserved": {"gpu": 4}, "users": ["alice"]}]
T0 = 1_800_000_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


@pytest.fixture
def pool(tmp_path):
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load as load_config

    def make(**more):
        settings = load_config({"nodes": [{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}], "queues": QUEUES,
                                "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
                                "work_dir": str(tmp_path), "run_as_user": False, "simulated_gpu_readings": True,
                                "simulated_activity_seconds": 60, **more}, discover=False)
        sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
        return settings, sessions
    return make


def add(sessions, **kw):
    from gpupool.hub_ext import store as D

    row = dict(type=D.JOB, kind="train", user="alice", queue="vision", gpus=1.0, submitted_at=T0, started_at=T0,
               parameters={}, status="running", attempt=1, reason="", server="")
    row.update(kw)
    with sessions() as s:
        s.add(D.Workload(**row))
        s.commit()


def test_running_jobs_and_active_workspaces_read_busy_the_rest_zero(pool):
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.runtime.simulated import SimulatedReadings

    settings, sessions = pool()
    add(sessions, allocation=[{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}])  # a running job
    add(sessions, status="starting", allocation=[{"pod": 0, "node": "box", "gpus": [1], "fraction": 1.0}])
    add(sessions, type=D.WORKSPACE, kind="interactive", server="", gpus=0.5, started_at=T0 - 3600,
        allocation=[{"pod": 0, "node": "box", "gpus": [2], "fraction": 0.5}])
    add(sessions, type=D.WORKSPACE, kind="interactive", server="big", started_at=T0 - 3600,
        allocation=[{"pod": 0, "node": "box", "gpus": [3], "fraction": 1.0}])
    now = [T0]
    activity = {("alice", ""): iso(T0 - 30), ("alice", "big"): iso(T0 - 61)}
    sim = SimulatedReadings(settings, sessions, activity, clock=lambda: now[0])
    util = {i: r["utilization"] for i, r in sim.read()["box"].items()}
    # the job runs (100 %), the starting one not yet (0 %), alice's server was active 30 s ago (its half
    # of the GPU: 50 %), her other one 61 s ago, past the 60 s of simulated_activity_seconds (0 %)
    assert util == {0: 100.0, 1: 0.0, 2: 50.0, 3: 0.0}
    assert sim.read()["box"][0] == {"utilization": 100.0, "memory_used": None, "memory_total": 24 * 2**30}
    now[0] += 31  # nothing new from the hub: alice's default server is idle too
    assert sim.read()["box"][2]["utilization"] == 0.0
    activity[("alice", "big")] = iso(now[0] - 1)  # she works in it again
    assert sim.read()["box"][3]["utilization"] == 100.0
    # a server that just started, before the hub reported any activity of it, is active
    add(sessions, type=D.WORKSPACE, kind="interactive", server="new", started_at=now[0] - 5,
        allocation=[{"pod": 0, "node": "box", "gpus": [1], "fraction": 1.0}])
    assert sim.read()["box"][1]["utilization"] == 100.0


def test_only_gpus_without_real_readings_are_simulated(pool):
    from gpupool.hub_ext.runtime.simulated import SimulatedReadings

    settings, sessions = pool()
    sim = SimulatedReadings(settings, sessions, {})
    assert [n.name for n in sim.nodes()] == ["box"]
    settings.gpu_uuids["box"] = ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]  # NVML reads it: real readings only
    assert sim.nodes() == [] and sim.read() == {}


def test_the_knobs_are_checked(pool):
    from gpupool.hub_ext.config import GPUPoolConfigError

    with pytest.raises(GPUPoolConfigError, match=r"c.GPUPool.simulated_activity_seconds: must be > 0"):
        pool(simulated_activity_seconds=0)


async def test_an_idle_workspace_on_simulated_readings_is_suspended_and_the_reason_says_simulated(pool):
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.runtime.idle import IdleChecker
    from gpupool.hub_ext.runtime.loop import SchedulerLoop
    from gpupool.hub_ext.runtime.sampling import Sampler
    from gpupool.hub_ext.runtime.simulated import SimulatedReadings

    settings, sessions = pool(idle_rules={"*": {"interactive": {"after": 90}}})
    now = [T0]
    add(sessions, type=D.WORKSPACE, kind="interactive", server="", started_at=T0, preemptible=False,
        allocation=[{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}])
    activity = {("alice", ""): iso(T0)}
    sim = SimulatedReadings(settings, sessions, activity, clock=lambda: now[0])
    sampler = Sampler(sessions, sim.read, 10, 86400, 300, 86400, clock=lambda: now[0])
    checker = IdleChecker(SchedulerLoop(settings, sessions, LocalBackend()), sessions, settings.idle_rules, 30,
                          clock=lambda: now[0], simulated={n.name for n in sim.nodes()})

    def advance(seconds):
        for _ in range(int(seconds // 10)):
            now[0] += 10
            sampler.sample()

    advance(120)  # active for its first 60 s: not idle for 90 s yet
    assert await checker.tick() == []
    advance(40)
    assert await checker.tick() == ["w-000001"]
    with sessions() as s:
        [sus] = s.query(D.Suspension).all()
    assert sus.reason.startswith("suspended: its GPU stayed idle (0 % simulated utilisation: no activity seen) "
                                 "for 1 min 30 s (the pool's rule for interactive workspaces)"), sus.reason


def test_gpupool_top_labels_simulated_readings():
    from gpupool.client.cli import gpu_map

    gpu = {"index": 0, "allocated": 1.0, "utilization": 0.0, "memory_used": None, "allocations": []}
    assert "0% (simulated)" in gpu_map([{"name": "demo", "readings": "simulated", "gpus": [gpu]}])
    real = gpu_map([{"name": "box", "readings": "nvml", "gpus": [gpu]}])
    assert "0%" in real and "simulated" not in real


def test_the_demo_turns_simulated_readings_on_for_declared_gpus_only(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    from gpupool.hub_ext import demo_config

    def settings(gpus):
        path = demo_config.write_demo(tmp_path / gpus, demo_config.DemoOptions(gpus=gpus))
        return PyFileConfigLoader(path.name, path=str(path.parent)).load_config().GPUPool

    declared = settings("declared")
    assert declared.simulated_gpu_readings is True and declared.simulated_activity_seconds == 600
    assert declared.idle_rules["*"]["interactive"] == {"after": "30m"}
    assert "simulated_gpu_readings" not in settings("real")  # real GPUs: NVML's readings only
    assert "SIMULATED readings" in demo_config.banner(demo_config.DemoOptions())
    assert "SIMULATED" not in demo_config.banner(demo_config.DemoOptions(gpus="real"))
