"""GPUPoolSpawnerMixin: route a JupyterHub server start through the gpupool scheduler.

Mix it in front of any spawner (``class S(GPUPoolSpawnerMixin, LocalProcessSpawner)``,
``class S(GPUPoolSpawnerMixin, KubeSpawner)``). A start then goes:

1. ``user_options`` (form or REST) are validated into a :class:`~.form.GPURequest`; a bad value is
   a 400 naming the field.
2. ``POST workspaces/{user}[/{server}]`` asks the gpupool service for admission.
3. ``GET workspaces/{user}[/{server}]`` is polled every ``admission_poll_interval`` seconds; each
   new reason ("queued in vision: position 2, waiting for 1 GPU") becomes a spawn progress event.
4. Once the workspace is ``running``, its ``env`` (``CUDA_VISIBLE_DEVICES``, fraction / memory-cap
   variables) goes into the server's environment and the wrapped spawner starts the server.

If admission takes longer than ``admission_timeout`` the request is withdrawn and the start fails
with a message saying where it was in the queue. ``stop()``, a failed or cancelled start and a
server found dead by ``poll()`` all ``DELETE`` the workspace, so its GPUs free at once.

A request without GPUs (``gpus: 0``) does not go through the scheduler; the server starts with
``CUDA_VISIBLE_DEVICES=""`` so it cannot touch GPUs that belong to others.

Nothing in this module depends on the local process spawner.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import threading
import time
from typing import Any, AsyncIterator
from urllib.parse import quote

from jupyterhub.spawner import Spawner, SpawnException
from jupyterhub.utils import url_path_join
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default

from .. import contract as C
from ..client import api as client_api
from ..contract import format_bytes
from ..protocol import Env
from . import form as gpuform
from .form import GPURequest, OptionError

DEFAULT_SERVICE_URL = "http://127.0.0.1:10101/services/gpupool/"


def _human_duration(seconds: float) -> str:
    if seconds >= 120:
        minutes = seconds / 60
        return f"{minutes:.0f} minutes" if abs(minutes - round(minutes)) < 0.05 else f"{minutes:.1f} minutes"
    return f"{seconds:.0f} seconds" if seconds >= 2 else f"{seconds:.1f} seconds"


def _spawn_error(message: str, *, reason: str, status_code: int = 400) -> SpawnException:
    """A SpawnException whose text is exactly ``message`` wherever JupyterHub shows it (the spawn
    page, the progress stream, the REST API), without the class name and status in front."""
    e = SpawnException(message, reason=reason, status_code=status_code)
    e.jupyterhub_message = message
    return e


# What to tell a user whose start timed out in the queue, by the service's reason_code.
_TIMEOUT_ADVICE = {
    C.Code.LIMIT: "The queue is at its limit: wait until its other work finishes or ask your admin for more.",
    C.Code.NON_PREEMPTIBLE: "A workspace runs within the queue's deserved GPUs: stop another of your "
                            "workspaces, ask for a preemptible one, or ask your admin.",
    C.Code.FRAGMENTED: "Enough GPUs are free, but not together on one node: try fewer GPUs.",
    C.Code.NO_MATCHING_NODE: "No node matches the request: ask your admin.",
}
_IN_MOTION_ADVICE = "GPUs were being freed for it: please start again in a minute."
_DEFAULT_ADVICE = "Try a smaller request or ask your admin."


def timeout_advice(reason_code: str | None) -> str:
    """Advice for an admission timeout, chosen by the service's ``reason_code`` (never its prose)."""
    try:
        code = C.Code(reason_code)
    except ValueError:
        return _DEFAULT_ADVICE
    if code in C.IN_MOTION:
        return _IN_MOTION_ADVICE
    return _TIMEOUT_ADVICE.get(code, _DEFAULT_ADVICE)


class GPUPoolError(Exception):
    """A call to the gpupool service failed; ``status`` is the HTTP status (0: not reachable)."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


_clients: dict[tuple[str, str, float], client_api.Client] = {}
_clients_lock = threading.Lock()


def service_client(url: str, token: str, timeout: float) -> client_api.Client:
    """The client (gpupool.client's HTTP layer) for the service at ``url`` with ``token``: one per
    hub process and setting, so its connections are kept between calls."""
    key = (url, token, float(timeout))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = client_api.Client(url_path_join(url, "api/v1"), token or None, timeout=timeout,
                                                       url_source="c.Spawner.gpupool_url", login_hint=False)
        return client


class GPUPoolSpawnerMixin(Spawner):
    """Admission through the gpupool scheduler before the real spawner starts the server."""

    # ---- where the service is -------------------------------------------------------------
    gpupool_url = Unicode(
        help="""URL of the gpupool service (its prefix, e.g. http://127.0.0.1:10101/services/gpupool/);
        the API is under api/v1/ there. Default: $GPUPOOL_SERVICE_URL, else the service's default
        address from c.GPUPool.port / c.GPUPool.service_name.""",
    ).tag(config=True)

    def _pool_config(self, name: str, fallback: Any) -> Any:
        """A ``c.GPUPool`` setting from the hub's config (the service registration), if set."""
        try:
            section = self.config.get("GPUPool") or {}
            return section.get(name, fallback) if hasattr(section, "get") else fallback
        except Exception:
            return fallback

    @default("gpupool_url")
    def _default_gpupool_url(self) -> str:
        env = os.environ.get("GPUPOOL_SERVICE_URL")
        if env:
            return env
        port = self._pool_config("port", 10101)
        name = self._pool_config("service_name", "gpupool")
        return f"http://127.0.0.1:{port}/services/{name}/"

    gpupool_token = Unicode(
        help="""API token the spawner uses for the gpupool service; it needs the
        custom:gpupool:admin scope (the spawner acts for every user). Default: $GPUPOOL_API_TOKEN,
        else c.GPUPool.api_token (the service's own token, which configure(c) sets).""",
    ).tag(config=True)

    @default("gpupool_token")
    def _default_gpupool_token(self) -> str:
        return os.environ.get("GPUPOOL_API_TOKEN") or self._pool_config("api_token", "") or ""

    gpupool_request_timeout = Float(
        15.0, help="Seconds one HTTP call to the gpupool service may take before it counts as failed.",
    ).tag(config=True)

    # ---- admission ------------------------------------------------------------------------
    admission_timeout = Float(
        600.0,
        help="""Seconds a server start may wait in the queue for its GPUs. When it expires the queued
        request is withdrawn and the user gets a message saying where it was in the queue.
        0 = wait as long as the hub lets the start run (Spawner.start_timeout; see
        admission_start_reserve). Unless you set Spawner.start_timeout yourself, it defaults to
        admission_timeout + admission_start_reserve, so the hub never times out a queued start
        silently.""",
    ).tag(config=True)

    admission_start_reserve = Float(
        120.0,
        help="""Seconds of Spawner.start_timeout kept for starting the server once GPUs are granted.
        The admission wait is capped at start_timeout minus this (at least half of start_timeout).""",
    ).tag(config=True)

    admission_poll_interval = Float(
        0.5, help="""Longest wait between polls of the workspace's admission state while it is queued
        (the first polls come after 10, 20, 40 ... ms, so a free GPU is picked up at once).""",
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        if self.admission_timeout <= 0:
            return 7 * 24 * 3600  # "wait forever": a week, the hub needs a number
        return int(math.ceil(self.admission_timeout + self.admission_start_reserve))

    # ---- what users may ask for -----------------------------------------------------------
    gpu_fractions = List(
        Float(), [0.25, 0.5],
        help="""Fractions of one GPU the spawn page offers in its menu. A request for another fraction
        below 1 (through the API, e.g. ``{"gpus": 0.3}``) is as valid: jobs and workspaces share one
        rule (gpupool/hub_ext/domain/gpus.py).""",
    ).tag(config=True)

    max_gpus = Integer(
        0,
        help="""Most whole GPUs one workspace may ask for. 0 = the largest node's GPU count
        (from the service's GET nodes).""",
    ).tag(config=True)

    default_gpus = Float(
        0.0, help="GPUs for a start without user_options (e.g. the REST API with no body).",
    ).tag(config=True)

    default_preemptible = Bool(
        False,
        help="""Whether a workspace is preemptible unless the user says otherwise. Workspaces are
        non-preemptible (they run within the queue's deserved quota) by default.""",
    ).tag(config=True)

    extra_user_options = List(
        Unicode(),
        help="""user_options fields besides gpus, gpu_memory, queue, preemptible that are allowed
        (for a subclass or an apply_user_options hook that handles them, e.g. an image choice).
        Any other field is refused with 400.""",
    ).tag(config=True)

    hide_gpus_without_allocation = Bool(
        True,
        help="""Start servers that asked for no GPU with CUDA_VISIBLE_DEVICES="" so they cannot use
        GPUs that the scheduler gave to others.""",
    ).tag(config=True)

    server_gpupool_url = Unicode(
        help="""gpupool service URL given to servers as GPUPOOL_URL, so ``import gpupool`` in a notebook
        finds the service (with the server's own JUPYTERHUB_API_TOKEN). Default: gpupool_url (right
        for servers on the hub's machine); set the address servers reach it at otherwise, or "" to
        leave GPUPOOL_URL unset. A GPUPOOL_URL in Spawner.environment wins.""",
    ).tag(config=True)

    @default("server_gpupool_url")
    def _default_server_gpupool_url(self) -> str:
        return self.gpupool_url

    gpupool_form_note = Unicode(
        "", help="A sentence shown at the top of the GPU options form (e.g. where to find help).",
    ).tag(config=True)

    # ---- state ----------------------------------------------------------------------------
    gpu_request: GPURequest | None = None  # set from user_options before start()
    gpu_env = Dict(help="Environment granted by the scheduler for the current server (read-only).")
    gpu_allocation = List(help="The scheduler's allocation for the current server (read-only).")
    gpupool_workspace = Unicode(
        "", help="Workspace path (user[/server]) held in the gpupool service; kept in the hub's state.",
    )

    @default("options_form")
    def _default_options_form(self):
        return self._render_gpu_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return gpuform.options_from_form

    # ---- HTTP to the service (gpupool.client's HTTP layer, in a thread) ---------------------
    async def _gpupool(self, method: str, path: str, body: Any = None, query: dict | None = None) -> Any:
        client = service_client(self.gpupool_url, self.gpupool_token, self.gpupool_request_timeout)
        try:
            return await asyncio.to_thread(client.request, method, path, params=query, json_body=body)
        except client_api.ConnectionFailed as e:
            raise GPUPoolError(0, f"the GPU scheduler is not reachable: {e.message}") from None
        except client_api.GPUPoolError as e:
            raise GPUPoolError(e.status or 0, e.message, e.field) from None

    def _workspace_path(self) -> str:
        path = "workspaces/" + quote(self.user.name, safe="")
        if self.name:
            path += "/" + quote(self.name, safe="")
        return path

    # ---- what the user may choose -----------------------------------------------------------
    async def gpupool_queues(self) -> list[dict]:
        """Queues (``GET queues``) this user may submit to, in the service's order. The service
        decides: asked with ``?user=`` (the spawner's token has the admin scope), its
        ``may_submit`` is that user's access, from the user's JupyterHub groups and admin flag."""
        data = await self._gpupool("GET", "queues", query={"user": self.user.name})
        queues = (data or {}).get("queues", []) if isinstance(data, dict) else []
        return [q for q in queues if q.get("may_submit")]

    async def gpupool_policies(self) -> dict[str, dict]:
        """Leaf queue -> the workload policy of its workspaces (the ``interactive`` entry of ``GET
        policies/effective``): what the spawn page offers and pre-selects. A service that does not
        answer it: no policies (the service still checks every request)."""
        try:
            data = await self._gpupool("GET", "policies/effective")
        except GPUPoolError as e:
            if e.status != 404:
                raise
            return {}
        return {p["queue"]: p["kinds"].get(C.INTERACTIVE, {}) for p in (data or {}).get("policies", [])}

    async def gpupool_nodes(self) -> list[dict]:
        data = await self._gpupool("GET", "nodes")
        return (data or {}).get("nodes", []) if isinstance(data, dict) else []

    def _limits_from_nodes(self, nodes: list[dict]) -> tuple[int, int, str]:
        max_gpus = self.max_gpus
        if not max_gpus:  # the largest node; 0 when the pool has no GPU at all
            counts = [len(n.get("gpus") or []) for n in nodes if n.get("schedulable", True)]
            max_gpus = max(counts) if counts else 0
        mems = [int(n.get("gpu_memory") or 0) for n in nodes]
        models = sorted({n.get("gpu_model") or "" for n in nodes} - {""})
        return max_gpus, max(mems) if mems else 0, "/".join(models)

    @staticmethod
    def _gpu_kinds(nodes: list[dict]) -> str:
        """The kinds of GPU the form names where they differ, e.g. ``24Gi (L4, pool build), 80Gi
        (H100, pool train)``; "" where every GPU is alike (the form then says "each GPU has ...")."""
        kinds = sorted({(int(n.get("gpu_memory") or 0), n.get("gpu_model") or "", n.get("pool") or "")
                        for n in nodes if n.get("gpus")})
        if len({(m, g) for m, g, _ in kinds}) <= 1:
            return ""
        out = []
        for mem, model, pool in kinds:
            about = ", ".join(x for x in (model, f"pool {pool}" if pool and pool != "default" else "") if x)
            out.append(f"{format_bytes(mem) if mem else 'unknown memory'}" + (f" ({about})" if about else ""))
        return ", ".join(out)

    async def _render_gpu_form(self, spawner: Spawner | None = None) -> str:
        try:
            queues = await self.gpupool_queues()
            nodes = await self.gpupool_nodes()
            policies = await self.gpupool_policies()
        except GPUPoolError as e:
            self.log.error("gpupool: cannot build the options form for %s: %s", self._log_name, e.message)
            return gpuform.render_unavailable()
        max_gpus, memory, model = self._limits_from_nodes(nodes)
        defaults = self.orm_spawner.user_options if getattr(self, "orm_spawner", None) else None
        queues = [q for q in queues if policies.get(q["name"], {}).get("allowed", True)]  # queues taking workspaces
        return gpuform.render_form(queues=queues, fractions=self.gpu_fractions, max_gpus=max_gpus,
                                   gpu_memory=memory, gpu_model=model, defaults=defaults or {},
                                   note=self.gpupool_form_note, policies=policies, gpu_kinds=self._gpu_kinds(nodes))

    async def validate_gpu_options(self, user_options: dict) -> GPURequest:
        """``user_options`` -> GPURequest, or SpawnException(400) naming the field.

        With the service unreachable, a request without GPUs is still accepted (a CPU-only server
        needs no scheduler); one with GPUs fails with 503 and a message saying why."""
        queues: list[str] | None
        try:
            nodes = await self.gpupool_nodes()
            queues = [q["name"] for q in await self.gpupool_queues()]
        except GPUPoolError as e:
            try:
                cpu_only = not gpuform.parse_user_options(
                    user_options, max_gpus=10**6, queues=None,
                    default_gpus=self.default_gpus, extra_fields=self.extra_user_options).wants_gpu
            except OptionError:
                cpu_only = False
            if not cpu_only:
                raise _spawn_error(f"Cannot start: {e.message}. Please try again in a minute or tell your admin.",
                                   reason="gpupool-unavailable", status_code=503) from None
            self.log.warning("gpupool: %s; starting %s without GPUs anyway", e.message, self._log_name)
            nodes, queues = [], None
        max_gpus, memory, _ = self._limits_from_nodes(nodes)
        try:
            request = gpuform.parse_user_options(
                user_options, max_gpus=max_gpus, max_gpu_memory=memory,
                queues=queues, default_gpus=self.default_gpus, default_preemptible=self.default_preemptible,
                extra_fields=self.extra_user_options)
        except OptionError as e:
            raise _spawn_error(f"Invalid option {e.field}: {e.message}", reason="invalid-options",
                                 status_code=400) from None
        return await self._policy_defaults(request, user_options or {}) if queues is not None else request

    async def _policy_defaults(self, request: GPURequest, user_options: dict) -> GPURequest:
        """What the user left out, from the queue's workload policy (before the spawner's own
        defaults): the same defaults a request to the service gets."""
        if not request.queue:
            return request
        try:
            policies = await self.gpupool_policies()
        except GPUPoolError as e:  # the service checks the request again when it is asked for the GPUs
            self.log.warning("gpupool: no workload policy for %s's defaults: %s", self._log_name, e.message)
            return request
        policy = gpuform.queue_policy(policies.get(request.queue), 0)
        changes: dict[str, Any] = {}
        if all(user_options.get(k) in (None, "") for k in ("gpus", "gpu_memory")):
            if policy["gpus"] is not None:
                changes.update(gpus=float(policy["gpus"]), gpu_memory=0)
            elif policy["gpu_memory"] is not None:
                changes.update(gpus=0.0, gpu_memory=int(policy["gpu_memory"]))
        if user_options.get("preemptible") is None and policy["preemptible"] is not None:
            changes["preemptible"] = bool(policy["preemptible"])
        return dataclasses.replace(request, **changes) if changes else request

    async def _run_apply_user_options(self, user_options):
        # Validate first (a clean 400 naming the field), then the admin's apply_user_options hook.
        self.gpu_request = await self.validate_gpu_options(user_options or {})
        if self.apply_user_options:  # (without a hook the base class only warns "unhandled user_options")
            return await super()._run_apply_user_options(user_options)

    # ---- progress -------------------------------------------------------------------------
    def _progress_reset(self) -> None:
        self._progress_events: list[dict] = []
        self._progress_done = False
        self._progress_failed = False
        self._progress_changed = asyncio.Event()

    def _progress_push(self, message: str, progress: int | None = None, done: bool = False) -> None:
        if not hasattr(self, "_progress_events"):
            self._progress_reset()
        events = self._progress_events
        if message and (not events or events[-1].get("message") != message):
            event: dict[str, Any] = {"message": message}
            if progress is not None:
                event["progress"] = progress
            events.append(event)
        if done:
            self._progress_done = True
        changed, self._progress_changed = self._progress_changed, asyncio.Event()
        changed.set()

    async def progress(self) -> AsyncIterator[dict]:
        """Admission events (queue position and reason) until the GPUs are granted, then the
        wrapped spawner's own events."""
        if not hasattr(self, "_progress_events"):
            self._progress_reset()
        sent = 0
        while True:
            changed = self._progress_changed
            while sent < len(self._progress_events):
                yield self._progress_events[sent]
                sent += 1
            if self._progress_done:
                break
            await changed.wait()
        if self._progress_failed:
            return
        async for event in super().progress():
            yield event

    # ---- admission ------------------------------------------------------------------------
    def _admission_limit(self) -> float:
        limit = self.admission_timeout if self.admission_timeout > 0 else math.inf
        cap = max(self.start_timeout - self.admission_start_reserve, self.start_timeout / 2)
        if cap < limit:
            if self.admission_timeout > 0:
                self.log.warning("gpupool: admission_timeout %ss is capped at %ss by Spawner.start_timeout %ss",
                                 self.admission_timeout, cap, self.start_timeout)
            limit = cap
        return limit

    def _timeout_message(self, ws: dict, waited: float) -> str:
        """Where the request was when admission timed out: the service's position and its reason
        (the sentence as the service wrote it; the spawner never takes it apart)."""
        queue = ws.get("queue") or (self.gpu_request.queue if self.gpu_request else None) or "its queue"
        where = f" at position {ws['position']}" if ws.get("position") else ""
        reason = (ws.get("reason") or "").strip().rstrip(".")
        return (f"Still queued in {queue} after {_human_duration(waited)}{where}"
                + (f" ({reason})" if reason else "") + ". " + timeout_advice(ws.get("reason_code")))

    async def admit(self, request: GPURequest) -> dict:
        """Ask for the GPUs and wait until they are granted; returns the running workspace."""
        path = self._workspace_path()
        started = time.monotonic()
        limit = self._admission_limit()
        self._progress_push(f"Asking the GPU scheduler for {request.describe()}"
                            + (f" in queue {request.queue}" if request.queue else ""), 5)
        try:
            ws = await self._gpupool("POST", path, body=request.body(self.name))
        except GPUPoolError as e:
            if 400 <= e.status < 500 and e.status not in (401,):
                field = f"{e.field}: " if e.field and not e.message.startswith(f"{e.field}:") else ""
                raise _spawn_error(f"The GPU scheduler refused the request: {field}{e.message}",
                                     reason="gpupool-refused", status_code=e.status) from None
            raise _spawn_error(f"Cannot start: {e.message}. Please try again in a minute or tell your admin.",
                                 reason="gpupool-unavailable", status_code=503) from None
        self.gpupool_workspace = path
        polls = 0
        while True:
            status = (ws or {}).get("status")
            if status == C.RUNNING:
                return ws
            if status in C.ENDED or status == C.STOPPED:
                raise _spawn_error(f"The GPU scheduler did not admit this server: "
                                     f"{ws.get('reason') or status}", reason="gpupool-" + status)
            reason = ws.get("reason") or ("waiting for the GPU scheduler" if status != C.STARTING
                                          else "GPUs granted, starting")
            self._progress_push(reason[0].upper() + reason[1:], 10)
            waited = time.monotonic() - started
            if waited >= limit:
                raise _spawn_error(self._timeout_message(ws, waited), reason="gpupool-admission-timeout",
                                     status_code=503)
            # poll fast at first (a free GPU is granted within one scheduler wake-up), then back off
            delay = min(self.admission_poll_interval, 0.01 * 2 ** polls)
            polls += 1
            await asyncio.sleep(min(delay, max(limit - waited, 0.01)))
            try:
                ws = await self._gpupool("GET", path)
            except GPUPoolError as e:
                if e.status == 404:
                    raise _spawn_error("The workspace request was withdrawn while it waited "
                                         "(an admin cancelled it, or the scheduler restarted). Please start again.",
                                         reason="gpupool-withdrawn") from None
                if e.status == 0 or e.status >= 500:  # transient: keep waiting, say so
                    self.log.warning("gpupool: polling %s failed: %s", path, e.message)
                    ws = {**ws, "reason": "the GPU scheduler is not answering; still waiting"}
                    continue
                raise _spawn_error(f"The GPU scheduler refused the request: {e.message}",
                                     reason="gpupool-refused", status_code=e.status) from None
            if isinstance(ws, dict) and isinstance(ws.get("workspaces"), list):  # list form of the answer
                ws = next((w for w in ws["workspaces"] if w.get("server", "") == self.name), {})

    def apply_allocation(self, workspace: dict) -> None:
        """Take the granted workspace: its ``env`` and ``allocation``. A subclass that places the
        server itself (e.g. on the allocated node) extends this."""
        env = workspace.get("env") or {}
        self.gpu_env = {str(k): str(v) for k, v in env.items()}
        self.gpu_allocation = list(workspace.get("allocation") or [])
        if "CUDA_VISIBLE_DEVICES" not in self.gpu_env:
            gpus = [str(g) for a in self.gpu_allocation for g in a.get("gpus", [])]
            if gpus:
                self.gpu_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)

    async def release(self) -> None:
        """DELETE the workspace (frees its GPUs or withdraws its queued request); idempotent."""
        path = self.gpupool_workspace
        if not path:
            return
        try:
            await self._gpupool("DELETE", path)
        except GPUPoolError as e:
            if e.status == 0:  # the service is down (JupyterHub stops its services before its servers)
                self.log.warning("gpupool: %s not released now: the gpupool service is not running; it "
                                 "releases the GPUs of servers the hub no longer has as it starts", path)
                return
            if e.status != 404:
                self.log.error("gpupool: could not release %s: %s (kept in the server's state; the "
                               "next start or stop of this server releases it)", path, e.message)
                return
        self.log.info("gpupool: released workspace %s", path)
        self.gpupool_workspace = ""
        self.gpu_env = {}
        self.gpu_allocation = []

    def get_env(self) -> dict:
        env = super().get_env()
        if self.server_gpupool_url and "GPUPOOL_URL" not in env:
            env["GPUPOOL_URL"] = self.server_gpupool_url
        job_root = self._pool_config("job_root", "")
        if job_root and Env.JOB_ROOT not in env:  # the TensorBoard launcher finds the user's jobs there
            env[Env.JOB_ROOT] = os.path.abspath(str(job_root))
        if self.gpu_env:
            env.update(self.gpu_env)
        elif self.hide_gpus_without_allocation:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    # ---- lifecycle ------------------------------------------------------------------------
    _starting = False  # True while start() runs (poll() must not release a workspace being admitted)

    gpupool_suspension: dict | None = None  # set when the server was stopped because it was suspended

    async def _note_suspension(self) -> None:
        """The service suspended this server's workspace (idle GPUs): keep the suspension (reason,
        options) for the hub's home page, which offers to resume it (hub_ext/runtime/idle.py)."""
        try:
            found = await self._gpupool("GET", "suspensions", query={"user": self.user.name})
        except GPUPoolError:
            return
        mine = [s for s in (found or {}).get("suspensions", []) if s.get("server") == (self.name or "")]
        if mine:
            self.gpupool_suspension = mine[-1]

    async def start(self):
        self._starting = True
        self.gpupool_suspension = None
        self._progress_reset()
        if self.gpu_request is None:  # a hub older than 5.3 does not call _run_apply_user_options
            self.gpu_request = await self.validate_gpu_options(self.user_options or {})
        request = self.gpu_request
        self.gpu_env, self.gpu_allocation = {}, []
        try:
            if request.wants_gpu:
                ws = await self.admit(request)
                self.apply_allocation(ws)
                where = C.describe_allocation(self.gpu_allocation)
                self._progress_push(f"GPUs granted ({where or request.describe()}); starting the server", 40,
                                    done=True)
            else:
                self._progress_push("No GPU requested; starting the server", 40, done=True)
            return await super().start()
        except BaseException:  # includes the hub cancelling a start (timeout, user clicked cancel)
            self._progress_failed = True
            self._progress_push("", done=True)
            await asyncio.shield(self.release())
            raise
        finally:
            self.gpu_request = None
            self._starting = False

    _stopping = False

    async def stop(self, now=False):
        self._stopping = True  # the wrapped stop() polls; that poll must not re-enter stop()
        try:
            await super().stop(now=now)
        finally:
            try:
                await self.release()
            finally:
                self._stopping = False

    async def poll(self):
        status = await super().poll()
        if self._starting or self._stopping or not self.gpupool_workspace:
            return status
        if status is not None:
            await self.release()  # the server died: free its GPUs now
            return status
        # Running: does it still hold its GPUs? A preemptible workspace loses them when its queue's
        # owner reclaims them (after the service's grace period it is requeued); an admin may also
        # have removed it. Then the server is stopped, so it cannot use GPUs that are now someone
        # else's, and the hub shows the user why on the next visit.
        try:
            ws = await self._gpupool("GET", self.gpupool_workspace)
        except GPUPoolError as e:
            if e.status != 404:
                return None  # the service is unreachable: never stop servers because of that
            ws = {"status": "gone", "reason": "its workspace was removed from the GPU scheduler"}
            await self._note_suspension()
            if self.gpupool_suspension:
                ws["reason"] = self.gpupool_suspension.get("reason")
        if ws.get("status") in C.HOLDING:
            if ws.get("status") == C.PREEMPTING and not self._warned_preempting:
                self._warned_preempting = True
                self.log.warning("gpupool: %s is being preempted: %s", self._log_name, ws.get("reason"))
            return None
        self.log.warning("gpupool: stopping %s: it no longer holds its GPUs (%s)", self._log_name,
                         ws.get("reason") or ws.get("status"))
        await self.stop()
        return 0

    _warned_preempting = False

    @default("poll_interval")
    def _default_poll_interval(self) -> int:
        return 10  # also how soon a preempted workspace's server is stopped after its grace period

    def get_state(self) -> dict:
        state = super().get_state()
        if self.gpupool_workspace:
            state["gpupool_workspace"] = self.gpupool_workspace
            state["gpupool_env"] = dict(self.gpu_env)
            state["gpupool_allocation"] = list(self.gpu_allocation)
        if self.gpupool_suspension:  # kept while the server is stopped (clear_state leaves it)
            state["gpupool_suspension"] = dict(self.gpupool_suspension)
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.gpupool_workspace = state.get("gpupool_workspace", "")
        self.gpu_env = state.get("gpupool_env", {}) or {}
        self.gpu_allocation = state.get("gpupool_allocation", []) or []
        self.gpupool_suspension = state.get("gpupool_suspension") or None

    def clear_state(self) -> None:
        super().clear_state()
        # gpupool_workspace is kept until release() succeeds, so a failed DELETE is retried by stop()
