"""The checks of ``c.GPUPool`` settings that need no other setting (config.py runs them): each
knob's range, and the warnings about over-committed quotas (never errors: the hub starts)."""
from __future__ import annotations

import re
from typing import Any

from ..scheduler.model import DEFAULT_POOL, NodeSpec, QueueSpec
from ..scheduler.spec import over_committed
from ..scheduler.units import parse_bytes

OVER_COMMITTED = ("over-committed: when every queue wants its share, the guarantees shrink in proportion and some "
                  "get less than they deserve; the hub starts")
_GPU_WORD = re.compile(r"\bgpu\b")  # the core says "8 gpu"; people read "8 GPUs"


def over_commit_warnings(queues: list[QueueSpec], nodes: list[NodeSpec] | None) -> list[str]:
    """Warnings, never errors: where deserved quotas add up to more than there is (the core's
    ``over_committed``), in each node pool: the top-level queues against the pool's GPUs (when the
    nodes are known), and every department whose children deserve more than it does; and a queue
    with a quota in a pool that no node is in (a misspelt pool, or nodes still to come)."""
    named = {p for q in queues for p in q.pools}
    pools = sorted(named | {n.pool for n in nodes or ()} | {DEFAULT_POOL})
    have = {n.pool for n in nodes or ()}
    out = []
    for pool in pools:
        if nodes is not None and pool not in have:
            users = [q.name for q in queues if q.in_pool(pool).deserved.get("gpu", 0) > 0 or
                     (pool in q.pools and pool != DEFAULT_POOL)]
            if users:
                out.append(f"c.GPUPool.queues: node pool {pool!r} has no node (c.GPUPool.nodes: a node's pool), so "
                           f"the quotas of {', '.join(users)} in it give nothing until it has")
            continue
        capacity = float(sum(n.gpus for n in nodes if n.pool == pool)) if nodes is not None else None
        where = "" if pools == [DEFAULT_POOL] else f"in node pool {pool}: "
        out += [f"c.GPUPool.queues: {where}{_GPU_WORD.sub('GPUs', what)} ({OVER_COMMITTED})"
                for what in over_committed(queues, capacity, pool=pool)]
    return out


def knob_errors(pool: Any) -> list[str]:
    """One sentence per knob of ``pool`` (a GPUPool) out of its range."""
    errors: list[str] = []
    if pool.max_pods < 1:
        errors.append("c.GPUPool.max_pods: must be >= 1")
    for knob in ("cycle_seconds", "cycle_timeout"):
        if getattr(pool, knob) <= 0:
            errors.append(f"c.GPUPool.{knob}: must be > 0")
    for knob in ("preemption_grace", "min_runtime", "kill_after", "workspace_reconcile_seconds",
                 "workspace_release_grace", "gang_restarts", "startup_retries", "usage_sample_seconds",
                 "usage_raw_retention", "usage_rollup_retention"):
        if getattr(pool, knob) < 0:
            errors.append(f"c.GPUPool.{knob}: must be >= 0")
    if not 0 <= pool.gpu_memory_reserve < 1:
        errors.append("c.GPUPool.gpu_memory_reserve: must be a fraction, at least 0 and below 1 (e.g. 0.03)")
    try:
        parse_bytes(pool.gpu_memory_reserve_min)
    except ValueError as e:
        errors.append(f"c.GPUPool.gpu_memory_reserve_min: {e}")
    if pool.usage_rollup_seconds <= 0:
        errors.append("c.GPUPool.usage_rollup_seconds: must be > 0")
    if pool.simulated_activity_seconds <= 0:
        errors.append("c.GPUPool.simulated_activity_seconds: must be > 0")
    if "{" in pool.work_dir:
        try:
            pool.work_dir.format(home="/h", user="u")
        except (KeyError, IndexError, ValueError) as e:
            errors.append(f"c.GPUPool.work_dir: bad template ({e}); use {{home}} or {{user}}")
    if pool.idle_window_seconds <= 0:
        errors.append("c.GPUPool.idle_window_seconds: must be > 0")
    if pool.max_runtime_warning < 0:
        errors.append("c.GPUPool.max_runtime_warning: must be >= 0")
    return errors
