"""The gpupool service: ``python -m gpupool.hub_ext.app``, started by JupyterHub (``configure(c)``).

It reads its configuration from ``GPUPOOL_CONFIG`` (JSON of every ``c.GPUPool`` trait, computed
by the hub when it starts the service), listens on ``JUPYTERHUB_SERVICE_URL`` under
``JUPYTERHUB_SERVICE_PREFIX``, authenticates requests through the Hub (``JUPYTERHUB_API_URL``,
``JUPYTERHUB_API_TOKEN``) and runs the scheduling loop.

Only one instance may run the loop against a job root: it holds an exclusive lock on
``<job_root>/.service.lock`` (released by the kernel even on SIGKILL). SIGTERM / SIGINT stop it
promptly; running jobs keep running and are re-adopted by the next start.
"""
from __future__ import annotations

import asyncio
import fcntl
import gc
import importlib
import json
import logging
import os
import signal
import sys
import time
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import insert, select
from tornado import web

from .. import contract as C
from ..scheduler.spec import SpecError, parse_workload
from . import db as D
from . import schemas as S
from .api import APIError, routes, spec_error
from .auth import Authenticator, Identity
from .config import GPUPoolConfigError, Settings, from_json
from .gpus import check_gpus
from .loop import SchedulerLoop
from .metrics import Metrics
from .programs import check_pods, in_workdir, program
from .reconcile import WorkspaceReconciler

log = logging.getLogger("gpupool")


def make_backend(name: str, settings: Settings) -> Any:
    if name in ("", "local"):
        from ..backends.local import LocalBackend

        return LocalBackend(settings, logging.getLogger("gpupool.backend"))
    module, _, cls = name.rpartition(".")
    if not module:
        raise GPUPoolConfigError(f"c.GPUPool.backend: {name!r} is neither 'local' nor a module.Class path")
    try:
        return getattr(importlib.import_module(module), cls)(settings, logging.getLogger("gpupool.backend"))
    except (ImportError, AttributeError) as e:
        raise GPUPoolConfigError(f"c.GPUPool.backend: cannot load {name!r}: {e}") from None


class BatchInserter:
    """Group commit for submissions: the inserts of requests that arrive within a millisecond share
    one transaction (one SQLite commit), and each request gets its id once that commit is done.

    Requests are validated fully before they get here. Should the database still refuse a batch,
    its rows are inserted one by one, so that only the request at fault fails (with its own answer)."""

    def __init__(self, engine: Any, delay: float = 0.001):
        self.engine = engine
        self.delay = delay
        self.table = D.Workload.__table__
        self.pending: list[tuple[dict, asyncio.Future]] = []

    def insert(self, values: dict) -> "asyncio.Future[int]":
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((values, fut))
        if len(self.pending) == 1:
            loop.call_later(self.delay, self._flush)
        return fut

    def _insert(self, rows: list[dict]) -> list[int]:
        with self.engine.begin() as conn:
            stmt = insert(self.table).returning(self.table.c.id, sort_by_parameter_order=True)
            return [r[0] for r in conn.execute(stmt, rows)]

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        try:
            ids = self._insert([v for v, _ in batch])
        except Exception:  # nothing of the batch was committed: one by one, each gets its own answer
            if len(batch) > 1:
                log.warning("a batch of %d submissions was refused; storing them one by one", len(batch))
            for values, fut in batch:
                try:
                    (new_id,) = self._insert([values])
                except Exception as e:
                    log.exception("could not store a submission of %s", values.get("user"))
                    if not fut.done():
                        fut.set_exception(APIError(503, f"the gpupool database refused the job: {type(e).__name__}"))
                else:
                    if not fut.done():
                        fut.set_result(new_id)
            return
        for (_, fut), new_id in zip(batch, ids):
            if not fut.done():
                fut.set_result(new_id)


class Service:
    """Shared state of the handlers: settings, database, loop, auth, metrics; the submission logic."""

    def __init__(self, settings: Settings, sessions: Any, loop: SchedulerLoop, auth: Authenticator,
                 metrics: Metrics, nvml: Any = None):
        self.settings = settings
        self.sessions = sessions
        self.loop = loop
        self.auth = auth
        self.metrics = metrics
        self.nvml = nvml
        # (user, server) -> the hub's last_activity of that server, kept by the workspace reconciler
        self.server_activity: dict[tuple[str, str], str | None] = {}
        self.inserter = BatchInserter(sessions.kw["bind"])
        self.queue_map = {q.name: q for q in settings.queues}
        parents = {q.parent for q in settings.queues if q.parent}
        self.leaves = [q.name for q in settings.queues if q.name not in parents]

    # the node list may change while the service runs (a live Kubernetes inventory): read it each time
    @property
    def max_gpus(self) -> int:
        return max((n.gpus for n in self.settings.nodes), default=0)

    @property
    def max_gpu_memory(self) -> int:
        return max((n.gpu_memory for n in self.settings.nodes if n.gpus), default=0)

    # ------------------------------------------------------------------ queue access
    def may_use(self, ident: Identity, queue: str) -> bool:
        if queue not in self.leaves:
            return False
        if ident.admin:
            return True
        acc = self.settings.access.get(queue, {})
        users, groups = acc.get("users", []), acc.get("groups", [])
        if not users and not groups:
            return True
        return ident.name in users or any(g in groups for g in ident.groups)

    def default_queue(self, ident: Identity) -> str | None:
        pref = self.settings.pool.default_queue
        if pref and self.may_use(ident, pref):
            return pref
        return next((q for q in self.leaves if self.may_use(ident, q)), None)

    def _queue(self, ident: Identity, queue: str | None) -> str:
        if queue is None or queue == "":
            queue = self.default_queue(ident)
            if queue is None:
                raise APIError(403, f"{ident.name} may not use any queue; ask an admin to add you to one in "
                                    "c.GPUPool.queues", "queue")
            return queue
        if queue not in self.queue_map:
            raise APIError(400, f"queue: unknown queue {queue!r} (queues: {', '.join(self.leaves)})", "queue")
        if queue not in self.leaves:
            raise APIError(400, f"queue: {queue!r} is a department (it has child queues); submit to one of its "
                                "leaf queues", "queue")
        if not self.may_use(ident, queue):
            raise APIError(403, f"queue: {ident.name} may not submit to queue {queue!r}", "queue")
        return queue

    def _resources(self, request: S.Resources, queue: str, kind: str, user: str, **overrides: Any) -> Any:
        """The scheduler's rules for a request (fractions, whole GPUs, what the nodes can hold)."""
        entry: dict[str, Any] = {"name": "request", "queue": queue, "kind": kind, "user": user}
        for key in ("gpus", "gpu_memory", "cpu", "memory", "priority", "preemptible", "checkpoint_on_signal", "pods"):
            value = overrides.get(key, getattr(request, key, None))
            if value is not None:
                entry[key] = value
        if "gpus" in entry:  # the one GPU rule (hub_ext/gpus.py), shared with the spawn page
            try:
                entry["gpus"] = check_gpus(entry["gpus"])
            except ValueError as e:
                raise APIError(400, f"gpus: {e}", "gpus") from None
            if not entry["gpus"]:
                del entry["gpus"]  # one meaning of zero: no GPU, the same as leaving gpus out
        try:
            w = parse_workload(entry, "request", self.queue_map)
        except SpecError as e:
            raise spec_error(e) from None
        if w.gpus > 0 and self.max_gpus == 0:
            raise APIError(400, "gpus: the pool has no GPUs (ask for gpus: 0 or none)", "gpus")
        if w.gpus > self.max_gpus:
            raise APIError(400, f"gpus: no node has {w.gpus:g} GPUs (the largest has {self.max_gpus})", "gpus")
        if w.gpu_memory:
            if self.max_gpus == 0:
                raise APIError(400, "gpu_memory: the pool has no GPUs", "gpu_memory")
            if self.max_gpu_memory and w.gpu_memory > self.max_gpu_memory:
                raise APIError(400, f"gpu_memory: no GPU has {C.format_bytes(w.gpu_memory)} "
                                    f"(the largest has {C.format_bytes(self.max_gpu_memory)})", "gpu_memory")
        return w

    # ------------------------------------------------------------------ jobs
    async def new_job(self, ident: Identity, request: S.JobRequest | dict) -> D.Workload:
        """Check what depends on the pool (queues, nodes, the user's files), then store the job.
        ``request``: the validated body, or a dict (validated here)."""
        request = _typed(S.JobRequest, request)
        nb, content = request.notebook, request.notebook_content
        prog = program(request.model_dump(), lambda: self.loop.workdir(ident.name))
        if prog is None and (nb is None) == (content is None):
            raise APIError(400, "notebook: give exactly one of notebook (a path), notebook_content, script and "
                                "command", "notebook")
        kind = request.kind or C.DEFAULT_JOB_KIND
        queue = self._queue(ident, request.queue)
        w = self._resources(request, queue, kind, ident.name)
        check_pods(w, self.settings.pool.max_pods, self.settings.nodes)
        params = request.parameters or {}
        source: str | None = None
        self._workdir(ident.name)  # missing: created now (jobs run as the service's user) or refused now
        if prog is not None:
            name_default = prog.name
        elif nb is not None:
            _, source = in_workdir("notebook", nb, lambda: self.loop.workdir(ident.name))
            try:
                with open(source, "rb") as f:
                    doc = json.load(f)
            except (OSError, ValueError) as e:
                raise APIError(400, f"notebook: {nb!r} is not a readable Jupyter notebook ({e})", "notebook") from None
            _check_notebook(doc, "notebook")
            name_default = os.path.splitext(os.path.basename(nb))[0]
        else:
            _check_notebook(content, "notebook_content")
            name_default = "notebook"
        name = (request.name or name_default)[:C.MAX_NAME]
        values = dict(type=D.JOB, user=ident.name, server="", name=name, queue=queue, kind=kind,
                      gpus=w.gpus, gpu_memory=w.gpu_memory, cpu=w.cpu, memory=w.memory, priority=w.priority,
                      preemptible=w.preemptible, checkpoint_on_signal=w.checkpoint_on_signal,
                      notebook=nb, parameters=params, pods=w.pods,
                      source=None if prog else json.dumps(doc if source is not None else content),
                      script=prog and prog.script, args=prog and prog.args, command=prog and prog.command,
                      sweep=request.sweep, status=D.QUEUED, reason="submitted; waiting for the scheduler's next cycle",
                      submitted_at=time.time(), preemptions=0, restarts=0, attempt=0)
        new_id = await self.inserter.insert(values)  # committed before the 201
        self.metrics.submitted.inc()
        values.pop("source")
        # the view of what was just committed (an ORM instance costs more than the rest of the request)
        return SimpleNamespace(id=new_id, public_id=D.public_id(D.JOB, new_id), started_at=None, finished_at=None,
                               allocation=None, exit_code=None, checkpoint_path=None, last_checkpoint_at=None,
                               **values)

    def _workdir(self, user: str) -> str:
        """The user's working directory on the hub, where the job will run. Missing, it is created
        (as the demo's spawner creates homes) when jobs run as the service's own user; a system
        user's missing home is refused now rather than failing the job when it starts."""
        try:
            workdir = self.loop.workdir(user)
        except ValueError as e:
            raise APIError(400, f"notebook: {e}", "notebook") from None
        if os.path.isdir(workdir):
            return workdir
        if self.settings.pool.run_as_user and os.geteuid() == 0:
            raise APIError(400, f"your working directory on the hub ({workdir}) does not exist; ask an admin to "
                                "create it (c.GPUPool.work_dir)")
        try:
            os.makedirs(workdir, 0o755, exist_ok=True)
        except OSError as e:
            raise APIError(400, f"your working directory on the hub ({workdir}) does not exist and cannot be "
                                f"created: {e.strerror}") from None
        log.info("created the working directory %s of %s", workdir, user)
        return workdir

    # ------------------------------------------------------------------ workspaces
    async def request_workspace(self, user: str, server: str,
                                request: S.WorkspaceRequest | dict) -> tuple[D.Workload, bool]:
        request = _typed(S.WorkspaceRequest, request)
        groups, admin = await self.auth.user_info(user)
        owner = Identity(name=user, groups=groups, admin=admin)
        queue = self._queue(owner, request.queue)
        preemptible = request.preemptible
        if preemptible is None:
            preemptible = self.settings.pool.workspace_preemptible_default
        w = self._resources(request, queue, C.INTERACTIVE, user, preemptible=preemptible)
        with self.sessions() as s:
            existing = s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE, D.Workload.user == user,
                                                          D.Workload.server == server,
                                                          D.Workload.status.in_(D.ACTIVE))).first()
            if existing is not None:
                same = (existing.queue, existing.gpus, existing.gpu_memory, existing.preemptible) == \
                       (queue, w.gpus, w.gpu_memory, w.preemptible)
                if same:
                    return existing, False
                s.delete(existing)  # a different request replaces the old one
            row = D.Workload(type=D.WORKSPACE, user=user, server=server, name=request.name or server or user,
                             queue=queue, kind=C.INTERACTIVE, gpus=w.gpus, gpu_memory=w.gpu_memory, cpu=w.cpu,
                             memory=w.memory, priority=w.priority, preemptible=w.preemptible,
                             checkpoint_on_signal=False, parameters={}, status=D.QUEUED,
                             reason="requested; waiting for the scheduler's next cycle", submitted_at=time.time(),
                             preemptions=0, restarts=0, attempt=0)
            s.add(row)
            from .idle import on_workspace_request

            on_workspace_request(s, row, time.time())  # a suspended server coming back says so
            s.commit()
        return row, True

    # ------------------------------------------------------------------ live GPU readings
    def gpu_readings(self) -> dict[str, dict[int, dict]]:
        if self.nvml is None:
            return {}
        out = {}
        for node in self.settings.gpu_uuids:  # nodes discovered through NVML on this machine
            out[node] = self.nvml.utilization()
        return out


DEFAULT_KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _typed(model: type[S.BaseModel], request: Any) -> Any:
    if isinstance(request, model):
        return request
    try:
        return S.parse(model, request)
    except S.Invalid as e:
        raise APIError(400, e.message, e.field) from None


def _check_notebook(doc: Any, field: str) -> None:
    """Refuse what is not an nbformat-4 notebook; a notebook naming no kernel gets ``python3``
    (the jobs' Python, as papermill's ``-k python3``) instead of failing every run later."""
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise APIError(400, f"{field}: not a Jupyter notebook (an object with a 'cells' list)", field)
    if doc.get("nbformat") != 4:
        raise APIError(400, f"{field}: must be an nbformat 4 notebook", field)
    meta = doc.get("metadata")
    if meta is None:
        meta = doc["metadata"] = {}
    if not isinstance(meta, dict):
        raise APIError(400, f"{field}: metadata must be an object", field)
    spec = meta.get("kernelspec")
    if not isinstance(spec, dict) or not spec.get("name"):
        meta["kernelspec"] = dict(DEFAULT_KERNELSPEC)


def _acquire_lock(path: str, wait: float = 15.0) -> Any:
    f = open(path, "a+")
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                return None
            time.sleep(0.2)


async def serve(settings: Settings) -> int:
    pool = settings.pool
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL") or f"http://127.0.0.1:{pool.port}"
    u = urlparse(service_url)
    host, port = u.hostname or "127.0.0.1", u.port or pool.port
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or f"/services/{pool.service_name}/"
    os.makedirs(pool.job_root, exist_ok=True)
    lock = _acquire_lock(os.path.join(pool.job_root, ".service.lock"))
    if lock is None:
        log.error("another gpupool service holds %s; not starting a second scheduler on the same jobs",
                  os.path.join(pool.job_root, ".service.lock"))
        return 3
    for warning in settings.warnings:
        log.warning("%s", warning)
    engine = D.make_engine(pool.db_url)
    sessions = D.make_sessionmaker(engine)
    backend = make_backend(pool.backend, settings)
    from ..backends import nvml as nvml_mod

    reader = nvml_mod.Reader(nvml_mod.load_module(pool.nvml_module))  # checked by config.load
    nvml = reader if reader.available() else None
    if nvml is None:
        log.info("NVML not available: GPU memory enforcement, live readings and utilisation history are off")
    metrics = Metrics()
    api_url = pool.api_url or f"http://{host}:{port}{prefix.rstrip('/')}/api/v1/"
    loop = SchedulerLoop(settings, sessions, backend, metrics, api_url=api_url, nvml=nvml)
    from jupyterhub.services.auth import HubAuth

    hub_auth = HubAuth(cache_max_age=60)
    auth = Authenticator(hub_auth, sessions, hub_auth.api_url, hub_auth.api_token, pool.group_cache_seconds)
    svc = Service(settings, sessions, loop, auth, metrics, nvml)
    await loop.start()  # re-adopt / finish / requeue what the last run left, before answering anyone
    # workspaces whose server the hub no longer has (their release was lost): checked now and periodically
    reconciler = WorkspaceReconciler(loop, sessions, hub_auth.api_url, hub_auth.api_token,
                                     pool.workspace_reconcile_seconds, pool.workspace_release_grace,
                                     activity=svc.server_activity)
    reconciler.start()
    from .sampling import Sampler

    sampler = Sampler(sessions, svc.gpu_readings, pool.usage_sample_seconds, pool.usage_raw_retention,
                      pool.usage_rollup_seconds, pool.usage_rollup_retention, metrics=metrics)
    if nvml is not None and settings.gpu_uuids:
        sampler.start()
    svc.sampler = sampler
    from . import dashboard, idle, usage

    checker = idle.IdleChecker(loop, sessions, settings.idle_rules, pool.idle_window_seconds, metrics,
                               limits=settings.max_runtime, warning=pool.max_runtime_warning)
    checker.start()
    svc.idle = checker
    app = web.Application(usage.routes(prefix) + idle.routes(prefix) + dashboard.routes(prefix, pool.service_name)
                          + routes(prefix), gpupool=svc, gpupool_api_path=prefix.rstrip("/") + "/api/v1",
                          log_function=_log_request,
                          cookie_secret=dashboard.cookie_secret())
    server = app.listen(port, address=host, xheaders=True)
    # what start-up made (modules, the ORM's and tornado's machinery) lives as long as the service:
    # out of the cyclic collector's way, so a full collection walks only what cycles and requests make
    gc.freeze()
    log.info("gpupool service on %s%s (%d nodes, %d GPUs, %d queues, db %s, jobs in %s)", service_url.rstrip("/"),
             prefix, len(settings.nodes), sum(n.gpus for n in settings.nodes), len(settings.queues),
             engine.url.render_as_string(hide_password=True), pool.job_root)
    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aloop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping (running jobs keep running; the next start re-adopts them)")
    server.stop()
    await reconciler.stop()
    await sampler.stop()
    await checker.stop()
    await loop.stop()
    engine.dispose()
    lock.close()
    return 0


def _log_request(handler: web.RequestHandler) -> None:
    status = handler.get_status()
    if status >= 500:
        level = logging.ERROR
    elif status >= 400:
        level = logging.INFO
    else:
        level = logging.DEBUG
    log.log(level, "%d %s %s %.1fms", status, handler.request.method, handler.request.uri,
            1000 * handler.request.request_time())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("GPUPOOL_LOG_LEVEL", "INFO"),
                        format="[gpupool %(asctime)s %(levelname)s %(name)s] %(message)s")
    for noisy in ("alembic", "sqlalchemy", "tornado.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    text = os.environ.get("GPUPOOL_CONFIG")
    if not text:
        print("gpupool service: GPUPOOL_CONFIG is not set. Start the service through JupyterHub: "
              "put `from gpupool.hub_ext import configure; configure(c)` in jupyterhub_config.py (docs/hub.md).",
              file=sys.stderr)
        return 2
    try:
        settings = from_json(text)
    except GPUPoolConfigError as e:
        print(f"gpupool service: bad configuration: {e}", file=sys.stderr)
        return 2
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
