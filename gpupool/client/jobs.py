"""Notebook jobs: ``gpupool.submit(...)`` and :class:`Job`."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..contract import ENDED, PREEMPTED, CANCELLED, Placement, format_request, history_marker
from .api import BadRequest, Client, GPUPoolError, get_client
from .progress import Progress

# Fields that change while a job lives: reading them refreshes a stale, unfinished job.
_LIVE_MAX_AGE = 2.0


class Job:
    """A notebook job in the pool.

    ``Job("j-000042")`` attaches to an existing job. Attributes mirror the service's job object
    (docs/api.md). ``status``, ``reason``, ``position``, ``allocation`` and ``metrics`` of an
    unfinished job are refreshed from the service when older than two seconds; ``refresh()``
    forces it.
    """

    def __init__(self, job: str | Mapping[str, Any], *, client: Client | None = None):
        self._client = client
        #: the file on this machine whose content was sent at submission (None: a path on the hub)
        self.local_notebook: Path | None = None
        if isinstance(job, Mapping):
            self._data = dict(job)
            self._fetched = time.monotonic()
        else:
            self._data = {"id": str(job)}
            self._fetched = 0.0
            self.refresh()

    # -- plumbing -----------------------------------------------------------------------------
    @property
    def client(self) -> Client:
        return get_client(self._client)

    def refresh(self) -> "Job":
        """Fetch the job's current state from the service; returns the job."""
        self._data = self.client.job(self.id)
        self._fetched = time.monotonic()
        return self

    def _live(self, key: str, default=None):
        if self._data.get("status") not in ENDED and time.monotonic() - self._fetched > _LIVE_MAX_AGE:
            self.refresh()
        return self._data.get(key, default)

    @property
    def data(self) -> dict:
        """The raw job object as last fetched."""
        return dict(self._data)

    @property
    def url(self) -> str | None:
        """An endpoint's full URL through the hub (docs/endpoints.md); None for other jobs."""
        from .serving import endpoint_url

        return endpoint_url(self._data, self._client)

    # -- attributes ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._data["id"]

    def __getattr__(self, name: str):
        # name, user, queue, kind, gpus, gpu_memory, priority, preemptible, notebook, parameters,
        # sweep, submitted_at, started_at, finished_at, preemptions, restarts, exit_code, checkpoint
        if name.startswith("_"):
            raise AttributeError(name)
        data = self.__dict__.get("_data") or {}
        if name in data:
            if name in ("finished_at", "exit_code", "started_at", "preemptions", "restarts", "checkpoint"):
                return self._live(name)
            return data[name]
        raise AttributeError(f"Job has no attribute {name!r}")

    @property
    def status(self) -> str:
        """queued, starting, running, preempting, succeeded, failed or cancelled."""
        return self._live("status")

    @property
    def reason(self) -> str:
        """Why the job is in its state, in words (why it waits, why it failed...)."""
        return self._live("reason") or ""

    @property
    def reason_code(self) -> str | None:
        """Why the job waits, for programs: one of ``gpupool.contract.REASON_CODES`` (None unless queued)."""
        return self._live("reason_code")

    @property
    def position(self) -> int | None:
        return self._live("position")

    @property
    def allocation(self) -> list:
        return self._live("allocation") or []

    @property
    def done(self) -> bool:
        return self.status in ENDED

    @property
    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        """Metrics the job logged with ``gpupool.log_metric``: name -> [(step, value), ...] by step."""
        return metrics_of(self._live("metrics") or {})

    def metric(self, name: str, default: float | None = None) -> float | None:
        """The latest value (highest step) the job logged for metric ``name``; ``default`` if none."""
        points = self.metrics.get(name)
        return points[-1][1] if points else default

    # -- actions ------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, progress: bool = True, poll: float = 1.0) -> "Job":
        """Block until the job has finished (succeeded, failed or cancelled); returns the job.

        With ``progress`` it shows the status and the reason (the queue position while it waits):
        in a notebook one line that updates in place and wraps, in a terminal a line per change.
        Raises ``TimeoutError`` when ``timeout`` seconds pass first (the job keeps running).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress(self.id) if progress else None
        delay = poll
        try:
            while True:
                self.refresh()
                status = self._data.get("status")
                if bar is not None:
                    bar.show(str(status or "?"), status_line(self._data))
                if status in ENDED:
                    return self
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.id} is still {status} after {timeout:g}s: "
                                       f"{self._data.get('reason') or ''}")
                sleep = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
                time.sleep(sleep)
                delay = min(delay * 1.25, 5.0)
        finally:
            if bar is not None:
                bar.close()

    def logs(self, offset: int = 0, rank: int | None = None) -> str:
        """The job's log so far (from byte ``offset``): papermill's, or the program's output;
        ``rank`` picks a worker of a distributed job (default: rank 0)."""
        return self.client.log(self.id, offset, rank=rank)[0]

    @property
    def workers(self) -> list[dict]:
        """The job's workers: ``[{"rank", "node", "gpus", "fraction", "log"}, ...]``."""
        return self._live("workers") or []

    def follow_logs(self, poll: float = 1.0, rank: int | None = None) -> Iterator[str]:
        """Yield new log text (of worker ``rank``) as it arrives until the job has finished."""
        offset = 0
        while True:
            text, offset = self.client.log(self.id, offset, rank=rank)
            if text:
                yield text
            if self.refresh().status in ENDED:
                text, offset = self.client.log(self.id, offset, rank=rank)
                if text:
                    yield text
                return
            time.sleep(poll)

    def cancel(self) -> "Job":
        """Cancel the job (a running job is asked to stop with the grace period)."""
        self._data = self.client.cancel(self.id)
        self._fetched = time.monotonic()
        return self

    def output(self):
        """The executed notebook as an ``nbformat.NotebookNode`` (NotFound until one exists)."""
        import nbformat
        return nbformat.reads(self.client.output(self.id), as_version=4)

    # -- display ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        d = self._data
        return f"<Job {d.get('id')} {d.get('name', '')!s} ({request_text(d)}) {status_line(d)}>"

    def _repr_html_(self) -> str:
        from gpupool.widgets.render import job_html
        try:
            url = self.url
        except GPUPoolError:  # no hub configured here: the endpoint's path alone
            url = None
        return job_html({**self._data, "url": url} if url else self._data)

    def __eq__(self, other) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


def request_text(j: Mapping[str, Any]) -> str:
    """The GPU request in words: ``0.5 GPU``, ``2 GPUs``, ``8Gi of one GPU``, ``0 GPUs (CPU only)``,
    ``2 workers x 4 GPUs``."""
    return format_request(j.get("gpus"), j.get("gpu_memory"), j.get("pods"))


def status_line(j: Mapping[str, Any]) -> str:
    """The status and its reason, the status said once: ``succeeded: the notebook ran to the end``,
    ``queued in vision: position 2, ...``, ``running: ...``."""
    status, reason = str(j.get("status") or "?"), (j.get("reason") or "").strip()
    if not reason:
        return status
    return reason if reason.startswith(status) else f"{status}: {reason}"


def marker(j: Mapping[str, Any]) -> str:
    """``resumed x2`` / ``requeued x1`` for a job with past attempts ("" on its first)."""
    return history_marker(j.get("status"), j.get("attempts"))


def attempt_words(a: Mapping[str, Any]) -> dict[str, str]:
    """One entry of a job's ``history`` in words: ``end`` (how it ended: ``preempted``, ``failed,
    exit 1``, ``running``), ``on`` (each rank's placement), ``resumed`` (the checkpoint and step)."""
    end = str(a.get("outcome") or "running")
    cause = a.get("stop_cause")
    if cause and not (end == PREEMPTED and cause == "preempt" or end == CANCELLED and cause == "cancel"):
        end += f" (asked to stop: {cause})"
    if a.get("exit_code") is not None:
        end += f", exit {a['exit_code']}"
    places = [(p.get("rank", 0), Placement(str(p.get("node")), tuple(p.get("gpus") or ()),
                                           float(p.get("fraction", 1.0))).describe()) for p in a.get("placement") or []]
    on = places[0][1] if len(places) == 1 else "; ".join(f"rank {r} on {where}" for r, where in places)
    resumed = ""
    if a.get("resumed_from"):
        point = a["resumed_from"]
        resumed = os.path.basename(str(point.get("checkpoint") or ""))
        if point.get("step") is not None:
            resumed += f" (step {point['step']})"
    return {"end": end, "on": on or "-", "resumed": resumed}


def metrics_of(raw: Mapping[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """The API's metrics object -> {name: [(step, value), ...]} sorted by step."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name, points in (raw or {}).items():
        pts = []
        for i, p in enumerate(points or []):
            if isinstance(p, Mapping):
                step = p.get("step")
                pts.append((int(step) if step is not None else i, float(p.get("value"))))
            elif isinstance(p, (list, tuple)) and len(p) >= 2:
                pts.append((int(p[0]), float(p[1])))
        pts.sort(key=lambda sv: sv[0])
        out[name] = pts
    return out


def local_notebook(notebook) -> Path | None:
    """The local file a notebook path names, when there is one on this machine (its content is sent)."""
    if isinstance(notebook, Mapping) or not isinstance(notebook, (str, os.PathLike)):
        return None
    p = Path(os.fspath(notebook)).expanduser()
    return p.resolve() if p.is_file() else None


def _notebook_ref(notebook) -> dict:
    """Body fields naming the notebook: ``notebook_content`` (a dict, or the content of a local
    file) or ``notebook`` (a path in your working directory on the hub)."""
    if isinstance(notebook, Mapping):
        return {"notebook_content": _plain(notebook)}
    if not isinstance(notebook, (str, os.PathLike)):
        raise TypeError("notebook must be a path such as 'train.ipynb' or an nbformat notebook dict")
    path = os.fspath(notebook)
    if not path.endswith(".ipynb"):
        raise GPUPoolError(f"notebook: {path!r} is not a .ipynb notebook or a .py script (run other programs "
                           "as a command: a list such as ['bash', 'run.sh'])", field="notebook")
    local = local_notebook(path)
    if local is not None:  # a file on this machine: send what it holds (like sbatch sends its script)
        try:
            doc = json.loads(local.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise GPUPoolError(f"notebook: the local file {local} is not a readable Jupyter notebook ({e})",
                               field="notebook") from None
        return {"notebook_content": doc}
    if Path(path).expanduser().is_absolute():
        raise GPUPoolError(f"notebook: there is no file {path} on this machine (an absolute path is read on this "
                           "machine and its content sent; a relative path that is not a file here names a "
                           "notebook in your working directory on the hub)", field="notebook")
    return {"notebook": path}


def _plain(obj):
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _program_ref(target, args) -> dict | None:
    """Body fields of a script job (``"train.py"`` + ``args``) or a command job (an argv list);
    None when ``target`` is a notebook."""
    if isinstance(target, (list, tuple)):
        if args is not None:
            raise GPUPoolError("args: a command takes its arguments in the list itself", field="args")
        return {"command": [str(a) for a in target]}
    if isinstance(target, (str, os.PathLike)) and os.fspath(target).endswith(".py"):
        path = Path(os.fspath(target)).expanduser()
        body = {"script": _home_relative(path) if path.is_absolute() or path.exists() else os.fspath(target)}
        if args is not None:
            if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
                raise GPUPoolError("args: must be a list of strings, e.g. ['--lr', '3e-4']", field="args")
            body["args"] = [str(a) for a in args]
        return body
    if args is not None:
        raise GPUPoolError("args: only a script (.py) takes args; a notebook takes parameters", field="args")
    return None


def _home_relative(p: Path) -> str:
    """A local path as the service wants it: relative to the user's home (the job's working
    directory on the hub), or ``$GPUPOOL_NOTEBOOK_ROOT`` when set."""
    p = p.resolve()
    home = Path(os.path.expanduser("~")).resolve()
    root = os.environ.get("GPUPOOL_NOTEBOOK_ROOT")
    for base in ([Path(root).resolve()] if root else []) + [home]:
        try:
            return str(p.relative_to(base))
        except ValueError:
            continue
    return str(p)


def build_body(notebook=None, *, gpus: float | None = None, gpu_memory: str | int | None = None,
               parameters: Mapping[str, Any] | None = None, queue: str | None = None,
               kind: str | None = None, priority: int | None = None, preemptible: bool | None = None,
               checkpoint_on_signal: bool | None = None, name: str | None = None,
               cpu: float | None = None, memory: str | int | None = None, sweep: str | None = None,
               notebook_content: Mapping | None = None, args=None, pods: int | None = None,
               pools: Sequence[str] | str | None = None) -> dict:
    program = _program_ref(notebook, args)
    if program is None and (notebook is None) == (notebook_content is None):
        raise GPUPoolError("give exactly one of notebook (a path) or notebook_content (a notebook dict), "
                           "a script (.py) or a command (a list)", field="notebook")
    if program is not None and notebook_content is not None:
        raise GPUPoolError("give either a script/command or notebook_content, not both", field="notebook_content")
    if program is not None:
        body = program
    else:
        body = _notebook_ref(notebook) if notebook is not None else {"notebook_content": _plain(notebook_content)}
    if name is None and "notebook_content" in body and notebook is not None and not isinstance(notebook, Mapping):
        name = Path(os.fspath(notebook)).stem  # the service would call inline content "notebook"
    if pods is not None:
        body["pods"] = pods
    if pools is not None:
        body["pools"] = [pools] if isinstance(pools, str) else list(pools)
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise GPUPoolError("parameters: must be a dict of papermill parameters", field="parameters")
        body["parameters"] = dict(parameters)
    for key, value in (("gpus", gpus), ("gpu_memory", gpu_memory), ("queue", queue), ("kind", kind),
                       ("priority", priority), ("preemptible", preemptible),
                       ("checkpoint_on_signal", checkpoint_on_signal), ("name", name), ("cpu", cpu),
                       ("memory", memory), ("sweep", sweep)):
        if value is not None:
            body[key] = value
    return body


def submit(notebook=None, *, gpus: float | None = None, gpu_memory: str | int | None = None,
           parameters: Mapping[str, Any] | None = None, queue: str | None = None, kind: str | None = None,
           priority: int | None = None, preemptible: bool | None = None,
           checkpoint_on_signal: bool | None = None, name: str | None = None, cpu: float | None = None,
           memory: str | int | None = None, sweep: str | None = None,
           notebook_content: Mapping | None = None, args=None, pods: int | None = None,
           pools: Sequence[str] | str | None = None, client: Client | None = None) -> Job:
    """Run a notebook (papermill, with ``parameters``), a Python script (``"train.py"``, with
    ``args=[...]``) or a command (``["python", "-m", "mypkg.train", "--lr", "3e-4"]``) as a job in
    the pool and return its :class:`Job`.

    ``gpus`` is whole GPUs or a fraction below 1 (``0.5``); ``gpu_memory`` (``"8Gi"``) asks for a
    slice by memory instead; ``gpus=0`` (or neither) is a CPU-only job. ``pods=N`` runs N workers,
    each with that many GPUs, started together with the torch.distributed environment
    (``gpupool.distributed``). ``pools`` names the node pools it may run in, most preferred first
    (default: the hub's preference for its kind). ``queue`` defaults to your first queue; ``kind`` is ``train``,
    ``hpo-trial`` or ``inference``. A notebook that is a file on this machine is read and its
    content sent (``job.local_notebook`` names it); any other relative notebook path names a
    notebook in your working directory on the hub. A script path is relative to your home (a local
    path under your home is converted). Or pass ``notebook_content`` (an nbformat notebook dict).
    """
    body = build_body(notebook, gpus=gpus, gpu_memory=gpu_memory, parameters=parameters, queue=queue,
                      kind=kind, priority=priority, preemptible=preemptible,
                      checkpoint_on_signal=checkpoint_on_signal, name=name, cpu=cpu, memory=memory,
                      sweep=sweep, notebook_content=notebook_content, args=args, pods=pods, pools=pools)
    return post_job(body, notebook, client)


def post_job(body: dict, notebook=None, client: Client | None = None) -> Job:
    """Submit a body made by :func:`build_body` for ``notebook``; the returned job's
    ``local_notebook`` names the local file whose content was sent."""
    try:
        data = get_client(client).submit(body)
    except BadRequest as e:
        if e.field == "notebook" and "notebook" in body:  # looked up on the hub after not being found here
            raise BadRequest(f"{e.message}; nor is it a file on this machine ({Path.cwd() / body['notebook']})",
                             status=e.status, field=e.field, url=e.url) from None
        raise
    job = Job(data, client=client)
    if "notebook_content" in body:
        job.local_notebook = local_notebook(notebook)
    return job


def jobs(status: str | None = None, *, user: str | None = None, sweep: str | None = None,
         client: Client | None = None) -> list[Job]:
    """Your jobs (admins: everyone's; ``user=`` filters), optionally by ``status`` or ``sweep``."""
    return [Job(d, client=client) for d in get_client(client).jobs(status=status, user=user, sweep=sweep)]


def queues(client: Client | None = None) -> list[dict]:
    """The queues with deserved quota, fair share, allocation and pending counts."""
    return get_client(client).queues()


def nodes(client: Client | None = None) -> list[dict]:
    """The nodes and their GPUs with allocations (and utilization where measured)."""
    return get_client(client).nodes()
