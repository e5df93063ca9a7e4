"""Node pools in the service: the pools a request may name, the default preference per kind
(``c.GPUPool.pool_preference``: build and train environments), fairness over time's settings
(``c.GPUPool.fairness``), and what the pools hold and wait for (the spawn page, the dashboard,
``gpupool queues``). The scheduler's rules are the core's (``scheduler/pools.py``)."""
from __future__ import annotations

from typing import Any

from ...scheduler.model import DEFAULT_POOL
from ...scheduler.usage import WINDOW_TYPES, FairnessConfig
from .errors import APIError
from .idle_rules import parse_duration

FAIRNESS_FIELDS = ("window", "window_type", "half_life", "k")


def node_pools(nodes: Any) -> list[str]:
    """The pools the nodes are in, sorted (``default`` when there is no node)."""
    return sorted({n.pool for n in nodes}) or [DEFAULT_POOL]


def _biggest(nodes: Any, pool: str) -> int:
    return max((n.gpus for n in nodes if n.pool == pool), default=0)


def preferred_pools(pool: Any, kind: str, nodes: Any, gpus: float = 0.0) -> tuple[str, ...]:
    """The pools a request of ``kind`` that names none prefers (``c.GPUPool.pool_preference``), less
    those without a node that holds ``gpus`` per pod; () when that leaves none, or there is no
    preference (any pool: the core's choice)."""
    return tuple(p for p in (pool.pool_preference or {}).get(kind, ()) if _biggest(nodes, p) >= gpus
                 and any(n.pool == p for n in nodes))


def request_pools(asked: Any, pool: Any, kind: str, nodes: Any, gpus: float = 0.0,
                  allowed: Any = None) -> tuple[str, ...]:
    """The pools a request runs in: its own (each one a pool some node is in, and one of them with
    a node that holds ``gpus`` per pod: else a 400 naming the field), or the preference of its kind.
    ``allowed``: the pools its queue's policy allows (None: all; domain/policies.py checks that the
    request names no other): a request naming none runs in those, its kind's preference first."""
    if not asked:
        preferred = preferred_pools(pool, kind, nodes, gpus)
        if allowed is None:
            return preferred
        mine = [p for p in preferred if p in allowed]
        mine += [p for p in sorted(allowed) if p not in mine and _biggest(nodes, p) >= gpus
                 and any(n.pool == p for n in nodes)]
        if not mine:
            raise APIError(400, f"gpus: no node in the pools this queue may use ({', '.join(sorted(allowed))}) has "
                                f"{gpus:g} GPUs", "gpus")
        return tuple(mine)
    have = {n.pool for n in nodes}
    for p in asked:
        if p not in have:
            raise APIError(400, f"pools: no node is in pool {p!r} (the pools: {', '.join(node_pools(nodes))})",
                           "pools")
    biggest = max(_biggest(nodes, p) for p in asked)
    if gpus > biggest:
        raise APIError(400, f"gpus: no node in pools {', '.join(asked)} has {gpus:g} GPUs (the largest there has "
                            f"{biggest})", "gpus")
    return tuple(asked)


def fairness_config(value: dict) -> FairnessConfig | None:
    """``c.GPUPool.fairness`` as the core's ``FairnessConfig`` (None: off). Raises ValueError with
    a message naming the field."""
    if not value:
        return None
    unknown = sorted(set(value) - set(FAIRNESS_FIELDS))
    if unknown:
        raise ValueError(f"c.GPUPool.fairness.{unknown[0]}: unknown field (allowed: {', '.join(FAIRNESS_FIELDS)})")
    fields: dict[str, Any] = {}
    for key in ("window", "half_life"):
        if value.get(key) is not None:
            fields[key] = parse_duration(value[key], f"c.GPUPool.fairness.{key}")  # a ValueError naming it
    if "window_type" in value:
        if value["window_type"] not in WINDOW_TYPES:
            raise ValueError(f"c.GPUPool.fairness.window_type: must be one of {', '.join(WINDOW_TYPES)}")
        fields["window_type"] = value["window_type"]
    if "k" in value:
        k = value["k"]
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ValueError("c.GPUPool.fairness.k: must be a number >= 0")
        fields["k"] = float(k)
    try:
        return FairnessConfig(**fields)
    except ValueError as e:  # the core's ranges: "window must be > 0 seconds"
        field, _, rest = str(e).partition(" ")
        raise ValueError(f"c.GPUPool.fairness.{field}: {rest}") from None




def pool_counts(snap: Any, binds: Any = ()) -> dict[str, dict[str, float]]:
    """What each pool holds and waits for once a cycle's ``binds`` are made, from its ``Snapshot``:
    ``running`` (workloads holding GPUs there), ``allocated`` (their GPUs) and ``queued`` (waiting
    workloads that may run there: those naming it, and those naming no pool)."""
    pools = node_pools(snap.nodes)
    node_pool = {n.name: n.pool for n in snap.nodes}
    out = {p: {"running": 0, "allocated": 0.0, "queued": 0} for p in pools}
    bound = {b.workload: b.placements for b in binds}
    for w in snap.workloads:
        placements = w.placements or bound.get(w.id)
        if placements:
            p = node_pool.get(placements[0].node)
            if p in out:
                out[p]["running"] += 1
                out[p]["allocated"] += sum(len(pl.gpus) * pl.fraction for pl in placements)
        else:
            for p in (w.pools or pools):
                if p in out:
                    out[p]["queued"] += 1
    return out


def pool_view(nodes: Any, counts: dict, fairness: Any) -> dict:
    """``GET pools``: each pool's nodes and GPUs (in service), what it holds and what waits for it."""
    out = []
    for p in node_pools(nodes):
        mine = [n for n in nodes if n.pool == p]
        gpus = float(sum(n.gpus for n in mine if n.schedulable))
        c = counts.get(p, {})
        allocated = round(float(c.get("allocated", 0.0)), 6)
        out.append({"name": p, "nodes": len(mine), "gpus": gpus, "allocated": allocated,
                    "free": max(0.0, round(gpus - allocated, 6)), "running": int(c.get("running", 0)),
                    "queued": int(c.get("queued", 0)), "gpu_models": sorted({n.gpu_model for n in mine} - {""})})
    return {"pools": out, "fairness": fairness or None}


def plain_share(state: Any, queue: str, pool: str | None = None) -> dict | None:
    """Fairness over time: ``queue``'s fair share without past usage (over every pool, or in
    ``pool``), from the last cycle; None while past usage counts for nothing
    (fairness over time off, or no queue has usage yet)."""
    plain = state.fair_share_plain if pool is None else state.pool_fair_share_plain.get(pool, {})
    return plain.get(queue, {}) if plain else None


def queue_pools(spec: Any, state: Any, pools: list[dict]) -> tuple[dict, float | None]:
    """A queue's entry per pool for ``GET queues`` (its quota there, fair share and, while past
    usage counts, the share without usage, allocation, past usage, whether it may use the pool,
    the pool's free GPUs and waiting workloads) and its usage over every pool (None: fairness over
    time is off)."""
    out = {}
    weighted = capacity = 0.0
    on = bool(state.usage) or bool(getattr(state, "fairness_on", False))
    single = len(pools) == 1 and pools[0]["name"] == DEFAULT_POOL
    for pool in pools:
        p = pool["name"]
        q = spec.in_pool(p)
        fair = (state.fair_share if single else state.pool_fair_share.get(p, {})).get(spec.name, {})
        alloc = (state.allocated if single else state.pool_allocated.get(p, {})).get(spec.name, {})
        usage = state.usage.get(p, {}).get(spec.name, 0.0) if on else None
        if usage is not None:
            weighted += usage * pool["gpus"]
            capacity += pool["gpus"]
        out[p] = {"deserved": q.deserved, "limit": q.limit, "over_quota_weight": q.over_quota_weight,
                  "fair_share": fair, "fair_share_plain": plain_share(state, spec.name, None if single else p),
                  "allocated": alloc, "usage": usage, "may_use": q.limit.get("gpu") != 0,
                  "free": pool["free"], "queued": pool["queued"]}
    return out, ((weighted / capacity if capacity else 0.0) if on else None)
