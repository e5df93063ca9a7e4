"""What a job runs, beside notebooks: a Python script with arguments or a command (an argv list),
and how many workers (``pods``). Validation of those submission fields (docs/jobs.md); every
error is a 400 naming its field.

* ``script``: a ``.py`` path relative to the user's working directory, run there as
  ``python SCRIPT ARGS...`` with the job interpreter; ``args``: a list of strings (numbers are
  converted).
* ``command``: a non-empty list of strings, run in the working directory; a leading ``python`` /
  ``python3`` is the job interpreter (the one notebook jobs run with), anything else is looked up
  on the service's ``PATH``.
* ``pods``: the number of workers (a gang: all start together or none does), each with the
  job's ``gpus`` / ``gpu_memory`` / ``cpu`` / ``memory``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ...backends.base import PYTHON_NAMES
from ...contract import MAX_ARGS, format_gpus
from .errors import APIError

PROGRAM_FIELDS = ("script", "args", "command")


@dataclass
class Program:
    script: str | None = None
    args: list[str] | None = None
    command: list[str] | None = None
    name: str = ""  # the job's default name


def _strings(value: Any, field: str, empty_ok: bool) -> list[str]:
    if not isinstance(value, list):
        raise APIError(400, f"{field}: must be a list of strings", field)
    if not value and not empty_ok:
        raise APIError(400, f"{field}: must not be empty (e.g. [\"python\", \"-m\", \"mypkg.train\"])", field)
    if len(value) > MAX_ARGS:
        raise APIError(400, f"{field}: at most {MAX_ARGS} items", field)
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise APIError(400, f"{field}[{i}]: must be a string", field)
        text = str(item)
        if "\0" in text:
            raise APIError(400, f"{field}[{i}]: must not contain a NUL character", field)
        out.append(text)
    if field == "command" and not out[0].strip():
        raise APIError(400, "command[0]: must name a program", field)
    return out


def program(data: dict, workdir: Callable[[], str]) -> Program | None:
    """The script or command of a submission, None for a notebook job. ``workdir()`` gives the
    user's working directory (it raises ValueError when there is none)."""
    script, command = data.get("script"), data.get("command")
    args = data.get("args")
    if script is None and command is None:
        if args is not None:
            raise APIError(400, "args: only a script job takes args (give script, or put them in command)", "args")
        return None
    given = [k for k in ("notebook", "notebook_content", "script", "command") if data.get(k) is not None]
    if len(given) > 1:
        raise APIError(400, f"{given[1]}: give exactly one of notebook, notebook_content, script and command "
                            f"(got {', '.join(given)})", given[1])
    if data.get("parameters"):
        raise APIError(400, "parameters: papermill parameters are for notebook jobs; pass a script's "
                            "arguments in args", "parameters")
    if command is not None:
        argv = _strings(command, "command", empty_ok=False)
        if args is not None:
            raise APIError(400, "args: a command job takes its arguments in command", "args")
        if argv[0] in PYTHON_NAMES and len(argv) > 2 and argv[1] == "-m":
            name = argv[2]  # python -m mypkg.train
        elif argv[0] in PYTHON_NAMES and len(argv) > 1 and not argv[1].startswith("-"):
            name = os.path.splitext(os.path.basename(argv[1]))[0]  # python train.py
        else:
            name = os.path.basename(argv[0])
        return Program(command=argv, name=name[:255])
    if isinstance(script, str) and script.strip() and not os.path.isabs(script) and not script.endswith(".py"):
        raise APIError(400, f"script: {script!r} is not a Python file (.py); run anything else with command",
                       "script")
    argv = _strings(args, "args", empty_ok=True) if args is not None else []
    # the service sees the working directory on the local backend; on Kubernetes it usually does not
    # (the user's volume is mounted in the job's pod only): then python reports a missing file in the log
    in_workdir("script", script, workdir, must_exist="if-visible")
    return Program(script=script, args=argv, name=os.path.splitext(os.path.basename(script))[0])


def in_workdir(field: str, rel: Any, workdir: Callable[[], str], must_exist: str = "yes") -> tuple[str, str]:
    """``rel`` as a file in the user's working directory: (the directory, the file's real path).
    400 naming ``field`` when it is not a relative path staying inside it, or the file is missing
    (``must_exist``: ``yes``, or ``if-visible``: only when the service sees the directory)."""
    if not isinstance(rel, str) or not rel.strip():
        raise APIError(400, f"{field}: must be a path relative to your working directory", field)
    if os.path.isabs(rel):
        raise APIError(400, f"{field}: must be relative to your working directory, not absolute", field)
    try:
        wd = workdir()
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None
    path = os.path.realpath(os.path.join(wd, rel))
    if not path.startswith(os.path.realpath(wd) + os.sep):
        raise APIError(400, f"{field}: must stay inside your working directory", field)
    if (must_exist == "yes" or os.path.isdir(wd)) and not os.path.isfile(path):
        raise APIError(400, f"{field}: no such file {rel!r} in your working directory on the hub ({wd})", field)
    return wd, path


def check_pods(w: Any, max_pods: int, nodes: list) -> None:
    """A gang must fit the pool at all: at most ``max_pods`` workers, and no more workers than
    the nodes can hold at once (the scheduler would keep it queued forever)."""
    if w.pods > max_pods:
        raise APIError(400, f"pods: at most {max_pods} workers per job (c.GPUPool.max_pods)", "pods")
    if w.pods < 2 or not (w.gpus or w.gpu_memory):
        return
    if w.gpu_memory:
        fits = sum(n.gpus * (n.gpu_memory // w.gpu_memory if n.gpu_memory else 1) for n in nodes)
        each = "that much GPU memory"
    elif w.gpus < 1:
        fits = sum(n.gpus * int(1 / w.gpus + 1e-9) for n in nodes)
        each = format_gpus(w.gpus)
    else:
        fits = sum(int(n.gpus // w.gpus) for n in nodes)
        each = format_gpus(w.gpus)
    if w.pods > fits:
        total = sum(n.gpus for n in nodes)
        raise APIError(400, f"pods: {w.pods} workers with {each} each do not fit in the pool (its {total} GPUs "
                            f"hold at most {fits} such workers at once)", "pods")
