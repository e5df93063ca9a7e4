"""Node pools: ``GET pools`` (each pool's GPUs, what it holds and what waits for it), and a
queue's entry per pool for ``GET queues`` (its quota, fair share, allocation and past usage in
each pool, and its share without past usage while fairness over time counts it). The numbers come
from the last cycle (runtime/loop.py's state); the rules from domain/pools.py."""
from __future__ import annotations

from typing import Any

from ..domain.pools import plain_share, pool_view, queue_pools
from .base import BaseHandler
from .scopes import SUBMIT, needs_scope


def pools_of(svc: Any) -> dict:
    """``schemas.PoolList`` of the service: its nodes as the scheduler sees them (drained or failed
    nodes out of service) and the last cycle's counts."""
    nodes = svc.loop.node_states.apply(svc.settings.nodes)
    return pool_view(nodes, svc.loop.state.pools, svc.settings.pool.fairness)


def queue_entry(svc: Any, spec: Any, pools: dict) -> dict:
    """The ``pools``, ``usage`` and ``fair_share_plain`` fields of a queue in ``GET queues``."""
    per_pool, usage = queue_pools(spec, svc.loop.state, pools["pools"])
    return {"pools": per_pool, "usage": usage, "fair_share_plain": plain_share(svc.loop.state, spec.name)}


class PoolsHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        self.send(pools_of(self.svc))
