"""The held workloads of a cycle (running or releasing), kept across cycles beside the waiting book.

Every cycle adds up what the held workloads hold, per queue (floats, in the snapshot's order) and
per GPU and node (what the ``now`` view starts without). ``HeldBook`` keeps, per held workload,
what that needs of it (its amount, its request, and the GPU milli, CPU and memory its pods take
where), so that a workload the snapshot did not name as changed is not read again. The cluster's
part is kept summed: integers, so the sum brought up to date with the changes alone is the sum
taken afresh, bit for bit. The queues' sums are still added up in the snapshot's order each cycle
(floats: the order is part of the result). Valid for one node list (the same ``NodeSpec``
objects in the same order). Pure: no I/O.
"""
from __future__ import annotations

import operator
from typing import Iterable

import numpy as np

from .model import MILLI, NodeSpec, Workload

# what a held workload takes of the cluster: per GPU (flat node x width index, milli), per pod
# (node, CPU milli, memory)
Take = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def takes(ws: Iterable[Workload], index: dict[str, int], width: int) -> tuple[list[int], ...]:
    """What ``ws`` take of a cluster whose nodes ``index`` numbers (``width`` GPUs a row): per
    GPU its flat index and milli, per pod its node, CPU milli and memory (pods on nodes not in
    ``index`` take nothing)."""
    keys, milli, pods, cpu, mem = [], [], [], [], []
    for w in ws:
        c, m = int(round(w.cpu * MILLI)), w.memory
        for p in w.placements:
            n = index.get(p.node)
            if n is None:
                continue
            pods.append(n)
            cpu.append(c)
            mem.append(m)
            for g in p.gpus:
                keys.append(n * width + g)
                milli.append(p.milli)
    return keys, milli, pods, cpu, mem


CHANGED_KEPT = 4096  # changes kept for the victim book beyond twice the held workloads (see ``forget``)


class HeldBook:
    """Per held workload id: (amount, request key, ``Take``); and the sum of the takes."""

    def __init__(self, nodes: list[NodeSpec], index: dict[str, int], width: int):
        self.nodes = list(nodes)
        self.index, self.width = index, width
        self.facts: dict[str, tuple] = {}
        self.gpu = np.zeros(len(nodes) * width, dtype=np.int64)
        self.cpu = np.zeros(len(nodes), dtype=np.int64)
        self.mem = np.zeros(len(nodes), dtype=np.int64)
        self._add: list[Take] = []
        self._sub: list[Take] = []
        # ``Cycle.victim_nodes``'s cache, kept too: workload id -> (node, GPU milli) per node it
        # runs on, valid for this node list while the workload is not named as changed
        self.nodes_of: dict[str, list[tuple[int, int]]] = {}
        # the victim index's facts kept for the planner (``plan._VictimBook``; None: none yet),
        # and the workloads named as changed since it was last brought up to date
        self.victims = None
        self.changed: set[str] = set()

    def fits(self, nodes: list[NodeSpec], width: int) -> bool:
        """Was it made for this node list (the same objects, in order)?"""
        return width == self.width and len(nodes) == len(self.nodes) and all(map(operator.is_, nodes, self.nodes))

    def take_of(self, w: Workload) -> Take:
        """What ``w`` takes of the cluster, where (its pods on unknown nodes take nothing)."""
        keys, milli, pods, cpu, mem = takes((w,), self.index, self.width)
        return tuple(keys), tuple(milli), tuple(pods), tuple(cpu), tuple(mem)

    def note(self, wid: str, fact: tuple) -> None:
        """Keep ``fact`` (amount, request key, take) of a held workload; its take is added."""
        self.facts[wid] = fact
        self._add.append(fact[2])

    def forget(self, ids: Iterable[str]) -> None:
        """Drop these workloads (changed or gone); their takes are taken off."""
        facts, nodes_of = self.facts, self.nodes_of
        if self.victims is not None:
            ids = list(ids)
            self.changed.update(ids)
            if len(self.changed) > 2 * len(facts) + CHANGED_KEPT:
                # no victim index was made for many cycles (no reclaim): rather than keep every
                # change since, drop the victim book; the next index is made afresh
                self.victims, self.changed = None, set()
        for wid in ids:
            f = facts.pop(wid, None)
            if f is not None:
                self._sub.append(f[2])
            nodes_of.pop(wid, None)

    def keep_only(self, ids: set[str]) -> None:
        """Drop every workload but ``ids`` (after a change the snapshot did not name)."""
        self.forget([wid for wid in self.facts if wid not in ids])
        self.nodes_of.clear()  # (what else went unnamed is not known)
        self.victims, self.changed = None, set()

    def settle(self) -> None:
        """Apply the takes noted or forgotten since the last call to the sums."""
        for noted, sign in ((self._add, 1), (self._sub, -1)):
            if not noted:
                continue
            keys = [k for t in noted for k in t[0]]
            if keys:
                milli = [v for t in noted for v in t[1]]
                np.add.at(self.gpu, np.array(keys, dtype=np.int64), sign * np.array(milli, dtype=np.int64))
            pods = [n for t in noted for n in t[2]]
            if pods:
                at = np.array(pods, dtype=np.int64)
                np.add.at(self.cpu, at, sign * np.array([v for t in noted for v in t[3]], dtype=np.int64))
                np.add.at(self.mem, at, sign * np.array([v for t in noted for v in t[4]], dtype=np.int64))
            noted.clear()
