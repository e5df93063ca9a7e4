"""Fair share: how much of each resource every queue should have right now.

Per resource, top-down through the queue tree (docs/scheduling.md has worked examples):

1. The amount to divide at the root level is the cluster's capacity; at any other level it is the
   parent's fair share.
2. Each child first gets ``min(deserved, demand)`` (capped by its limit). If those guarantees add
   up to more than the amount (an over-committed level), the amount is split in proportion to them.
3. The rest is water-filled among the children that still have unmet demand, in proportion to
   ``over_quota_weight``, each capped by its demand and its limit; children with a higher queue
   ``priority`` are served first, and only what they cannot use goes to the next priority.
4. A department's demand is the sum of its children's demand.

**Fairness over time** (``usage`` and ``k``): in step 3, each round of the water-fill weighs a child
by ``max(0, w + k * (w - u))`` instead of ``w``, where ``w`` is its weight normalised over the
children still taking part and ``u`` its past usage (its GPU-seconds over the window as a share of
the capacity's; KAI-Scheduler's formula). A queue that used more than its weight's share gets less
of what is lent beyond deserved quotas, one that used less gets more; steps 1-2 (deserved quotas)
never move.

``guarantees`` gives each queue's **guarantee**: ``min(deserved, demand)`` (capped by its limit),
shrunk in proportion wherever the guarantees of one level add up to more than what that level is
guaranteed itself (the cluster's capacity at the top, the parent's guarantee below). Without
over-commitment it is the deserved quota as far as the queue wants it; when nodes fail or quotas
over-commit the cluster, it is the "shrunk share" that a queue reclaims up to. It never exceeds the
fair share.

Pure and deterministic: plain floats, no I/O.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .model import RESOURCES, QueueSpec

EPS = 1e-9


def _adjusted(active: list[str], weights: Mapping[str, float], usage: Mapping[str, float], k: float) -> dict[str, float]:
    """The weights of one water-fill round under fairness over time (module doc); the plain
    weights when every adjusted one is 0."""
    total = sum(weights[n] for n in active)
    out = {}
    for n in active:
        w = weights[n] / total
        out[n] = max(0.0, w + k * (w - usage.get(n, 0.0)))
    return out if sum(out.values()) > EPS else {n: weights[n] for n in active}


def _waterfill(amount: float, caps: dict[str, float], weights: dict[str, float],
               usage: Mapping[str, float] | None = None, k: float = 0.0) -> dict[str, float]:
    """Split ``amount`` in proportion to ``weights``, each name capped by ``caps``; leftover from
    capped names flows to the others. Names with weight 0 get nothing. With ``usage`` and ``k``,
    each round's weights are adjusted for past usage (``_adjusted``)."""
    give = {n: 0.0 for n in caps}
    active = [n for n in caps if caps[n] > EPS and weights.get(n, 0) > 0]
    plain = weights
    while amount > EPS and active:
        if usage and k:
            weights = _adjusted(active, plain, usage, k)
            active = [n for n in active if weights[n] > 0]
        total_w = sum(weights[n] for n in active)
        capped = []
        for n in active:
            share = amount * weights[n] / total_w
            room = caps[n] - give[n]
            if share >= room - EPS:
                capped.append(n)
        if not capped:
            for n in active:
                give[n] += amount * weights[n] / total_w
            amount = 0.0
            break
        for n in capped:
            room = caps[n] - give[n]
            give[n] += room
            amount -= room
        active = [n for n in active if n not in capped]
    return give


def divide(amount: float, children: list[QueueSpec], demand: Mapping[str, float], resource: str,
           usage: Mapping[str, float] | None = None, k: float = 0.0) -> dict[str, float]:
    """One level of the division: returns each child's fair share of ``amount`` (``usage``/``k``:
    fairness over time, for the part beyond deserved quotas)."""
    cap = {}
    for q in children:
        c = demand.get(q.name, 0.0)
        if resource in q.limit:
            c = min(c, q.limit[resource])
        cap[q.name] = max(0.0, c)
    guaranteed = {q.name: min(q.deserved.get(resource, 0.0), cap[q.name]) for q in children}
    total_g = sum(guaranteed.values())
    if total_g > amount + EPS:  # over-committed: split the amount in proportion to the guarantees
        return {n: amount * g / total_g if total_g > 0 else 0.0 for n, g in guaranteed.items()}
    share = dict(guaranteed)
    rest = amount - total_g
    for prio in sorted({q.priority for q in children}, reverse=True):
        if rest <= EPS:
            break
        group = [q for q in children if q.priority == prio]
        room = {q.name: cap[q.name] - share[q.name] for q in group}
        extra = _waterfill(rest, room, {q.name: q.over_quota_weight for q in group}, usage, k)
        for n, v in extra.items():
            share[n] += v
            rest -= v
    return share


class QueueTree:
    """The queue tree with fast parent/children/ancestry lookups."""

    def __init__(self, queues: Iterable[QueueSpec]):
        self.queues: dict[str, QueueSpec] = {q.name: q for q in queues}
        self.children: dict[str | None, list[QueueSpec]] = {}
        for q in self.queues.values():
            parent = q.parent if q.parent in self.queues else None
            self.children.setdefault(parent, []).append(q)
        for lst in self.children.values():
            lst.sort(key=lambda q: q.name)
        self._path: dict[str, tuple[str, ...]] = {}
        self._splits: dict[tuple[str, str], tuple[str, str]] = {}
        for name in self.queues:
            path, cur = [], name
            while cur is not None:
                path.append(cur)
                p = self.queues[cur].parent
                cur = p if p in self.queues else None
            self._path[name] = tuple(reversed(path))

    def is_leaf(self, name: str) -> bool:
        return not self.children.get(name)

    def path(self, name: str) -> tuple[str, ...]:
        """Root-first ancestry, ending with ``name`` itself."""
        return self._path[name]

    def subtree(self, name: str) -> frozenset[str]:
        """``name`` and every queue below it."""
        if not hasattr(self, "_subtree"):
            below: dict[str, set[str]] = {q: set() for q in self.queues}
            for q, path in self._path.items():
                for a in path:
                    below[a].add(q)
            self._subtree = {q: frozenset(v) for q, v in below.items()}
        return self._subtree[name]

    def split(self, a: str, b: str) -> tuple[str, str]:
        """The two queues where the ancestries of ``a`` and ``b`` part: the children of their
        lowest common ancestor (or the roots) on each side."""
        key = (a, b)
        hit = self._splits.get(key)
        if hit is not None:
            return hit
        pa, pb = self._path[a], self._path[b]
        i = 0
        while i < len(pa) and i < len(pb) and pa[i] == pb[i]:
            i += 1
        hit = self._splits[key] = (pa[min(i, len(pa) - 1)], pb[min(i, len(pb) - 1)])
        return hit

    def rollup(self, leaf_values: Mapping[str, float]) -> dict[str, float]:
        """Sum leaf values up the tree: every queue gets its own plus its descendants'."""
        out = {name: 0.0 for name in self.queues}
        for leaf, v in leaf_values.items():
            if leaf in self._path:
                for q in self._path[leaf]:
                    out[q] += v
        return out


def guarantees(tree: QueueTree, demand: Mapping[str, Mapping[str, float]], capacity: float,
               resource: str = "gpu") -> dict[str, float]:
    """Each queue's guarantee of ``resource`` (module doc): what it may take back from borrowers
    whatever the other queues want, shrunk where the quotas over-commit what there is."""
    rolled = tree.rollup({q: d.get(resource, 0.0) for q, d in demand.items()})
    out: dict[str, float] = {}
    stack: list[tuple[str | None, float]] = [(None, float(capacity))]
    while stack:
        parent, amount = stack.pop()
        kids = tree.children.get(parent, [])
        if not kids:
            continue
        want = {}
        for q in kids:
            c = rolled.get(q.name, 0.0)
            if resource in q.limit:
                c = min(c, q.limit[resource])
            want[q.name] = max(0.0, min(q.deserved.get(resource, 0.0), c))
        total = sum(want.values())
        scale = amount / total if total > amount + EPS else 1.0
        for q in kids:
            out[q.name] = want[q.name] * scale
            stack.append((q.name, out[q.name]))
    return out


def fair_shares(tree: QueueTree, demand: Mapping[str, Mapping[str, float]],
                capacity: Mapping[str, float], resources: Iterable[str] = RESOURCES,
                usage: Mapping[str, float] | None = None, k: float = 0.0) -> dict[str, dict[str, float]]:
    """Fair share of every queue (departments included) for each resource.

    ``demand[leaf][resource]`` is what the leaf's workloads ask for (running + pending);
    ``capacity[resource]`` is the cluster's total. ``usage[queue]`` (any level) and ``k``: fairness
    over time for GPUs (module doc).
    """
    out: dict[str, dict[str, float]] = {name: {} for name in tree.queues}
    for res in resources:
        leaf_demand = {q: d.get(res, 0.0) for q, d in demand.items()}
        rolled = tree.rollup(leaf_demand)
        stack: list[tuple[str | None, float]] = [(None, float(capacity.get(res, 0.0)))]
        while stack:
            parent, amount = stack.pop()
            kids = tree.children.get(parent, [])
            if not kids:
                continue
            shares = divide(amount, kids, rolled, res, usage if res == "gpu" else None, k)
            for q in kids:
                out[q.name][res] = shares[q.name]
                stack.append((q.name, shares[q.name]))
    return out
