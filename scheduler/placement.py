"""Placement policies: which node and which GPUs a pod goes to.

API (stable; the live scheduler and the trace-fill benchmark both call it):

    policy = make_policy("default", shapes=[(PodRequest, weight), ...], seed=0)
    choice = policy.choose(state, req, mask=None)   # -> (node_index, gpu_indices, milli) | None

``mask`` (bool per node) restricts the candidate nodes (node selectors, GPU models, topology).
``milli`` is the per-GPU share actually taken on the chosen node (memory-sized requests convert
per node). ``choose`` never mutates ``state``; the caller applies the choice with
``state.take(node, gpus, milli, req.cpu_milli, req.memory)``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .cluster import ClusterState, PodRequest
from .model import MILLI

Choice = tuple[int, tuple[int, ...], int]


class FirstFit:
    name = "firstfit"

    def choose(self, state: ClusterState, req: PodRequest, mask: np.ndarray | None = None) -> Choice | None:
        for n in range(len(state.nodes)):
            if not state.schedulable[n] or (mask is not None and not mask[n]):
                continue
            if state.cpu_free[n] < req.cpu_milli or state.mem_free[n] < req.memory:
                continue
            if req.num_gpus == 0:
                return n, (), 0
            milli = state.milli_on(n, req)
            if milli > MILLI:
                continue
            ok = [g for g in range(int(state.num_gpus[n])) if state.gpu_free[n, g] >= milli]
            if len(ok) >= req.num_gpus:
                return n, tuple(ok[: req.num_gpus]), milli
        return None


POLICIES = ("default", "firstfit")


def make_policy(name: str = "default", shapes: Sequence[tuple[PodRequest, float]] = (), seed: int = 0):
    if name not in POLICIES:
        raise ValueError(f"unknown placement policy {name!r} (choose from {', '.join(POLICIES)})")
    return FirstFit()
