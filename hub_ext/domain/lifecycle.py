"""The lifecycle of a workload (a job or a workspace): every status change and every reason written
to a workload's row happens here, and nowhere else.

Statuses (gpupool/contract.py) and the moves between them::

    queued ──bind──> starting ──started──> running ──release──> succeeded | failed
      │  │ (workspace: bind -> running)      │  │
      │  └──cancel──> cancelled              │  └──stop(preempt)──> preempting ──release──> queued
      │                  ^                   └──stop(cancel)──> cancelled (stopping) ──release──> cancelled
      └── (a queued workload waits: its reason is the scheduler's)

    starting ──start failed──> failed;  starting | running ──vanished / a gang's worker lost──> queued
    a workspace: running ──suspended / its server gone──> cancelled
    its node drained: as stop(preempt), cause drain;  its node failed: starting | running |
    preempting ──node_failed──> queued at once (a workspace: suspended, cancelled)

Anything else raises :class:`IllegalTransition` (a bug in the caller, never a user's mistake).
Why a workload holding GPUs is asked to stop is a :class:`gpupool.contract.StopCause`; the row
keeps its value (``stop_cause``) until the run is gone.

Every bind opens an attempt in the row's ``history`` (when, where each rank runs, the checkpoint it
resumes from) and every end closes it (when, how: a ``contract.ATTEMPT_OUTCOMES`` value, the stop
cause, the reason as the row then reads, the exit code). Only this module writes ``history``.

The functions change the row in memory; the caller commits (the usage ledger follows the
allocation in the same transaction, store/ledger.py). They do no I/O: what a run left behind
(its log's last error) is handed in.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from sqlalchemy import update

from ...backends.base import EXITED, LOST, RunState
from ... import contract as C
from ...contract import StopCause, describe_allocation
from ..store import tables as D
from ..store.ledger import DRAINED, NODE_FAILURE, SUSPENDED

SUBMITTED = "submitted; waiting for the scheduler's next cycle"
REQUESTED = "requested; waiting for the scheduler's next cycle"
WARNING, IDLE = "; warning: ", "; idle: "  # what a note appends to a running workload's reason
REASONS_PER_COMMIT = 200  # pending reasons stored per transaction

TRANSITIONS: dict[str, frozenset[str]] = {
    D.QUEUED: frozenset({D.STARTING, D.RUNNING, D.CANCELLED}),
    D.STARTING: frozenset({D.RUNNING, D.PREEMPTING, D.CANCELLED, D.FAILED, D.QUEUED}),
    D.RUNNING: frozenset({D.PREEMPTING, D.CANCELLED, D.SUCCEEDED, D.FAILED, D.QUEUED}),
    D.PREEMPTING: frozenset({D.QUEUED, D.CANCELLED, D.FAILED}),
    D.CANCELLED: frozenset({D.FAILED}),  # cancelled while it started, and the start failed
    D.SUCCEEDED: frozenset(),
    D.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the lifecycle does not have (from a final status, or skipping one)."""


def where(allocation: list[dict] | None) -> str:
    return describe_allocation(allocation) or "CPU only"


def _move(row: Any, status: str, reason: str) -> None:
    if status != row.status and status not in TRANSITIONS.get(row.status, ()):
        raise IllegalTransition(f"{row.public_id}: {row.status} -> {status} is not a move of the lifecycle")
    row.status = status
    row.reason = reason


def _say(row: Any, reason: str) -> None:
    """A reason without a status change."""
    row.reason = reason


def _run_gone(row: Any) -> None:
    """The run holds nothing any more, and its job token is revoked (a new attempt gets a new one)."""
    row.allocation = None
    row.handle = None
    row.token_hash = None


def _clear_stop(row: Any) -> None:
    row.stop_requested_at = row.term_sent_at = None
    row.stop_cause = row.stop_reason = None


def _open_attempt(row: Any, allocation: list[dict], now: float, resumed_from: dict | None) -> None:
    entry = {"attempt": row.attempt, "started_at": now, "ended_at": None, "allocation": allocation,
             "outcome": None, "stop_cause": None, "reason": None, "exit_code": None, "resumed_from": resumed_from}
    row.history = [*(row.history or []), entry]  # a new list: the JSON column sees the change


def _close_attempt(row: Any, outcome: str, now: float, cause: str | None = None, exit_code: int | None = None) -> None:
    """The open attempt ends (after the move: its reason is the row's new one)."""
    history = list(row.history or [])
    if not history or history[-1].get("ended_at") is not None:
        return  # nothing open (a row from before the history existed)
    history[-1] = dict(history[-1], ended_at=now, outcome=outcome, stop_cause=cause, reason=row.reason,
                       exit_code=exit_code)
    row.history = history


def _resume_words(row: Any) -> str:
    return ("resumes from its checkpoint" if row.last_checkpoint_at
            else "restarts from the beginning (it saved no checkpoint)")


# ---------------------------------------------------------------------------------- admission
def bind(row: Any, allocation: list[dict], why: str, now: float, env: dict | None = None,
         token_hash: str | None = None, resumed_from: dict | None = None) -> None:
    """The scheduler bound a queued workload: it holds ``allocation`` from now (write-ahead: the
    caller commits before anything runs). A job starts; a workspace is admitted with ``env``.
    ``resumed_from``: the checkpoint the run starts from (``{"checkpoint", "step"}``), if any."""
    row.allocation = allocation
    row.started_at = now
    row.attempt += 1
    row.exit_code = None  # the last run's; this one has none yet
    _clear_stop(row)
    _open_attempt(row, allocation, now, resumed_from)
    if row.type == D.WORKSPACE:
        row.env = env
        _move(row, D.RUNNING, f"admitted on {where(allocation)}: {why}")
        return
    row.token_hash = token_hash
    _move(row, D.STARTING, f"starting on {where(allocation)}: {why}")


def started(row: Any, handle: Any, why: str) -> bool:
    """Its run exists. False when it was cancelled while it started (it is asked to stop now)."""
    row.handle = handle
    if row.stop_cause == StopCause.CANCEL:
        return False
    _move(row, D.RUNNING, f"running on {where(row.allocation)}: {why}")
    return True


def start_failed(row: Any, error: Exception | str, now: float) -> None:
    _run_gone(row)
    row.finished_at = now
    _move(row, D.FAILED, f"failed to start: {error}")
    _close_attempt(row, C.FAILED, now)


def readopted(row: Any, handle: Any) -> None:
    """After a restart of the service: its run is still there."""
    row.handle = handle
    if row.status == D.STARTING:
        _move(row, D.RUNNING, f"running on {where(row.allocation)}")


def vanished(row: Any, now: float | None = None) -> None:
    """After a restart of the service: its run is gone without an exit status."""
    _run_gone(row)
    row.restarts += 1
    _move(row, D.QUEUED, "requeued: its process was gone when the gpupool service restarted; "
                         "it resumes from its latest checkpoint")
    _close_attempt(row, C.LOST, time.time() if now is None else now)


def cancel_queued(row: Any, who: str, now: float) -> None:
    """Cancelled before it started (it holds nothing)."""
    row.finished_at = now
    _move(row, D.CANCELLED, f"cancelled by {who} before it started")


# ---------------------------------------------------------------------------------- stopping
def request_stop(row: Any, cause: StopCause | str, reason: str, now: float, grace: float) -> bool:
    """Ask a workload holding GPUs to checkpoint and stop (the runtime then tells its run, and
    terminates it after ``grace``). Returns whether this is the first request."""
    cause = StopCause(cause)
    first = row.stop_requested_at is None
    row.stop_cause, row.stop_reason = cause.value, reason
    if first:
        row.stop_requested_at = now
    if cause is StopCause.PREEMPT or cause is StopCause.DRAIN:
        then = "suspended" if cause is StopCause.DRAIN and row.type == D.WORKSPACE else "requeued"
        _move(row, D.PREEMPTING, f"{reason}; it has {grace:g} s to save a checkpoint, then it is {then}")
    elif cause is StopCause.CANCEL:
        _move(row, D.CANCELLED, f"{reason}; stopping (it has {grace:g} s to save a checkpoint)")
    else:
        _say(row, reason)
    return first


def terminated(row: Any, now: float) -> None:
    """Its grace period is over and it was sent SIGTERM."""
    row.term_sent_at = now


def released(row: Any, state: Any, now: float, gang_restarts: int,
             error_line: Callable[[int], str] = lambda rank: "", before_code: bool = False,
             startup_retries: int = 0) -> str:
    """A job's run ended (or is gone, ``state``: a backend RunState): its GPUs are free, and the
    job is requeued (preempted; a gang's worker lost; it died before its code ran and has retries
    left), cancelled, failed or succeeded. Returns the new status. ``error_line(rank)``: the
    telling line of a worker's log; ``before_code``: the run failed before any of the user's code
    ran (an infrastructure failure, retried up to ``startup_retries`` times)."""
    cause, why = row.stop_cause, row.stop_reason or ""
    _run_gone(row)
    row.exit_code = state.exit_code
    _clear_stop(row)
    outcome = _released(row, cause, why, state, now, gang_restarts, error_line, before_code, startup_retries)
    _close_attempt(row, outcome, now, cause, state.exit_code)
    return row.status


def _released(row: Any, cause: str | None, why: str, state: Any, now: float, gang_restarts: int,
              error_line: Callable[[int], str], before_code: bool, startup_retries: int) -> str:
    """The move of :func:`released`; returns the attempt's outcome."""
    if cause == StopCause.PREEMPT:
        row.preemptions += 1
        _move(row, D.QUEUED, f"requeued after preemption ({why}); it {_resume_words(row)}")
        return C.PREEMPTED
    if cause in (StopCause.DRAIN, StopCause.NODE_FAILURE):
        row.preemptions += 1
        row._gpupool_end_reason = DRAINED if cause == StopCause.DRAIN else NODE_FAILURE
        _move(row, D.QUEUED, f"requeued: {why}; it {_resume_words(row)}")
        return C.PREEMPTED
    if cause is None and state.state == LOST and (row.pods or 1) > 1 and row.restarts < gang_restarts:
        # a worker of a gang died (killed, its node failed): the whole gang starts again
        row.restarts += 1
        _move(row, D.QUEUED, f"requeued: {state.detail}; it {_resume_words(row)} "
                             f"(restart {row.restarts} of at most {gang_restarts})")
        return C.REQUEUED
    failure, failed_exit = "", cause is None and state.state == EXITED and state.exit_code != 0
    if failed_exit:
        err = error_line(state.rank or 0)
        if err and state.rank is not None:
            err = f"worker {state.rank}: {err}"
        failure = err or state.detail
        if err and state.exit_code and state.exit_code > 128:
            failure += f" ({state.detail})"
    if failed_exit and before_code:
        retried = sum(1 for a in row.history or [] if a.get("outcome") == C.RETRIED)
        if retried < startup_retries:
            _move(row, D.QUEUED, f"requeued: its run died before its code ran ({failure}), a failure of the "
                                 f"machinery, not of the job; retry {retried + 1} of at most {startup_retries}")
            return C.RETRIED
        if startup_retries:
            failure += f"; it died before its code ran in {retried + 1} attempts"
    row.finished_at = now
    if cause == StopCause.CANCEL:
        _move(row, D.CANCELLED, why or "cancelled")
    elif cause == StopCause.MEMORY:
        _move(row, D.FAILED, why)
    elif state.state == EXITED and state.exit_code == 0:
        what = "the notebook ran to the end" if not (row.command or row.script) else "the program exited with status 0"
        _move(row, D.SUCCEEDED, f"succeeded: {what}" + (f" in all {row.pods} workers" if (row.pods or 1) > 1 else ""))
    elif state.state == EXITED:
        _move(row, D.FAILED, f"failed: {failure}")
    else:
        _move(row, D.FAILED, f"failed: {state.detail}")
    return row.status


def node_failed(row: Any, why: str, now: float) -> str:
    """A job's node failed (``why``: "node box failed: ..."): its GPUs are free at once, without
    waiting for its run (the caller has killed what is left of it), and it is requeued from its
    latest checkpoint, whatever stop it was asked for before (a preemption or a drain: it lost
    its grace). A job being cancelled ends cancelled, one stopped for its memory fails. Returns
    the new status."""
    if row.stop_cause in (None, StopCause.PREEMPT, StopCause.DRAIN):
        row.stop_cause, row.stop_reason = StopCause.NODE_FAILURE.value, why
    return released(row, RunState(LOST, None, why), now, gang_restarts=0)


def workspace_released(row: Any, now: float | None = None) -> None:
    """A preempted workspace's grace period is over: its GPUs go back and it waits again."""
    why = row.stop_reason or "preempted"
    row.allocation = None
    row.env = None
    _clear_stop(row)
    row.preemptions += 1
    _move(row, D.QUEUED, f"requeued after preemption ({why})")
    _close_attempt(row, C.PREEMPTED, time.time() if now is None else now, StopCause.PREEMPT.value)


def workspace_ended(row: Any, reason: str, now: float, suspended: bool = False) -> None:
    """A workspace gives its GPUs back for good: suspended by a rule, or its server is gone."""
    if suspended:
        row._gpupool_end_reason = SUSPENDED  # the ledger's end reason for this interval
    cause = row.stop_cause
    row.allocation = None
    row.env = None
    row.finished_at = now
    _clear_stop(row)
    _move(row, D.CANCELLED, reason)
    _close_attempt(row, C.SUSPENDED if suspended else C.CANCELLED, now, cause)


# ---------------------------------------------------------------------------------- notes
def _note(row: Any, mark: str, text: str) -> bool:
    """Append ``mark + text`` to the reason, replacing an earlier note of the same mark; False
    when it says so already."""
    if row.reason.endswith(mark + text):
        return False
    _say(row, row.reason.split(mark)[0] + mark + text)
    return True


def warn(row: Any, text: str) -> bool:
    """A warning on a running workload (its maximum run time comes)."""
    return _note(row, WARNING, text)


def flag_idle(row: Any, why: str) -> bool:
    return _note(row, IDLE, why)


def memory_warning(row: Any, text: str) -> None:
    """A fractional job over its GPU memory share (``memory_enforcement = 'report'``)."""
    if not row.reason.endswith(text):
        _say(row, f"running on {where(row.allocation)}{WARNING}{text}")


def resuming(row: Any, words: str) -> None:
    """A new request for a server that was suspended says so in its first reason."""
    _say(row, f"resuming: {words}; {row.reason}")


def store_pending_reasons(s: Any, changes: list[dict]) -> None:
    """The scheduler's reasons of waiting workloads (``[{"id", "reason"}]``), stored only on rows
    still queued (a cancel may have landed since), in short transactions so that a submission
    never waits long for SQLite's write lock."""
    for i in range(0, len(changes), REASONS_PER_COMMIT):
        s.execute(update(D.Workload).where(D.Workload.status == D.QUEUED), changes[i:i + REASONS_PER_COMMIT],
                  execution_options={"synchronize_session": None})
        s.commit()
