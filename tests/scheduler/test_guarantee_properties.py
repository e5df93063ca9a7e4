"""Liveness and stability of the guaranteed quota over long random scenarios (issue 8), replayed
through the real scheduler by the simulator.

Scenarios: a department with two projects plus one or two top-level queues (deserved quotas that
never over-commit the cluster: top-level quotas sum to at most the cluster's GPUs, a department's
projects to at most its own), weights, some limits (never below deserved), queue priorities; 2-4
nodes of 2 or 4 GPUs in two racks; a constant stream of arrivals of whole-GPU, fractional
(0.25/0.5 or gpu_memory) and gang (2-4 pods) workloads, interactive/inference (non-preemptible)
and train/hpo-trial, with checkpoint_on_signal / checkpoint_every and sometimes a min_runtime.
Every time in a scenario (submissions, durations, grace, min_runtime, checkpoints) is a multiple
of the cycle, so the state the scheduler sees at each cycle is the state until the next cycle.

The **extended** generator (``scenarios(extended=True)``, the ``test_extended_*`` properties) adds
what a lab meets when the pool shrinks: half of its examples have **over-committed** top-level
quotas (they add up to more than the cluster; with configurations that accept it, half also
give a department's projects more than the department), and each example has 0-3 **node
events** (``fail`` or ``drain`` of a random node at a random time, half of them followed by a
``return`` 1-60 cycles later). With ``extended=False`` the draws are exactly the original ones,
so CI's fixed examples of the original properties do not move.

Properties:

* **Liveness.** A pending workload ``w`` of leaf queue ``Q`` is *entitled* at a cycle (judged on
  the state after that cycle's decisions) when all of these hold:

  1. for ``Q`` and every ancestor ``A``: what ``A`` holds (running workloads; releasing ones are
     leaving and not counted) + ``w`` + every pending workload of ``Q`` ahead of ``w`` in its
     queue (higher priority, or equal priority and earlier submission) <= ``A``'s *guarantee*
     (so also within every limit, as limits are never below deserved);
  2. ``w`` fits the cluster once a *valid victim set* ``V`` is gone: some set of running
     preemptible workloads of other leaf queues such that every queue on a victim's path below
     the level where it meets ``Q``'s path still holds at least its guarantee without ``V``
     (only borrowed capacity is taken back).

  A queue's *guarantee* is its deserved quota shrunk as docs/scheduling.md section 1 divides an
  over-committed level: top-down, each child's ``min(deserved, demand)`` (demand: what its
  running, releasing and pending workloads ask), scaled in proportion when a level's add up to
  more than that level has: at the top the GPUs of the nodes in service (a failed or drained
  node's are gone), below it the parent's own guarantee. Where nothing over-commits this judges
  exactly as the deserved quota does. Everything else running stays where it is: all
     non-preemptible workloads, every workload of ``Q`` itself, and every workload of a queue
     within its deserved. Releasing workloads count as free (they leave within a grace period).
     "Fits" is exact for identical pods and no CPU/memory requests: per node, whole-GPU pods
     take entirely free GPUs, fractional pods take per-GPU free milli-GPU (a gang's pods each a
     GPU of their own).

  ``V`` is searched among subsets of up to 3 victims (after checking that freeing every
  individually valid candidate fits at all), so the check can miss an entitlement but never
  invents one. Property: a workload that stays entitled from cycle ``t0`` starts by
  ``t0 + 2 * preemption_grace + min_runtime + 5 * cycle`` (``min_runtime``: a victim may still be
  protected when ``w`` becomes entitled); losing entitlement (another queue legitimately took the
  room within its own deserved quota) restarts the clock, and so does a node event (a change of
  supply: the plans under way may no longer hold).

* **Stability.** A workload is not preempted twice within ``preemption_grace + min_runtime``
  (between the two eviction decisions: the issue's window; a workload that resumed runs at least
  ``min_runtime`` after its grace period before it may be evicted again) unless demand changed:
  a submission or a finish between the two eviction signals. A stop caused by a node event
  (``reason`` ``node-failure`` or ``drain``) is not the scheduler's and does not count; a node
  event between two evictions counts as a change (of supply).

* **Steady state.** Arrivals and node events stop at ``T`` and nothing finishes (long
  durations): from ``T + 6 * (preemption_grace + min_runtime) + 30 * cycle`` on, no eviction is
  decided.

The **pooled** generator (``scenarios(pooled=True)``, the ``test_pooled_*`` properties) puts the
nodes in two node pools, draws every queue's quota per pool, lets workloads name their pools (one,
both in either order, or none) and, in half of its examples, turns fairness over time on
(liveness and stability; steady state is checked without it, since past usage moves shares as it
ages). Liveness is then judged per pool.

The **deep** generator (``scenarios(extended=True, deep=True)``) adds a third level to the
extended one: an organisation over the department and ``q0``, and sometimes a third project in
the department, so that reclaims meet at the top, inside the organisation and inside the
department. The ``test_mixed_*`` properties draw from it and from the pooled generator with the
extended one's over-commit and node events (``scenarios(extended=True, pooled=True)``); liveness
and stability are judged there on one replay.

Each original property runs ``GUARANTEE_EXAMPLES`` examples, each extended one
``GUARANTEE_EXTENDED_EXAMPLES``, each pooled one ``GUARANTEE_POOLED_EXAMPLES`` and each mixed one
``GUARANTEE_MIXED_EXAMPLES`` (the CI counts are the defaults below; ``-k "not extended"`` runs
only the original generator, ``-k extended`` only the new one); hunt with e.g.
``GUARANTEE_EXAMPLES=2000``, ``GUARANTEE_RANDOM=1`` (a fresh random stream instead of CI's fixed
examples, which are derandomized and leave the project's own literals out, so that they do not
move with the files collected or the code's growth) and ``GUARANTEE_SHRINK=1`` (shrinking is off by default: on a long
scenario it takes minutes); ``GUARANTEE_DUMP=DIR`` writes each counterexample found to DIR as a
scenario file. Counterexamples are kept as tests/scenarios/regress_*.yaml, each with a
plain test at the end of this file.
"""
from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler.model import MILLI
from gpupool.sim import load_scenario, parse_scenario, simulate
from gpupool.sim.engine import Engine
# the generator and its settings (tests/support/guarantee_scenarios.py); ``_settings`` is the name
# the decorators below were written with, part of each property's seed
from guarantee_scenarios import EPS, RANDOM, example_settings as _settings, scenarios, thrash

N = int(os.environ.get("GUARANTEE_EXAMPLES", "200"))  # per property, the original generator
N_EXTENDED = int(os.environ.get("GUARANTEE_EXTENDED_EXAMPLES", "150"))  # per property, over-commit + node events
N_POOLED = int(os.environ.get("GUARANTEE_POOLED_EXAMPLES", "40"))  # per property, node pools + fairness over time
N_MIXED = int(os.environ.get("GUARANTEE_MIXED_EXAMPLES", "150"))  # per property: deep, or pooled with node events
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
DUMP = os.environ.get("GUARANTEE_DUMP")  # a folder: each counterexample is written there as a scenario file


# -- entitlement -------------------------------------------------------------------------------
def _pod_milli(w, node) -> tuple[int, int]:
    """(whole GPUs, milli of one GPU) one pod of w takes on node (whole: (g, 0))."""
    if w.gpu_memory > 0:
        return 0, -(-w.gpu_memory * MILLI // node.gpu_memory)
    if w.gpus >= 1:
        return int(w.gpus), 0
    return 0, int(round(w.gpus * MILLI))


def _fits(w, nodes, used: dict[tuple[str, int], int]) -> bool:
    """Whether the pods of ``w`` fit; the pods of a gang never share a GPU (a distributed job's
    ranks each need their own device)."""
    pods = 0
    for n in nodes:
        whole, milli = _pod_milli(w, n)
        free = [MILLI - used.get((n.name, g), 0) for g in range(n.gpus)]
        if whole:
            pods += sum(1 for f in free if f >= MILLI) // whole
        elif w.pods > 1:  # the pods of a gang never share a GPU
            pods += sum(1 for f in free if f >= milli)
        else:
            pods += sum(f // milli for f in free)
        if pods >= w.pods:
            return True
    return False


class Entitlement:
    """Decides, from the engine's state after a cycle, whether a pending workload is entitled
    (see the module docstring). ``refresh()`` takes the cycle's state (nodes in service, shrunk
    shares); call it once per cycle before judging."""

    def __init__(self, engine: Engine, pool: str | None = None):
        sc = engine.scenario
        self.engine = engine
        self.pool = pool  # None: no node pools (the whole cluster); else judged inside that pool
        self.queues = {q.name: (q if pool is None else q.in_pool(pool)) for q in sc.queues}
        self.children: dict[str | None, list[str]] = {}
        for q in sc.queues:
            self.children.setdefault(q.parent, []).append(q.name)
        self.path: dict[str, list[str]] = {}
        for q in sc.queues:
            cur, path = q.name, []
            while cur is not None:
                path.append(cur)
                cur = self.queues[cur].parent
            self.path[q.name] = path
        self.refresh()

    def refresh(self) -> None:
        """The nodes in service and every queue's shrunk share at this moment."""
        eng = self.engine
        self.nodes = [n for n in eng.nodes if n.schedulable and self.mine(n)]
        demand = {q: 0.0 for q in self.queues}
        for s in eng._active.values():
            if s.state in ("pending", "running", "releasing") and self.counts(s):
                amt = s.gpu_share if s.state != "pending" else self.share(s.w)
                for q in self.path[s.w.queue]:
                    demand[q] += amt
        self.shrunk = shrunk_shares(self.queues, self.children, demand, float(sum(n.gpus for n in self.nodes)))

    def mine(self, node) -> bool:
        return self.pool is None or node.pool == self.pool

    def counts(self, s) -> bool:
        """Whether ``s`` takes part in this pool: held there, or pending and allowed to use it
        (the scheduler counts a pending workload as demand in every pool it may use)."""
        if self.pool is None:
            return True
        if s.state == "pending":
            return not s.w.pools or self.pool in s.w.pools
        return self.engine._pool_of(s) == self.pool

    def deserved(self, q: str) -> float:
        """What ``q`` is guaranteed now: its deserved quota, shrunk where a level over-commits."""
        return self.shrunk[q]

    def __call__(self, sw) -> bool:
        eng = self.engine
        w = sw.w
        if not self.counts(sw):
            return False
        running = [s for s in eng._active.values() if s.state == "running" and self.counts(s)]
        alloc = eng._roll_up({q: 0.0 for q in eng.scenario.leaves})
        for s in running:
            for q in self.path[s.w.queue]:
                alloc[q] += s.gpu_share
        ahead = sum(self.share(s.w) for s in eng._active.values()
                    if s.state == "pending" and s.w.queue == w.queue and s is not sw and self.counts(s)
                    and (s.w.priority, -s.w.submit_time, -s.index) > (w.priority, -w.submit_time, -sw.index))
        need = self.share(w) + ahead
        qpath = self.path[w.queue]
        if any(alloc[q] + need > self.deserved(q) + EPS for q in qpath):
            return False
        fixed, cands = [], []
        for s in running:
            below = [q for q in self.path[s.w.queue] if q not in qpath]
            if (s.w.preemptible and below
                    and all(alloc[q] - s.gpu_share >= self.deserved(q) - EPS for q in below)):
                cands.append((s, below))
            else:
                fixed.append(s)
        upper: dict[tuple[str, int], int] = {}  # every candidate gone: no victim set frees more
        for s in fixed:
            self._use(upper, s)
        if not _fits(w, self.nodes, upper):
            return False
        for k in range(0, min(3, len(cands)) + 1):
            for subset in itertools.combinations(range(len(cands)), k):
                taken: dict[str, float] = {}
                for i in subset:
                    s, below = cands[i]
                    for q in below:
                        taken[q] = taken.get(q, 0.0) + s.gpu_share
                if any(alloc[q] - v < self.deserved(q) - EPS for q, v in taken.items()):
                    continue
                used = dict(upper)
                for i, (s, _) in enumerate(cands):
                    if i not in subset:
                        self._use(used, s)
                if _fits(w, self.nodes, used):
                    return True
        return False

    def share(self, w) -> float:
        if w.gpu_memory > 0:  # the least share it can take on any node
            nodes = [n for n in self.engine.nodes if n.gpu_memory > 0 and self.mine(n)] or \
                [n for n in self.engine.nodes if n.gpu_memory > 0]
            return w.pods * min(-(-w.gpu_memory * MILLI // n.gpu_memory) for n in nodes) / MILLI
        return w.pods * w.gpus

    @staticmethod
    def _use(used: dict, s) -> None:
        for p in s.w.placements:
            for g in p.gpus:
                used[(p.node, g)] = used.get((p.node, g), 0) + p.milli

def shrunk_shares(queues: dict, children: dict, demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Every queue's guarantee in GPUs after shrinkage (docs/scheduling.md section 1,
    over-committed quotas): top-down, each child's guarantee is ``min(deserved, demand)``; when
    the guarantees of one level add up to more than what that level has (the capacity in service
    at the top, the parent's own shrunk guarantee below), each is scaled in proportion. Without
    over-commit this is ``min(deserved, demand)``, which judges exactly as the deserved quota."""
    out: dict[str, float] = {}
    stack: list[tuple[str | None, float]] = [(None, capacity)]
    while stack:
        parent, amount = stack.pop()
        kids = children.get(parent, [])
        g = {k: min(queues[k].deserved.get("gpu", 0.0), demand[k]) for k in kids}
        total = sum(g.values())
        scale = amount / total if total > amount + EPS else 1.0
        for k in kids:
            out[k] = g[k] * scale
            stack.append((k, out[k]))
    return out


# -- the properties ----------------------------------------------------------------------------
def liveness_failures(data: dict, seed: int = 0) -> tuple[list[str], dict]:
    """Replay ``data``; return the entitled workloads that did not start in time, and the report."""
    sc = parse_scenario(data)
    cfg = sc.config
    bound = 2 * cfg.preemption_grace + cfg.min_runtime + 5 * cfg.cycle
    since: dict[str, float] = {}
    late: list[str] = []
    judge: list[Entitlement] = []

    events_seen = [0]

    def entitled_(sw) -> bool:
        return any(j(sw) for j in judge)

    def watch(engine: Engine, rec) -> None:
        if not judge:
            judge.extend([Entitlement(engine, p) for p in engine.pools] if engine.pooled else [Entitlement(engine)])
        for j in judge:
            j.refresh()
        t = rec.t
        if len(engine.node_log) != events_seen[0]:  # a node event changes supply: every clock restarts
            events_seen[0] = len(engine.node_log)
            since.clear()
        for name, t0 in list(since.items()):
            sw = engine.by_name[name]
            entitled = sw.state == "pending" and entitled_(sw)
            if sw.state != "pending" or not entitled or t - t0 > bound:
                if t - t0 > bound:
                    late.append(f"{name} entitled from t={t0:g}, "
                                f"{'started' if sw.state != 'pending' else 'still pending'} at t={t:g} "
                                f"(bound {bound:g}s): {sw.pending}")
                del since[name]
        for sw in engine._active.values():
            if sw.state == "pending" and sw.name not in since and entitled_(sw):
                since[sw.name] = t

    report = simulate(sc, seed=seed, on_cycle=watch)
    return late, report


def dump(kind: str, data: dict, seed: int, found: list[str]) -> None:
    """With GUARANTEE_DUMP set, keep a counterexample as a scenario file (with the seed and what
    failed in its header) to replay with ``gpupool simulate`` or turn into a regression scenario:
    a random hunt's examples cannot be regenerated, and pytest truncates them."""
    if not DUMP or not found:
        return
    import hashlib

    import yaml

    text = yaml.safe_dump(data, sort_keys=False)
    path = Path(DUMP) / f"{kind}-{hashlib.sha1(text.encode()).hexdigest()[:10]}-seed{seed}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"# {line}\n" for line in found[:5]) + text)


@_settings(N)
@given(scenarios(), st.integers(0, 2))
def test_entitled_workloads_start_within_two_grace_periods(data, seed):
    late, report = liveness_failures(data, seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    dump("liveness", data, seed, late)
    assert not late, late


@_settings(N)
@given(scenarios(), st.integers(0, 2))
def test_no_workload_preempted_twice_without_a_change_of_demand(data, seed):
    report = simulate(parse_scenario(data), seed=seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    bad = thrash(report)
    dump("stability", data, seed, bad)
    assert not bad, bad


def late_evictions(data: dict, settle: float, seed: int = 0) -> list[str]:
    out: list[str] = []

    def watch(engine: Engine, rec) -> None:
        if rec.t >= settle:
            out.extend(f"t={rec.t:g}: evict {e.workload} ({e.cause}: {e.reason})" for e in rec.result.evictions)

    simulate(parse_scenario(data), seed=seed, on_cycle=watch)
    return out


@_settings(N)
@given(scenarios(steady=True), st.integers(0, 2))
def test_steady_state_makes_no_preemptions(case, seed):
    data, settle = case
    bad = late_evictions(data, settle, seed)
    dump("steady", data, seed, bad)
    assert not bad, bad


# -- the same properties with over-committed quotas and node events -------------------------------
# Separate tests, so that the original generator's fixed examples stay as they were:
#   pytest tests/scheduler/test_guarantee_properties.py -k "not extended"   # the original generator
#   pytest tests/scheduler/test_guarantee_properties.py -k extended         # over-commit and node events
@_settings(N_EXTENDED)
@given(scenarios(extended=True), st.integers(0, 2))
def test_extended_entitled_workloads_start_within_two_grace_periods(data, seed):
    late, report = liveness_failures(data, seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    dump("liveness", data, seed, late)
    assert not late, late


@_settings(N_EXTENDED)
@given(scenarios(extended=True), st.integers(0, 2))
def test_extended_no_workload_preempted_twice_without_a_change_of_demand(data, seed):
    report = simulate(parse_scenario(data), seed=seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    bad = thrash(report)
    dump("stability", data, seed, bad)
    assert not bad, bad


@_settings(N_EXTENDED)
@given(scenarios(steady=True, extended=True), st.integers(0, 2))
def test_extended_steady_state_makes_no_preemptions(case, seed):
    data, settle = case
    bad = late_evictions(data, settle, seed)
    dump("steady", data, seed, bad)
    assert not bad, bad


# -- the same properties with node pools and fairness over time -----------------------------------
#   pytest tests/scheduler/test_guarantee_properties.py -k pooled
# Liveness is judged per pool (a workload is entitled when it is in one of the pools it may use,
# by that pool's quotas, nodes and holders); steady state without fairness over time, which by
# design moves shares (and so GPUs) as usage ages.
@_settings(N_POOLED)
@given(scenarios(pooled=True), st.integers(0, 2))
def test_pooled_entitled_workloads_start_within_two_grace_periods(data, seed):
    late, report = liveness_failures(data, seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    dump("liveness", data, seed, late)
    assert not late, late


@_settings(N_POOLED)
@given(scenarios(pooled=True), st.integers(0, 2))
def test_pooled_no_workload_preempted_twice_without_a_change_of_demand(data, seed):
    report = simulate(parse_scenario(data), seed=seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    bad = thrash(report)
    dump("stability", data, seed, bad)
    assert not bad, bad


@_settings(N_POOLED)
@given(scenarios(steady=True, pooled=True), st.integers(0, 2))
def test_pooled_steady_state_makes_no_preemptions(case, seed):
    data, settle = case
    bad = late_evictions(data, settle, seed)
    dump("steady", data, seed, bad)
    assert not bad, bad


# -- three levels; node pools with over-commit and node events -----------------------------------
# Liveness and stability judged on one replay each (the liveness replay's report is the one the
# stability judge reads).
MIXED = st.one_of(scenarios(extended=True, deep=True), scenarios(extended=True, pooled=True))
MIXED_STEADY = st.one_of(scenarios(steady=True, extended=True, deep=True),
                         scenarios(steady=True, extended=True, pooled=True))


@_settings(N_MIXED)
@given(MIXED, st.integers(0, 2))
def test_mixed_entitled_workloads_start_in_time_and_none_is_preempted_twice(data, seed):
    late, report = liveness_failures(data, seed)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    bad = thrash(report)
    for kind, found in (("liveness", late), ("stability", bad)):
        dump(kind, data, seed, found)
    assert not late and not bad, late + bad


@_settings(N_MIXED)
@given(MIXED_STEADY, st.integers(0, 2))
def test_mixed_steady_state_makes_no_preemptions(case, seed):
    bad = late_evictions(case[0], case[1], seed)
    dump("steady", case[0], seed, bad)
    assert not bad, bad


# -- regression scenarios (counterexamples and the issue's failures) ------------------------------
def scenario_data(name: str) -> dict:
    import yaml

    return yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())


def test_entitlement_check_sees_a_starved_gang_and_not_a_fragmented_node():
    """The liveness check itself: alone, the gang of issue 8 failure 2 starts at once (the
    regression test below checks it against the small borrowers), and calls nothing entitled when the reclaimer's room is
    held by a queue within its deserved quota."""
    data = scenario_data("regress_issue2_gang_starved")
    data["workloads"] = [w for w in data["workloads"] if w["name"] == "gang"]  # nobody competes
    late, report = liveness_failures(data)
    assert not late and next(w for w in report["workloads"] if w["name"] == "gang")["started"] == 12
    blocked = {"config": {"cycle": 1, "preemption_grace": 10, "until": 100},
               "cluster": {"nodes": [{"name": "n0", "gpus": 4}, {"name": "n1", "gpus": 4}]},
               "queues": [{"name": "a", "deserved": {"gpu": 4}}, {"name": "b", "deserved": {"gpu": 4}}],
               "workloads": [{"name": "b0", "queue": "b", "gpus": 1, "duration": 1000, "node_selector": {"name": "n0"}},
                             {"name": "b1", "queue": "b", "gpus": 1, "duration": 1000, "node_selector": {"name": "n1"}},
                             {"name": "a4", "queue": "a", "gpus": 4, "duration": 100, "submit_at": 5}]}
    late, report = liveness_failures(blocked)  # b is within its deserved 4: a4 is legitimately blocked
    assert not late and next(w for w in report["workloads"] if w["name"] == "a4")["started"] is None


def test_regress_issue2_guaranteed_gang_not_starved_by_small_borrowers():
    late, report = liveness_failures(scenario_data("regress_issue2_gang_starved"))
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_no_endless_reclaim_when_the_reclaimer_is_fragmented():
    report = simulate(parse_scenario(scenario_data("regress_endless_reclaim_fragmented")))
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_no_priority_ping_pong():
    report = simulate(parse_scenario(scenario_data("regress_priority_ping_pong")))
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_reclaim_takes_a_queues_lowest_priorities_first():
    data = scenario_data("regress_reclaim_lowest_priority_first")
    report = simulate(parse_scenario(data), seed=1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)
    assert not late_evictions(data, settle=120, seed=1)


def test_regress_a_whole_gang_reclaimed_past_a_guarantee_is_not_reclaimed_back():
    """Found by the extended generator (over-committed quotas: 10 GPUs deserved on 8). q0, below
    its shrunk share of 2.4, reclaims room for a 3-GPU gang (larger than the gap: allowed once, as
    q0 is below its guarantee) and ends 0.85 above its guarantee; p2, below its own share, takes
    the whole gang back by the guarantee rule (q0 holds more than its guarantee before the gang
    goes), which drops q0 to 0.25, below its guarantee, and q0 reclaims again: every 100 s, for
    ever. The second reclaim was the fair-share rule taking p2's department below its guarantee
    for q0, which borrowed beyond its own: that rule now keeps a side's guarantee unless the
    reclaimer's side ends within its own."""
    assert not late_evictions(scenario_data("regress_whole_gang_overshoot_ping_pong"), settle=900)


def test_regress_no_reclaim_of_a_higher_priority_workload_while_a_lower_one_holds_a_reservation():
    """The closer-to-fair rule takes a queue's lowest priorities first; a lower-priority workload
    about to start on a reservation counts as running (else the reclaimed one, pending again,
    preempts it once it starts, and its queue reclaims again, every 60 s)."""
    data = scenario_data("regress_reclaim_while_a_lower_priority_one_holds_a_reservation")
    assert not late_evictions(data, settle=600, seed=0)


def test_regress_no_reclaim_of_a_higher_priority_workload_while_a_lower_one_binds():
    """The same for a lower-priority workload bound by allocate earlier in the same cycle."""
    data = scenario_data("regress_reclaim_while_a_lower_priority_one_binds_in_the_cycle")
    assert not late_evictions(data, settle=800, seed=1)


def test_regress_the_guarantee_rule_takes_no_gang_that_comes_back():
    """The guarantee rule took a 6-GPU gang that checkpoints (no work lost) for 0.25 GPU from a
    queue 0.25 above its guarantee; the gang came back by preempting its queue's lower-priority
    0.25-GPU workload and reclaiming the rest by the same rule, every 2 s. A whole victim that
    could come back so is no longer taken past what the reclaimer lacks."""
    data = scenario_data("regress_guarantee_rule_takes_a_gang_that_comes_back")
    assert not late_evictions(data, settle=550, seed=0)


def test_regress_three_queues_do_not_reclaim_in_a_cycle():
    """A steady state where p2 reclaimed from p1 and q0, p1 took q0's gang whole by the guarantee
    rule, and q0 took p2's job by the fair-share rule, every 15 s (the scenario's header)."""
    assert not late_evictions(scenario_data("regress_three_queue_reclaim_cycle"), settle=430, seed=1)


def test_regress_steady_state_without_priority_preemptions():
    assert not late_evictions(scenario_data("regress_steady_priority_preemption"), settle=200)


def test_regress_no_second_eviction_after_consolidation():
    """Consolidation evicted w1 for a borrower in the cycle where its queue's notebook finished;
    three seconds later priority preemption in w1's own queue evicted it again. A workload that a
    waiting higher-priority workload of its queue may preempt is no longer moved."""
    report = simulate(parse_scenario(scenario_data("regress_consolidation_then_priority")), seed=1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_guaranteed_workload_is_not_moved_twice_for_a_loan():
    """Consolidation moved w3 (within its queue's deserved quota) for a notebook, then three
    seconds later again for another queue's borrower. A borrower is consolidated for only by
    moving workloads that run on a loan too."""
    report = simulate(parse_scenario(scenario_data("regress_consolidation_moves_twice")), seed=0)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_settled_reservation_never_holds_again():
    """A bound holder's reservation marker came back as a live reservation once the holder was
    preempted, so it re-bound and was preempted twice in 3 s."""
    report = simulate(parse_scenario(scenario_data("regress_marker_revived")), seed=1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_lower_priority_workload_waits_for_its_queues_preemptor():
    """A low-priority workload bound into half a GPU while a higher-priority one of its queue did
    not fit, and was preempted by it in the next cycle."""
    report = simulate(parse_scenario(scenario_data("regress_low_priority_binds_before_preemptor")), seed=0)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_borrowing_queue_does_not_swap_by_priority_while_reclaimed():
    report = simulate(parse_scenario(scenario_data("regress_priority_swap_under_reclaim")), seed=1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_lower_priorities_wait_only_for_a_preemption_that_can_happen():
    late, report = liveness_failures(scenario_data("regress_behind_without_preemption"), 0)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_idle_gpus_lent_between_two_reclaims():
    """Idle GPUs lent to a borrower between two reclaims by different queues: with grace 0 and
    min_runtime 0 the borrower may be evicted again in the next cycle (the issue's window is
    grace + min_runtime); with any protection it is not (checked with min_runtime 10)."""
    data = scenario_data("regress_lend_between_reclaims")
    for min_runtime in (0, 10):
        data["config"]["min_runtime"] = min_runtime
        report = simulate(parse_scenario(data), seed=2)
        assert report["metrics"]["invariant_violations"] == 0
        assert not thrash(report), thrash(report)


def test_regress_no_consolidation_for_a_borrower_while_a_reclaim_is_due():
    report = simulate(parse_scenario(scenario_data("regress_consolidation_then_reclaim")), seed=1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)


def test_regress_a_resumed_workload_keeps_its_min_runtime_and_no_more():
    """w13 (priority 10) was preempted at 1100 for its queue's interactive gang, resumed at 1130
    (the grace period's end) into a quarter GPU its queue's higher-priority w17 could not use, and
    was preempted again at 1150, when its min_runtime of 20 s ended, by w17's plan (itself plus a
    reclaim). That is the promise's edge (it ran exactly min_runtime), not inside it; the check
    judges the window strictly, and this scenario pins the edge."""
    data = scenario_data("regress_resumed_then_preempted_at_min_runtime")
    report = simulate(parse_scenario(data), seed=2)
    assert report["metrics"]["invariant_violations"] == 0
    assert not thrash(report), thrash(report)
    pre = [e for e in report["events"] if e["type"] == "preempt" and e["workload"] == "w13"]
    window = data["config"]["preemption_grace"] + data["config"]["min_runtime"]
    gaps = [b["signalled_at"] - a["signalled_at"] for a, b in zip(pre, pre[1:])]
    assert all(g >= window for g in gaps), gaps


def test_regress_reclaiming_workload_starts_within_the_bound():
    late, report = liveness_failures(scenario_data("regress_reclaiming_gang_late"), 1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_an_entitled_workload_takes_a_whole_gang_that_borrows():
    """The guarantee rule takes a whole 8-GPU gang from a queue guaranteed 4 for a 2-GPU
    workload that its queue is guaranteed: the gang's queue lacks more afterwards than the
    reclaimer did, but its gang never fitted its guarantee."""
    late, report = liveness_failures(scenario_data("regress_entitled_gang_behind_an_eight_gpu_borrower"), 1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_an_entitled_workload_does_not_wait_behind_a_long_reservation():
    """An entitled workload waited 90 s (bound 85 s) while 8 GPUs of the free capacity were held
    for a reclaimer that could never bind: other work of its queue had started meanwhile, and its
    queue's limit left no room. Such a reservation is now dropped at the next cycle."""
    late, report = liveness_failures(scenario_data("regress_entitled_workload_waits_behind_a_long_reservation"), 2)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


@pytest.mark.parametrize("name, seed", [
    ("regress_shrunk_overcommitted_quotas", 2),  # no node event: quotas over-commit one node
    ("regress_shrunk_after_drain", 2),  # a drain halves the cluster under quotas that fit it
    ("regress_shrunk_after_failures", 2),  # a failure and a drain leave a third of the GPUs
    ("regress_shrunk_gang_after_drain", 2),  # a gang of the starved queue
    ("regress_shrunk_project_reclaims", 1),  # the reclaimer is a project; the holders top-level queues
])
def test_regress_a_queue_below_its_shrunk_share_reclaims_up_to_it(name, seed):
    late, report = liveness_failures(scenario_data(name), seed)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_shrunk_shares_divide_an_overcommitted_level_in_proportion():
    """The judge's guarantee: the scheduling doc's over-committed example (4 GPUs; vision deserves
    4, nlp 2) and a department whose guarantee shrinks at the top level."""
    from gpupool.scheduler.model import QueueSpec

    def tree(*qs):
        queues = {q.name: q for q in qs}
        children: dict = {}
        for q in qs:
            children.setdefault(q.parent, []).append(q.name)
        return queues, children

    queues, children = tree(QueueSpec("vision", deserved={"gpu": 4}), QueueSpec("nlp", deserved={"gpu": 2}))
    got = shrunk_shares(queues, children, {"vision": 10, "nlp": 10}, 4)
    assert got == pytest.approx({"vision": 8 / 3, "nlp": 4 / 3})
    assert shrunk_shares(queues, children, {"vision": 10, "nlp": 10}, 8) == {"vision": 4, "nlp": 2}
    assert shrunk_shares(queues, children, {"vision": 1, "nlp": 10}, 8) == {"vision": 1, "nlp": 2}  # demand caps
    queues, children = tree(QueueSpec("d", deserved={"gpu": 6}), QueueSpec("a", parent="d", deserved={"gpu": 4}),
                            QueueSpec("b", parent="d", deserved={"gpu": 2}), QueueSpec("q", deserved={"gpu": 6}))
    got = shrunk_shares(queues, children, {"d": 20, "a": 10, "b": 10, "q": 20}, 6)  # half the cluster is gone
    assert got == pytest.approx({"d": 3, "a": 2, "b": 1, "q": 3})


def test_extended_generator_draws_overcommit_and_node_events_and_the_original_does_not():
    def overcommitted(d):
        cap = sum(n["gpus"] for n in d["cluster"]["nodes"])
        return sum(q["deserved"]["gpu"] for q in d["queues"] if "parent" not in q) > cap

    seen: list[tuple[bool, set]] = []

    @_settings(30)
    @given(scenarios(extended=True))
    def extended(d):
        seen.append((overcommitted(d), {e["action"] for e in d["cluster"].get("events", [])}))

    @_settings(30)
    @given(scenarios())
    def original(d):
        assert not overcommitted(d) and "events" not in d["cluster"]

    extended()
    original()
    if RANDOM:  # (a hunt's new stream of 30 draws: the shares below hold for CI's fixed one)
        return
    assert 5 <= sum(o for o, _ in seen) <= 25  # about half over-commit
    assert set().union(*(a for _, a in seen)) == {"fail", "drain", "return"}


def test_deep_generator_draws_three_levels_that_parse():
    """The deep generator puts the department and q0 under an organisation deserving at least
    what they do, adds a third project some of the time, and every tree it draws is accepted."""
    seen: list[set] = []

    @_settings(30)
    @given(scenarios(extended=True, deep=True))
    def deep(d):
        by = {q["name"]: q for q in d["queues"]}
        assert by["dept"]["parent"] == by["q0"]["parent"] == "org" and "parent" not in by["org"]
        assert by["org"]["deserved"]["gpu"] >= by["dept"]["deserved"]["gpu"] + by["q0"]["deserved"]["gpu"]
        assert {w["queue"] for w in d["workloads"]} <= set(by) - {"org", "dept"}
        parse_scenario(d)
        seen.append(set(by))

    deep()
    if RANDOM:  # (a hunt's new stream, perhaps of more draws: the share below holds for CI's fixed one)
        return
    assert 3 <= sum("p3" in names for names in seen) <= 27  # about half


def test_regress_a_dropped_reservation_is_followed_by_a_cycle():
    """A cycle that dropped a reservation (its workload pinned to a node pool by it) bound and
    evicted nothing, so the simulator waited for the next event (95 s) instead of running the next
    cycle, which tries the workload in its other pool, where it fits at once."""
    late, report = liveness_failures(scenario_data("regress_dropped_reservation_unpins_a_pooled_workload"), 0)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_a_pooled_reclaimer_binds_once_its_victims_are_gone():
    """Node pools: a workload that falls back to its second pool (round 1 of a cycle) bound into
    the idle room of a reclaim planned in that pool in round 0; the reservation then found its
    room gone, the reclaim evicted the newcomer, the first victim came back into the idle half,
    and so on every cycle: the entitled reclaimer (w22, grace 0) never bound. Round 1 now holds
    round 0's reservations in the now view, as the next cycle's intake does."""
    late, report = liveness_failures(scenario_data("regress_pooled_reclaimer_never_binds"), 1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late
    assert not thrash(report), thrash(report)


def test_regress_reclaims_at_two_levels_do_not_turn_in_a_circle():
    """Three queues at two levels moved a quarter and a half GPU around for ever, each move bringing
    its own level closer to fair: q0 took from p2 (below its share inside dept) because dept was
    above its share, p2 took back from p1 inside dept, p1 took from q0. The closer-to-fair rule now
    leaves no queue inside a side further from its own share."""
    data = scenario_data("regress_three_way_reclaim_circle")
    settle = 520 + 6 * 30 + 30 * 5  # the generator's: the last arrival, six grace periods, 30 cycles
    bad = late_evictions(data, settle, 0)
    assert not bad, bad
    late, report = liveness_failures(data, 0)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_combined_preemptions_do_not_take_each_other_back():
    """Node pools: two queues' higher-priority workloads each preempted their own queue's lower
    priorities and reclaimed the other's workload in one plan (``preempt._combined``), every 7 s
    after all demand had arrived. The own victims were preempted only to make quota room; they
    came straight back as borrowers, and the side that lost its workload lacked exactly what the
    other had lacked. A combined plan now measures its side with its own victims held, and leaves
    a victim whose side would end just as far below its guarantee."""
    data = scenario_data("regress_combined_preemption_back_and_forth")
    settle = 500 + 6 * 6 + 30 * 1  # the generator's: the last arrival, six grace periods, 30 cycles
    bad = late_evictions(data, settle, 2)
    assert not bad, bad[:6]
    late, report = liveness_failures(data, 2)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late


def test_regress_an_entitled_gang_reclaims_whole_gpus_past_fractional_victims():
    """Found by the extended generator on a fresh random stream (node failure, over-committed
    quotas). When q0's 2-GPU workload ends, p1's borrowers start on the freed GPUs in the same
    cycle while q0's entitled 3-GPU gang waits. No GPU is wholly free; taking the two borrowers
    and one quarter-GPU victim would free three and leave dept above its guarantee, but every pass
    of the search first takes fractional victims that free no whole GPU (they share GPUs with
    workloads that stay) and is refused at dept's guarantee. The gang started 245 s after it
    became entitled, the bound being 105 s. A search that plans nothing for whole GPUs after
    refusals now makes one more pass over only the victims on GPUs they can free whole
    (``plan._whole_gpus_only``)."""
    late, report = liveness_failures(scenario_data("regress_entitled_gang_behind_fractional_victims"), 1)
    assert report["metrics"]["invariant_violations"] == 0
    assert not late, late
