"""A pynvml stand-in for a gpupool service started by a test (``c.GPUPool.nvml_module =
"nvml_standin"``, with this directory on ``PYTHONPATH``).

Its functions are those of ``FakeNVML`` (below, also what tests/local/test_nvml.py and others pass
as ``nvml=``) whose devices come from the JSON file named by ``GPUPOOL_TEST_NVML_FILE``, read
again at every ``nvmlInit``: a test writes the utilisation it wants there (:func:`write`) and the
service's next reading returns it.
"""
from __future__ import annotations

import contextlib
import json
import os
import types

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
    from gpupool.backends import nvml
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


ENV = "GPUPOOL_TEST_NVML_FILE"
NVMLError = FakeNVMLError
_fake = FakeNVML([])


def write(path, utilizations: list[float | None], name: str = "NVIDIA L4", total: int = 24 * 2**30,
          used: int = 2**30, **more) -> None:
    """The devices the service will see: one per utilisation value (None: not supported); ``more``:
    keys of every device (``driver="615.10"``, ``mig=0``)."""
    devices = [device(i, name=name, total=total, used=used, util=u, **more) for i, u in enumerate(utilizations)]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(devices, f)
    os.replace(tmp, path)


def nvmlInit():
    try:
        with open(os.environ[ENV]) as f:
            _fake.devices = json.load(f)
    except (KeyError, OSError, ValueError) as e:
        raise FakeNVMLError(f"NVML Shared Library Not Found ({e})") from None
    _fake.nvmlInit()


def nvmlDeviceSetMemoryLimits_v1(handle, limits):
    """The stand-in's call, also appended to ``<file>.limits.jsonl`` (the test reads the arguments)."""
    call = _fake.nvmlDeviceSetMemoryLimits_v1(handle, limits)
    with open(os.environ[ENV] + ".limits.jsonl", "a") as f:
        f.write(json.dumps(call) + "\n")


def limit_calls(path) -> list[dict]:
    try:
        with open(f"{path}.limits.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


c_nvmlSetMemoryLimits_v1_t = FakeNVML.c_nvmlSetMemoryLimits_v1_t


def __getattr__(name):  # every other pynvml function: the stand-in's
    return getattr(_fake, name)


@contextlib.contextmanager
def for_services(path, utilizations: list[float | None], **more):
    """Services started inside this block load this stand-in (``nvml_module = "nvml_standin"``) with
    these readings: the environment variable and ``PYTHONPATH`` are set (the harness hands its
    environment to a service it starts itself, ``Hub(managed=False)``)."""
    import pytest

    write(path, utilizations, **more)
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, str(path))
    here = os.path.dirname(os.path.abspath(__file__))
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    try:
        yield path
    finally:
        mp.undo()
