"""The gpupool service: ``python -m gpupool.hub_ext.app``, started by JupyterHub (``configure(c)``).

It reads its configuration from ``GPUPOOL_CONFIG`` (JSON of every ``c.GPUPool`` trait, computed
by the hub when it starts the service), listens on ``JUPYTERHUB_SERVICE_URL`` under
``JUPYTERHUB_SERVICE_PREFIX``, authenticates requests through the Hub (``JUPYTERHUB_API_URL``,
``JUPYTERHUB_API_TOKEN``) and runs the scheduling loop.

Only one instance may run the loop against a job root: it holds an exclusive lock on
``<job_root>/.service.lock`` (released by the kernel even on SIGKILL). SIGTERM / SIGINT stop it
promptly and it logs the jobs not finished; running jobs keep running and are re-adopted by the
next start.
"""
from __future__ import annotations

import asyncio
import fcntl
import gc
import importlib
import logging
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import select
from tornado import web

from ..backends import dcgm
from ..backends import nvml as nvml_mod
from .config import GPUPoolConfigError, Settings, from_json
from .domain.access import QueueAccess
from .domain.errors import APIError
from .domain.identity import Identity
from .domain.submission import Submissions
from .runtime.endpoints import EndpointProber
from .runtime.idle import IdleChecker
from .runtime.loop import SchedulerLoop
from .runtime.metrics import Metrics
from .runtime.reconcile import WorkspaceReconciler
from .runtime.sampling import Sampler
from .runtime.simulated import SimulatedReadings
from .store import engine as E
from .store import tables as D
from .store.inserter import BatchInserter
from .web import dashboard
from .web import schemas as S
from .web.auth import Authenticator
from .web.routes import routes
from .web.validation import Invalid, parse

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


class Service:
    """What the handlers share (``application.settings["gpupool"]``): settings, database, loop,
    auth, metrics; queue access and submissions (domain/access.py, domain/submission.py)."""

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
        self.dcgm_last: dict[str, dict[int, dict]] = {}  # the latest DCGM readings (Prometheus)
        self.access = QueueAccess(settings)
        self.submissions = Submissions(settings, sessions, self.access, BatchInserter(sessions.kw["bind"]), metrics)
        # the demo's made-up readings of declared GPUs (runtime/simulated.py), labelled as such wherever shown
        self.simulated = (SimulatedReadings(settings, sessions, self.server_activity)
                          if settings.pool.simulated_gpu_readings else None)

    async def new_job(self, ident: Identity, request: S.JobRequest | dict) -> Any:
        """Store a job (``request``: the validated body, or a dict, validated here)."""
        return await self.submissions.new_job(ident, _typed(S.JobRequest, request))

    async def request_workspace(self, user: str, server: str,
                                request: S.WorkspaceRequest | dict) -> tuple[D.Workload, bool]:
        groups, admin = await self.auth.user_info(user)
        owner = Identity(name=user, groups=groups, admin=admin)
        return self.submissions.request_workspace(owner, server, _typed(S.WorkspaceRequest, request))

    def gpu_readings(self) -> dict[str, dict[int, dict]]:
        """Live NVML readings of the nodes discovered through NVML on this machine, over the
        latest DCGM readings from Prometheus (``c.GPUPool.prometheus_url``; the sampler takes them),
        over the simulated readings of declared GPUs (``c.GPUPool.simulated_gpu_readings``)."""
        out = self.simulated.read() if self.simulated is not None else {}
        out.update(self.dcgm_last)
        if self.nvml is not None:
            out.update({node: self.nvml.utilization() for node in self.settings.gpu_uuids})
        return out

    def sample_readings(self) -> dict[str, dict[int, dict]]:
        """What the sampler stores (in a thread: Prometheus is asked over HTTP)."""
        if self.settings.pool.prometheus_url:
            with self.sessions() as s:
                held = s.execute(select(D.Workload.handle, D.Workload.allocation)
                                 .where(D.Workload.allocation.is_not(None), D.Workload.handle.is_not(None))).all()
            self.dcgm_last = dcgm.readings(self.settings.pool.prometheus_url, self.loop.specs.gpu_uuids,
                                           dcgm.pod_nodes(held))
        return self.gpu_readings()


def _typed(model: type[S.BaseModel], request: Any) -> Any:
    if isinstance(request, model):
        return request
    try:
        return parse(model, request)
    except Invalid as e:
        raise APIError(400, e.message, e.field) from None


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
    engine = E.make_engine(pool.db_url)
    sessions = E.make_sessionmaker(engine)
    backend = make_backend(pool.backend, settings)
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
    sampler = Sampler(sessions, svc.sample_readings, pool.usage_sample_seconds, pool.usage_raw_retention,
                      pool.usage_rollup_seconds, pool.usage_rollup_retention, metrics=metrics)
    if (nvml is not None and settings.gpu_uuids) or pool.prometheus_url or svc.simulated is not None:
        sampler.start()
    svc.sampler = sampler
    checker = IdleChecker(loop, sessions, settings.idle_rules, pool.idle_window_seconds, metrics,
                          limits=settings.max_runtime, warning=pool.max_runtime_warning,
                          simulated={n.name for n in svc.simulated.nodes()} if svc.simulated is not None else ())
    checker.start()
    svc.idle = checker
    prober = EndpointProber(sessions, backend, pool.job_root, pool.endpoint_probe_seconds)  # endpoints' readiness
    prober.start()
    svc.endpoint_prober = prober
    app = web.Application(routes(prefix, pool.service_name), gpupool=svc, gpupool_api_path=prefix.rstrip("/") + "/api/v1",
                          log_function=_log_request,
                          cookie_secret=dashboard.cookie_secret())
    try:
        server = app.listen(port, address=host, xheaders=True)
    except OSError as e:  # taken since the hub checked it at start
        log.error("cannot listen on %s:%d (c.GPUPool.port): %s", host, port, e)
        server = None
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
    if server is not None:
        await stop.wait()
        log.info("stopping (running jobs keep running; the next start re-adopts them)")
        server.stop()
    for task in (reconciler, sampler, checker, prober, loop):
        await task.stop()
    note = unfinished_jobs(sessions)
    if note:
        log.warning("%s", note)
    engine.dispose()
    lock.close()
    return 0 if server is not None else 4


def unfinished_jobs(sessions: Any) -> str:
    """Which jobs outlive the service: running ones keep running (the next start re-adopts them),
    queued ones wait for it. "" when there are none."""
    with sessions() as s:
        rows = s.execute(select(D.Workload.id, D.Workload.status).where(
            D.Workload.type == D.JOB, D.Workload.status.in_(D.ACTIVE)).order_by(D.Workload.id)).all()
    if not rows:
        return ""
    listed = ", ".join(f"{D.public_id(D.JOB, i)} ({status})" for i, status in rows[:10]) + (", ..." if len(rows) > 10 else "")
    return (f"{len(rows)} job{'s' if len(rows) != 1 else ''} not finished: {listed}. Running jobs keep running "
            "after the service stops and its next start re-adopts them; queued jobs wait for it. "
            "`gpupool delete JOB` cancels one.")


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
