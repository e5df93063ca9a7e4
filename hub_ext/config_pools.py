"""The ``c.GPUPool`` knobs of node pools and fairness over time (``GPUPool`` inherits them), and
their checks: a default pool preference per kind (build and train environments) and ``fairness``
(KAI-Scheduler's time-aware fairness: usage from the ledger moves the over-quota share). On
Kubernetes a node's pool is a node label (``c.GPUPoolKubernetes.pool_label``). The core's rules are in ``scheduler/pools.py`` and
``scheduler/usage.py``; docs/admin.md says how to use them."""
from __future__ import annotations

from typing import Any

from traitlets import Dict
from traitlets.config import Configurable

from ..scheduler.model import KINDS
from .domain.pools import fairness_config


class PoolSettings(Configurable):
    """Node pools and fairness over time (``c.GPUPool.*``)."""

    pool_preference = Dict(
        default_value={},
        help="""The node pools a request that names none prefers, per kind (``interactive``: workspaces;
        ``train``, ``hpo-trial``, ``inference``: jobs), in order: the build and train environments
        of a mixed pool, e.g. ``{"interactive": ["build", "train"], "train": ["train", "build"]}``
        (workspaces on the small GPUs of pool build, training on the big ones of pool train, each
        falling back on the other). A pool no node is in is left out of the preference. A kind not
        listed, or empty (the default): any pool, the scheduler's own choice (the pools where the
        queue has the most deserved quota free). A request's own ``pools`` always wins.""",
    ).tag(config=True)

    fairness = Dict(
        default_value={},
        help="""Fairness over time (off when empty, the default): the GPUs lent beyond deserved quotas
        are divided by weight adjusted for each queue's past usage, read from the usage ledger, as
        KAI-Scheduler's time-aware fairness does. Deserved quotas never move. Fields: ``window``
        (seconds, or ``"1h"``, ``"7d"``: the usage that counts; default 1h), ``window_type``
        (``sliding`` or ``tumbling``: usage resets at each window's start), ``half_life`` (usage
        that old counts half; absent: no decay), ``k`` (how strongly usage moves the share; default
        1, 0 = no effect), e.g. ``{"window": "7d", "half_life": "1d", "k": 1}``.""",
    ).tag(config=True)


def pool_errors(pool: Any) -> list[str]:
    """One sentence per problem of the pool and fairness knobs of ``pool`` (a GPUPool)."""
    errors = []
    for kind, prefs in (pool.pool_preference or {}).items():
        path = f"c.GPUPool.pool_preference.{kind}"
        if kind not in KINDS:
            errors.append(f"{path}: unknown kind (use {', '.join(KINDS)})")
        elif not isinstance(prefs, list) or not all(isinstance(p, str) and p.strip() for p in prefs):
            errors.append(f"{path}: must be a list of pool names, most preferred first")
        elif len(set(prefs)) != len(prefs):
            errors.append(f"{path}: lists a pool twice")
    try:
        fairness_config(pool.fairness)
    except ValueError as e:
        errors.append(str(e))
    return errors

