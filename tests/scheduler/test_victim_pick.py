"""A plan's next victim is the least ``victim_key`` among the queues' first victims not taken; a
walk visits nodes in the order of a full sort of their bounds.

``plan._Pool._pick`` keeps the queues' first victims in a heap whose keys may lag behind (a
queue's key only rises as its victims go), and puts an entry right when it comes up. Checked
against a scan of every queue over random victims and random passes: victims taken (their
queue's excess falls), refused (taken, nothing gone) and forced first out of order.
"""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler import plan
from gpupool.scheduler.model import Workload
# ``_settings``: the name the decorators below were written with, part of each property's seed
from guarantee_scenarios import example_settings as _settings


def _scan(pool: plan._Pool, gone: dict[str, float], taken: set[str]) -> Workload | None:
    best, best_key = None, None
    for q, lst in pool.groups.items():
        for i, v in enumerate(lst):
            if v.id not in taken:
                s = pool.keys[q][i]
                k = (s[0], gone.get(q, 0.0) - pool.excess[q], s[1], s[2], s[3])
                if best_key is None or k < best_key:
                    best, best_key = v, k
                break
    return best


VICTIMS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 10.0, 20.0]), st.sampled_from([40, 50]),
                             st.sampled_from([0.0, 5.0]), st.sampled_from([0.25, 1.0, 2.0])),
                   min_size=1, max_size=14)


@_settings(300)
@given(VICTIMS, st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.5]), min_size=4, max_size=4),
       st.lists(st.tuples(st.sampled_from(["take", "refuse", "force"]), st.integers(0, 13)), max_size=20))
def test_the_heap_picks_what_a_scan_of_every_queue_picks(victims, overs, steps):
    ws = [Workload(f"v{i:02d}", f"q{q}", gpus=gpus, priority=prio, started_at=start)
          for i, (q, _, prio, start, gpus) in enumerate(victims)]
    cost = {w.id: c for w, (_, c, *_rest) in zip(ws, victims)}
    amounts = {w.id: (w.gpus, 0.0, 0.0) for w in ws}
    ctx = SimpleNamespace(now_t=100.0, victim_cost=lambda v: cost[v.id], over=lambda q: overs[int(q[1:])],
                          amounts=amounts, cache={})
    pool = plan._Pool(ctx, ws)
    heads = pool.heads.copy()
    idx = {q: 0 for q in pool.groups}
    gone: dict[str, float] = {}
    taken: set[str] = set()
    for action, k in steps:
        if action == "force":  # a pass that starts from a given victim takes it out of order
            v = ws[k % len(ws)]
            if v.id in taken:
                continue
        else:
            v = pool._pick(heads, idx, gone, taken)
            assert v is _scan(pool, gone, taken)
            if v is None:
                break
        taken.add(v.id)
        if action != "refuse":
            gone[v.queue] = gone.get(v.queue, 0.0) + amounts[v.id][0]
    assert pool._pick(heads, idx, gone, taken) is _scan(pool, gone, taken)


@_settings(300)
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 0.25, 1.0, 3.0]), st.sampled_from([-2.0, -1.0, 0.0, 4.5])),
                max_size=400),
       st.integers(1, 80))
def test_a_walk_visits_nodes_in_the_order_of_a_full_sort(keys, head):
    """``plan._lex_order`` sorts a slice at a time (a walk mostly stops early); it gives the order
    of ``np.lexsort`` by the bound's first place, then its third, then node, ties included."""
    import numpy as np
    first = np.array([k[0] for k in keys], dtype=float)
    second = np.array([k[1] for k in keys], dtype=float)
    want = np.lexsort((np.arange(len(keys)), second, first)).tolist()
    assert list(plan._lex_order(first, second, head)) == want


TIMES = st.one_of(st.none(), st.floats(0.0, 1e6, allow_nan=False, allow_subnormal=False))


@_settings(300)
@given(st.lists(st.tuples(st.booleans(), TIMES, TIMES, st.floats(0.0, 64.0, allow_nan=False, allow_subnormal=False)),
                max_size=30),
       st.floats(0.0, 1e6, allow_nan=False, allow_subnormal=False))
def test_lost_work_of_all_victims_at_once_is_each_ones_bit_for_bit(facts, now):
    """The victim index works out every victim's lost GPU-seconds in one pass of array
    arithmetic; it must be what ``lost_gpu_seconds`` says of each (the plans' costs, their ties
    and the caches share these numbers)."""
    import numpy as np

    from gpupool.scheduler.victims import lost_gpu_seconds, lost_gpu_seconds_all

    ws = [Workload(f"w{i}", "q", gpus=1.0, checkpoint_on_signal=sig, started_at=start, last_checkpoint_at=last)
          for i, (sig, start, last, _) in enumerate(facts)]
    gpus = np.array([g for *_, g in facts], dtype=float)
    got = lost_gpu_seconds_all(now, gpus, [w.checkpoint_on_signal for w in ws], [w.started_at for w in ws],
                               [w.last_checkpoint_at for w in ws])
    want = [lost_gpu_seconds(w, now, g) for w, g in zip(ws, gpus.tolist())]
    assert got.tolist() == want


def _index_one_by_one(ctx) -> dict:
    """The victim index as it was built before (one victim at a time): the reference."""
    import numpy as np

    from gpupool.scheduler.victims import lost_gpu_seconds

    qn = {q: i for i, q in enumerate(ctx.tree.queues)}
    per_node: dict = {}
    per_node_q: dict = {}
    cols, milli, queue, cost, gpus, prio = [], [], [], [], [], []
    for v in ctx.preemptible_running():
        a = ctx.amounts[v.id][0]
        k = lost_gpu_seconds(v, ctx.now_t, a)
        for n, m in ctx.victim_nodes(v):
            per_node.setdefault(n, []).append((v, m))
            per_node_q.setdefault(n, []).append((qn[v.queue], v.id))
            cols.append(n)
            milli.append(m)
            queue.append(qn[v.queue])
            cost.append(k)
            gpus.append(a)
            prio.append(v.priority)
    milli_a, cols_a = np.array(milli, dtype=np.int64), np.array(cols, dtype=np.int64)
    order = np.lexsort((-milli_a, cols_a))
    return {"per_node": list(per_node.items()), "per_node_q": list(per_node_q.items()),
            "cols": cols_a[order].tolist(), "milli": milli_a[order].tolist(),
            "queue": np.array(queue, dtype=np.int64)[order].tolist(), "cost": np.array(cost)[order].tolist(),
            "gpus": np.array(gpus)[order].tolist(), "prio": np.array(prio, dtype=float)[order].tolist()}


@_settings(100)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3), st.sampled_from([0.25, 0.5, 1.0, 2.0]),
                          st.integers(0, 2), st.booleans(), st.sampled_from([None, 0.0, 30.0, 90.0]),
                          st.sampled_from([None, 10.0, 60.0]), st.booleans()), max_size=25),
       st.randoms(use_true_random=False))
def test_the_victim_index_built_at_once_is_the_one_built_victim_by_victim(specs, rnd):
    """The index reads every victim's facts in one pass and works out the rest for all at once;
    its per-node lists (in the victims' order, nodes as they first come), its sorted entries and
    their facts are what a loop over the victims one by one makes (victims of one or more pods,
    across nodes, on unknown nodes, young and evicted ones left out)."""
    from gpupool.scheduler.core import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot

    nodes = [NodeSpec(f"n{i}", gpus=4, gpu_memory=80 * 2**30, cpu=64, memory=512 * 2**30) for i in range(4)]
    queues = [QueueSpec("a", deserved={"gpu": 8}), QueueSpec("b", deserved={"gpu": 8}),
              QueueSpec("a1", parent="a", deserved={"gpu": 4})]
    ws = []
    for i, (node, pods, gpus, q, signal, started, last, elsewhere) in enumerate(specs):
        placements = tuple(PodPlacement(p, f"n{(node + p) % 6}" if not elsewhere else "gone",
                                        (rnd.randrange(4),), min(gpus, 1.0)) for p in range(pods))
        ws.append(Workload(f"v{rnd.randrange(10**6):06d}-{i}", ["a1", "b", "a1"][q], gpus=gpus, pods=pods,
                           priority=q, phase=Phase.RUNNING, placements=placements, checkpoint_on_signal=signal,
                           started_at=started, last_checkpoint_at=last))
    ctx = Scheduler(SchedulerConfig(min_runtime=45.0)).start(Snapshot(100.0, nodes, queues, ws))
    running = ctx.preemptible_running()
    if running:
        ctx.evicted.add(running[rnd.randrange(len(running))].id)
    want = _index_one_by_one(ctx)
    idx = plan._VictimIndex(ctx)
    gpus, prio = idx.facts()
    got = {"per_node": list(idx.per_node.items()), "per_node_q": list(idx.per_node_q.items()),
           "cols": idx.nodes.repeat([hi - lo for lo, hi in idx.bounds]).tolist() if idx.bounds else [],
           "milli": idx.milli.tolist(), "queue": idx.queue.tolist(), "cost": idx.cost.tolist(),
           "gpus": gpus.tolist(), "prio": prio.tolist()}
    assert got == want
    from gpupool.scheduler.victims import lost_gpu_seconds

    for v in ctx.preemptible_running():  # (the cost cache the index fills)
        assert ctx._vcost[v.id] == lost_gpu_seconds(v, ctx.now_t, ctx.amounts[v.id][0])


def _canonical(index: dict) -> dict:
    """An index as sets: each node's victims, and the entries' facts sorted (what a kept book may
    hold in another order than a fresh build; nothing the index answers depends on it)."""
    out = {"per_node": {n: sorted((v.id, m) for v, m in vs) for n, vs in index["per_node"]},
           "per_node_q": {n: sorted((vid, q) for q, vid in vs) for n, vs in index["per_node_q"]}}
    rows = list(zip(index["cols"], index["milli"], index["queue"], index["cost"], index["gpus"], index["prio"]))
    out["entries"] = sorted(rows)
    # the runs: a node's entries together, the largest share first
    out["cols"] = index["cols"]
    out["milli_runs"] = [m for _, m in sorted(zip(index["cols"], index["milli"]), key=lambda t: (t[0], -t[1]))] \
        == index["milli"]
    return out


def _got(idx) -> dict:
    gpus, prio = idx.facts()
    return {"per_node": list(idx.per_node.items()), "per_node_q": list(idx.per_node_q.items()),
            "cols": idx.nodes.repeat([hi - lo for lo, hi in idx.bounds]).tolist() if idx.bounds else [],
            "milli": idx.milli.tolist(), "queue": idx.queue.tolist(), "cost": idx.cost.tolist(),
            "gpus": gpus.tolist(), "prio": prio.tolist()}


@_settings(60)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["start", "change", "release", "end", "stay"]), st.integers(0, 11),
                                   st.integers(0, 3), st.integers(1, 2), st.sampled_from([0.25, 1.0, 2.0]),
                                   st.sampled_from([None, 0.0, 80.0])), min_size=1, max_size=10), min_size=3, max_size=7),
       st.randoms(use_true_random=False))
def test_the_victim_book_kept_across_cycles_gives_the_index_a_fresh_build_gives(steps, rnd):
    """Cycle after cycle, with the snapshot naming what changed, the victim index made from the
    kept book (victims that came, went, changed, aged past ``min_runtime``, and one evicted before
    the build) holds what an index built afresh from the same cycle holds, node by node and entry
    by entry, and fills the same lost-work cache."""
    import dataclasses

    from gpupool.scheduler.core import Scheduler
    from gpupool.scheduler.model import NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot

    nodes = [NodeSpec(f"n{i}", gpus=4, gpu_memory=80 * 2**30, cpu=64, memory=512 * 2**30) for i in range(4)]
    queues = [QueueSpec("a", deserved={"gpu": 8}), QueueSpec("b", deserved={"gpu": 8}),
              QueueSpec("a1", parent="a", deserved={"gpu": 4})]
    sched = Scheduler(SchedulerConfig(min_runtime=45.0))
    ws: dict[str, Workload] = {}
    kept = None
    now = 100.0
    for k, step in enumerate(steps):
        changed: set[str] = set()
        for what, i, node, pods, gpus, started in step:
            wid = f"w{i:02d}"
            old = ws.get(wid)
            if what == "stay" or (old is None and what != "start"):
                continue
            if what == "end":
                ws.pop(wid, None)
            elif what == "release":
                ws[wid] = dataclasses.replace(old, phase=Phase.RELEASING)
            else:  # start (or start again elsewhere), or change its facts in place
                placements = tuple(PodPlacement(p, f"n{(node + p) % 5}", (rnd.randrange(4),), min(gpus, 1.0))
                                   for p in range(pods))
                ws[wid] = Workload(wid, ["a1", "b", "a1"][i % 3], gpus=gpus, pods=pods, priority=i % 3,
                                   phase=Phase.RUNNING, placements=placements, checkpoint_on_signal=i % 4 == 0,
                                   started_at=None if started is None else now - started,
                                   last_checkpoint_at=now - 10.0 if i % 5 == 0 else None)
            changed.add(wid)
        snap = Snapshot(now, nodes, queues, list(ws.values()), changes=frozenset(changed) if kept else None)
        ctx = sched.start(snap, waiting=kept, keep=True)
        running = ctx.preemptible_running()
        if running and k % 2:
            ctx.evicted.add(running[rnd.randrange(len(running))].id)
        fresh_ctx = Scheduler(SchedulerConfig(min_runtime=45.0)).start(dataclasses.replace(snap, changes=None))
        fresh_ctx.evicted |= ctx.evicted
        want = _canonical(_index_one_by_one(fresh_ctx))
        assert _canonical(_got(plan._VictimIndex(ctx))) == want
        assert _canonical(_got(plan._VictimIndex(fresh_ctx))) == want
        assert {v.id: ctx._vcost[v.id] for v in ctx.preemptible_running()} == \
            {v.id: fresh_ctx._vcost[v.id] for v in fresh_ctx.preemptible_running()}
        kept = ctx.waiting
        now += 20.0  # (victims age past min_runtime: a young one comes in later without a change)


def test_the_held_book_drops_its_victim_book_when_changes_pile_up():
    """A held book keeps the changes since the victim index was last made, for the victim book;
    when no index is made for many cycles (no reclaim), it drops the book rather than keep every
    change since (a long-running service would otherwise hold them all), and the next index is
    made afresh."""
    from gpupool.scheduler import held
    from gpupool.scheduler.model import NodeSpec

    nodes = [NodeSpec("n0", gpus=4)]
    hb = held.HeldBook(nodes, {"n0": 0}, 4)
    hb.victims = object()  # (a book: ``plan._VictimBook``)
    hb.forget([f"w{i}" for i in range(10)])
    assert hb.victims is not None and len(hb.changed) == 10
    cycle = 0
    while hb.victims is not None:
        hb.forget([f"c{cycle}-{i}" for i in range(500)])
        cycle += 1
        assert len(hb.changed) <= held.CHANGED_KEPT + 500
    assert hb.changed == set() and cycle == held.CHANGED_KEPT // 500 + 1
