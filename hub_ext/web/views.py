"""Answers of the REST API, serialised through their models (web/schemas.py): a field of an
answer model that is a column of the workload's row is copied by name; what is derived (ids,
times, reasons of waiting workloads, allocations, workers) is said here once."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select

from ... import contract as C
from ..domain import endpoints
from ..store import tables as D
from . import schemas
from .base import iso

COLUMNS = frozenset(D.Workload.__table__.c.keys())
JOB_COLUMNS = tuple(f for f in schemas.Job.model_fields if f in COLUMNS and f != "history")
WORKSPACE_COLUMNS = tuple(f for f in schemas.Workspace.model_fields if f in COLUMNS and f != "env")


def _waiting(state: Any, row: Any) -> dict:
    """reason, reason_code and position: a queued workload's come from the last cycle."""
    pid = row.public_id
    queued = row.status == D.QUEUED
    why = state.pending.get(pid) if queued else None
    return {"reason": str(why) if why is not None else row.reason, "reason_code": C.reason_code(why),
            "position": state.positions.get(pid) if queued else None}


def _common(state: Any, row: Any, columns: tuple[str, ...]) -> dict:
    out = {f: getattr(row, f) for f in columns}
    out.update(_waiting(state, row), id=row.public_id, gpu_memory=row.gpu_memory or None,
               allocation=C.allocation_to_api(row.allocation), submitted_at=iso(row.submitted_at),
               started_at=iso(row.started_at))
    return out


def job(state: Any, row: Any, metrics: dict | None = None) -> dict:
    """``schemas.Job`` of a job's row; ``state``: the loop's (runtime/loop.py LoopState)."""
    out = _common(state, row, JOB_COLUMNS)
    ckpt = None
    if row.checkpoint_path or row.last_checkpoint_at:
        ckpt = {"latest": row.checkpoint_path, "at": iso(row.last_checkpoint_at)}
    out.update(parameters=row.parameters or {}, finished_at=iso(row.finished_at), attempts=row.attempt,
               metrics=metrics if metrics is not None else {}, checkpoint=ckpt, pods=int(row.pods or 1),
               workers=workers(row), history=history(row), **endpoints.view(row))
    return schemas.Job.model_validate(out).model_dump(exclude_unset=True)


def _ranks(allocation: list[dict] | None) -> dict[int, Any]:
    """rank -> its placement (the contract's codec), of a stored allocation."""
    return {p.pod: p for p in C.decode_allocation(allocation)}


def history(row: Any) -> list[dict]:
    """``schemas.Attempt`` of each attempt of a workload (its row's ``history``, lifecycle.py)."""
    out = []
    for a in row.history or []:
        ranks = sorted(_ranks(a.get("allocation")).items())
        out.append({**{k: a.get(k) for k in ("attempt", "outcome", "stop_cause", "reason", "exit_code",
                                               "resumed_from")},
                    "started_at": iso(a.get("started_at")), "ended_at": iso(a.get("ended_at")),
                    "placement": [{"rank": rank, **C.allocation_to_api(C.encode_allocation([p]))[0]}
                                  for rank, p in ranks]})
    return out


def workers(row: Any) -> list[dict]:
    """The workers of a job (one for a plain job): rank, where it runs (a job that ended: where
    its last attempt ran), its log (``?rank=``)."""
    allocation = row.allocation
    if allocation is None and row.status in C.ENDED and row.history:
        allocation = row.history[-1].get("allocation")
    placed = _ranks(allocation)
    out = []
    for rank in range(int(row.pods or 1)):
        p = placed.get(rank)
        out.append({"rank": rank, "node": p.node if p else None, "gpus": list(p.gpus) if p else [],
                    "fraction": p.fraction if p else None,
                    "log": f"jobs/{row.public_id}/log" + (f"?rank={rank}" if rank else "")})
    return out


def workspace(state: Any, row: Any, activity: dict, env: bool = True, **changes: Any) -> dict:
    """``schemas.Workspace`` of a workspace's row; ``env`` only for its owner and admins."""
    out = _common(state, row, WORKSPACE_COLUMNS)
    out["last_activity"] = activity.get((row.user, row.server))
    if env:
        out["env"] = row.env or {} if row.status == D.RUNNING else {}
    out.update(changes)
    return schemas.Workspace.model_validate(out).model_dump(exclude_unset=True)


def suspension(sus: Any) -> dict:
    return schemas.Suspension.model_validate(
        {"id": sus.id, "user": sus.user, "server": sus.server, "workload": sus.workload, "options": sus.options,
         "reason": sus.reason, "suspended_at": iso(sus.suspended_at), "resumed_at": iso(sus.resumed_at),
         "resumed_by": sus.resumed_by}).model_dump(exclude_unset=True)


def metric(job_id: str, m: Any) -> dict:
    return schemas.MetricOut.model_validate({"job": job_id, "name": m.name, "step": m.step, "value": m.value,
                                             "t": iso(m.t)}).model_dump(exclude_unset=True)


def metrics_for(s: Any, ids: list[int]) -> dict[int, dict[str, list]]:
    """The metrics of jobs, by job id: name -> [{"step", "value", "t"}]."""
    out: dict[int, dict[str, list]] = {i: {} for i in ids}
    if not ids:
        return out
    for chunk in range(0, len(ids), 500):
        part = ids[chunk:chunk + 500]
        q = select(D.Metric).where(D.Metric.workload_id.in_(part)).order_by(D.Metric.id)
        for m in s.scalars(q):
            out[m.workload_id].setdefault(m.name, []).append({"step": m.step, "value": m.value, "t": iso(m.t)})
    return out
