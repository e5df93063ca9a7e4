"""The actions of a scheduling cycle, one module each, all with one signature:
``action(ctx: Cycle, failed: list[Candidate]) -> list[Candidate]`` (the candidates still waiting).

``allocate`` runs first (it takes no ``failed`` list of its own and produces one); the others try
to make room for what allocate could not place: ``consolidate`` (move workloads to open a node),
``reclaim`` (take borrowed capacity back for a queue below its fair share) and ``preempt``
(higher priority within a queue). Every move goes through a ``Statement``.

The ``failed`` list is in allocate's order (``Candidate.seq``) and every action keeps that order
in what it returns. An entry may stand for a group of workloads of one queue and request that
failed alike (``Candidate.more``); an action that tries candidates one by one expands the groups
it touches (``cycle.expand``) and leaves the others whole.
"""
from __future__ import annotations

from ..cycle import Candidate, Cycle, Statement
from ..fairshare import EPS
from ..reasons import Code


def entitled(ctx: Cycle, c: Candidate) -> bool:
    """Does ``c`` keep its queue, at every level, within its fair share (which is never below its
    guarantee)?"""
    amt = c.amount[0]
    for x in ctx.tree.path(c.w.queue):
        if ctx.held(x) + amt > ctx.fair[x].get("gpu", 0.0) + EPS:
            return False
    return True


def pipeline(ctx: Cycle, c: Candidate, hold: bool = True) -> bool:
    """If ``c`` fits once releasing workloads have stopped, plan it there and say so; with
    ``hold``, reserve that room for it across cycles."""
    key = (c.shape, ctx.future_version)
    if key in ctx.no_room:
        return False
    # a gang is probed first (a probe takes the first node that fits; a placement scores them
    # all); one pod is placed straight away: its placement fails exactly where a probe would, on
    # a node list with none that fits, and changes nothing then
    if c.w.pods > 1 and not ctx.fits(c):
        ctx.no_room.add(key)
        return False
    st = Statement(ctx, ctx.future)
    placements = ctx.place(c, st)
    if placements is None:
        ctx.no_room.add(key)
        return False
    detail = {"need": c.amount[0], "grace": ctx.cfg.preemption_grace}
    st.claim(c.w, c.amount[0])
    if hold:
        st.reserve(ctx.reservation_for(c, placements, Code.RELEASING, **detail))
    st.commit()
    ctx.wait(c, Code.RELEASING, detail)
    return True
