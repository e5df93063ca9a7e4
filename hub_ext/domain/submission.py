"""What a submission (``POST jobs``) or a workspace request (``POST workspaces/...``) may ask for,
checked against the pool (queues, nodes, the user's files), and the row it becomes.

A request arrives validated by its model (web/schemas.py: shapes, types, limits). The fields of
the request that the scheduler knows (``scheduler.spec.WORKLOAD_FIELDS``) go through the
scheduler's own parser, and every field of the request that is a column of the workload's row is
stored under its name: a new request field needs no change here.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from ... import contract as C
from ...scheduler.spec import WORKLOAD_FIELDS, SpecError, parse_workload
from ...scheduler.units import parse_bytes
from ..store import tables as D
from ..store.inserter import Refused
from . import endpoints, lifecycle
from . import policies
from .access import QueueAccess
from .errors import APIError
from .gpus import check_gpus
from .identity import Identity
from .idle_rules import on_workspace_request
from .pools import request_pools
from .programs import check_pods, in_workdir, program
from .workdirs import user_workdir

log = logging.getLogger("gpupool")

COLUMNS = D.Workload.__table__.c
DEFAULT_KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
SET_HERE = ("name", "queue", "kind", "user")  # the scheduler's fields a request does not give as is


def spec_error(e: SpecError) -> APIError:
    field = e.path.split(".", 1)[1] if "." in e.path else e.path
    return APIError(400, f"{field}: {e.message}", field)


class Submissions:
    """``inserter``: store/inserter.py's group commit; ``metrics``: runtime/metrics.py's."""

    def __init__(self, settings: Any, sessions: Any, access: QueueAccess, inserter: Any, metrics: Any):
        self.settings = settings
        self.sessions = sessions
        self.access = access
        self.inserter = inserter
        self.metrics = metrics

    # the node list may change while the service runs (a live Kubernetes inventory): read it each time
    @property
    def max_gpus(self) -> int:
        return max((n.gpus for n in self.settings.nodes), default=0)

    @property
    def max_gpu_memory(self) -> int:
        """The most GPU memory one request can have: a GPU's memory less what the driver keeps
        (``c.GPUPool.gpu_memory_reserve``, at least ``gpu_memory_reserve_min``), as the core sizes it."""
        pool = self.settings.pool
        keep_min = parse_bytes(pool.gpu_memory_reserve_min)
        return max((n.gpu_memory - max(math.ceil(n.gpu_memory * pool.gpu_memory_reserve), keep_min)
                    for n in self.settings.nodes if n.gpus and n.gpu_memory), default=0)

    def workdir(self, user: str) -> str:
        return user_workdir(self.settings.pool.work_dir, user)

    def policy(self, queue: str, kind: str) -> Any:
        """The effective policy (domain/policies.py) of ``kind`` in ``queue``; None when it has none."""
        return self.settings.policies.get(queue, {}).get(kind)

    def with_defaults(self, request: Any, queue: str, kind: str) -> Any:
        """The request with its queue's policy defaults in the fields it left out."""
        fields = tuple(type(request).model_fields)
        filled = policies.fill(self.policy(queue, kind), {f: getattr(request, f) for f in fields}, fields)
        return request.model_copy(update=filled) if filled else request

    def resources(self, request: Any, queue: str, kind: str, user: str, **overrides: Any) -> Any:
        """The scheduler's rules for a request (fractions, whole GPUs, what the nodes can hold)
        and its queue's policy limits: its ``scheduler.model.Workload``."""
        entry: dict[str, Any] = {"name": "request", "queue": queue, "kind": kind, "user": user}
        for key in _scheduler_fields(request):
            value = overrides.get(key, getattr(request, key, None))
            if value is not None:
                entry[key] = value
        if "gpus" in entry:  # the one GPU rule (domain/gpus.py), shared with the spawn page
            try:
                entry["gpus"] = check_gpus(entry["gpus"])
            except ValueError as e:
                raise APIError(400, f"gpus: {e}", "gpus") from None
            if not entry["gpus"]:
                del entry["gpus"]  # one meaning of zero: no GPU, the same as leaving gpus out
        try:
            w = parse_workload(entry, "request", self.access.queue_map)
        except SpecError as e:
            raise spec_error(e) from None
        eff = self.policy(queue, kind)
        policies.check_pools(eff, queue, kind, w.pools)  # a pool the queue's policy does not allow: 400
        w.pools = request_pools(w.pools, self.settings.pool, kind, self.settings.nodes, w.gpus,  # domain/pools.py
                                allowed=policies.allowed_pools(eff))
        if w.gpus > 0 and self.max_gpus == 0:
            raise APIError(400, "gpus: the pool has no GPUs (ask for gpus: 0 or none)", "gpus")
        if w.gpus > self.max_gpus:
            raise APIError(400, f"gpus: no node has {w.gpus:g} GPUs (the largest has {self.max_gpus})", "gpus")
        if w.gpu_memory:
            if self.max_gpus == 0:
                raise APIError(400, "gpu_memory: the pool has no GPUs", "gpu_memory")
            if self.max_gpu_memory and w.gpu_memory > self.max_gpu_memory:
                raise APIError(400, f"gpu_memory: no GPU has {C.format_bytes(w.gpu_memory)} "
                                    f"(the largest has {C.format_bytes(self.max_gpu_memory)} once the driver's "
                                    "reserve is kept: c.GPUPool.gpu_memory_reserve)", "gpu_memory")
        policies.check(eff, queue, kind, w)
        return w

    # ------------------------------------------------------------------ jobs
    async def new_job(self, ident: Identity, request: Any) -> Any:
        """Check what depends on the pool (queues, nodes, the user's files), then store the job.
        ``request``: a validated ``JobRequest``. Returns a view of the committed row."""
        nb, content = request.notebook, request.notebook_content
        prog = program(request.model_dump(), lambda: self.workdir(ident.name))
        if prog is None and (nb is None) == (content is None):
            raise APIError(400, "notebook: give exactly one of notebook (a path), notebook_content, script and "
                                "command", "notebook")
        kind = request.kind or C.DEFAULT_JOB_KIND
        request = endpoints.checked(request, kind)  # an endpoint's replicas are its workers
        queue = self.access.choose(ident, request.queue)
        request = self.with_defaults(request, queue, kind)
        w = self.resources(request, queue, kind, ident.name)
        check_pods(w, self.settings.pool.max_pods, self.settings.nodes)
        source: str | None = None
        self.ensure_workdir(ident.name)  # missing: created now (jobs run as the service's user) or refused now
        if prog is not None:
            name_default = prog.name
        elif nb is not None:
            _, source = in_workdir("notebook", nb, lambda: self.workdir(ident.name))
            try:
                with open(source, "rb") as f:
                    doc = json.load(f)
            except (OSError, ValueError) as e:
                raise APIError(400, f"notebook: {nb!r} is not a readable Jupyter notebook ({e})", "notebook") from None
            check_notebook(doc, "notebook")
            name_default = os.path.splitext(os.path.basename(nb))[0]
        else:
            check_notebook(content, "notebook_content")
            name_default = "notebook"
        values = _stored(request, w)
        values.update(type=D.JOB, user=ident.name, server="", name=(request.name or name_default)[:C.MAX_NAME],
                      queue=queue, kind=kind, parameters=request.parameters or {},
                      source=None if prog else json.dumps(doc if source is not None else content),
                      script=prog and prog.script, args=prog and prog.args, command=prog and prog.command,
                      status=D.QUEUED, reason=lifecycle.SUBMITTED, submitted_at=time.time(), preemptions=0,
                      restarts=0, attempt=0)
        try:
            new_id = await self.inserter.insert(values)  # committed before the 201
        except Refused as e:
            raise APIError(503, str(e)) from None
        self.metrics.submitted.inc()
        values.pop("source")
        # the view of what was just committed (an ORM instance costs more than the rest of the request)
        return SimpleNamespace(**{**_defaults(), **values, "id": new_id, "public_id": D.public_id(D.JOB, new_id)})

    def ensure_workdir(self, user: str) -> str:
        """The user's working directory on the hub, where the job will run. Missing, it is created
        (as the demo's spawner creates homes) when jobs run as the service's own user; a system
        user's missing home is refused now rather than failing the job when it starts."""
        try:
            workdir = self.workdir(user)
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
    def request_workspace(self, owner: Identity, server: str, request: Any) -> tuple[D.Workload, bool]:
        """Admission of ``owner``'s server (``request``: a validated ``WorkspaceRequest``): the
        same request again is the same workspace; a different one replaces it."""
        user = owner.name
        queue = self.access.choose(owner, request.queue)
        request = self.with_defaults(request, queue, C.INTERACTIVE)
        policies.check_image(self.policy(queue, C.INTERACTIVE), queue, C.INTERACTIVE, request.image)
        preemptible = request.preemptible
        if preemptible is None:
            preemptible = self.settings.pool.workspace_preemptible_default
        w = self.resources(request, queue, C.INTERACTIVE, user, preemptible=preemptible)
        with self.sessions() as s:
            existing = s.scalars(select(D.Workload).where(D.Workload.type == D.WORKSPACE, D.Workload.user == user,
                                                          D.Workload.server == server,
                                                          D.Workload.status.in_(D.ACTIVE))).first()
            if existing is not None:
                same = (existing.queue, existing.gpus, existing.gpu_memory, existing.preemptible,
                        tuple(existing.pools or ())) == (queue, w.gpus, w.gpu_memory, w.preemptible, w.pools)
                if same:
                    return existing, False
                s.delete(existing)  # a different request replaces the old one
            values = _stored(request, w)
            values.update(type=D.WORKSPACE, user=user, server=server, name=request.name or server or user,
                          queue=queue, kind=C.INTERACTIVE, checkpoint_on_signal=False, parameters={},
                          status=D.QUEUED, reason=lifecycle.REQUESTED, submitted_at=time.time(), preemptions=0,
                          restarts=0, attempt=0)
            row = D.Workload(**values)
            s.add(row)
            on_workspace_request(s, row, time.time())  # a suspended server coming back says so
            s.commit()
        return row, True


def _scheduler_fields(request: Any) -> tuple[str, ...]:
    """The fields of a request model that the scheduler's parser reads."""
    return tuple(f for f in type(request).model_fields if f in WORKLOAD_FIELDS and f not in SET_HERE)


def _stored(request: Any, w: Any) -> dict[str, Any]:
    """The columns a request fills by name: the scheduler's fields as it parsed them, the others as
    given, or their column's default (every request of a kind gives the same columns: a batch of
    inserts is one statement)."""
    defaults = _defaults()
    out = {f: (defaults[f] if v is None else v) for f, v in request.model_dump().items() if f in COLUMNS}
    out.update({f: getattr(w, f) for f in _scheduler_fields(request)})
    return out


@functools.lru_cache(maxsize=None)
def _defaults() -> dict[str, Any]:
    """Every column with its default (None for a computed default): the view of a row just inserted."""
    out = {}
    for col in COLUMNS:
        arg = col.default.arg if col.default is not None else None
        out[col.key] = None if callable(arg) else arg
    return out


def check_notebook(doc: Any, field: str) -> None:
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
