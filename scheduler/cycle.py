"""The working context of one scheduling cycle: capacity views, queue accounting, the Statement
through which actions move workloads, and the reservations carried from the last cycle.

Two capacity views are kept per cycle:

* ``now``: what is physically held (running and releasing workloads, and what reservations hold
  of the free capacity); allocate binds here.
* ``future``: what will be held once every releasing workload has stopped, with every
  reservation's planned placement taken; reclaim, preempt and consolidate plan here, and a pending
  workload that fits in ``future`` waits for the release ("pipelined") instead of evicting anyone.
"""
from __future__ import annotations

import math
import operator
from itertools import repeat
from typing import Callable, Iterable

import numpy as np

from .cluster import ClusterState, PodRequest, fits_placements
from .fairshare import EPS, QueueTree, fair_shares, guarantees
from .held import HeldBook, takes
from .intake import take_in
from .model import (MILLI, RESOURCES, Bind, CycleResult, Evict, Phase, PodPlacement, Reservation, SchedulerConfig,
                    Snapshot, Workload)
from .placement import FirstFit, make_policy
from .reasons import Code, Pending
from .units import format_amount
from .victims import lost_gpu_seconds
from .waiting import WaitingBook, pending_amount

Vec = tuple[float, float, float]  # gpu, cpu, memory
_PRIORITY = operator.attrgetter("priority")
# Shortcuts that must not change a decision (False turns them all off: the equivalence tests
# compare whole simulations both ways): the reservations carried in are taken in runs
# (``intake``); allocate does not probe again a holder's shape known to fit nowhere, and groups
# workloads whose request already failed; reclaim does not search a node whose victims the budget
# can only refuse (``plan._Refusals``).
SHORTCUTS = True
_ID = operator.attrgetter("id")
SINCE = operator.attrgetter("since", "workload")  # the order reservations are taken in and handed on
PROBE = FirstFit()  # feasibility probes: "would it fit?" needs no scoring
_new_tuple = tuple.__new__  # Pending(...) without its Python-level __new__ (one per waiting workload)


def _add(a: Vec, b: Vec, sign: float = 1.0) -> Vec:
    return (a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2])


class Statement:
    """Tentative moves of one action, with the accounting they imply, undone as a unit.

    ``place``/``remove`` move pods on one capacity view (``state``); ``claim`` counts a pending
    workload's planned capacity against its queues; ``evict`` marks a victim as releasing (queue
    accounting and the cycle's evictions); ``reserve`` holds a placement for a workload across
    cycles. ``mark()`` is a checkpoint; ``rollback(mark)`` undoes everything after it."""

    def __init__(self, ctx: "Cycle", state: ClusterState):
        self.ctx = ctx
        self.state = state
        self.ops: list[tuple] = []

    def mark(self) -> int:
        return len(self.ops)

    def place(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.state.take_placement(p, w)
        self.ops.append(("place", w, placements))

    def remove(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.state.give_placement(p, w)
        self.ops.append(("remove", w, placements))

    def claim(self, w: Workload, amount: float) -> None:
        self.ctx._claim(w.queue, amount)
        self.ops.append(("claim", w, amount))

    def evict(self, v: Workload, ev: Evict) -> None:
        self.ctx._evict(v, ev, +1)
        self.ops.append(("evict", v, ev))

    def reserve(self, r: Reservation) -> None:
        if r.workload not in self.ctx.reservations:
            self.ctx._note_starting(r.workload, +1)
        self.ctx.reservations[r.workload] = r
        self.ctx.reservations_in_order = False
        self.ops.append(("reserve", r, None))

    def rollback(self, to: int = 0) -> None:
        """Undo the moves made after the first ``to`` (all of them by default)."""
        ctx = self.ctx
        while len(self.ops) > to:
            op, x, arg = self.ops.pop()
            if op == "place":
                for p in arg:
                    self.state.give_placement(p, x)
            elif op == "remove":
                for p in arg:
                    self.state.take_placement(p, x)
            elif op == "claim":
                ctx._claim(x.queue, -arg)
            elif op == "evict":
                ctx._evict(x, arg, -1)
            elif op == "reserve":
                if ctx.reservations.pop(x.workload, None) is not None:
                    ctx._note_starting(x.workload, -1)

    def commit(self) -> list[tuple]:
        ops, self.ops = self.ops, []
        return ops


class Candidate:
    """A workload being tried this cycle, with its request resolved and, once it failed, why
    (``code`` and ``detail``: see reasons.py).

    A failed candidate may stand for a *group*: ``more`` lists further workloads of the same
    queue and request that failed the same way (``more_seq``: their places in the order), so
    that the thousands of workloads of a busy cycle that wait for capacity cost one entry each
    action, not one each. ``seq`` is the candidate's place in the order allocate tried them;
    every list of failed candidates is sorted by ``seq``, and an action that treats candidates one
    by one expands the groups it touches (``expand``) and goes through them in ``seq`` order."""

    __slots__ = ("w", "req", "amount", "mask", "shape", "code", "detail", "seq", "more", "more_seq", "more_top",
                 "more_ids")

    def __init__(self, w: Workload, req: PodRequest, amount: Vec, mask: np.ndarray | None):
        self.w, self.req, self.amount, self.mask = w, req, amount, mask
        # workloads with the same shape place identically: a failure for one is a failure for all
        sel = w.node_selector
        self.shape = (req, w.pods, tuple(sorted(sel.items())) if sel else ())
        self.code: Code | None = None
        self.detail: dict = {}
        self.seq = 0
        self.more: list[Workload] | None = None
        self.more_seq: list[int] | None = None
        self.more_top = 0  # the highest priority in ``more`` (kept by whoever adds to it)
        self.more_ids: list[str] | None = None  # their ids, when listed as they were added

    def like(self, w: Workload, seq: int = 0) -> "Candidate":
        """The same request and failure for another workload of the same shape."""
        c = Candidate.__new__(Candidate)
        c.w, c.req, c.amount, c.mask, c.shape = w, self.req, self.amount, self.mask, self.shape
        c.code, c.detail, c.seq = self.code, self.detail, seq
        c.more, c.more_seq, c.more_top, c.more_ids = None, None, 0, None
        return c

    def members(self) -> list["Candidate"]:
        """This candidate and, for a group, one candidate per further workload."""
        if not self.more:
            return [self]
        return [self.like(self.w, self.seq), *map(self.like, self.more, self.more_seq)]

    def restricted(self, mask: np.ndarray | None) -> "Candidate":
        """The same candidate limited to the nodes of ``mask`` (None: unchanged)."""
        if mask is None:
            return self
        c = Candidate(self.w, self.req, self.amount, mask if self.mask is None else (mask & self.mask))
        c.code, c.detail = self.code, self.detail
        return c

    @property
    def top_priority(self) -> int:
        """The highest priority among the workloads this candidate stands for."""
        return max(self.w.priority, self.more_top) if self.more else self.w.priority

    @property
    def quota_bound(self) -> bool:
        """Waiting for a reason no preemption on its behalf can remove this cycle."""
        return self.code in (Code.LIMIT, Code.NON_PREEMPTIBLE, Code.BEHIND)


SEQ = operator.attrgetter("seq")


def expand(cands: Iterable[Candidate]) -> list[Candidate]:
    """One candidate per workload, in the order allocate tried them."""
    out = [m for c in cands for m in c.members()]
    out.sort(key=SEQ)
    return out


def fits_on(state: ClusterState, n: int, req: PodRequest) -> bool:
    """Does one pod of ``req`` fit on node ``n`` now? (O(GPUs), no scoring.)"""
    if state.cpu_free[n] < req.cpu_milli or state.mem_free[n] < req.memory:
        return False
    if req.num_gpus == 0:
        return True
    milli = state.milli_on(n, req)
    return milli <= MILLI and np.count_nonzero(state.gpu_free[n] >= milli) >= req.num_gpus


class Cycle:
    """Working context of one scheduling cycle."""

    def __init__(self, snap: Snapshot, cfg: SchedulerConfig, policies: dict | None = None,
                 usage: dict[str, float] | None = None, extra_demand: dict[str, Vec] | None = None,
                 waiting: WaitingBook | None = None, keep: bool = False):
        """``usage``: past usage per queue (fairness over time); ``extra_demand``: what pending
        workloads that are not candidates here also want of this capacity (queue -> amount; node
        pools: a workload tried in another pool this round still counts as demand in the pools it
        may fall back to). ``waiting``: the book of pending workloads kept from the last snapshot,
        brought up to date here with ``snap.changes`` (when it names them and the book still
        applies); else a fresh one is made, one to keep if ``keep`` (``self.waiting``)."""
        self.snap = snap
        self.pool: str | None = None  # set for one node pool's cycle: reasons then name the pool
        self._pool_details: dict[int, tuple[dict, dict]] = {}
        self.cfg = cfg
        self.now_t = snap.now
        self.tree = QueueTree(snap.queues)
        self.now = ClusterState(snap.nodes, cfg.gpu_memory_reserve, cfg.gpu_memory_reserve_min)
        self.result = CycleResult()
        self._positions = self.result.positions
        self.max_gpu_mem = int(self.now.gpu_mem.max()) if len(self.now.gpu_mem) else 0
        known = self.tree.queues
        names = list(known)
        book_key = (self.max_gpu_mem, tuple(names))
        changes = snap.changes
        kept = waiting is not None and waiting.key == book_key and changes is not None
        ws = self.workloads = snap.workloads
        self.by_id = snap.by_id if snap.by_id is not None else dict(zip(map(_ID, ws), ws))
        # the workloads of known queues: all of the snapshot's when all of the last one's were
        # (the kept book says) and none changed names another queue (not looked for again)
        if not (kept and waiting.all_known and all(self.by_id[c].queue in known for c in changes if c in self.by_id)):
            self._known_only(ws)
        self._reqs: dict[tuple, PodRequest] = {}
        self._masks: dict[tuple, np.ndarray | None] = {}
        self._pending_amounts: dict[tuple, Vec] = {}
        self._topology: list[tuple[str, np.ndarray]] | None = None
        leaf_alloc: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        leaf_rel: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        leaf_nonpre: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        demand_leaf: dict[str, list[float]] = {n: [0.0, 0.0, 0.0] for n in names}
        PENDING, RELEASING = Phase.PENDING, Phase.RELEASING
        # Pending workloads (most of a busy snapshot): their amounts, demand and shapes, worked out
        # once per distinct request, or kept from the last snapshot and brought up to date
        held: list[Workload] = [w for w in self.workloads if w.phase is not PENDING]
        self.book_mismatch = False  # a kept book did not come out with the snapshot's pending count
        if kept:
            waiting.update(changes, self.by_id)
            if len(waiting.ws) != len(self.workloads) - len(held):  # changes the adapter did not name
                self.book_mismatch, waiting = True, None
                if self.workloads is ws:  # (nor whether one names another queue)
                    self._known_only(ws)
                    held = [w for w in self.workloads if w.phase is not PENDING]
        else:
            waiting = None
        if waiting is None:
            waiting = WaitingBook.fresh([w for w in self.workloads if w.phase is PENDING],
                                        self.max_gpu_mem, book_key[1], keep)
        waiting.all_known = len(self.workloads) == len(ws)
        self.waiting = waiting
        self.pending: list[Workload] = waiting.pending
        # (a kept book's amounts stay its own: the held workloads' are added to a copy)
        self.amounts: dict[str, Vec] = waiting.amounts.copy() if waiting.lists is not None else waiting.amounts
        for q, d in waiting.demand.items():
            demand_leaf[q] = [d[0], d[1], d[2]]
        shape_count: dict[tuple, float] = dict(waiting.shapes)
        # Held workloads: what is worked out of each is kept with the book (``HeldBook``), for
        # those the snapshot does not name as changed; the cluster's part kept summed
        width = self.now.gpu_free.shape[1]
        hb = waiting.held if kept and waiting.held is not None and waiting.held.fits(snap.nodes, width) else None
        if hb is not None:
            hb.forget(changes)
        elif waiting.lists is not None:  # a book to keep: its held workloads from here
            hb = HeldBook(snap.nodes, self.now.index, width)
        waiting.held = hb
        known_held = hb.facts if hb is not None else None
        self.running: list[Workload] = []
        releasing: list[Workload] = []
        amounts, running = self.amounts, self.running
        for w in held:  # the hottest loop of the snapshot: kept flat
            wid = w.id
            f = known_held.get(wid) if known_held is not None else None
            if f is None:
                pl = w.placements
                if pl:
                    g = 0.0
                    for p in pl:
                        g += len(p.gpus) * p.fraction
                    amt = (g, w.cpu * w.pods, float(w.memory * w.pods))
                else:
                    amt = self.amount(w)
                rkey = (w.gpus, w.gpu_memory, w.cpu, w.memory)
                if hb is not None:
                    hb.note(wid, (amt, rkey, hb.take_of(w)))
            else:
                amt, rkey = f[0], f[1]
            amounts[wid] = amt
            q = w.queue
            d = demand_leaf[q]
            d[0] += amt[0]
            d[1] += amt[1]
            d[2] += amt[2]
            shape_count[rkey] = shape_count.get(rkey, 0.0) + w.pods
            v = leaf_alloc[q]
            v[0] += amt[0]
            v[1] += amt[1]
            v[2] += amt[2]
            if not w.preemptible:
                v = leaf_nonpre[q]
                v[0] += amt[0]
                v[1] += amt[1]
                v[2] += amt[2]
            if w.phase is RELEASING:
                v = leaf_rel[q]
                v[0] += amt[0]
                v[1] += amt[1]
                v[2] += amt[2]
                releasing.append(w)
            else:
                running.append(w)
        # Queue accounting, rolled up to departments. alloc: held (running + releasing + bound this
        # cycle); releasing: part of alloc on its way out; nonpre: held by non-preemptible workloads;
        # reserved: planned for pending workloads (reservations and plans made this cycle).
        self.alloc = self._rollup(leaf_alloc)
        self.releasing = self._rollup(leaf_rel)
        self.nonpre = self._rollup(leaf_nonpre)
        if hb is not None:
            if len(hb.facts) != len(held):  # a held workload gone that the snapshot did not name
                hb.keep_only({w.id for w in held})
                self.book_mismatch = True
            hb.settle()
            st = self.now
            st.gpu_free -= hb.gpu.reshape(st.gpu_free.shape)
            st.cpu_free -= hb.cpu
            st.mem_free -= hb.mem
            st.forget()
        else:
            self._move_all(self.now, held, -1)  # every held workload's resources, taken from the now view
        self.future = self.now.copy()
        if releasing:  # what is being released is free in the future view (a new state: no log yet to keep)
            self._move_all(self.future, releasing, +1)
        self.future_version = 0  # bumped whenever the future view gains room
        cap = (float(self.now.num_gpus[self.now.schedulable].sum()),
               self._capacity(self.now.cpu_total) / MILLI, self._capacity(self.now.mem_total))
        self.capacity = dict(zip(RESOURCES, cap))
        for q, v in (extra_demand or {}).items():
            d = demand_leaf.get(q)
            if d is not None:
                d[0] += v[0]
                d[1] += v[1]
                d[2] += v[2]
        demand = {n: dict(zip(RESOURCES, v)) for n, v in demand_leaf.items()}
        self.demand_gpu = self.tree.rollup({n: v[0] for n, v in demand_leaf.items()})  # running + pending
        k = cfg.fairness_k if usage else 0.0
        self.fair = fair_shares(self.tree, demand, self.capacity, usage=usage, k=k)
        # fairness over time: the GPU shares past usage did not move (None: it moves none)
        self.fair_plain = fair_shares(self.tree, demand, self.capacity, ("gpu",)) if k else None
        self.usage = usage or {}
        # GPUs each queue is guaranteed (its deserved quota as far as it wants it, shrunk in
        # proportion where the quotas over-commit what there is): what reclaim takes back for it
        self.guar = guarantees(self.tree, demand, self.capacity["gpu"])
        gpu_shapes = {}
        for rkey, count in shape_count.items():
            req = self._req_for(rkey)
            if req.num_gpus:
                gpu_shapes[req] = gpu_shapes.get(req, 0.0) + count
        total = sum(gpu_shapes.values()) or 1.0
        self.shapes = sorted(((r, c / total) for r, c in gpu_shapes.items()), key=lambda rc: rc[0].shape)
        # one policy instance per capacity view (fragmentation-aware policies cache per-node scores
        # and would recompute every row that differs each time the view switched); the Scheduler
        # reuses them across cycles while the workload's shapes are unchanged
        self.policies = policies if policies is not None else {}
        if self.policies.get("shapes") != self.shapes:
            self.policies.clear()
            self.policies["shapes"] = self.shapes
        self.policy = self._policy("now")
        self.failed_shapes: set[tuple] = set()
        self.failed_requests: dict[tuple, Candidate] = {}  # raw request -> the candidate that failed
        self.reasons: dict[tuple, tuple[Code, dict]] = {}  # capacity reasons by shape, reset on binds
        self.evicted: set[str] = set()
        self.reserved: dict[str, float] = {n: 0.0 for n in names}
        # queue numbers: the order of ``tree.queues`` (the per-queue arrays below, and the planner's)
        self.queue_names = names
        self.queue_index = {q: i for i, q in enumerate(names)}
        self._over_vec: np.ndarray | None = None  # see over_all
        self._held_vec: np.ndarray | None = None  # see held_all
        self._over_dirty: set[str] = set()
        self._held: dict[str, float] = {}  # see held
        self._side_flags: dict[str, tuple[bool, bool]] = {}  # see side_flags
        # (kept with the held book: a workload's nodes change only with the workload)
        self._vnodes: dict[str, list[tuple[int, int]]] = hb.nodes_of if hb is not None else {}
        self._vcost: dict[str, float] = {}
        self.no_room: set[tuple] = set()  # (shape, future_version) that did not fit the future view
        self.cache: dict[str, object] = {}  # per-cycle indexes built by actions and policies
        self.behind: dict[str, int] = {}  # queue -> priority of a waiting workload that may preempt
        self.probed: set[str] = set()  # queues whose first failing workload was probed for that
        self.limited = {q: any(self.tree.queues[x].limit for x in self.tree.path(q)) for q in names}
        # reservations: those carried in and still valid, plus those made this cycle
        self.reservations: dict[str, Reservation] = {}
        # are ``reservations`` in the order ``SINCE`` sorts them (as intake takes them in), with
        # none made by this cycle's plans yet?
        self.reservations_in_order = True
        # queue -> priority -> how many of its waiting preemptible workloads start: hold a
        # reservation, or were bound this cycle (see runs_lower_priority)
        self._starting_prios: dict[str, dict[int, int]] = {}
        self._starting: set[str] = set()
        self._lowest: dict[str, float] = {}  # see lowest_running_priority (dropped as its queue changes)
        self._lowest_vec: np.ndarray | None = None  # see lowest_running_priorities
        self._lowest_known: np.ndarray | None = None
        self.holds: dict[str, list[tuple[int, tuple[int, ...], int, int, int]]] = {}  # now-view holds
        self._held_all: tuple[int, list[str]] | None = None  # what they hold in all (see _held_in)
        # holders that bound into their planned place lately (the last two grace periods): their
        # reservations are handed on as markers, and consolidation does not move them again
        self.settling: dict[str, Reservation] = {}
        self._intake(snap.reservations)

    def _known_only(self, ws: list[Workload]) -> None:
        """``workloads`` (and ``by_id``): those of ``ws`` in known queues."""
        known = self.tree.queues
        self.workloads = [w for w in ws if w.queue in known]
        if len(self.workloads) < len(ws):
            self.by_id = dict(zip(map(_ID, self.workloads), self.workloads))

    def _policy(self, view: str):
        pol = self.policies.get(view)
        if pol is None:
            pol = self.policies[view] = make_policy(self.cfg.placement, shapes=self.shapes, seed=self.cfg.seed)
        return pol

    @staticmethod
    def _move_all(st: ClusterState, ws: list[Workload], sign: int) -> None:
        """Take (``sign`` -1) or give back (+1) every placement of ``ws`` on ``st`` in one
        vectorised step (``take_placement``/``give_placement`` one by one, less the change log:
        for a view as it is being made, before any reader has seen it)."""
        width = st.gpu_free.shape[1]
        keys, milli, pods, cpu, mem = takes(ws, st.index, width)
        if keys:
            at = np.divmod(np.array(keys, dtype=np.int64), width)  # (node, GPU)
            np.add.at(st.gpu_free, at, sign * np.array(milli, dtype=np.int64))
        if pods:
            idx = np.array(pods, dtype=np.int64)
            np.add.at(st.cpu_free, idx, sign * np.array(cpu, dtype=np.int64))
            np.add.at(st.mem_free, idx, sign * np.array(mem, dtype=np.int64))
        st.forget()

    def _rollup(self, leaf: dict[str, list[float]]) -> dict[str, Vec]:
        out = {n: [0.0, 0.0, 0.0] for n in self.tree.queues}
        for q, v in leaf.items():
            if v[0] or v[1] or v[2]:
                for x in self.tree.path(q):
                    o = out[x]
                    o[0] += v[0]
                    o[1] += v[1]
                    o[2] += v[2]
        return {n: (v[0], v[1], v[2]) for n, v in out.items()}

    def request(self, w: Workload) -> PodRequest:
        return self._req_for((w.gpus, w.gpu_memory, w.cpu, w.memory))

    def _req_for(self, key: tuple) -> PodRequest:
        r = self._reqs.get(key)
        if r is None:
            gpus, gpu_memory, cpu, memory = key
            r = self._reqs[key] = PodRequest.for_workload(Workload("", "", gpus=gpus, gpu_memory=gpu_memory,
                                                                   cpu=cpu, memory=memory))
        return r

    def mask(self, selector: dict[str, str]) -> np.ndarray | None:
        if not selector:
            return None
        key = tuple(sorted(selector.items()))
        if key not in self._masks:
            self._masks[key] = self.now.node_mask(selector)
        return self._masks[key]

    # -- reservations ----------------------------------------------------------------------------
    def _intake(self, reservations: Iterable[Reservation]) -> None:
        """Take in the reservations the last cycle returned. One whose holder has bound or ended
        lapses silently; one that can no longer be honoured is dropped with the reason in
        ``result.dropped`` (its holder is then planned afresh this cycle)."""
        timeout = self.cfg.reservation_timeout
        if timeout is None:
            timeout = 2 * self.cfg.preemption_grace + 60.0
        todo: list[tuple[Reservation, Workload]] = []
        for r in sorted(reservations, key=SINCE):
            w = self.by_id.get(r.workload)
            if r.bound_at is not None:  # a marker: it bound into a planned place lately
                if (w is not None and w.phase == Phase.RUNNING
                        and self.now_t - r.bound_at <= 2 * self.cfg.preemption_grace):
                    self.settling[r.workload] = r
                continue
            if w is not None and w.phase is not Phase.RUNNING:
                todo.append((r, w))
        if SHORTCUTS:
            take_in(self, todo, timeout)  # in runs, as ``_take_one`` would one by one
        else:
            for r, w in todo:
                self._take_one(r, w, timeout)

    def _take_one(self, r: Reservation, w: Workload, timeout: float) -> None:
        """Take in one reservation: drop it with the reason, or take and hold its placement."""
        if r.workload in self.reservations:
            return
        why = ""
        if self.now_t - r.since > timeout:
            why = f"its victims did not release the capacity within {timeout:g}s"
        elif r.code == Code.RECLAIMING and w.phase == Phase.PENDING:
            why = self._unentitled(w)
        if not why and not w.preemptible and w.phase == Phase.PENDING:
            why = self._nonpreemptible_blocked(w)
        if not why and self.limited[w.queue] and w.phase == Phase.PENDING:
            why = self._limit_blocked(w)
        if not why:
            why = self._hold(w, r)
        if why:
            self.result.dropped[w.id] = why
            return
        self.reservations[w.id] = r
        self._note_starting(w.id, +1)

    def _unentitled(self, w: Workload, reserved: float | None = None) -> str:
        """Why a reclaimer is no longer entitled to what it reserved (empty: it still is): reclaim
        admits a workload while its queue holds less than its fair share (a whole workload may
        take it past; the reclaim budget judges the move), so the reservation lapses once the
        queue holds its fair share without it and would go above with it. ``reserved``: its
        queue's reserved GPUs, if not ``self.reserved``'s (intake judging a run ahead)."""
        amt = self.amounts[w.id][0]
        q = w.queue
        held = self.held(q) if reserved is None else self.effective(q)[0] + reserved
        fair = self.fair[q].get("gpu", 0.0)
        if held >= fair - EPS and held + amt > fair + EPS:
            return (f"queue {q} holds {held:g} GPUs without it, its fair share of {fair:g}, "
                    f"and would hold {held + amt:g} with it")
        return ""

    def _nonpreemptible_blocked(self, w: Workload) -> str:
        """Why a non-preemptible holder can no longer bind whatever is released for it (empty: it
        still can): other non-preemptible work of its queue took the deserved quota it counted on
        meanwhile. Its reservation would only keep the capacity from everyone until it times out."""
        held = self.nonpre[w.queue][0]
        amt = self.amounts[w.id][0]
        deserved = self.tree.queues[w.queue].deserved.get("gpu", 0.0)
        if amt > 0 and held + amt > deserved + EPS:
            return (f"queue {w.queue}'s deserved {deserved:g} GPUs are held by other non-preemptible work "
                    f"({held:g} GPUs), so it cannot bind")
        return ""

    def _limit_blocked(self, w: Workload) -> str:
        """Why a holder can no longer bind for a limit of its queue or an ancestor (empty: it still
        can): other work of that queue started meanwhile, and what stays of it (less what is being
        released) leaves no room under the limit. Its reservation would only keep the capacity from
        everyone until it times out."""
        amt = self.amounts[w.id]
        for q in self.tree.path(w.queue):
            spec = self.tree.queues[q]
            if not spec.limit:
                continue
            held = self.effective(q)
            for i, res in enumerate(RESOURCES):
                lim = spec.limit.get(res)
                if lim is not None and amt[i] > 0 and held[i] + amt[i] > lim + EPS:
                    return (f"queue {q}'s limit of {format_amount(res, lim)} leaves no room for "
                            f"{format_amount(res, amt[i])} more: {format_amount(res, round(held[i], 2))} "
                            f"of it stays in use")
        return ""

    def _hold(self, w: Workload, r: Reservation) -> str:
        """Take ``r``'s placements in the future view and hold what is free of them now."""
        fut = self.future
        index, sched = fut.index, fut.schedulable
        for p in r.placements:
            n = index.get(p.node)
            if n is None or not sched[n]:
                gone = sorted({p.node for p in r.placements if p.node not in index or not sched[index[p.node]]})
                return f"node {', '.join(gone)} is gone or no longer schedulable"
        if not fits_placements(fut, r.placements, w):
            nodes = ", ".join(sorted({p.node for p in r.placements}))
            return f"the capacity planned on node {nodes} is no longer there"
        for p in r.placements:
            fut.take_placement(p, w)
        self._claim(w.queue, self.amounts[w.id][0])
        self._hold_now(w, r.placements)
        return ""

    def unhold(self, wid: str) -> None:
        """Give the now-view capacity held for ``wid`` back (it is about to bind into it)."""
        self._held_all = None
        for n, gpus, gh, ch, mh in self.holds.pop(wid, ()):
            for g, h in zip(gpus, gh):
                if h:
                    self.now.give(n, (g,), h, 0, 0)
            if ch or mh:
                self.now.give(n, (), 0, ch, mh)

    def rehold(self, wid: str) -> None:
        """Undo ``unhold`` (the holder could not bind yet)."""
        self._hold_now(self.by_id[wid], self.reservations[wid].placements)

    def _hold_now(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        """Hold for ``w`` whatever of ``placements`` is free in the now view (the rest is still
        held by the workloads releasing it), so that nobody else binds there meanwhile."""
        now = self.now
        cpu, mem = int(round(w.cpu * MILLI)), w.memory
        holds = []
        for p in placements:
            n = now.index[p.node]
            row = now.gpu_free[n]
            gh = tuple(int(min(p.milli, max(0, row[g]))) for g in p.gpus)
            ch = int(min(cpu, max(0, now.cpu_free[n])))
            mh = int(min(mem, max(0, now.mem_free[n])))
            for g, h in zip(p.gpus, gh):
                if h:
                    now.take(n, (g,), h, 0, 0)
            if ch or mh:
                now.take(n, (), 0, ch, mh)
            holds.append((n, p.gpus, gh, ch, mh))
        self.holds[w.id] = holds
        self._held_all = None

    def hold_new_reservations(self) -> None:
        """Hold in the now view what is idle of the reservations made since intake, as the next
        cycle's intake will: a later round of this cycle (node pools) allocates on the now view
        and must not bind into the room a plan counts on."""
        for wid, r in self.reservations.items():
            if wid not in self.holds and r.bound_at is None:
                w = self.by_id.get(wid)
                if w is not None and w.phase is Phase.PENDING:
                    self._hold_now(w, r.placements)

    def reservation_for(self, c: Candidate, placements: tuple[PodPlacement, ...], code: Code,
                        **detail) -> Reservation:
        return Reservation(c.w.id, placements, code, self.now_t, detail)

    # -- accounting ------------------------------------------------------------------------------
    def _capacity(self, totals: np.ndarray) -> float:
        sched = totals[self.now.schedulable]
        if (sched >= np.int64(2**59)).any():
            return float("inf")
        return float(sched.sum())

    def amount(self, w: Workload) -> Vec:
        """What the workload holds (or, pending, is expected to hold): GPUs, cores, bytes."""
        if w.placements:
            gpu = sum(len(p.gpus) * p.fraction for p in w.placements)
            return (gpu, w.cpu * w.pods, float(w.memory * w.pods))
        return self._pending_amount_of(w.pods, w.gpus, w.gpu_memory, w.cpu, w.memory)

    def _pending_amount_of(self, pods: int, gpus: float, gpu_memory: int, cpu: float, memory: int) -> Vec:
        key = (pods, gpus, gpu_memory, cpu, memory)
        amt = self._pending_amounts.get(key)
        if amt is None:
            amt = self._pending_amounts[key] = pending_amount(self.max_gpu_mem, pods, gpus, gpu_memory, cpu, memory)
        return amt

    def _changing(self, queue: str) -> tuple[str, ...]:
        """The path of ``queue``, whose sums the caller is about to change: what is kept of them
        (``held``, ``over_all``) is dropped for each queue on it."""
        path = self.tree.path(queue)
        held, flags = self._held, self._side_flags
        for q in path:
            held.pop(q, None)
            flags.pop(q, None)
        if self._over_vec is not None:
            self._over_dirty.update(path)
        return path

    def _account(self, w: Workload, amt: Vec, sign: int) -> None:
        for q in self._changing(w.queue):
            self.alloc[q] = _add(self.alloc[q], amt, sign)
            if not w.preemptible:
                self.nonpre[q] = _add(self.nonpre[q], amt, sign)

    def _claim(self, queue: str, amount: float) -> None:
        for q in self._changing(queue):
            self.reserved[q] += amount

    def _evict(self, v: Workload, ev: Evict, sign: int) -> None:
        amt = self.amounts[v.id]
        self._drop_lowest(v.queue)
        for q in self._changing(v.queue):
            self.releasing[q] = _add(self.releasing[q], amt, sign)
        if sign > 0:
            self.evicted.add(v.id)
            self.future_version += 1
            self.result.evictions.append(ev)
        else:
            self.evicted.discard(v.id)
            self.result.evictions.remove(ev)

    def effective(self, q: str) -> Vec:
        """Held and staying: allocation less what is being released."""
        return _add(self.alloc[q], self.releasing[q], -1)

    def held(self, q: str) -> float:
        """GPUs held and staying plus those reserved for its pending workloads (``effective``'s
        GPUs plus ``reserved``), kept until the queue's sums change."""
        h = self._held.get(q)
        if h is None:
            h = self._held[q] = (self.alloc[q][0] - self.releasing[q][0]) + self.reserved[q]
        return h

    def over(self, q: str, extra: float = 0.0) -> float:
        """GPUs above fair share (negative: below), counting room reserved for its pending
        workloads that wait for preempted ones to release."""
        return self.held(q) + extra - self.fair[q].get("gpu", 0.0)

    def side_flags(self, q: str) -> tuple[bool, bool]:
        """Is ``q`` above its fair share, and above its guarantee (as reclaim judges a side:
        ``ReclaimBudget.candidate_side``)? Kept until the queue's sums change."""
        hit = self._side_flags.get(q)
        if hit is None:
            hit = self._side_flags[q] = (self.over(q) > EPS, self.held(q) > self.guar[q] + EPS)
        return hit

    def over_all(self) -> np.ndarray:
        """``over`` of every queue, in ``tree.queues`` order (the same numbers: queues whose sums
        changed since the last call are worked out again)."""
        if self._over_vec is None:
            queues = self.queue_names
            self._over_vec = np.array([self.over(q) for q in queues], dtype=float)
            self._held_vec = np.array([self.held(q) for q in queues], dtype=float)
        elif self._over_dirty:
            vec, held, index = self._over_vec, self._held_vec, self.queue_index
            for q in self._over_dirty:
                i = index[q]
                vec[i], held[i] = self.over(q), self.held(q)
        self._over_dirty.clear()
        return self._over_vec

    def held_all(self) -> np.ndarray:
        """``held`` of every queue, in ``tree.queues`` order (kept as ``over_all`` is)."""
        self.over_all()
        return self._held_vec

    def guar_all(self) -> np.ndarray:
        """``guar`` of every queue, in ``tree.queues`` order (fixed for the cycle)."""
        vec = self.cache.get("guar-all")
        if vec is None:
            vec = self.cache["guar-all"] = np.array([self.guar[q] for q in self.queue_names], dtype=float)
        return vec

    # -- placement -------------------------------------------------------------------------------
    def candidate(self, w: Workload) -> Candidate:
        return Candidate(w, self.request(w), self.amounts.get(w.id) or self.amount(w), self.mask(w.node_selector))

    def place(self, c: Candidate, st: Statement, probe: bool = False) -> tuple[PodPlacement, ...] | None:
        """Place every pod of ``c`` on ``st.state`` (all or none; a gang prefers one topology
        domain). On success the pods are placed through ``st``; on failure nothing changed.
        ``probe``: only the answer matters (does it fit?), so take the first feasible node
        instead of scoring every node with the placement policy."""
        policy = PROBE if probe else (self._policy("future") if st.state is self.future else self.policy)
        domains = self._domains(c, st.state) if c.w.pods > 1 else [None]
        # the pods of a gang never share a GPU (a distributed job's ranks each need their own
        # device): once a pod of fractions has its GPU, the rest of that GPU is out of the others' reach
        req = c.req
        distinct = c.w.pods > 1 and req.num_gpus > 0 and (req.gpu_memory > 0 or 0 < req.milli < MILLI)
        for dmask in domains:
            mask = c.mask if dmask is None else (dmask if c.mask is None else (dmask & c.mask))
            mark = st.mark()
            placements = []
            blocked: list[tuple[int, int, int]] = []  # GPUs an earlier pod of the gang took
            for i in range(c.w.pods):
                choice = policy.choose(st.state, c.req, mask)
                if choice is None:
                    break
                node, gpus, milli = choice
                p = PodPlacement(i, st.state.nodes[node].name, tuple(int(g) for g in gpus),
                                 milli / MILLI if c.req.num_gpus else 0.0)
                st.place(c.w, (p,))
                placements.append(p)
                if distinct and i + 1 < c.w.pods:
                    blocked.extend(self._block(st.state, node, p.gpus))
            for n, g, left in reversed(blocked):
                st.state.give(n, (g,), left, 0, 0)
            if len(placements) == c.w.pods:
                return tuple(placements)
            st.rollback(mark)  # undo this domain's partial gang
        return None

    @staticmethod
    def _block(state: ClusterState, node: int, gpus: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """Take what is left free of ``gpus`` (for the other pods of a gang); returns what to give back."""
        out = []
        for g in gpus:
            left = int(state.gpu_free[node, g])
            if left > 0:
                state.take(node, (g,), left, 0, 0)
                out.append((node, g, left))
        return out

    def fits(self, c: Candidate, state: ClusterState | None = None) -> bool:
        """Would ``c`` fit on ``state`` (the future view by default)? Nothing changes."""
        probe = Statement(self, self.future if state is None else state)
        if self.place(c, probe, probe=True) is None:
            return False
        probe.rollback()
        return True

    def _domains(self, c: Candidate, state: ClusterState) -> list[np.ndarray | None]:
        """Topology domains to try for a gang: those with enough free GPU milli in all, tightest
        first (bin-packing across domains), then the whole cluster."""
        if self._topology is None:
            key = self.cfg.topology_key
            labels = [n.labels.get(key) for n in self.now.nodes]
            values = sorted({v for v in labels if v is not None})
            arr = np.array([v if v is not None else "" for v in labels], dtype=object)
            self._topology = [(v, arr == v) for v in values] if len(values) >= 2 else []
        if not self._topology:
            return [None]
        need = c.req.gpu_milli_total * c.w.pods
        free = [(int(state.gpu_free[d].sum()), v, d) for v, d in self._topology]
        return [d for f, v, d in sorted(free, key=lambda t: (t[0], t[1])) if f >= need] + [None]

    # -- quota checks ----------------------------------------------------------------------------
    def quota_block(self, c: Candidate, freed: float = 0.0) -> tuple[Code, dict] | None:
        """Why quota alone stops ``c`` now (None: quota allows it). ``freed``: GPUs that planned
        victims of its own queue will give back (priority preemption at a limit)."""
        w, amt = c.w, c.amount
        if self.limited[w.queue]:
            # GPUs held for the queue's reservations count as used (KAI counts pipelined work in a
            # queue's allocation): another workload of the queue does not take the room under the
            # limit that a reclaim in motion counts on. The limit holds now (what is allocated,
            # releasing workloads included) and once the reservations bind (what stays, and what
            # they hold: a workload moved by consolidation counts once). A holder does not count
            # its own claim.
            own = self.amounts[w.id][0] if w.id in self.reservations else 0.0
            for q in self.tree.path(w.queue):
                spec = self.tree.queues[q]
                for i, res in enumerate(RESOURCES):
                    lim = spec.limit.get(res)
                    if lim is None or amt[i] <= 0:
                        continue
                    held = 0.0
                    used = self.alloc[q][i]
                    if i == 0:
                        held = self.reserved[q] - own
                        if held > EPS:
                            used = max(used, self.effective(q)[0] + held)
                        used -= freed
                    if used + amt[i] > lim + EPS:
                        detail = {"at": q, "resource": res, "limit": lim, "used": self.alloc[q][i],
                                  "over": used + amt[i] - lim}
                        if held > EPS:
                            detail["reserved"] = held
                        return Code.LIMIT, detail
        if not w.preemptible:
            spec = self.tree.queues[w.queue]
            for i, res in enumerate(RESOURCES):
                if amt[i] <= 0 or (res != "gpu" and res not in spec.deserved):
                    continue
                deserved = spec.deserved.get(res, 0.0)
                if self.nonpre[w.queue][i] + amt[i] > deserved + EPS:
                    return Code.NON_PREEMPTIBLE, {"kind": w.kind, "resource": res, "deserved": deserved,
                                                  "held": self.nonpre[w.queue][i]}
        return None

    def capacity_reason(self, c: Candidate) -> tuple[Code, dict]:
        key = c.shape
        hit = self.reasons.get(key)
        if hit is None:
            hit = self.reasons[key] = self._capacity_reason(c)
        return hit

    def _capacity_reason(self, c: Candidate) -> tuple[Code, dict]:
        need = c.amount[0]
        if c.mask is not None and not c.mask.any():
            sel = ", ".join(f"{k}={v}" for k, v in c.w.node_selector.items())
            return Code.NO_MATCHING_NODE, {"selector": sel}
        if need <= 0:
            return Code.CAPACITY, {"need": 0.0}
        sel = self.now.schedulable & (c.mask if c.mask is not None else True)
        free = self.now.gpu_free[sel].sum() / MILLI
        detail = {"need": need, "pods": c.w.pods, "free": float(free)}
        if free + EPS >= need:
            req = c.req
            if c.w.pods > 1 and req.num_gpus and (req.gpu_memory > 0 or req.milli < MILLI):
                detail["own_gpus"] = c.w.pods  # the gang's pods may not share a GPU
            return Code.FRAGMENTED, detail
        if self.holds:
            held, holders = self._held_in(sel, c.mask is None)
            if held and free + held / MILLI + EPS >= need:
                return Code.RESERVED, {**detail, "reserved": held / MILLI, "holder": ", ".join(sorted(holders))}
        off = int((~self.now.schedulable & (self.now.num_gpus > 0)).sum())
        if off:
            detail["unschedulable_nodes"] = off
        return Code.CAPACITY, detail

    def _held_in(self, sel: np.ndarray, whole: bool) -> tuple[int, list[str]]:
        """GPU milli held in the now view for holders on the nodes ``sel`` marks, and the holders
        (``whole``: ``sel`` marks every schedulable node; kept until the holds change)."""
        if whole and self._held_all is not None:
            return self._held_all
        held, holders = 0, []
        for wid, holds in self.holds.items():
            h = sum(sum(gh) for n, _, gh, _, _ in holds if sel is True or sel[n])
            if h:
                held += h
                holders.append(wid)
        if whole:
            self._held_all = (held, holders)
        return held, holders

    def wait(self, c: Candidate | Workload, code: Code, detail: dict | None = None) -> None:
        """Record why a workload waits this cycle."""
        w = c if isinstance(c, Workload) else c.w
        detail = detail or {}
        if self.pool is not None:
            detail = self._in_pool(detail)
        self.result.pending[w.id] = _new_tuple(Pending, (code, w.queue, self._positions.get(w.id, 1), detail))

    def _in_pool(self, detail: dict) -> dict:
        """``detail`` naming this cycle's node pool (one copy per detail: groups share theirs)."""
        hit = self._pool_details.get(id(detail))
        if hit is None or hit[0] is not detail:
            hit = self._pool_details[id(detail)] = (detail, {**detail, "pool": self.pool})
        return hit[1]

    def wait_all(self, cands: list[Candidate]) -> None:
        """``wait`` for each of ``cands`` (groups included) with the reason it carries."""
        pending, positions = self.result.pending, self._positions
        for c in cands:
            w = c.w
            detail = c.detail or {}
            if self.pool is not None:
                detail = self._in_pool(detail)
            pending[w.id] = _new_tuple(Pending, (c.code, w.queue, positions.get(w.id, 1), detail))
            if c.more:  # the group's other workloads: the same reason, each with its position
                ids = c.more_ids if c.more_ids is not None else list(map(_ID, c.more))
                fields = zip(repeat(c.code), repeat(w.queue), map(positions.get, ids, repeat(1)),
                             repeat(detail))
                pending.update(zip(ids, map(_new_tuple, repeat(Pending), fields)))

    # -- binding ---------------------------------------------------------------------------------
    def bind(self, c: Candidate, placements: tuple[PodPlacement, ...]) -> None:
        w = c.w
        before = self.alloc[w.queue][0]
        deserved = self.tree.queues[w.queue].deserved.get("gpu", 0.0)
        amt = (sum(len(p.gpus) * p.fraction for p in placements), c.amount[1], c.amount[2])
        self._account(w, amt, +1)
        over = w.preemptible and before + amt[0] > deserved + EPS and amt[0] > 0
        if over:
            reason = (f"borrowing idle GPUs beyond {w.queue}'s deserved {deserved:g} GPUs; "
                      f"may be preempted when their owners need them")
        else:
            reason = f"within the deserved quota of {w.queue}"
        self.result.binds.append(Bind(w.id, placements, reason, over_quota=over))
        self._note_starting(w.id, +1)
        self.result.pending.pop(w.id, None)
        self.reasons.clear()  # free capacity changed

    def future_place(self, w: Workload, placements: tuple[PodPlacement, ...]) -> None:
        for p in placements:
            self.future.take_placement(p, w)

    # -- victims ---------------------------------------------------------------------------------
    def victim_nodes(self, v: Workload) -> list[tuple[int, int]]:
        """(node index, milli held there) for each node the workload runs on (cached)."""
        hit = self._vnodes.get(v.id)
        if hit is None:
            pl = v.placements
            if len(pl) == 1:  # (most: one pod)
                n = self.future.index.get(pl[0].node)
                hit = self._vnodes[v.id] = [] if n is None else [(n, pl[0].milli * len(pl[0].gpus))]
                return hit
            per: dict[int, int] = {}
            for p in pl:
                n = self.future.index.get(p.node)
                if n is not None:
                    per[n] = per.get(n, 0) + p.milli * len(p.gpus)
            hit = self._vnodes[v.id] = sorted(per.items())
        return hit

    def victim_cost(self, v: Workload) -> float:
        hit = self._vcost.get(v.id)
        if hit is None:
            hit = self._vcost[v.id] = lost_gpu_seconds(v, self.now_t, self.amounts[v.id][0])
        return hit

    def _note_starting(self, wid: str, d: int) -> None:
        """Note that a waiting workload starts (reserved, or bound: ``d`` +1) or no longer does
        (its reservation rolled back: -1), for ``runs_lower_priority``."""
        w = self.by_id.get(wid)
        if w is not None:
            self._note_starts((w,), d)

    def _note_starts(self, ws: Iterable[Workload], d: int) -> None:
        """``_note_starting`` for each of ``ws`` (intake notes a run of holders at once), each
        queue's lowest priority dropped once."""
        starting, prios_of, PENDING = self._starting, self._starting_prios, Phase.PENDING
        queues: set[str] = set()
        for w in ws:
            if w.phase is not PENDING or not w.preemptible or (w.id in starting) == (d > 0):
                continue  # (reserved, then bound: counted once)
            if d > 0:
                starting.add(w.id)
            else:
                starting.discard(w.id)
            queues.add(w.queue)
            prios = prios_of.setdefault(w.queue, {})
            prios[w.priority] = prios.get(w.priority, 0) + d
        for q in queues:
            self._drop_lowest(q)

    def could_return(self, v: Workload, left: float, guar: float, taken: set[str]) -> bool:
        """Would ``v``, evicted with its side left holding ``left`` GPUs against a guarantee of
        ``guar``, fit back within it, preempting the lower-priority preemptible workloads of its
        queue that keep running?"""
        lower = 0.0
        for w in self.preemptible_by_queue(young=True).get(v.queue, ()):
            if w.priority < v.priority and w.id not in self.evicted and w.id not in taken:
                lower += self.amounts[w.id][0]
        return left - lower + self.amounts[v.id][0] <= guar + EPS

    def runs_lower_priority(self, v: Workload, taken: set[str]) -> bool:
        """Does a preemptible workload of ``v``'s queue with a lower priority keep running (not
        evicted this cycle, nor in ``taken``), or does one start (bound this cycle, or about to on a
        reservation)? Once it runs, ``v``, pending again, would preempt it."""
        prios = self._starting_prios.get(v.queue)
        if prios and any(n > 0 and p < v.priority for p, n in prios.items()):
            return True
        for w in self._ranked(v.queue):
            if w.priority >= v.priority:
                return False
            if w.id not in self.evicted and w.id not in taken:
                return True
        return False

    def lowest_running_priority(self, q: str) -> float:
        """The lowest priority among ``q``'s preemptible workloads that keep running (not evicted
        this cycle) or start: ``runs_lower_priority(v, set())`` is ``v.priority`` above it (inf:
        none)."""
        hit = self._lowest.get(q)
        if hit is None:
            prios = self._starting_prios.get(q)
            hit = min((p for p, n in prios.items() if n > 0), default=math.inf) if prios else math.inf
            for w in self._ranked(q):
                if w.priority >= hit:
                    break
                if w.id not in self.evicted:
                    hit = w.priority
                    break
            self._lowest[q] = hit
        return hit

    def lowest_running_priorities(self, qs: np.ndarray) -> np.ndarray:
        """``lowest_running_priority`` by queue number (of ``tree.queues``), brought up to date for
        the numbers ``qs`` (the others' entries are not to be read): kept as the queues change."""
        if self._lowest_vec is None:
            n = len(self.queue_names)
            self._lowest_vec, self._lowest_known = np.full(n, math.inf), np.zeros(n, dtype=bool)
        vec, known, names = self._lowest_vec, self._lowest_known, self.queue_names
        for qi in qs[~known[qs]].tolist():
            vec[qi] = self.lowest_running_priority(names[qi])
            known[qi] = True
        return vec

    def _drop_lowest(self, q: str) -> None:
        """``q``'s workloads that run or start changed: its lowest priority is worked out again."""
        self._lowest.pop(q, None)
        if self._lowest_known is not None:
            self._lowest_known[self.queue_index[q]] = False

    def _ranked(self, q: str) -> list[Workload]:
        """``q``'s preemptible running workloads (young ones too), lowest priority first; kept for
        the cycle (callers skip ``evicted``)."""
        ranked = self.cache.setdefault("preemptible-ranked", {})
        mine = ranked.get(q)
        if mine is None:
            mine = ranked[q] = sorted(self.preemptible_by_queue(young=True).get(q, ()), key=_PRIORITY)
        return mine

    def preemptible_by_queue(self, young: bool = False) -> dict[str, list[Workload]]:
        """The preemptible running workloads by queue, grouped once a cycle (in running order;
        those evicted since stay listed: callers skip ``evicted``). ``young``: those still inside
        ``min_runtime`` too."""
        key = "preemptible-by-queue-young" if young else "preemptible-by-queue"
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = {}
            self.preemptible_running()  # fills the cache it groups
            for w in self.running if young else self.cache["preemptible"][0]:
                if w.preemptible:
                    hit.setdefault(w.queue, []).append(w)
        return hit

    def preemptible_running(self, protected: list[Workload] | None = None) -> list[Workload]:
        """Running workloads that may be preempted now (not evicted yet this cycle); those still
        inside ``min_runtime`` go to ``protected`` (when given) instead."""
        hit = self.cache.get("preemptible")
        if hit is None:
            t, ok, young = self.now_t, [], []
            for w in self.running:
                if w.preemptible:
                    (ok if w.started_at is None or t - w.started_at >= self.cfg.min_runtime else young).append(w)
            hit = self.cache["preemptible"] = (ok, young)
        ev = self.evicted
        if protected is not None:
            protected.extend(w for w in hit[1] if w.id not in ev)
        return [w for w in hit[0] if w.id not in ev] if ev else list(hit[0])


def queue_order(ctx: Cycle) -> Callable[[str, float], tuple]:
    """Hierarchical order of queues for a workload of ``amount`` GPUs: compare the queues'
    ancestries level by level from the root. At each level, a workload that keeps the queue within
    its deserved quota goes ahead of one that would take it above (guarantees before borrowing,
    as Run:ai orders them; the guarantee is the deserved quota shrunk where quotas over-commit the
    cluster); then queues by GPUs held above fair share (furthest below first), then
    queue priority. These are the measures reclaim's rules use, so what a reclaim frees ranks the
    reclaimer first, never the victim."""
    const = {x: (ctx.guar[x] + EPS, ctx.fair[x].get("gpu", 0.0), -spec.priority)
             for x, spec in ctx.tree.queues.items()}
    held_of = ctx.held

    def key(q: str, amount: float) -> tuple:
        out = []
        for x in ctx.tree.path(q):
            deserved, fair, prio = const[x]
            held = held_of(x)
            out.append((held + amount > deserved, held - fair, prio, x))
        return tuple(out)
    return key
