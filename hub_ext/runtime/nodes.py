"""Nodes out of service, in the running service (the rules: domain/nodes.py).

Every cycle the loop asks the backend which nodes it finds out of service (``node_conditions``),
merges that with the admin's drains and fails (stored), hands the scheduler the nodes that are
out as not schedulable (no new placements; reservations counting on them are dropped by the
core) and makes the workloads on them leave:

* on a **drained** node, each workload not already stopping is asked to checkpoint and stop with
  the grace period (stop cause ``drain``); a job is then requeued, a workspace suspended;
* on a **failed** node, a job's run is killed at once and its GPUs freed without waiting for it:
  it is requeued and resumes from its last checkpoint (stop cause ``node-failure``); a workspace
  is suspended at once (the spawner stops its server; its owner resumes it elsewhere).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Iterable

from sqlalchemy import select

from ...contract import StopCause
from ...scheduler.model import NodeSpec
from ..domain import lifecycle
from ..domain import nodes as N
from ..domain.idle_rules import suspend
from ..store import tables as D

log = logging.getLogger("gpupool.nodes")


class NodeStates:
    """Which nodes are out and why: ``admin`` (stored), ``found`` (the backend's, this cycle) and
    ``out``, the two merged."""

    def __init__(self, sessions: Any, backend: Any, metrics: Any = None):
        self.sessions = sessions
        self.backend = backend
        self.metrics = metrics
        self.admin: dict[str, N.Out] = {}
        self.found: dict[str, N.Out] = {}
        self.out: dict[str, N.Out] = {}

    def load(self) -> None:
        """The admin's drains and fails from the database (at service start)."""
        with self.sessions() as s:
            self.admin = N.load(s)
        self._merge()

    def _merge(self) -> None:
        new = N.merged(self.admin, self.found)
        for name in sorted(new.keys() | self.out.keys()):
            was, now = self.out.get(name), new.get(name)
            if was != now:
                log.warning("node %s: %s", name, now.words(name) if now else "back in service")
        self.out = new

    async def detect(self) -> None:
        """What the backend finds now (a failed reading keeps the last one)."""
        try:
            conditions = await self.backend.node_conditions()
        except Exception:  # noqa: BLE001 - never stop a cycle for it
            log.exception("could not ask the backend which nodes are out of service")
            return
        found = {}
        for name, (action, why) in conditions.items():
            prev = self.found.get(name)
            same = prev is not None and (prev.action, prev.why) == (action, why)
            found[name] = prev if same else N.Out(action, why, getattr(self.backend, "name", "backend"), time.time())
        self.found = found
        self._merge()

    def apply(self, nodes: Iterable[NodeSpec]) -> list[NodeSpec]:
        """The nodes as the scheduler sees them: those out of service are not schedulable."""
        return [dataclasses.replace(n, schedulable=False) if n.name in self.out and n.schedulable else n
                for n in nodes]

    def view(self, name: str, holding: bool) -> dict:
        """A node's ``state``, ``state_reason`` and ``state_source`` (``GET nodes``)."""
        out = self.out.get(name)
        if out is None:
            return {"state": N.state(None, holding)}
        return {"state": N.state(out, holding), "state_reason": out.why or None, "state_source": out.source}

    # ------------------------------------------------------------------ acting
    async def act(self, loop: Any, s: Any, now: float) -> list[str]:
        """Make the workloads on nodes that are out leave (see the module's docstring); returns
        the ids of those acted on now."""
        if not self.out:
            return []
        acted = []
        # plain rows first (cheap for thousands); a workload's ORM row only when it must leave
        plain = s.execute(select(D.Workload.id, D.Workload.allocation, D.Workload.stop_requested_at)
                          .where(D.Workload.allocation.is_not(None))).all()
        for r in plain:
            hit = N.leaving(r.allocation, self.out)
            if hit is None or (hit[1].action == N.DRAIN and r.stop_requested_at is not None):
                continue
            row = s.get(D.Workload, r.id)
            name, out = hit
            if out.action == N.FAIL:
                await self._failed(loop, s, row, f"its node {name} failed" + (f" ({out.why})" if out.why else ""), now)
            elif row.stop_requested_at is None:  # one already stopping keeps its own stop
                why = f"its node {name} is being drained" + (f" ({out.why})" if out.why else "")
                log.info("%s: %s", row.public_id, why)
                await loop.request_stop(row, StopCause.DRAIN, why, now, session=s)
            else:
                continue
            acted.append(row.public_id)
            if self.metrics is not None:
                self.metrics.evictions.labels(cause=StopCause.DRAIN.value if out.action == N.DRAIN
                                              else StopCause.NODE_FAILURE.value).inc()
        s.commit()
        return acted

    async def _failed(self, loop: Any, s: Any, row: D.Workload, why: str, now: float) -> None:
        log.warning("%s: %s; %s", row.public_id, why, "suspended" if row.type == D.WORKSPACE else "requeued")
        if row.type == D.WORKSPACE:
            suspend(s, row, why, now)
            return
        if row.handle is not None:
            try:
                await self.backend.terminate(row.handle, force=True)  # whatever is left of it goes now
            except Exception:  # noqa: BLE001 - a node that failed may not answer: its GPUs go back anyway
                log.exception("could not kill what is left of %s", row.public_id)
        loop._note_checkpoint(row)  # the latest checkpoint it saved is where it resumes
        lifecycle.node_failed(row, why, now)
        s.commit()

    async def set(self, loop: Any, name: str, action: str, by: str, reason: str) -> list[str]:
        """An admin's drain, fail or return of ``name``, stored and acted on now (under the
        loop's lock: not in the middle of a cycle). Returns the workloads acted on."""
        async with loop._lock:
            now = time.time()
            with self.sessions() as s:
                if action == N.RETURN:
                    N.bring_back(s, name)
                    self.admin.pop(name, None)
                else:
                    self.admin[name] = N.take_out(s, name, action, by, reason, now)
                s.commit()
                self._merge()
                acted = await self.act(loop, s, now)
        loop.wake()
        return acted


def workspace_grace_over(s: Any, row: D.Workload, now: float) -> None:
    """A workspace asked to stop has had its grace period: one on a drained node is suspended
    (it is resumed elsewhere), a preempted one waits again."""
    if row.stop_cause == StopCause.DRAIN:
        suspend(s, row, row.stop_reason or "its node is being drained", now)
    else:
        lifecycle.workspace_released(row, now)
