"""``nodes``: the nodes and their GPUs with allocations, live readings and whether each is in
service; an admin takes one out and back (``POST nodes/{name}/drain|fail|return``; what that does:
domain/nodes.py, runtime/nodes.py)."""
from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import select

from ...contract import NODE_ACTIONS, decode_allocation
from ..domain import nodes as N
from ..domain.errors import APIError
from ..runtime.simulated import SIMULATED
from ..store import tables as D
from . import schemas
from .base import BaseHandler
from .scopes import ADMIN, SUBMIT, needs_scope


def readings_source(svc: Any, node: str) -> str | None:
    """Where a node's readings come from: ``nvml``, ``dcgm``, ``simulated`` (made up:
    runtime/simulated.py, never shown as measured) or None (none)."""
    if getattr(svc, "nvml", None) is not None and node in svc.settings.gpu_uuids:
        return "nvml"
    if node in (getattr(svc, "dcgm_last", None) or {}):
        return "dcgm"
    simulated = getattr(svc, "simulated", None)
    if simulated is not None and any(n.name == node for n in simulated.nodes()):
        return SIMULATED
    return None


def node_views(svc: Any, only: Iterable[str] | None = None) -> list[dict]:
    """``GET nodes``' entries (of the nodes named in ``only``; all when None)."""
    with svc.sessions() as s:
        rows = s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None))).all()
    per_gpu: dict[tuple[str, int], list[dict]] = {}
    held: set[str] = set()
    for row in rows:
        for p in decode_allocation(row.allocation):
            held.add(p.node)
            for g in p.gpus:
                per_gpu.setdefault((p.node, g), []).append(
                    {"workload": row.public_id, "kind": row.kind, "user": row.user, "fraction": p.fraction})
    readings = svc.gpu_readings()
    states = svc.loop.node_states
    wanted = set(only) if only is not None else None
    out = []
    for n in svc.settings.nodes:
        if wanted is not None and n.name not in wanted:
            continue
        uuids = svc.settings.gpu_uuids.get(n.name) or []
        live = readings.get(n.name, {})
        gpus = []
        for i in range(n.gpus):
            allocs = per_gpu.get((n.name, i), [])
            r = live.get(i, {})
            gpus.append({"index": i, "uuid": uuids[i] if i < len(uuids) else None,
                         "allocated": round(sum(a["fraction"] for a in allocs), 3),
                         "utilization": r.get("utilization"), "memory_used": r.get("memory_used"),
                         "memory_total": r.get("memory_total") or n.gpu_memory or None,
                         "allocations": allocs})
        state = states.view(n.name, n.name in held)
        schedulable = n.schedulable and n.name not in states.out
        node = {"name": n.name, "gpu_model": n.gpu_model, "gpu_memory": n.gpu_memory, "pool": n.pool,
                "schedulable": schedulable, "labels": n.labels, "gpus": gpus,
                "readings": readings_source(svc, n.name), **state}
        if not schedulable:
            node["unschedulable_reason"] = (svc.loop.node_reasons.get(n.name) or state.get("state_reason")
                                            or "marked unschedulable")
        out.append(node)
    return out


class NodesHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        self.send({"nodes": node_views(self.svc)})


class NodeActionHandler(BaseHandler):
    """``POST nodes/{name}/drain|fail|return`` (admin)."""

    @needs_scope(ADMIN)
    async def post(self, name: str, action: str) -> None:
        if action not in NODE_ACTIONS:
            raise APIError(404, f"action: no action {action!r} on a node (drain, fail or return)", "action")
        body = self.body(schemas.NodeActionRequest)
        svc = self.svc
        known = [n.name for n in svc.settings.nodes]
        if name not in known:
            raise APIError(404, f"name: no node {name!r} in the pool (its nodes: {', '.join(known) or 'none'})", "name")
        states = svc.loop.node_states
        found = states.found.get(name)
        if action == N.RETURN and found is not None:
            raise APIError(409, f"name: node {name} is out of service because the {found.source} backend finds it "
                                f"so ({found.why}); it returns by itself once that is over", "name")
        acted = await states.set(svc.loop, name, action, self.ident.name, body.reason or "")
        [view] = node_views(svc, [name])
        self.send({**view, "workloads": acted})
