"""The service's tables: workloads (jobs and workspaces), job metrics, the scheduler's reservations
and suspended workspaces (the usage ledger's and the GPU samples' tables are in ledger.py and
samples.py; engine.py makes the database).

A row holds GPUs exactly when ``allocation`` is not NULL; the scheduler loop counts every such
row as busy capacity, whatever its status (a cancelled job still exiting keeps its GPUs until it
is gone). That is what keeps a GPU from being handed out twice across crashes and restarts.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, deferred, mapped_column

# statuses, workload types and public ids are the API's (gpupool/contract.py)
from ...contract import (ACTIVE, CANCELLED, ENDED, FAILED, JOB, PREEMPTING, QUEUED, RUNNING, STARTING,  # noqa: F401
                         STATUSES, SUCCEEDED, TRAIN, WORKSPACE, parse_public_id, public_id)
from ...contract import decode_allocation, encode_allocation
from ...scheduler.model import Reservation
from ...scheduler.reasons import Code

NullableJSON = JSON(none_as_null=True)  # Python None is SQL NULL (not the JSON text 'null')


class Base(DeclarativeBase):
    pass


class Workload(Base):
    """A notebook job (``type='job'``) or a workspace admission (``type='workspace'``)."""

    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(16), default=JOB)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")  # workspace: server name
    name: Mapped[str] = mapped_column(String(255), default="")
    queue: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32), default=TRAIN)
    gpus: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_memory: Mapped[int] = mapped_column(Integer, default=0)
    cpu: Mapped[float] = mapped_column(Float, default=0.0)
    memory: Mapped[int] = mapped_column(Integer, default=0)
    priority: Mapped[int] = mapped_column(Integer, default=50)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    checkpoint_on_signal: Mapped[bool] = mapped_column(Boolean, default=False)
    notebook: Mapped[str | None] = mapped_column(Text, nullable=True)
    # script and command jobs (docs/jobs.md): ``script`` relative to the working directory with its
    # ``args``, or ``command`` (an argv list); both NULL for a notebook job
    script: Mapped[str | None] = mapped_column(Text, nullable=True)
    args: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    command: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    pods: Mapped[int] = mapped_column(Integer, default=1)  # workers of a distributed job (a gang)
    enforcement: Mapped[str | None] = mapped_column(String(16), nullable=True)  # contract.ENFORCEMENT_TIERS
    # node pools it may run in, in order of preference (NULL or []: any pool, the core's choice)
    pools: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    source: Mapped[str | None] = deferred(mapped_column(Text, nullable=True))  # the notebook (JSON) as submitted
    parameters: Mapped[Any] = mapped_column(JSON, default=dict)
    sweep: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)

    status: Mapped[str] = mapped_column(String(16), default=QUEUED)
    reason: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # current/last run
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # number of starts so far
    allocation: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)  # list of placements; NULL = holds nothing
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    handle: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)  # backend's run handle
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_cause: Mapped[str | None] = mapped_column(String(32), nullable=True)  # preempt | cancel | memory
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    term_sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    checkpoint_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    env: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)  # workspace: env for the server
    # its attempts, oldest first (written by domain/lifecycle.py only): [{"attempt", "started_at",
    # "ended_at", "allocation", "outcome", "stop_cause", "reason", "exit_code", "resumed_from"}];
    # NULL in rows from before the column existed
    history: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True, default=list)
    # an endpoint (kind inference; domain/endpoints.py): who else may call it ({"users": [...], "groups":
    # [...]}), and what the readiness probe last found (runtime/endpoints.py): contract.EndpointState, the
    # replicas that answered, the restarts of its servers in the current attempt
    share: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    endpoint_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # server defaults: a row written without them (an older service's, a migration) reads 0
    ready_replicas: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    endpoint_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    # AUTOINCREMENT on SQLite: an id (the public id, w-000001) is never handed out again after its
    # row is deleted (a released workspace), so the usage ledger, reservations and the loop's
    # caches and binds, all keyed by it, never mistake a new workload for an old one
    __table_args__ = (Index("ix_workloads_status", "status"), Index("ix_workloads_type_user", "type", "user"),
                      {"sqlite_autoincrement": True})

    @property
    def public_id(self) -> str:
        return public_id(self.type, self.id)


class ReservationRow(Base):
    """A reservation of the scheduler (``scheduler.model.Reservation``): capacity held for a
    workload whose reclaim, preemption or consolidation is in motion. Stored with the first
    decision of each cycle that changed them (same transaction) and read back when the service
    starts, so a plan in motion survives a restart: the victims already checkpointing make room
    for the workload they were evicted for, and nobody is evicted afresh for it."""

    __tablename__ = "reservations"

    workload: Mapped[str] = mapped_column(String(32), primary_key=True)  # the holder's public id
    placements: Mapped[Any] = mapped_column(JSON)  # [{"pod", "node", "gpus", "fraction"}]
    code: Mapped[str] = mapped_column(String(64))  # a reasons.Code value
    since: Mapped[float] = mapped_column(Float)
    detail: Mapped[Any] = mapped_column(JSON, default=dict)  # numbers of its pending reason
    bound_at: Mapped[float | None] = mapped_column(Float, nullable=True)


def reservation_rows(reservations: list[Any]) -> list[dict]:
    """``Reservation`` objects as rows of :class:`ReservationRow`."""
    return [{"workload": r.workload, "code": r.code.value, "since": r.since, "bound_at": r.bound_at,
             "placements": encode_allocation(r.placements),
             "detail": {k: v.item() if hasattr(v, "item") else v for k, v in r.detail.items()}}
            for r in reservations]


def reservations_from_rows(rows: list[Any]) -> list[Any]:
    """The inverse of :func:`reservation_rows` (rows: mappings or ORM rows)."""
    get = (lambda r, k: r[k]) if rows and isinstance(rows[0], dict) else getattr
    return [Reservation(workload=get(r, "workload"), code=Code(get(r, "code")), since=get(r, "since"),
                        bound_at=get(r, "bound_at"), detail=dict(get(r, "detail") or {}),
                        placements=decode_allocation(get(r, "placements")))
            for r in rows]


class Metric(Base):
    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[int] = mapped_column(Integer, index=True)
    name: Mapped[str] = mapped_column(String(255))
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    value: Mapped[float] = mapped_column(Float)
    t: Mapped[float] = mapped_column(Float)


class Suspension(Base):
    """A workspace suspended by an idle rule or its maximum run time (runtime/idle.py): what it
    asked for, so that resuming starts it again with the same options."""

    __tablename__ = "suspensions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    workload: Mapped[str] = mapped_column(String(32))
    options: Mapped[Any] = mapped_column(JSON, default=dict)  # the start options to resume with
    reason: Mapped[str] = mapped_column(Text)
    suspended_at: Mapped[float] = mapped_column(Float)
    resumed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    resumed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
