"""Victim planning: which running workloads to preempt so that a pending one fits.

A bounded search rather than greedy-then-refuse. Each attempt is a greedy pass that picks, at
every step, the best remaining victim by ``victims.victim_key`` with every queue's excess over its
fair share re-evaluated after each choice (so a plan stops taking from a queue that has dropped
to its share), skips victims its ``Budget`` refuses, stops as soon as the workload fits, and
then prunes victims that turned out unnecessary. When the first attempt had to skip a victim (a
whole gang its budget refused after cheaper victims of the same queue were taken, say), further
attempts start from each refused victim (not from one the budget refuses even before any victim
is taken: that attempt would replay the first), and one takes the largest victims first. The best plan
wins: least work lost, then fewest victims, then the most over-quota queues, then node name
(among the nodes the walk reaches: it stops at the first whose bound equals the best plan's cost).

A single-pod workload is planned node by node (its pod needs room on one node); a gang over the
whole cluster. Budgets are the policy hooks: ``Budget`` (any victim; priority preemption within
a queue) and ``ReclaimBudget`` (only borrowed capacity, no ping-pong).
"""
from __future__ import annotations

import heapq
import itertools
import math
import operator
from typing import Callable, Iterable, Iterator

import numpy as np

from . import cycle
from .cycle import Candidate, Cycle, Statement, fits_on
from .fairshare import EPS
from .model import MILLI, PodPlacement, Workload
from .victims import lost_gpu_seconds_all

MAX_ATTEMPTS = 5  # greedy passes per node (single pod) or per plan (gang)
# what the victim index reads of each victim, in one read
_VICTIM = operator.attrgetter("id", "queue", "priority", "checkpoint_on_signal", "started_at", "last_checkpoint_at")
_FIRST = operator.itemgetter(0)
_ID = operator.attrgetter("id")
_UNSET: dict = {}  # a budget's ``why`` before a search that may leave a refusal
_UNJUDGED = object()  # a victim ``_Refusals`` has not judged yet


class Budget:
    """Which victims a plan may take. The default takes any (priority preemption in a queue)."""

    refused = ""
    why: dict = {}  # why ``refused`` (never mutated: a refusal replaces it)

    def reset(self) -> None:
        pass

    def allows(self, v: Workload) -> bool:
        return True

    def take(self, v: Workload) -> None:
        pass

    def accepts(self, chosen: list[Workload]) -> bool:
        """Is the whole plan acceptable (after its victims were chosen one by one)?"""
        return True


class QueueSet:
    """A set of queues as a mark per queue number (of ``tree.queues``): what a reclaim's candidate
    queues are, made side by side without a set of names (``ReclaimBudget.candidate_queues``),
    and what a walk's queue views are keyed by. Reads as a set of names."""

    __slots__ = ("mask", "_index", "_marks")

    def __init__(self, mask: np.ndarray, index: dict[str, int]):
        self.mask, self._index, self._marks = mask, index, None

    def __contains__(self, q: str) -> bool:
        if self._marks is None:
            self._marks = self.mask.tolist()
        i = self._index.get(q)
        return i is not None and self._marks[i]

    def __bool__(self) -> bool:
        return bool(self.mask.any())

    def __iter__(self) -> Iterator[str]:
        names = list(self._index)
        return (names[i] for i in np.flatnonzero(self.mask).tolist())


class ReclaimBudget(Budget):
    """Which borrowers a reclaim may take. Queues are compared where their ancestries split (the
    reclaimer's side and the victim's side), each against its **guarantee** (its deserved quota,
    shrunk in proportion where quotas over-commit the cluster) and its **fair share**. A victim
    may go by either rule:

    * guarantee: the reclaimer's side ends within its guarantee, and the victim's side still holds
      more than its own guarantee before this victim goes (only borrowed capacity is taken back,
      even if a whole gang must go); a victim that leaves its side further below its guarantee
      than the reclaimer's side lacks now only if it could not come back, by this rule
      (``Cycle.could_return``) or by the fair-share one (``_refilled``);
    * fair share: the victim's side is better off, relative to its fair share, than the
      reclaimer's side, and keeps its guarantee unless it holds more than its fair share. A plan
      with such a victim must bring the two sides closer to their fair shares: the sum of the
      squares of (held - fair share) over the sides involved strictly falls (``accepts``). Whole
      workloads move, so a reclaimer may end above its share by less than a workload, and a
      victim below it, but never so that the shares end further from fair than they were. Nor
      so that the victim's side ends below its guarantee, by enough to take one of its victims
      back by the guarantee rule, while the reclaimer's side ends above its own (``accepts``).

    Neither rule allows the reverse move afterwards (the squared distance only falls; what the
    guarantee rule takes whole, the fair-share rule does not hand back to a side that would
    reclaim it again), and allocation ranks queues by the same
    measures (within guarantee first, then GPUs above fair share), so what a reclaim frees goes to
    the reclaimer and capacity never ping-pongs. Victims already taken in the plan count against
    their side. ``refused`` names the last side a victim was refused for, ``why`` says why."""

    def __init__(self, ctx: Cycle, reclaimer: str, amount: float, back: float = 0.0):
        self.ctx, self.reclaimer, self.amount = ctx, reclaimer, amount
        # GPUs of the reclaimer's own lower-priority workloads that the same plan preempts
        # (``preempt._combined``): they wait to come back, as borrowers wherever room is left, so
        # the reclaimer's side is measured with them held (``back``), and a victim the guarantee
        # rule would leave exactly as far below its guarantee as that side lacks stays (else the
        # two queues' combined plans take the same GPU from each other for ever)
        self.back = back
        self.sides: dict[str, tuple] = {}  # victim queue -> (side, its over, its held, its guarantee,
        #                                    reclaimer side's over, reclaimer side within guarantee after,
        #                                    reclaimer side)
        self._by_side: dict[str, tuple] = {}  # the same, by side
        self.gone: dict[str, float] = {}
        self.inside: dict[str, float] = {}  # GPUs taken in this pass from each queue below a victim's side
        self.by_share: set[str] = set()  # victims taken by the fair-share rule in this pass
        self.taken: set[str] = set()  # victims taken in this pass
        self.refused = ""
        self.why: dict = {}

    def _side(self, queue: str) -> tuple:
        hit = self.sides.get(queue)
        if hit is None:
            ctx = self.ctx
            aq, ap = ctx.tree.split(self.reclaimer, queue)
            hit = self._by_side.get(ap)  # queues of one side share its numbers
            if hit is None:
                hit = self._by_side[ap] = (
                    ap, ctx.over(ap), ctx.held(ap), ctx.guar[ap], self._over_mine(aq), self._within(aq), aq)
            self.sides[queue] = hit
        return hit

    def _within(self, aq: str) -> bool:
        """Does the reclaimer's side ``aq`` stay within its guarantee once this plan's need is met?"""
        return self.ctx.held(aq) + self.amount <= self.ctx.guar[aq] + EPS

    def _mine(self, aq: str) -> float:
        """GPUs the reclaimer's side ``aq`` holds once this plan's need is met, the plan's own
        preempted workloads counted as held (``back``)."""
        return self.ctx.held(aq) + self.amount + self.back

    def _over_mine(self, aq: str) -> float:
        """GPUs the reclaimer's side ``aq`` holds above its fair share now, the plan's own
        preempted workloads counted as held (``back``)."""
        return self.ctx.over(aq) + self.back

    def _wants(self, aq: str) -> float:
        """GPUs the reclaimer's side ``aq`` still asks for beyond what it holds, is promised and
        this plan's need (its own preempted workloads counted as held)."""
        ctx = self.ctx
        return max(0.0, ctx.demand_gpu[aq] - ctx.effective(aq)[0] - ctx.reserved[aq] - self.amount - self.back)

    def _short(self, aq: str) -> float:
        """How far the reclaimer's side ``aq`` is below its guarantee now (GPUs; <= 0: not)."""
        ctx = self.ctx
        return ctx.guar[aq] - ctx.effective(aq)[0] - ctx.reserved[aq] - self.back

    def _refilled(self, aq: str, amt: float) -> bool:
        """Would the reclaimer's side ``aq`` end above its fair share once what this plan frees
        beyond the need (``amt`` more now) is lent on to it, as far as it wants more? Then a whole
        victim that leaves its own side below its guarantee could come back by the fair-share rule
        (its queue, below its guarantee, may reclaim a workload of its size)."""
        ctx = self.ctx
        mine = self._mine(aq)
        freed = sum(self.gone.values()) + amt - self.amount
        wants = max(0.0, ctx.demand_gpu[aq] - mine)
        return mine + min(max(0.0, freed), wants) > ctx.fair[aq].get("gpu", 0.0) + EPS

    def candidate_side(self, queue: str) -> bool:
        """Could any workload of ``queue`` be a victim (before any is taken)?"""
        aq, ap = self.ctx.tree.split(self.reclaimer, queue)
        return self._admits(ap, self._within(aq))

    def _admits(self, side: str, within: bool) -> bool:
        """Could any victim of ``side`` go: is it above its fair share, or above its guarantee
        while the reclaimer's side stays ``within`` its own?"""
        above_share, above_guarantee = self.ctx.side_flags(side)
        return above_share or (within and above_guarantee)

    def candidate_queues(self, queues: Iterable[str]) -> QueueSet:
        """The queues among ``queues``, the reclaimer's own left out, that ``candidate_side``
        admits. Queues whose ancestries part from the reclaimer's at the same place share a side,
        so each sibling subtree along the reclaimer's path is judged once, all of them at once
        from the cycle's per-queue numbers (``Cycle.side_flags``'s tests; the grouping is kept
        for the cycle, per reclaimer and ``queues`` object), and its members marked at once."""
        groups, alone = self._groups(queues)
        ctx = self.ctx
        mask = np.zeros(len(ctx.queue_names), dtype=bool)
        if groups[0]:
            members, sides, level, levels = groups
            within = np.array([self._within(aq) for aq in levels], dtype=bool)
            over, held, guar = ctx.over_all()[sides], ctx.held_all()[sides], ctx.guar_all()[sides]
            admitted = (over > EPS) | (within[level] & (held > guar + EPS))  # ``_admits``, side by side
            picked = list(itertools.compress(members, admitted.tolist()))
            if picked:
                mask[np.concatenate(picked)] = True
        index = ctx.queue_index
        for q in alone:
            if self.candidate_side(q):
                mask[index[q]] = True
        return QueueSet(mask, index)

    def _groups(self, queues: Iterable[str]) -> tuple[tuple[list[np.ndarray], np.ndarray, np.ndarray, list[str]],
                                                      list[str]]:
        """``queues`` split into sides of the reclaimer: per sibling subtree along its path, its
        members (queue numbers), the side (a queue number of ``tree.queues``) and the reclaimer's side against it
        (an index into the last list, of those names); and the reclaimer's ancestors and
        descendants among them (queues that hold workloads themselves, each its own side)."""
        ctx, r = self.ctx, self.reclaimer
        memo = ctx.cache.setdefault("reclaim-sides", {})
        hit = memo.get((r, id(queues)))
        if hit is not None and hit[0] is queues:
            return hit[1], hit[2]
        tree = ctx.tree
        # each subtree's members among ``queues``, shared by the reclaimers that ask of them
        shared = ctx.cache.setdefault("reclaim-side-members", {})
        hit = shared.get(id(queues))
        if hit is None or hit[0] is not queues:
            hit = shared[id(queues)] = (queues, set(queues), {})
        among, by_parent = hit[1], hit[2]
        members: list[np.ndarray] = []  # each subtree's members among ``queues``, as queue numbers
        sides: list[int] = []
        level: list[int] = []
        path = tree.path(r)
        for i, mine in enumerate(path):
            # the parent's children that have members, in order (shared by the reclaimers below
            # it), less the reclaimer's own
            parent = path[i - 1] if i else None
            kids = by_parent.get(parent)
            if kids is None:
                number, names, mem, nums = ctx.queue_index, {}, [], []
                for s in tree.children.get(parent, ()):
                    m = tree.subtree(s.name) & among
                    if m:
                        names[s.name] = len(mem)
                        mem.append(np.fromiter(map(number.__getitem__, m), dtype=np.int64, count=len(m)))
                        nums.append(number[s.name])
                kids = by_parent[parent] = (names, mem, nums)
            names, mem, nums = kids
            k = names.get(mine)
            if k is None:
                members += mem
                sides += nums
            else:
                members += mem[:k] + mem[k + 1:]
                sides += nums[:k] + nums[k + 1:]
            level += [i] * (len(sides) - len(level))
        groups = (members, np.array(sides, dtype=np.int64), np.array(level, dtype=np.int64), list(path))
        alone = sorted(q for q in (set(path) | tree.subtree(r)) & among if q != r)
        memo[r, id(queues)] = (queues, groups, alone)  # ``queues`` kept: its id is not reused meanwhile
        return groups, alone

    def reset(self) -> None:
        self.gone.clear()
        self.inside.clear()
        self.by_share.clear()
        self.taken.clear()

    def _inner(self, v: Workload, side: str) -> tuple[str, ...]:
        """The victim's queue and its ancestors below its side (empty when its queue is the side)."""
        if v.queue == side:
            return ()
        path = self.ctx.tree.path(v.queue)
        return path[path.index(side) + 1:]

    def _below_inside(self, v: Workload, side: str, amt: float) -> str | None:
        """The first queue below the victim's side, on its way down to the victim's queue, that
        the victim would leave further from its own fair share than it is (it holds less than half
        the victim above its share, what this pass took from it counted as gone), or None."""
        ctx, half = self.ctx, amt / 2.0
        for x in self._inner(v, side):
            if ctx.over(x) - self.inside.get(x, 0.0) + EPS < half:
                return x
        return None

    def allows(self, v: Workload) -> bool:
        side, over, held, guar, reclaimer_before, guaranteed, aq = self._side(v.queue)
        gone = self.gone.get(side, 0.0)
        amt = self.ctx.amounts[v.id][0]
        if guaranteed and held - gone > guar + EPS:
            left = held - gone - amt
            if (left >= guar - EPS or guar - left <= self._short(aq) + (-EPS if self.back else EPS)
                    or not (self.ctx.could_return(v, left, guar, self.taken) or self._refilled(aq, amt))):
                # guarantee: take borrowed capacity back; a whole victim that takes its side below
                # its guarantee by more than the reclaimer's side lacks only if it cannot come back:
                # it does not fit that guarantee, even with its queue's lower-priority workloads
                # preempted, and the reclaimer's side does not end above its fair share once what
                # the plan frees is lent on to it; else the queues would trade it for ever
                return True
            self.refused = side
            self.why = {"holder": side, "held": held - gone, "fair": self.ctx.fair[side].get("gpu", 0.0),
                        "guarantee": guar, "rule": "guarantee"}
            return False
        share = over - gone > reclaimer_before + EPS
        inner = None
        if share and (held - gone - amt >= guar - EPS or over - gone > EPS):
            inner = self._below_inside(v, side, amt)
            if inner is None and not self.ctx.runs_lower_priority(v, self.taken):
                self.by_share.add(v.id)
                return True  # fair share: rebalance, never below a guarantee of a queue within its share
            # inside its side, only from a queue above its own share (``inside``); and its queue's
            # lower-priority workloads go first (``priority``)
            rule = "inside" if inner is not None else "priority"
        else:
            rule = "guarantee" if share else "share"
        self.refused = side
        self.why = {"holder": side, "held": held - gone, "fair": self.ctx.fair[side].get("gpu", 0.0),
                    "guarantee": guar, "rule": rule}
        if rule == "priority":
            self.why["queue"] = v.queue
        elif rule == "inside":
            self.why.update(below=inner, below_held=self.ctx.held(inner) - self.inside.get(inner, 0.0),
                            below_fair=self.ctx.fair[inner].get("gpu", 0.0))
        return False

    def take(self, v: Workload) -> None:
        self.taken.add(v.id)
        side = self._side(v.queue)[0]
        amt = self.ctx.amounts[v.id][0]
        self.gone[side] = self.gone.get(side, 0.0) + amt
        for x in self._inner(v, side):
            self.inside[x] = self.inside.get(x, 0.0) + amt

    def accepts(self, chosen: list[Workload]) -> bool:
        """Does the plan bring the shares closer to fair (needed once a victim went by the fair-share
        rule)? Per level where the reclaimer's side meets victims' sides: the sum of squared
        distances from fair share (GPUs held - fair share) over those sides strictly falls, the
        reclaimer's side counted with what the victims free beyond its need as far as it wants more
        (a small reclaim that evicts a large victim would otherwise hand the rest on to it)."""
        if not any(v.id in self.by_share for v in chosen):
            return True
        levels: dict[str, dict[str, float]] = {}
        smallest: dict[str, float] = {}  # victim side -> its smallest victim in the plan
        for v in chosen:
            side, *_, aq = self._side(v.queue)
            lv = levels.setdefault(aq, {})
            amt = self.ctx.amounts[v.id][0]
            lv[side] = lv.get(side, 0.0) + amt
            smallest[side] = min(smallest.get(side, amt), amt)
        ctx = self.ctx
        for aq, taken in levels.items():
            mine = self._mine(aq)
            if mine > ctx.guar[aq] + EPS:
                # the reclaimer's side ends above its guarantee: a victim side this plan takes below
                # its own guarantee, far enough that one of its victims fits back within it, would
                # take that victim back by the guarantee rule (and the whole workloads that rule
                # may take, with it): capacity would move back and forth for ever
                for side, amt in taken.items():
                    left = ctx.held(side) - amt
                    if left + smallest[side] <= ctx.guar[side] + EPS:
                        self.refused = side
                        self.why = {"holder": side, "held": left + amt, "fair": ctx.fair[side].get("gpu", 0.0),
                                    "guarantee": ctx.guar[side], "rule": "back", "taken": amt}
                        return False
            before = self._over_mine(aq)
            # what the victims free beyond the reclaimer's need counts as the reclaimer's side's as
            # far as that side wants more (it would take it next, by lending or by priority)
            excess = max(0.0, sum(taken.values()) - self.amount)
            after = before + self.amount + min(excess, self._wants(aq))
            change = after * after - before * before
            for side, amt in taken.items():
                o = self.ctx.over(side)
                change += (o - amt) * (o - amt) - o * o
            if change >= -EPS:
                self.refused = next(iter(taken))
                side = self.refused
                self.why = {"holder": side, "held": self.ctx.held(side),
                            "fair": self.ctx.fair[side].get("gpu", 0.0), "guarantee": self.ctx.guar[side],
                            "rule": "whole", "taken": taken[side]}
                return False
        return True


class _Pool:
    """Candidate victims grouped by queue, each group in its static victim order; ``pick``
    returns the best head across queues with every queue's excess re-evaluated."""

    def __init__(self, ctx: Cycle, victims: list[Workload]):
        self.ctx = ctx
        groups: dict[str, list[Workload]] = {}
        for v in victims:
            groups.setdefault(v.queue, []).append(v)
        t = ctx.now_t
        cost = ctx.victim_cost
        # each victim's ``victim_key`` less the queue's excess (constant within a queue): the work
        # it loses, its priority, its start (negated), its id; fixed for the cycle, so worked out
        # once per victim for every search (and sorted by: no two victims share an id)
        known = ctx.cache.get("victim-order-keys")
        if known is None:
            known = ctx.cache["victim-order-keys"] = {}
        self.keys = keys = {}
        for q, lst in groups.items():
            ks = []
            for v in lst:
                k = known.get(v.id)
                if k is None:
                    k = known[v.id] = (cost(v), v.priority, -(v.started_at if v.started_at is not None else t), v.id)
                ks.append(k)
            if len(lst) > 1:
                pairs = sorted(zip(ks, lst), key=_FIRST)
                groups[q] = [v for _, v in pairs]
                keys[q] = [k for k, _ in pairs]
            else:
                keys[q] = ks
        self.groups = groups
        self.excess = excess = {q: ctx.over(q) for q in groups}
        # every queue's first victim, by its key with nothing gone yet: the start of each pass
        self.heads = [((k[0][0], 0.0 - excess[q], *k[0][1:]), q, 0) for q, k in keys.items()]
        heapq.heapify(self.heads)

    def greedy(self, st: Statement, budget: Budget, done: Callable[[float], bool],
               first: Workload | None = None, largest: bool = False) -> tuple[list[Workload], list[Workload]]:
        """One greedy pass: (victims taken until ``done(freed)``, or [] if never; victims
        refused). The victims stay removed from ``st``'s view; the caller rolls back."""
        ctx = self.ctx
        budget.reset()
        chosen: list[Workload] = []
        refused: list[Workload] = []
        freed = 0.0
        gone: dict[str, float] = {}
        idx = {q: 0 for q in self.groups}
        heads = self.heads.copy()
        taken: set[str] = set()
        order = None
        if largest:
            order = sorted((v for lst in self.groups.values() for v in lst),
                           key=lambda v: (-ctx.amounts[v.id][0], ctx.victim_cost(v), v.id))
        nxt = [first] if first is not None else []
        while True:
            if nxt:
                v = nxt.pop()
            elif order is not None:
                v = next((x for x in order if x.id not in taken), None)
            else:
                v = self._pick(heads, idx, gone, taken)
            if v is None:
                return [], refused
            taken.add(v.id)
            if not budget.allows(v):
                refused.append(v)
                continue
            st.remove(v, v.placements)
            budget.take(v)
            amt = ctx.amounts[v.id][0]
            gone[v.queue] = gone.get(v.queue, 0.0) + amt
            freed += amt
            chosen.append(v)
            if done(freed):
                return chosen, refused

    def _pick(self, heads: list, idx: dict[str, int], gone: dict[str, float], taken: set[str]) -> Workload | None:
        """The next victim: the least ``victim_key`` among the queues' first victims not taken.
        ``heads`` is a heap of (key, queue, index) with one entry per queue that has victims left,
        its key never above the queue's true one (a queue's key only rises: its victims are in
        key order and what is gone from it only grows), so an entry found out of date is put
        right and the heap asked again; the least up-to-date entry is the least of all."""
        keys, excess, groups = self.keys, self.excess, self.groups
        while heads:
            key, q, i = heads[0]
            lst = groups[q]
            n = len(lst)
            j = idx[q]
            while j < n and lst[j].id in taken:
                j += 1
            idx[q] = j
            if j == n:
                heapq.heappop(heads)
                continue
            s = keys[q][j]
            k = (s[0], gone.get(q, 0.0) - excess[q], s[1], s[2], s[3])
            if i == j and k == key:
                return lst[j]
            heapq.heapreplace(heads, (k, q, j))
        return None


def _prune(ctx: Cycle, st: Statement, chosen: list[Workload], done: Callable[[float], bool]) -> list[Workload]:
    """Drop victims the plan turned out not to need (latest first)."""
    freed = sum(ctx.amounts[v.id][0] for v in chosen)
    for v in list(reversed(chosen)):
        mark = st.mark()
        st.place(v, v.placements)
        amt = ctx.amounts[v.id][0]
        if done(freed - amt):
            chosen = [x for x in chosen if x is not v]
            freed -= amt
        else:
            st.rollback(mark)
    return chosen


def _cost(ctx: Cycle, chosen: list[Workload]) -> tuple:
    return (round(sum(ctx.victim_cost(v) for v in chosen), 6), len(chosen),
            -min(ctx.over(v.queue) for v in chosen))


def _search(ctx: Cycle, c: Candidate, victims: list[Workload], budget: Budget,
            fits: Callable[[], bool], need: float, need_freed: float) -> tuple[tuple, list[Workload]] | None:
    """The best victim set among a few greedy attempts (module doc); nothing changes."""
    pool = _Pool(ctx, victims)
    free0 = 0.0

    def done(freed: float) -> bool:
        return freed + EPS >= need_freed and freed + free0 + EPS >= need and fits()

    best: tuple[tuple, list[Workload]] | None = None
    st = Statement(ctx, ctx.future)
    attempts: list[tuple[Workload | None, bool]] = [(None, False)]
    tried = 0
    first_pass: tuple | None = None  # its refused victims, the refusal it left, and whether ``accepts`` turned it down
    while attempts and tried < MAX_ATTEMPTS:
        first, largest = attempts.pop(0)
        tried += 1
        if first is not None and cycle.SHORTCUTS and _replays(budget, first, first_pass):
            budget.refused, budget.why = first_pass[1]
            continue
        chosen, refused = pool.greedy(st, budget, done, first, largest)
        if chosen:
            chosen = _prune(ctx, st, chosen, done)
        turned_down = bool(chosen) and not budget.accepts(chosen)
        if turned_down:
            chosen = []
        if chosen:  # (empty after pruning: it fits without victims, which is no plan to make)
            cost = _cost(ctx, chosen)
            if best is None or cost < best[0]:
                best = (cost, chosen)
        st.rollback()
        if tried == 1:
            first_pass = (refused, (budget.refused, budget.why), turned_down)
            if refused:  # the first pass had to skip victims: try starting from them
                attempts.extend((v, False) for v in refused[:MAX_ATTEMPTS - 2])
            if refused or len(chosen) > 1:  # fewer, larger victims may lose no more work
                attempts.append((None, True))
    if best is None and first_pass is not None and first_pass[0] and c.req.milli == MILLI and not c.req.gpu_memory:
        best = _whole_gpus_only(ctx, victims, budget, st, done)
    return best


def _whole_gpus_only(ctx: Cycle, victims: list[Workload], budget: Budget, st: Statement,
                     done: Callable[[float], bool]) -> tuple[tuple, list[Workload]] | None:
    """One more pass for a workload of whole GPUs that no pass could plan for because its budget
    refused victims: over only the victims on GPUs that the victims there could free whole. A
    fraction sharing its GPU with a workload that stays frees nothing such a workload can use,
    yet the passes above may take it and run into a guarantee before they reach victims that
    would make room. Nothing changes where a plan was found; a pass that finds none leaves the
    refusal the others left."""
    fut = ctx.future
    index = fut.index
    held: dict[tuple[int, int], int] = {}  # (node, GPU) -> the GPU milli the victims hold there
    for v in victims:
        for p in v.placements:
            n = index.get(p.node)
            if n is not None:
                for g in p.gpus:
                    held[n, g] = held.get((n, g), 0) + p.milli
    useful = []
    for v in victims:
        for p in v.placements:
            n = index.get(p.node)
            if n is None or not fut.schedulable[n] or any(
                    int(fut.gpu_free[n, g]) + held[n, g] < MILLI for g in p.gpus):
                break
        else:
            useful.append(v)
    if not useful or len(useful) == len(victims):
        return None
    left = (budget.refused, budget.why)
    chosen, _ = _Pool(ctx, useful).greedy(st, budget, done)
    if chosen:
        chosen = _prune(ctx, st, chosen, done)
    found = (_cost(ctx, chosen), chosen) if chosen and budget.accepts(chosen) else None
    st.rollback()
    if found is None:
        budget.refused, budget.why = left
    return found


def _replays(budget: Budget, v: Workload, first_pass: tuple) -> bool:
    """Would the pass that starts from ``v``, a victim the first pass refused, only replay the
    first pass? So it is when the budget refuses ``v`` even before any victim is taken: the pass
    then takes what the first took, in the same order (a refusal changes nothing the budget or
    the view reads), and plans the same. It also leaves the same refusal in the budget, the last
    one it met (or ``accepts``'s), unless ``v`` was the first pass's last refusal: then the pass is
    made."""
    refused, _, turned_down = first_pass
    if refused[-1] is v and not turned_down:
        return False
    left = (budget.refused, budget.why)
    budget.reset()
    go = budget.allows(v)
    budget.reset()
    budget.refused, budget.why = left
    return not go


def plan(ctx: Cycle, c: Candidate, victims: list[Workload] | None, budget: Budget,
         need_freed: float = 0.0, queues: set[str] | None = None
         ) -> tuple[list[Workload], np.ndarray | None] | None:
    """Victims whose removal from the future view lets ``c`` fit, losing the least work, and the
    node mask to place it with; None if there are none. The candidates are ``victims``, or (when
    ``victims`` is None) every preemptible running workload of ``queues``. ``need_freed``: GPUs
    the victims must give back in all (priority preemption at a queue's limit). Nothing changes."""
    if c.w.pods == 1:
        return _plan_single(ctx, c, victims, budget, need_freed, queues)
    if victims is None:
        per_node = _index(ctx).per_node
        seen: set[str] = set()
        victims = [v for vs in per_node.values() for v, _ in vs
                   if v.queue in queues and v.id not in ctx.evicted and not (v.id in seen or seen.add(v.id))]
    fut = ctx.future
    free = float(fut.gpu_free[fut.schedulable].sum()) / 1000.0

    def fits() -> bool:
        return ctx.fits(c)

    found = _search(ctx, c, victims, budget, fits, c.amount[0] - free, need_freed)
    return None if found is None else (found[1], None)


class _VictimBook:
    """The victim index's facts, kept from one cycle to the next beside the held book
    (``HeldBook.victims``) while its node list and the queues stay: one slot per victim (its id,
    workload, queue number, priority, GPUs, the fields lost work reads, its nodes) and one entry
    per (victim, node) in arrays, unsorted. A build takes out the victims that are gone or named
    as changed (``HeldBook.changed``) and reads only the ones that came in: what a fresh build
    read of all 10,000 victims of a large cycle, each lying elsewhere in memory, was most of its
    cost. The order of a node's victims and of equal entries is not kept (nothing the index
    answers depends on it: ``_VictimIndex``)."""

    def __init__(self, queues: tuple[str, ...]):
        self.queues = queues  # the queue numbers' names, in order
        self.qn = {q: i for i, q in enumerate(queues)}
        self.slot_of: dict[str, int] = {}  # victim id -> its slot
        self.free: list[int] = []  # slots given back
        self.vid: list[str | None] = []
        self.node_lists: list[list[tuple[int, int]]] = []  # slot -> its (node, GPU milli)
        cap = 0
        self.queue_s = np.zeros(cap, dtype=np.int64)
        self.prio_s = np.zeros(cap)
        self.gpus_s = np.zeros(cap)
        self.signal_s = np.zeros(cap, dtype=bool)
        self.started_s = np.zeros(cap)  # (None: nan)
        self.last_s = np.zeros(cap)
        self.live_s = np.zeros(cap, dtype=bool)
        self.e_slot = np.zeros(0, dtype=np.int64)  # per entry: its slot, node, GPU milli
        self.e_col = np.zeros(0, dtype=np.int64)
        self.e_milli = np.zeros(0, dtype=np.int64)
        self.per_node: dict[int, list[tuple[Workload, int]]] = {}
        self.per_node_q: dict[int, list[tuple[int, str]]] = {}

    def _grow(self, need: int) -> None:
        cap = len(self.live_s)
        if need <= cap:
            return
        new = max(need, 2 * cap, 64)
        for name in ("queue_s", "prio_s", "gpus_s", "signal_s", "started_s", "last_s", "live_s"):
            old = getattr(self, name)
            arr = np.zeros(new, dtype=old.dtype)
            arr[:cap] = old
            setattr(self, name, arr)

    def update(self, ctx: Cycle, victims: list[Workload], changed: set[str]) -> None:
        """Bring the book to ``victims`` (the cycle's, by id): out go the victims that are not
        among them or were named as changed, in come the others."""
        slot_of = self.slot_of
        if not slot_of:  # (a new book: every victim comes in, in the cycle's order)
            self._add(ctx, victims)
            return
        now = set(map(_ID, victims))
        gone = slot_of.keys() - now
        if changed:
            gone |= changed & slot_of.keys()
        touched: set[int] = set()
        if gone:
            dead = np.zeros(len(self.live_s), dtype=bool)
            for vid in gone:
                k = slot_of.pop(vid)
                dead[k] = True
                self.live_s[k] = False
                self.vid[k] = None
                self.free.append(k)
                touched.update(n for n, _ in self.node_lists[k])
                self.node_lists[k] = []
            keep = ~dead[self.e_slot]
            self.e_slot, self.e_col, self.e_milli = self.e_slot[keep], self.e_col[keep], self.e_milli[keep]
            per_node, per_node_q = self.per_node, self.per_node_q
            for n in touched:  # (a node's lists filtered as one)
                pairs = [(e, eq) for e, eq in zip(per_node[n], per_node_q[n]) if eq[1] not in gone]
                if pairs:
                    per_node[n] = [e for e, _ in pairs]
                    per_node_q[n] = [eq for _, eq in pairs]
                else:
                    del per_node[n], per_node_q[n]
        came = sorted(now - slot_of.keys())
        if came:
            self._add(ctx, list(map(ctx.by_id.__getitem__, came)))

    def _add(self, ctx: Cycle, new: list[Workload]) -> None:
        """Take in these victims (none of them in the book)."""
        if not new:
            return
        slot_of, qn = self.slot_of, self.qn
        self._grow(len(slot_of) + len(new))
        vids, queues, prios, signal, started, last = zip(*map(_VICTIM, new))
        slots = []
        for vid in vids:
            k = self.free.pop() if self.free else len(self.vid)
            if k == len(self.vid):
                self.vid.append(vid)
                self.node_lists.append([])
            else:
                self.vid[k] = vid
            slot_of[vid] = k
            slots.append(k)
        at = np.array(slots, dtype=np.int64)
        qs = list(map(qn.__getitem__, queues))
        self.queue_s[at] = qs
        self.prio_s[at] = prios
        self.gpus_s[at] = list(map(_FIRST, map(ctx.amounts.__getitem__, vids)))
        self.signal_s[at] = signal
        self.started_s[at] = np.array(started, dtype=float)
        self.last_s[at] = np.array(last, dtype=float)
        self.live_s[at] = True
        victim_nodes = ctx.victim_nodes
        e_slot, e_col, e_milli = [], [], []
        per_node, per_node_q = self.per_node, self.per_node_q
        for v, k, qi, vid in zip(new, slots, qs, vids):
            on = victim_nodes(v)
            self.node_lists[k] = on
            for n, m in on:
                e_slot.append(k)
                e_col.append(n)
                e_milli.append(m)
                lst = per_node.get(n)
                if lst is None:
                    per_node[n], per_node_q[n] = [(v, m)], [(qi, vid)]
                else:
                    lst.append((v, m))
                    per_node_q[n].append((qi, vid))
        if e_slot:
            i64 = np.int64
            self.e_slot = np.concatenate((self.e_slot, np.array(e_slot, dtype=i64)))
            self.e_col = np.concatenate((self.e_col, np.array(e_col, dtype=i64)))
            self.e_milli = np.concatenate((self.e_milli, np.array(e_milli, dtype=i64)))


def _victim_book(ctx: Cycle) -> _VictimBook:
    """The cycle's victim book: the one kept with its held book, brought up to date, or a new one."""
    queues = tuple(ctx.tree.queues)
    hb = ctx.waiting.held if ctx.waiting is not None else None
    book = hb.victims if hb is not None else None
    if book is None or book.queues != queues:  # (a new book takes every victim in: no changes to apply)
        book = _VictimBook(queues)
    book.update(ctx, ctx.preemptible_running(), hb.changed if hb is not None else set())
    if hb is not None:
        hb.victims, hb.changed = book, set()
    return book


class _VictimIndex:
    """Preemptible running workloads by node, as the cycle first asks for them (victims evicted
    since are filtered where they are used: the sums only over-estimate). Besides ``per_node``,
    one entry per (victim, node) in flat arrays sorted by node, so that a plan over a set of
    queues costs O(entries) rather than O(queues x nodes): ``starts`` opens each of ``nodes``'
    runs. Made from the victim book (``_VictimBook``), kept across cycles.

    Nothing it answers depends on the order of a node's victims or of its entries of one size:
    the sums are of integers, the bounds are minima and maxima, a search ranks victims by their
    keys (``_Pool``), ``_Refusals`` judges a node's victims as a set, and ``never_closer`` sums
    their GPUs exactly (``math.fsum``)."""

    def __init__(self, ctx: Cycle):
        book = _victim_book(ctx)
        self.qn = book.qn
        live = np.flatnonzero(book.live_s)
        self._book = book
        # lost work of every victim at once (the same doubles as ``Workload.lost_work``); the
        # cache of ``ctx.victim_cost`` filled
        cost_s = np.zeros(len(book.live_s))
        if live.size:
            cost_s[live] = lost_gpu_seconds_all(ctx.now_t, book.gpus_s[live], book.signal_s[live],
                                                book.started_s[live], book.last_s[live])
            vid = book.vid
            ctx._vcost.update(zip(map(vid.__getitem__, live.tolist()), cost_s[live].tolist()))
        # by node, the largest share first (``_nodes_from_index`` counts the fewest victims needed)
        top = int(book.e_milli.max()) if len(book.e_milli) else 0
        order = _stable_order(book.e_col, top - book.e_milli, top + 1)
        cols = book.e_col[order]
        self.slot = book.e_slot[order]
        self.milli = book.e_milli[order]
        self.queue = book.queue_s[self.slot]
        self.cost = cost_s[self.slot]
        entries = bool(len(cols))
        if entries:
            first = np.ones(len(cols), dtype=bool)
            first[1:] = cols[1:] != cols[:-1]
            self.starts = np.nonzero(first)[0]
        else:
            self.starts = np.zeros(0, dtype=np.int64)
        self.nodes = cols[self.starts]
        self.run_of = np.cumsum(first) - 1 if entries else np.zeros(0, dtype=np.int64)  # entry -> its run
        self.bounds = list(zip(self.starts.tolist(), self.starts[1:].tolist() + [len(cols)]))  # each run's entries
        self.lengths = np.diff(np.append(self.starts, len(cols)))
        self.holds = self.milli > 0  # entries that hold GPUs
        # each node's victims (and beside them, their queue numbers and ids: a walk filters a
        # node's victims by these without reading the workloads)
        self.per_node: dict[int, list[tuple[Workload, int]]] = book.per_node
        self.per_node_q: dict[int, list[tuple[int, str]]] = book.per_node_q
        self.views: dict[bytes, tuple] = {}  # candidate queues (their marks' bytes) -> ``_queue_view``
        self.last_view: tuple[bytes, tuple] | None = None  # the view last asked for
        self._by_queue: tuple[np.ndarray, np.ndarray] | None = None  # see ``entries_of_queues``
        self.queue_l = self.queue.tolist()
        self.milli_l = self.milli.tolist()
        self.cost_l = self.cost.tolist()
        self._facts: tuple | None = None
        self._by_slot: tuple | None = None  # see ``entries``
        self._dead: np.ndarray | None = None  # see ``evicted_entries``
        self._applied: set[str] = set()
        self._live: dict[int, tuple] = {}  # see ``live``
        self._dead_log: list[np.ndarray] = []  # the entries ``evicted_entries`` marked, step by step
        # a view's marks (by id, the array kept) -> (the marks, its entries, the GPU milli of its
        # larger entries before each on the node): ``_Skip.beyond``'s parts that stay for the cycle
        self.freed_before: dict[int, tuple] = {}

    def facts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per entry, its victim's GPUs and priority (arrays, made when a walk first needs them)."""
        if self._facts is None:
            self._facts = (self._book.gpus_s[self.slot], self._book.prio_s[self.slot])
        return self._facts

    def evicted_entries(self, evicted: set[str]) -> np.ndarray:
        """Per entry, is its victim in ``evicted`` (the cycle's evicted set)? Kept in step as
        victims are evicted, and worked out again when one was taken back (a rolled-back plan)."""
        if self._dead is None or not self._applied <= evicted:
            self._dead, self._applied = np.zeros(len(self.slot), dtype=bool), set()
            self._dead_log = []
            self._live.clear()
        new = evicted - self._applied
        if new:
            at = np.array(self.entries(new), dtype=np.int64)
            self._dead[at] = True
            self._dead_log.append(at)
            self._applied |= new
        return self._dead

    def live(self, sel: np.ndarray, evicted: set[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per entry, is its victim of a queue ``sel`` marks (by queue number) and not
        ``evicted``; and per run, how many such entries and the GPU milli they hold. Kept for
        the marks (the same array: a view's), brought up to date with the entries evicted since."""
        dead = self.evicted_entries(evicted)
        log = self._dead_log
        hit = self._live.get(id(sel))
        if hit is not None and hit[0] is sel:
            live, count, room = hit[2]
            if hit[1] < len(log):
                at = np.concatenate(log[hit[1]:])
                at = at[live[at]]  # (those still counted)
                live, count, room = live.copy(), count.copy(), room.copy()
                live[at] = False
                np.subtract.at(count, self.run_of[at], 1)
                np.subtract.at(room, self.run_of[at], self.milli[at])
        else:
            live = sel[self.queue] & ~dead
            starts = self.starts
            count = np.add.reduceat(live.astype(np.int64), starts)
            room = np.add.reduceat(np.where(live, self.milli, 0), starts)
        out = (live, count, room)
        self._live[id(sel)] = (sel, len(log), out)  # (``sel`` kept: its id is not reused meanwhile)
        return out

    def entries_of_queues(self, queues: list[int]) -> np.ndarray:
        """The entries of these queues (numbers), as an array."""
        if not queues:
            return np.zeros(0, dtype=np.int64)
        if self._by_queue is None:  # entries by queue (made when first asked)
            by = np.argsort(self.queue, kind="stable")
            self._by_queue = (by, np.searchsorted(self.queue[by], np.arange(len(self.qn) + 1)))
        by, opens = self._by_queue
        return np.concatenate([by[opens[q]:opens[q + 1]] for q in queues])

    def entries(self, victims: Iterable[str]) -> list[int]:
        """The entries of these victims (ids; those not in the index have none)."""
        if self._by_slot is None:  # entries by slot (made when first asked)
            by = np.argsort(self.slot, kind="stable")
            self._by_slot = (by, self.slot[by])
        by, slots = self._by_slot
        slot_of = self._book.slot_of
        out: list[int] = []
        for vid in victims:
            k = slot_of.get(vid)
            if k is not None:
                lo, hi = np.searchsorted(slots, k), np.searchsorted(slots, k, side="right")
                out.extend(by[lo:hi].tolist())
        return out


def _index(ctx: Cycle) -> _VictimIndex:
    idx = ctx.cache.get("victim-index")
    if idx is None:
        idx = ctx.cache["victim-index"] = _VictimIndex(ctx)
    return idx


DERIVE_MAX = 64  # queues in or out of the last view up to which a view is derived from it


def _queue_view(idx: _VictimIndex, queues: Iterable[str]) -> tuple:
    """What ``_nodes_from_index`` needs of the index for one set of candidate queues (names, or a
    ``QueueSet``), whatever the state (kept for the cycle: reclaimers of one side ask for the same
    queues again): the GPU milli their entries hold per node, the least work one of their victims
    loses per node (and rounded as plans' costs are), their entries that hold GPUs, and which
    queues are theirs (a list by queue number: read entry by entry, node by node; and as an
    array); and which entries are theirs.

    Successive reclaimers mostly ask for the queues the last one asked for, give or take a few
    (a plan made moves a few queues over or under their shares): then the view is the last one's
    with the entries of those few queues put in or taken out (``_derived_view``), the same
    numbers for a fraction of the passes over every entry."""
    if isinstance(queues, QueueSet):
        sel = queues.mask
    else:
        sel = np.zeros(len(idx.qn), dtype=bool)
        sel[np.fromiter(map(idx.qn.__getitem__, queues), dtype=np.int64, count=len(queues))] = True
    key = sel.tobytes()
    hit = idx.views.get(key)
    if hit is None:
        last = idx.last_view
        if last is not None:
            before = last[1][5]
            gone, new = np.flatnonzero(before & ~sel), np.flatnonzero(sel & ~before)
            if len(gone) + len(new) <= DERIVE_MAX:
                hit = _derived_view(idx, last[1], gone.tolist(), new.tolist())
        if hit is None:
            hit = _fresh_view(idx, sel.copy())
        idx.views[key] = hit
    idx.last_view = (key, hit)
    return hit


def _fresh_view(idx: _VictimIndex, sel: np.ndarray) -> tuple:
    """``_queue_view`` worked out from every entry, for the queues ``sel`` marks (by number; the
    view keeps the array)."""
    mine = sel[idx.queue]
    least = np.minimum.reduceat(np.where(mine, idx.cost, np.inf), idx.starts)
    return (np.add.reduceat(np.where(mine, idx.milli, 0), idx.starts), least, np.round(least, 6),
            _holding(idx, mine), sel.tolist(), sel, mine)


def _derived_view(idx: _VictimIndex, base: tuple, gone: list[int], new: list[int]) -> tuple:
    """``_queue_view`` of the queues of ``base`` less ``gone`` plus ``new`` (queue numbers), worked
    out from ``base``: the room per node by the entries that come or go (integers), the least work
    lost afresh on the nodes those entries are on (a minimum: the same whatever else is there),
    and the entry and queue marks."""
    room, least, rounded, _, _, sel, mine = base
    sel, mine = sel.copy(), mine.copy()
    sel[new], sel[gone] = True, False
    e_on, e_off = idx.entries_of_queues(new), idx.entries_of_queues(gone)
    mine[e_on], mine[e_off] = True, False
    touched = np.concatenate((e_on, e_off))
    if touched.size:
        room, least, rounded = room.copy(), least.copy(), rounded.copy()
        np.add.at(room, idx.run_of[e_on], idx.milli[e_on])
        np.subtract.at(room, idx.run_of[e_off], idx.milli[e_off])
        marked = np.zeros(len(idx.starts), dtype=bool)
        marked[idx.run_of[touched]] = True
        runs = np.flatnonzero(marked)  # (the runs touched, in order)
        lo, n = idx.starts[runs], idx.lengths[runs]
        at = np.cumsum(n) - n  # where each run's entries open in ``ent``
        ent = np.arange(int(n.sum())) + np.repeat(lo - at, n)
        least[runs] = np.minimum.reduceat(np.where(mine[ent], idx.cost[ent], np.inf), at)
        rounded[runs] = np.round(least[runs], 6)
    return room, least, rounded, _holding(idx, mine), sel.tolist(), sel, mine


def _holding(idx: _VictimIndex, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entries marked ``mine`` that hold GPUs, by run: their queues, where each run of them
    opens, and the run (a walk's "most over-quota queue" per node reads these alone, not every
    entry)."""
    held = np.flatnonzero(mine & idx.holds)
    run = idx.run_of[held]
    opens = np.flatnonzero(np.concatenate(([True], run[1:] != run[:-1]))) if held.size else held
    return idx.queue[held], opens, run[opens]


def _nodes_from_index(ctx: Cycle, c: Candidate, queues: set[str], need: int, free: np.ndarray,
                      skip: _Skip | None = None):
    """Nodes worth planning on, with a lower bound on a plan's cost there, best first: the least
    work one victim of ``queues`` there loses, one victim, the most over-quota queue there; and a
    function that gives a tighter bound (worked out only for the nodes it is asked for).

    ``skip`` (a reclaim's walk), once ``SKIP_AFTER`` nodes were yielded: while no plan is found,
    of each run of nodes where the budget refuses every victim first, or where no plan can bring
    the shares closer to fair, only the last refused one a search would judge is yielded, then
    the last of the others after it (the walk over the first only leaves its refusal, over the
    others only owes a search, and each overwrites what the ones before it left); once a plan is
    found, neither the refused nodes nor the nodes whose tighter bound cannot beat it are
    (``_Skip``)."""
    idx = _index(ctx)
    if not idx.nodes.size:
        return
    fut = ctx.future
    room, least, rounded, holding, theirs, sel, _ = _queue_view(idx, queues)
    nodes = idx.nodes
    free_n = free[nodes]
    ok = (room > 0) & (free_n + room >= need) & fut.schedulable[nodes]
    if c.mask is not None:
        ok &= c.mask[nodes]
    if not ok.any():
        return
    over = ctx.over_all()  # over-quota GPUs per queue (finite)
    lost = rounded[ok]
    h_queue, h_opens, h_runs = holding
    most = np.full(len(nodes), -np.inf)
    if h_queue.size:
        most[h_runs] = np.maximum.reduceat(over[h_queue], h_opens)
    most = most[ok]
    runs = np.flatnonzero(ok)
    cand = nodes[ok]
    per_node, per_node_q, evicted = idx.per_node, idx.per_node_q, ctx.evicted
    ov = over.tolist()
    queue_l, milli_l, cost_l = idx.queue_l, idx.milli_l, idx.cost_l

    def tighter(j: int) -> tuple:
        """At least the fewest victims (largest first) that free what is short on the node, each
        losing at least the least work one loses there (less a hair: a sum of costs may round
        below that many times the least); then the most over-quota queue there (of one victim
        alone: among those that could make such a plan)."""
        lo, hi = idx.bounds[j]
        short = need - int(free_n[j])
        mine_e = [e for e in range(lo, hi) if theirs[queue_l[e]]]  # largest first
        fewest = _fewest((milli_l[e] for e in mine_e), short)
        lost = _least_lost(fewest, float(least[j]))
        if fewest == 1:
            # a plan that ties this bound's first two places takes one victim that frees enough
            # here on its own and loses the least work (within the rounding of a plan's cost): the
            # third place is the most over-quota queue among those; any other plan loses more or
            # takes more victims, so ranks behind the bound whatever its third place
            top = least[j] + 1e-6
            most = max((ov[queue_l[e]] for e in mine_e if milli_l[e] >= short and cost_l[e] < top), default=None)
            return (lost, 1, -most if most is not None else float("inf"))
        most_any = max(ov[queue_l[e]] for e in mine_e)
        return (lost, fewest, -most_any)

    def item(i: int) -> tuple:
        n = int(cand[i])
        return ((float(lost[i]), 1, -float(most[i])), n,
                [e for e, (qi, vid) in zip(per_node[n], per_node_q[n]) if theirs[qi] and vid not in evicted],
                lambda j=int(runs[i]): tighter(j))

    if skip is None:
        for i in _lex_order(lost, -most):  # victims listed only for nodes examined
            yield item(i)
        return
    # per run: victims all refused first; judged; no plan of them closer to fair; no better plan
    refused = judged = closer = beyond = None
    held_back, held_closer, walked, seen = -1, -1, 0, None
    for i in _lex_order(lost, -most):
        if walked >= SKIP_AFTER:
            j = runs[i]
            if refused is None:
                refused, judged = skip.refused_runs(idx, sel, need, free)
            if skip.open:
                if refused[j]:
                    if judged[j]:
                        held_back, held_closer = i, -1  # (its refusal ends what an earlier one owed)
                    continue
                if closer is None:
                    closer = skip.never_closer_runs(idx, sel, refused, judged)
                if closer[j]:  # the walk would only owe it: the last one stands for the run
                    held_closer = i
                    continue
            else:
                if refused[j]:  # once a plan is found, what the budget refuses is not read
                    continue
                if seen != skip.best:
                    beyond, seen = skip.beyond(idx, sel, least, need, free), skip.best
                if beyond[j]:
                    continue
        if held_back >= 0:
            yield item(held_back)
            held_back = -1
        if held_closer >= 0:
            yield item(held_closer)
            held_closer = -1
        walked += 1
        yield item(i)
    if held_back >= 0:
        yield item(held_back)
    if held_closer >= 0:
        yield item(held_closer)


def _stable_order(primary: np.ndarray, secondary: np.ndarray, width: int) -> np.ndarray:
    """``np.lexsort((secondary, primary))`` for non-negative integers, ``secondary`` below
    ``width``: one stable sort of a combined key, which comes nearly sorted here (entries by node),
    some twenty times faster than the two-key sort."""
    return np.argsort(primary.astype(np.int64) * width + secondary, kind="stable")


def _fewest(sizes: Iterable[int], short: int) -> int:
    """How many of ``sizes`` (GPU milli, largest first) free ``short`` milli; at least one."""
    fewest, freed = 0, 0
    for m in sizes:
        if freed >= short:
            break
        fewest += 1
        freed += m
    return max(fewest, 1)


def _least_lost(fewest: int, least: float) -> float:
    """The least work ``fewest`` victims losing at least ``least`` each lose, rounded as a plan's
    cost is (less a hair: a sum of costs may round below that many times the least);
    ``_Skip.beyond`` works out the same for every node at once."""
    return round((fewest * least - 1e-7) * 1e6) / 1e6


def _lex_order(first: np.ndarray, second: np.ndarray, head: int = 64) -> Iterator[int]:
    """Positions in the order of ``np.lexsort((positions, second, first))``, sorted a slice at a
    time: a walk mostly stops within its first nodes, so only the smallest ``head`` keys are
    sorted first (those below the ``head``-th smallest ``first``, then its ties by ``second``),
    the next slice (twice as many) only if the walk goes on."""
    rest = np.arange(len(first))
    while len(rest) > head:
        vals = first[rest]
        pivot = np.partition(vals, head)[head]
        lo = rest[vals < pivot]
        yield from lo[np.lexsort((second[lo], first[lo]))].tolist()
        yield from _by_second(rest[vals == pivot], second, head)
        rest = rest[vals > pivot]
        head *= 2
    yield from rest[np.lexsort((second[rest], first[rest]))].tolist()


def _by_second(rest: np.ndarray, second: np.ndarray, head: int) -> Iterator[int]:
    """``_lex_order`` within one value of ``first``: by ``second``, ties in position order."""
    while len(rest) > head:
        vals = second[rest]
        pivot = np.partition(vals, head)[head]
        lo = rest[vals < pivot]
        yield from lo[np.argsort(second[lo], kind="stable")].tolist()
        yield from rest[vals == pivot].tolist()
        rest = rest[vals > pivot]
        head *= 2
    yield from rest[np.argsort(second[rest], kind="stable")].tolist()


def _nodes_from_list(ctx: Cycle, c: Candidate, victims: list[Workload], need: int, free: np.ndarray):
    """The same for an explicit victim list, with a tighter bound (the fewest victims that could
    free enough on the node, and the least work those could lose)."""
    fut = ctx.future
    on_node: dict[int, list[tuple[Workload, int]]] = {}
    for v in victims:
        for n, m in ctx.victim_nodes(v):
            on_node.setdefault(n, []).append((v, m))
    out = []
    for n, vs in on_node.items():
        if not fut.schedulable[n] or (c.mask is not None and not c.mask[n]):
            continue
        short = need - int(free[n])
        held_n = sorted((m for _, m in vs), reverse=True)
        if sum(held_n) < short:  # even evicting all of them is not enough
            continue
        k, got = 0, 0
        while got < short or k == 0:
            got += held_n[k]
            k += 1
        lost = sum(sorted(ctx.victim_cost(v) for v, _ in vs)[:k])
        excess = max(ctx.over(v.queue) for v, _ in vs)
        out.append(((round(lost, 6), k, -excess), n, vs))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def _plan_single(ctx: Cycle, c: Candidate, victims: list[Workload] | None, budget: Budget,
                 need_freed: float, queues: set[str] | None) -> tuple[list[Workload], np.ndarray] | None:
    """Plan node by node, examining nodes in order of a lower bound on their cost and stopping
    when no node left can beat the best plan found."""
    fut = ctx.future
    need = c.req.gpu_milli_total if not c.req.gpu_memory else 1
    free = fut.free_milli()
    judge = _Refusals(ctx, budget) if type(budget) is ReclaimBudget and cycle.SHORTCUTS else None
    skip = _Skip(ctx, budget) if judge is not None and victims is None else None
    if victims is None:
        nodes = _nodes_from_index(ctx, c, queues, need, free, skip)
    else:
        nodes = _nodes_from_list(ctx, c, victims, need, free)
    best: tuple[tuple, list[Workload], int] | None = None
    owed = None  # the last node skipped as never closer to fair, unless a later one left the refusal

    def search(n: int, vs: list[tuple[Workload, int]]):
        return _search(ctx, c, [v for v, _ in vs], budget, lambda: fits_on(fut, n, c.req), 0.0, need_freed)

    for bound, n, vs, *tighter in nodes:
        if best is not None:
            if bound >= best[0][:3]:
                break  # no node left can beat the best plan
            if tighter:
                tight = tighter[0]()
                if tight > best[0][:3] or (tight == best[0][:3] and n > best[2]):
                    continue  # nor can this one (a plan's cost ties break by node)
        if not vs or sum(m for _, m in vs) + int(free[n]) < need:
            continue
        if judge is not None:
            # once a plan is found, what a search would refuse is not read: first whether the
            # node can beat it at all (most nodes a walk goes on to cannot)
            if best is not None and judge.cannot_beat(vs, need - int(free[n]), best[0][:3], n, best[2]):
                continue
            refused = judge.hopeless(vs)
            if refused is not None:  # the search could only fail, leaving the budget so
                budget.refused, budget.why = refused
                owed = None
                continue
            if judge.never_closer(vs):  # it could only fail too, by ``accepts``
                owed = (n, vs)
                continue
        if judge is not None:
            left = (budget.refused, budget.why)
            budget.why = _UNSET
        found = search(n, vs)
        if judge is not None:
            if budget.why is _UNSET:  # this search refused nothing: what an earlier node left stands
                budget.refused, budget.why = left
            else:
                owed = None
        if found is None and judge is not None and len(vs) == 1:
            judge.failed_alone(vs[0][0])
        if found is not None:
            cost = found[0] + (n,)
            if best is None or cost < best[0]:
                best = (cost, found[1], n)
                if skip is not None:
                    skip.open, skip.best = False, best[0][:3]  # bounds now decide which nodes are judged
    if best is None:
        if owed is not None:  # the refusal the last skipped node's search leaves, as if searched
            search(*owed)
        return None
    only = np.zeros(len(fut.nodes), dtype=bool)
    only[best[2]] = True
    return best[1], only


class _Refusals:
    """What a reclaim's budget refuses, worked out once per plan for a victim's side, size, queue
    and priority: a node where the budget may take none of the victims, or where its one victim
    may not go on its own, is not searched (the search could only fail). Within a plan nothing
    commits, and whether ``ReclaimBudget`` takes a victim first, and whether a plan of that
    victim alone brings the shares closer, depend on those alone. When every victim on a node is
    refused first, none is ever taken: a side's rules only tighten as victims go, and a victim
    refused for a lower-priority workload of its queue still running waits for one that runs
    elsewhere (out of this node's plan) or is itself refused. Each answer keeps what the refusal
    leaves in the budget (``refused``, ``why``), so that the reasons come out as if the node had
    been searched."""

    def __init__(self, ctx: Cycle, budget: ReclaimBudget):
        self.ctx, self.budget = ctx, budget
        self.first: dict[tuple, tuple | None] = {}  # (side, GPUs) -> None: may go first; else the refusal
        self.alone: dict[tuple, tuple] = {}  # (side, GPUs) -> the refusal of a plan of it alone
        # victim id -> ``first`` of its key (a victim's key is fixed for the plan: one lookup)
        self.by_victim: dict[str, tuple | None] = {}
        # victim id -> the order of ``hopeless``'s last victim (largest first, least work lost, id)
        self.order: dict[str, tuple] = {}
        self.takeable: dict[str, bool] = {}  # victim id -> ``_takeable``

    def _key(self, v: Workload) -> tuple:
        return self.budget._side(v.queue)[0], self.ctx.amounts[v.id][0], v.queue, v.priority

    def _judge(self, check: Callable[[], bool]) -> tuple | None:
        b = self.budget
        left = (b.refused, b.why)
        b.reset()
        try:
            return None if check() else (b.refused, b.why)
        finally:
            b.reset()
            b.refused, b.why = left

    def _may_go_first(self, v: Workload) -> tuple | None:
        hit = self.by_victim.get(v.id, _UNJUDGED)
        if hit is _UNJUDGED:
            key = self._key(v)
            if key not in self.first:
                self.first[key] = self._judge(lambda: self.budget.allows(v))
            hit = self.by_victim[v.id] = self.first[key]
        return hit

    def _last(self, v: Workload) -> tuple:
        hit = self.order.get(v.id)
        if hit is None:
            ctx = self.ctx
            hit = self.order[v.id] = (-ctx.amounts[v.id][0], ctx.victim_cost(v), v.id)
        return hit

    def hopeless(self, vs: list[tuple[Workload, int]]) -> tuple | None:
        """The refusal a search of these victims would end with, if it could only fail."""
        if len(vs) == 1 and self.alone and self._key(vs[0][0]) in self.alone:
            return self.alone[self._key(vs[0][0])]
        may = self._may_go_first
        for v, _ in vs:
            if may(v) is None:
                return None
        # every pass is refused throughout; the last is the largest-first one, whose last
        # victim's refusal the search leaves
        last = max((v for v, _ in vs), key=self._last)
        return may(last)

    def _takeable(self, v: Workload) -> bool:
        """Could a search take ``v`` at some point? Only if the budget lets it go first, or it is
        refused for a lower-priority workload of its queue that the same plan may take, or its
        side is one the guarantee rule takes from (as victims go, the fair-share rule may judge
        that side instead); the fair-share rule's other refusals only tighten as victims go.
        Where its side decides, the side answers without a judgement of ``v``: yes on a side the
        guarantee rule takes from, no on a side no better off than the reclaimer's (the
        fair-share rule refuses all its victims first)."""
        hit = self.takeable.get(v.id)
        if hit is None:
            _, over, held, guar, before, guaranteed, _ = self.budget._side(v.queue)
            if guaranteed and held > guar + EPS:
                hit = True  # (allowed first or refused by the guarantee rule: either way takeable)
            elif not over > before + EPS:
                hit = False  # its side is no better off than the reclaimer's: the fair-share rule refuses it first
            else:
                refused = self._may_go_first(v)
                hit = refused is None or refused[1].get("rule") == "priority"
            self.takeable[v.id] = hit
        return hit

    def cannot_beat(self, vs: list[tuple[Workload, int]], short: int, best: tuple, n: int, best_n: int) -> bool:
        """Once a plan is found (cost ``best``, on node ``best_n``): can no search of these
        victims on node ``n``, where ``short`` GPU milli are missing, beat it? True when the
        victims a search could take (``_takeable``) cannot free what is missing, or when a lower
        bound of a plan's cost from them ranks behind ``best``: the fewest of them, largest first,
        that free what is missing, each losing at least the least work one loses here (less a
        hair, as ``_nodes_from_index``'s tighter bound); then the most over-quota queue among them
        (of one victim alone: among those that free enough on their own and lose the least).

        When the best plan takes one victim and loses no more work than that bound's least here
        (the usual case: victims that checkpoint on the signal lose nothing), a plan here of two
        or more victims ranks behind it, so only the victims that could make a better plan of one
        are judged (``_beats_with_one``): the same answer, with fewer victims judged."""
        least = min(map(self.ctx.victim_cost, (v for v, _ in vs)))
        if best[1] == 1 and _least_lost(1, least) == best[0]:
            return not self._beats_with_one(vs, short, least, best[2], n, best_n)
        return self._cannot_beat_by_bound(vs, short, least, best, n, best_n)

    def _beats_with_one(self, vs: list[tuple[Workload, int]], short: int, least: float, third: float, n: int,
                        best_n: int) -> bool:
        """Is one of ``vs`` a victim a search may take that frees what is short on its own, loses
        the least work here (within the rounding of a plan's cost), and is of a queue further over
        its fair share than the best plan's third place ``third`` (or as far, on an earlier node)?"""
        cost, over = self.ctx.victim_cost, self.ctx.over
        top = least + 1e-6
        for v, m in vs:
            if m >= short and cost(v) < top:
                mine = -over(v.queue)
                if (mine < third or (mine == third and n < best_n)) and self._takeable(v):
                    return True
        return False

    def _cannot_beat_by_bound(self, vs: list[tuple[Workload, int]], short: int, least: float, best: tuple, n: int,
                              best_n: int) -> bool:
        """``cannot_beat`` by its bound, every victim judged."""
        cost, over = self.ctx.victim_cost, self.ctx.over
        top = least + 1e-6
        sizes = []
        most = one = None
        for v, m in vs:
            if not self._takeable(v):
                continue
            sizes.append(m)
            o = over(v.queue)
            if most is None or o > most:
                most = o
            if m >= short and cost(v) < top and (one is None or o > one):
                one = o
        if sum(sizes) < short:
            return True  # the search cannot make room: it fails
        fewest = _fewest(sorted(sizes, reverse=True), short)
        lost = _least_lost(fewest, least)
        if fewest == 1:  # (no such one victim: every plan loses more, or takes more victims)
            bound = (lost, 1, -one if one is not None else math.inf)
        else:
            bound = (lost, fewest, -most)
        return bound > best or (bound == best and n > best_n)

    def never_closer(self, vs: list[tuple[Workload, int]]) -> bool:
        """Can no plan of these victims bring the shares closer to fair? True when each of them
        could only go by the fair-share rule (no side of theirs is one the guarantee rule takes
        from), so that ``ReclaimBudget.accepts`` judges any plan of them, and when, at every level
        where their sides meet the reclaimer's, a lower bound of the change it computes is not
        negative for any choice of them (``_least_change``). A search of them could only fail."""
        ctx, b = self.ctx, self.budget
        levels: dict[str, tuple[set, list[float], float]] = {}  # level -> (sides, amounts, most over)
        for v, _ in vs:
            side, over, held, guar, _, guaranteed, aq = b._side(v.queue)
            if guaranteed and held > guar + EPS:
                return False  # the guarantee rule may take it: no squared distances judged
            sides, amounts, most = levels.get(aq) or (set(), [], 0.0)
            sides.add(side)
            amounts.append(ctx.amounts[v.id][0])
            levels[aq] = (sides, amounts, max(most, over))
        for aq, (sides, amounts, most) in levels.items():
            if _least_change(b._over_mine(aq), b.amount, b._wants(aq), len(sides), most, min(amounts),
                             math.fsum(amounts)) < -EPS:  # (exact: in whatever order the node lists them)
                return False
        return True

    def failed_alone(self, v: Workload) -> None:
        """A search of ``v`` alone found no plan: note it if the budget refuses the plan."""
        if self._may_go_first(v) is None:
            refused = self._judge(lambda: self.budget.allows(v) and self.budget.accepts([v]))
            if refused is not None:
                self.alone[self._key(v)] = refused


SKIP_AFTER = 64  # nodes a reclaim's walk judges one by one before it marks the rest at once (fewest instructions of 4-128 over four dumped 4,000-node cycles)


class _Skip:
    """Which nodes of a reclaim's walk the budget refuses outright: every victim there is refused
    first (``_Refusals.hopeless``), judged for all the victim index's entries at once.

    Where nothing is taken yet, ``ReclaimBudget.allows`` refuses a victim of GPUs ``a`` whose
    side is not one the guarantee rule takes from (then it is not judged here: its node is
    walked) when the side is no better off than the reclaimer's (``share``); or when the side
    neither keeps its guarantee without the victim nor holds more than its fair share; or when a
    queue below the side, down to the victim's, is less than ``a / 2`` above its fair share
    (``inside``); or when its queue runs a workload of lower priority (``priority``). Each test
    below is the same arithmetic on the same numbers, so the answers are the budget's own. While
    no plan is found, walking such a node only leaves its refusal in the budget, so of a run of
    them only the last that a search would judge (victims left, room enough) needs walking; a
    node where no plan can bring the shares closer (``never_closer_runs``) only owes the search
    that leaves its refusal if nothing later does, so the last of them after the last refused
    one stands for the run too. Once
    a plan is found, the refusals are not read (they only explain a plan not made), so such nodes
    are not walked at all, nor those ``beyond`` the best plan.
    ``open``: no plan found yet; ``best``: the best plan's cost since."""

    def __init__(self, ctx: Cycle, budget: ReclaimBudget):
        self.ctx, self.budget = ctx, budget
        self.open = True
        self.best: tuple | None = None  # the best plan's cost once one is found
        self._facts: _SideFacts | None = None

    def beyond(self, idx: _VictimIndex, sel: np.ndarray, least: np.ndarray, need: int,
               free: np.ndarray) -> np.ndarray:
        """Per run of the index (a node): can no plan there beat the best found, by the first two
        places of the tighter bound of ``_nodes_from_index`` (the fewest victims of the candidate
        queues, largest first, that free what is short there, each losing at least the least work
        one loses there)? The same arithmetic as that bound, for every node at once; the walk
        would skip such a node on that bound (or stop at it)."""
        hit = idx.freed_before.get(id(sel))
        if hit is None or hit[0] is not sel:
            theirs = sel[idx.queue]
            milli = np.where(theirs, idx.milli, 0)
            before = np.cumsum(milli) - milli  # freed by the larger entries before each one, from the index's start
            hit = idx.freed_before[id(sel)] = (sel, theirs, before - before[idx.starts][idx.run_of])  # (within its run)
        _, theirs, before = hit
        short = need - free[idx.nodes]
        counted = theirs & (before < short[idx.run_of])
        fewest = np.maximum(np.add.reduceat(counted.astype(np.int64), idx.starts), 1)
        lost = np.rint((fewest * least - 1e-7) * 1e6) / 1e6
        b0, b1 = self.best[0], self.best[1]
        return (lost > b0) | ((lost == b0) & (fewest > b1))

    def _sides(self, idx: _VictimIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per queue number: the queue number of its side against the reclaimer and that side's
        depth; the queues' ancestries (root first, -1 after the end); and per queue number, the
        queue number of the reclaimer's side against it (``QueueTree.split``). Kept for the cycle."""
        ctx, r = self.ctx, self.budget.reclaimer
        memo = ctx.cache.setdefault("reclaim-side-arrays", {})
        hit = memo.get(r)
        if hit is None:
            anc = ctx.cache.get("queue-ancestry")
            if anc is None:
                paths = [ctx.tree.path(q) for q in idx.qn]
                anc = np.full((len(paths), max(map(len, paths))), -1, dtype=np.int64)
                for i, path in enumerate(paths):
                    anc[i, :len(path)] = [idx.qn[x] for x in path]
                depth = np.array([len(path) for path in paths], dtype=np.int64)
                anc = ctx.cache["queue-ancestry"] = (anc, depth)
            anc, depth = anc
            mine = np.array([idx.qn[x] for x in ctx.tree.path(r)], dtype=np.int64)
            k = min(len(mine), anc.shape[1])
            # how many of the reclaimer's ancestors each queue shares (as ``QueueTree.split``)
            same = np.ones(len(anc), dtype=bool)
            common = np.zeros(len(anc), dtype=np.int64)
            for i, x in enumerate(mine[:k].tolist()):
                same &= anc[:, i] == x
                common += same
            sd = np.minimum(common, depth - 1)
            hit = memo[r] = (anc[np.arange(len(anc)), sd], sd, anc, mine[np.minimum(common, len(mine) - 1)])
        return hit

    def _side_facts(self, idx: _VictimIndex, sel: np.ndarray) -> "_SideFacts":
        """The budget's numbers of the candidate queues' sides, by queue number (made once per
        walk: ``sel`` is the walk's)."""
        if self._facts is None:
            b, ctx = self.budget, self.ctx
            f = self._facts = _SideFacts(len(idx.qn))
            sides, level, f.levels = self._side_levels(idx, sel)
            # ``ReclaimBudget._side``'s numbers, every side at once: the same values
            before = np.array([b._over_mine(aq) for aq in f.levels], dtype=float)
            within = np.array([b._within(aq) for aq in f.levels], dtype=bool)
            held, guar = ctx.held_all()[sides], ctx.guar_all()[sides]
            f.over[sides], f.held[sides], f.guar[sides] = ctx.over_all()[sides], held, guar
            f.before[sides] = before[level]
            f.unknown[sides] = within[level] & (held > guar + EPS)  # the guarantee rule: walked
            f.level[sides] = level
        return self._facts

    def _side_levels(self, idx: _VictimIndex, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The sides of the candidate queues (``sel``) against the reclaimer (queue numbers, in
        order), the level of each (an index into the last list: the reclaimer's side against it,
        numbered as the sides first name it) and those levels' names. Kept for the cycle, per
        reclaimer and ``sel`` (a view's, kept with it)."""
        memo = self.ctx.cache.setdefault("reclaim-side-levels", {})
        key = (self.budget.reclaimer, id(sel))
        hit = memo.get(key)
        if hit is None or hit[0] is not sel:
            side, _, _, aq_of = self._sides(idx)
            cand = np.flatnonzero(sel)
            sides, first = np.unique(side[cand], return_index=True)
            aqs = aq_of[cand[first]]
            lv, lv_first, lv_of = np.unique(aqs, return_index=True, return_inverse=True)
            by_first = np.argsort(lv_first, kind="stable")
            number = np.empty(len(lv), dtype=np.int64)
            number[by_first] = np.arange(len(lv))
            names = self.ctx.queue_names
            hit = memo[key] = (sel, sides, number[lv_of.reshape(-1)], [names[i] for i in lv[by_first].tolist()])
        return hit[1], hit[2], hit[3]

    def never_closer_runs(self, idx: _VictimIndex, sel: np.ndarray, refused: np.ndarray,
                          judged: np.ndarray) -> np.ndarray:
        """Per run of the index (a node the walk would judge, ``judged``, and not ``refused``: so
        some victim there may go first): is it certain that no plan of its victims left (two or
        more: a plan of one victim refused before is not asked) can bring the shares closer to
        fair (``_Refusals.never_closer``)? The same sides, levels, counts, least and greatest victims
        and ``_least_change`` for every node at once. ``never_closer`` sums a level's victims
        exactly (``math.fsum``); here they are summed in order, so a node is marked only when its
        bound clears -EPS by more than that sum can be off (a node at the edge is walked)."""
        b = self.budget
        f = self._side_facts(idx, sel)
        side = self._sides(idx)[0]
        amt = idx.facts()[0]
        starts = idx.starts
        live, count, _ = idx.live(sel, self.ctx.evicted)
        se = side[idx.queue]
        out = judged & ~refused & (count >= 2)
        out &= ~np.logical_or.reduceat(live & f.unknown[se], starts)  # the guarantee rule may take one
        if not out.any():
            return out
        at = np.flatnonzero(live & out[idx.run_of])  # (the victims of the nodes still in question)
        # one group per (node, level where the victims' sides meet the reclaimer's)
        nl = len(f.levels)
        s_e = se[at]
        g = idx.run_of[at] * nl + f.level[s_e]
        order = _stable_order(g, s_e, len(idx.qn))
        g, s_e, a, o = g[order], s_e[order], amt[at][order], f.over[s_e][order]
        opens = np.ones(len(g), dtype=bool)
        opens[1:] = g[1:] != g[:-1]
        new_side = opens.copy()
        new_side[1:] |= s_e[1:] != s_e[:-1]
        gi = np.flatnonzero(opens)
        k = np.add.reduceat(new_side.astype(np.float64), gi)  # distinct sides
        most = np.maximum(np.maximum.reduceat(o, gi), 0.0)
        lo = np.minimum.reduceat(a, gi)
        hi = np.add.reduceat(a, gi)
        lev = g[gi] % nl
        before = np.array([b._over_mine(aq) for aq in f.levels])[lev]
        wants = np.array([b._wants(aq) for aq in f.levels])[lev]
        change = _least_change_all(before, b.amount, wants, k, most, lo, hi)
        # how far the sum in order may be from the exact one, times how fast the bound moves with it
        slope = 2.0 * (np.abs(before) + abs(b.amount) + wants + hi + most) + 2.0
        off = 1e-12 * np.diff(np.append(gi, len(g))) * (1.0 + hi) * slope
        bad = change < -EPS + off
        out[(g[gi] // nl)[bad]] = False
        return out

    def refused_runs(self, idx: _VictimIndex, sel: np.ndarray, need: int,
                     free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per run of the index (a node): are all its victims of the candidate queues (``sel``,
        by queue number) that are not evicted refused first? And would a search judge the node
        (such victims there, and with the node's free capacity, room for ``need``)?"""
        ctx = self.ctx
        side, sd, anc, _ = self._sides(idx)
        amt, prio = idx.facts()
        q = idx.queue
        f = self._side_facts(idx, sel)
        unknown, held, guar = f.unknown, f.held, f.guar
        share = f.over > f.before + EPS
        above = f.over > EPS
        # the least excess over fair share of the queues below each queue's side, down to it
        over_q = ctx.over_all()
        masks = ctx.cache.setdefault("reclaim-below-sides", {})  # per reclaimer: the ancestries below each side
        inner = masks.get(self.budget.reclaimer)
        if inner is None:
            inner = masks[self.budget.reclaimer] = (anc >= 0) & (np.arange(anc.shape[1])[None, :] > sd[:, None])
        below = np.where(inner, over_q[anc], np.inf).min(axis=1)
        se = side[q]
        live, count, room = idx.live(sel, ctx.evicted)
        may = live & share[se] & ((held[se] - amt >= guar[se] - EPS) | above[se]) & ~(below[q] + EPS < amt / 2.0)
        may &= ~unknown[se]
        if may.any():  # a queue running lower-priority workloads keeps its higher ones
            marked = np.zeros(len(idx.qn), dtype=bool)
            marked[q[may]] = True
            may &= ~(ctx.lowest_running_priorities(np.flatnonzero(marked))[q] < prio)
        blocks = may | (live & unknown[se])
        refused = ~np.logical_or.reduceat(blocks, idx.starts)
        judged = (count > 0) & (room + free[idx.nodes] >= need)
        return refused, judged


class _SideFacts:
    """Per queue number, the numbers ``ReclaimBudget._side`` gives its side (filled for the sides
    of a walk's candidate queues): over its fair share, the reclaimer's side's excess it is
    compared with, held, guarantee, judged by the guarantee rule, and the level (an index into
    ``levels``, the reclaimer's ancestors where sides meet it)."""

    def __init__(self, nq: int):
        self.unknown = np.zeros(nq, dtype=bool)
        self.over, self.before = np.zeros(nq), np.zeros(nq)
        self.held, self.guar = np.zeros(nq), np.zeros(nq)
        self.level = np.zeros(nq, dtype=np.int64)
        self.levels: list[str] = []


def _least_change_all(before: np.ndarray, amount: float, wants: np.ndarray, k: np.ndarray, most: np.ndarray,
                      lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``_least_change`` for many levels at once: the same arithmetic, element by element."""
    least = np.full(len(before), np.inf)
    for t in (lo, hi, np.full(len(before), amount), amount + wants, k * most, (most - before) / (1.0 + 1.0 / k)):
        after = before + amount + np.minimum(np.maximum(0.0, t - amount), wants)
        value = after * after - before * before + t * t / k - 2.0 * most * t
        least = np.where((lo <= t) & (t <= hi), np.minimum(least, value), least)
    return least


def _least_change(before: float, amount: float, wants: float, k: int, most: float, lo: float, hi: float) -> float:
    """A lower bound of the change in squared distances ``ReclaimBudget.accepts`` computes at one
    level, over every plan taking T GPUs in all (``lo`` <= T <= ``hi``) from ``k`` victim sides
    none more than ``most`` above its share: the reclaimer's side goes from ``before`` to
    ``before + amount + min(max(0, T - amount), wants)``; the sides' part, the sum of
    (o - t)^2 - o^2 = t^2 - 2 o t, is at least T^2 / k - 2 most T (Cauchy-Schwarz). The bound is
    convex on each of three pieces of T, so its least value is at a piece's end or its vertex."""
    def bound(t: float) -> float:
        after = before + amount + min(max(0.0, t - amount), wants)
        return after * after - before * before + t * t / k - 2.0 * most * t

    points = [lo, hi, amount, amount + wants, k * most, (most - before) / (1.0 + 1.0 / k)]
    return min(bound(t) for t in points if lo <= t <= hi)


def make_room(ctx: Cycle, c: Candidate, chosen: list[Workload], mask: np.ndarray | None,
              st: Statement | None = None) -> tuple[Statement, tuple[PodPlacement, ...]] | None:
    """Start carrying out a plan on the future view: remove the victims, place ``c`` and claim its
    capacity. Returns the open Statement (``st``, or a new one; the caller evicts, reserves and
    commits) and the placements."""
    st = st if st is not None else Statement(ctx, ctx.future)
    for v in chosen:
        st.remove(v, v.placements)
    placements = ctx.place(c.restricted(mask), st)
    if placements is None:  # cannot happen: the plan was probed
        st.rollback()
        return None
    st.claim(c.w, c.amount[0])
    return st, placements
