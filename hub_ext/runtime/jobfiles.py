"""What the service alone writes and reads in a job directory: the submitted notebook, the lines
it adds to a log, and the telling line of a failed run's log.

The layout (``protocol.JobDir``: notebook, output and log per worker, checkpoints, control
files) and the files both sides use (the checkpoint pointer: ``protocol.read_latest`` /
``latest_mtime``; the stop request and the warning: ``protocol.write_stop`` / ``write_warning``)
are the job protocol's, :mod:`gpupool.protocol`: one writer and one reader each, for the service
and the jobs alike.
"""
from __future__ import annotations

import os
import re

from ...protocol import JobDir


def write_notebook(jdir: str, source: str) -> None:
    """The submitted notebook, written once before the first start (atomically)."""
    path = JobDir(jdir).notebook
    os.makedirs(jdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(source)
    os.replace(path + ".tmp", path)


def append(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


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
