"""gpupool: a Jupyter-centric, fair-share GPU pool for JupyterHub.

From a notebook::

    import gpupool
    job = gpupool.submit("train.ipynb", gpus=0.5, parameters={"lr": 1e-3})
    job.wait()
    gpupool.dashboard()

Importing ``gpupool`` is cheap: the client (requests, optuna, ipywidgets) loads on first use, so
``import gpupool.scheduler`` pulls in nothing but the pure scheduler core.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_CLIENT = (
    "BadRequest", "BestTrial", "Client", "ConfigurationError", "Conflict", "ConnectionFailed", "Forbidden",
    "GPUPoolError", "Job", "NotFound", "QuotaError", "ServiceError", "Sweep", "SweepError", "TrialTable",
    "Unauthorized", "choice", "connect", "intuniform", "log_metric", "loguniform", "nodes", "queues",
    "submit", "uniform", "serve", "endpoints",
)
_WIDGETS = ("dashboard", "QueueView", "GPUView", "JobView", "SweepView", "JobsView", "EndpointsView")
_LAZY = {**{n: "gpupool.client" for n in _CLIENT}, **{n: "gpupool.widgets" for n in _WIDGETS},
         "jobs": "gpupool.client.jobs", "sweep": "gpupool.client.sweep"}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpupool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
