"""The scheduler's shortcuts change no decision.

A cycle takes in the reservations carried from the last one in runs, judged with prefix sums
(``scheduler/intake.py``), not one by one; allocate groups workloads whose request already failed for capacity (one failed candidate per
queue and request, expanded only where an action tries them one by one) and skips probing the
whole cluster for a holder whose shape already fitted nowhere; reclaim does not search a node
whose victims its budget can only refuse (``plan._Refusals``: refused first, a plan of one victim
refused before, or no plan of them bringing the shares closer to fair), leaving the refusal the
search would have left, and a long walk marks such nodes, and those that cannot beat the plan
found, for the whole index at once (``plan._Skip``); once a plan is found, a node where the
victims a search could take cannot beat it is not searched (``_Refusals.cannot_beat``); a
search makes no pass from a victim its budget refuses even before any is taken, which would
replay its first pass (``plan._replays``). All are pure optimisations: whole simulations of random contended
scenarios (the guarantee properties' generator: gangs, fractions, priorities, limits, reclaims,
reservations) must give byte-identical reports, reasons included, with the shortcuts on and off.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler import cycle, plan
from gpupool.scheduler.actions import allocate
# ``_settings``: the name the decorators below were written with, part of each property's seed
from guarantee_scenarios import example_settings as _settings, scenarios
from sim_harness import report_text


@st.composite
def bursts(draw):
    """A borrower fills the cluster, then other queues submit bursts of identical workloads (the
    groups' case): reclaims, priority preemption inside a burst, fractions and gangs."""
    cycle = draw(st.sampled_from([1, 5]))
    nodes = [{"name": f"n{i}", "gpus": draw(st.sampled_from([4, 8])), "gpu_memory": "40Gi"}
             for i in range(draw(st.integers(1, 3)))]
    capacity = sum(n["gpus"] for n in nodes)
    queues = [{"name": "borrower", "deserved": {"gpu": 0}}]
    leaves = draw(st.integers(1, 3))
    share = capacity // leaves
    for i in range(leaves):
        q = {"name": f"q{i}", "deserved": {"gpu": share}, "over_quota_weight": draw(st.sampled_from([1, 2]))}
        if draw(st.integers(0, 3)) == 0:
            q["limit"] = {"gpu": share + draw(st.integers(0, 2))}
        queues.append(q)
    workloads = [{"name": f"b{i}", "queue": "borrower", "kind": "train", "submit_at": 0, "gpus": 1,
                  "duration": cycle * draw(st.integers(40, 200)), "checkpoint_on_signal": draw(st.booleans())}
                 for i in range(capacity)]
    for j in range(draw(st.integers(1, 5))):
        queue = f"q{draw(st.integers(0, min(j, leaves - 1)))}"  # later bursts often join an earlier queue
        at = cycle * draw(st.integers(3, 30))
        shape = draw(st.sampled_from([{"gpus": 1}, {"gpus": 2}, {"gpus": 0.5}, {"gpu_memory": "10Gi"},
                                      {"gpus": 1, "pods": 2}]))
        for k in range(draw(st.integers(2, 12))):
            w = {"name": f"x{j}-{k}", "queue": queue, "submit_at": at, "duration": cycle * draw(st.integers(20, 120)),
                 "kind": draw(st.sampled_from(["train", "train", "hpo-trial", "interactive"])), **shape}
            if draw(st.booleans()):  # mixed priorities inside a burst: priority preemption in its queue
                w["priority"] = draw(st.sampled_from([10, 90]))
            workloads.append(w)
    return {"config": {"cycle": cycle, "preemption_grace": cycle * draw(st.sampled_from([0, 2, 6])),
                       "min_runtime": cycle * draw(st.sampled_from([0, 4])), "until": 400 * cycle},
            "cluster": {"nodes": nodes}, "queues": queues, "workloads": workloads}


def _same_both_ways(data: dict, seed: int) -> None:
    # a reclaim's walk marks the nodes its budget refuses after SKIP_AFTER nodes (64); these small
    # clusters walk a few, so the marking starts after 0, 1 or 2 of them here
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "SKIP_AFTER", seed)
        fast = report_text(data, seed)
    cycle.SHORTCUTS = False
    try:
        slow = report_text(data, seed)
    finally:
        cycle.SHORTCUTS = True
    assert fast == slow


@_settings(100)
@given(scenarios(), st.integers(0, 2))
def test_shortcuts_change_no_decision(data, seed):
    _same_both_ways(data, seed)


@_settings(100)
@given(bursts(), st.integers(0, 2))
def test_shortcuts_change_no_decision_in_bursts(data, seed):
    _same_both_ways(data, seed)


def _groups_keep_their_members_facts(monkeypatch, data: dict, seed: int) -> int:
    """Run the simulation checking every group allocate returns: the highest priority and the ids
    it keeps as members join (read by preempt and ``wait_all`` without going back to the
    workloads) are those of its members. Returns how many groups were checked."""
    from gpupool.scheduler import core
    real, seen = allocate.allocate, [0]

    def checked(ctx, failed=None):
        out = real(ctx, failed)
        for c in out:
            if c.more:
                assert c.more_ids == [w.id for w in c.more]
                assert c.top_priority == max(w.priority for w in (c.w, *c.more))
                seen[0] += 1
        return out
    monkeypatch.setitem(core.ACTIONS, "allocate", checked)
    report_text(data, seed)
    return seen[0]


@_settings(40)
@given(bursts(), st.integers(0, 2))
def test_groups_keep_their_members_priority_and_ids(data, seed):
    with pytest.MonkeyPatch.context() as mp:
        _groups_keep_their_members_facts(mp, data, seed)


def _holder_probes_agree(monkeypatch, data: dict, seed: int) -> int:
    """Run the simulation with every batched probe of the holders (``_own_node_fits``, on the now
    view before any holder binds) checked against the one-by-one probe (``_fits_own_node``, its
    holds given back on list rows); returns how many holders were compared."""
    from gpupool.scheduler.cluster import FreeRows
    real = allocate._own_node_fits
    compared = []

    def checked(ctx, holders):
        out = real(ctx, holders)
        rows = FreeRows(ctx.now)
        for w, r, _ in holders:
            if w.id in out:
                node, fits = out[w.id]
                assert node == ctx.now.index[r.placements[0].node]
                assert fits == allocate._fits_own_node(ctx, ctx.candidate(w), r, rows), w.id
                compared.append(fits)
        return out
    monkeypatch.setattr(allocate, "_own_node_fits", checked)
    report_text(data, seed)
    return len(compared)


@_settings(60)
@given(bursts(), st.integers(0, 2))
def test_holders_probed_at_once_answer_as_one_by_one(data, seed):
    with pytest.MonkeyPatch.context() as mp:
        _holder_probes_agree(mp, data, seed)


def _walks_skip_what_node_by_node_judging_skips(monkeypatch, data: dict, seed: int) -> dict[str, int]:
    """Run the simulation with every node marking of a reclaim's walk (``plan._Skip``) checked
    against judging the node alone: a node marked refused is one where every victim left is
    refused first (``_Refusals``), and conversely where none of them is judged by the guarantee
    rule; one marked judged is one the walk would search (victims left, room enough); one marked
    never closer is one with two victims or more left, not hopeless, where no plan of them brings
    the shares closer (``_Refusals.never_closer``); one marked beyond the best plan is one whose
    tighter bound, worked out victim by victim, is worse in its first two places. Returns how
    many nodes were marked, by marking."""
    marked: dict[str, int] = {"refused": 0, "never closer": 0, "beyond": 0}
    real_refused, real_beyond = plan._Skip.refused_runs, plan._Skip.beyond
    real_closer = plan._Skip.never_closer_runs

    def victims(skip, idx, sel, j):
        ctx = skip.ctx
        n = int(idx.nodes[j])
        return [(v, m) for v, m in idx.per_node[n] if sel[idx.qn[v.queue]] and v.id not in ctx.evicted]

    def refused_runs(self, idx, sel, need, free):
        refused, judged = real_refused(self, idx, sel, need, free)
        judge = plan._Refusals(self.ctx, self.budget)
        for j in range(len(idx.starts)):
            vs = victims(self, idx, sel, j)
            assert judged[j] == (bool(vs) and sum(m for _, m in vs) + int(free[idx.nodes[j]]) >= need)
            first = [judge._may_go_first(v) for v, _ in vs]
            by_guarantee = any(self.budget._side(v.queue)[5] and self.budget._side(v.queue)[2] > self.budget._side(v.queue)[3] + plan.EPS
                               for v, _ in vs)
            if refused[j]:
                assert all(f is not None for f in first)
                marked["refused"] += 1
            elif not by_guarantee:
                assert any(f is None for f in first)
        return refused, judged

    def never_closer_runs(self, idx, sel, refused, judged):
        out = real_closer(self, idx, sel, refused, judged)
        judge = plan._Refusals(self.ctx, self.budget)
        for j in np.flatnonzero(out).tolist():
            vs = victims(self, idx, sel, j)
            assert judged[j] and not refused[j] and len(vs) >= 2
            assert judge.hopeless(vs) is None and judge.never_closer(vs)
            marked["never closer"] += 1
        return out

    def beyond(self, idx, sel, least, need, free):
        out = real_beyond(self, idx, sel, least, need, free)
        for j in range(len(idx.starts)):
            lo, hi = idx.bounds[j]
            short = need - int(free[idx.nodes[j]])
            fewest, freed = 0, 0
            for e in range(lo, hi):
                if sel[idx.queue_l[e]] and freed < short:
                    fewest, freed = fewest + 1, freed + idx.milli_l[e]
            fewest = max(fewest, 1)
            lost = round((fewest * float(least[j]) - 1e-7) * 1e6) / 1e6 if np.isfinite(least[j]) else np.inf
            assert bool(out[j]) == ((lost, fewest) > tuple(self.best[:2]))
            if out[j]:
                marked["beyond"] += 1
        return out

    monkeypatch.setattr(plan._Skip, "refused_runs", refused_runs)
    monkeypatch.setattr(plan._Skip, "beyond", beyond)
    monkeypatch.setattr(plan._Skip, "never_closer_runs", never_closer_runs)
    monkeypatch.setattr(plan, "SKIP_AFTER", 0)
    report_text(data, seed)
    return marked


@_settings(60)
@given(st.one_of(scenarios(), scenarios(extended=True, deep=True), bursts()), st.integers(0, 2))
def test_nodes_a_walk_skips_are_judged_as_node_by_node(data, seed):
    with pytest.MonkeyPatch.context() as mp:
        _walks_skip_what_node_by_node_judging_skips(mp, data, seed)
    with pytest.MonkeyPatch.context() as mp:
        _pruned_nodes_cannot_beat_the_plan(mp, data, seed)


def _pruned_nodes_cannot_beat_the_plan(monkeypatch, data: dict, seed: int) -> dict[str, int]:
    """Run the simulation with every node a reclaim's walk leaves unsearched once a plan is found
    (``_Refusals.cannot_beat``) searched anyway: the search finds nothing, or a plan no better than
    the one found (its cost, then its node); every answer the same as the bound's with every
    victim judged; and whether a search could take a victim the same as the budget's own first
    judgement of it says. Returns how many nodes were left and checked, and how many were judged by
    the best plan's one victim (``_Refusals._beats_with_one``)."""
    from gpupool.scheduler.cycle import fits_on
    checked, by_one = [], []  # nodes left and searched anyway; nodes judged by one-victim plans
    plans = []  # the candidate (and GPUs to free) of the plan being made
    real_single, real_beat = plan._plan_single, plan._Refusals.cannot_beat

    def single(ctx, c, victims, budget, need_freed, queues):
        plans.append((c, need_freed))
        try:
            return real_single(ctx, c, victims, budget, need_freed, queues)
        finally:
            plans.pop()

    def cannot_beat(self, vs, short, best, n, best_n):
        out = real_beat(self, vs, short, best, n, best_n)
        # the answer from the one-victim victims alone is the bound's, every victim judged
        least = min(self.ctx.victim_cost(v) for v, _ in vs)
        assert out == self._cannot_beat_by_bound(vs, short, least, best, n, best_n)
        if best[1] == 1 and plan._least_lost(1, least) == best[0]:
            by_one.append(n)
        if out:
            ctx, b = self.ctx, self.budget
            c, need_freed = plans[-1]
            left = (b.refused, b.why)
            found = plan._search(ctx, c, [v for v, _ in vs], b, lambda: fits_on(ctx.future, n, c.req),
                                 0.0, need_freed)
            b.refused, b.why = left
            assert found is None or found[0] + (n,) >= best + (best_n,)
            checked.append(n)
        return out

    real_takeable = plan._Refusals._takeable

    def takeable(self, v):
        """As the budget's own first judgement of ``v`` says (the side-level answers agree)."""
        out = real_takeable(self, v)
        refused = self._may_go_first(v)
        _, _, held, guar, _, guaranteed, _ = self.budget._side(v.queue)
        assert out == (refused is None or refused[1].get("rule") == "priority"
                       or (guaranteed and held > guar + plan.EPS))
        return out

    monkeypatch.setattr(plan, "_plan_single", single)
    monkeypatch.setattr(plan._Refusals, "cannot_beat", cannot_beat)
    monkeypatch.setattr(plan._Refusals, "_takeable", takeable)
    report_text(data, seed)
    return {"checked": len(checked), "by one": len(by_one)}


def _churn(nodes: int, queues: int, workloads: int) -> dict:
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cycle_speed.py"
    spec = importlib.util.spec_from_file_location("cycle_speed", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.churn_scenario(nodes, queues, workloads, seed=0, until=20)


def test_a_churn_walk_leaves_nodes_that_cannot_beat_its_plan(monkeypatch):
    """The benchmark's churning cluster, small: queues below their fair share reclaim from
    borrowers whose workloads save on signal (every victim loses no work, so plans rank by how
    few victims they take and how far above its share their queue is). Once a plan is found,
    the walk leaves nodes that cannot beat it, each checked by searching it anyway (and mostly
    judged by the best plan's one victim); the simulation decides the same as with the shortcuts
    off."""
    data = _churn(50, 40, 1500)
    seen = _pruned_nodes_cannot_beat_the_plan(monkeypatch, data, 0)
    assert seen["checked"] > 0 and seen["by one"] > 0
    monkeypatch.undo()
    fast = report_text(data, 0)
    monkeypatch.setattr(cycle, "SHORTCUTS", False)
    assert report_text(data, 0) == fast


def test_a_churn_walk_marks_the_nodes_where_no_plan_comes_closer(monkeypatch):
    """The same churn, its walks marked from the first node: while no plan is found, the nodes
    where no plan of the victims can bring the shares closer to fair are marked for the whole
    index at once (each checked against judging it alone), the walk lists only the last of a run
    of them, and the simulation decides the same, reasons included, as with the shortcuts off."""
    data = _churn(50, 40, 1500)
    assert _walks_skip_what_node_by_node_judging_skips(monkeypatch, data, 0)["never closer"] > 0
    monkeypatch.setattr(cycle, "SHORTCUTS", False)
    slow = report_text(data, 0)
    monkeypatch.undo()
    monkeypatch.setattr(plan, "SKIP_AFTER", 0)
    assert report_text(data, 0) == slow


def _views_derived_as_fresh(monkeypatch, data: dict, seed: int) -> int:
    """Run the simulation checking every queue view a walk derives from the last one
    (``plan._derived_view``: the entries of the queues that came in or went out) against the view
    worked out from every entry; returns how many were derived."""
    real, derived = plan._derived_view, [0]

    def checked(idx, base, gone, new):
        out = real(idx, base, gone, new)
        sel = base[5].copy()
        sel[gone], sel[new] = False, True
        fresh = plan._fresh_view(idx, sel)
        for a, b in zip(out, fresh):
            if isinstance(a, tuple):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
            else:
                assert np.array_equal(a, b)
        derived[0] += 1
        return out
    monkeypatch.setattr(plan, "_derived_view", checked)
    report_text(data, seed)
    return derived[0]


@pytest.mark.parametrize("shape", [(50, 40, 1500), (80, 120, 2400)])
def test_a_churn_walk_derives_its_queue_views_as_worked_out_afresh(monkeypatch, shape):
    """The benchmark's churning cluster, small: successive reclaimers ask for nearly the same
    candidate queues, so most views are derived from the last one, each the same as worked out
    from every entry. (The random scenarios above make one or two plans a cycle: they derive
    none.)"""
    assert _views_derived_as_fresh(monkeypatch, _churn(*shape), 0) > 20


def test_a_churn_search_skips_the_passes_that_replay_its_first(monkeypatch):
    """The benchmark's churning cluster, small: a reclaim's search whose first pass refused
    victims tries a pass from each; from a victim the budget refuses even before any is taken,
    that pass would take what the first took (``plan._replays``), so it is not made. Many are
    skipped, and the simulation (reasons included) is the one with every pass made."""
    real, skipped = plan._replays, [0]

    def counted(budget, v, first_pass):
        out = real(budget, v, first_pass)
        skipped[0] += out
        return out
    monkeypatch.setattr(plan, "_replays", counted)
    data = _churn(80, 120, 2400)
    fast = report_text(data, 0)
    assert skipped[0] > 20
    monkeypatch.setattr(plan, "_replays", lambda budget, v, first_pass: False)
    assert report_text(data, 0) == fast


def test_a_churn_reclaim_asks_each_side_once_and_admits_as_queue_by_queue(monkeypatch):
    """The candidate queues of a reclaim, judged side by side for all the reclaimer's sibling
    subtrees at once (``ReclaimBudget.candidate_queues``), are those ``candidate_side`` admits
    queue by queue, the reclaimer's own left out."""
    real, asked = plan.ReclaimBudget.candidate_queues, [0, 0]

    def checked(self, queues):
        out = real(self, queues)
        assert set(out) == {q for q in queues if q != self.reclaimer and self.candidate_side(q)}
        assert all(q in out for q in set(out)) and not any(q in out for q in set(queues) - set(out))
        asked[0] += 1
        asked[1] += bool(out)
        return out
    monkeypatch.setattr(plan.ReclaimBudget, "candidate_queues", checked)
    report_text(_churn(80, 120, 2400), 0)
    assert asked[1] > 20


def test_kept_lowest_running_priorities_follow_evictions_and_starts():
    """The node marks read each queue's lowest running priority from an array kept for the cycle
    (``Cycle.lowest_running_priorities``): it follows what the cycle does to the queue, as
    ``lowest_running_priority`` does: an eviction and its rollback, a waiting workload that starts
    and one that no longer does."""
    from gpupool.scheduler.cycle import Cycle
    from gpupool.scheduler.model import Evict, NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot, Workload

    def run(wid, prio, g):
        return Workload(wid, "q", gpus=1, priority=prio, phase=Phase.RUNNING, started_at=0.0,
                        placements=(PodPlacement(0, "n", (g,)),))
    low, high = run("low", 10, 0), run("high", 50, 1)
    waiting = Workload("w", "q", gpus=1, priority=5)
    snap = Snapshot(1000.0, [NodeSpec("n", gpus=4)], [QueueSpec("q", deserved={"gpu": 4}), QueueSpec("o")],
                    [low, high, waiting])
    ctx = Cycle(snap, SchedulerConfig())
    q = np.array([list(ctx.tree.queues).index("q")])

    def lowest():
        got = float(ctx.lowest_running_priorities(q)[q[0]])
        assert got == ctx.lowest_running_priority("q")
        return got
    assert lowest() == 10
    ev = Evict("low", "reclaim", "")
    ctx._evict(low, ev, +1)
    assert lowest() == 50
    ctx._evict(low, ev, -1)
    assert lowest() == 10
    ctx._note_starting("w", +1)
    assert lowest() == 5
    ctx._note_starting("w", -1)
    assert lowest() == 10


def test_a_victim_refused_for_its_lower_priority_sibling_may_still_go(monkeypatch):
    """A node left once a plan is found must not be one a search could still do better on. Queue
    q (deserved 1) needs 2 GPUs; borrowers b and c, equally far above their shares, hold 3 GPUs
    each. On n0, c's 1-GPU workloads make a plan of two victims. On n1, b's 2-GPU workload H is
    refused first, since b's lower-priority L runs; but a search takes L, then H, and drops L
    again (H alone makes room): a plan of one victim, which beats n0's. The walk searches n1
    although only L may go first, and preempts H, as with the shortcuts off."""
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Snapshot, Workload

    nodes = [NodeSpec(f"n{i}", gpus=3, gpu_memory=80 * 2**30) for i in range(2)]
    queues = [QueueSpec("q", deserved={"gpu": 1}), QueueSpec("b", deserved={"gpu": 0}),
              QueueSpec("c", deserved={"gpu": 0})]

    def running(name, queue, gpus, node, first, priority):
        return Workload(name, queue, gpus=gpus, priority=priority, phase=Phase.RUNNING, started_at=0.0,
                        checkpoint_on_signal=True, placements=(PodPlacement(0, node, tuple(range(first, first + gpus))),))
    held = [running(f"c{i}", "c", 1, "n0", i, 50) for i in range(3)]
    held += [running("L", "b", 1, "n1", 0, 40), running("H", "b", 2, "n1", 1, 60)]
    snap = Snapshot(now=100.0, nodes=nodes, queues=queues, workloads=[*held, Workload("p", "q", gpus=2)])
    fast = Scheduler().schedule(snap)
    assert [e.workload for e in fast.evictions] == ["H"]
    monkeypatch.setattr(cycle, "SHORTCUTS", False)
    slow = Scheduler().schedule(snap)
    assert fast.evictions == slow.evictions and fast.reservations == slow.reservations


def test_a_walk_skips_the_nodes_where_every_victim_is_refused(monkeypatch):
    """A borrower holds one GPU on each of 30 nodes, and keeps a younger workload of lower priority
    running (protected by the minimum runtime): the budget refuses every one of its victims first
    (its lower-priority workload would go first). The walk searches none of the 30 nodes; with the
    marking on it lists only the last of them (for the refusal the walk leaves), and the cycle
    decides the same, its reason included, as with the shortcuts off."""
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot, Workload
    from gpupool.scheduler.reasons import Code

    nodes = [NodeSpec(f"n{i:02d}", gpus=1, gpu_memory=80 * 2**30) for i in range(31)]
    queues = [QueueSpec("b", deserved={"gpu": 10}), QueueSpec("q", deserved={"gpu": 0})]
    old = [Workload(f"b{i:02d}", "b", gpus=1, priority=60, phase=Phase.RUNNING, started_at=0.0,
                    placements=(PodPlacement(0, f"n{i:02d}", (0,)),)) for i in range(30)]
    young = Workload("young", "b", gpus=1, priority=40, phase=Phase.RUNNING, started_at=990.0,
                     placements=(PodPlacement(0, "n30", (0,)),))
    snap = Snapshot(now=1000.0, nodes=nodes, queues=queues, workloads=[*old, young, Workload("p", "q", gpus=1)])
    cfg = SchedulerConfig(min_runtime=60.0)
    listed = []
    real = plan._nodes_from_index

    def spy(*a, **kw):
        for item in real(*a, **kw):
            listed.append(item[1])
            yield item
    monkeypatch.setattr(plan, "_nodes_from_index", spy)
    results = {}
    for skip_after in (0, 1000):
        monkeypatch.setattr(plan, "SKIP_AFTER", skip_after)
        listed.clear()
        results[skip_after] = (Scheduler(cfg).schedule(snap), list(listed))
    monkeypatch.setattr(cycle, "SHORTCUTS", False)
    slow = Scheduler(cfg).schedule(snap)
    for result, _ in results.values():
        assert not result.evictions
        assert result.pending["p"] == slow.pending["p"]
        assert result.pending["p"].code is Code.RECLAIM_REFUSED
        assert result.pending["p"].detail["rule"] == "priority"
    assert len(results[1000][1]) == 30
    assert results[0][1] == [results[1000][1][-1]]


def test_holders_probed_at_once_see_their_own_holds(monkeypatch):
    """A holder planned on two idle GPUs of a node (it holds them in the now view) fits there only
    with its own holds given back; one planned where a workload is still releasing fits nowhere
    on that node yet."""
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.cluster import FreeRows
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Reservation, Snapshot, Workload
    from gpupool.scheduler.reasons import Code

    nodes = [NodeSpec("n0", gpus=4, gpu_memory=80 * 2**30), NodeSpec("n1", gpus=2, gpu_memory=80 * 2**30)]
    queues = [QueueSpec("borrower", deserved={"gpu": 0}), QueueSpec("q", deserved={"gpu": 6})]
    running = [Workload("r0", "borrower", gpus=2, phase=Phase.RELEASING, started_at=0.0,
                        placements=(PodPlacement(0, "n0", (2, 3)),)),
               Workload("r1", "borrower", gpus=2, phase=Phase.RELEASING, started_at=0.0,
                        placements=(PodPlacement(0, "n1", (0, 1)),))]
    holders = [Workload("h0", "q", gpus=2, submit_time=1.0), Workload("h1", "q", gpus=2, submit_time=2.0)]
    reservations = [Reservation("h0", (PodPlacement(0, "n0", (0, 1)),), Code.RECLAIMING, 50.0),
                    Reservation("h1", (PodPlacement(0, "n1", (0, 1)),), Code.RECLAIMING, 51.0)]
    snap = Snapshot(now=60.0, nodes=nodes, queues=queues, workloads=[*running, *holders], reservations=reservations)
    ctx = Scheduler().start(snap)
    todo = [(w, ctx.reservations[w.id], ctx.candidate(w)) for w in holders]
    out = allocate._own_node_fits(ctx, todo)
    assert out == {"h0": (0, True), "h1": (1, False)}
    rows = FreeRows(ctx.now)
    assert [allocate._fits_own_node(ctx, c, r, rows) for _, r, c in todo] == [True, False]
    assert ctx.now.gpu_free[0].tolist()[:2] == [0, 0]  # held for h0: free to nobody else


def test_the_switch_really_turns_the_shortcuts_off(monkeypatch):
    """The comparison above is only worth something if SHORTCUTS=False takes the other path:
    four pending workloads of one queue and request wait for a busy GPU; with the shortcuts on,
    the first fails on its own, the second leads a group of the other two."""
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Snapshot, Workload

    nodes = [NodeSpec("n0", gpus=1, gpu_memory=80 * 2**30)]
    queues = [QueueSpec("q", deserved={"gpu": 1})]
    running = Workload("r", "q", gpus=1, phase=Phase.RUNNING, placements=(PodPlacement(0, "n0", (0,)),),
                       started_at=0.0)
    pending = [Workload(f"p{i}", "q", gpus=1, submit_time=float(i)) for i in range(4)]
    snap = Snapshot(now=10.0, nodes=nodes, queues=queues, workloads=[running, *pending])
    grouped = []
    real = allocate.allocate

    def spy(ctx, failed=None):
        out = real(ctx, failed)
        grouped.append(sum(len(c.more or ()) for c in out))
        return out
    from gpupool.scheduler import core
    monkeypatch.setitem(core.ACTIONS, "allocate", spy)
    for on in (True, False):
        monkeypatch.setattr(cycle, "SHORTCUTS", on)
        grouped.clear()
        result = Scheduler().schedule(snap)
        assert grouped == [2 if on else 0]  # p0 fails first; p1 leads the group of p2 and p3
        assert sorted(result.pending) == ["p0", "p1", "p2", "p3"]
        assert [result.pending[f"p{i}"].position for i in range(4)] == [1, 2, 3, 4]


def test_the_switch_really_turns_the_reclaim_judgements_off(monkeypatch):
    """The same for reclaim: a queue below its share reclaims from a borrower; with the shortcuts
    on its budget's refusals are judged (``plan._Refusals``), with them off every node is searched."""
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Snapshot, Workload

    nodes = [NodeSpec(f"n{i}", gpus=2, gpu_memory=80 * 2**30) for i in range(2)]
    queues = [QueueSpec("borrower", deserved={"gpu": 0}), QueueSpec("q", deserved={"gpu": 4})]
    running = [Workload(f"b{i}", "borrower", gpus=1, phase=Phase.RUNNING, started_at=0.0,
                        placements=(PodPlacement(0, f"n{i // 2}", (i % 2,)),)) for i in range(4)]
    snap = Snapshot(now=100.0, nodes=nodes, queues=queues, workloads=[*running, Workload("p", "q", gpus=1)])
    judged = []
    real = plan._Refusals

    class Spy(real):
        def __init__(self, *a):
            judged.append(1)
            super().__init__(*a)
    monkeypatch.setattr(plan, "_Refusals", Spy)
    for on in (True, False):
        monkeypatch.setattr(cycle, "SHORTCUTS", on)
        judged.clear()
        result = Scheduler().schedule(snap)
        assert len(result.evictions) == 1
        assert bool(judged) is on


def test_the_switch_really_turns_the_runs_of_reservations_off(monkeypatch):
    """And for intake: three reservations are taken in as one run with the shortcuts on, one by
    one with them off, to the same holds."""
    from gpupool.scheduler import Scheduler, intake
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Reservation, Snapshot, Workload
    from gpupool.scheduler.reasons import Code

    nodes = [NodeSpec("n0", gpus=4, gpu_memory=80 * 2**30)]
    queues = [QueueSpec("borrower", deserved={"gpu": 0}), QueueSpec("q", deserved={"gpu": 4})]
    releasing = [Workload(f"b{i}", "borrower", gpus=1, phase=Phase.RELEASING, started_at=0.0,
                          placements=(PodPlacement(0, "n0", (i,)),)) for i in range(3)]
    holders = [Workload(f"h{i}", "q", gpus=1, submit_time=float(i)) for i in range(3)]
    reservations = [Reservation(f"h{i}", (PodPlacement(0, "n0", (i,)),), Code.RECLAIMING, 50.0 + i)
                    for i in range(3)]
    snap = Snapshot(now=60.0, nodes=nodes, queues=queues, workloads=[*releasing, *holders],
                    reservations=reservations)
    runs, one_by_one = [], []
    real_run = intake._take_run
    monkeypatch.setattr(intake, "_take_run", lambda *a: runs.append(a[4] - a[3]) or real_run(*a))
    seen = {}
    for on in (True, False):
        monkeypatch.setattr(cycle, "SHORTCUTS", on)
        runs.clear()
        ctx = Scheduler().start(snap)
        seen[on] = (dict(ctx.holds), sorted(ctx.reservations), dict(ctx.reserved))
        assert runs == ([3] if on else [])
    assert seen[True] == seen[False]
    assert sorted(seen[True][0]) == ["h0", "h1", "h2"]


def _intake_both_ways(monkeypatch, snap):
    from gpupool.scheduler import Scheduler
    seen = {}
    for on in (True, False):
        monkeypatch.setattr(cycle, "SHORTCUTS", on)
        ctx = Scheduler().start(snap)
        seen[on] = (dict(ctx.holds), list(ctx.reservations), dict(ctx.reserved), dict(ctx.result.dropped),
                    ctx.now.gpu_free.tolist(), ctx.future.gpu_free.tolist())
    assert seen[True] == seen[False]
    return seen[True]


def test_a_run_of_reservations_stops_at_the_first_that_cannot_be_taken(monkeypatch):
    """Four reservations planned on one node: the second's GPU is taken by a workload that runs
    there now (its capacity is no longer there), the fourth asks for more than its queue's fair
    share leaves (no longer entitled); the first and third are taken, with their holds, exactly
    as one by one, and the drops give the one-by-one reasons."""
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, Reservation, Snapshot, Workload
    from gpupool.scheduler.reasons import Code

    nodes = [NodeSpec("n0", gpus=4, gpu_memory=80 * 2**30), NodeSpec("n1", gpus=4, gpu_memory=80 * 2**30)]
    queues = [QueueSpec("borrower", deserved={"gpu": 0}), QueueSpec("q", deserved={"gpu": 2}),
              QueueSpec("other", deserved={"gpu": 6})]
    run = [Workload("o1", "other", gpus=1, phase=Phase.RUNNING, started_at=0.0, preemptible=False,
                    placements=(PodPlacement(0, "n0", (1,)),))]
    releasing = [Workload(f"b{g}", "borrower", gpus=0.5, phase=Phase.RELEASING, started_at=0.0,
                          placements=(PodPlacement(0, "n0", (g,), 0.5),)) for g in (0, 2, 3)]
    holders = [Workload(f"h{i}", "q", gpus=1, submit_time=float(i)) for i in range(3)]
    holders.append(Workload("h3", "q", gpus=2, submit_time=3.0))
    holders += [Workload(f"w{i}", "other", gpus=1, submit_time=9.0) for i in range(8)]  # other wants its share
    # two halves planned on one GPU of n1 that a releasing quarter still holds 3/4 of: the first
    # holds the free quarter, the second nothing yet
    releasing.append(Workload("b9", "borrower", gpus=0.75, phase=Phase.RELEASING, started_at=0.0,
                              placements=(PodPlacement(0, "n1", (2,), 0.75),)))
    holders += [Workload(f"s{i}", "other", gpus=0.5, submit_time=8.0) for i in range(2)]
    plan = [(0,), (1,), (2,), (3,)]
    reservations = [Reservation(f"h{i}", (PodPlacement(0, "n0", plan[i]),), Code.RECLAIMING, 50.0 + i)
                    for i in range(3)]
    reservations.append(Reservation("h3", (PodPlacement(0, "n1", (0, 1)),), Code.RECLAIMING, 53.0))
    reservations += [Reservation(f"s{i}", (PodPlacement(0, "n1", (2,), 0.5),), Code.PREEMPTING, 54.0 + i)
                     for i in range(2)]
    snap = Snapshot(now=60.0, nodes=nodes, queues=queues, workloads=[*run, *releasing, *holders],
                    reservations=reservations)
    holds, taken, _, dropped, _, _ = _intake_both_ways(monkeypatch, snap)
    assert taken == ["h0", "h2", "s0", "s1"]
    assert "no longer there" in dropped["h1"] and "fair share" in dropped["h3"], dropped
    assert holds["h0"][0][2] == (500,) and holds["h2"][0][2] == (500,)  # the halves free now, held
    assert holds["s0"][0][2] == (250,) and holds["s1"][0][2] == (0,)
