"""gpupool.backends.nvml.

This machine has no GPU, so the NVML calls are exercised against ``FakeNVML``: a stand-in for the
``pynvml`` module with the same function names, return shapes (``.total``/``.used``, ``.gpu``,
process objects with ``.pid``/``.usedGpuMemory``) and error class. The real library path is the
same code with ``nvml=None``; the last tests check that on this machine it says "no GPU" without
crashing.
"""
from __future__ import annotations

import types

import pytest

from gpupool.backends import nvml

GiB = 2**30


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """A stand-in for the pynvml module (not our component: the vendor library)."""

    NVMLError = FakeNVMLError

    def __init__(self, devices, *, init_error=None, bytes_names=False):
        self.devices = devices
        self.init_error = init_error
        self.bytes_names = bytes_names
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def _check(self):
        if self.inits <= self.shutdowns:
            raise FakeNVMLError("Uninitialized")

    def nvmlDeviceGetCount(self):
        self._check()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check()
        if not 0 <= i < len(self.devices):
            raise FakeNVMLError("Invalid Argument")
        return self.devices[i]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode() if self.bytes_names else h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetUtilizationRates(self, h):
        if h.get("util") is None:
            raise FakeNVMLError("Not Supported")
        return types.SimpleNamespace(gpu=h["util"], memory=10)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h.get("procs", [])]

    # per-cgroup memory limits (driver r615+): the driver's version, MIG mode, the call recorded
    limit_calls: list

    def nvmlSystemGetDriverVersion(self):
        self._check()
        return (self.devices[0].get("driver") if self.devices else None) or "550.54.15"

    def nvmlDeviceGetMigMode(self, h):
        if h.get("mig") is None:
            raise FakeNVMLError("Not Supported")
        return [int(h["mig"]), int(h["mig"])]

    class c_nvmlSetMemoryLimits_v1_t:  # pynvml's ctypes structure: nameSpace, softLimit, hardLimit
        nameSpace = b""
        softLimit = 0
        hardLimit = 0

    def nvmlDeviceSetMemoryLimits_v1(self, h, limits):
        self._check()
        if h.get("limits_error"):
            raise FakeNVMLError(h["limits_error"])
        call = {"uuid": h["uuid"], "nameSpace": limits.nameSpace.decode(), "softLimit": limits.softLimit,
                "hardLimit": limits.hardLimit}
        self.__dict__.setdefault("limit_calls", []).append(call)
        return call


def device(i, name="NVIDIA A100-SXM4-80GB", total=80 * GiB, used=0, util=0, procs=(), **more):
    return {"uuid": f"GPU-{i:08d}-0000", "name": name, "total": total, "used": used, "util": util,
            "procs": list(procs), **more}


def memory_loop(tmp_path, gpus: int = 1):
    """A scheduler loop on the real local backend with this NVML stand-in as its reader, for the
    memory enforcement tests: ``(sessions, fake, backend, loop, service)``; one node of ``gpus``
    16Gi GPUs, grace 1 s, kill_after 1 s."""
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.app import Service
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.runtime.loop import SchedulerLoop
    from gpupool.hub_ext.runtime.metrics import Metrics

    (tmp_path / "home").mkdir()
    settings = load({"nodes": [{"name": "box", "gpus": gpus, "gpu_memory": "16Gi"}], "run_as_user": False,
                     "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
                     "work_dir": str(tmp_path / "home"), "preemption_grace": 1, "kill_after": 1})
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    fake = FakeNVML([device(g, total=16 * GiB) for g in range(gpus)])
    reader = types.SimpleNamespace(process_memory=lambda i: nvml.process_memory(i, nvml=fake))
    backend = LocalBackend(settings)
    loop = SchedulerLoop(settings, sessions, backend, Metrics(), nvml=reader)
    return sessions, fake, backend, loop, Service(settings, sessions, loop, None, Metrics())


def test_gpus_and_node():
    fake = FakeNVML([device(0), device(1, used=3 * GiB, util=55)])
    assert nvml.available(nvml=fake)
    listed = nvml.gpus(nvml=fake)
    assert listed == [
        {"index": 0, "uuid": "GPU-00000000-0000", "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB},
        {"index": 1, "uuid": "GPU-00000001-0000", "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB},
    ]
    [node] = nvml.discover_nodes("box", nvml=fake)
    assert (node.name, node.gpus, node.gpu_memory, node.gpu_model) == ("box", 2, 80 * GiB, "NVIDIA A100-SXM4-80GB")
    assert node.labels == {}
    assert fake.inits == fake.shutdowns  # every session is closed


def test_mixed_gpus_use_smallest_memory(caplog):
    fake = FakeNVML([device(0, "A100", 80 * GiB), device(1, "T4", 16 * GiB)], bytes_names=True)
    [node] = nvml.discover_nodes("mixed", nvml=fake)
    assert node.gpus == 2 and node.gpu_memory == 16 * GiB
    assert node.gpu_model == "A100+T4"
    assert node.labels["gpupool/mixed-gpus"] == "true"
    assert "smallest memory" in caplog.text


def test_default_node_name_is_hostname():
    import socket
    [node] = nvml.discover_nodes(nvml=FakeNVML([device(0)]))
    assert node.name == socket.gethostname()


def test_utilization_and_unsupported_reading():
    fake = FakeNVML([device(0, used=GiB, util=37), device(1, util=None)])
    u = nvml.utilization(nvml=fake)
    assert u[0] == {"utilization": 37.0, "memory_used": GiB, "memory_total": 80 * GiB}
    assert u[1] == {"utilization": None, "memory_used": 0, "memory_total": 80 * GiB}


def test_process_memory():
    fake = FakeNVML([device(0, procs=[(101, 2 * GiB), (202, None)]), device(1)])
    assert nvml.process_memory(0, nvml=fake) == {101: 2 * GiB, 202: 0}
    assert nvml.process_memory(1, nvml=fake) == {}
    assert nvml.process_memory(7, nvml=fake) == {}  # bad index: NVML error -> empty, no crash
    assert fake.inits == fake.shutdowns


def test_driver_missing_is_not_an_error():
    fake = FakeNVML([device(0)], init_error=FakeNVMLError("NVML Shared Library Not Found"))
    assert nvml.available(nvml=fake) is False
    assert nvml.gpus(nvml=fake) == []
    assert nvml.discover_nodes(nvml=fake) == []
    assert nvml.utilization(nvml=fake) == {}
    assert nvml.process_memory(0, nvml=fake) == {}


def test_zero_gpus():
    fake = FakeNVML([])
    assert nvml.available(nvml=fake) is False
    assert nvml.discover_nodes(nvml=fake) == []


def test_this_machine_has_no_gpu_and_nothing_crashes():
    """The real pynvml on this GPU-less machine (nvml=None: the library path)."""
    pytest.importorskip("pynvml")
    if nvml.available():  # pragma: no cover - only on a GPU machine
        [node] = nvml.discover_nodes()
        assert node.gpus == len(nvml.gpus()) > 0
        assert set(nvml.utilization()) == set(range(node.gpus))
        return
    assert nvml.gpus() == []
    assert nvml.discover_nodes() == []
    assert nvml.utilization() == {}
    assert nvml.process_memory(0) == {}
