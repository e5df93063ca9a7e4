"""``gpupool.log_metric``: report a metric from inside a running job.

The service starts every job with ``GPUPOOL_JOB_ID``, ``GPUPOOL_API_URL`` and
``GPUPOOL_API_TOKEN`` in its environment; ``log_metric`` posts to ``POST jobs/{id}/metrics``.
Outside a job (e.g. while developing the notebook interactively) it warns once and does nothing,
so the same notebook runs both ways.

A training step never waits on the service for long: one post may take :data:`SEND_TIMEOUT`
seconds. When the service does not answer (it restarts, the hub is down), the value is kept in a
buffer (at most :data:`MAX_BUFFERED` values; beyond that the oldest are dropped with a warning)
and a background thread sends the buffer, in order, with a back-off up to
:data:`RETRY_MAX_SECONDS`; meanwhile the next values join the buffer without touching the network.
At the process's exit the buffer gets :data:`FLUSH_AT_EXIT` seconds more; what is still not sent
is reported in a warning. A value the service refuses (4xx) is dropped with a warning.
"""
from __future__ import annotations

import atexit
import collections
import math
import numbers
import os
import threading
import time
import warnings

from ..protocol import Env
from .api import Client, GPUPoolError

SEND_TIMEOUT = 3.0  # seconds one post of a metric may take
MAX_BUFFERED = 10_000  # values kept while the service does not answer
RETRY_MAX_SECONDS = 30.0  # the back-off between tries of the buffer grows to this
FLUSH_AT_EXIT = 3.0  # seconds the buffer gets at exit (papermill gives a kernel 5 s to end)

_lock = threading.Lock()
_steps: dict[str, int] = {}
_warned_outside = False
_client: Client | None = None
_client_key: tuple | None = None


def _job_client() -> tuple[str, Client] | None:
    global _client, _client_key
    job_id = os.environ.get(Env.JOB_ID)
    url = os.environ.get(Env.API_URL)
    if not job_id or not url:
        return None
    key = (job_id, url, os.environ.get(Env.API_TOKEN))
    with _lock:
        if _client is None or _client_key != key:
            _client = Client(url, key[2], timeout=SEND_TIMEOUT, url_source=Env.API_URL)
            _client_key = key
        return job_id, _client


def _retryable(e: GPUPoolError) -> bool:
    """No answer, or the service (or the hub's proxy in front of it) not ready: try again later."""
    return e.status is None or e.status >= 500 or e.status == 429


def _warn(message: str) -> None:
    warnings.warn(f"gpupool.log_metric: {message}", RuntimeWarning, stacklevel=3)


class _Buffer:
    """The values not yet recorded, sent in order by a daemon thread while the service is away."""

    def __init__(self):
        self.items: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.sending = threading.Lock()  # one post at a time (the thread, flush()): each value once
        self.thread: threading.Thread | None = None
        self.dropped = 0
        self.delay = 1.0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, client: Client, job_id: str, name: str, value: float, step: int, why: str) -> None:
        with self.cond:
            if not self.items:
                _warn(f"the service did not take {name}={value} at step {step} ({why}); buffering metrics and "
                      "sending them in the background until it answers")
            if len(self.items) >= MAX_BUFFERED:
                self.items.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    _warn(f"more than {MAX_BUFFERED} metrics are waiting for the service; dropping the oldest")
            self.items.append((client, job_id, name, value, step))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="gpupool-metrics", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def send_one(self) -> bool:
        """Post the oldest value; True when the buffer moved on (sent, or refused for good)."""
        with self.sending:
            with self.cond:
                if not self.items:
                    return True
                first = self.items[0]
            client, job_id, name, value, step = first
            try:
                client.post_metric(job_id, name, value, step)
            except GPUPoolError as e:
                if _retryable(e):
                    return False
                _warn(f"{name}={value} at step {step} was not recorded: {e}")
            with self.cond:
                if self.items and self.items[0] is first:  # not dropped meanwhile (a full buffer)
                    self.items.popleft()
            return True

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.items:
                    self.cond.wait()
            if self.send_one():
                self.delay = 1.0
            else:
                time.sleep(self.delay)
                self.delay = min(self.delay * 2, RETRY_MAX_SECONDS)

    def flush(self, timeout: float) -> int:
        """Send what is buffered for at most ``timeout`` seconds; returns how many are left."""
        deadline = time.monotonic() + timeout
        while self.items and time.monotonic() < deadline:
            if not self.send_one():
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return len(self.items)


_buffer = _Buffer()


@atexit.register
def _flush_at_exit() -> None:
    if not len(_buffer):
        return
    left = _buffer.flush(FLUSH_AT_EXIT)
    if left:
        _warn(f"{left} metrics were never recorded: the service did not answer before the job's end")


def flush(timeout: float = 10.0) -> bool:
    """Send the metrics still buffered (the service did not answer when they were logged), waiting
    at most ``timeout`` seconds; True when none is left."""
    return _buffer.flush(timeout) == 0


def log_metric(name: str, value: float, step: int | None = None) -> bool:
    """Record ``value`` of metric ``name`` at ``step`` for the running job.

    ``step`` defaults to 0, 1, 2, ... per metric name. Sweeps read these (the objective's last
    value is the trial's result; earlier steps feed the pruner). Returns True when the service
    recorded it at once. Outside a gpupool job this warns once and returns False. When the service
    does not answer within a few seconds the value is buffered and sent in the background (False),
    so a step never waits for a service that restarts; a lost metric never crashes the training.
    """
    global _warned_outside
    if not isinstance(name, str) or not name:
        raise ValueError("log_metric: name must be a non-empty string such as 'val_acc'")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:  # numpy / torch scalars
            value = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError):
            raise TypeError(f"log_metric: value of {name!r} must be a number, not {type(value).__name__}") from None
    value = float(value)
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"log_metric: step must be an integer, not {type(step).__name__}")
        step = int(step)
    with _lock:
        if step is None:
            step = _steps.get(name, -1) + 1
        _steps[name] = max(step, _steps.get(name, -1))
    if not math.isfinite(value):
        warnings.warn(f"gpupool.log_metric: {name}={value} at step {step} is not finite; not recorded",
                      RuntimeWarning, stacklevel=2)
        return False
    found = _job_client()
    if found is None:
        if not _warned_outside:
            _warned_outside = True
            warnings.warn(f"gpupool.log_metric: not running inside a gpupool job ({Env.JOB_ID} is not set); "
                          "metrics are not recorded", RuntimeWarning, stacklevel=2)
        return False
    job_id, client = found
    if not len(_buffer):  # the service answered last time: post now (SEND_TIMEOUT at most)
        try:
            client.post_metric(job_id, name, value, step)
            return True
        except GPUPoolError as e:
            if not _retryable(e):
                _warn(f"{name}={value} at step {step} was not recorded: {e}")
                return False
            why = str(e)
    else:
        why = "earlier metrics are still waiting"
    _buffer.add(client, job_id, name, value, step, why)  # sent in order, in the background
    return False
