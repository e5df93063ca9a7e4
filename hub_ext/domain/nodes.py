"""Nodes out of service, and what that means for the workloads on them (runtime/nodes.py acts on it).

A node leaves service in one of two ways (docs/admin.md, "Draining a node"):

* **drain**: no new placements; every workload on it is asked to checkpoint and stop (the usual
  ``preemption_grace``), then a job is requeued and a workspace suspended;
* **fail**: at once: its jobs are stopped and requeued from their last checkpoint, its workspaces
  suspended; their GPUs are free at once.

and comes back with **return** (schedulable again). An admin does it through the API
(``POST nodes/{name}/drain|fail|return``, stored: store/nodes.py); a backend finds it by itself
(``JobBackend.node_conditions``: a GPU NVML no longer lists, a Kubernetes node NotReady or
cordoned) and brings the node back when the condition is gone. Where both say something, the
stronger wins (fail over drain); a node a backend holds out cannot be returned by an admin.

A workload with any pod on a node that is out leaves whole (a gang's other pods too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sqlalchemy import select

from ...contract import NODE_ACTIONS, NODE_DRAINED, NODE_DRAINING, NODE_FAILED, NODE_UP
from ..store.nodes import NodeOut

DRAIN, FAIL, RETURN = NODE_ACTIONS
ADMIN = "admin"  # the source of an admin's action (a backend's is its name)
_STRENGTH = {DRAIN: 1, FAIL: 2}


@dataclass(frozen=True)
class Out:
    """Why a node is out of service: ``action`` drain or fail, ``why`` in words ("by alice:
    kernel update", "NVML no longer lists GPU 1"), ``source`` admin or a backend's name."""

    action: str
    why: str
    source: str = ADMIN
    since: float | None = None

    def words(self, node: str) -> str:
        """``node box is drained (by alice: kernel update)``."""
        verb = "is drained" if self.action == DRAIN else "failed"
        return f"node {node} {verb} ({self.why})" if self.why else f"node {node} {verb}"


def admin_out(row: NodeOut) -> Out:
    who = f"by {row.by}" if row.by else "by an admin"
    return Out(row.action, f"{who}: {row.note}" if row.note else who, ADMIN, row.since)


def load(s: Any) -> dict[str, Out]:
    """The admin's actions in force (the store)."""
    return {row.name: admin_out(row) for row in s.scalars(select(NodeOut))}


def take_out(s: Any, name: str, action: str, by: str, note: str, now: float) -> Out:
    """Store an admin's drain or fail of ``name`` (a later action replaces an earlier one); the
    caller commits."""
    row = s.get(NodeOut, name)
    if row is None:
        row = NodeOut(name=name, since=now)
        s.add(row)
    elif row.action != action:
        row.since = now
    row.action, row.by, row.note = action, by, note
    return admin_out(row)


def bring_back(s: Any, name: str) -> bool:
    """Forget the admin's action on ``name``; False when there was none. The caller commits."""
    row = s.get(NodeOut, name)
    if row is None:
        return False
    s.delete(row)
    s.flush()
    return True


def merged(admin: Mapping[str, Out], found: Mapping[str, Out]) -> dict[str, Out]:
    """Every node that is out: the stronger of the admin's action and the backend's finding (the
    admin's on a tie)."""
    out = dict(found)
    for name, o in admin.items():
        if name not in out or _STRENGTH[o.action] >= _STRENGTH[out[name].action]:
            out[name] = o
    return out


def leaving(allocation: Iterable[Mapping] | None, out: Mapping[str, Out]) -> tuple[str, Out] | None:
    """Whether a workload holding ``allocation`` must leave, and for which node: a failed node
    before a drained one (the first of each in pod order)."""
    hit = [(p["node"], out[p["node"]]) for p in allocation or () if p.get("node") in out]
    hit.sort(key=lambda h: -_STRENGTH[h[1].action])
    return hit[0] if hit else None


def state(out: Out | None, holding: bool) -> str:
    """A node's ``state`` in ``GET nodes``: up; draining while workloads still hold GPUs there,
    then drained; failed."""
    if out is None:
        return NODE_UP
    if out.action == FAIL:
        return NODE_FAILED
    return NODE_DRAINING if holding else NODE_DRAINED
