"""The job backend interface: how the hub service runs a notebook job somewhere.

The scheduler loop (``gpupool.hub_ext.loop``) decides *what* runs *where*; a backend only carries
it out. Two implementations: :mod:`gpupool.backends.local` (processes on this machine, the
default) and a Kubernetes backend. A backend is chosen with ``c.GPUPool.backend``.

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
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

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
    job_dir: str  # <job_root>/<job_id>
    checkpoint_dir: str  # kept across attempts
    stop_file: str  # exists = "checkpoint and stop now"
    env: dict[str, str] = field(default_factory=dict)  # GPU visibility, caps, GPUPOOL_* (see hub_ext.loop)
    placements: list[dict] = field(default_factory=list)  # [{"pod", "node", "gpus", "fraction"}]
    kernel_name: str = ""
    python: str = ""  # interpreter that runs papermill
    run_as: str | None = None  # system user to run as (None: the service's own user)
    queue: str = ""  # the job's queue (Kubernetes: the pod's gpupool.io/queue label)
    kind: str = ""  # train | build | inference ... (Kubernetes: the gpupool.io/kind label)
    cpu: float = 0.0  # CPU cores the job asked for (0: the backend's default)
    memory: int = 0  # bytes of memory the job asked for (0: the backend's default)


@dataclass
class RunState:
    state: str  # RUNNING | EXITED | LOST
    exit_code: int | None = None
    detail: str = ""  # a sentence for the job's reason (e.g. "killed by signal 9")


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

    def pids(self, handle: dict) -> set[int]:
        """Process ids of the run on this machine (for NVML memory accounting); empty if unknown."""
        return set()

    async def close(self) -> None:
        """Release backend resources at service shutdown (runs keep going)."""
