"""The readiness probe of model endpoints, and the replicas the proxy may send a request to.

Every ``c.GPUPool.endpoint_probe_seconds`` the service asks each replica of every running endpoint
(``kind: inference``) for ``/``: a replica answers when its status is below 500. An endpoint is
``starting`` (``contract.EndpointState``) until a replica answers, then ``ready``; ``ready_replicas``
counts them. A replica that stops answering (crashed, being restarted by its runner or kubelet) gets
no requests until it answers again, and the endpoint is ``starting`` again while none answers. The
restarts of its servers (the backend's count) are stored as ``endpoint_restarts``. The proxy
(web/endpoints.py) takes the replicas that answered in turn (round-robin).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from sqlalchemy import select, update
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ...backends.base import endpoint_targets
from ...contract import INFERENCE, EndpointState
from ...protocol import JobDir
from ..store import tables as D
from .periodic import Periodic

log = logging.getLogger("gpupool.endpoints")

PROBE_TIMEOUT = 2.0  # seconds one readiness probe waits


async def answers(target: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the server at ``target`` (``http://host:port``) answers ``GET /`` with a status below 500."""
    req = HTTPRequest(target.rstrip("/") + "/", method="GET", request_timeout=timeout, connect_timeout=timeout,
                      follow_redirects=False)
    try:
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    except Exception:  # refused, reset, DNS: not answering
        return False
    return 0 < resp.code < 500 and resp.code != 599


class EndpointProber(Periodic):
    what = "probing endpoints"
    off_message = "the endpoints' readiness probe is off (c.GPUPool.endpoint_probe_seconds = 0)"
    log = log

    def __init__(self, sessions: Any, backend: Any, job_root: str, interval: float):
        self.sessions = sessions
        self.backend = backend
        self.job_root = job_root
        self.interval = interval
        self.ready: dict[int, list[str]] = {}  # workload id -> replicas that answered the last probe
        self._turns: dict[int, Any] = {}  # workload id -> (its replicas, a cycle over them)

    def pick(self, workload_id: int) -> str | None:
        """The next replica of an endpoint to send a request to (round-robin); None: none answers."""
        targets = self.ready.get(workload_id) or []
        if not targets:
            return None
        known = self._turns.get(workload_id)
        if known is None or known[0] != targets:
            known = self._turns[workload_id] = (targets, itertools.cycle(targets))
        return next(known[1])

    async def tick(self) -> None:
        with self.sessions() as s:
            rows = s.execute(select(D.Workload.id, D.Workload.status, D.Workload.handle, D.Workload.attempt,
                                    D.Workload.endpoint_state, D.Workload.ready_replicas, D.Workload.endpoint_restarts)
                             .where(D.Workload.type == D.JOB, D.Workload.kind == INFERENCE,
                                    D.Workload.status.in_(D.ACTIVE))).all()
        found = await asyncio.gather(*(self._probe(r) for r in rows))
        ready, changes = {}, []
        for r, (answered, restarts) in zip(rows, found):
            if answered:
                ready[r.id] = answered
            state = (EndpointState.READY if answered else EndpointState.STARTING).value
            if (state, len(answered), restarts) != (r.endpoint_state, r.ready_replicas, r.endpoint_restarts):
                if state != r.endpoint_state:
                    log.info("%s: endpoint %s (%d replicas answer)", D.public_id(D.JOB, r.id), state, len(answered))
                changes.append({"id": r.id, "endpoint_state": state, "ready_replicas": len(answered),
                                "endpoint_restarts": restarts})
        self.ready = ready
        for gone in set(self._turns) - set(ready):
            self._turns.pop(gone, None)
        if changes:
            with self.sessions() as s:
                s.execute(update(D.Workload), changes)
                s.commit()

    async def _probe(self, r: Any) -> tuple[list[str], int]:
        """(the replicas that answer, the restarts of its servers) of one endpoint's row."""
        targets = endpoint_targets(r.handle) if r.status == D.RUNNING else []
        if not targets:
            return [], 0
        ok = await asyncio.gather(*(answers(t) for t in targets))
        restarts_of = getattr(self.backend, "restarts", None)
        restarts = 0
        if callable(restarts_of):
            try:
                restarts = int(await asyncio.get_running_loop().run_in_executor(
                    None, restarts_of, r.handle, JobDir.of(self.job_root, D.public_id(D.JOB, r.id)).path, r.attempt))
            except Exception as e:  # a count the backend cannot read now: the last one stays
                log.debug("restarts of %s not read: %s", D.public_id(D.JOB, r.id), e)
                restarts = r.endpoint_restarts or 0
        return [t for t, good in zip(targets, ok) if good], restarts
