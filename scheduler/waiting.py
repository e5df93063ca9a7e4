"""The waiting workloads of a cycle, worked out once, or kept across cycles.

A busy snapshot is mostly pending workloads (60,000 of 80,000 at 4,000 nodes), and from one cycle
to the next most of them are the same. What a cycle needs of them is here: each one's amount, each
queue's pending demand, the request shapes, and (for allocate) each queue's workloads in order with
their positions. ``WaitingBook.fresh`` works it out from a list of pending workloads. A book the
``Scheduler`` keeps is brought up to date with ``Snapshot.changes`` (the ids of the workloads
added, removed or changed since the last snapshot): only those and the queues they are in are
worked out again.

Both ways give the same numbers, bit for bit: a queue's pending demand is an exactly rounded sum
(``math.fsum``) of count x amount over its distinct requests, whatever order they came in; shapes
are counted in whole pods; the order within a queue is a total order (priority, highest first;
submit time; id). Pure: no I/O.
"""
from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections import Counter
from typing import Iterable

from .model import Phase, Workload

Vec = tuple[float, float, float]

_ID = operator.attrgetter("id")
# a pending workload's request: what its amount, its queue's demand and its shape depend on
_REQUEST = operator.attrgetter("queue", "pods", "gpus", "gpu_memory", "cpu", "memory")
_SUBMITTED = operator.attrgetter("submit_time", "id")
_PRIORITY = operator.attrgetter("priority")
_PREEMPTIBLE = operator.attrgetter("preemptible")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_RAW = operator.attrgetter("gpus", "gpu_memory", "cpu", "memory", "pods")
# ``facts_of``: every field it needs of a workload in one read, then each part of that
_READ = operator.attrgetter("priority", "preemptible", "node_selector", "queue", "pods", "gpus", "gpu_memory",
                            "cpu", "memory")
_SELECTOR_OF = operator.itemgetter(2)
_REQUEST_OF = operator.itemgetter(3, 4, 5, 6, 7, 8)  # as ``_REQUEST``
_RAW_OF = operator.itemgetter(5, 6, 7, 8, 4)  # as ``_RAW``


def raw_key(w: Workload) -> tuple:
    """The request of a pending workload as plain values (cheaper than a Candidate)."""
    sel = w.node_selector
    return _RAW(w) + (tuple(sorted(sel.items())),) if sel else _RAW(w)


def facts_of(lst: list[Workload], by_request: dict[tuple, Vec]) -> list[tuple]:
    """What allocate reads of each of ``lst`` as it goes down a queue: (GPUs it asks for, priority,
    preemptible, ``raw_key``), so that the workloads themselves are read only when tried.
    ``by_request``: the amount of each request (``_REQUEST``) among them. Each workload is read
    once, in C; the rest is worked out from what was read (and the amounts by request, not by
    id: the few requests stay in the caches where 60,000 ids do not)."""
    got = list(map(_READ, lst))
    raw = list(map(_RAW_OF, got))
    if any(map(_SELECTOR_OF, got)):  # ``raw_key`` for node selectors (rare)
        raw = [r + (tuple(sorted(g[2].items())),) if g[2] else r for r, g in zip(raw, got)]
    return list(zip(map(_FIRST, map(by_request.__getitem__, map(_REQUEST_OF, got))), map(_FIRST, got),
                    map(_SECOND, got), raw))


def pending_amount(max_gpu_mem: int, pods: int, gpus: float, gpu_memory: int, cpu: float, memory: int) -> Vec:
    """(GPUs, CPUs, memory) a pending workload asks for; a GPU-memory request counts as its share
    of the largest GPU (``max_gpu_mem``)."""
    if gpu_memory > 0:
        gpu = pods * min(1.0, gpu_memory / max_gpu_mem) if max_gpu_mem else float(pods)
    else:
        gpu = pods * gpus
    return (gpu, cpu * pods, float(memory * pods))


def by_queue(workloads: Iterable[Workload]) -> dict[str, list[Workload]]:
    """Workloads by queue, each queue's in allocation order: priority (highest first), then
    submit time, then id (``order_key``)."""
    out: dict[str, list[Workload]] = {}
    for w in workloads:
        out.setdefault(w.queue, []).append(w)
    for lst in out.values():
        lst.sort(key=_SUBMITTED)
        lst.sort(key=_PRIORITY, reverse=True)  # stable: equal priorities keep the order above
    return out


def order_key(w: Workload) -> tuple:
    """``by_queue``'s order as one key."""
    return (-w.priority, w.submit_time, w.id)


def _demand(counts: dict[tuple, int], amounts: dict[tuple, Vec]) -> Vec:
    """A queue's pending demand: count x amount over its requests, exactly rounded (any order)."""
    if len(counts) == 1:  # (one request: one product, which fsum would return as it is)
        for key, k in counts.items():
            a = amounts[key]
            return (k * a[0], k * a[1], k * a[2])
    items = [(k, amounts[key]) for key, k in counts.items()]
    return (math.fsum(k * a[0] for k, a in items), math.fsum(k * a[1] for k, a in items),
            math.fsum(k * a[2] for k, a in items))


class WaitingBook:
    """The pending workloads of known queues, as one cycle needs them (module doc).

    ``amounts``: workload id -> amount; ``demand``: queue -> pending demand (queues with pending
    workloads only); ``shapes``: (gpus, gpu_memory, cpu, memory) -> pods pending; ``pending``: the
    workloads. A kept book (``fresh(..., keep=True)``) also has, for allocate, ``lists`` (queue ->
    its workloads in order) and ``positions`` (id -> place in its queue, from 1), and ``update``."""

    def __init__(self, max_gpu_mem: int, names: tuple[str, ...]):
        self.key = (max_gpu_mem, names)  # what the amounts depend on, and which queues are known
        self.by_request: dict[tuple, Vec] = {}  # request -> amount
        self.amounts: dict[str, Vec] = {}
        self.counts: dict[str, dict[tuple, int]] = {}  # queue -> request -> workloads
        self.demand: dict[str, Vec] = {}
        self.shapes: dict[tuple, int] = {}
        self.ws: dict[str, Workload] = {}  # (kept books) id -> workload
        self.req: dict[str, tuple] = {}  # (kept books) id -> its request, as counted
        self.okey: dict[str, tuple] = {}  # (kept books) id -> its ``order_key``, as placed
        self.lists: dict[str, list[Workload]] | None = None
        self.keys: dict[str, list[tuple]] = {}  # (kept books) queue -> ``order_key`` of each in ``lists``
        self.facts: dict[str, list[tuple]] = {}  # (kept books) queue -> ``facts_of`` its list (shared tuples)
        self._facts: dict[tuple, tuple] = {}  # one tuple per distinct fact (few: read from cache)
        self.positions: dict[str, int] = {}
        self.pending: list[Workload] = []
        # (kept books) every workload of the snapshot it was made for was in a known queue
        self.all_known = False
        self.held = None  # (kept books) the held workloads' ``held.HeldBook``, kept beside

    @classmethod
    def fresh(cls, pending: list[Workload], max_gpu_mem: int, names: tuple[str, ...],
              keep: bool = False) -> "WaitingBook":
        """The book of ``pending`` (pending workloads of known queues); ``keep``: one that
        ``update`` can bring up to date (lists, positions and the per-workload keys too)."""
        book = cls(max_gpu_mem, names)
        book.pending = pending
        keys = list(map(_REQUEST, pending))  # counted in C: worked out once per distinct request
        by_request, counts, shapes = book.by_request, book.counts, book.shapes
        for key, k in Counter(keys).items():
            by_request[key] = pending_amount(max_gpu_mem, *key[1:])
            counts.setdefault(key[0], {})[key] = k
            rkey = key[2:]
            shapes[rkey] = shapes.get(rkey, 0) + k * key[1]
        ids = list(map(_ID, pending))
        book.amounts = dict(zip(ids, map(by_request.__getitem__, keys)))
        book.demand = {q: _demand(c, by_request) for q, c in counts.items()}
        if keep:
            book.ws = dict(zip(ids, pending))
            book.req = dict(zip(ids, keys))
            lists = book.lists = by_queue(pending)
            shared = book._facts
            for q, lst in lists.items():
                book.facts[q] = [shared.setdefault(f, f) for f in facts_of(lst, by_request)]
                okeys = book.keys[q] = list(map(order_key, lst))
                book.okey.update(zip(map(_ID, lst), okeys))
                book.positions.update(zip(map(_ID, lst), range(1, len(lst) + 1)))
        return book

    def update(self, changes: Iterable[str], by_id: dict[str, Workload]) -> None:
        """Bring a kept book up to date: ``changes`` are the ids added, removed or changed since
        the snapshot it was last brought to, ``by_id`` the workloads (of known queues) now."""
        dirty: dict[str, int] = {}  # queue -> the first place in its list that moved
        ws, get, pending = self.ws, dirty.get, Phase.PENDING
        for wid in changes:
            if wid in ws:
                q, i = self._remove(wid)
                dirty[q] = min(i, get(q, i))
            w = by_id.get(wid)
            if w is not None and w.phase is pending:
                q, i = self._add(w)
                dirty[q] = min(i, get(q, i))
        counts, lists = self.counts, self.lists
        for q, i in dirty.items():
            c = counts.get(q)
            if c:
                self.demand[q] = _demand(c, self.by_request)
            else:
                self.demand.pop(q, None)
            lst = lists.get(q)
            if lst and i < len(lst):  # (the places before the first that moved keep their number)
                self.positions.update(zip(map(_ID, lst[i:]), range(i + 1, len(lst) + 1)))
        self.pending = list(ws.values())

    def _remove(self, wid: str) -> tuple[str, int]:
        del self.ws[wid]
        del self.amounts[wid]
        key = self.req.pop(wid)
        q = key[0]
        c = self.counts[q]
        if c[key] == 1:
            del c[key]
            if not c:
                del self.counts[q]
        else:
            c[key] -= 1
        rkey = key[2:]
        left = self.shapes[rkey] - key[1]
        if left:
            self.shapes[rkey] = left
        else:
            del self.shapes[rkey]
        ok = self.okey.pop(wid)
        keys, lst = self.keys[q], self.lists[q]
        i = bisect_left(keys, ok)
        del keys[i], lst[i], self.facts[q][i]
        if not lst:
            del self.keys[q], self.lists[q], self.facts[q]
        del self.positions[wid]
        return q, i

    def _add(self, w: Workload) -> tuple[str, int]:
        wid = w.id
        key = _REQUEST(w)
        amt = self.by_request.get(key)
        if amt is None:
            amt = self.by_request[key] = pending_amount(self.key[0], *key[1:])
        q = key[0]
        self.ws[wid] = w
        self.req[wid] = key
        self.amounts[wid] = amt
        c = self.counts.setdefault(q, {})
        c[key] = c.get(key, 0) + 1
        rkey = key[2:]
        self.shapes[rkey] = self.shapes.get(rkey, 0) + key[1]
        ok = self.okey[wid] = order_key(w)
        keys = self.keys.get(q)
        if keys is None:
            keys, lst, facts = self.keys[q], self.lists[q], self.facts[q] = [], [], []
        else:
            lst, facts = self.lists[q], self.facts[q]
        i = bisect_left(keys, ok)
        keys.insert(i, ok)
        lst.insert(i, w)
        f = (amt[0], w.priority, w.preemptible, raw_key(w))
        facts.insert(i, self._facts.setdefault(f, f))
        return q, i
