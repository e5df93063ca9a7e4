"""preempt: within a queue, a higher-priority workload preempts lower-priority preemptible ones.

Not in a queue above its fair share while reclaim is under way (another queue below its fair
share waits, or reclaimed this cycle), nor a swap that would take its queue above its fair share
then (a preemptor larger than its victims takes idle capacity too): the swap would start a
workload on a loan that is being recalled, and it would be preempted again at once.

At the queue's limit too: the victims free the headroom the preemptor needs, so a plan must give
back at least what the preemptor would take beyond the limit.

Combined: when the lower-priority workloads of its queue are not enough, and with them gone the
preemptor keeps its queue within its guarantee, the rest may come from borrowers of other queues
by the reclaim rules (``plan.ReclaimBudget``), in one statement: the fewest of its own lower-priority
workloads (cheapest first) that let a reclaim plan fit.
"""
from __future__ import annotations

from ..cycle import SEQ, Candidate, Cycle, Statement, expand
from ..fairshare import EPS
from ..model import Evict, Workload
from ..plan import MAX_ATTEMPTS, Budget, ReclaimBudget, make_room, plan
from ..reasons import Cause, Code
from ..victims import victim_key
from . import pipeline


def _limit_need(ctx: Cycle, c: Candidate) -> float | None:
    """GPUs the victims must give back for ``c`` to fit under every limit on its path (None:
    a CPU or memory limit blocks it, which preempting for GPUs cannot fix)."""
    need = 0.0
    amt = c.amount[0]
    for q in ctx.tree.path(c.w.queue):
        lim = ctx.tree.queues[q].limit.get("gpu")
        if lim is not None:
            need = max(need, ctx.held(q) + amt - lim)
    if ctx.quota_block(c, freed=float("inf")) is not None:
        return None
    return need


def preempt(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    left: list[Candidate] = []
    ev = ctx.evicted
    by_queue = {q: live for q, vs in ctx.preemptible_by_queue().items() if (live := [v for v in vs if v.id not in ev])}
    lowest = {q: min(v.priority for v in vs) for q, vs in by_queue.items()}
    tried: set[tuple] = set()
    # reclaim pressure: a queue below its fair share still waits, or reclaimed this cycle
    pressure = any(e.cause == Cause.RECLAIM.value for e in ctx.result.evictions) or any(
        not c.quota_bound and c.amount[0] > 0 and ctx.over(c.w.queue) < -EPS for c in failed)
    # candidates none of whose workloads may preempt wait on as they are (groups too); the others
    # are tried one by one, in order
    todo: list[Candidate] = []
    for c in failed:
        low = lowest.get(c.w.queue)  # (a group's top priority is worked out once, and only if asked)
        if (c.code in (Code.NON_PREEMPTIBLE, Code.BEHIND) or (c.amount[0] <= 0 and c.amount[1] <= 0)
                or low is None or low >= c.top_priority):
            left.append(c)
        else:
            todo.append(c)
    if not todo:
        return left
    if any(c.more for c in todo):
        todo = expand(todo)
    for c in todo:
        w = c.w
        if (lowest.get(w.queue, w.priority) >= w.priority
                or (pressure and ctx.over(w.queue) > EPS)):
            left.append(c)  # (a borrowing queue swaps nothing while its loans are being recalled)
            continue
        need_freed = 0.0
        if c.code == Code.LIMIT:
            need = _limit_need(ctx, c)
            if need is None:
                left.append(c)
                continue
            need_freed = need
        elif pipeline(ctx, c):
            continue
        key = (c.shape, w.queue, w.priority)
        if key in tried:
            left.append(c)
            continue
        cands = [v for v in by_queue[w.queue] if v.priority < w.priority and v.id not in ctx.evicted]
        found = plan(ctx, c, cands, Budget(), need_freed) if cands else None
        if found is not None and pressure:
            # a swap that takes its queue above its fair share (the preemptor is larger than its
            # victims, the rest idle) waits while reclaim is under way: the rest is another
            # queue's, and it would be reclaimed at once
            gain = c.amount[0] - sum(ctx.amounts[v.id][0] for v in found[0])
            if ctx.over(w.queue, gain) > EPS:
                found = None
        if found is None and cands and c.code != Code.LIMIT and _combined(ctx, c, cands):
            continue
        if found is None:
            tried.add(key)
            left.append(c)
            continue
        opened = make_room(ctx, c, *found)
        if opened is None:
            left.append(c)
            continue
        st, placements = opened
        victims = found[0]
        for v in victims:
            st.evict(v, _priority_evict(v, w))
        st.reserve(ctx.reservation_for(c, placements, Code.PREEMPTING))
        st.commit()
        ctx.wait(c, Code.PREEMPTING)
    left.sort(key=SEQ)
    return left


def _combined(ctx: Cycle, c: Candidate, own: list[Workload]) -> bool:
    """Preempt lower-priority workloads of ``c``'s queue and reclaim the rest from other queues'
    borrowers, in one statement (module doc). True when a plan was made and committed."""
    w = c.w
    t = ctx.now_t
    own = sorted(own, key=lambda v: victim_key(v, t, ctx.amounts[v.id][0]))
    others = [v for v in ctx.preemptible_running() if v.queue != w.queue]
    if not others:
        return False
    amt = c.amount[0]
    for k in range(1, min(len(own), MAX_ATTEMPTS) + 1):
        st = Statement(ctx, ctx.future)
        for v in own[:k]:
            st.remove(v, v.placements)
            st.evict(v, _priority_evict(v, w))
        found = None
        # only within its guarantee once its own victims are gone: a borrower swapping by priority
        # takes no other borrower's GPUs (two borrowing queues would take them back and forth)
        if ctx.held(w.queue) + amt <= ctx.guar[w.queue] + EPS:
            budget = ReclaimBudget(ctx, w.queue, amt, back=sum(ctx.amounts[v.id][0] for v in own[:k]))
            sides = {v.queue for v in others if budget.candidate_side(v.queue)}
            found = plan(ctx, c, None, budget, queues=sides) if sides else None
        if found is None:
            st.rollback()
            continue
        reclaimed = found[0]
        opened = make_room(ctx, c, reclaimed, found[1], st)
        if opened is None:  # cannot happen: the plan was probed (make_room rolled everything back)
            return False
        placements = opened[1]
        for v in reclaimed:
            st.evict(v, Evict(v.id, Cause.RECLAIM.value, (
                f"preempted: reclaimed by queue {w.queue} for its higher-priority {w.kind} workload {w.id}, "
                f"which also preempts lower-priority workloads of its own queue"), w.id))
        st.reserve(ctx.reservation_for(c, placements, Code.PREEMPTING))
        st.commit()
        ctx.wait(c, Code.PREEMPTING)
        return True
    return False


def _priority_evict(v: Workload, w: Workload) -> Evict:
    return Evict(v.id, Cause.PRIORITY.value, (
        f"preempted: higher-priority {w.kind} workload {w.id} (priority {w.priority}) needs the GPUs "
        f"in queue {w.queue}"), w.id)
