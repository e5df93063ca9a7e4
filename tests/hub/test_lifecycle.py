"""One lifecycle (hub_ext/domain/lifecycle.py) owns every status change and reason of a workload;
stop causes are gpupool.contract.StopCause, stored as the same strings as before."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpupool import contract as C
from gpupool.backends.base import EXITED, LOST, RunState
from gpupool.contract import StopCause
from gpupool.hub_ext.domain import lifecycle as L
from source_tree import parse

ROOT = Path(__file__).resolve().parents[2]
ALLOC = [{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}]


def job(status: str = C.QUEUED, **kw) -> SimpleNamespace:
    row = dict(id=1, type=C.JOB, public_id="j-000001", status=status, reason="", allocation=None, handle=None,
               started_at=None, finished_at=None, attempt=0, preemptions=0, restarts=0, pods=1, exit_code=None,
               stop_requested_at=None, term_sent_at=None, stop_cause=None, stop_reason=None, token_hash=None,
               last_checkpoint_at=None, command=None, script=None, env=None, history=None)
    row.update(kw)
    return SimpleNamespace(**row)


def test_stop_causes_keep_their_stored_values():
    assert [c.value for c in StopCause] == ["preempt", "cancel", "memory", "drain", "node-failure"]
    # the node causes are the core's preemption causes of the same name (the simulator's events say them too)
    from gpupool.scheduler.reasons import Cause
    assert (StopCause.DRAIN.value, StopCause.NODE_FAILURE.value) == (Cause.DRAIN.value, Cause.NODE_FAILURE.value)
    assert StopCause("cancel") is StopCause.CANCEL and StopCause.CANCEL == "cancel" and str(StopCause.MEMORY) == "memory"


def test_a_job_from_submission_to_success():
    row = job()
    L.bind(row, ALLOC, "fits", 10.0, token_hash="h")
    assert (row.status, row.attempt, row.token_hash, row.started_at) == (C.STARTING, 1, "h", 10.0)
    assert row.reason == "starting on box GPU 0: fits"
    assert L.started(row, {"pid": 1}, "fits") and row.status == C.RUNNING
    assert L.released(row, RunState(EXITED, 0, "exit 0"), 20.0, gang_restarts=3) == C.SUCCEEDED
    assert row.allocation is None and row.finished_at == 20.0 and row.reason == "succeeded: the notebook ran to the end"
    assert row.token_hash is None  # the run's job token is revoked with its end
    with pytest.raises(L.IllegalTransition, match="succeeded -> queued"):
        L.vanished(row, 30.0)


def test_preemption_requeues_and_a_cancel_pending_ends_cancelled():
    row = job(C.RUNNING, allocation=ALLOC, handle={"pid": 1})
    assert L.request_stop(row, "preempt", "queue nlp reclaims", 5.0, grace=30)
    assert row.status == C.PREEMPTING and row.stop_cause == "preempt" and "30 s to save a checkpoint" in row.reason
    assert not L.request_stop(row, StopCause.CANCEL, "cancelled by alice", 6.0, grace=30)  # not the first request
    assert row.status == C.CANCELLED and row.stop_requested_at == 5.0
    assert L.released(row, RunState(EXITED, 143, "killed"), 9.0, gang_restarts=3) == C.CANCELLED
    assert row.reason == "cancelled by alice" and row.stop_cause is None
    row = job(C.RUNNING, allocation=ALLOC, handle={"pid": 1}, last_checkpoint_at=3.0)
    L.request_stop(row, StopCause.PREEMPT, "reclaim", 5.0, grace=0)
    assert L.released(row, RunState(EXITED, 0, ""), 6.0, 3) == C.QUEUED and row.preemptions == 1
    assert row.reason == "requeued after preemption (reclaim); it resumes from its checkpoint"


def test_a_drained_job_checkpoints_then_is_requeued_and_a_failed_node_requeues_at_once():
    row = job(C.RUNNING, allocation=ALLOC, handle={"pid": 1}, last_checkpoint_at=3.0)
    assert L.request_stop(row, StopCause.DRAIN, "its node box is being drained (by alice)", 5.0, grace=30)
    assert row.status == C.PREEMPTING and row.stop_cause == "drain"
    assert row.reason == "its node box is being drained (by alice); it has 30 s to save a checkpoint, then it is requeued"
    assert L.released(row, RunState(EXITED, 0, ""), 9.0, 3) == C.QUEUED and row.preemptions == 1
    assert row.reason == "requeued: its node box is being drained (by alice); it resumes from its checkpoint"
    assert row._gpupool_end_reason == "drain" and row.allocation is None and row.stop_cause is None
    # a workspace on a drained node is suspended at the end of its grace (runtime/nodes.py)
    ws = job(C.RUNNING, type=C.WORKSPACE, allocation=ALLOC)
    L.request_stop(ws, StopCause.DRAIN, "its node box is being drained", 5.0, grace=30)
    assert ws.reason.endswith("then it is suspended")
    # a failure: at once, from whatever it was doing; it lost its grace, it keeps its checkpoint
    for status, cause in ((C.RUNNING, None), (C.PREEMPTING, "preempt"), (C.PREEMPTING, "drain"), (C.STARTING, None)):
        row = job(status, allocation=ALLOC, handle={"pid": 1}, stop_cause=cause, stop_reason=cause and "x",
                  last_checkpoint_at=None if status == C.STARTING else 2.0)
        assert L.node_failed(row, "its node box failed (NVML no longer lists GPU 0)", 7.0) == C.QUEUED
        words = "restarts from the beginning (it saved no checkpoint)" if status == C.STARTING else \
            "resumes from its checkpoint"
        assert row.reason == f"requeued: its node box failed (NVML no longer lists GPU 0); it {words}"
        assert row.allocation is None and row.handle is None and row.preemptions == 1
        assert row._gpupool_end_reason == "node-failure" and row.finished_at is None
    # one being cancelled ends cancelled, one stopped for its memory fails
    row = job(C.CANCELLED, allocation=ALLOC, stop_cause="cancel", stop_reason="cancelled by alice")
    assert L.node_failed(row, "its node box failed", 7.0) == C.CANCELLED and row.reason == "cancelled by alice"
    row = job(C.RUNNING, allocation=ALLOC, stop_cause="memory", stop_reason="failed: too much memory")
    assert L.node_failed(row, "its node box failed", 7.0) == C.FAILED and row.finished_at == 7.0


def test_a_failed_run_says_the_telling_line_of_its_log_and_a_lost_gang_restarts():
    row = job(C.RUNNING, allocation=ALLOC, pods=2)
    assert L.released(row, RunState(EXITED, 1, "exit 1", rank=1), 7.0, 3,
                      error_line=lambda rank: f"ValueError: rank {rank}") == C.FAILED
    assert row.reason == "failed: worker 1: ValueError: rank 1"
    row = job(C.RUNNING, allocation=ALLOC, pods=2)
    assert L.released(row, RunState(LOST, None, "worker 1 was killed"), 7.0, 3) == C.QUEUED
    assert row.restarts == 1 and "(restart 1 of at most 3)" in row.reason


def test_every_attempt_is_kept_in_the_history():
    """When and where each attempt ran, how it ended and why, and the checkpoint it resumed from."""
    gang = [{"pod": 1, "node": "n2", "gpus": [2, 3], "fraction": 1.0}, {"pod": 0, "node": "n1", "gpus": [0, 1],
                                                                        "fraction": 1.0}]
    row = job(pods=2)
    L.bind(row, gang, "borrowing", 10.0, token_hash="h")
    assert L.started(row, {"pid": 1}, "borrowing")
    first = row.history
    L.request_stop(row, StopCause.PREEMPT, "queue vision reclaims its GPUs", 20.0, grace=30)
    assert L.released(row, RunState(EXITED, 0, "exit 0"), 25.0, 3) == C.QUEUED and row.exit_code == 0
    assert row.token_hash is None  # a preempted run's token too
    assert first[0]["ended_at"] is None  # a new list each time: the stored JSON column sees each change
    (a,) = row.history
    assert (a["attempt"], a["started_at"], a["ended_at"], a["outcome"], a["stop_cause"], a["exit_code"]) == \
        (1, 10.0, 25.0, C.PREEMPTED, "preempt", 0)
    assert a["allocation"] == gang and a["reason"].startswith("requeued after preemption (queue vision reclaims")
    L.bind(row, gang, "fits", 40.0, token_hash="h2",
           resumed_from={"checkpoint": "/j/checkpoints/ckpt-000012.pkl", "step": 12})
    assert row.exit_code is None  # the running attempt has no exit code yet (the last one's was 0)
    assert [x["outcome"] for x in row.history] == [C.PREEMPTED, None] and row.history[1]["attempt"] == 2
    L.started(row, {"pid": 2}, "fits")
    L.released(row, RunState(EXITED, 0, "exit 0"), 50.0, 3)
    b = row.history[1]
    assert (b["outcome"], b["stop_cause"], b["ended_at"], b["resumed_from"]["step"]) == (C.SUCCEEDED, None, 50.0, 12)
    assert b["reason"] == "succeeded: the notebook ran to the end in all 2 workers"
    # the other ends: a failed start, a run gone at a restart, a cancel, a workspace's suspension
    row = job()
    L.bind(row, ALLOC, "fits", 1.0, token_hash="h")
    L.start_failed(row, "no such directory", 2.0)
    assert row.history[-1]["outcome"] == C.FAILED and row.history[-1]["reason"] == "failed to start: no such directory"
    row = job()
    L.bind(row, ALLOC, "fits", 1.0, token_hash="h")
    L.started(row, {"pid": 1}, "fits")
    L.vanished(row, 3.0)
    assert (row.history[-1]["outcome"], row.history[-1]["ended_at"]) == (C.LOST, 3.0)
    L.bind(row, ALLOC, "fits", 4.0, token_hash="h")
    L.started(row, {"pid": 1}, "fits")
    L.request_stop(row, StopCause.CANCEL, "cancelled by alice", 5.0, grace=30)
    L.released(row, RunState(EXITED, 143, "SIGTERM"), 6.0, 3)
    assert [(x["outcome"], x["stop_cause"]) for x in row.history] == [(C.LOST, None), (C.CANCELLED, "cancel")]
    ws = job(type=C.WORKSPACE, public_id="w-000001")
    L.bind(ws, ALLOC, "fits", 1.0, env={})
    L.workspace_ended(ws, "suspended: idle for 2 h", 9.0, suspended=True)
    assert ws.history[-1]["outcome"] == C.SUSPENDED


def test_a_run_that_died_before_its_code_ran_is_retried_a_bounded_number_of_times():
    row = job()
    died = RunState(EXITED, 1, "it exited with status 1")
    kernel = lambda rank: "RuntimeError: Kernel died before replying to kernel_info"  # noqa: E731
    for n in (1, 2):
        L.bind(row, ALLOC, "fits", 10.0 * n, token_hash="h")
        L.started(row, {"pid": n}, "fits")
        assert L.released(row, died, 10.0 * n + 1, 3, kernel, before_code=True, startup_retries=2) == C.QUEUED
        assert row.reason == ("requeued: its run died before its code ran (RuntimeError: Kernel died before replying "
                              f"to kernel_info), a failure of the machinery, not of the job; retry {n} of at most 2")
        assert row.finished_at is None and row.history[-1]["outcome"] == C.RETRIED
    L.bind(row, ALLOC, "fits", 30.0, token_hash="h")
    L.started(row, {"pid": 3}, "fits")
    assert L.released(row, died, 31.0, 3, kernel, before_code=True, startup_retries=2) == C.FAILED
    assert row.reason.endswith("kernel_info; it died before its code ran in 3 attempts")
    assert [x["outcome"] for x in row.history] == [C.RETRIED, C.RETRIED, C.FAILED]
    # the user's own failure (its code ran), or no retries configured: failed at once
    for before, retries in ((False, 2), (True, 0)):
        row = job()
        L.bind(row, ALLOC, "fits", 1.0, token_hash="h")
        L.started(row, {"pid": 1}, "fits")
        assert L.released(row, died, 2.0, 3, kernel, before_code=before, startup_retries=retries) == C.FAILED
        assert row.reason == "failed: RuntimeError: Kernel died before replying to kernel_info"


def test_memory_stop_fails_the_job_and_illegal_moves_raise():
    row = job(C.RUNNING, allocation=ALLOC)
    L.request_stop(row, StopCause.MEMORY, "failed: stopped for using too much", 1.0, 30)
    assert row.status == C.RUNNING and row.reason == "failed: stopped for using too much"
    assert L.released(row, RunState(EXITED, 137, "killed"), 2.0, 3) == C.FAILED
    with pytest.raises(L.IllegalTransition):
        L.cancel_queued(job(C.FAILED), "alice", 1.0)
    with pytest.raises(L.IllegalTransition):
        L.request_stop(job(C.SUCCEEDED), StopCause.PREEMPT, "x", 1.0, 30)
    with pytest.raises(ValueError):
        L.request_stop(job(C.RUNNING), "evict", "x", 1.0, 30)  # not a stop cause


def test_workspaces_and_notes():
    ws = job(type=C.WORKSPACE, public_id="w-000001")
    L.bind(ws, ALLOC, "fits", 1.0, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert ws.status == C.RUNNING and ws.env and ws.reason == "admitted on box GPU 0: fits"
    assert L.warn(ws, "runs out at noon") and not L.warn(ws, "runs out at noon")
    assert L.flag_idle(ws, "idle for 2 h") and ws.reason == "admitted on box GPU 0: fits; warning: runs out at noon" \
                                                             "; idle: idle for 2 h"
    L.workspace_ended(ws, "suspended: idle", 5.0, suspended=True)
    assert ws.status == C.CANCELLED and ws.allocation is None and ws._gpupool_end_reason == "suspended"


def test_only_the_lifecycle_writes_statuses_and_reasons():
    """No other module of hub_ext assigns ``.status``, ``.reason``, ``.stop_cause`` or ``.history`` of a row."""
    found = []
    for path in sorted((ROOT / "hub_ext").rglob("*.py")):
        if path.name == "lifecycle.py":
            continue
        for node in ast.walk(parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Attribute) and leaf.attr in ("status", "reason", "stop_cause", "history") \
                            and not (isinstance(leaf.value, ast.Name) and leaf.value.id in ("self", "sus")):  # sus: a suspension record
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


async def test_a_submission_the_database_refuses_is_a_503(tmp_path):
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.domain.access import QueueAccess
    from gpupool.hub_ext.domain.errors import APIError
    from gpupool.hub_ext.domain.identity import Identity
    from gpupool.hub_ext.domain.submission import Submissions
    from gpupool.hub_ext.store.inserter import Refused
    from gpupool.hub_ext.web.schemas import JobRequest

    settings = load({"nodes": [], "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "j"),
                     "work_dir": str(tmp_path), "run_as_user": False})

    class Refusing:
        async def insert(self, values: dict) -> int:
            raise Refused("the gpupool database refused the job: IntegrityError")

    subs = Submissions(settings, D.make_sessionmaker(D.make_engine(settings.pool.db_url)), QueueAccess(settings),
                       Refusing(), metrics=None)
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}
    with pytest.raises(APIError) as e:
        await subs.new_job(Identity("alice"), JobRequest(notebook_content=nb))
    assert e.value.status == 503 and "refused the job" in e.value.message
