"""``gpupool.log_metric``: report a metric from inside a running job.

The service starts every job with ``GPUPOOL_JOB_ID``, ``GPUPOOL_API_URL`` and
``GPUPOOL_API_TOKEN`` in its environment; ``log_metric`` posts to ``POST jobs/{id}/metrics``.
Outside a job (e.g. while developing the notebook interactively) it warns once and does nothing,
so the same notebook runs both ways.
"""
from __future__ import annotations

import math
import numbers
import os
import threading
import time
import warnings

from ..protocol import Env
from .api import Client, GPUPoolError

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
            _client = Client(url, key[2], timeout=10, url_source=Env.API_URL)
            _client_key = key
        return job_id, _client


def log_metric(name: str, value: float, step: int | None = None) -> bool:
    """Record ``value`` of metric ``name`` at ``step`` for the running job.

    ``step`` defaults to 0, 1, 2, ... per metric name. Sweeps read these (the objective's last
    value is the trial's result; earlier steps feed the pruner). Returns True when the service
    recorded it. Outside a gpupool job this warns once and returns False. A transient service
    problem is retried, then warned about: a lost metric never crashes the training.
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
    delay = 0.5
    for attempt in range(4):
        try:
            client.post_metric(job_id, name, value, step)
            return True
        except GPUPoolError as e:
            retry = e.status is None or e.status >= 500
            if not retry or attempt == 3:
                warnings.warn(f"gpupool.log_metric: {name}={value} at step {step} was not recorded: {e}",
                              RuntimeWarning, stacklevel=2)
                return False
            time.sleep(delay)
            delay *= 2
    return False
