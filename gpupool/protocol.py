"""The job protocol: what the service and a job's processes agree on, defined once.

The service (its loop), both job backends (local processes, Kubernetes pods), the pod entrypoint
and the in-job helpers (:mod:`gpupool.checkpoint`, :mod:`gpupool.distributed`,
:mod:`gpupool.client.metrics`) import these names; none of them spells a ``GPUPOOL_*`` variable,
a file of the job directory or the stop request's format itself. docs/jobs.md lists the
environment for users.

* :class:`Env`: the ``GPUPOOL_*`` environment of a job's processes;
* :class:`JobDir`: the job directory (``<job_root>/<job id>``): which file lives where;
* the checkpoint layout: the ``LATEST`` pointer in the checkpoint directory
  (:func:`write_latest`, :func:`read_latest`, :func:`latest_mtime`);
* the stop request and the warning beside it (:func:`write_stop`, :func:`read_stop`,
  :func:`write_warning`, :func:`read_warning`) and a worker's exit status (:func:`write_exit`,
  :func:`read_exit`);
* the GPU environment of one placement (:func:`gpu_env`), computed here for both backends.

Standard library only: a job imports it through ``gpupool.checkpoint``. The allocation codec
(stored allocation <-> the scheduler's placements) needs the scheduler's model, so it lives in
:mod:`gpupool.contract` (``encode_allocation`` / ``decode_allocation``), which re-exports this module's
names.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class Env:
    """Names of the environment variables the service gives a job's processes."""

    JOB_ID = "GPUPOOL_JOB_ID"  # "j-000042": set in every job; its absence means "not in a job"
    ATTEMPT = "GPUPOOL_ATTEMPT"  # 1, 2, ...: a requeued job runs again as the next attempt
    JOB_DIR = "GPUPOOL_JOB_DIR"  # the job directory (JobDir)
    CHECKPOINT_DIR = "GPUPOOL_CHECKPOINT_DIR"  # kept across attempts
    STOP_FILE = "GPUPOOL_STOP_FILE"  # exists = "save a checkpoint and stop now"
    RESUME_FROM = "GPUPOOL_RESUME_FROM"  # the newest checkpoint when the attempt started
    PREEMPTION_GRACE = "GPUPOOL_PREEMPTION_GRACE"  # seconds between the stop request and SIGTERM (pods)
    API_URL = "GPUPOOL_API_URL"  # how the job reaches the service (metrics)
    API_TOKEN = "GPUPOOL_API_TOKEN"  # the job's token, minted for this run
    RUN_ID = "GPUPOOL_RUN_ID"  # marks every process of one run (the local runner finds them by it)
    NODE = "GPUPOOL_NODE"  # the node of this worker's placement
    GPUS = "GPUPOOL_GPUS"  # the scheduler's GPU indices on that node ("" for none)
    GPU_FRACTION = "GPUPOOL_GPU_FRACTION"  # share of each GPU ("1", "0.5"; "0" without a GPU)
    GPU_MEMORY_LIMIT = "GPUPOOL_GPU_MEMORY_LIMIT"  # bytes of GPU memory a fractional worker may use
    # that cap as a share of the whole GPU's memory (what PyTorch's per-process fraction takes)
    GPU_MEMORY_FRACTION = "GPUPOOL_GPU_MEMORY_FRACTION"
    # workspaces: where the jobs' directories are (the TensorBoard launcher reads the user's jobs there)
    JOB_ROOT = "GPUPOOL_JOB_ROOT"

    SECRETS = (API_TOKEN,)  # values that must not appear in a pod spec (a Secret holds them)


# an endpoint (kind inference): the TCP port its server listens on (the usual name of web platforms)
PORT = "PORT"


# -- the job directory ------------------------------------------------------------------------

def worker_file(path: str, rank: int) -> str:
    """Worker ``rank``'s copy of a job file: ``log.txt`` for rank 0 (single-worker jobs keep their
    layout), ``log-rank1.txt`` for rank 1; likewise ``output.ipynb`` and ``exit.json``."""
    if not rank:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}-rank{int(rank)}{ext}"


@dataclass(frozen=True)
class JobDir:
    """The files of one job, under ``<job_root>/<job id>`` (the same path in the service and in
    a job's pod, which mounts the jobs volume there)::

        input.ipynb                the submitted notebook
        output.ipynb               the executed notebook (output-rank1.ipynb ... for workers)
        log.txt                    the log, appended to by every attempt (log-rank1.txt ...)
        checkpoints/               kept across attempts; LATEST names the newest checkpoint
        tensorboard/               TensorBoard event files the job writes (docs/tools.md)
        control/stop               the stop request (JSON: reason, requested_at)
        control/warning            a warning before the job must stop (JSON: message, at)
        runs/<attempt>/exit.json   a worker's exit status (exit-rank1.json ...)
        runs/<attempt>/parameters.json  the notebook's parameters (local backend)
        runs/<attempt>/restarts    an endpoint's server restarts in the attempt (restarts-rank1 ...)
    """

    path: str

    @classmethod
    def of(cls, job_root: str, job_id: str) -> "JobDir":
        return cls(os.path.join(job_root, job_id))

    @property
    def notebook(self) -> str:
        return os.path.join(self.path, "input.ipynb")

    @property
    def output(self) -> str:
        return os.path.join(self.path, "output.ipynb")

    @property
    def log(self) -> str:
        return os.path.join(self.path, "log.txt")

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.path, "checkpoints")

    @property
    def tensorboard(self) -> str:
        return os.path.join(self.path, "tensorboard")

    @property
    def stop_file(self) -> str:
        return os.path.join(self.path, "control", "stop")

    @property
    def warning_file(self) -> str:
        return warning_file(self.stop_file)

    def run_dir(self, attempt: int) -> str:
        return os.path.join(self.path, "runs", str(int(attempt)))

    def exit_file(self, attempt: int, rank: int = 0) -> str:
        return worker_file(os.path.join(self.run_dir(attempt), "exit.json"), rank)

    def restarts_file(self, attempt: int, rank: int = 0) -> str:
        """An endpoint's worker: how often its server was restarted in this attempt (a number)."""
        return worker_file(os.path.join(self.run_dir(attempt), "restarts"), rank)

    def parameters(self, attempt: int) -> str:
        return os.path.join(self.run_dir(attempt), "parameters.json")

    def worker_log(self, rank: int) -> str:
        return worker_file(self.log, rank)

    def worker_output(self, rank: int) -> str:
        return worker_file(self.output, rank)


def _write_json(path: str, data: Mapping[str, Any], *, sync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, then a rename), creating
    the directory; readers see the old file or the new one, never half of one."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from a job running as another user
        with os.fdopen(fd, "w") as f:
            json.dump(dict(data), f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_json(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- checkpoints ------------------------------------------------------------------------------
LATEST = "LATEST"  # in the checkpoint directory: JSON {"path": name, "step": n, "t": time}


def write_latest(checkpoint_dir: str, name: str, step: int | None = None) -> None:
    """Make ``name`` (a file or folder in ``checkpoint_dir``) the newest checkpoint (atomic, synced)."""
    _write_json(os.path.join(checkpoint_dir, LATEST), {"path": name, "step": step, "t": time.time()}, sync=True)


def read_latest(checkpoint_dir: str) -> str | None:
    """The path of the newest checkpoint, or None when there is none (or it is gone)."""
    info = _read_json(os.path.join(checkpoint_dir, LATEST)) or {}
    name = info.get("path")
    if not name:
        return None
    path = os.path.join(checkpoint_dir, str(name))
    return path if os.path.exists(path) else None


def latest_mtime(checkpoint_dir: str) -> float | None:
    """When the ``LATEST`` pointer was last written (a job saved a checkpoint); None: never."""
    try:
        return os.stat(os.path.join(checkpoint_dir, LATEST)).st_mtime
    except OSError:
        return None


# -- the stop request and the warning beside it ------------------------------------------------

def write_stop(stop_file: str, reason: str, *, replace: bool = True) -> bool:
    """Ask the job to save a checkpoint and stop: ``gpupool.checkpoint.should_stop()`` turns True
    and ``stop_reason()`` returns ``reason``. With ``replace`` False an existing request is kept.
    Returns whether the file was written; raises OSError when it cannot be."""
    if not replace and os.path.exists(stop_file):
        return False
    _write_json(stop_file, {"requested_at": time.time(), "reason": reason})
    return True


def stop_requested(stop_file: str | None) -> bool:
    return bool(stop_file) and os.path.exists(stop_file)


def read_stop(stop_file: str | None) -> str | None:
    """Why the job is asked to stop; None when it is not (or the request cannot be read yet)."""
    data = _read_json(stop_file)
    if data is None:
        return None
    return data.get("reason") or "asked to stop"


def warning_file(stop_file: str) -> str:
    return os.path.join(os.path.dirname(stop_file), "warning")


def write_warning(stop_file: str, message: str, at: float | None = None) -> None:
    """Warn the job that it will be asked to stop (``gpupool.checkpoint.warning()`` returns
    ``message``); ``at``: when. Raises OSError when it cannot be written."""
    _write_json(warning_file(stop_file), {"message": message, "at": at})


def read_warning(stop_file: str | None) -> str | None:
    data = _read_json(warning_file(stop_file)) if stop_file else None
    return (data or {}).get("message") or None


def write_exit(exit_file: str, code: int, signal: int | None = None) -> None:
    """A worker's exit status (the runner writes it when the program ended)."""
    _write_json(exit_file, {"exit_code": int(code), "signal": signal, "t": time.time()})


def read_exit(exit_file: str | None) -> int | None:
    """The exit status a worker's runner wrote; None when there is none."""
    data = _read_json(exit_file)
    try:
        return int(data["exit_code"]) if data is not None else None
    except (KeyError, TypeError, ValueError):
        return None


# -- the GPU environment of a placement --------------------------------------------------------
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# set by the service from a placement; the host's own values mean nothing in a pod
GPU_VISIBILITY = (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
                  "HIP_VISIBLE_DEVICES")


def _parts(placement: Any) -> tuple[str, tuple[int, ...], float]:
    """(node, gpus, fraction) of a placement: a PodPlacement / Placement or a stored dict."""
    if isinstance(placement, Mapping):
        fraction = placement.get("fraction")
        return (str(placement.get("node") or ""), tuple(int(g) for g in placement.get("gpus") or ()),
                1.0 if fraction is None else float(fraction))
    return str(placement.node or ""), tuple(int(g) for g in placement.gpus), float(placement.fraction)


def device_ids(gpus: Sequence[int], uuids: Sequence[str] | None = None) -> list[str]:
    """How the GPUs are named to CUDA / the container runtime: their UUIDs when known, else the
    indices."""
    return [str(uuids[g]) if uuids and g < len(uuids) and uuids[g] else str(g) for g in gpus]


def usable_memory(total: int, reserve: float = 0.0, reserve_min: int = 0) -> int:
    """A GPU's memory less what the driver keeps (``reserve`` of it, at least ``reserve_min``
    bytes: ``c.GPUPool.gpu_memory_reserve`` / ``_min``), as the scheduler sizes shares; 0 unknown."""
    if total <= 0:
        return 0
    kept = max(math.ceil(total * reserve), int(reserve_min)) if (reserve or reserve_min) else 0
    return max(int(total) - kept, 0)


def memory_limit(fraction: float, gpu_memory: int = 0, requested: int = 0, reserve: float = 0.0,
                 reserve_min: int = 0) -> int:
    """Bytes of GPU memory a fractional placement may use: what was asked for, else its share of
    what the driver leaves of the GPU (``gpu_memory``: the GPU's memory, 0 unknown; ``reserve`` /
    ``reserve_min``: see :func:`usable_memory`); 0 for whole GPUs or when unknown."""
    if fraction >= 1.0:
        return 0
    return int(requested or usable_memory(gpu_memory, reserve, reserve_min) * fraction)


def memory_fraction(fraction: float, memory: int = 0, total: int = 0) -> float:
    """The cap of a fractional placement as a share of the whole GPU's memory, rounded down to
    three decimals (what PyTorch's ``set_per_process_memory_fraction`` and JAX's
    ``XLA_*_MEM_FRACTION`` take): ``memory / total`` when both are known, else ``fraction``."""
    share = memory / total if memory and total else fraction
    return math.floor(max(0.0, min(1.0, share)) * 1000) / 1000


def gpu_env(placement: Any, *, uuids: Sequence[str] | None = None, memory: int = 0, total: int = 0,
            container: bool = False) -> dict[str, str]:
    """The GPU part of one worker's environment for its placement (``None``: no GPU).

    * No GPU: ``CUDA_VISIBLE_DEVICES=""`` and ``NVIDIA_VISIBLE_DEVICES=void`` (an image built on a
      CUDA base image says ``all``), ``GPUPOOL_GPUS=""``, ``GPUPOOL_GPU_FRACTION=0``.
    * Always: ``GPUPOOL_GPUS`` (the scheduler's indices) and ``GPUPOOL_NODE``, the share in
      ``GPUPOOL_GPU_FRACTION``, and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (JAX takes what it uses).
    * A process on the node (``container`` False, the local backend and workspaces): the devices
      by name in ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` (UUIDs when known).
    * A pod (``container`` True): whole GPUs are the device plugin's to name and isolate; a
      fraction names its GPU in ``NVIDIA_VISIBLE_DEVICES`` (the container runtime mounts only it)
      and sets the MPS limits (enforced only where an MPS daemon serves the node).
    * A fraction: its cap, ``memory`` bytes (:func:`memory_limit`), in ``GPUPOOL_GPU_MEMORY_LIMIT``
      and as a share of the GPU's ``total`` memory (:func:`memory_fraction`) in
      ``GPUPOOL_GPU_MEMORY_FRACTION``, JAX's ``XLA_CLIENT_MEM_FRACTION`` and the older
      ``XLA_PYTHON_CLIENT_MEM_FRACTION``; ``TF_FORCE_GPU_ALLOW_GROWTH``. The start-up hook
      (:mod:`gpupool.startup.gpupool_caps`) hands the cap to PyTorch and TensorFlow.

    These caps bind the frameworks, not the driver: docs/admin.md has the tiers of enforcement."""
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    node, gpus, fraction = _parts(placement) if placement is not None else ("", (), 1.0)
    if not gpus:
        env.update({CUDA_VISIBLE_DEVICES: "", NVIDIA_VISIBLE_DEVICES: "void", Env.GPUS: "", Env.GPU_FRACTION: "0"})
        return env
    fraction = max(0.0, min(1.0, fraction))
    ids = device_ids(gpus, uuids)
    env.update({Env.GPUS: ",".join(str(g) for g in gpus), Env.NODE: node, Env.GPU_FRACTION: f"{fraction:g}"})
    if not container:
        env.update({CUDA_VISIBLE_DEVICES: ",".join(ids), NVIDIA_VISIBLE_DEVICES: ",".join(ids)})
    if fraction >= 1.0:
        return env
    share = f"{memory_fraction(fraction, memory, total):.3f}"
    env.update({"XLA_PYTHON_CLIENT_MEM_FRACTION": share, "XLA_CLIENT_MEM_FRACTION": share,
                Env.GPU_MEMORY_FRACTION: share, "TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    if memory:
        env[Env.GPU_MEMORY_LIMIT] = str(int(memory))
    if container:
        env.update({NVIDIA_VISIBLE_DEVICES: ids[0], "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, int(round(fraction * 100))))})
        if memory:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, int(memory) // 2**20)}M"
    return env


STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def with_startup_hook(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with gpupool's start-up hook first on ``PYTHONPATH`` (the runner of every job
    worker calls it for its program): the directory :data:`STARTUP_DIR` of the gpupool that runs
    the job, whose ``sitecustomize`` hands a fractional job's cap to PyTorch and TensorFlow in
    every Python process of the job, the kernel included, and then runs any other
    ``sitecustomize`` on the path. Standard library only, so a kernel in another environment
    runs it too."""
    out = dict(env)
    parts = [p for p in (out.get("PYTHONPATH") or "").split(os.pathsep) if p and p != STARTUP_DIR]
    out["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, *parts])
    return out


def job_env(job: JobDir, job_id: str, attempt: int, *, api_url: str = "", token: str = "") -> dict[str, str]:
    """The job part of a run's environment (besides :func:`gpu_env`): its id and attempt, its
    directory, checkpoints and stop file, the newest checkpoint to resume from, and how it reaches
    the service."""
    env = {Env.JOB_ID: job_id, Env.ATTEMPT: str(int(attempt)), Env.CHECKPOINT_DIR: job.checkpoints,
           Env.STOP_FILE: job.stop_file, Env.JOB_DIR: job.path, Env.API_URL: api_url}
    if token:
        env[Env.API_TOKEN] = token
    latest = read_latest(job.checkpoints)
    if latest:
        env[Env.RESUME_FROM] = latest
    return env


__all__ = ["Env", "PORT", "JobDir", "worker_file", "LATEST", "write_latest", "read_latest", "latest_mtime", "write_stop",
           "stop_requested", "read_stop", "warning_file", "write_warning", "read_warning", "write_exit", "read_exit",
           "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPU_VISIBILITY", "device_ids", "memory_limit",
           "usable_memory", "memory_fraction", "gpu_env", "job_env", "STARTUP_DIR", "with_startup_hook"]
