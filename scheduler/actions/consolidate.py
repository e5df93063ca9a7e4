"""consolidate: a pending single-pod workload that fits the free GPUs but not on any one node (or
any one GPU): move preemptible workloads (checkpoint, restart elsewhere, possibly on another GPU of
the same node) to open room for it. The moved workloads and the workload they make room for hold
their planned places until they bind, so the move happens once.
"""
from __future__ import annotations

import numpy as np

from ..cycle import Candidate, Cycle, Statement
from ..fairshare import EPS
from ..model import MILLI, Evict, PodPlacement, Workload
from ..reasons import Cause, Code
from . import entitled, pipeline


def consolidate(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    left: list[Candidate] = []
    on_node: dict[str, list[Workload]] = {}
    for w in ctx.preemptible_running():
        if w.pods == 1 and w.placements:
            on_node.setdefault(w.placements[0].node, []).append(w)
    tried: set[tuple] = set()
    for c in failed:
        if c.code != Code.FRAGMENTED or c.w.pods != 1 or c.req.num_gpus == 0:
            left.append(c)
            continue
        if pipeline(ctx, c, hold=entitled(ctx, c)):
            continue
        key = (c.shape, ctx.future_version)
        if key in tried or not _consolidate_one(ctx, c, on_node):
            tried.add(key)
            left.append(c)
    return left


def _fits_back(ctx: Cycle, v: Workload) -> bool:
    """Does ``v``'s current placement still fit the future view (it need not move)?"""
    fut = ctx.future
    cpu = int(round(v.cpu * MILLI))
    for p in v.placements:
        n = fut.index.get(p.node)
        if n is None or fut.cpu_free[n] < cpu or fut.mem_free[n] < v.memory:
            return False
        if any(fut.gpu_free[n, g] < p.milli for g in p.gpus):
            return False
    return True


def _consolidate_one(ctx: Cycle, c: Candidate, on_node: dict[str, list[Workload]]) -> bool:
    fut = ctx.future
    need = c.amount[0]
    nodes = []
    for name, movers in on_node.items():
        n = fut.index[name]
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        movers = [v for v in movers if v.id not in ctx.evicted]
        room = fut.gpu_free[n].sum() / MILLI + sum(ctx.amounts[v.id][0] for v in movers)
        if movers and room + EPS >= need:
            nodes.append((-float(fut.gpu_free[n].sum()), name, n, movers))
    for _, name, n, movers in sorted(nodes):
        only_n = np.zeros(len(fut.nodes), dtype=bool)
        only_n[n] = True
        st = Statement(ctx, fut)
        chosen: list[Workload] = []
        placed = None
        for v in sorted(movers, key=lambda v: (ctx.victim_cost(v), v.priority, v.id)):
            st.remove(v, v.placements)
            chosen.append(v)
            placed = ctx.place(c.restricted(only_n), st)
            if placed is not None:
                break
            placed = None
        if placed is None:
            st.rollback()
            continue
        for v in list(reversed(chosen)):  # a workload whose place is still free need not move
            if _fits_back(ctx, v):
                st.place(v, v.placements)
                chosen.remove(v)
        moves: list[tuple[Workload, tuple[PodPlacement, ...]]] = []
        for v in chosen:  # every moved workload must fit somewhere (another GPU of n included)
            dest = ctx.place(ctx.candidate(v), st)
            if dest is None:
                break
            moves.append((v, dest))
        if not moves or len(moves) < len(chosen):
            st.rollback()
            continue
        st.claim(c.w, need)
        for v, dest in moves:
            st.claim(v, ctx.amounts[v.id][0])
            st.evict(v, Evict(v.id, Cause.CONSOLIDATION.value, (
                f"preempted: moved to make room for {c.w.id} ({need:g} GPUs on one node); restarts from "
                f"its checkpoint"), c.w.id))
            st.reserve(ctx.reservation_for(ctx.candidate(v), dest, Code.RELEASING, need=ctx.amounts[v.id][0],
                                           grace=ctx.cfg.preemption_grace))
        detail = {"moved": len(moves), "node": name}
        st.reserve(ctx.reservation_for(c, placed, Code.CONSOLIDATING, **detail))
        st.commit()
        ctx.wait(c, Code.CONSOLIDATING, detail)
        return True
    return False
