"""The one rule for how many GPUs a request may ask for: jobs and workspaces, the REST API and the
spawn page all check ``gpus`` with :func:`check_gpus` (docs/client.md, docs/workspaces.md).

* whole GPUs: ``1``, ``2``, ... (a job's pods each get that many);
* a fraction of one GPU: any number between 0 and 1 (``0.5``, ``0.3``); the spawn page offers
  ``Spawner.gpu_fractions`` as its menu, and a request for another fraction is as valid;
* ``0``: no GPU (a CPU-only workload), the same as leaving ``gpus`` out;
* anything else (negative, ``1.5``, not a number) is refused with the reason.
"""
from __future__ import annotations

import math
import numbers

RULE = "whole GPUs (1, 2, ...), a fraction of one GPU below 1 (0.5), or 0 for no GPU"


def check_gpus(value: object) -> float:
    """``value`` as a number of GPUs by the rule above, or ``ValueError`` saying what is wrong."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"must be a number of GPUs: {RULE}")
    gpus = float(value)
    if not math.isfinite(gpus) or gpus < 0:
        raise ValueError(f"must be >= 0 (0 means no GPU): {RULE}")
    if gpus > 1 and gpus != int(gpus):
        raise ValueError(f"{gpus:g}: above 1 must be a whole number of GPUs")
    return gpus
