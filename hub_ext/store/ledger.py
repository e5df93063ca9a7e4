"""The usage ledger: one record per allocation interval, written with the state change itself.

A workload holds GPUs exactly when its row's ``allocation`` is set (store/tables.py). So the ledger
follows that one column: whenever a flush changes a workload's ``allocation`` (bind, release,
preemption, cancel, a workspace deleted, a vanished run requeued at restart, a release by the
workspace reconciler, ...), the open records of that workload are closed and, when it holds an
allocation again, new ones are opened, on the same connection and so in the same transaction as
the change. Nothing in the loop or the API has to remember to write it, and a crash can never
leave the ledger and the state disagreeing: either both are committed or neither.

One record per placement (a pod on a node): workload, user, queue (and its path in the queue
tree, whose first element is the department), kind, node and its pool, GPU indices and model, fraction, start,
end and why it ended (``end_reason``: a code from :data:`END_REASONS`, ``end_detail``: the
workload's reason, a sentence). A SIGKILL of the service leaves the records of running workloads
open; on the next start :func:`reconcile` (called by ``SchedulerLoop.recover``) keeps the interval
of a run that is re-adopted (it never stopped holding its GPUs), and the requeue of one that
vanished closes it (``lost``). It also repairs what an older version or a hand edit left: an
allocation without an open record gets one from its ``started_at``, an open record of a workload
that holds nothing is closed.
"""
from __future__ import annotations

import time
from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text, event, inspect, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from ...contract import decode_allocation
from ...scheduler.fairshare import QueueTree
from ...scheduler.model import DEFAULT_POOL
from . import tables as D

# Why an interval ended (``end_reason``)
SUCCEEDED, FAILED, CANCELLED = D.SUCCEEDED, D.FAILED, D.CANCELLED
PREEMPTED = "preempted"      # evicted by the scheduler and requeued
LOST = "lost"                # its run was gone when the service restarted; requeued
STOPPED = "stopped"          # a workspace whose server stopped (its request was deleted)
REQUEUED = "requeued"        # given back for another reason and waiting again
REPAIRED = "repaired"        # closed at start-up: the workload held nothing any more
REPLACED = "replaced"        # the allocation changed while the workload kept running
SUSPENDED = "suspended"      # a workspace suspended by an idle rule (runtime/idle.py)
DRAINED = "drain"            # its node was drained: it checkpointed and was requeued
NODE_FAILURE = "node-failure"  # its node failed: stopped at once and requeued
END_REASONS = (SUCCEEDED, FAILED, CANCELLED, PREEMPTED, LOST, STOPPED, REQUEUED, REPAIRED, REPLACED, SUSPENDED,
               DRAINED, NODE_FAILURE)


class UsageRecord(D.Base):
    __tablename__ = "usage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[int] = mapped_column(Integer, index=True)
    workload: Mapped[str] = mapped_column(String(32))  # public id, j-000042 / w-000007
    type: Mapped[str] = mapped_column(String(16))
    user: Mapped[str] = mapped_column(String(255), index=True)
    queue: Mapped[str] = mapped_column(String(255))
    queue_path: Mapped[str] = mapped_column(Text)  # "research/vision"
    department: Mapped[str] = mapped_column(String(255))  # the top of the path (a root queue is its own)
    kind: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    pod: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str] = mapped_column(String(255))
    gpu_indices: Mapped[Any] = mapped_column(JSON, default=list)
    gpu_model: Mapped[str] = mapped_column(String(255), default="")
    # the node's pool (scheduler NodeSpec.pool); NULL in records from before pools: pool ``default``
    pool: Mapped[str | None] = mapped_column(String(255), nullable=True)
    fraction: Mapped[float] = mapped_column(Float, default=1.0)
    gpus: Mapped[float] = mapped_column(Float, default=0.0)  # len(gpu_indices) * fraction
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    end_detail: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_usage_span", "start", "end"),)


TABLE = UsageRecord.__table__


class Ledger:
    """Writes the records of one sessionmaker's sessions. ``settings`` (hub_ext.config.Settings) is
    read at each write: the node list of a live inventory changes in place."""

    def __init__(self, settings: Any, clock: Any = time.time):
        self.settings = settings
        self.clock = clock
        self._tree: tuple[Any, QueueTree] | None = None  # (the queue list it was made of, the tree)

    # ------------------------------------------------------------------ what a record says
    def queue_path(self, queue: str) -> list[str]:
        """Root first; a queue no longer configured is its own path."""
        queues = self.settings.queues
        if self._tree is None or self._tree[0] is not queues:
            self._tree = (queues, QueueTree(queues))
        tree = self._tree[1]
        return list(tree.path(queue)) if queue in tree.queues else [queue]

    def records(self, row: D.Workload, start: float) -> list[dict]:
        models = {n.name: n.gpu_model for n in self.settings.nodes}
        pools = {n.name: n.pool for n in self.settings.nodes}
        path = self.queue_path(row.queue)
        out = []
        for p in decode_allocation(row.allocation):
            indices, fraction = list(p.gpus), p.fraction
            out.append(dict(workload_id=row.id, workload=D.public_id(row.type, row.id), type=row.type, user=row.user,
                            queue=row.queue, queue_path="/".join(path), department=path[0], kind=row.kind,
                            attempt=row.attempt or 0, pod=p.pod, node=p.node,
                            gpu_indices=indices, gpu_model=models.get(p.node, "") or "", pool=pools.get(p.node, DEFAULT_POOL),
                            fraction=fraction, gpus=len(indices) * fraction, start=start, end=None))
        return out

    @staticmethod
    def end_reason(row: D.Workload, deleted: bool) -> str:
        named = getattr(row, "_gpupool_end_reason", None)  # set by the code that ended it (idle: suspended)
        if named:
            return named
        if deleted:
            return STOPPED
        if row.status in D.ENDED:
            return row.status
        if row.status == D.QUEUED:
            state = inspect(row)
            if state.attrs.restarts.history.added:
                return LOST
            if state.attrs.preemptions.history.added:
                return PREEMPTED
            return REQUEUED
        return REPLACED

    # ------------------------------------------------------------------ the flush hook
    def after_flush(self, session: Session, _context: Any) -> None:
        changes: list[tuple[D.Workload, bool]] = []
        for obj in session.new:
            if isinstance(obj, D.Workload) and obj.allocation is not None:
                changes.append((obj, False))
        for obj in session.dirty:
            if isinstance(obj, D.Workload) and inspect(obj).attrs.allocation.history.has_changes():
                changes.append((obj, False))
        for obj in session.deleted:
            if isinstance(obj, D.Workload):
                changes.append((obj, True))
        if not changes:
            return
        conn = session.connection()
        now = self.clock()
        for row, deleted in changes:
            ended = row.finished_at if row.status in D.ENDED and row.finished_at else now
            conn.execute(update(TABLE).where(TABLE.c.workload_id == row.id, TABLE.c.end.is_(None))
                         .values(end=ended, end_reason=self.end_reason(row, deleted),
                                 end_detail=("its server stopped (the spawner released it)" if deleted
                                             else row.reason or None)))
            if not deleted and row.allocation is not None:
                values = self.records(row, row.started_at or now)
                if values:
                    conn.execute(TABLE.insert(), values)

    # ------------------------------------------------------------------ start-up repair
    def reconcile(self, s: Session) -> tuple[int, int]:
        """Make the open records match the allocations (after a crash, an upgrade, a hand edit):
        returns (records opened, records closed). Runs inside the caller's transaction."""
        holding = {r.id: r for r in s.scalars(select(D.Workload).where(D.Workload.allocation.is_not(None)))}
        open_ids = set(s.scalars(select(TABLE.c.workload_id).where(TABLE.c.end.is_(None))))
        now = self.clock()
        closed = 0
        stale = open_ids - set(holding)
        if stale:
            closed = s.execute(update(TABLE).where(TABLE.c.workload_id.in_(stale), TABLE.c.end.is_(None))
                               .values(end=now, end_reason=REPAIRED,
                                       end_detail="closed when the gpupool service started: the workload "
                                                  "held no GPUs any more")).rowcount
        opened = 0
        for wid in set(holding) - open_ids:
            values = self.records(holding[wid], holding[wid].started_at or now)
            if values:
                s.execute(TABLE.insert(), values)
                opened += len(values)
        return opened, closed


def install(sessions: Any, settings: Any) -> Ledger:
    """Attach the ledger to a sessionmaker (once; later calls return the same ledger)."""
    existing = getattr(sessions, "_gpupool_ledger", None)
    if existing is not None:
        existing.settings = settings
        return existing
    ledger = Ledger(settings)
    event.listen(sessions, "after_flush", ledger.after_flush)
    sessions._gpupool_ledger = ledger
    return ledger
