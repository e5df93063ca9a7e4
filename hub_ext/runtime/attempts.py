"""What the job directory tells about an attempt, for its history (domain/lifecycle.py writes it):
the checkpoint a new attempt resumes from, and whether a failed run died before its code ran.

A notebook run's code has run once papermill gave a cell of its output notebook a start time:
papermill writes the output (every cell without one) before it starts the kernel, and each cell's
``metadata.papermill.start_time`` as it starts it. A run that failed while no cell had started (the
kernel died before it answered, papermill could not start) failed in the machinery, not in the
user's code; so did one that never wrote its output. A script or command job runs its code at once: its
failures are its own.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ... import protocol as P


def resume_point(files: P.JobDir) -> dict | None:
    """``{"checkpoint": path, "step": n or None}`` of the newest checkpoint; None without one."""
    path = P.read_latest(files.checkpoints)
    if path is None:
        return None
    try:
        with open(os.path.join(files.checkpoints, P.LATEST)) as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    return {"checkpoint": path, "step": step if isinstance(step, int) else None}


def died_before_code(row: Any, files: P.JobDir, rank: int | None) -> bool:
    """Whether the failed run of this attempt (its worker ``rank``) never started the user's code."""
    if row.command or row.script:
        return False
    path = files.worker_output(rank or 0)
    try:
        if row.started_at and os.stat(path).st_mtime < row.started_at:
            return True  # what is there is an earlier attempt's: this one never wrote its output
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False  # unreadable: say nothing we do not know
    cells = [c for c in nb.get("cells") or [] if isinstance(c, dict) and c.get("cell_type") == "code"]
    if not cells:
        return False
    marks = [(c.get("metadata") or {}).get("papermill") for c in cells]
    return all(isinstance(m, dict) and m.get("start_time") is None for m in marks)
