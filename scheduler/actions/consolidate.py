"""consolidate: a pending workload that fits the free GPUs in total but not in its shape (no one
node, or no one GPU, has room for a pod): move preemptible single-pod workloads (checkpoint,
restart elsewhere, possibly on another GPU of the same node) to open room for it.

A borrower (a workload that would take its queue above its fair share) is consolidated for only
when no entitled workload waits for capacity this cycle, nor one that reclaim will try for (its
queue has room below its fair share for it): otherwise the room would go to a loan that the
reclaim recalls at once. And only by moving workloads that run on
a loan too (their queue above its deserved quota): a guaranteed workload is not disturbed for a
loan. The moved workloads and the workload they make room
for hold their planned places until they bind (reservations), so the move happens once.

A workload that a waiting higher-priority workload of its own queue may preempt is never moved
(it would be evicted twice in a row), nor one that bound into a planned place within the last two
grace periods (it was just moved, or just started after a preemption). A single-pod workload is planned node by node: on each node the fewest movers, losing the least
work, whose departure lets it fit there (two greedy orders, cheapest and largest first, each
pruned); the best node wins. A gang, only when it is entitled, is planned over the whole
cluster the same way.
"""
from __future__ import annotations

import numpy as np

from ..cycle import Candidate, Cycle, Statement, expand, fits_on
from ..fairshare import EPS
from ..model import MILLI, Evict, PodPlacement, Workload
from ..reasons import Cause, Code
from . import entitled, pipeline

MAX_GANG_MOVERS = 64  # movers considered for one gang (the least costly, on the emptiest nodes)


def consolidate(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    if not any(c.code == Code.FRAGMENTED for c in failed):
        return failed
    failed = expand(failed)  # one by one from here
    left: list[Candidate] = []
    # a workload that a waiting higher-priority workload of its own queue may preempt is not moved:
    # it would be evicted twice in a row
    waiting: dict[str, int] = {}
    for c in failed:
        waiting[c.w.queue] = max(waiting.get(c.w.queue, c.w.priority), c.w.priority)
    movers: list[Workload] = [w for w in ctx.preemptible_running() if w.pods == 1 and w.placements
                              and w.priority >= waiting.get(w.queue, w.priority) and w.id not in ctx.settling]
    on_node: dict[int, list[Workload]] = {}
    for w in movers:
        n = ctx.future.index.get(w.placements[0].node)
        if n is not None:
            on_node.setdefault(n, []).append(w)
    tried: set[tuple] = set()
    verdicts: dict[tuple, bool] = {}  # (queue, amount) -> entitled

    def is_owed(c: Candidate) -> bool:
        k = (c.w.queue, c.amount[0])
        hit = verdicts.get(k)
        if hit is None:
            hit = verdicts[k] = entitled(ctx, c)
        return hit

    owed = {id(c) for c in failed if c.code in (Code.FRAGMENTED, Code.CAPACITY) and c.amount[0] > 0
            and is_owed(c)}
    # a workload that reclaim will try for (its queue has the headroom below its fair share) may
    # take back what a borrower's consolidation would start on: no consolidation for borrowers then
    reclaiming = any(c.code in (Code.FRAGMENTED, Code.CAPACITY) and 0 < c.amount[0] <= -ctx.over(c.w.queue) + EPS
                     for c in failed)
    for c in failed:
        if (c.code != Code.FRAGMENTED or c.req.num_gpus == 0 or ((owed or reclaiming) and id(c) not in owed)
                or (c.w.pods > 1 and id(c) not in owed)):  # a borrowing gang waits for room in its shape
            left.append(c)
            continue
        if pipeline(ctx, c, hold=id(c) in owed):
            continue
        lender = id(c) not in owed  # a borrower moves only other borrowers' workloads
        key = (c.shape, ctx.future_version, lender)
        if key in tried or not _consolidate_one(ctx, c, _borrowed(ctx, on_node) if lender else on_node):
            tried.add(key)
            left.append(c)
    return left


def _borrowed(ctx: Cycle, on_node: dict[int, list[Workload]]) -> dict[int, list[Workload]]:
    """The movers whose queue holds more than its guarantee (they run on a loan too)."""
    over = {}
    out: dict[int, list[Workload]] = {}
    for n, vs in on_node.items():
        keep = []
        for v in vs:
            o = over.get(v.queue)
            if o is None:
                o = over[v.queue] = ctx.effective(v.queue)[0] > ctx.guar[v.queue] + EPS
            if o:
                keep.append(v)
        if keep:
            out[n] = keep
    return out


def _cost(ctx: Cycle, chosen: list[Workload]) -> tuple:
    return (round(sum(ctx.victim_cost(v) for v in chosen), 6), len(chosen))


def _fewest(ctx: Cycle, st: Statement, cands: list[Workload], fits) -> list[Workload] | None:
    """The fewest movers, losing the least work, whose removal from ``st``'s view makes ``fits()``
    true (two greedy orders, each pruned). Nothing changes."""
    best = None
    cheapest = sorted(cands, key=lambda v: (ctx.victim_cost(v), v.priority, v.id))
    largest = sorted(cands, key=lambda v: (-ctx.amounts[v.id][0], ctx.victim_cost(v), v.id))
    for order in (cheapest, largest):
        mark = st.mark()
        chosen: list[Workload] = []
        for v in order:
            st.remove(v, v.placements)
            chosen.append(v)
            if fits():
                break
        else:
            st.rollback(mark)
            continue
        for v in list(reversed(chosen)):  # prune: a mover the plan does not need stays
            m = st.mark()
            st.place(v, v.placements)
            if fits():
                chosen.remove(v)
            else:
                st.rollback(m)
        st.rollback(mark)
        if best is None or _cost(ctx, chosen) < _cost(ctx, best):
            best = chosen
    return best


def _consolidate_one(ctx: Cycle, c: Candidate, on_node: dict[int, list[Workload]]) -> bool:
    fut = ctx.future
    st = Statement(ctx, fut)
    if c.w.pods > 1:
        pool = [v for n, vs in on_node.items() if fut.schedulable[n] for v in vs if v.id not in ctx.evicted]
        pool.sort(key=lambda v: (-int(fut.gpu_free[fut.index[v.placements[0].node]].sum()), ctx.victim_cost(v), v.id))
        chosen = _fewest(ctx, st, pool[:MAX_GANG_MOVERS], lambda: ctx.fits(c))
        return chosen is not None and _carry_out(ctx, st, c, chosen, None, "the cluster")
    need = c.amount[0]
    plans = []
    for n, movers in on_node.items():
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        movers = [v for v in movers if v.id not in ctx.evicted]
        room = fut.gpu_free[n].sum() / MILLI + sum(ctx.amounts[v.id][0] for v in movers)
        if not movers or room + EPS < need:
            continue
        chosen = _fewest(ctx, st, movers, lambda n=n: fits_on(fut, n, c.req))
        if chosen:
            plans.append((_cost(ctx, chosen), fut.nodes[n].name, n, chosen))
    for _, name, n, chosen in sorted(plans, key=lambda p: p[:2]):
        only_n = np.zeros(len(fut.nodes), dtype=bool)
        only_n[n] = True
        if _carry_out(ctx, st, c, chosen, only_n, f"node {name}"):
            return True
    return False


def _carry_out(ctx: Cycle, st: Statement, c: Candidate, chosen: list[Workload], mask: np.ndarray | None,
               where: str) -> bool:
    """Move ``chosen`` so that ``c`` fits (within ``mask``); every mover must fit somewhere
    (another GPU of the same node included). Commits and returns True, or changes nothing."""
    for v in chosen:
        st.remove(v, v.placements)
    placed = ctx.place(c.restricted(mask), st)
    moves: list[tuple[Workload, tuple[PodPlacement, ...]]] = []
    if placed is not None:
        for v in chosen:
            dest = ctx.place(ctx.candidate(v), st)
            if dest is None:
                break
            moves.append((v, dest))
    if placed is None or not moves or len(moves) < len(chosen):
        st.rollback()
        return False
    need = c.amount[0]
    st.claim(c.w, need)
    for v, dest in moves:
        st.claim(v, ctx.amounts[v.id][0])
        st.evict(v, Evict(v.id, Cause.CONSOLIDATION.value, (
            f"preempted: moved to make room for {c.w.id} ({need:g} GPUs in its shape); restarts from "
            f"its checkpoint"), c.w.id))
        st.reserve(ctx.reservation_for(ctx.candidate(v), dest, Code.RELEASING, need=ctx.amounts[v.id][0],
                                       grace=ctx.cfg.preemption_grace))
    detail = {"moved": len(moves), "node": where}
    st.reserve(ctx.reservation_for(c, placed, Code.CONSOLIDATING, **detail))
    st.commit()
    ctx.wait(c, Code.CONSOLIDATING, detail)
    return True
