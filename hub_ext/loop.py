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
   off the event loop, in a worker process by default (hub_ext/cycle_worker.py,
   ``c.GPUPool.cycle_in_process``), so the API stays responsive during a long cycle;
4. *act*: evictions are persisted (status ``preempting``) and then the run is asked to checkpoint;
   binds are persisted first (status ``starting`` with the allocation: write-ahead) and then
   started through the backend; the handle is persisted once the run exists.

Crash safety: a row holds GPUs exactly when its ``allocation`` is set, and every such row is in
every snapshot. On start-up :meth:`SchedulerLoop.recover` re-adopts runs that are still alive,
finishes those that ended meanwhile, and requeues those that vanished. The scheduler's
reservations (plans in motion) are stored with the cycle's first decision and taken up again.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import pwd
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from sqlalchemy import delete, event, insert, or_, select

from ..backends.base import EXITED, LOST, RUNNING as RUN_ALIVE, JobBackend, JobSpec, RunState, worker_file
from ..scheduler.model import CycleResult, SchedulerConfig
from ..scheduler.reasons import Pending
from ..contract import describe_allocation, format_bytes, format_gpus
from . import db as D
from . import ledger
from .config import Settings
from .cycle_worker import Decider, QueueView, WorkerConfig

log = logging.getLogger("gpupool.loop")

JOB_TOKEN_PREFIX = "gpj_"
MIN_GAP = 0.02  # seconds between back-to-back cycles, so a burst of submissions is one cycle
YIELD_SECONDS = 0.001  # longest the reconcile step runs before the API's requests get their turn
# what the reconcile step reads of each workload holding GPUs (plain rows: cheap for thousands)
RECONCILE_COLUMNS = [getattr(D.Workload, c) for c in (
    "id", "type", "handle", "allocation", "stop_requested_at", "term_sent_at", "last_checkpoint_at")]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class LoopState:
    """What the API shows between cycles (in memory; rebuilt by every cycle)."""

    pending: dict[str, Pending] = field(default_factory=dict)  # str() is the sentence
    positions: dict[str, int] = field(default_factory=dict)
    fair_share: dict[str, dict[str, float]] = field(default_factory=dict)
    allocated: dict[str, dict[str, float]] = field(default_factory=dict)
    queues: dict[str, QueueView] = field(default_factory=dict)
    memory_warnings: dict[int, str] = field(default_factory=dict)
    cycles: int = 0
    last_cycle_at: float | None = None


class SchedulerLoop:
    def __init__(self, settings: Settings, sessions: Any, backend: JobBackend, metrics: Any = None,
                 api_url: str = "", nvml: Any = None):
        self.settings = settings
        self.pool = settings.pool
        self.sessions = sessions
        self.backend = backend
        self.metrics = metrics
        self.api_url = api_url
        self.nvml = nvml  # gpupool.backends.nvml when NVML works here, else None (enforcement dormant)
        # run ids must be unique on the machine (another hub's j-000001 is not ours): job root digest
        self.instance = hashlib.sha256(os.path.realpath(self.pool.job_root).encode()).hexdigest()[:10]
        self.nodes = {n.name: n for n in settings.nodes}
        self.queue_specs = {q.name: q for q in settings.queues}
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
        self.decider = Decider(WorkerConfig(db_url=self.pool.db_url, queues=list(settings.queues),
                                            scheduler=SchedulerConfig(min_runtime=self.pool.min_runtime,
                                                                      preemption_grace=self.pool.preemption_grace,
                                                                      placement=self.pool.placement),
                                            live_nodes=self._live_nodes),
                               sessions, self.pool.cycle_in_process, timeout=self.pool.cycle_timeout)
        self.node_reasons: dict[str, str] = {}  # node -> why it is not schedulable (live inventory)
        self._inventory_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        watch = getattr(self.backend, "start_watching", None)
        if callable(watch):
            await watch()  # the live inventory is there before the first cycle
            self.refresh_nodes()
            event = self._inventory_event()
            if event is not None:
                self._inventory_task = asyncio.create_task(self._wake_on_inventory(event),
                                                           name="gpupool-inventory-wake")
        self.decider.start()
        await self.recover()
        self._task = asyncio.create_task(self._run())

    def _inventory_event(self) -> asyncio.Event | None:
        """The backend's "the inventory changed" event (Kubernetes: ``backend.inventory.changed``)."""
        event = getattr(getattr(self.backend, "inventory", None), "changed", None)
        return event if isinstance(event, asyncio.Event) else None

    async def _wake_on_inventory(self, event: asyncio.Event) -> None:
        """A node cordoned, added, removed, or its free GPUs changed: run a cycle now."""
        while not self._stopping:
            await event.wait()
            event.clear()
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
        if old != new:
            for name in sorted(old.keys() | new.keys()):
                if old.get(name) != new.get(name):
                    was, now = old.get(name), new.get(name)
                    log.info("node %s: %s -> %s", name, _node_words(was), _node_words(now))
        self.settings.nodes[:] = nodes
        self.nodes = {n.name: n for n in nodes}
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

    # ------------------------------------------------------------------ helpers
    def job_dir(self, row: D.Workload) -> str:
        return os.path.join(self.pool.job_root, row.public_id)

    def workdir(self, user: str) -> str:
        template = self.pool.work_dir
        home = ""
        if "{home}" in template:
            try:
                home = pwd.getpwnam(user).pw_dir
            except KeyError:
                raise ValueError(f"there is no system user {user!r} to find a home directory for "
                                 "(an admin can set c.GPUPool.work_dir, e.g. '/srv/homes/{user}')") from None
        return os.path.abspath(template.format(home=home, user=user))

    def gpu_env(self, allocation: list[dict] | None, gpu_memory: int = 0) -> dict[str, str]:
        """CUDA visibility and memory caps for an allocation (jobs and workspaces)."""
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        placed = [p for p in (allocation or []) if p.get("gpus")]
        if not placed:
            env.update(CUDA_VISIBLE_DEVICES="", NVIDIA_VISIBLE_DEVICES="void", GPUPOOL_GPUS="",
                       GPUPOOL_GPU_FRACTION="0")
            return env
        p = placed[0]
        uuids = self.settings.gpu_uuids.get(p["node"]) or []
        ids = [uuids[i] if i < len(uuids) else str(i) for i in p["gpus"]]
        fraction = float(p.get("fraction", 1.0))
        env.update(CUDA_VISIBLE_DEVICES=",".join(ids), NVIDIA_VISIBLE_DEVICES=",".join(ids),
                   GPUPOOL_GPUS=",".join(str(i) for i in p["gpus"]), GPUPOOL_NODE=p["node"],
                   GPUPOOL_GPU_FRACTION=f"{fraction:g}")
        if fraction < 1.0:
            node = self.nodes.get(p["node"])
            limit = gpu_memory or (int(node.gpu_memory * fraction) if node and node.gpu_memory else 0)
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.3f}"
            env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
            if limit:
                env["GPUPOOL_GPU_MEMORY_LIMIT"] = str(limit)
        return env

    def job_spec(self, row: D.Workload, token: str = "") -> JobSpec:
        jid = row.public_id
        jdir = self.job_dir(row)
        ckpt = os.path.join(jdir, "checkpoints")
        env = self.gpu_env(row.allocation, row.gpu_memory)
        env.update(GPUPOOL_JOB_ID=jid, GPUPOOL_ATTEMPT=str(row.attempt), GPUPOOL_CHECKPOINT_DIR=ckpt,
                   GPUPOOL_STOP_FILE=os.path.join(jdir, "control", "stop"), GPUPOOL_JOB_DIR=jdir,
                   GPUPOOL_API_URL=self.api_url)
        if token:
            env["GPUPOOL_API_TOKEN"] = token
        latest = _latest_checkpoint(ckpt)
        if latest:
            env["GPUPOOL_RESUME_FROM"] = latest
        run_as = None
        if self.pool.run_as_user and os.geteuid() == 0:
            run_as = row.user
        pods = int(row.pods or 1)
        placements = sorted(row.allocation or [], key=lambda p: int(p.get("pod", 0)))
        return JobSpec(job_id=jid, run_id=f"{jid}.{row.attempt}.{self.instance}", attempt=row.attempt, user=row.user,
                       notebook=os.path.join(jdir, "input.ipynb"), output=os.path.join(jdir, "output.ipynb"),
                       log=os.path.join(jdir, "log.txt"), parameters=row.parameters or {},
                       workdir=self.workdir(row.user), job_dir=jdir, checkpoint_dir=ckpt,
                       stop_file=env["GPUPOOL_STOP_FILE"], env=env, placements=placements,
                       kernel_name=self.pool.kernel_name, python=self.pool.job_python, run_as=run_as,
                       queue=row.queue or "", kind=row.kind or "", cpu=float(row.cpu or 0), memory=int(row.memory or 0),
                       command=program_command(row), pods=pods,
                       worker_env=[self.gpu_env([p], row.gpu_memory) for p in placements] if pods > 1 else [])

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
                        row.handle = handle
                        if row.status == D.STARTING:
                            row.status = D.RUNNING
                            row.reason = f"running on {_where(row.allocation)}"
                        log.info("re-adopted %s (%s)", row.public_id, handle)
                    elif state.state == EXITED or row.stop_cause:
                        log.info("%s ended while the service was down: %s", row.public_id, state.detail)
                        self._release(row, state, time.time())
                    else:
                        log.info("%s vanished while the service was down; requeued", row.public_id)
                        row.allocation = None
                        row.handle = None
                        row.status = D.QUEUED
                        row.restarts += 1
                        row.reason = ("requeued: its process was gone when the gpupool service restarted; "
                                      "it resumes from its latest checkpoint")
                opened, closed = self.ledger.reconcile(s)
                if opened or closed:
                    log.info("usage ledger: opened %d and closed %d records to match the allocations", opened, closed)
                s.commit()
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
        with self.sessions() as s:
            # the rows the reconcile step may change: jobs holding GPUs (their runs are polled) and
            # workspaces asked to stop; a workspace that just holds its GPUs needs nothing here
            rows = s.execute(select(*RECONCILE_COLUMNS).where(  # read as they are polled
                D.Workload.allocation.is_not(None),
                or_(D.Workload.type == D.JOB, D.Workload.stop_requested_at.is_not(None))))
            await self._reconcile(s, rows, now)
            s.commit()
        t_rec = time.perf_counter()
        decision = await self.decider.decide(now, list(self.nodes.values()), self._reservations)
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
        fractional = []
        with s.no_autoflush:
            for r in rows:
                if time.perf_counter() - tick > YIELD_SECONDS:
                    await asyncio.sleep(0)  # the API's requests get their turn
                    tick = time.perf_counter()
                if r.type == D.WORKSPACE:
                    if r.stop_requested_at is not None and now - r.stop_requested_at >= grace:
                        self._release_workspace(s.get(D.Workload, r.id))
                    continue
                if r.handle is None:
                    continue  # being started right now (cannot happen across restarts: recover() ran)
                if _fractional(r.allocation):
                    fractional.append(r.id)
                state = await self.backend.poll(r.handle)
                if state.state != RUN_ALIVE:
                    self._release(s.get(D.Workload, r.id), state, now)
                    continue
                if _checkpoint_mtime(self.pool.job_root, D.public_id(r.type, r.id)) not in (None, r.last_checkpoint_at):
                    self._note_checkpoint(s.get(D.Workload, r.id))
                if r.stop_requested_at is not None:
                    waited = now - r.stop_requested_at
                    if r.term_sent_at is None and waited >= grace:
                        log.info("%s: grace period over; terminating", D.public_id(r.type, r.id))
                        await self.backend.terminate(r.handle, force=False)
                        s.get(D.Workload, r.id).term_sent_at = now
                    elif r.term_sent_at is not None and now - r.term_sent_at >= kill_after:
                        await self.backend.terminate(r.handle, force=True)
        if self.nvml is not None:
            await self._enforce_memory(s, [s.get(D.Workload, i) for i in fractional], now)

    def _note_checkpoint(self, row: D.Workload) -> None:
        mtime = _checkpoint_mtime(self.pool.job_root, row.public_id)
        if mtime is not None and row.last_checkpoint_at != mtime:
            row.last_checkpoint_at = mtime
            row.checkpoint_path = _latest_checkpoint(os.path.join(self.job_dir(row), "checkpoints"))

    def _release(self, row: D.Workload, state: RunState, now: float) -> None:
        """A run ended (or is gone): free its GPUs and decide what the job becomes."""
        self._note_checkpoint(row)
        cause, why = row.stop_cause, row.stop_reason or ""
        row.allocation = None
        row.handle = None
        row.exit_code = state.exit_code
        row.stop_requested_at = row.term_sent_at = None
        row.stop_cause = row.stop_reason = None
        if cause == "preempt":
            row.status = D.QUEUED
            row.preemptions += 1
            resume = ("resumes from its checkpoint" if row.last_checkpoint_at
                      else "restarts from the beginning (it saved no checkpoint)")
            row.reason = f"requeued after preemption ({why}); it {resume}"
            if self.metrics is not None:
                self.metrics.preemptions.inc()
            return
        if cause is None and state.state == LOST and (row.pods or 1) > 1 and row.restarts < self.pool.gang_restarts:
            # a worker of a gang died (killed, its node failed): the whole gang starts again
            row.status = D.QUEUED
            row.restarts += 1
            resume = ("resumes from its checkpoint" if row.last_checkpoint_at
                      else "restarts from the beginning (it saved no checkpoint)")
            row.reason = (f"requeued: {state.detail}; it {resume} "
                          f"(restart {row.restarts} of at most {self.pool.gang_restarts})")
            return
        row.finished_at = now
        if cause == "cancel":
            row.status = D.CANCELLED
            row.reason = why or "cancelled"
        elif cause == "memory":
            row.status = D.FAILED
            row.reason = why
        elif state.state == EXITED and state.exit_code == 0:
            row.status = D.SUCCEEDED
            what = "the notebook ran to the end" if program_command(row) is None else "the program exited with status 0"
            row.reason = f"succeeded: {what}" + (f" in all {row.pods} workers" if (row.pods or 1) > 1 else "")
        elif state.state == EXITED:
            row.status = D.FAILED
            err = _error_line(worker_file(os.path.join(self.job_dir(row), "log.txt"), state.rank or 0))
            if err and state.rank is not None:
                err = f"worker {state.rank}: {err}"
            row.reason = f"failed: {err}" if err else f"failed: {state.detail}"
            if err and state.exit_code and state.exit_code > 128:
                row.reason += f" ({state.detail})"
        else:
            row.status = D.FAILED
            row.reason = f"failed: {state.detail}"
        if self.metrics is not None:
            self.metrics.finished.labels(status=row.status).inc()

    def _release_workspace(self, row: D.Workload) -> None:
        why = row.stop_reason or "preempted"
        row.allocation = None
        row.env = None
        row.stop_requested_at = row.term_sent_at = None
        row.stop_cause = row.stop_reason = None
        row.status = D.QUEUED
        row.preemptions += 1
        row.reason = f"requeued after preemption ({why})"

    async def _enforce_memory(self, s: Any, rows: list[D.Workload], now: float) -> None:
        """Fractional jobs over their GPU memory share (NVML per-process readings)."""
        by_gpu: dict[int, dict[int, list]] = {}  # GPU index -> job id -> [row, its workers on that GPU]
        for row in rows:
            if row.type != D.JOB or not row.allocation or row.handle is None or row.stop_requested_at:
                continue
            for p in row.allocation:  # every worker's share (a gang's workers may share a GPU)
                if p.get("gpus") and float(p.get("fraction", 1)) < 1:
                    by_gpu.setdefault(p["gpus"][0], {}).setdefault(row.id, [row, 0])[1] += 1
        warnings: dict[int, str] = {}
        for index, jobs in by_gpu.items():
            used_by_pid = self.nvml.process_memory(index)
            if not used_by_pid:
                continue
            for row, workers in jobs.values():
                pids = self.backend.pids(row.handle)
                used = sum(b for pid, b in used_by_pid.items() if pid in pids)
                node = self.nodes.get(row.allocation[0]["node"])
                share = workers * (row.gpu_memory or (node.gpu_memory * float(row.allocation[0]["fraction"])
                                                      if node else 0))
                if share and used > share * 1.02:
                    msg = (f"using {format_bytes(used)} of GPU {index}'s memory, more than its share of "
                           f"{format_bytes(share)}")
                    warnings[row.id] = msg
                    if self.pool.memory_enforcement == "stop":
                        reason = f"failed: stopped for {msg} (memory_enforcement = 'stop')"
                        await self.request_stop(row, "memory", reason, now, session=s)
                    elif not row.reason.endswith(msg):
                        row.reason = f"running on {_where(row.allocation)}; warning: {msg}"
        self.state.memory_warnings = warnings

    async def _evict(self, s: Any, wid: str, ev: Any, now: float) -> None:
        row = _load(s, wid)
        if row is None or row.allocation is None or row.stop_requested_at is not None:
            return
        await self.request_stop(row, "preempt", ev.reason, now, session=s)

    async def request_stop(self, row: D.Workload, cause: str, reason: str, now: float, session: Any = None) -> None:
        """Ask a workload that holds GPUs to checkpoint and stop (persisted first, then the backend
        is told); the loop terminates it after the grace period. ``cause``: preempt | cancel | memory."""
        first = row.stop_requested_at is None
        row.stop_cause, row.stop_reason = cause, reason
        grace = self.pool.preemption_grace
        if first:
            row.stop_requested_at = now
        if cause == "preempt":
            row.status = D.PREEMPTING
            row.reason = f"{reason}; it has {grace:g} s to save a checkpoint, then it is requeued"
        elif cause == "cancel":
            row.status = D.CANCELLED
            row.reason = f"{reason}; stopping (it has {grace:g} s to save a checkpoint)"
        else:
            row.reason = reason
        if session is not None:
            session.commit()
        if row.type == D.JOB and row.handle is not None and first:
            try:
                await self.backend.request_checkpoint(row.handle, self.job_spec(row), reason)
                if grace <= 0:
                    await self.backend.terminate(row.handle, force=False)
                    row.term_sent_at = now
            except Exception:
                log.exception("could not ask %s to stop", row.public_id)
        self.wake()

    async def _bind(self, s: Any, wid: str, bind: Any, now: float) -> None:
        row = _load(s, wid)
        if row is None or row.status != D.QUEUED or row.allocation is not None:
            return  # cancelled or deleted since the snapshot
        allocation = [{"pod": p.pod, "node": p.node, "gpus": list(p.gpus), "fraction": p.fraction}
                      for p in bind.placements]
        row.allocation = allocation
        row.started_at = now
        row.attempt += 1
        row.stop_requested_at = row.term_sent_at = None
        row.stop_cause = row.stop_reason = None
        if row.type == D.WORKSPACE:
            row.status = D.RUNNING
            row.env = self.gpu_env(allocation, row.gpu_memory)
            row.reason = f"admitted on {_where(allocation)}: {bind.reason}"
            s.commit()
            return
        token = JOB_TOKEN_PREFIX + secrets.token_urlsafe(24)
        row.token_hash = hash_token(token)
        row.status = D.STARTING
        row.reason = f"starting on {_where(allocation)}: {bind.reason}"
        s.commit()  # write-ahead: the allocation is on disk before anything runs
        try:
            spec = self.job_spec(row, token)
            if spec.command is None and not os.path.exists(spec.notebook):
                source = s.scalar(select(D.Workload.source).where(D.Workload.id == row.id))
                if not source:
                    raise RuntimeError("the submitted notebook was not stored")
                os.makedirs(spec.job_dir, exist_ok=True)
                tmp = spec.notebook + ".tmp"
                with open(tmp, "w") as f:
                    f.write(source)
                os.replace(tmp, spec.notebook)
            if row.attempt > 1:
                for rank in range(spec.pods):
                    _append(spec.worker_log(rank),
                            f"\n=== gpupool: attempt {row.attempt} of {spec.job_id} on {_where(allocation)}"
                            f"{'; resuming from ' + spec.env['GPUPOOL_RESUME_FROM'] if 'GPUPOOL_RESUME_FROM' in spec.env else ''} ===\n")
            handle = await self.backend.start(spec)
        except Exception as e:
            log.warning("could not start %s: %s", row.public_id, e)
            s.refresh(row)
            row.allocation = None
            row.status = D.FAILED
            row.finished_at = time.time()
            row.reason = f"failed to start: {e}"
            s.commit()
            if self.metrics is not None:
                self.metrics.finished.labels(status=D.FAILED).inc()
            return
        s.refresh(row)  # a cancel may have come in while it started
        row.handle = handle
        if row.stop_cause == "cancel":
            s.commit()
            await self.backend.request_checkpoint(handle, self.job_spec(row), row.stop_reason or "cancelled")
            return
        row.status = D.RUNNING
        row.reason = f"running on {_where(allocation)}: {bind.reason}"
        s.commit()


def _load(s: Any, wid: str) -> D.Workload | None:
    """The row of a workload the scheduler named (by its public id)."""
    parsed = D.parse_public_id(wid)
    return s.get(D.Workload, parsed[1]) if parsed is not None else None


def program_command(row: Any) -> list[str] | None:
    """A script or command job's argv (a leading ``python`` is the job's interpreter); None for a
    notebook job."""
    if row.command:
        return [str(a) for a in row.command]
    if row.script:
        return ["python", row.script, *[str(a) for a in (row.args or [])]]
    return None


def _node_words(state: tuple[int, bool] | None) -> str:
    if state is None:
        return "gone"
    gpus, schedulable = state
    return format_gpus(gpus) + ("" if schedulable else ", not schedulable")


def _where(allocation: list[dict] | None) -> str:
    return describe_allocation(allocation) or "CPU only"


def _checkpoint_mtime(job_root: str, job_id: str) -> float | None:
    """When the job's checkpoint pointer (``checkpoints/LATEST``) was last written; None: never."""
    try:
        return os.stat(os.path.join(job_root, job_id, "checkpoints", "LATEST")).st_mtime
    except OSError:
        return None


def _fractional(allocation: list[dict] | None) -> bool:
    return any(p.get("gpus") and float(p.get("fraction", 1)) < 1 for p in allocation or ())


def _latest_checkpoint(ckpt_dir: str) -> str | None:
    try:
        with open(os.path.join(ckpt_dir, "LATEST")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    path = os.path.join(ckpt_dir, info.get("path", ""))
    return path if info.get("path") and os.path.exists(path) else None


def _append(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def _error_line(log_path: str) -> str:
    """The most telling line at the end of a failed papermill log (the exception)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 16384))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    import re

    tail = re.sub(r"\x1b\[[0-9;]*m", "", tail)
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$", ln)
        if m and not ln.startswith("papermill.exceptions.PapermillExecutionError"):
            return m.group(1)[:500]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln[:500]
    return ""
