"""allocate: bind pending workloads where they fit now.

Holders of reservations go first, into the capacity held for them. Then two passes. The first
binds only workloads that keep their queue, at every level, within its fair share; the second
lends what is still idle to the rest (work-conserving borrowing). Once a workload that may preempt
lower-priority ones of its queue fails to fit, the lower-priority workloads of that queue wait
for this cycle (they would bind into what the preemption frees, and be preempted next). In each pass queues are served
in ``queue_order`` (a workload that keeps its queue within deserved first, then furthest below
fair share), and within a queue by priority, then submit time.
"""
from __future__ import annotations

import dataclasses
import heapq
import operator

import numpy as np

from .. import cycle
from ..cluster import FreeRows, fits_placements
from ..cycle import SINCE, Candidate, Cycle, Statement, fits_on, queue_order
from ..fairshare import EPS
from ..model import MILLI, Phase, Workload
from ..reasons import Code
from ..waiting import by_queue, facts_of, raw_key


_ID = operator.attrgetter("id")


def allocate(ctx: Cycle, failed: list[Candidate] | None = None) -> list[Candidate]:
    book = ctx.waiting
    if book.lists is not None and ctx.pending is book.pending:  # each queue in order, kept
        # (the lists are only read; ``_leave_out`` copies those it cuts)
        queues, facts = dict(book.lists), dict(book.facts)
        ctx.result.positions = ctx._positions = book.positions.copy()
    elif book.lists is not None:  # some of a kept book's workloads (a round of a node pool's cycle)
        # each queue's of them in the book's order, found by the ids its order keys end with
        # (``order_key``: the workloads are not read again), with their places among them
        want = set(map(_ID, ctx.pending))
        queues, facts = {}, {}
        positions = ctx.result.positions
        for q, keys in book.keys.items():
            at = [i for i, k in enumerate(keys) if k[2] in want]
            if at:
                lst, fl = book.lists[q], book.facts[q]
                queues[q] = [lst[i] for i in at]
                facts[q] = [fl[i] for i in at]
                positions.update(zip([keys[i][2] for i in at], range(1, len(at) + 1)))
    else:
        queues = by_queue(ctx.pending)
        by_request = book.by_request  # (ctx.pending: the book's workloads, or some of them)
        facts = {q: facts_of(lst, by_request) for q, lst in queues.items()}
        positions = ctx.result.positions
        for lst in queues.values():
            positions.update(zip(map(_ID, lst), range(1, len(lst) + 1)))
    if ctx.reservations:
        holders = [ctx.by_id[wid] for wid in ctx.reservations]
        if "holders-tried" not in ctx.cache:  # a later round of a node pool's cycle: done already
            ctx.cache["holders-tried"] = True
            _bind_holders(ctx)
        _leave_out(queues, facts, holders, ctx._positions)
    failed: list[Candidate] = []
    deferred: dict[str, list[Workload]] = {}
    deferred_facts: dict[str, list[tuple]] = {}
    groups: dict[str, dict[tuple, Candidate]] = {}
    _allocate_pass(ctx, queues, facts, failed, (deferred, deferred_facts), groups)
    _allocate_pass(ctx, deferred, deferred_facts, failed, None, groups)
    return failed


def _leave_out(queues: dict[str, list[Workload]], facts: dict[str, list[tuple]], holders: list[Workload],
               positions: dict[str, int]) -> None:
    """Take ``holders`` (their own reservations bind them) out of their queues' lists (and the
    facts beside them), found by their positions (every workload of the lists has one; a queue
    where a holder is not at its position is filtered whole)."""
    at: dict[str, list[int] | None] = {}
    for w in holders:
        q = w.queue
        lst = queues.get(q)
        i = positions.get(w.id, 0) - 1
        if lst is None or i < 0 or (q in at and at[q] is None):
            continue  # (no position: in no list)
        if i < len(lst) and lst[i] is w:
            at.setdefault(q, []).append(i)
        else:
            at[q] = None
    gone = None
    for q, idx in at.items():
        lst, fl = queues[q], facts[q]
        if idx is None:
            if gone is None:
                gone = {w.id for w in holders}
            idx = [i for i, w in enumerate(lst) if w.id in gone]
        lst, fl = queues[q], facts[q] = lst[:], fl[:]  # (the lists may be shared with the caller's)
        for i in sorted(idx, reverse=True):
            del lst[i], fl[i]


def _bind_holders(ctx: Cycle) -> None:
    """Bind each pending holder into what is held for it, once its victims have released it
    (or anywhere else it fits now: a cheap probe first, since most holders still wait)."""
    now = ctx.now
    # Single-pod shapes that fitted nowhere in the now view. Capacity in the now view only shrinks
    # during this loop, except on the nodes a holder's own holds give back while it is tried (and
    # where a holder that bound elsewhere held: then this is forgotten): a later holder of such a
    # shape can only fit on the nodes of its own reservation.
    nowhere: set[tuple] = set()
    rows = FreeRows(now)  # the probes read the now view as lists (kept in step through its log)
    todo = []
    by_id = ctx.by_id
    shapes: dict[tuple, _Shape] = {}
    held = ctx.reservations.values()  # (a copy: binding takes a holder's reservation out)
    for r in (list(held) if ctx.reservations_in_order else sorted(held, key=SINCE)):  # (one per holder)
        w = by_id[r.workload]
        if w.phase is Phase.PENDING:  # (else moved by consolidation and still releasing: its new place stays held)
            key = raw_key(w)
            s = shapes.get(key)
            if s is None:
                s = shapes[key] = _Shape(ctx, w, key[5] if len(key) > 5 else ())
            todo.append((w, r, s))
    # the first probes of every single-pod holder at once, on the now view as it is before any
    # binds; a holder whose node a bind or a hold changed since is probed on its own
    own = _own_node_fits(ctx, [h for h in todo if h[0].pods == 1]) if cycle.SHORTCUTS else {}
    seen, touched = len(now.log), set()
    for w, r, s in todo:
        wid = w.id
        c = None  # its candidate, made once needed (most holders only wait)
        if w.pods == 1 and cycle.SHORTCUTS:
            if len(now.log) > seen:
                touched.update(now.log[seen:])
                seen = len(now.log)
            hit = own.get(wid)
            if hit is None or hit[0] in touched:
                c = ctx.candidate(w)
                could = _could_bind(ctx, c, r, nowhere, rows)
            elif not hit[1] and s.shape in nowhere:
                could = False  # (what ``_fits_elsewhere`` answers first; quota need not be asked)
            else:
                c = ctx.candidate(w)
                could = ctx.quota_block(c) is None and (hit[1] or _fits_elsewhere(ctx, c, nowhere))
            if not could:
                ctx.wait(w, r.code, r.detail)  # what giving its holds back and taking them again would end in
                continue
        if c is None:
            c = ctx.candidate(w)
        ctx.unhold(wid)
        placed = None
        st = Statement(ctx, now)
        if ctx.quota_block(c) is None:
            if now.fits_placements(r.placements, w):  # its victims have released
                st.place(w, r.placements)
                placed = r.placements
            elif w.pods > 1 or c.shape not in nowhere:
                if ctx.fits(c, now):
                    placed = ctx.place(c, st)
                elif w.pods == 1 and cycle.SHORTCUTS:
                    nowhere.add(c.shape)
            elif _fits_on_any(ctx, c, {now.index[p.node] for p in r.placements}):
                placed = ctx.place(c, st)
        if placed is None:
            ctx.rehold(wid)
            ctx.wait(w, r.code, r.detail)
            continue
        st.commit()
        if placed is not r.placements:
            nowhere.clear()  # what it held where it was planned is free now
        for p in r.placements:  # the planned place gives way to the real one
            ctx.future.give_placement(p, w)
        ctx.future_place(w, placed)
        ctx._claim(w.queue, -c.amount[0])  # the claim becomes an allocation
        ctx.settling[wid] = dataclasses.replace(ctx.reservations.pop(wid), bound_at=ctx.now_t)
        ctx.bind(c, placed)


class _Shape:
    """What the holders of one shape share for their probes: the request, the nodes they may run
    on (None: any) and ``Candidate.shape``."""

    __slots__ = ("req", "mask", "shape")

    def __init__(self, ctx: Cycle, w: Workload, selector: tuple):
        self.req, self.mask = ctx.request(w), ctx.mask(w.node_selector)
        self.shape = (self.req, w.pods, selector)


def _could_bind(ctx: Cycle, c: Candidate, r, nowhere: set[tuple], rows: FreeRows) -> bool:
    """Would ``_bind_holders`` bind this single-pod holder, its holds given back? Worked out
    without giving them back (most holders still wait: giving back and taking again what they
    hold would be most of the action's cost); records a shape that fits nowhere as it would."""
    if ctx.quota_block(c) is not None:
        return False
    return _fits_own_node(ctx, c, r, rows) or _fits_elsewhere(ctx, c, nowhere)


def _fits_own_node(ctx: Cycle, c: Candidate, r, rows: FreeRows) -> bool:
    """Would this single-pod holder fit where it is planned, or elsewhere on the nodes of its
    reservation, with what it holds itself given back? (Probed on the list rows, which are put
    back as they were.)"""
    now, w = ctx.now, c.w
    holds = ctx.holds.get(w.id, ())
    rows.sync()
    _give_back(rows, holds, 1)
    try:
        if fits_placements(rows, r.placements, w):
            return True
        for n in {now.index[p.node] for p in r.placements}:
            if rows.schedulable[n] and (c.mask is None or c.mask[n]) and rows.fits_on(n, c.req, now.milli_on(n, c.req)):
                return True
        return False
    finally:
        _give_back(rows, holds, -1)


def _fits_elsewhere(ctx: Cycle, c: Candidate, nowhere: set[tuple]) -> bool:
    """``_could_bind``'s last probe: does ``c`` fit anywhere in the now view as it is (the nodes of
    its reservation were tried with its holds)? A shape that fits nowhere is recorded."""
    if c.shape in nowhere:
        return False
    if ctx.fits(c, ctx.now):
        return True
    nowhere.add(c.shape)
    return False


def _own_node_fits(ctx: Cycle, holders: list) -> dict[str, tuple[int, bool]]:
    """``_fits_own_node`` for many single-pod holders (workload, reservation, and its ``_Shape``
    or candidate: their request and mask are read) at once, on the now view as it is: would each
    fit where it is planned, or elsewhere on that node, with what it holds itself given back?
    Holder id -> (the node, the answer); a holder whose reservation is not one placement on a
    known node is left out."""
    now = ctx.now
    index, num_gpus = now.index, now.num_gpus.tolist()
    keep, nodes, pm, cpu, mem, k3, m3, where_ok = [], [], [], [], [], [], [], []
    pi, pg, hi, hg, hv, ch, mh = [], [], [], [], [], [], []
    bad: list[int] = []
    for w, r, c in holders:
        if len(r.placements) != 1:
            continue
        p = r.placements[0]
        n = index.get(p.node)
        if n is None:
            continue
        j = len(keep)
        keep.append(w.id)
        nodes.append(n)
        pm.append(p.milli)
        req = c.req
        cpu.append(req.cpu_milli)  # a pod's request is the workload's CPU and memory
        mem.append(req.memory)
        k3.append(req.num_gpus)
        m3.append(now.milli_on(n, req) if req.num_gpus else 0)
        where_ok.append(c.mask is None or bool(c.mask[n]))
        for g in p.gpus:
            if g >= num_gpus[n]:
                bad.append(j)
            else:
                pi.append(j)
                pg.append(g)
        c_h = m_h = 0
        for hn, gpus, gh, hc, hm in ctx.holds.get(w.id, ()):
            if hn == n:
                for g, h in zip(gpus, gh):
                    hi.append(j)
                    hg.append(g)
                    hv.append(h)
                c_h += hc
                m_h += hm
        ch.append(c_h)
        mh.append(m_h)
    if not keep:
        return {}
    node = np.array(nodes, dtype=np.int64)
    free = now.gpu_free[node]  # a copy: the own holds are added to it
    if hi:
        np.add.at(free, (np.array(hi), np.array(hg)), np.array(hv, dtype=np.int64))
    cpu_a = now.cpu_free[node] + np.array(ch, dtype=np.int64)
    mem_a = now.mem_free[node] + np.array(mh, dtype=np.int64)
    # (both probes ask the same CPU and memory of the node)
    room = (cpu_a >= np.array(cpu, dtype=np.int64)) & (mem_a >= np.array(mem, dtype=np.int64))
    # where it is planned (``fits_placements`` of its one placement)
    planned = room.copy()
    if pi:
        pi_a = np.array(pi)
        short = free[pi_a, np.array(pg)] < np.array(pm, dtype=np.int64)[pi_a]
        planned[pi_a[short]] = False
    planned[bad] = False
    # elsewhere on that node, where it may run (``FreeRows.fits_on``)
    k = np.array(k3, dtype=np.int64)
    m = np.array(m3, dtype=np.int64)
    gpus_ok = (k == 0) | ((m <= MILLI) & ((free >= m[:, None]).sum(axis=1) >= k))
    on_node = now.schedulable[node] & np.array(where_ok, dtype=bool) & room & gpus_ok
    return dict(zip(keep, zip(nodes, (planned | on_node).tolist())))


def _give_back(rows: FreeRows, holds, sign: int) -> None:
    """Add (``sign`` 1) or take away again (-1) a holder's now-view holds on the lists, for a
    probe: the view itself is not touched."""
    for n, gpus, gh, ch, mh in holds:
        row = rows.gpu_free[n]
        for g, h in zip(gpus, gh):
            row[g] += sign * h
        rows.cpu_free[n] += sign * ch
        rows.mem_free[n] += sign * mh


def _fits_on_any(ctx: Cycle, c: Candidate, nodes: set[int]) -> bool:
    """Does one pod of ``c`` fit on one of ``nodes`` in the now view?"""
    now = ctx.now
    return any(now.schedulable[n] and (c.mask is None or c.mask[n]) and fits_on(now, n, c.req) for n in nodes)


def _maybe_behind(ctx: Cycle, c: Candidate, lowest: dict[str, int]) -> None:
    """If ``c`` could fit by preempting lower-priority workloads of its own queue, those of its
    queue with a lower priority wait this cycle (probed once per queue per cycle)."""
    q, prio = c.w.queue, c.w.priority
    if lowest.get(q, prio) >= prio or q in ctx.probed:
        return
    ctx.probed.add(q)
    st = Statement(ctx, ctx.future)
    for v in ctx.preemptible_by_queue().get(q, ()):
        if v.priority < prio and v.id not in ctx.evicted:
            st.remove(v, v.placements)
    if ctx.fits(c):
        ctx.behind[q] = prio
    st.rollback()


def _same_rank(ctx: Cycle, path: tuple[str, ...], amount: float) -> tuple[float, float]:
    """The interval (lo, hi] of amounts that rank a queue as ``amount`` does: the queue order
    changes with the amount only where it crosses guarantee - held at some level of ``path``."""
    lo, hi = float("-inf"), float("inf")
    for x in path:
        r = ctx.guar[x] + EPS - ctx.effective(x)[0] - ctx.reserved[x]
        if amount > r:
            lo = max(lo, r)
        else:
            hi = min(hi, r)
    return lo, hi


def _allocate_pass(ctx: Cycle, queues: dict[str, list[Workload]], facts: dict[str, list[tuple]],
                   failed: list[Candidate], deferred: tuple[dict, dict] | None,
                   groups: dict[str, dict[tuple, Candidate]]) -> None:
    """One allocate pass over each queue's workloads in order and their ``facts_of`` beside them.
    With ``deferred`` (workloads and facts by queue), workloads that would take their queue above
    its fair share are set aside there instead of tried. Failures are appended to ``failed`` in the order
    tried (``Candidate.seq``); a workload whose request already failed for capacity joins the
    group of its queue and request in ``groups`` (queue -> request -> group; see ``Candidate``).

    A queue keeps its turn through consecutive failures while its next workload ranks as the
    failed one did (the order between queues only changes when something binds, or when the next
    request would take its queue above deserved where the last did not), and a shape that failed to place is not tried again this cycle:
    capacity only shrinks during allocate."""
    key = queue_order(ctx)
    seq = len(failed) + sum(len(c.more) for c in failed if c.more)  # the next place in the order
    heap = [(key(q, facts[q][0][0]), q, 0) for q, lst in queues.items() if lst]
    heapq.heapify(heap)
    dead = ctx.failed_shapes
    dead_raw = ctx.failed_requests
    behind = ctx.behind  # queue -> priority of a waiting workload that may preempt in its queue
    deferred_top: dict[str, int] = {}  # queue -> highest priority it set aside for the lending pass
    set_aside, set_aside_facts = deferred if deferred is not None else (None, None)
    shortcuts = cycle.SHORTCUTS
    lowest = ctx.cache.get("lowest-running")
    if lowest is None:  # queue -> the lowest priority among its preemptible running workloads
        ev = ctx.evicted
        lowest = ctx.cache["lowest-running"] = {
            q: min(prios) for q, vs in ctx.preemptible_by_queue().items()
            if (prios := [v.priority for v in vs if v.id not in ev])}
    while heap:
        k, q, i = heapq.heappop(heap)
        lst, fl = queues[q], facts[q]
        fresh = key(q, fl[i][0])
        if fresh > k:  # binds elsewhere in its department raised its key: requeue lazily
            heapq.heappush(heap, (fresh, q, i))
            continue
        n = len(lst)
        mine = groups.setdefault(q, {}) if shortcuts else {}  # this queue's groups by request
        check_quota = ctx.limited[q]
        path = ctx.tree.path(q)
        bound = False
        # may a failure here make lower priorities of q wait? (see _maybe_behind; probed once)
        low = lowest.get(q) if q not in ctx.probed else None
        beyond: dict[float, bool] = {}  # amount -> above fair share somewhere on path (fixed until a bind)
        lo, hi = _same_rank(ctx, path, fl[i][0])  # the amounts that rank as this turn did
        first = behind.get(q)  # (changes only where ``_maybe_behind`` probes q: read again there)
        while i < n and not bound:
            a, prio, pre, rk = fl[i]
            if not lo < a <= hi and heap:
                if key(q, a) > heap[0][0]:  # it now ranks behind another queue's head
                    break
                lo, hi = _same_rank(ctx, path, a)
            w = lst[i]
            i += 1
            if first is not None and prio < first:  # it would take what the preemption frees
                c = ctx.candidate(w)
                c.code, c.detail, c.seq = Code.BEHIND, {"priority": first}, seq
                seq += 1
                failed.append(c)
                continue
            if not check_quota and pre:  # quota cannot stop it: only capacity can
                g = mine.get(rk)  # (a group is only opened for a request that failed)
                if g is not None:
                    if not g.more or prio > g.more_top:
                        g.more_top = prio
                    g.more.append(w)
                    g.more_seq.append(seq)
                    g.more_ids.append(w.id)  # (read while the workload is at hand: see wait_all)
                else:
                    template = dead_raw.get(rk)
                    if template is not None:
                        g = template.like(w, seq)
                        if shortcuts:
                            g.more, g.more_seq, g.more_ids = [], [], []
                            mine[rk] = g
                        failed.append(g)
                if g is not None:
                    seq += 1
                    if low is not None and prio > low:
                        _maybe_behind(ctx, dead_raw[rk].like(w), lowest)
                        low = lowest.get(q) if q not in ctx.probed else None
                        first = behind.get(q)
                    continue
            c = ctx.candidate(w)
            block = ctx.quota_block(c) if (check_quota or not pre) else None
            if block:
                c.code, c.detail, c.seq = block[0], block[1], seq
                seq += 1
                failed.append(c)
                continue
            if deferred is not None and c.amount[0] > 0:
                over = beyond.get(c.amount[0])
                if over is None:
                    over = beyond[c.amount[0]] = any(ctx.over(x, c.amount[0]) > EPS for x in path)
                # a lower-priority workload of a queue whose higher-priority one was set aside waits
                # for the lending pass too: binding first, it would be preempted by that one next
                if over or prio < deferred_top.get(q, prio):
                    set_aside.setdefault(q, []).append(w)  # beyond its fair share: only if still idle later
                    set_aside_facts.setdefault(q, []).append(fl[i - 1])
                    deferred_top[q] = max(deferred_top.get(q, prio), prio)
                    continue
            shape = c.shape
            if shape not in dead:
                st = Statement(ctx, ctx.now)
                placements = ctx.place(c, st)
                if placements is not None:
                    st.commit()
                    ctx.future_place(w, placements)
                    ctx.bind(c, placements)
                    bound = True
                    continue
                dead.add(shape)
            c.code, c.detail = ctx.capacity_reason(c)
            c.seq = seq
            seq += 1
            dead_raw.setdefault(rk, c)
            failed.append(c)
            _maybe_behind(ctx, c, lowest)
            low = lowest.get(q) if q not in ctx.probed else None
            first = behind.get(q)
        if i < n:
            heapq.heappush(heap, (key(q, fl[i][0]), q, i))
