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
                          amounts=amounts)
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
