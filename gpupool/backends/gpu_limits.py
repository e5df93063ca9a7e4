"""Tier 2 of fraction enforcement: the driver caps a job's GPU memory (NVIDIA driver r615 and
later, cgroup v2, the service running as root, a GPU not in MIG mode).

Each fractional worker of the local backend runs in a cgroup of its own under
``c.GPUPool.gpu_memory_cgroup`` (``/sys/fs/cgroup/gpupool``), and NVML's
``nvmlDeviceSetMemoryLimits_v1`` gives that cgroup a hard limit (the fraction's memory: an
allocation past it fails with out-of-memory in the job itself) and a soft limit (what the job
asked for) on its GPU. The worker's runner is moved into the cgroup as soon as it exists and
waits until it is there before it starts the program, so every process of the job is inside.
Removing the cgroup when the run has ended clears the limits (NVML's rule).

:func:`driver_tier` says whether this machine and GPU allow it, and why not; elsewhere the NVML
watch (hub_ext/runtime/memory.py) and the frameworks' own caps (gpupool/startup/) hold the job.
Every NVML call goes through the module ``nvml`` given (``pynvml``, or a test's stand-in).
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

log = logging.getLogger("gpupool.gpu_limits")

MIN_DRIVER = 615  # the first driver branch with per-cgroup GPU memory limits


def driver_version(nvml: Any) -> int | None:
    """The driver's major version (``615`` of ``"615.12"``), None when NVML cannot say."""
    try:
        text = nvml.nvmlSystemGetDriverVersion()
    except Exception:
        return None
    m = re.match(r"\s*(\d+)", text.decode() if isinstance(text, bytes) else str(text))
    return int(m.group(1)) if m else None


def mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # not supported: a GPU without MIG
        return False
    current = current[0] if isinstance(current, (list, tuple)) else current
    return bool(current)


def driver_tier(nvml: Any, index: int, cgroup: str, *, euid: int | None = None) -> tuple[bool, str]:
    """(whether tier 2 can hold a job on GPU ``index``, why not). ``cgroup``: the parent cgroup
    (``c.GPUPool.gpu_memory_cgroup``; "" turns tier 2 off). NVML must be initialised."""
    if not cgroup:
        return False, "c.GPUPool.gpu_memory_cgroup is empty"
    if (os.geteuid() if euid is None else euid) != 0:
        return False, "the service does not run as root"
    if not os.path.exists(os.path.join(os.path.dirname(cgroup.rstrip("/")), "cgroup.controllers")):
        return False, f"{os.path.dirname(cgroup.rstrip('/'))} is not a cgroup v2 hierarchy"
    if nvml is None or not hasattr(nvml, "nvmlDeviceSetMemoryLimits_v1"):
        return False, "this nvidia-ml-py has no nvmlDeviceSetMemoryLimits_v1"
    version = driver_version(nvml)
    if version is None or version < MIN_DRIVER:
        return False, f"driver {version or 'unknown'} is older than r{MIN_DRIVER}"
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(int(index))
    except Exception as e:
        return False, f"NVML has no GPU {index}: {e}"
    if mig_enabled(nvml, handle):
        return False, f"GPU {index} is in MIG mode (MIG partitions are isolated by the hardware)"
    return True, ""


class CgroupLimits:
    """Per-worker cgroups with GPU memory limits under ``root`` (the parent cgroup)."""

    def __init__(self, nvml: Any, root: str, euid: int | None = None):
        self.nvml = nvml
        self.root = root.rstrip("/")
        self.euid = euid
        self._tier: dict[int, tuple[bool, str]] = {}  # GPU index -> driver_tier (the machine does not change)

    def usable(self, index: int) -> tuple[bool, str]:
        if index not in self._tier:
            try:
                self.nvml.nvmlInit()
            except Exception as e:
                return False, f"NVML did not start: {e}"
            try:
                self._tier[index] = driver_tier(self.nvml, index, self.root, euid=self.euid)
            finally:
                try:
                    self.nvml.nvmlShutdown()
                except Exception:
                    pass
            ok, why = self._tier[index]
            if not ok:
                log.info("GPU memory of fractional jobs on GPU %d is not capped by the driver: %s", index, why)
        return self._tier[index]

    def path(self, run_id: str) -> str:
        return os.path.join(self.root, re.sub(r"[^A-Za-z0-9_.-]", "_", run_id))

    def prepare(self, run_id: str, index: int, hard: int, soft: int) -> str:
        """Make the worker's cgroup and set its limits on GPU ``index``: ``hard`` bytes at most,
        ``soft`` guaranteed (at most ``hard``). Returns the cgroup's path; raises OSError or NVML's
        error when it cannot (the caller falls back to the other tiers)."""
        path = self.path(run_id)
        os.makedirs(path, exist_ok=True)
        limits = self.nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = path.encode()
        limits.hardLimit = int(hard)
        limits.softLimit = int(min(soft or hard, hard))
        self.nvml.nvmlInit()
        try:
            self.nvml.nvmlDeviceSetMemoryLimits_v1(self.nvml.nvmlDeviceGetHandleByIndex(int(index)), limits)
        except BaseException:
            self.release(path)
            raise
        finally:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        return path

    @staticmethod
    def enter(path: str, pid: int) -> None:
        """Move process ``pid`` (the worker's runner) into the cgroup ``path``."""
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(int(pid)))

    @staticmethod
    def release(path: str) -> None:
        """Remove a worker's cgroup once its processes are gone (that clears its limits)."""
        try:
            os.rmdir(path)
        except OSError as e:
            log.debug("could not remove the cgroup %s: %s", path, e)


def wait_inside(path: str, pid: int | None = None, timeout: float = 10.0) -> bool:
    """In the runner: wait until process ``pid`` (this one) is listed in the cgroup ``path``, so
    the program it starts is inside from its first instruction. False after ``timeout``."""
    pid = os.getpid() if pid is None else pid
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                if str(pid) in f.read().split():
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
