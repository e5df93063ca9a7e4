"""The gpupool client (``gpupool.jobs()`` and ``gpupool.sweep()`` live in the submodules of the same
names, which stay importable as modules): submit notebook jobs, run sweeps, read queues and GPUs (docs/client.md)."""
from .api import (BadRequest, Client, ConfigurationError, Conflict, ConnectionFailed, Forbidden, GPUPoolError,
                  NotFound, QuotaError, ServiceError, Unauthorized, connect, get_client)
from .serving import endpoints, serve
from .jobs import Job, nodes, queues, submit
from .metrics import log_metric
from .sweep import BestTrial, Sweep, SweepError, TrialTable, choice, intuniform, loguniform, uniform

__all__ = [
    "BadRequest", "BestTrial", "Client", "ConfigurationError", "Conflict", "ConnectionFailed", "Forbidden",
    "GPUPoolError", "Job", "NotFound", "QuotaError", "ServiceError", "Sweep", "SweepError", "TrialTable",
    "Unauthorized", "choice", "connect", "get_client", "intuniform", "log_metric", "loguniform", "nodes",
    "queues", "submit", "uniform", "serve", "endpoints",
]
