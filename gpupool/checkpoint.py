"""Checkpointing inside a gpupool job (import it in the job's notebook). Standard library only.

::

    from gpupool import checkpoint

    state = checkpoint.load() or {"step": 0}           # resume where the last attempt saved
    for step in range(state["step"], 100):
        train_one_step()
        state["step"] = step + 1
        checkpoint.save(state, step=step + 1)          # atomic; the newest is checkpoint.latest()
        if checkpoint.should_stop():                   # preempted or cancelled: we saved, so exit
            break

When the scheduler preempts a job (its GPUs are reclaimed by the queue that owns them) or a user
cancels it, the service writes a *stop request*; :func:`should_stop` sees it at once (a ``stat``
of one file, cheap enough to call every step). The job then has ``c.GPUPool.preemption_grace``
seconds to save and finish before it is terminated; a preempted job is requeued and, when it runs
again, :func:`latest` / :func:`load` return what it saved. The checkpoint directory persists across
requeues of the same job.

Outside a gpupool job (no ``GPUPOOL_CHECKPOINT_DIR``) everything still works against
``./.gpupool-checkpoints`` and :func:`should_stop` is always False, so a notebook runs the same
interactively.

Environment (set by the service; the names are :class:`gpupool.protocol.Env`'s):
``GPUPOOL_CHECKPOINT_DIR``, ``GPUPOOL_STOP_FILE``, ``GPUPOOL_RESUME_FROM`` (the newest checkpoint
when the attempt started), ``GPUPOOL_GPU_FRACTION``, ``GPUPOOL_GPU_MEMORY_LIMIT`` (bytes; fractional
GPUs), used by :func:`limit_gpu_memory`. The files (the ``LATEST`` pointer, the stop request and the
warning) are :mod:`gpupool.protocol`'s.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from . import protocol as P
from .protocol import Env

__all__ = ["checkpoint_dir", "save", "latest", "load", "should_stop", "stop_reason", "limit_gpu_memory",
           "in_job"]

LATEST = P.LATEST  # a small JSON file naming the newest checkpoint (written atomically)
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def in_job() -> bool:
    """True inside a job started by gpupool."""
    return bool(os.environ.get(Env.JOB_ID))


def checkpoint_dir() -> Path:
    """The job's checkpoint directory (created if missing); kept across requeues."""
    d = _dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _dir() -> Path:
    return Path(os.environ.get(Env.CHECKPOINT_DIR) or ".gpupool-checkpoints")


def save(obj: Any, step: int | None = None, name: str | None = None, keep: int = 3) -> Path:
    """Save a checkpoint atomically and make it the newest; returns its path.

    ``obj``: a path to an existing file or directory (copied in, e.g. a ``torch.save`` output), or
    any picklable object (pickled; a PyTorch object is saved with ``torch.save``). ``step`` names
    the file (``ckpt-000042.pkl``); ``name`` overrides the name. Only the newest ``keep``
    checkpoints are kept (0 = all)."""
    d = checkpoint_dir()
    stem = _NAME.sub("_", name) if name else (f"ckpt-{step:06d}" if step is not None else f"ckpt-{time.time_ns()}")
    src = Path(obj) if isinstance(obj, (str, os.PathLike)) and Path(obj).exists() else None
    if src is not None:
        target = d / (stem + "".join(src.suffixes) if src.is_file() and not name else stem)
        tmp = d / f".tmp-{stem}-{os.getpid()}"
        if src.is_dir():
            shutil.copytree(src, tmp)
        else:
            shutil.copy2(src, tmp)
    else:
        torch = sys.modules.get("torch")
        use_torch = torch is not None and type(obj).__module__.startswith("torch")
        target = d / (stem if name and "." in stem else stem + (".pt" if use_torch else ".pkl"))
        tmp = d / f".tmp-{stem}-{os.getpid()}"
        if use_torch:
            torch.save(obj, tmp)
        else:
            with open(tmp, "wb") as f:
                pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
    if target.exists() and target.is_dir():
        shutil.rmtree(target)
    os.replace(tmp, target)
    P.write_latest(str(d), target.name, step)
    if keep:
        _prune(d, keep, target.name)
    return target


def _prune(d: Path, keep: int, newest: str) -> None:
    ckpts = sorted((p for p in d.iterdir() if p.name.startswith("ckpt-")), key=lambda p: p.stat().st_mtime)
    for old in ckpts[:-keep]:
        if old.name == newest:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def latest() -> Path | None:
    """Path of the newest checkpoint, or None when the job has not saved one yet."""
    path = P.read_latest(str(_dir()))
    return Path(path) if path else None


def load(default: Any = None) -> Any:
    """The newest checkpoint's object (unpickled, or ``torch.load``-ed for ``.pt``), else ``default``."""
    path = latest()
    if path is None:
        return default
    if path.suffix == ".pt":
        import torch

        return torch.load(path, weights_only=False)
    if path.suffix == ".pkl":
        with open(path, "rb") as f:
            return pickle.load(f)
    return path


def should_stop() -> bool:
    """True once the service asked this job to stop (preemption or cancel). Checks a file: call
    it as often as you like (every step). Save a checkpoint and finish when it turns True."""
    return P.stop_requested(os.environ.get(Env.STOP_FILE))


def stop_reason() -> str | None:
    """Why the job is asked to stop (e.g. "preempted: reclaimed by queue vision"), or None."""
    return P.read_stop(os.environ.get(Env.STOP_FILE))


WARNING_FILE = os.path.basename(P.warning_file("stop"))  # beside the stop file (protocol.write_warning)


def warning() -> str | None:
    """A warning from the service that this job will be asked to stop soon (e.g. "reaches its
    maximum run time of 72 h at 2026-11-23 12:00 UTC; it will then be asked to checkpoint and is
    requeued"), or None. Cheap (a file check): save a checkpoint when it appears."""
    return P.read_warning(os.environ.get(Env.STOP_FILE))


def limit_gpu_memory() -> dict[str, Any]:
    """Apply this job's GPU share to the frameworks already imported; returns what was applied.

    The job's start-up hook (:mod:`gpupool.startup.gpupool_caps`) already does this for PyTorch
    and TensorFlow as they are imported; call it yourself where a process started without the
    hook (``python -I``, a program that clears ``PYTHONPATH``). PyTorch:
    ``torch.cuda.set_per_process_memory_fraction``; TensorFlow: a logical device with a memory
    limit; JAX reads ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (already set by the service)."""
    applied: dict[str, Any] = {}
    fraction = float(os.environ.get(Env.GPU_FRACTION) or 1.0)
    limit = int(os.environ.get(Env.GPU_MEMORY_LIMIT) or 0)
    if fraction >= 1.0 and not limit:
        return applied
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        for dev in range(torch.cuda.device_count()):
            frac = float(os.environ.get(Env.GPU_MEMORY_FRACTION) or fraction)
            if limit:
                total = torch.cuda.get_device_properties(dev).total_memory
                frac = min(1.0, limit / total)
            torch.cuda.set_per_process_memory_fraction(frac, dev)
        applied["torch"] = fraction
    tf = sys.modules.get("tensorflow")
    if tf is not None and limit:
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit // 2**20)])
        applied["tensorflow"] = limit
    return applied
