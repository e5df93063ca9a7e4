"""The scheduling loop of the hub service.

Each cycle (every ``c.GPUPool.cycle_seconds``, and at once when a submission, cancel or release
wakes it):

1. *reconcile*: poll every run that holds GPUs; a run that ended is finished (succeeded / failed),
   requeued (it was preempted) or closed (it was cancelled), and its GPUs are freed;
2. *enforce*: a run asked to stop that is still there after ``preemption_grace`` gets SIGTERM,
   then SIGKILL after ``kill_after``; fractional jobs over their GPU memory share (NVML) are
   reported or stopped (``memory_enforcement``);
3. *decide*: a Snapshot of every node, queue and active workload goes to ``Scheduler.schedule``,
   and every queued workload's reason and position come from the cycle's result; this part runs
   off the event loop, in a worker process by default (runtime/cycle_worker.py,
   ``c.GPUPool.cycle_in_process``), so the API stays responsive during a long cycle;
4. *act*: evictions are persisted (status ``preempting``) and then the run is asked to checkpoint;
   binds are persisted first (status ``starting`` with the allocation: write-ahead) and then
   started through the backend; the handle is persisted once the run exists.

The loop orchestrates: what a status change means is domain/lifecycle.py, what a run is told is
runtime/jobspec.py and runtime/jobfiles.py, and memory enforcement is runtime/memory.py.

Crash safety: a row holds GPUs exactly when its ``allocation`` is set, and every such row is in
every snapshot. On start-up :meth:`SchedulerLoop.recover` re-adopts runs that are still alive,
finishes those that ended meanwhile, and requeues those that vanished. The scheduler's
reservations (plans in motion) are stored with the cycle's first decision and taken up again.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from sqlalchemy import delete, event, insert, or_, select

from ...backends.base import EXITED, LOST, RUNNING as RUN_ALIVE, JobBackend, JobSpec, RunState
from ...contract import StopCause, encode_allocation, format_gpus
from ...protocol import JobDir, latest_mtime, read_latest
from ...scheduler.model import CycleResult, SchedulerConfig
from ...scheduler.reasons import Pending
from ...scheduler.units import parse_bytes
from ..domain import lifecycle, tokens
from ..store import ledger
from ..store import tables as D
from . import attempts, jobfiles
from ..domain.pools import fairness_config
from .cycle_worker import Decider, QueueView, WorkerConfig
from .fairness import UsageTracker
from .jobspec import JobSpecs
from .memory import MemoryEnforcer, fractional
from .memory import tier as enforcement_tier
from .nodes import NodeStates, workspace_grace_over

log = logging.getLogger("gpupool.loop")

MIN_GAP = 0.02  # seconds between back-to-back cycles, so a burst of submissions is one cycle
YIELD_SECONDS = 0.001  # longest the reconcile step runs before the API's requests get their turn
# what the reconcile step reads of each workload holding GPUs (plain rows: cheap for thousands)
RECONCILE_COLUMNS = [getattr(D.Workload, c) for c in (
    "id", "type", "handle", "allocation", "stop_requested_at", "term_sent_at", "last_checkpoint_at")]


@dataclass
class LoopState:
    """What the API shows between cycles (in memory; rebuilt by every cycle)."""

    pending: dict[str, Pending] = field(default_factory=dict)  # str() is the sentence
    positions: dict[str, int] = field(default_factory=dict)
    fair_share: dict[str, dict[str, float]] = field(default_factory=dict)
    allocated: dict[str, dict[str, float]] = field(default_factory=dict)
    # per node pool (pool -> queue -> resource -> amount) and past usage (pool -> queue -> share)
    pool_fair_share: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    pool_allocated: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    # fairness over time: each queue's share without past usage (whole pool, per node pool);
    # empty while past usage counts for nothing (fairness off, or no usage yet)
    fair_share_plain: dict[str, dict[str, float]] = field(default_factory=dict)
    pool_fair_share_plain: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    fairness_on: bool = False
    pools: dict[str, dict[str, float]] = field(default_factory=dict)  # pool -> running, allocated, queued
    queues: dict[str, QueueView] = field(default_factory=dict)
    memory_warnings: dict[int, str] = field(default_factory=dict)
    cycles: int = 0
    last_cycle_at: float | None = None


class SchedulerLoop:
    """``settings``: the service's (hub_ext.config.Settings); ``nvml``: gpupool.backends.nvml's
    reader when NVML works here, else None (memory enforcement is dormant)."""

    def __init__(self, settings: Any, sessions: Any, backend: JobBackend, metrics: Any = None,
                 api_url: str = "", nvml: Any = None):
        self.settings = settings
        self.pool = settings.pool
        self.sessions = sessions
        self.backend = backend
        self.metrics = metrics
        self.nodes = {n.name: n for n in settings.nodes}
        self.specs = JobSpecs(self.pool, settings.gpu_uuids, self.nodes.get, api_url)
        self.memory = (MemoryEnforcer(nvml, backend, lambda name: self.nodes.get(name), self.pool, self.request_stop)
                       if nvml is not None else None)
        self.state = LoopState()
        self.ledger = ledger.install(sessions, settings)  # usage records follow every allocation change
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()  # one cycle (or recovery) at a time
        self._last_cycle_seconds = 0.0
        self._reservations: list = []  # the scheduler's last reservations, for the next snapshot
        self._stored_reservations: list[dict] = []  # what the database holds of them (D.ReservationRow)
        # a backend that watches the cluster (Kubernetes) gives the node list every cycle
        self._live_nodes = callable(getattr(backend, "nodes", None))
        # reading the database, the snapshot, Scheduler.schedule and the pending reasons: in a
        # worker process (c.GPUPool.cycle_in_process) or a thread, never on the event loop
        fairness = fairness_config(self.pool.fairness)  # c.GPUPool.fairness (None: off)
        self.fairness = UsageTracker(sessions, fairness)  # past usage from the ledger (runtime/fairness.py)
        self.state.fairness_on = fairness is not None
        core = SchedulerConfig(min_runtime=self.pool.min_runtime, preemption_grace=self.pool.preemption_grace,
                               placement=self.pool.placement, gpu_memory_reserve=self.pool.gpu_memory_reserve,
                               gpu_memory_reserve_min=parse_bytes(self.pool.gpu_memory_reserve_min),
                               fairness_k=fairness.k if fairness else 0.0)
        self.decider = Decider(WorkerConfig(db_url=self.pool.db_url, queues=list(settings.queues), scheduler=core,
                                            live_nodes=self._live_nodes),
                               sessions, self.pool.cycle_in_process, timeout=self.pool.cycle_timeout)
        self.node_reasons: dict[str, str] = {}  # node -> why it is not schedulable (live inventory)
        self._inventory_task: asyncio.Task | None = None
        self.node_states = NodeStates(sessions, backend, metrics)  # nodes drained or failed (runtime/nodes.py)

    # what runs are told (runtime/jobspec.py)
    @property
    def instance(self) -> str:
        return self.specs.instance

    def job_dir(self, row: D.Workload) -> JobDir:
        return self.specs.job_dir(row)

    def workdir(self, user: str) -> str:
        return self.specs.workdir(user)

    def gpu_env(self, allocation: list[dict] | None, gpu_memory: int = 0) -> dict[str, str]:
        return self.specs.gpu_env(allocation, gpu_memory)

    def job_spec(self, row: D.Workload, token: str = "") -> JobSpec:
        return self.specs.job_spec(row, token)

    # ------------------------------------------------------------------ lifecycle
    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        watch = getattr(self.backend, "start_watching", None)
        if callable(watch):
            await watch()  # the live inventory is there before the first cycle
            self.refresh_nodes()
            changed = getattr(getattr(self.backend, "inventory", None), "changed", None)
            if isinstance(changed, asyncio.Event):  # Kubernetes: backend.inventory.changed
                self._inventory_task = asyncio.create_task(self._wake_on_inventory(changed),
                                                           name="gpupool-inventory-wake")
        self.decider.start()
        self.node_states.load()
        await self.recover()
        self._task = asyncio.create_task(self._run())

    async def _wake_on_inventory(self, changed: asyncio.Event) -> None:
        """A node cordoned, added, removed, or its free GPUs changed: run a cycle now."""
        while not self._stopping:
            await changed.wait()
            changed.clear()
            self.wake()

    def refresh_nodes(self) -> None:
        """Take the node list (and GPU UUIDs) from a backend that keeps a live inventory. The
        service's ``settings.nodes`` is updated in place, so the API's /nodes and submission
        checks see the same list. A backend without one (local) keeps the configured nodes."""
        if not self._live_nodes:
            return
        nodes = self.backend.nodes()
        if nodes is None:  # declared inventory, or not watching yet
            return
        old = {n.name: (n.gpus, n.schedulable) for n in self.settings.nodes}
        new = {n.name: (n.gpus, n.schedulable) for n in nodes}
        for name in sorted(old.keys() | new.keys()):
            if old.get(name) != new.get(name):
                log.info("node %s: %s -> %s", name, _node_words(old.get(name)), _node_words(new.get(name)))
        self.settings.nodes[:] = nodes
        self.nodes.clear()
        self.nodes.update((n.name, n) for n in nodes)
        uuids_fn = getattr(self.backend, "gpu_uuids", None)
        uuids = uuids_fn() if callable(uuids_fn) else None
        if uuids is not None:
            self.settings.gpu_uuids.clear()
            self.settings.gpu_uuids.update(uuids)
        why_fn = getattr(self.backend, "why_unschedulable", None)
        self.node_reasons = (why_fn() if callable(why_fn) else None) or {}

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._inventory_task is not None:
            self._inventory_task.cancel()
            try:
                await self._inventory_task
            except (asyncio.CancelledError, Exception):
                pass
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self.decider.close)
        await self.backend.close()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.cycle()
            except Exception:  # a bad cycle must not kill the loop; the next one retries
                log.exception("scheduling cycle failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.pool.cycle_seconds)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            # a burst of wake-ups (many submissions) keeps the loop busy at most a third of the time
            await asyncio.sleep(max(MIN_GAP, 2 * self._last_cycle_seconds))

    # ------------------------------------------------------------------ recovery
    async def recover(self) -> None:
        """After a (re)start: re-adopt live runs, finish ended ones, requeue vanished ones."""
        async with self._lock:
            with self.sessions() as s:
                rows = s.scalars(select(D.Workload).where(D.Workload.type == D.JOB,
                                                          D.Workload.allocation.is_not(None))).all()
                for row in rows:
                    try:
                        spec = self.job_spec(row)
                    except ValueError as e:
                        self._release(row, RunState(LOST, None, str(e)), time.time())
                        continue
                    handle, state = await self.backend.adopt(spec, row.handle)
                    if state.state == RUN_ALIVE:
                        lifecycle.readopted(row, handle)
                        log.info("re-adopted %s (%s)", row.public_id, handle)
                    elif state.state == EXITED or row.stop_cause:
                        log.info("%s ended while the service was down: %s", row.public_id, state.detail)
                        self._release(row, state, time.time())
                    else:
                        log.info("%s vanished while the service was down; requeued", row.public_id)
                        lifecycle.vanished(row, time.time())
                opened, closed = self.ledger.reconcile(s)
                if opened or closed:
                    log.info("usage ledger: opened %d and closed %d records to match the allocations", opened, closed)
                s.commit()
            self.fairness.rebuild(time.time(), self.node_states.apply(self.nodes.values()))
            with self.sessions() as s:
                # plans in motion before the restart (the next cycle keeps or drops each, saying why)
                self._reservations = D.reservations_from_rows(
                    s.scalars(select(D.ReservationRow).order_by(D.ReservationRow.since)).all())
                self._stored_reservations = D.reservation_rows(self._reservations)
                if self._reservations:
                    log.info("%d reservations of plans in motion taken up again: %s", len(self._reservations),
                             ", ".join(r.workload for r in self._reservations))

    # ------------------------------------------------------------------ the cycle
    async def cycle(self) -> CycleResult | None:
        async with self._lock:
            return await self._cycle()

    async def _cycle(self) -> CycleResult | None:
        t0 = time.perf_counter()
        now = time.time()
        self.refresh_nodes()
        await self.node_states.detect()
        with self.sessions() as s:
            await self.node_states.act(self, s, now)  # workloads on nodes drained or failed leave them
            # the rows the reconcile step may change: jobs holding GPUs (their runs are polled) and
            # workspaces asked to stop; a workspace that just holds its GPUs needs nothing here
            rows = s.execute(select(*RECONCILE_COLUMNS).where(  # read as they are polled
                D.Workload.allocation.is_not(None),
                or_(D.Workload.type == D.JOB, D.Workload.stop_requested_at.is_not(None))))
            await self._reconcile(s, rows, now)
            s.commit()
        t_rec = time.perf_counter()
        nodes = self.node_states.apply(self.nodes.values())
        usage = self.fairness.usage(now, nodes)  # fairness over time ({} when off)
        decision = await self.decider.decide(now, nodes, self._reservations, usage)
        result = decision.result
        t_dec = time.perf_counter()
        for warning in decision.warnings:
            log.warning("%s", warning)
        for wid, why in result.dropped.items():
            log.info("%s: its reservation was dropped (%s); planning it afresh", wid, why)
        with self.sessions() as s:
            stored = self._store_reservations(s, result.reservations)
            # each decision is committed on its own; between two, the API's requests get their turn
            for ev in result.evictions:
                await self._evict(s, ev.workload, ev, now)
                await asyncio.sleep(0)
            for bind in result.binds:
                await self._bind(s, bind.workload, bind, now)
                await asyncio.sleep(0)
            s.commit()
        self._stored_reservations = stored
        t_act = time.perf_counter()
        log.debug("cycle: reconcile %.0f ms, decide %.0f ms (%s: read %.0f ms, schedule %.0f ms, %d reasons stored "
                  "in %.0f ms), act %.0f ms (%d binds, %d evictions)", 1000 * (t_rec - t0), 1000 * (t_dec - t_rec),
                  "worker process" if decision.pid != os.getpid() else "thread", decision.read_ms, decision.decide_ms,
                  decision.reasons, decision.explain_ms, 1000 * (t_act - t_dec), len(result.binds),
                  len(result.evictions))
        self._reservations = result.reservations  # handed back unchanged next cycle
        st = self.state
        st.queues = decision.queues
        st.pending, st.positions = result.pending, result.positions
        st.fair_share, st.allocated = result.fair_share, result.allocated
        st.pool_fair_share, st.pool_allocated, st.usage = result.pool_fair_share, result.pool_allocated, usage
        st.fair_share_plain, st.pool_fair_share_plain = result.fair_share_plain, result.pool_fair_share_plain
        st.pools = decision.pools
        # the gap before the next cycle follows the service's own work, not a hung worker's wait
        self._last_cycle_seconds = time.perf_counter() - t0 - decision.lost_seconds
        st.cycles += 1
        st.last_cycle_at = now
        if self.metrics is not None:
            self.metrics.observe_cycle(self, now, decision.held, result, time.perf_counter() - t0, decision.decide_ms)
        return result

    def _store_reservations(self, s: Any, reservations: list) -> list[dict]:
        """Have the session's next commit (the cycle's first decision, or its end) store the
        reservations when they changed: a plan and the evictions it made are durable together."""
        rows = D.reservation_rows(reservations)
        if rows != self._stored_reservations:
            def write(session: Any) -> None:
                session.execute(delete(D.ReservationRow))
                if rows:
                    session.execute(insert(D.ReservationRow), rows)
            event.listen(s, "before_commit", write, once=True)
        return rows

    async def _reconcile(self, s: Any, rows: Iterable[Any], now: float) -> None:
        """Poll every run holding GPUs and act on what changed. ``rows`` are plain rows
        (:data:`RECONCILE_COLUMNS`): a workload's ORM row is loaded only when something about it
        changes, so thousands of running jobs cost little of the event loop's time; and the loop
        yields every few milliseconds (nothing is flushed before the commit, so no write lock is
        held meanwhile)."""
        grace, kill_after = self.pool.preemption_grace, self.pool.kill_after
        tick = time.perf_counter()
        fractional_ids = []
        with s.no_autoflush:
            for r in rows:
                if time.perf_counter() - tick > YIELD_SECONDS:
                    await asyncio.sleep(0)  # the API's requests get their turn
                    tick = time.perf_counter()
                if r.type == D.WORKSPACE:
                    if r.stop_requested_at is not None and now - r.stop_requested_at >= grace:
                        workspace_grace_over(s, s.get(D.Workload, r.id), now)
                    continue
                if r.handle is None:
                    continue  # being started right now (cannot happen across restarts: recover() ran)
                if fractional(r.allocation):
                    fractional_ids.append(r.id)
                state = await self.backend.poll(r.handle)
                if state.state != RUN_ALIVE:
                    self._release(s.get(D.Workload, r.id), state, now)
                    continue
                files = JobDir.of(self.pool.job_root, D.public_id(r.type, r.id))
                if latest_mtime(files.checkpoints) not in (None, r.last_checkpoint_at):
                    self._note_checkpoint(s.get(D.Workload, r.id))
                if r.stop_requested_at is not None:
                    if r.term_sent_at is None and now - r.stop_requested_at >= grace:
                        log.info("%s: grace period over; terminating", D.public_id(r.type, r.id))
                        await self.backend.terminate(r.handle, force=False)
                        lifecycle.terminated(s.get(D.Workload, r.id), now)
                    elif r.term_sent_at is not None and now - r.term_sent_at >= kill_after:
                        await self.backend.terminate(r.handle, force=True)
        if self.memory is not None:
            self.state.memory_warnings = await self.memory.check(s, [s.get(D.Workload, i) for i in fractional_ids], now)

    def _note_checkpoint(self, row: D.Workload) -> None:
        checkpoints = self.job_dir(row).checkpoints
        mtime = latest_mtime(checkpoints)
        if mtime is not None and row.last_checkpoint_at != mtime:
            row.last_checkpoint_at = mtime
            row.checkpoint_path = read_latest(checkpoints)

    def _release(self, row: D.Workload, state: RunState, now: float) -> None:
        """A run ended (or is gone): free its GPUs; the lifecycle decides what the job becomes."""
        self._note_checkpoint(row)
        files = self.job_dir(row)
        was = row.stop_cause
        status = lifecycle.released(row, state, now, self.pool.gang_restarts,
                                    error_line=lambda rank: jobfiles.error_line(files.worker_log(rank)),
                                    before_code=state.state == EXITED and bool(state.exit_code)
                                    and attempts.died_before_code(row, files, state.rank),
                                    startup_retries=self.pool.startup_retries)
        if self.metrics is None or status == D.QUEUED and was != StopCause.PREEMPT:
            return
        if status == D.QUEUED:
            self.metrics.preemptions.inc()
        else:
            self.metrics.finished.labels(status=status).inc()

    # ------------------------------------------------------------------ acting on decisions
    async def _evict(self, s: Any, wid: str, ev: Any, now: float) -> None:
        row = _load(s, wid)
        if row is None or row.allocation is None or row.stop_requested_at is not None:
            return
        await self.request_stop(row, StopCause.PREEMPT, ev.reason, now, session=s)

    async def request_stop(self, row: D.Workload, cause: StopCause | str, reason: str, now: float,
                           session: Any = None) -> None:
        """Ask a workload that holds GPUs to checkpoint and stop (persisted first, then the backend
        is told); the loop terminates it after the grace period."""
        grace = self.pool.preemption_grace
        first = lifecycle.request_stop(row, cause, reason, now, grace)
        if session is not None:
            session.commit()
        if row.type == D.JOB and row.handle is not None and first:
            try:
                await self.backend.request_checkpoint(row.handle, self.job_spec(row), reason)
                if grace <= 0:
                    await self.backend.terminate(row.handle, force=False)
                    lifecycle.terminated(row, now)
            except Exception:
                log.exception("could not ask %s to stop", row.public_id)
        self.wake()

    async def _bind(self, s: Any, wid: str, bind: Any, now: float) -> None:
        row = _load(s, wid)
        if row is None or row.status != D.QUEUED or row.allocation is not None:
            return  # cancelled or deleted since the snapshot
        allocation = encode_allocation(bind.placements)
        if row.type == D.WORKSPACE:
            lifecycle.bind(row, allocation, bind.reason, now, env=self.gpu_env(allocation, row.gpu_memory))
            row.enforcement = enforcement_tier(allocation, None, False)  # the NVML watch checks jobs only
            s.commit()
            return
        token, token_hash = tokens.mint()
        lifecycle.bind(row, allocation, bind.reason, now, token_hash=token_hash,
                       resumed_from=attempts.resume_point(self.job_dir(row)))
        s.commit()  # write-ahead: the allocation is on disk before anything runs
        try:
            spec = self.job_spec(row, token)
            if spec.command is None and not os.path.exists(spec.notebook):
                source = s.scalar(select(D.Workload.source).where(D.Workload.id == row.id))
                if not source:
                    raise RuntimeError("the submitted notebook was not stored")
                jobfiles.write_notebook(spec.job_dir, source)
            if row.attempt > 1:
                resume = self.specs.resumes_from(spec)
                for rank in range(spec.pods):
                    jobfiles.append(spec.worker_log(rank),
                                    f"\n=== gpupool: attempt {row.attempt} of {spec.job_id} on "
                                    f"{lifecycle.where(allocation)}{'; resuming from ' + resume if resume else ''} ===\n")
            handle = await self.backend.start(spec)
        except Exception as e:
            log.warning("could not start %s: %s", row.public_id, e)
            s.refresh(row)
            lifecycle.start_failed(row, e, time.time())
            s.commit()
            if self.metrics is not None:
                self.metrics.finished.labels(status=D.FAILED).inc()
            return
        s.refresh(row)  # a cancel may have come in while it started
        row.enforcement = enforcement_tier(allocation, handle, self.memory is not None and self.backend.name == "local")
        if not lifecycle.started(row, handle, bind.reason):
            s.commit()
            await self.backend.request_checkpoint(handle, self.job_spec(row), row.stop_reason or "cancelled")
            return
        s.commit()


def _load(s: Any, wid: str) -> D.Workload | None:
    """The row of a workload the scheduler named (by its public id)."""
    parsed = D.parse_public_id(wid)
    return s.get(D.Workload, parsed[1]) if parsed is not None else None


def _node_words(state: tuple[int, bool] | None) -> str:
    if state is None:
        return "gone"
    gpus, schedulable = state
    return format_gpus(gpus) + ("" if schedulable else ", not schedulable")
