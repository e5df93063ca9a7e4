"""Tier 2 of fraction enforcement: a fractional worker of the local backend in its own cgroup,
whose GPU memory the NVIDIA driver caps (gpupool/backends/gpu_limits.py), and which tier holds a
workload (hub_ext/runtime/memory.py ``tier``).

No GPU and no r615 driver here: NVML is the stand-in (tests/support/nvml_standin.py FakeNVML), whose
``nvmlDeviceSetMemoryLimits_v1`` records its arguments, and the cgroup hierarchy is a directory
of the test (a ``cgroup.controllers`` file marks it v2). A real worker is started through the
local backend: its runner is moved into the cgroup and starts the program only once it is there.
That the driver then refuses memory past the hard limit is benchmarks/gpu_check.py's, on a GPU."""
from __future__ import annotations

import asyncio
import os
import sys
from types import SimpleNamespace

import pytest

from gpupool.backends import gpu_limits as G
from gpupool.backends.base import EXITED, JobSpec
from gpupool.backends.local import LocalBackend
from gpupool.contract import ENFORCE_DRIVER, ENFORCE_FRAMEWORK, ENFORCE_WATCH
from gpupool.hub_ext.runtime.memory import tier
from nvml_standin import FakeNVML, device

GiB = 2**30


def fake(driver="615.10", **more):
    return FakeNVML([device(0, driver=driver, **more), device(1, driver=driver, **more)])


@pytest.fixture
def cgroups(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")  # a cgroup v2 hierarchy's root
    return str(tmp_path / "gpupool")


def usable(nv, cgroup, index=0, euid=0):
    nv.nvmlInit()
    try:
        return G.driver_tier(nv, index, cgroup, euid=euid)
    finally:
        nv.nvmlShutdown()


def test_the_tier_is_chosen_from_the_machine(cgroups, tmp_path):
    assert usable(fake(), cgroups) == (True, "")
    assert usable(fake(), cgroups, euid=1000) == (False, "the service does not run as root")
    assert usable(fake(), "") == (False, "c.GPUPool.gpu_memory_cgroup is empty")
    assert usable(fake(), str(tmp_path / "v1" / "gpupool"))[1].endswith("is not a cgroup v2 hierarchy")
    assert usable(fake("580.65.06"), cgroups) == (False, "driver 580 is older than r615")
    assert usable(fake(mig=1), cgroups) == (False, "GPU 0 is in MIG mode (MIG partitions are isolated by the hardware)")
    assert usable(fake(mig=0), cgroups) == (True, "")  # MIG capable, not enabled
    assert usable(fake(), cgroups, index=7)[1].startswith("NVML has no GPU 7")
    nv = fake()
    old = SimpleNamespace(**{k: getattr(nv, k) for k in ("nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion",
                                                         "nvmlDeviceGetHandleByIndex")})
    assert usable(old, cgroups) == (False, "this nvidia-ml-py has no nvmlDeviceSetMemoryLimits_v1")
    assert G.driver_version(SimpleNamespace(nvmlSystemGetDriverVersion=lambda: b"615.3")) == 615


def test_the_limits_go_to_the_workers_cgroup(cgroups):
    nv = fake()
    limits = G.CgroupLimits(nv, cgroups, euid=0)
    path = limits.prepare("j-000001.1.abc", 1, hard=12 * GiB, soft=8 * GiB)
    assert path == os.path.join(cgroups, "j-000001.1.abc") and os.path.isdir(path)
    assert nv.limit_calls == [{"uuid": "GPU-00000001-0000", "nameSpace": path, "softLimit": 8 * GiB,
                               "hardLimit": 12 * GiB}]
    limits.prepare("j-000002.1.abc", 0, hard=4 * GiB, soft=6 * GiB)
    assert nv.limit_calls[-1]["softLimit"] == 4 * GiB  # never above the hard limit
    assert nv.inits == nv.shutdowns  # every NVML session closed
    broken = FakeNVML([device(0, driver="615.10", limits_error="Insufficient Permissions")])
    with pytest.raises(Exception, match="Insufficient Permissions"):
        G.CgroupLimits(broken, cgroups, euid=0).prepare("j-000003.1.abc", 0, GiB, GiB)
    assert not os.path.exists(os.path.join(cgroups, "j-000003.1.abc"))  # no cgroup left behind


def _spec(tmp_path, fraction=0.5, cap=None):
    job = tmp_path / "j-000009"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    out = tmp_path / "ran.txt"
    return JobSpec(job_id="j-000009", run_id="j-000009.1.test", attempt=1, user="alice", notebook="", output=str(job / "out"),
                   log=str(job / "log.txt"), parameters={}, workdir=str(work), job_dir=str(job),
                   checkpoint_dir=str(job / "checkpoints"), stop_file=str(job / "control" / "stop"),
                   placements=[{"pod": 0, "node": "box", "gpus": [1], "fraction": fraction}],
                   command=["python", "-c", f"open({str(out)!r}, 'w').write('ran')"], python=sys.executable,
                   gpu_caps=[cap] if cap else []), out


async def _run(backend, spec):
    handle = await backend.start(spec)
    for _ in range(300):
        state = await backend.poll(handle)
        if state.state == EXITED:
            return handle, state
        await asyncio.sleep(0.05)
    raise AssertionError("the worker did not end")


async def test_a_fractional_worker_starts_inside_its_capped_cgroup(tmp_path, cgroups):
    nv = fake()
    backend = LocalBackend(SimpleNamespace(pool=SimpleNamespace(gpu_memory_cgroup=cgroups)))
    backend._limits = G.CgroupLimits(nv, cgroups, euid=0)
    spec, ran = _spec(tmp_path, cap={"gpu": 1, "hard": 12 * GiB, "soft": 8 * GiB})
    handle, state = await _run(backend, spec)
    assert state.exit_code == 0 and ran.read_text() == "ran"
    path = os.path.join(cgroups, "j-000009.1.test")
    assert (handle["enforcement"], handle["cgroup"]) == ("driver", path)
    assert open(os.path.join(path, "cgroup.procs")).read() == str(handle["pid"])  # the runner was moved in
    assert nv.limit_calls == [{"uuid": "GPU-00000001-0000", "nameSpace": path, "softLimit": 8 * GiB,
                               "hardLimit": 12 * GiB}]
    assert "not in the cgroup" not in open(spec.log).read()  # it waited for the move, then ran


async def test_without_the_driver_the_worker_runs_as_before(tmp_path, cgroups):
    nv = fake("550.54.15")
    backend = LocalBackend(SimpleNamespace(pool=SimpleNamespace(gpu_memory_cgroup=cgroups)))
    backend._limits = G.CgroupLimits(nv, cgroups, euid=0)
    spec, ran = _spec(tmp_path, cap={"gpu": 1, "hard": 12 * GiB, "soft": 8 * GiB})
    handle, state = await _run(backend, spec)
    assert state.exit_code == 0 and "enforcement" not in handle and not getattr(nv, "limit_calls", [])
    spec, _ = _spec(tmp_path, fraction=1.0)  # whole GPUs: no cgroup asked for at all
    backend._limits = G.CgroupLimits(fake(), cgroups, euid=0)
    handle, _ = await _run(backend, spec)
    assert "cgroup" not in handle and not getattr(backend._limits.nvml, "limit_calls", [])


def test_the_runner_waits_for_its_cgroup(tmp_path):
    path = tmp_path / "cg"
    path.mkdir()
    (path / "cgroup.procs").write_text("1\n")
    assert not G.wait_inside(str(path), pid=4242, timeout=0.1)
    (path / "cgroup.procs").write_text("1\n4242\n")
    assert G.wait_inside(str(path), pid=4242, timeout=0.1)


def test_which_tier_holds_a_workload():
    half = [{"pod": 0, "node": "box", "gpus": [0], "fraction": 0.5}]
    whole = [{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}]
    capped = {"pid": 1, "enforcement": "driver"}
    assert tier(whole, capped, True) is None and tier(None, None, True) is None
    assert tier(half, capped, True) == ENFORCE_DRIVER
    assert tier(half, {"pid": 1}, True) == ENFORCE_WATCH
    assert tier(half, {"pid": 1}, False) == ENFORCE_FRAMEWORK
    gang = dict(capped, workers=[{"pid": 2}])  # one worker without its cgroup: the driver does not hold the job
    assert tier(half * 2, gang, True) == ENFORCE_WATCH


def test_the_caps_a_run_is_given(tmp_path):
    from gpupool.hub_ext.runtime.jobspec import JobSpecs

    pool = SimpleNamespace(job_root=str(tmp_path), work_dir=str(tmp_path), run_as_user=False, kernel_name="",
                           job_python="python", gpu_memory_reserve=0.0, gpu_memory_reserve_min=0)
    nodes = {"box": SimpleNamespace(name="box", gpu_memory=16 * GiB)}
    specs = JobSpecs(pool, {}, nodes.get)
    place = SimpleNamespace(node="box", gpus=(1,), fraction=0.5)
    assert specs.gpu_cap(place) == {"gpu": 1, "hard": 8 * GiB, "soft": 8 * GiB}
    assert specs.gpu_cap(place, 6 * GiB) == {"gpu": 1, "hard": 8 * GiB, "soft": 6 * GiB}  # soft: its request
    assert specs.gpu_cap(SimpleNamespace(node="box", gpus=(1,), fraction=1.0)) == {}
    assert specs.gpu_cap(SimpleNamespace(node="gone", gpus=(1,), fraction=0.5)) == {}
