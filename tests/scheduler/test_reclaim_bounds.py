"""The bounds behind reclaim's node search are sound.

The node bounds: a reclaim plans node by node, in order of a lower bound on the cost of a plan
there, and skips a node whose tighter bound already ranks behind the best plan found
(``plan._nodes_from_index``). Checked on whole random simulations: every node is searched, and
no plan found on a node costs less than either bound said.

The bound behind reclaim's "never closer to fair" judgement:
A reclaim by the fair-share rule must bring the shares closer to fair: at each level where the
reclaimer's side meets victims' sides, the sum of squared distances from fair share must fall
(``ReclaimBudget.accepts``). Reclaim skips a node when ``plan._least_change`` shows that no choice of
its victims can make that sum fall. The skip is only safe if the bound is never above the change
of any plan: checked here against every subset of random victims, with the change worked out as
``accepts`` does.
"""
from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler.fairshare import EPS
from gpupool.scheduler import plan
from gpupool.scheduler.plan import _least_change
from gpupool.sim import parse_scenario, simulate
# ``_settings``: the name the decorators below were written with, part of each property's seed
from guarantee_scenarios import example_settings as _settings, scenarios

QUARTERS = st.integers(-16, 16).map(lambda k: k / 4)  # GPUs above fair share, as shares come
SIZES = st.sampled_from([0.25, 0.5, 0.75, 1.0, 2.0, 4.0])


def _change(before: float, amount: float, wants: float, over: dict[str, float], taken: dict[str, float]) -> float:
    """``ReclaimBudget.accepts``' change at one level for victims taking ``taken`` from each side."""
    excess = max(0.0, sum(taken.values()) - amount)
    after = before + amount + min(excess, wants)
    change = after * after - before * before
    for side, t in taken.items():
        o = over[side]
        change += (o - t) * (o - t) - o * o
    return change


@_settings(400)
@given(before=QUARTERS, amount=SIZES, wants=st.sampled_from([0.0, 0.5, 1.0, 3.0, 100.0]),
       over=st.lists(QUARTERS, min_size=1, max_size=4),
       victims=st.lists(st.tuples(st.integers(0, 3), SIZES), min_size=1, max_size=6))
def test_the_bound_is_never_above_the_change_of_any_plan(before, amount, wants, over, victims):
    victims = [(f"s{i % len(over)}", a) for i, a in victims]
    overs = {f"s{i}": o for i, o in enumerate(over)}
    sides = {s for s, _ in victims}
    amounts = [a for _, a in victims]
    bound = _least_change(before, amount, wants, len(sides), max([0.0, *(overs[s] for s in sides)]),
                          min(amounts), sum(amounts))
    for k in range(1, len(victims) + 1):
        for chosen in combinations(victims, k):
            taken: dict[str, float] = {}
            for s, a in chosen:
                taken[s] = taken.get(s, 0.0) + a
            assert bound <= _change(before, amount, wants, overs, taken) + 1e-9


def test_the_bound_proves_the_case_that_made_reclaim_search_every_node():
    """At 4,000 nodes one reclaimer searched 1,373 nodes and found no plan: its department was
    1 GPU above its fair share, every victim's 0.25 to 1.5 GPUs above, and whatever moved, the
    reclaimer's side gained the GPU it asked for. The bound says so without searching."""
    assert _least_change(1.0, 1.0, 828.5, 3, 1.5, 0.25, 3.0) >= -EPS
    # and it does not claim it where a plan can help: a victim side 3 GPUs above its share
    assert _least_change(1.0, 1.0, 828.5, 1, 3.0, 1.0, 1.0) < -EPS


_NEVER = (float("-inf"), 0, float("-inf"))  # ranks before any plan: no node is skipped


@pytest.fixture(scope="module")
def node_bounds_seen():
    seen = {"plans": 0, "one": 0}
    yield seen
    # the property below must have met plans of one victim judged by the tighter bound
    assert seen["plans"] > 0 and seen["one"] > 0, seen


@_settings(60)
@given(scenarios(), st.integers(0, 2))
def test_no_plan_on_a_node_costs_less_than_its_bounds(node_bounds_seen, data, seed):
    here: dict = {}
    seen = node_bounds_seen
    nodes_from_index, search = plan._nodes_from_index, plan._search

    def every_node(*a, **k):
        for bound, n, vs, *tighter in nodes_from_index(*a, **k):
            here["node"] = (bound, tighter[0]())
            yield _NEVER, n, vs, lambda: _NEVER
            here.clear()  # a search after the walk (a skipped node's refusal) is not this node's

    def checked(*a, **k):
        found = search(*a, **k)
        if found is not None and "node" in here:
            bound, tight = here["node"]
            cost = found[0][:3]
            assert bound <= cost and tight <= cost, (bound, tight, cost)
            seen["plans"] += 1
            seen["one"] += cost[1] == 1 == tight[1]
        return found

    plan._nodes_from_index, plan._search = every_node, checked
    try:
        simulate(parse_scenario(data), seed=seed)
    finally:
        plan._nodes_from_index, plan._search = nodes_from_index, search
