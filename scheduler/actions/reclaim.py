"""reclaim: a queue below its fair share takes back borrowed capacity.

Queues are compared where their ancestries split; ``plan.ReclaimBudget`` says which borrowers may
go (no ping-pong). A reclaimer whose victims are chosen reserves the capacity it counts on (idle
now and being released) until it binds: see docs/scheduling.md, "Reservations".
"""
from __future__ import annotations

from ..cycle import SEQ, Candidate, Cycle, expand
from ..fairshare import EPS
from ..model import Evict, Workload
from ..plan import ReclaimBudget, make_room, plan
from ..reasons import Cause, Code
from . import pipeline


def reclaim(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]:
    protected: list[Workload] = []
    pool: dict[str, list[Workload]] = {}
    for v in ctx.preemptible_running(protected):
        pool.setdefault(v.queue, []).append(v)
    tried: dict[tuple, tuple | None] = {}  # (shape, queue) that found no victims -> why not
    headroom: dict[str, float] = {}  # GPUs a queue may still take up to its fair share
    groups: dict[str, list[Candidate]] = {}
    for c in failed:
        groups.setdefault(c.w.queue, []).append(c)
    todo: list[Candidate] = []
    below: set[str] = set()  # queues below their fair share: their candidates are tried one by one
    shares: dict[str, dict | None] = {}
    for q, lst in groups.items():
        headroom[q] = -ctx.over(q)
        if headroom[q] > EPS:
            below.add(q)
            todo.extend(expand(lst))
            continue
        _above_share(ctx, q, lst, shares)  # at or above its fair share: nothing to reclaim for q
    planned: set[int] = set()  # candidates taken out of the list (a plan in motion)
    smallest: dict[str, float] = {}  # the smallest GPU request of each queue's candidates
    for c in todo:
        if not c.quota_bound and c.amount[0] > 0:
            q = c.w.queue
            smallest[q] = min(smallest.get(q, c.amount[0]), c.amount[0])
    overshot: set[str] = set()  # queues that tried a workload larger than the gap to their share
    for c in todo:
        w = c.w
        q = w.queue
        room = headroom[q]
        amt = c.amount[0]
        if c.quota_bound or amt <= 0 or room <= EPS:
            # quota-bound, or its queue already holds its fair share
            if room <= EPS:
                _above_share(ctx, q, [c], shares)
            continue
        if ctx.limited[q]:  # a plan made earlier in this action may have taken the room under a limit
            block = ctx.quota_block(c)
            if block is not None:
                c.code, c.detail = block
                continue
        if amt > room + EPS:
            # larger than the gap to its fair share: a queue below its guarantee may still run a
            # workload of the smallest size it asks for (once a cycle; the budget judges the move)
            if (q in overshot or amt > smallest[q] + EPS
                    or ctx.held(q) >= ctx.guar[q] - EPS):
                _above_share(ctx, q, [c], shares)
                continue
            overshot.add(q)
        if pipeline(ctx, c):
            headroom[q] = room - amt
            planned.add(id(c))
            continue
        key = (c.shape, w.queue)
        if key in tried:
            if tried[key]:
                c.code, c.detail = tried[key]
            continue
        budget = ReclaimBudget(ctx, w.queue, amt)
        sides = budget.candidate_queues(pool)
        found = plan(ctx, c, None, budget, queues=sides) if sides else None
        if found is None:
            why = _why_not(ctx, c, budget, sides, protected)
            tried[key] = why
            if why:
                c.code, c.detail = why
            continue
        opened = make_room(ctx, c, *found)
        if opened is None:
            continue
        st, placements = opened
        victims = found[0]
        fair = ctx.fair[w.queue].get("gpu", 0.0)
        for v in victims:
            ap, _, held, guar = budget.sides[v.queue][:4]
            st.evict(v, Evict(v.id, Cause.RECLAIM.value, (
                f"preempted: reclaimed by queue {w.queue}, which is below its fair share ({fair:g} GPUs); "
                f"{ap} holds {held:g} GPUs (guaranteed {guar:g}, fair share {ctx.fair[ap].get('gpu', 0.0):g})"),
                w.id))
        st.reserve(ctx.reservation_for(c, placements, Code.RECLAIMING, need=amt))
        st.commit()
        headroom[w.queue] = room - amt
        planned.add(id(c))
        ctx.wait(c, Code.RECLAIMING, {"need": amt})
    # the others wait on, in the order they came (the order every action keeps)
    if not todo:
        return failed
    left = [c for c in failed if c.w.queue not in below]
    left.extend(c for c in todo if id(c) not in planned)
    left.sort(key=SEQ)
    return left


def _above_share(ctx: Cycle, q: str, cands: list[Candidate], shares: dict[str, tuple]) -> None:
    """Say that these candidates of ``q`` wait for idle capacity because reclaiming would take
    their queue above its fair share (for a plain capacity shortage; other reasons stay).
    ``shares`` caches the numbers per queue for the action."""
    if q not in shares:
        held, fair = ctx.held(q), ctx.fair[q].get("gpu", 0.0)
        detail = None if held <= EPS and fair <= EPS else {
            "held": held, "fair": fair, "overcommitted": fair + EPS < ctx.tree.queues[q].deserved.get("gpu", 0.0)}
        code = Code.FAIR_SHARE
        plain = ctx.fair_plain[q].get("gpu", 0.0) if ctx.fair_plain is not None else fair
        if detail is not None and plain > fair + EPS:  # fairness over time lowered its share
            code = Code.FAIR_SHARE_USAGE
            detail.update(plain=plain, usage=ctx.usage.get(q, 0.0))
        shares[q] = (code, detail)
    code, extra = shares[q]
    if extra is None:
        return
    # one merged detail per shared detail (candidates of one shape share theirs); the original is
    # kept in the value so that its id cannot be reused while this runs
    merged: dict[int, tuple[dict, dict]] = {}
    for c in cands:
        if c.code is Code.CAPACITY and c.amount[0] > 0:
            hit = merged.get(id(c.detail))
            if hit is None:
                hit = merged[id(c.detail)] = (c.detail, {**c.detail, **extra})
            c.code, c.detail = code, hit[1]


def _why_not(ctx: Cycle, c: Candidate, budget: ReclaimBudget, sides: set[str],
             protected: list[Workload]) -> tuple | None:
    """The reason a reclaim found no victims, when there is one more precise than capacity."""
    if budget.refused:
        q = c.w.queue
        return Code.RECLAIM_REFUSED, {**c.detail, **budget.why, "queue_held": ctx.held(q),
                                      "queue_fair": ctx.fair[q].get("gpu", 0.0)}
    young = [v for v in protected if v.queue != c.w.queue and budget.candidate_side(v.queue)]
    if not young:
        return None
    cands = [v for v in ctx.preemptible_running() if v.queue in sides] + young
    if plan(ctx, c, cands, ReclaimBudget(ctx, c.w.queue, c.amount[0])) is not None:
        return Code.MIN_RUNTIME, {**c.detail, "min_runtime": ctx.cfg.min_runtime}
    return None
