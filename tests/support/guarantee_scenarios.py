"""The guarantee properties' random scenarios (tests/scheduler/test_guarantee_properties.py, whose
docstring describes them and the knobs), shared with tests/scheduler/test_scheduler_shortcuts.py;
and ``thrash``, the stability property's judge, shared with tests/scheduler/test_shrinkage.py.

The generator's draws are exactly those it had as part of the test module, so CI's fixed examples
stay the same. Derandomized Hypothesis seeds each test from a hash of its own source, decorators
included: the test modules keep writing ``@_settings(N)`` (``example_settings`` imported under that
name) and ``@given(scenarios(...), ...)``, so a change to a decorator line moves its examples.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from gpupool.scheduler.spec import SpecError, parse_queues

EPS = 1e-6
SHRINK = os.environ.get("GUARANTEE_SHRINK") == "1"  # shrinking a long scenario takes minutes: opt in
RANDOM = os.environ.get("GUARANTEE_RANDOM") == "1"  # hunt beyond CI's fixed examples: a new stream each run


def _departments_may_overcommit() -> bool:
    """Whether the configuration accepts projects that deserve more than their department (the
    extended generator draws such trees only then; otherwise its departments are over-committed
    only by a shrinking top level)."""
    try:
        parse_queues([{"name": "d", "deserved": {"gpu": 1}}, {"name": "p", "parent": "d", "deserved": {"gpu": 2}}])
    except SpecError:
        return False
    return True


DEPT_OVERCOMMIT = _departments_may_overcommit()


def _pin_local_constants() -> None:
    """Keep CI's fixed stream fixed. Hypothesis (6.131 on) also draws, now and then, literals it
    finds in the project's loaded modules (not the tests'); which modules are loaded depends on the
    test files collected, and any literal added to the code joins the pool, so a derandomized
    test drew other examples when other files were collected or the code grew. The stream draws
    from Hypothesis's own constants only. The hook is Hypothesis's internal one: where it is
    missing (an older or a reworked Hypothesis) there is nothing to pin, and the property tests
    still run, only without that guarantee."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover
        return
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "_local_constants"):
        return  # pragma: no cover
    empty = type(providers._local_constants)()
    providers._get_local_constants = lambda: empty
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if cache is not None and hasattr(cache, "cache"):
        cache.cache.clear()  # permitted constants computed before the pin


if not RANDOM:
    _pin_local_constants()


def example_settings(n: int):
    """Hypothesis settings of a property with ``n`` examples: CI's fixed stream (derandomized: the
    seed is a hash of the test's source, its decorators included; the project's own literals left
    out, see ``_pin_local_constants``) unless GUARANTEE_RANDOM=1; shrinking only with
    GUARANTEE_SHRINK=1."""
    phases = tuple(Phase) if SHRINK else (Phase.explicit, Phase.reuse, Phase.generate)
    return settings(max_examples=n, deadline=None, derandomize=not RANDOM, database=None, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- scenarios -----------------------------------------------------------------------------------
@st.composite
def scenarios(draw, *, steady: bool = False, extended: bool = False, pooled: bool = False, deep: bool = False):
    """A random scenario (see the module docstring); ``extended`` adds over-committed quotas and
    node events; ``pooled`` node pools (and, unless ``steady``, fairness over time); ``deep`` a
    third level of queues (``_deepen``; not with ``pooled``). With all three False the draws are
    exactly those of the original generator, so CI's fixed examples stay the same."""
    assert not (deep and pooled), "the pooled quotas are drawn for the two-level tree"
    cycle = draw(st.sampled_from([1, 5]))
    grace = cycle * draw(st.sampled_from([0, 2, 6]))
    min_runtime = cycle * draw(st.sampled_from([0, 0, 4]))
    nodes, capacity = [], 0
    for i in range(draw(st.integers(2, 4))):
        g = draw(st.sampled_from([2, 4, 4]))
        nodes.append({"name": f"n{i}", "gpus": g, "gpu_memory": "40Gi", "labels": {"rack": f"r{i % 2}"}})
        capacity += g

    queues, left = [], capacity
    over_top = extended and draw(st.booleans())  # top-level quotas add up to more than the cluster
    over_dept = extended and DEPT_OVERCOMMIT and draw(st.booleans())  # projects more than their department
    dept = draw(st.integers(0, capacity if over_top else left))
    left -= dept
    if over_dept:
        a = draw(st.integers(0, dept + 2))
        b = draw(st.integers(max(0, dept - a + 1), dept + 3))
    else:
        a = draw(st.integers(0, dept))
        b = draw(st.integers(0, dept - a))
    queues.append({"name": "dept", "deserved": {"gpu": dept}})
    queues.append({"name": "p1", "parent": "dept", "deserved": {"gpu": a}})
    queues.append({"name": "p2", "parent": "dept", "deserved": {"gpu": b},
                   "over_quota_weight": draw(st.sampled_from([1, 2]))})
    tops = draw(st.integers(1, 2))
    for i in range(tops):
        if over_top:
            d = draw(st.integers(0, capacity))
            if i == tops - 1 and left - d >= 0:  # make sure the level over-commits
                d = left + draw(st.integers(1, 4))
        else:
            d = left if i == tops - 1 and draw(st.booleans()) else draw(st.integers(0, left))
        left -= d
        queues.append({"name": f"q{i}", "deserved": {"gpu": d}, "over_quota_weight": draw(st.sampled_from([1, 2])),
                       "priority": draw(st.sampled_from([0, 0, 1]))})
    for q in queues:
        if draw(st.integers(0, 3)) == 0:
            q["limit"] = {"gpu": q["deserved"]["gpu"] + draw(st.integers(0, 4))}
    if "limit" in queues[0]:  # a department's limit never below its projects' deserved
        queues[0]["limit"]["gpu"] = max(queues[0]["limit"]["gpu"], a + b)
    if deep:
        _deepen(draw, queues, capacity)
    leaves = [q["name"] for q in queues if q["name"] not in ("dept", "org")]

    span = draw(st.integers(20, 120)) * 5  # arrivals keep coming over this many seconds
    workloads = []
    for i in range(draw(st.integers(8, 28))):
        kind = draw(st.sampled_from(["train", "train", "hpo-trial", "interactive", "inference"]))
        w = {"name": f"w{i}", "queue": draw(st.sampled_from(leaves)), "kind": kind,
             "submit_at": cycle * (draw(st.integers(0, span)) // cycle),
             "duration": 100000 if steady else cycle * draw(st.integers(20, 300))}
        shape = draw(st.sampled_from(["whole", "whole", "fraction", "memory", "gang"]))
        if shape == "whole":
            w["gpus"] = draw(st.sampled_from([1, 1, 2, 4]))
        elif shape == "fraction":
            w["gpus"] = draw(st.sampled_from([0.25, 0.5]))
        elif shape == "memory":
            w["gpu_memory"] = draw(st.sampled_from(["10Gi", "20Gi"]))
        else:
            w["gpus"] = draw(st.sampled_from([1, 1, 2, 0.5]))
            w["pods"] = draw(st.integers(2, 4))
        if kind in ("train", "hpo-trial"):
            if draw(st.booleans()):
                w["checkpoint_every"] = cycle * draw(st.sampled_from([5, 20]))
            w["checkpoint_on_signal"] = draw(st.booleans())
        if draw(st.integers(0, 3)) == 0:
            w["priority"] = draw(st.sampled_from([10, 50, 90]))
        workloads.append(w)
    last = max(w["submit_at"] for w in workloads)
    cluster: dict = {"nodes": nodes}
    if extended:
        events = []
        for _ in range(draw(st.integers(0, 3))):
            node = draw(st.sampled_from(nodes))["name"]
            t = cycle * (draw(st.integers(0, span)) // cycle)
            events.append({"t": t, "node": node, "action": draw(st.sampled_from(["fail", "fail", "drain"]))})
            if draw(st.booleans()):
                events.append({"t": t + cycle * draw(st.integers(1, 60)), "node": node, "action": "return"})
        if events:
            cluster["events"] = sorted(events, key=lambda e: e["t"])
            last = max(last, max(e["t"] for e in events))  # the last change of supply counts like an arrival
    if pooled:
        _poolify(draw, nodes, queues, workloads, cycle)
    round_ = grace + min_runtime
    settle = last + 6 * round_ + 30 * cycle
    until = settle + 4 * round_ + 60 * cycle if steady else last + 900
    config = {"cycle": cycle, "preemption_grace": grace, "min_runtime": min_runtime, "until": until}
    if pooled and not steady and draw(st.booleans()):  # fairness over time moves shares as time passes
        config["fairness"] = {"window": cycle * draw(st.sampled_from([50, 200, 600])),
                              "window_type": draw(st.sampled_from(["sliding", "sliding", "tumbling"])),
                              "k": draw(st.sampled_from([0.5, 1.0, 2.0]))}
        if draw(st.booleans()):
            config["fairness"]["half_life"] = config["fairness"]["window"] / 2
    data = {"name": "random", "config": config, "cluster": cluster, "queues": queues,
            "workloads": workloads}
    return (data, settle) if steady else data


def _deepen(draw, queues: list[dict], capacity: int) -> None:
    """Three levels: an organisation ``org`` over the department and ``q0``, deserving at least
    what they deserve together (up to what the top level leaves over), sometimes with a weight or
    a limit of its own (never below its children's deserved); and, half the time, a third project
    ``p3`` in the department with what its other projects leave of it. Queues that reclaim from
    one another then meet at the top, inside ``org`` and inside ``dept``."""
    by = {q["name"]: q for q in queues}
    dept, q0 = by["dept"], by["q0"]
    spare = max(0, capacity - sum(q["deserved"]["gpu"] for q in queues if q.get("parent") is None))
    inner = dept["deserved"]["gpu"] + q0["deserved"]["gpu"]
    org: dict = {"name": "org", "deserved": {"gpu": inner + draw(st.integers(0, spare))},
                 "over_quota_weight": draw(st.sampled_from([1, 2]))}
    if draw(st.integers(0, 3)) == 0:
        org["limit"] = {"gpu": org["deserved"]["gpu"] + draw(st.integers(0, 4))}
    dept["parent"] = q0["parent"] = "org"
    queues.insert(0, org)
    if draw(st.booleans()):
        projects = sum(q["deserved"]["gpu"] for q in queues if q.get("parent") == "dept")
        queues.append({"name": "p3", "parent": "dept",
                       "deserved": {"gpu": draw(st.integers(0, max(0, dept["deserved"]["gpu"] - projects)))},
                       "over_quota_weight": draw(st.sampled_from([1, 2]))})
        lim = dept.get("limit")
        if lim is not None:  # a department's limit never below its projects' deserved
            lim["gpu"] = max(lim["gpu"], projects + queues[-1]["deserved"]["gpu"])


def _poolify(draw, nodes: list[dict], queues: list[dict], workloads: list[dict], cycle: int) -> None:
    """Node pools on a drawn scenario: the nodes alternate between pools p0 and p1; every queue's
    quota is drawn per pool as the original quotas are (a level's deserved quotas within what
    that level has), sometimes with a limit or a weight of its own; a workload names its pools
    (one, or both in either order) or none."""
    cap = {"p0": 0, "p1": 0}
    for i, n in enumerate(nodes):
        n["pool"] = f"p{i % 2}"
        cap[n["pool"]] += n["gpus"]
    for q in queues:
        for key in ("deserved", "limit", "over_quota_weight"):
            q.pop(key, None)
        q["pools"] = {}
    by = {q["name"]: q for q in queues}
    for pool, c in cap.items():
        left = c
        dept = draw(st.integers(0, left))
        left -= dept
        a = draw(st.integers(0, dept))
        b = draw(st.integers(0, dept - a))
        quota = {"dept": dept, "p1": a, "p2": b}
        for q in queues:
            if q.get("parent") is None and q["name"] != "dept":
                quota[q["name"]] = draw(st.integers(0, left))
                left -= quota[q["name"]]
        for name, d in quota.items():
            entry = {"deserved": {"gpu": d}}
            if draw(st.integers(0, 3)) == 0:
                entry["limit"] = {"gpu": d + draw(st.integers(0, 4))}
            if draw(st.integers(0, 3)) == 0:
                entry["over_quota_weight"] = draw(st.sampled_from([1, 2]))
            by[name]["pools"][pool] = entry
        dl = by["dept"]["pools"][pool].get("limit")
        if dl is not None:
            dl["gpu"] = max(dl["gpu"], a + b)
    for w in workloads:
        choice = draw(st.sampled_from([None, None, ["p0"], ["p1"], ["p0", "p1"], ["p1", "p0"]]))
        if choice:
            w["pools"] = choice


# -- stability -----------------------------------------------------------------------------------
NODE_CAUSES = ("node-failure", "drain")


def thrash(report: dict) -> list[str]:
    """Workloads preempted twice within grace + min_runtime (the issue's window, between the two
    eviction decisions) with no change of demand or supply in between. A stop caused by a node
    event is not the scheduler's and does not count (unless it cut short the scheduler's own
    eviction: ``interrupted``); a node event counts as a change."""
    cfg = report["config"]
    window = cfg["preemption_grace"] + cfg["min_runtime"]
    demand = [e["t"] for e in report["events"] if e["type"] == "finish"]
    submits = sorted(w["submitted"] for w in report["workloads"])
    supply = [e["t"] for e in report.get("node_events", [])]
    changes = sorted(demand + submits + supply)
    out = []
    by: dict[str, list[dict]] = {}
    for e in report["events"]:
        if e["type"] == "preempt" and (e["reason"] not in NODE_CAUSES or e.get("interrupted") not in (None, *NODE_CAUSES)):
            by.setdefault(e["workload"], []).append(e)
    for name, pre in by.items():
        for a, b in zip(pre, pre[1:]):
            s1, s2 = a["signalled_at"], b["signalled_at"]
            # strictly within: a workload that resumed runs *at least* min_runtime after its grace
            # period, so a second signal exactly grace + min_runtime after the first keeps the
            # promise (regress_resumed_then_preempted_at_min_runtime.yaml)
            if s2 - s1 < window - EPS or (window == 0 and s2 == s1):
                if not any(s1 < c <= s2 + EPS for c in changes):
                    out.append(f"{name}: released at t={a['t']:g} and t={b['t']:g} (signalled {s1:g}, {s2:g}; "
                               f"reasons {a['reason']}, {b['reason']}); no submission or finish in between")
    return out
