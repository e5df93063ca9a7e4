"""Regression cases for the guarantee failures of issue 8, at the core's interface: a snapshot in,
decisions out, with a minimal adapter between cycles (binds run, evictions release when told,
reservations are handed back)."""
from __future__ import annotations

from gpupool.scheduler import NodeSpec, Phase, PodPlacement, QueueSpec, Scheduler, Snapshot, Workload
from gpupool.scheduler.cycle import Cycle
from gpupool.scheduler.model import SchedulerConfig
from gpupool.scheduler.plan import Budget, plan
from gpupool.scheduler.reasons import Cause, Code


def running(w: Workload, node: str, gpus, started=0.0, fraction=1.0, pods=None) -> Workload:
    w.phase = Phase.RUNNING
    w.placements = pods or (PodPlacement(0, node, tuple(gpus), fraction),)
    w.started_at = started
    w.checkpoint_on_signal = True
    return w


class World:
    """The adapter: carries out binds and evictions and hands reservations back."""

    def __init__(self, nodes, queues, workloads, cfg=None):
        self.nodes, self.queues, self.workloads = nodes, queues, list(workloads)
        self.sched = Scheduler(cfg or SchedulerConfig())
        self.reservations = []
        self.t = 0.0

    def by(self, wid: str) -> Workload:
        return next(w for w in self.workloads if w.id == wid)

    def cycle(self, t: float):
        self.t = t
        r = self.sched.schedule(Snapshot(t, self.nodes, self.queues, self.workloads, self.reservations))
        self.reservations = r.reservations
        for e in r.evictions:
            self.by(e.workload).phase = Phase.RELEASING
        for b in r.binds:
            w = self.by(b.workload)
            w.phase, w.placements, w.started_at = Phase.RUNNING, b.placements, t
        return r

    def release(self, wid: str) -> None:
        w = self.by(wid)
        w.phase, w.placements, w.started_at = Phase.PENDING, (), None

    def settle(self, t0: float, cycles: int) -> list[str]:
        """Run ``cycles`` cycles a second apart from ``t0``, each victim released at once; the
        evictions made, as ``t=T workload (cause)``."""
        out = []
        for i in range(cycles):
            for e in self.cycle(t0 + i).evictions:
                out.append(f"t={t0 + i:g} {e.workload} ({e.cause})")
                self.release(e.workload)
        return out


def test_reclaimed_capacity_is_held_while_victims_release():
    """Issues 8.2 and 8.5: what a reclaim frees, and what is idle, is held for the reclaimer: a
    newcomer of the borrowing queue neither takes it in the lending pass nor forces a second
    reclaim, and the first victim cannot re-bind on its own GPUs."""
    qs = [QueueSpec("own", deserved={"gpu": 4}), QueueSpec("bor", deserved={"gpu": 0})]
    bor = [running(Workload(f"b{i}", "bor", gpus=1), "a", [i]) for i in range(4)]
    world = World([NodeSpec("a", 4)], qs, bor + [Workload("o", "own", gpus=2, submit_time=1)])
    r1 = world.cycle(10)
    assert sorted(e.workload for e in r1.evictions) == ["b0", "b1"]
    assert r1.pending["o"].code == Code.RECLAIMING and [x.workload for x in r1.reservations] == ["o"]
    world.release("b1")  # one victim has released; the other is still checkpointing
    world.workloads.append(Workload("new", "bor", gpus=1, submit_time=11))
    r2 = world.cycle(11)
    assert r2.binds == [] and r2.evictions == []
    assert r2.pending["new"].code == Code.RESERVED and r2.pending["b1"].code == Code.RESERVED
    assert r2.pending["o"].code == Code.RECLAIMING
    world.release("b0")
    r3 = world.cycle(12)
    assert [b.workload for b in r3.binds] == ["o"] and r3.evictions == []


def test_whole_node_reclaimer_is_not_overtaken_by_its_victim_gang():
    """Issue 8.1: a borrowing gang evicted for a whole-node workload within its queue's deserved
    quota does not bind again first; the reclaimer starts, and nothing is evicted twice."""
    qs = [QueueSpec("own", deserved={"gpu": 4}), QueueSpec("bor", deserved={"gpu": 0})]
    gang = running(Workload("g", "bor", gpus=2, pods=2), "", [], pods=(
        PodPlacement(0, "a", (0, 1)), PodPlacement(1, "b", (0, 1))))
    world = World([NodeSpec("a", 4), NodeSpec("b", 4)], qs,
                  [gang, Workload("whole", "own", gpus=4, submit_time=1)])
    r1 = world.cycle(10)
    assert r1.pending["whole"].code == Code.RECLAIMING and [e.workload for e in r1.evictions] == ["g"]
    world.release("g")
    evicted = 0
    for t in range(11, 20):
        r = world.cycle(t)
        evicted += len(r.evictions)
    assert world.by("whole").phase == Phase.RUNNING and evicted == 0
    assert world.by("g").phase == Phase.RUNNING  # the gang borrows what is left (the other node)


def test_priority_preemption_works_at_the_queue_limit():
    """Issue 8.4: the preemption frees the headroom the limit withholds."""
    qs = [QueueSpec("q", deserved={"gpu": 4}, limit={"gpu": 4})]
    low = [running(Workload(f"l{i}", "q", gpus=1, priority=10), "a", [i]) for i in range(4)]
    hi = Workload("hi", "q", gpus=2, priority=90, submit_time=1)
    r = Scheduler().schedule(Snapshot(10, [NodeSpec("a", 8)], qs, low + [hi]))
    assert len(r.evictions) == 2 and {e.cause for e in r.evictions} == {Cause.PRIORITY.value}
    assert r.pending["hi"].code == Code.PREEMPTING


def test_consolidation_repacks_fractions_within_a_node():
    """Issue 8.6: two half-GPU workloads on two GPUs of one node are packed onto one GPU so that
    a 1-GPU workload fits."""
    qs = [QueueSpec("q", deserved={"gpu": 2})]
    halves = [running(Workload(f"h{i}", "q", gpus=0.5), "a", [i], fraction=0.5) for i in range(2)]
    world = World([NodeSpec("a", 2)], qs, halves + [Workload("one", "q", gpus=1, submit_time=1)])
    r1 = world.cycle(10)
    assert [(e.workload, e.cause) for e in r1.evictions] == [("h0", Cause.CONSOLIDATION.value)]
    assert r1.pending["one"].code == Code.CONSOLIDATING
    world.release("h0")
    r2 = world.cycle(11)
    assert sorted(b.workload for b in r2.binds) == ["h0", "one"]
    assert world.by("h0").placements[0].gpus == world.by("h1").placements[0].gpus  # packed together


def test_fewest_victims_when_lost_work_ties():
    """Issue 8.7: one whole-GPU victim rather than two fractional ones."""
    qs = [QueueSpec("own", deserved={"gpu": 1}), QueueSpec("bor", deserved={"gpu": 0})]
    fr = [running(Workload(f"f{i}", "bor", gpus=0.5), "a", [0], fraction=0.5) for i in range(2)]
    whole = running(Workload("w", "bor", gpus=1), "b", [0])
    r = Scheduler().schedule(Snapshot(10, [NodeSpec("a", 1), NodeSpec("b", 1)], qs,
                                      fr + [whole, Workload("o", "own", gpus=1, submit_time=1)]))
    assert [e.workload for e in r.evictions] == ["w"]


class _RefuseAfterCheap(Budget):
    """A budget that refuses the gang once the cheap victim was taken (as the guarantee rule does
    when the cheap victim already brought its queue down to its deserved quota)."""

    def __init__(self):
        self.taken = set()

    def reset(self):
        self.taken.clear()

    def allows(self, v):
        return not (v.id == "gang" and "cheap" in self.taken)

    def take(self, v):
        self.taken.add(v.id)


def test_victim_search_tries_another_set_when_the_cheapest_first_is_refused():
    """Issue 8.3: planning does not stop at the first greedy plan its own rule refuses."""
    qs = [QueueSpec("q", deserved={"gpu": 4})]
    cheap = running(Workload("cheap", "q", gpus=1), "a", [0])  # saves on signal: loses nothing
    gang = running(Workload("gang", "q", gpus=2), "a", [1, 2])
    gang.checkpoint_on_signal = False  # loses work: the greedy order takes it last
    big = Workload("big", "q", gpus=4, submit_time=1)
    ctx = Cycle(Snapshot(100, [NodeSpec("a", 4)], qs, [cheap, gang, big]), SchedulerConfig())
    found = plan(ctx, ctx.candidate(big), [cheap, gang], _RefuseAfterCheap())
    assert found is not None and sorted(v.id for v in found[0]) == ["cheap", "gang"]


def test_a_gang_binds_into_its_reservation_only_when_all_its_pods_fit_together():
    """Two pods of a reserved gang on one GPU: each pod's half fitting on its own is not enough."""
    from pathlib import Path

    from gpupool.sim import load_scenario, simulate

    path = Path(__file__).resolve().parents[1] / "scenarios" / "regress_gang_reservation_shared_gpu.yaml"
    for seed in (0, 1, 2):
        report = simulate(load_scenario(path), seed=seed)
        assert report["metrics"]["invariant_violations"] == 0, report.get("violations")


def test_closer_to_fair_leaves_no_queue_inside_a_side_further_from_its_share():
    """dept (p1, p2) holds 2 GPUs against a fair share of 1.75 because p1 holds 1.5 (young, so
    protected); p2 holds 0.5, below its own 0.875. q0, above its guarantee of 1 but below its fair
    share of 2.25, asks for a quarter GPU: the only victims in dept are p2's. Taking one would
    bring dept and q0 closer to fair but open a gap inside dept that p2 would close by taking from
    p1, and p1 from q0 (three queues turning for ever): the reclaim is refused, and says why."""
    from gpupool.scheduler.reasons import describe
    nodes = [NodeSpec("n0", gpus=4, gpu_memory=80 * 2**30)]
    queues = [QueueSpec("dept", deserved={"gpu": 1}), QueueSpec("p1", parent="dept", deserved={"gpu": 0.5}),
              QueueSpec("p2", parent="dept", deserved={"gpu": 0.5}),
              QueueSpec("q0", deserved={"gpu": 1}, over_quota_weight=2)]
    work = [running(Workload("p1-a", "p1", gpus=1), "n0", (0,), started=95.0),
            running(Workload("p1-b", "p1", gpus=0.5), "n0", (1,), started=95.0, fraction=0.5),
            running(Workload("p2-a", "p2", gpus=0.25), "n0", (1,), fraction=0.25),
            running(Workload("p2-b", "p2", gpus=0.25), "n0", (1,), fraction=0.25),
            running(Workload("q0-a", "q0", gpus=1), "n0", (2,)),
            running(Workload("q0-b", "q0", gpus=1), "n0", (3,)),
            Workload("p2-more", "p2", gpus=1, submit_time=1.0),
            Workload("q0-small", "q0", gpus=0.25, submit_time=2.0)]
    result = Scheduler(SchedulerConfig(min_runtime=60)).schedule(Snapshot(now=100.0, nodes=nodes, queues=queues,
                                                                          workloads=work))
    assert result.fair_share["dept"]["gpu"] == 1.75 and result.fair_share["q0"]["gpu"] == 2.25
    assert result.fair_share["p2"]["gpu"] > 0.5
    assert not result.evictions
    why = result.pending["q0-small"]
    assert why.code == Code.RECLAIM_REFUSED
    assert why.detail["rule"] == "inside" and why.detail["below"] == "p2" and why.detail["holder"] == "dept"
    assert "within it to p2" in describe(why)


def _combined_world(b_low: float) -> World:
    """A (deserved 1) runs a low-priority half GPU and asks for one GPU at priority 50; B (deserved
    1) runs a high-priority GPU and a low-priority ``b_low`` away from it; C fills the rest, within
    its own deserved GPU. A whole GPU for A comes only from B's high-priority workload, with A's
    low one preempted."""
    nodes = [NodeSpec("n0", gpus=2, gpu_memory=80 * 2**30), NodeSpec("n1", gpus=1, gpu_memory=80 * 2**30)]
    queues = [QueueSpec(q, deserved={"gpu": 1}) for q in ("A", "B", "C")]
    work = [running(Workload("B-hi", "B", gpus=1, priority=90), "n0", (0,)),
            running(Workload("A-lo", "A", gpus=0.5, priority=10), "n0", (1,), fraction=0.5),
            running(Workload("C-x", "C", gpus=0.5), "n0", (1,), fraction=0.5),
            running(Workload("B-lo", "B", gpus=b_low, priority=10), "n1", (0,), fraction=b_low),
            running(Workload("C-y", "C", gpus=1 - b_low), "n1", (0,), fraction=1 - b_low),
            Workload("A-hi", "A", gpus=1, priority=50, submit_time=1.0)]
    return World(nodes, queues, work, SchedulerConfig(min_runtime=0))


def test_a_combined_plan_counts_its_own_victims_as_coming_back():
    """A's own low-priority half would be preempted only to make quota room: it comes straight back
    as a borrower beside C. Taking B's whole GPU would then leave B (half a GPU of its own left)
    just as far below its guarantee as A lacks now, and B would take it back the same way: no
    plan. With three quarters of its own left, B ends a quarter short, less than A lacks: the plan
    goes ahead, and B does not take it back."""
    tied = _combined_world(0.5)
    assert tied.settle(10.0, 6) == []
    assert tied.by("A-hi").phase == Phase.PENDING
    assert tied.by("B-hi").phase == Phase.RUNNING
    less = _combined_world(0.75)
    moved = less.settle(10.0, 12)
    assert moved == ["t=10 A-lo (priority)", "t=10 B-hi (reclaim)"], moved
    assert less.by("A-hi").phase == Phase.RUNNING and less.by("A-lo").phase == Phase.RUNNING
