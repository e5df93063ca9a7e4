"""The heavy part of a scheduling cycle runs in a worker process (hub_ext/runtime/cycle_worker.py,
``c.GPUPool.cycle_in_process``): the same decisions as in a thread, and a worker that dies, or
hangs (``c.GPUPool.cycle_timeout``), costs no cycle. How much it helps the API's latency is measured by ``benchmarks/api_throughput.py
--loaded``, not here."""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import time

import pytest

from gpupool.backends.base import RUNNING, JobBackend, RunState
from gpupool.hub_ext import store as D
from gpupool.hub_ext.runtime.cycle_worker import Decider, WorkerConfig
from gpupool.scheduler.model import NodeSpec, Phase, QueueSpec, SchedulerConfig

from hub_harness import Hub, _alive, children, hub_leak_check  # noqa: F401 (leak check fixtures)

NODES = [NodeSpec(name=f"n{i}", gpus=4, labels={"rack": f"r{i // 4}"}) for i in range(8)]
QUEUES = [QueueSpec("a", deserved={"gpu": 16}), QueueSpec("b", deserved={"gpu": 16}),
          QueueSpec("c", deserved={"gpu": 0}, limit={"gpu": 2})]


def _seed(url: str, now: float) -> None:
    """Queue a holds all GPUs but two (workspaces: a row with an allocation is a holder); b
    reclaims (evictions, reservations), c waits at its limit once it holds the two free GPUs."""
    rng = random.Random(7)
    rows = []
    for n in NODES:
        for g in range(n.gpus if n is not NODES[-1] else n.gpus - 2):
            rows.append(dict(type=D.WORKSPACE, user="u1", queue="a", kind="train", gpus=1.0, preemptible=True,
                             status=D.RUNNING, submitted_at=now - 900, started_at=now - 600 + rng.random(),
                             last_checkpoint_at=now - 60 * rng.random() if rng.random() < 0.5 else None,
                             allocation=[{"pod": 0, "node": n.name, "gpus": [g], "fraction": 1.0}]))
    for i in range(40):
        queue = "bc"[i % 2] if i < 30 else "a"
        rows.append(dict(type=D.JOB if i % 3 else D.WORKSPACE, command=["true"] if i % 3 else None,
                         user=f"u{i % 5}", queue=queue, kind="train",
                         gpus=rng.choice([0.5, 1.0, 1.0, 2.0]), preemptible=True, status=D.QUEUED,
                         submitted_at=now - 300 + i, parameters={}, pods=2 if i == 11 else 1))
    engine = D.make_engine(url)
    with engine.begin() as conn:
        base = dict(reason="", started_at=None, last_checkpoint_at=None, allocation=None, parameters={}, pods=1,
                    command=None)
        conn.execute(D.Workload.__table__.insert(), [{**base, **r} for r in rows])
    engine.dispose()


async def test_worker_process_decides_as_the_thread_does(tmp_path):
    """Three cycles (each handing its reservations to the next) decided in a worker process and in
    a thread, each on its own copy of the same database: the same binds, evictions, reasons,
    positions, shares and reservations."""
    now = time.time()
    first = tmp_path / "thread.sqlite"
    _seed(f"sqlite:///{first}", now)
    shutil.copy(first, tmp_path / "process.sqlite")
    outcomes = {}
    for name, in_process in (("thread", False), ("process", True)):
        config = WorkerConfig(db_url=f"sqlite:///{tmp_path / name}.sqlite", queues=QUEUES,
                              scheduler=SchedulerConfig(preemption_grace=30))
        decider = Decider(config, D.make_sessionmaker(D.make_engine(config.db_url)), in_process)
        try:
            reservations, seen = [], []
            for k in range(3):
                d = await decider.decide(now + 5 * k, NODES, reservations)
                r = d.result
                reservations = r.reservations
                seen.append((r.binds, r.evictions, dict(r.pending), r.positions, r.fair_share, r.allocated,
                             r.reservations, r.dropped, d.queues, d.held, d.reasons))
                assert (d.pid != os.getpid()) == in_process
                # waiting for the worker process to start is no work of the service: the loop's gap
                # before the next cycle leaves it out (it was twice the start-up, with no cycle then)
                assert (d.lost_seconds > 0) == (in_process and k == 0)
        finally:
            decider.close()
        outcomes[name] = seen
    assert outcomes["process"] == outcomes["thread"]
    binds, evictions, pending, *_ = outcomes["thread"][0]
    # the scenario is not trivial: binds, and b reclaims (evictions, reservations)
    assert evictions and outcomes["thread"][0][6] and binds
    assert "reclaiming" in {p.code.value for p in pending.values()}
    _assert_reasons_stored(f"sqlite:///{tmp_path / 'process.sqlite'}", pending, binds)


def test_a_new_workload_is_never_taken_for_an_old_one_with_its_id(tmp_path):
    """A deleted workload's id is not handed out again (the database's AUTOINCREMENT), and where a
    database does reuse it (one made before that), the worker's cache of queued workloads does not
    take the new row for the old one: the new request is what gets placed (a half-GPU workspace
    was once admitted with the two GPUs of the workspace whose id it got)."""
    from sqlalchemy import update

    from gpupool.hub_ext.runtime.cycle_worker import CycleWorker

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    sessions = D.make_sessionmaker(D.make_engine(url))
    now = time.time()
    row = dict(type=D.WORKSPACE, user="alice", queue="a", kind="interactive", preemptible=False, status=D.QUEUED,
               reason="", parameters={})
    with sessions() as s:
        old = D.Workload(**row, gpus=2.0, submitted_at=now)
        s.add(old)
        s.commit()
    worker = CycleWorker(WorkerConfig(db_url=url, queues=QUEUES, scheduler=SchedulerConfig()), sessions)
    assert not worker.decide(now, [], []).result.binds  # no GPUs yet: it waits (its model is kept)
    with sessions() as s:
        s.delete(s.get(D.Workload, old.id))  # released
        s.commit()
        new = D.Workload(**row, gpus=0.5, submitted_at=now + 1)
        s.add(new)
        s.commit()
        assert new.id > old.id
        s.execute(update(D.Workload).where(D.Workload.id == new.id).values(id=old.id))  # as an older database does
        s.commit()
    [bind] = worker.decide(now + 2, NODES[:1], []).result.binds
    assert bind.workload == D.public_id(D.WORKSPACE, old.id)
    assert [(len(p.gpus), p.fraction) for p in bind.placements] == [(1, 0.5)]


def _assert_reasons_stored(url: str, pending, binds) -> None:
    """The database holds each waiting workload's reason as the cycle gave it."""
    with D.make_sessionmaker(D.make_engine(url))() as s:
        stored = {D.public_id(r.type, r.id): r.reason for r in s.query(D.Workload).filter_by(status=D.QUEUED)}
    bound = {b.workload for b in binds}
    assert {wid: str(why) for wid, why in pending.items() if wid not in bound} == \
        {wid: reason for wid, reason in stored.items() if wid in pending and wid not in bound}


class _NoRuns(JobBackend):
    """Runs nothing; every run it started or adopts is alive."""

    async def start(self, spec):
        return {"run_id": spec.run_id}

    async def poll(self, handle):
        return RunState(RUNNING)

    async def request_checkpoint(self, handle, spec, reason=""):
        pass

    async def terminate(self, handle, force=False):
        pass

    async def adopt(self, spec, handle):
        return handle, RunState(RUNNING)


async def test_the_loop_acts_the_same_with_a_worker_process_and_a_thread(tmp_path, monkeypatch):
    """Whole cycles of the loop (reconcile, decide, act) on copies of one database, on the same
    clock, with ``cycle_in_process`` on and off: the same results and the same rows after each.
    Between cycles the clock passes the grace period, so evicted workspaces release and the
    reclaimers bind into what their reservations held."""
    import types

    from gpupool.hub_ext.runtime import loop as loop_mod
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    t0 = time.time()
    clock = [t0]
    monkeypatch.setattr(loop_mod, "time", types.SimpleNamespace(time=lambda: clock[0], perf_counter=time.perf_counter))
    _seed(f"sqlite:///{tmp_path / 'thread.sqlite'}", t0)
    shutil.copy(tmp_path / "thread.sqlite", tmp_path / "process.sqlite")
    nodes = [{"name": n.name, "gpus": n.gpus, "labels": n.labels} for n in NODES]
    queues = [{"name": q.name, "deserved": q.deserved, **({"limit": q.limit} if q.limit else {})} for q in QUEUES]
    seen = {}
    for name, in_process in (("thread", False), ("process", True)):
        url = f"sqlite:///{tmp_path / name}.sqlite"
        settings = load({"nodes": nodes, "queues": queues, "db_url": url, "job_root": str(tmp_path / "jobs"),
                         "work_dir": str(tmp_path), "run_as_user": False, "cycle_in_process": in_process})
        sessions = D.make_sessionmaker(D.make_engine(url))
        loop = SchedulerLoop(settings, sessions, _NoRuns())
        await loop.recover()
        steps = []
        try:
            for k in range(3):
                clock[0] = t0 + 40 * k
                r = await loop.cycle()
                with sessions() as s:
                    rows = [(w.id, w.status, w.allocation, w.reason, w.stop_requested_at)
                            for w in s.query(D.Workload).order_by(D.Workload.id)]
                steps.append((r.binds, r.evictions, dict(r.pending), r.reservations, rows))
        finally:
            await loop.stop()
        seen[name] = steps
    assert seen["process"] == seen["thread"]
    first, second, _ = seen["thread"]
    assert first[1] and first[3] and second[0]  # victims and reservations, then the reclaimers bound


async def test_a_worker_that_cannot_start_leaves_cycles_in_a_thread(tmp_path, caplog):
    """Workers that die one after the other (here: their database cannot be opened) cost no cycle;
    after MAX_DEATHS of them the cycles stay in a thread, and the log says so."""
    from gpupool.hub_ext.runtime.cycle_worker import MAX_DEATHS

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    _seed(url, time.time())
    config = WorkerConfig(db_url=f"sqlite:///{tmp_path / 'missing' / 'db.sqlite'}", queues=QUEUES,
                          scheduler=SchedulerConfig())
    decider = Decider(config, D.make_sessionmaker(D.make_engine(url)), True)
    try:
        for k in range(MAX_DEATHS + 1):
            d = await decider.decide(time.time(), NODES, [])
            assert d.pid == os.getpid() and d.result.evictions  # decided, in this process
            assert decider.in_process == (k < MAX_DEATHS - 1)
    finally:
        decider.close()
    assert decider.restarts == MAX_DEATHS - 1
    assert f"died {MAX_DEATHS} times in a row" in caplog.text


async def test_a_hung_worker_is_killed_and_its_cycle_decided_in_a_thread(tmp_path, caplog):
    """A worker that hangs (here: stopped with SIGSTOP, so SIGTERM does not reach it either) costs
    one cycle ``timeout`` seconds: the worker is killed, that cycle is decided in this process (its
    pending reasons stored), and a new worker decides the next one."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    _seed(url, time.time())
    config = WorkerConfig(db_url=url, queues=QUEUES, scheduler=SchedulerConfig())
    decider = Decider(config, D.make_sessionmaker(D.make_engine(url)), True, timeout=60)
    try:
        first = await decider.decide(time.time(), NODES, [])
        [worker] = _workers(os.getpid())
        assert first.pid == worker
        os.kill(worker, signal.SIGSTOP)
        decider.timeout = 1.0  # small for this test alone: a worker starting up under load may take longer
        d = await decider.decide(time.time(), NODES, [])
        assert d.pid == os.getpid() and d.result.evictions  # decided, in this process
        assert d.lost_seconds >= decider.timeout  # the loop's gap before the next cycle leaves it out
        assert not _alive(worker)
        assert "gave no decision in 1 s (c.GPUPool.cycle_timeout) and was killed" in caplog.text
        _assert_reasons_stored(url, d.result.pending, d.result.binds)
        decider.timeout = 60
        again = await decider.decide(time.time(), NODES, [])
        assert again.pid not in (os.getpid(), worker) and [again.pid] == _workers(os.getpid())
        assert decider.in_process and decider.restarts == 1 and decider.deaths == 0
        os.kill(again.pid, signal.SIGSTOP)  # a hung worker does not hold the service's stop either
        decider.timeout = 1.0
    finally:
        decider.close()
    assert not _alive(again.pid)


def test_cycle_timeout_must_be_positive(tmp_path):
    from gpupool.hub_ext.config import GPUPoolConfigError, load

    with pytest.raises(GPUPoolConfigError, match=r"c\.GPUPool\.cycle_timeout: must be > 0"):
        load({"nodes": [], "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
              "work_dir": str(tmp_path), "run_as_user": False, "cycle_timeout": 0})


def _workers(service_pid: int) -> list[int]:
    """The service's worker processes (multiprocessing spawn children; not its resource tracker)."""
    return children(service_pid, "spawn_main")


JOB = {"command": ["python", "-c", "print('done')"], "gpus": 1}


@pytest.mark.hub
def test_worker_process_dies_or_hangs_and_no_cycle_is_lost(tmp_path):
    """Through the real hub: the service decides in a worker process; SIGKILL it and the next
    cycle still happens (decided in the service) and a new worker takes over; stop one (SIGSTOP:
    hung) and after ``cycle_timeout`` it is killed, that cycle decided in the service, and a new
    worker takes over; SIGKILL the service and its worker goes too."""
    # cycle_timeout: small, yet ample for a worker starting up on a loaded machine
    with Hub(tmp_path, gpupool={"nodes": [{"name": "box", "gpus": 1}], "cycle_timeout": 15}, users=["alice"],
             managed=False) as hub:
        tok = hub.token("alice")
        service = hub.service_pid()
        [worker] = hub.wait_for(lambda: _workers(service), 30, message="no scheduling worker process")
        first = hub.api("POST", "jobs", tok, json=JOB).json()["id"]
        assert hub.wait_job(tok, first, {"succeeded", "failed"})["status"] == "succeeded"

        os.kill(worker, signal.SIGKILL)
        hub.wait_for(lambda: not _alive(worker), 10)
        second = hub.api("POST", "jobs", tok, json=JOB).json()["id"]
        assert hub.wait_job(tok, second, {"succeeded", "failed"})["status"] == "succeeded"
        assert "the scheduling worker process died" in hub.service_log()
        [again] = hub.wait_for(lambda: _workers(service), 30, message="no new worker process")
        assert again != worker
        third = hub.api("POST", "jobs", tok, json=JOB).json()["id"]
        assert hub.wait_job(tok, third, {"succeeded", "failed"})["status"] == "succeeded"

        os.kill(again, signal.SIGSTOP)
        fourth = hub.api("POST", "jobs", tok, json=JOB).json()["id"]
        assert hub.wait_job(tok, fourth, {"succeeded", "failed"})["status"] == "succeeded"
        assert "gave no decision in 15 s (c.GPUPool.cycle_timeout) and was killed" in hub.service_log()
        assert not _alive(again)
        [last] = hub.wait_for(lambda: _workers(service), 30, message="no worker process after the hung one")
        assert last not in (worker, again)
        fifth = hub.api("POST", "jobs", tok, json=JOB).json()["id"]
        assert hub.wait_job(tok, fifth, {"succeeded", "failed"})["status"] == "succeeded"

        hub.kill_service(signal.SIGKILL)  # no goodbye reaches the worker: it notices and exits
        hub.wait_for(lambda: not _alive(last), 10, message="the worker outlived its service")
        hub.start_service()
        assert hub.api("GET", f"jobs/{fifth}", tok).json()["status"] == "succeeded"
        assert "Traceback" not in hub.service_log()


def _apply(url: str, result, now: float, step: int) -> None:
    """Carry a cycle out in the database as the loop would, more or less: bound rows get their
    allocation, evicted ones go back to the queue; then one running row ends, two rows arrive and
    one queued row is cancelled (a different one each step)."""
    from sqlalchemy import update

    from gpupool.contract import encode_allocation
    with D.make_sessionmaker(D.make_engine(url))() as s:
        ids = {D.public_id(r.type, r.id): r.id for r in s.query(D.Workload)}
        for b in result.binds:
            s.execute(update(D.Workload).where(D.Workload.id == ids[b.workload])
                      .values(status=D.RUNNING, started_at=now, allocation=encode_allocation(b.placements)))
        for e in result.evictions:
            s.execute(update(D.Workload).where(D.Workload.id == ids[e.workload])
                      .values(status=D.QUEUED, started_at=None, allocation=None))
        running = sorted(r.id for r in s.query(D.Workload).filter_by(status=D.RUNNING))
        queued = sorted(r.id for r in s.query(D.Workload).filter_by(status=D.QUEUED))
        s.execute(update(D.Workload).where(D.Workload.id == running[step % len(running)])
                  .values(status=D.SUCCEEDED, allocation=None))
        s.execute(update(D.Workload).where(D.Workload.id == queued[(3 * step) % len(queued)])
                  .values(status=D.CANCELLED))
        for k in range(2):
            s.add(D.Workload(type=D.JOB, command=["true"], user="u9", queue="bc"[k], kind="train", gpus=1.0,
                             preemptible=True, status=D.QUEUED, submitted_at=now + k, reason="", parameters={}))
        s.commit()


def test_the_worker_names_what_changed_and_decides_the_same(tmp_path, monkeypatch):
    """The worker names what changed since the last snapshot it had decided (``Snapshot.changes``)
    and indexes the snapshot's workloads (``Snapshot.by_id``), so the scheduler keeps its book of
    the queued workloads: over cycles with binds, evictions,
    arrivals, cancellations and ends carried out in between, the same decisions as a worker whose
    snapshots name nothing, with no change missed (the book never disagrees with the snapshot);
    holders whose row is unchanged are not named (their model objects are kept)."""
    import dataclasses

    from gpupool.hub_ext.runtime.cycle_worker import CycleWorker
    from gpupool.scheduler import Scheduler

    now = time.time()
    _seed(f"sqlite:///{tmp_path / 'named.sqlite'}", now)
    shutil.copy(tmp_path / "named.sqlite", tmp_path / "blind.sqlite")
    real = Scheduler.schedule
    seen: dict[str, list] = {"named": [], "blind": []}
    changes: list = []

    def schedule(self, snapshot):
        # the worker indexes the snapshot's workloads for the core, object for object
        assert snapshot.by_id is not None and len(snapshot.by_id) == len(snapshot.workloads)
        assert all(snapshot.by_id[w.id] is w for w in snapshot.workloads)
        if self._blind:
            snapshot = dataclasses.replace(snapshot, changes=None, by_id=None)
        else:
            changes.append((snapshot.changes, {w.id for w in snapshot.workloads if w.placements}))
        out = real(self, snapshot)
        assert self.book_mismatches == 0
        return out
    monkeypatch.setattr(Scheduler, "schedule", schedule)
    for name in seen:
        url = f"sqlite:///{tmp_path / name}.sqlite"
        worker = CycleWorker(WorkerConfig(db_url=url, queues=QUEUES, scheduler=SchedulerConfig(preemption_grace=30)),
                             D.make_sessionmaker(D.make_engine(url)))
        worker.scheduler._blind = name == "blind"
        reservations = []
        for k in range(6):
            r = worker.decide(now + 5 * k, NODES, reservations).result
            reservations = r.reservations
            seen[name].append((r.binds, r.evictions, dict(r.pending), r.positions, r.fair_share, r.reservations))
            _apply(url, r, now + 5 * k, k)
    assert seen["named"] == seen["blind"]
    assert changes[0][0] is None and all(c is not None for c, _ in changes[1:])
    # holders whose row did not change keep their model object and are not named
    assert all(held - c for c, held in changes[1:])
    assert any(b for b, *_ in seen["named"][1:]) and any(e for _, e, *_ in seen["named"])


def test_a_holder_keeps_its_model_object_until_its_row_changes(tmp_path):
    """Between two decided cycles: a holder whose row did not change is the same object and not
    named; one asked to stop (releasing now) or moved to other GPUs is made afresh and named, and
    so is one that ended; the node objects are the same while the nodes are equal."""
    from sqlalchemy import update

    from gpupool.hub_ext.runtime.cycle_worker import CycleWorker

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    now = time.time()
    _seed(url, now)
    sessions = D.make_sessionmaker(D.make_engine(url))
    worker = CycleWorker(WorkerConfig(db_url=url, queues=QUEUES, scheduler=SchedulerConfig()), sessions)
    snaps = []
    real = worker.scheduler.schedule
    worker.scheduler.schedule = lambda snap: (snaps.append(snap), real(snap))[1]
    worker.decide(now, NODES, [])
    with sessions() as s:
        rows = sorted(s.query(D.Workload).filter_by(status=D.RUNNING), key=lambda r: r.id)
        stop, move, end = rows[0].id, rows[1].id, rows[2].id
        s.execute(update(D.Workload).where(D.Workload.id == stop).values(stop_requested_at=now + 1))
        s.execute(update(D.Workload).where(D.Workload.id == move).values(
            allocation=[{"pod": 0, "node": NODES[-1].name, "gpus": [3], "fraction": 1.0}]))
        s.execute(update(D.Workload).where(D.Workload.id == end).values(status=D.SUCCEEDED, allocation=None))
        kept = rows[3].id
        s.commit()
    worker.decide(now + 5, [dataclasses.replace(n) for n in NODES], [])  # equal nodes, other objects
    first, second = ({w.id: w for w in snap.workloads} for snap in snaps)
    pid = lambda i: D.public_id(D.WORKSPACE, i)  # noqa: E731
    assert second[pid(kept)] is first[pid(kept)] and pid(kept) not in snaps[1].changes
    assert second[pid(stop)].phase is Phase.RELEASING and pid(stop) in snaps[1].changes
    assert second[pid(move)].placements[0].node == NODES[-1].name and pid(move) in snaps[1].changes
    assert pid(end) not in second and pid(end) in snaps[1].changes
    assert all(a is b for a, b in zip(snaps[0].nodes, snaps[1].nodes))


def test_a_change_the_worker_does_not_name_is_logged_and_decided_all_the_same(tmp_path, caplog):
    """Should a snapshot ever leave out a queued workload's arrival, the scheduler's count catches
    it: the workload is decided on all the same (its book made afresh) and the worker logs it."""
    import dataclasses
    import logging

    from gpupool.hub_ext.runtime.cycle_worker import CycleWorker

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    now = time.time()
    _seed(url, now)
    sessions = D.make_sessionmaker(D.make_engine(url))
    worker = CycleWorker(WorkerConfig(db_url=url, queues=QUEUES, scheduler=SchedulerConfig()), sessions)
    worker.decide(now, NODES, [])
    worker.decide(now + 5, NODES, [])  # names its changes from here on: the book is kept
    with sessions() as s:
        new = D.Workload(type=D.JOB, command=["true"], user="u9", queue="c", kind="train", gpus=1.0, preemptible=True,
                         status=D.QUEUED, submitted_at=now + 6, reason="", parameters={})
        s.add(new)
        s.commit()
        wid = D.public_id(D.JOB, new.id)
    real = worker.snapshot

    def forgetful(*args, **kwargs):
        snap, by_id, views = real(*args, **kwargs)
        return dataclasses.replace(snap, changes=snap.changes - {wid}), by_id, views
    worker.snapshot = forgetful
    with caplog.at_level(logging.WARNING, logger="gpupool.loop"):
        result = worker.decide(now + 10, NODES, []).result
    assert worker.scheduler.book_mismatches == 1
    assert "did not name a change" in caplog.text
    assert wid in result.pending or wid in {b.workload for b in result.binds}
