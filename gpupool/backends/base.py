"""The job backend interface: how the hub service runs a notebook job somewhere.

The scheduler loop (``gpupool.hub_ext.runtime.loop``) decides *what* runs *where*; a backend
only carries it out. Two implementations: :mod:`gpupool.backends.local` (processes on this
machine, the default) and a Kubernetes backend. A backend is chosen with ``c.GPUPool.backend``.

Life of a run (one *attempt* of a job; a requeued job gets a new attempt and a new ``run_id``)::

    handle = await backend.start(spec)            # the loop has already persisted status=starting
    state = await backend.poll(handle)            # every cycle: running / exited(code) / lost
    await backend.request_checkpoint(handle, spec, reason) # preemption or cancel: "save and stop"
    await backend.terminate(handle, force=False)  # after the grace period (SIGTERM-like)
    await backend.terminate(handle, force=True)   # still there after kill_after (SIGKILL-like)

After a service restart the loop calls ``adopt(spec, handle)`` for every run the database says
holds GPUs (``handle`` is None when the service died between persisting ``starting`` and
persisting the handle): the backend finds the run again (keep tracking it), reports that it
ended meanwhile (with its exit code when known), or reports it lost (the loop requeues it).

Rules for implementations:

* ``start`` must tag the run with ``spec.run_id`` so ``adopt`` can find it without a handle
  (local: an environment variable of every process; Kubernetes: a label).
* ``handle`` is a JSON-serialisable dict; the loop stores it in the database as is.
* Methods must not block the event loop for long (run blocking client calls in a thread).
* ``request_checkpoint`` must make ``gpupool.checkpoint.should_stop()`` inside the job return True
  within a second (local: the stop file ``spec.stop_file``).
* Optional, for a backend that knows the cluster (Kubernetes): ``async start_watching()`` (the
  loop calls it at service start), ``nodes() -> list[NodeSpec] | None`` and ``gpu_uuids() ->
  dict | None`` (the loop takes them every cycle; None: keep the configured nodes),
  ``why_unschedulable() -> dict | None`` (node -> reason, shown by the API's /nodes), and an
  ``inventory.changed`` asyncio.Event the loop waits on to run a cycle when nodes change.
* Exit code convention: 0 = the notebook ran to the end; anything else is a failure, unless the
  loop asked the run to stop (then the job is requeued or cancelled, whatever the code).

Programs: ``spec.command`` is None for a notebook (the backend runs papermill on
``spec.notebook``) or the argv of a script or command job; a leading ``python`` / ``python3`` means
the job's interpreter (the one papermill runs with), see :func:`program_argv`.

Distributed jobs (``spec.pods`` > 1, a gang): the backend starts one *worker* per placement, all
of them or none, each with ``spec.env``, its own ``spec.worker_env[rank]`` (its pod's GPUs) and
the rendezvous variables of :func:`gpupool.distributed.worker_env`; worker ``rank`` writes
:func:`worker_file` of the log, the output notebook and the exit status. The run is one unit:
``poll`` reports it running until every worker has ended, and once one worker fails the backend
stops the others (:func:`gang_state` decides); ``request_checkpoint`` and ``terminate`` reach
every worker.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from ..protocol import JobDir, worker_file  # noqa: F401 (the job directory's layout; re-exported for the backends)

RUNNING = "running"
EXITED = "exited"
LOST = "lost"


@dataclass
class JobSpec:
    """Everything a backend needs to start one attempt of a job."""

    job_id: str  # "j-000042"
    run_id: str  # "j-000042.3.<instance>": job id + attempt + this service's id (unique on the machine)
    attempt: int
    user: str
    notebook: str  # the submitted notebook (a copy kept in job_dir)
    output: str  # where papermill writes the executed notebook
    log: str  # papermill's log (appended to across attempts)
    parameters: dict[str, Any]
    workdir: str  # the user's working directory (cwd of the notebook)
    job_dir: str  # <job_root>/<job_id> (gpupool.protocol.JobDir: which file lives where)
    checkpoint_dir: str  # kept across attempts
    stop_file: str  # exists = "checkpoint and stop now" (gpupool.protocol.write_stop)
    env: dict[str, str] = field(default_factory=dict)  # protocol.gpu_env + protocol.job_env
    placements: list[dict] = field(default_factory=list)  # [{"pod", "node", "gpus", "fraction"}]
    kernel_name: str = ""
    python: str = ""  # interpreter that runs papermill
    run_as: str | None = None  # system user to run as (None: the service's own user)
    queue: str = ""  # the job's queue (Kubernetes: the pod's gpupool.io/queue label)
    kind: str = ""  # train | build | inference ... (Kubernetes: the gpupool.io/kind label)
    cpu: float = 0.0  # CPU cores the job asked for (0: the backend's default)
    memory: int = 0  # bytes of memory the job asked for (0: the backend's default)
    command: list[str] | None = None  # None: papermill runs ``notebook``; else a script/command job's argv
    pods: int = 1  # workers (a gang when > 1): one per entry of ``placements``
    worker_env: list[dict[str, str]] = field(default_factory=list)  # per rank: its pod's GPU variables
    # per rank: a fractional worker's GPU memory cap ({"gpu": index, "hard": bytes, "soft": bytes}; {} for none)
    gpu_caps: list[dict[str, int]] = field(default_factory=list)
    # an endpoint (kind inference): each worker is a replica serving HTTP on ``$PORT``, restarted by
    # the backend up to ``max_restarts`` times when it exits (local: the runner; Kubernetes: the kubelet)
    endpoint: bool = False
    max_restarts: int = 0

    @property
    def files(self) -> JobDir:
        """The job directory's layout (run directories, exit files)."""
        return JobDir(self.job_dir)

    def worker_log(self, rank: int) -> str:
        return worker_file(self.log, rank)

    def worker_output(self, rank: int) -> str:
        return worker_file(self.output, rank)


@dataclass
class RunState:
    state: str  # RUNNING | EXITED | LOST
    exit_code: int | None = None
    detail: str = ""  # a sentence for the job's reason (e.g. "killed by signal 9")
    rank: int | None = None  # a gang: the worker whose end ended the run


PYTHON_NAMES = ("python", "python3")


def endpoint_targets(handle: dict | None) -> list[str]:
    """The base URLs an endpoint's run serves on (``http://host:port``), one per replica the
    service proxies to: ``target`` of the run's handle and of each worker's (local), or the
    handle's ``targets`` (Kubernetes: the Service in front of the pods)."""
    if not handle:
        return []
    if handle.get("targets"):
        return [str(t) for t in handle["targets"]]
    return [str(h["target"]) for h in [handle, *handle.get("workers", [])] if h.get("target")]


def worker_run_id(run_id: str, rank: int) -> str:
    """The run id of worker ``rank`` (it tags the worker's processes or pod; each worker's runner
    cleans up only its own): the run's id for rank 0, ``<run id>.r<rank>`` for the others."""
    return run_id if not rank else f"{run_id}.r{int(rank)}"


def program_argv(command: list[str] | None, python: str, notebook_cmd: list[str]) -> list[str]:
    """What a worker runs: ``notebook_cmd`` (papermill) for a notebook job (``command`` None),
    else the command with a leading ``python``/``python3`` replaced by ``python`` (the job
    interpreter)."""
    if command is None:
        return notebook_cmd
    argv = list(command)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = python
    return argv


def gang_state(states: list[RunState], cause: int | None = None) -> tuple[RunState, int | None]:
    """The state of a gang from its workers' states (index = rank), and the rank whose failure
    ends it (``cause``: the one recorded by an earlier poll, kept so the workers stopped because
    of it are not blamed). The run is RUNNING while any worker runs; when one has failed while
    others run, the caller must stop them (the returned cause is not None and the state is
    RUNNING). A worker killed by a signal or gone (LOST) is the preferred cause over one that
    exited with an error (its peers' errors usually follow from its death); the gang is then
    LOST, so the loop requeues it. Every worker done with status 0: EXITED 0."""
    failed = [r for r, s in enumerate(states) if s.state == LOST or (s.state == EXITED and s.exit_code != 0)]
    if cause is None and failed:
        died = [r for r in failed if states[r].state == LOST or (states[r].exit_code or 0) > 128]
        cause = (died or failed)[0]
    if any(s.state == RUNNING for s in states):
        detail = f"stopping every worker: worker {cause} ended ({states[cause].detail})" if cause is not None else ""
        return RunState(RUNNING, None, detail), cause
    if cause is None:
        return RunState(EXITED, 0, states[0].detail if states else "", rank=None), None
    s = states[cause]
    n = len(states)
    detail = f"worker {cause} of {n}: {s.detail}; the other workers were stopped"
    if s.state == LOST or (s.exit_code or 0) > 128:
        return RunState(LOST, s.exit_code, detail, rank=cause), cause
    return RunState(EXITED, s.exit_code, detail, rank=cause), cause


class JobBackend(abc.ABC):
    """Runs notebook jobs. Subclass and name it in ``c.GPUPool.backend``."""

    name = "base"

    def __init__(self, settings: Any = None, log: Any = None):
        self.settings = settings
        import logging

        self.log = log or logging.getLogger("gpupool.backend")

    @abc.abstractmethod
    async def start(self, spec: JobSpec) -> dict:
        """Start the run; return its handle. Raise to fail the job (the message becomes its reason)."""

    @abc.abstractmethod
    async def poll(self, handle: dict) -> RunState:
        """Is the run still there?"""

    @abc.abstractmethod
    async def request_checkpoint(self, handle: dict, spec: JobSpec, reason: str = "") -> None:
        """Ask the run to save a checkpoint and exit (it keeps running until it does); ``reason``
        is what ``gpupool.checkpoint.stop_reason()`` returns inside the job."""

    @abc.abstractmethod
    async def terminate(self, handle: dict, force: bool = False) -> None:
        """Stop the run: politely (SIGTERM) or, with ``force``, at once (SIGKILL)."""

    @abc.abstractmethod
    async def adopt(self, spec: JobSpec, handle: dict | None) -> tuple[dict | None, RunState]:
        """After a service restart: find the run again. Returns (handle, state)."""

    def restarts(self, handle: dict, job_dir: str, attempt: int) -> int:
        """How often an endpoint's servers were restarted in ``attempt``, every replica together:
        the counts their runners keep in the job directory (local processes and pods alike)."""
        files = JobDir(job_dir)
        total = 0
        for rank in range(1 + len(handle.get("workers", []))):
            try:
                with open(files.restarts_file(attempt, rank)) as f:
                    total += int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return total

    def pids(self, handle: dict) -> set[int]:
        """Process ids of the run on this machine (for NVML memory accounting); empty if unknown."""
        return set()

    async def node_conditions(self) -> dict[str, tuple[str, str]]:
        """Nodes this backend finds out of service by itself, asked every cycle: node ->
        (``"fail"`` or ``"drain"``, why in words). A node no longer named is back in service (unless
        an admin holds it out). Default: none."""
        return {}

    async def close(self) -> None:
        """Release backend resources at service shutdown (runs keep going)."""
