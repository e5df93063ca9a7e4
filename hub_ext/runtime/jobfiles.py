"""The job directory as the service sees it: ``<job_root>/<job id>/`` with the submitted notebook,
the output notebook, the log (one per worker: ``backends.base.worker_file``), ``checkpoints/``
(``LATEST`` points at the newest) and ``control/`` (the stop file a run polls, the run-time
warning it reads).

This module is the service's one seam to the job protocol's file layout: nothing else in
hub_ext spells out a file name of a job directory. (The jobs' side reads the same layout through
``gpupool.checkpoint``.)
"""
from __future__ import annotations

import json
import os
import re

from ...backends.base import worker_file

NOTEBOOK, OUTPUT, LOG = "input.ipynb", "output.ipynb", "log.txt"
CHECKPOINTS, LATEST = "checkpoints", "LATEST"
CONTROL, STOP, WARNING = "control", "stop", "warning"


def job_dir(job_root: str, job_id: str) -> str:
    return os.path.join(job_root, job_id)


def notebook(jdir: str) -> str:
    return os.path.join(jdir, NOTEBOOK)


def output(jdir: str, rank: int = 0) -> str:
    return worker_file(os.path.join(jdir, OUTPUT), rank)


def log(jdir: str, rank: int = 0) -> str:
    return worker_file(os.path.join(jdir, LOG), rank)


def checkpoints(jdir: str) -> str:
    return os.path.join(jdir, CHECKPOINTS)


def stop_file(jdir: str) -> str:
    return os.path.join(jdir, CONTROL, STOP)


def latest_checkpoint(jdir: str) -> str | None:
    """The path ``checkpoints/LATEST`` names, when it exists."""
    ckpt = checkpoints(jdir)
    try:
        with open(os.path.join(ckpt, LATEST)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    path = os.path.join(ckpt, info.get("path", ""))
    return path if info.get("path") and os.path.exists(path) else None


def checkpoint_mtime(jdir: str) -> float | None:
    """When the job's checkpoint pointer was last written; None: never."""
    try:
        return os.stat(os.path.join(checkpoints(jdir), LATEST)).st_mtime
    except OSError:
        return None


def write_notebook(jdir: str, source: str) -> None:
    """The submitted notebook, written once before the first start (atomically)."""
    path = notebook(jdir)
    os.makedirs(jdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(source)
    os.replace(path + ".tmp", path)


def append(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def write_warning(jdir: str, message: str, at: float) -> None:
    """The run-time warning a job reads with ``gpupool.checkpoint.warning()`` (raises OSError)."""
    path = os.path.join(jdir, CONTROL, WARNING)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"message": message, "at": at}, f)
    os.replace(path + ".tmp", path)


def error_line(log_path: str) -> str:
    """The most telling line at the end of a failed papermill log (the exception)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 16384))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    tail = re.sub(r"\x1b\[[0-9;]*m", "", tail)
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$", ln)
        if m and not ln.startswith("papermill.exceptions.PapermillExecutionError"):
            return m.group(1)[:500]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln[:500]
    return ""
