"""Placement policies: feasibility invariants, GPU choice, masks, memory-sized shares, CPU-only
pods, the fragmentation model and its incremental cache, and the live-scheduler fallbacks."""
import numpy as np
import pytest

from gpupool.scheduler.cluster import UNTRACKED, ClusterState, PodRequest
from gpupool.scheduler.fragmentation import FragModel, waste_table
from gpupool.scheduler.model import MILLI, NodeSpec
from gpupool.scheduler.placement import POLICIES, make_policy, top_shapes, typical_shapes

GI = 2**30


def cluster():
    return ClusterState([
        NodeSpec("a0", 4, gpu_memory=80 * GI, gpu_model="H100", cpu=32, memory=256 * GI),
        NodeSpec("a1", 4, gpu_memory=80 * GI, gpu_model="H100", cpu=32, memory=256 * GI),
        NodeSpec("b0", 2, gpu_memory=40 * GI, gpu_model="A100", cpu=16, memory=128 * GI),
        NodeSpec("c0", 8, gpu_memory=24 * GI, gpu_model="L4", cpu=64, memory=512 * GI),
        NodeSpec("d0", 2, gpu_memory=0, gpu_model="T4"),  # untracked CPU/memory, unknown GPU memory
        NodeSpec("e0", 0, cpu=8, memory=32 * GI),  # CPU-only node
        NodeSpec("f0", 8, gpu_memory=80 * GI, gpu_model="H100", cpu=64, memory=512 * GI, schedulable=False),
    ])


SHAPES = [
    (PodRequest(1, 1000, 0, 8000, 32 * GI), 4.0),
    (PodRequest(1, 500, 0, 2000, 8 * GI), 3.0),
    (PodRequest(1, 250, 0, 2000, 8 * GI), 2.0),
    (PodRequest(2, 1000, 0, 8000, 32 * GI), 1.0),
    (PodRequest(0, 0, 0, 4000, 8 * GI), 2.0),
    (PodRequest(1, 300, 0, 1000, 4 * GI), 1.0, ("L4",)),
]


def random_requests(rng, n):
    kinds = [
        lambda: PodRequest(1, int(rng.choice([100, 250, 300, 470, 500, 810])), 0, int(rng.integers(1, 9)) * 1000,
                           int(rng.integers(1, 33)) * GI),
        lambda: PodRequest(int(rng.choice([1, 2, 4, 8])), MILLI, 0, int(rng.integers(1, 17)) * 1000, 16 * GI),
        lambda: PodRequest(0, 0, 0, int(rng.integers(1, 9)) * 1000, 8 * GI),
        lambda: PodRequest(1, 0, int(rng.choice([10, 20, 30])) * GI, 2000, 8 * GI),
    ]
    return [kinds[int(rng.integers(len(kinds)))]() for _ in range(n)]


def check_choice(state, req, choice, mask):
    n, gpus, milli = choice
    assert state.schedulable[n]
    if mask is not None:
        assert mask[n]
    assert state.cpu_free[n] >= req.cpu_milli and state.mem_free[n] >= req.memory
    if req.num_gpus == 0:
        assert gpus == () and milli == 0
        return
    assert milli == state.milli_on(n, req) and 0 < milli <= MILLI
    assert len(gpus) == req.num_gpus == len(set(gpus))
    for g in gpus:
        assert 0 <= g < state.num_gpus[n]
        assert state.gpu_free[n, g] >= milli


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("with_shapes", [True, False])
def test_policy_invariants_on_random_workload(policy, with_shapes):
    rng = np.random.default_rng(7)
    state = cluster()
    pol = make_policy(policy, shapes=SHAPES if with_shapes else (), seed=3)
    placed = failed = 0
    for i, req in enumerate(random_requests(rng, 300)):
        mask = None
        if i % 5 == 0:
            mask = state.node_mask({"gpu_model": "H100"})
        before = (state.gpu_free.copy(), state.cpu_free.copy(), state.mem_free.copy())
        choice = pol.choose(state, req, mask)
        # choose never mutates the state
        assert np.array_equal(before[0], state.gpu_free) and np.array_equal(before[1], state.cpu_free)
        assert np.array_equal(before[2], state.mem_free)
        if choice is None:
            failed += 1
            continue
        check_choice(state, req, choice, mask)
        n, gpus, milli = choice
        state.take(n, gpus, milli, req.cpu_milli, req.memory)
        placed += 1
        assert (state.gpu_free >= 0).all() and (state.gpu_free <= MILLI).all()
        assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    assert placed > 20 and failed > 0  # the cluster filled up


def _feasible_by_definition(state, req, mask):
    """Where ``req`` fits, worked out from the free capacity alone (the definition ``feasible``
    implements with what the state keeps of it)."""
    from gpupool.scheduler.fragmentation import per_gpu_milli
    milli = per_gpu_milli(state, req)
    ok = state.schedulable & (state.cpu_free >= req.cpu_milli) & (state.mem_free >= req.memory)
    if mask is not None:
        ok &= mask
    if req.num_gpus:
        ok &= (milli <= MILLI) & ((state.gpu_free >= milli[:, None]).sum(axis=1) >= req.num_gpus)
    return ok


def test_kept_gpu_summary_follows_every_change():
    """``ClusterState.gpu_summary`` (the most free milli of one GPU and the wholly free GPUs per
    node) and ``free_milli`` (the free milli of all its GPUs) are kept across calls and brought in
    step through the change log: after takes, gives, copies and runs of changes logged in bulk,
    they and ``feasible`` agree with a fresh reading."""
    from gpupool.scheduler.placement import feasible
    rng = np.random.default_rng(11)
    state = cluster()
    reqs = random_requests(rng, 200) + [PodRequest(1, 0, int(g) * GI, 1000, GI) for g in (5, 20, 40, 90)]
    for step in range(600):
        req = reqs[int(rng.integers(len(reqs)))]
        mask = state.node_mask({"gpu_model": "H100"}) if step % 7 == 0 else None
        ok, _ = feasible(state, req, mask)
        assert np.array_equal(ok, _feasible_by_definition(state, req, mask)), (step, req)
        mx, full, _ = state.gpu_summary()
        assert np.array_equal(mx, state.gpu_free.max(axis=1))
        assert np.array_equal(full, (state.gpu_free >= MILLI).sum(axis=1))
        if step % 3:  # (read every other step or so: changes pile up in between)
            assert np.array_equal(state.free_milli(), state.gpu_free.sum(axis=1))
        n = int(rng.integers(len(state.nodes)))
        gpus = [g for g in range(int(state.num_gpus[n])) if rng.random() < 0.5]
        milli = int(rng.choice([100, 250, 500, 1000]))
        op = rng.random()
        if op < 0.45:  # take what is free, as a placement would
            gpus = [g for g in gpus if state.gpu_free[n, g] >= milli]
            state.take(n, gpus, milli, 0, 0)
        elif op < 0.9:  # give back what was taken
            gpus = [g for g in gpus if state.gpu_free[n, g] + milli <= MILLI]
            state.give(n, gpus, milli, 0, 0)
        elif op < 0.95:  # a copy keeps its own: changing it leaves the original's as it was
            kept, kept_free = state.gpu_summary()[0].copy(), state.free_milli().copy()
            old, state = state, state.copy()
            row = int(np.argmax(state.gpu_free.max(axis=1)))
            state.take(row, [int(np.argmax(state.gpu_free[row]))], 1, 0, 0)
            assert np.array_equal(old.gpu_summary()[0], kept)
            assert np.array_equal(state.free_milli(), state.gpu_free.sum(axis=1))
            assert np.array_equal(old.free_milli(), kept_free)
        else:  # a bulk change logged by hand (as the intake of reservations does)
            rows = rng.integers(len(state.nodes), size=3)
            for r in rows:
                if state.num_gpus[r]:
                    state.gpu_free[r, 0] = int(rng.integers(0, MILLI + 1))
            state.log.extend(rows.tolist())


def test_none_when_nothing_fits_and_mask_excludes_all():
    state = cluster()
    for policy in POLICIES:
        assert make_policy(policy, shapes=SHAPES).choose(ClusterState([]), PodRequest(1, MILLI)) is None
        pol = make_policy(policy, shapes=SHAPES)
        assert pol.choose(state, PodRequest(16, MILLI, 0, 0, 0)) is None  # no node has 16 GPUs
        assert pol.choose(state, PodRequest(1, MILLI), np.zeros(len(state.nodes), bool)) is None
        # CPU beyond every tracked node: only the node that tracks no CPU can take it
        assert pol.choose(state, PodRequest(1, 500, 0, 10**9, 0))[0] == 4
        assert pol.choose(state, PodRequest(1, 500, 0, 10**9, 0), state.schedulable & (state.cpu_total < UNTRACKED)) is None


def test_eight_gpu_pod_needs_a_fully_free_node():
    state = cluster()
    for policy in POLICIES:
        pol = make_policy(policy, shapes=SHAPES, seed=1)
        n, gpus, milli = pol.choose(state, PodRequest(8, MILLI, 0, 1000, GI))
        assert state.nodes[n].name == "c0" and gpus == tuple(range(8)) and milli == MILLI
    state.take(3, (0,), 300, 0, 0)
    for policy in POLICIES:
        assert make_policy(policy, shapes=SHAPES).choose(state, PodRequest(8, MILLI, 0, 1000, GI)) is None
        n, gpus, _ = make_policy(policy, shapes=SHAPES).choose(state, PodRequest(4, MILLI, 0, 1000, GI))
        assert len(set(gpus)) == 4 and all(state.gpu_free[n, g] == MILLI for g in gpus)


def test_memory_sized_share_converts_per_node_and_skips_unknown_gpu_memory():
    state = cluster()
    req = PodRequest(1, 0, 20 * GI, 1000, GI)
    seen = set()
    for policy in POLICIES:
        for seed in range(5):
            n, gpus, milli = make_policy(policy, shapes=SHAPES, seed=seed).choose(state, req)
            assert state.nodes[n].name != "d0"  # unknown GPU memory: a memory-sized share cannot go there
            assert milli == {"a0": 250, "a1": 250, "b0": 500, "c0": 834}[state.nodes[n].name]
            seen.add(state.nodes[n].name)
    assert seen  # at least one placement happened
    only_d0 = np.array([nd.name == "d0" for nd in state.nodes])
    assert make_policy("default", shapes=SHAPES).choose(state, req, only_d0) is None


def test_cpu_only_pod_uses_no_gpu_and_may_use_cpu_only_node():
    state = cluster()
    req = PodRequest(0, 0, 0, 6000, 16 * GI)
    mask = np.array([nd.gpus == 0 for nd in state.nodes])
    for policy in POLICIES:
        n, gpus, milli = make_policy(policy, shapes=SHAPES).choose(state, req, mask)
        assert state.nodes[n].name == "e0" and gpus == () and milli == 0


def test_share_goes_to_the_tightest_gpu_for_bestfit_and_default():
    state = cluster()
    only_a0 = np.array([nd.name == "a0" for nd in state.nodes])
    state.take(0, (0,), 300, 0, 0)  # a0: 700 1000 1000 1000
    state.take(0, (2,), 600, 0, 0)  # a0: 700 1000 400 1000
    for policy in ("bestfit", "default", "firstfit"):
        n, gpus, milli = make_policy(policy, shapes=()).choose(state, PodRequest(1, 400), only_a0)
        assert (n, gpus, milli) == (0, (2,), 400), policy


def test_default_packs_a_share_next_to_a_matching_share():
    """Two 500-shares fill one GPU: with the 500-share shape frequent, FGD-style scoring puts the
    second 500 on the half-used GPU instead of breaking a fresh GPU."""
    state = cluster()
    shapes = [(PodRequest(1, 500, 0, 1000, GI), 1.0), (PodRequest(1, 1000, 0, 1000, GI), 1.0)]
    for policy in ("default", "fgd"):
        st = state.copy()
        pol = make_policy(policy, shapes=shapes)
        n, gpus, milli = pol.choose(st, PodRequest(1, 500, 0, 1000, GI))
        st.take(n, gpus, milli, 1000, GI)
        n2, gpus2, _ = pol.choose(st, PodRequest(1, 500, 0, 1000, GI))
        assert (n2, gpus2) == (n, gpus), policy


def test_untracked_cpu_does_not_dominate_scores():
    """d0 tracks no CPU/memory (modelled as huge): it must not look infinitely 'empty' or 'full'."""
    state = ClusterState([NodeSpec("tracked", 2, cpu=16, memory=64 * GI), NodeSpec("untracked", 2)])
    state.take(1, (0,), 1000, 0, 0)  # untracked node has 1 free GPU, tracked 2
    for shapes in ((), SHAPES):
        n, gpus, _ = make_policy("default", shapes=shapes).choose(state, PodRequest(1, MILLI, 0, 1000, GI))
        assert state.nodes[n].name == "untracked", shapes  # best fit on GPUs: the node with 1 GPU left
    assert state.cpu_free[1] == UNTRACKED


@pytest.mark.parametrize("measure,beta,waste", [("fgd", 1.0, 0.0), ("hybrid", 0.5, 0.0), ("hybrid", 0.5, 3.0)])
def test_fragmentation_model_matches_definition_and_stays_in_sync(measure, beta, waste):
    rng = np.random.default_rng(1)
    state = cluster()
    # with the expected waste, a memory-sized share too: its milli per GPU, and so the table,
    # differs by the node's GPU memory
    shapes = SHAPES + [(PodRequest(1, 0, 20 * GI, 2000, 8 * GI), 1.0)] if waste else SHAPES
    fm = FragModel(shapes, use_memory=True, measure=measure, beta=beta, waste_weight=waste)
    gpu_shapes = [r for r, *_ in fm.shapes if r.num_gpus > 0]

    def table(n):  # the expected-waste table of node n: GPU shapes by their milli per GPU there
        classes = {}
        for (r, w, *_), m in zip(fm.shapes, fm.m[n]):
            if r.num_gpus > 0 and m <= MILLI:
                classes[int(m)] = classes.get(int(m), 0.0) + w
        return waste_table(sorted(classes.items()))
    pol = make_policy("random", seed=2)
    for step, req in enumerate(random_requests(rng, 120)):
        c = pol.choose(state, req)
        if c:
            state.take(c[0], c[1], c[2], req.cpu_milli, req.memory)
        if step % 10:
            continue
        fm.sync(state)
        for n in range(len(state.nodes)):
            total = 0.0
            free = state.gpu_free[n][: state.num_gpus[n]]
            for (r, w, *models), m in zip(fm.shapes, fm.m[n]):
                models = models[0] if models else None
                ok = (r.num_gpus > 0 and (not models or state.nodes[n].gpu_model in models)
                      and (free >= m).sum() >= r.num_gpus and state.cpu_free[n] >= r.cpu_milli
                      and state.mem_free[n] >= r.memory)
                frag = free[free < m].sum() if ok else free.sum()
                if ok and measure == "hybrid":  # GPU room for qg pods, CPU/memory for q of them
                    qg = int((free // m).sum()) // r.num_gpus
                    q = min(qg, state.cpu_free[n] // max(r.cpu_milli, 1) if r.cpu_milli else qg,
                            state.mem_free[n] // max(r.memory, 1) if r.memory else qg)
                    frag += beta * (qg - q) * r.num_gpus * m
                total += w * frag
            if waste:  # each GPU's expected waste; all free milli where no GPU pod's CPU/memory fits
                blocked = (state.cpu_free[n] < min(r.cpu_milli for r in gpu_shapes)
                           or state.mem_free[n] < min(r.memory for r in gpu_shapes))
                total += waste * (free.sum() if blocked else table(n)[free].sum())
            assert fm.F[n] == pytest.approx(total), (step, n)
        # the incremental 'after' formulas agree with recomputing the node
        for n in np.flatnonzero(state.gpu_free.max(axis=1) >= 300)[:3]:
            g = int(np.argmax(state.gpu_free[n]))
            after = fm.after_share(np.array([n]), np.array([g]), np.array([300]), 1000, GI)[0]
            row = state.gpu_free[n:n + 1].copy()
            row[0, g] -= 300
            assert after == pytest.approx(fm.after_rows(np.array([n]), row, 1000, GI)[0])
            # several GPUs of one node at once, its CPU/memory part worked out once: the same values
            gs = np.flatnonzero(state.gpu_free[n] >= 300)
            each = [fm.after_share(np.array([n]), np.array([g]), np.array([300]), 1000, GI)[0] for g in gs]
            once = fm.after_share(np.full(gs.size, n), gs, np.full(gs.size, 300), 1000, GI,
                                  nodes=np.array([n]), of=np.zeros(gs.size, dtype=np.int64))
            assert once == pytest.approx(each)
        # taking whole free GPUs (or none: a CPU-only pod)
        for n in np.flatnonzero((state.gpu_free >= MILLI).sum(axis=1) >= 1)[:3]:
            row = state.gpu_free[n:n + 1].copy()
            row[0, np.flatnonzero(row[0] >= MILLI)[:1]] = 0
            for k, r in ((1, row), (0, state.gpu_free[n:n + 1])):
                after = fm.after_whole(np.array([n]), k, 1000, GI)[0]
                assert after == pytest.approx(fm.after_rows(np.array([n]), r, 1000, GI)[0])


@pytest.mark.parametrize("kept", [20_000, 3])
def test_rows_looked_up_are_the_rows_worked_out(monkeypatch, kept):
    """A node's row is looked up among the rows already worked out for a node of its class in the
    same free state (``FragModel.row_key``); twins filled pod by pod with a few shapes pass
    through few states, so most rows are looked up, and the tables stay those of a model that
    works every row out afresh (a memory-sized share: nodes that differ only in GPU memory are
    not twins), also when the rows kept outgrow their bound and are dropped."""
    from gpupool.scheduler import fragmentation
    monkeypatch.setattr(fragmentation, "KEPT_ROWS", kept)
    rng = np.random.default_rng(7)
    nodes = [NodeSpec(f"n{i}", 4, gpu_memory=(80 if i % 2 else 40) * GI, gpu_model="H100", cpu=32,
                      memory=256 * GI) for i in range(48)]
    state = ClusterState(nodes)
    # (a frequent 0.81 share: its remainders are expected waste, so the waste sums are not 0)
    shapes = SHAPES + [(PodRequest(1, 0, 20 * GI, 2000, 8 * GI), 1.0), (PodRequest(1, 810, 0, 2000, 8 * GI), 4.0)]

    def model():
        return FragModel(shapes, use_memory=True, measure="hybrid", beta=0.5, waste_weight=3.0)
    fm = model()
    fm.sync(state)
    assert len(set(fm.node_class)) == 2  # the two GPU memory sizes
    derived, real = [], fm._derive
    fm._derive = lambda rows: (derived.append(len(rows)), real(rows))[1]
    pol, synced = make_policy("default", shapes=shapes, seed=3), 0  # (packs: nodes fill alike)
    asks = [PodRequest(1, 500, 0, 2000, 8 * GI), PodRequest(1, MILLI, 0, 4000, 16 * GI),
            PodRequest(1, 0, 20 * GI, 2000, 8 * GI), PodRequest(1, 810, 0, 2000, 8 * GI)]  # a few shapes
    for _ in range(240):  # (the nodes' 192 GPUs about four fifths full)
        req = asks[int(rng.integers(len(asks)))]
        c = pol.choose(state, req)
        if c is None:
            continue
        state.take(c[0], c[1], c[2], req.cpu_milli, req.memory)
        fm.sync(state)
        synced += 1
        if synced % 5 == 0:
            fresh = model()
            fresh.sync(state)
            for name in ("tot", "cnt", "small", "slots"):
                assert np.array_equal(getattr(fm, name), getattr(fresh, name)), (synced, name)
            assert fm.F == pytest.approx(fresh.F) and fm.wsum == pytest.approx(fresh.wsum), synced
    assert synced > 100 and (kept < 100 or sum(derived) < synced / 2), (synced, sum(derived))
    assert fm.wsum.any()


@pytest.mark.parametrize("kept", [4_096, 3])
def test_choices_from_looked_up_rows_equal_fresh_choices(monkeypatch, kept):
    """``default`` looks a node's best GPU and fragmentation decrease up by its row and the
    request's milli there; on twins filled with a few shapes most are looked up, and every choice
    is the one a fresh policy (working every node out) makes, also when what is kept outgrows
    its bound and is dropped."""
    from gpupool.scheduler import placement
    monkeypatch.setattr(placement, "KEPT_CHOICES", kept)
    rng = np.random.default_rng(11)
    nodes = [NodeSpec(f"n{i}", 4, gpu_memory=(80 if i % 2 else 40) * GI, gpu_model="H100", cpu=32,
                      memory=256 * GI) for i in range(40)]
    state = ClusterState(nodes)
    # no memory-sized typical shape: the twins of both GPU memory sizes are one class, and a
    # memory-sized request's milli per GPU tells them apart
    shapes = SHAPES + [(PodRequest(1, 810, 0, 2000, 8 * GI), 4.0)]
    asks = [PodRequest(1, 500, 0, 2000, 8 * GI), PodRequest(1, 0, 20 * GI, 2000, 8 * GI),
            PodRequest(1, 810, 0, 2000, 8 * GI), PodRequest(2, MILLI, 0, 4000, 16 * GI)]
    live = make_policy("default", shapes=shapes, seed=4)
    live.model.sync(state)
    assert len(set(live.model.node_class)) == 1
    asked, derived = [], []
    real_compute, real_derive = live._compute, live._derive
    live._compute = lambda rows, *a: (asked.append(len(rows)), real_compute(rows, *a))[1]
    live._derive = lambda rows, *a: (derived.append(len(rows)), real_derive(rows, *a))[1]
    for _ in range(200):
        req = asks[int(rng.integers(len(asks)))]
        a = live.choose(state, req)
        assert a == make_policy("default", shapes=shapes, seed=4).choose(state, req)
        if a:
            state.take(a[0], a[1], a[2], req.cpu_milli, req.memory)
    # (after each request's first look at every node: the nodes changed since its last choice)
    asked, derived = [k for k in asked if k < len(nodes)], [k for k in derived if k < len(nodes)]
    assert kept < 100 or sum(derived) < sum(asked) / 2, (sum(asked), sum(derived))


def test_cached_choices_equal_fresh_choices():
    """The per-shape cache (recomputing only changed nodes) never goes stale: a long-lived policy
    makes the same choices as a fresh one built for every pod."""
    rng = np.random.default_rng(5)
    state = cluster()
    for policy in ("default", "fgd"):
        st = state.copy()
        live = make_policy(policy, shapes=SHAPES, seed=4)
        for req in random_requests(rng, 150):
            a = live.choose(st, req)
            b = make_policy(policy, shapes=SHAPES, seed=4).choose(st, req)
            assert a == b
            if a:
                st.take(a[0], a[1], a[2], req.cpu_milli, req.memory)
        # a new ClusterState with the same nodes (as the live scheduler builds every cycle)
        st2 = ClusterState(st.nodes)
        st2.gpu_free[:] = st.gpu_free
        st2.cpu_free[:] = st.cpu_free
        st2.mem_free[:] = st.mem_free
        for req in random_requests(rng, 20):
            assert live.choose(st2, req) == make_policy(policy, shapes=SHAPES, seed=4).choose(st2, req)


def test_typical_shapes_and_top_shapes():
    reqs = [PodRequest(1, 500, 0, 1000, GI)] * 6 + [PodRequest(1, MILLI, 0, 2000, GI)] * 3 + \
           [(PodRequest(2, MILLI, 0, 4000, GI), ("A",))]
    shapes = typical_shapes(reqs)
    assert [(r.num_gpus, r.milli, w) for r, w, _ in shapes] == [(1, 500, 0.6), (1, 1000, 0.3), (2, 1000, 0.1)]
    assert shapes[2][2] == ("A",)
    top = top_shapes(shapes, 0.8)  # 0.6 + 0.3 covers 80%
    assert [w for _, w, _ in top] == pytest.approx([2 / 3, 1 / 3])


def test_unknown_policy_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="unknown placement policy 'nope'"):
        make_policy("nope")
    with pytest.raises(TypeError):
        make_policy("default", shapes=[("not a request", 1.0)])


def test_gpu_model_pressure_and_routing_of_unconstrained_pods():
    """A GPU model that model-constrained shapes oversubscribe is kept for them: an unconstrained
    pod goes to another model when the scores are close."""
    state = ClusterState([NodeSpec("x0", 4, gpu_model="X", cpu=32, memory=256 * GI),
                          NodeSpec("y0", 4, gpu_model="Y", cpu=32, memory=256 * GI),
                          NodeSpec("y1", 4, gpu_model="Y", cpu=32, memory=256 * GI)])
    shapes = [(PodRequest(1, MILLI, 0, 1000, GI), 1.0, ("X",)), (PodRequest(1, MILLI, 0, 1000, GI), 1.0)]
    pol = make_policy("default", shapes=shapes)
    # half of all GPU demand may only use X, which is a third of the capacity: pressure 1.5
    assert pol.choose(state, PodRequest(1, MILLI, 0, 1000, GI)) is not None
    rho = pol._pressure(state)
    assert rho[0] == pytest.approx(1.5) and rho[1] == rho[2] == 0
    for _ in range(6):  # unconstrained pods fill Y first
        n, gpus, milli = pol.choose(state, PodRequest(1, MILLI, 0, 1000, GI))
        assert state.nodes[n].gpu_model == "Y"
        state.take(n, gpus, milli, 1000, GI)
    # without constrained shapes there is no pressure anywhere
    plain = make_policy("default", shapes=[(PodRequest(1, MILLI, 0, 1000, GI), 1.0)])
    plain.choose(state, PodRequest(1, MILLI, 0, 1000, GI))
    assert not plain._pressure(state).any()


def test_default_keeps_cpu_hungry_shares_off_cpu_poor_nodes():
    """Even where CPU is plentiful cluster-wide, GPU capacity that a node's CPU strands counts a
    little (the floor of the stranded-capacity weight): a CPU-hungry share goes to the CPU-rich
    node, not to the CPU-poor one where it would leave a GPU no CPU for the workload's usual pod."""
    def state():
        s = ClusterState([NodeSpec("poor", 4, cpu=16, memory=256 * GI), NodeSpec("rich", 4, cpu=64, memory=256 * GI)])
        s.take(0, (), 0, 0, GI)  # poor is in use: equal scores would go there
        return s
    shapes = [(PodRequest(1, MILLI, 0, 4000, 8 * GI), 0.9), (PodRequest(1, 500, 0, 6000, 8 * GI), 0.1)]
    hungry = PodRequest(1, 500, 0, 6000, 8 * GI)
    chosen = {}
    for floor in (0.0, None):
        s, pol = state(), make_policy("default", shapes=shapes)
        if floor is not None:
            pol.cpu_floor = floor  # the measure without the floor, for contrast
        n, _, _ = pol.choose(s, hungry)
        chosen[floor] = s.nodes[n].name
    assert chosen == {0.0: "poor", None: "rich"}


def test_stranded_capacity_weight_follows_cpu_scarcity():
    """The weight of GPU capacity stranded by CPU: the floor while the workload's CPU per GPU is
    well below the cluster's, 1 once it reaches the cluster's, 0 when no node tracks CPU."""
    nodes = [NodeSpec("n0", 4, cpu=32, memory=256 * GI)]
    def beta(cpu_per_gpu, nodes=nodes):
        pol = make_policy("default", shapes=[(PodRequest(1, MILLI, 0, cpu_per_gpu, GI), 1.0)])
        return pol._cpu_beta(ClusterState(nodes))[0]
    assert beta(2000) == pytest.approx(0.1)  # a quarter of the cluster's 8 cores per GPU
    assert beta(7600) == pytest.approx(0.5)  # 95% of it: halfway up the ramp
    assert beta(8000) == beta(16000) == 1.0
    assert beta(8000, [NodeSpec("u0", 4)]) == 0.0


def test_waste_table_looks_past_the_next_pod():
    """A GPU's expected waste: what the shares that fit its free milli would leave, trusting a class
    in proportion to how often it arrives (fully from 2% of pods on)."""
    W = waste_table([(1000, 0.6), (650, 0.05), (470, 0.1), (320, 0.05), (160, 0.007)])
    assert W[1000] == 0 and W[0] == 0
    assert W[530] == 60  # another 0.47 share fills it to 0.94
    assert W[680] == W[350] == 30  # a 0.65 share / a 0.32 share
    assert W[210] == pytest.approx(0.65 * 210 + 0.35 * 50)  # only the rare 0.16 share fits
    assert W[100] == 100  # nothing fits
    assert np.all(W <= np.arange(MILLI + 1))
    assert np.array_equal(waste_table([]), np.arange(MILLI + 1))


def test_default_keeps_a_remainder_a_frequent_share_would_fill():
    """A 0.32 share beside a 0.47 one leaves 0.21 that hardly anything fills; FGD, looking one pod
    ahead, still prefers it to breaking a fresh GPU. With 0.47 and 0.65 shares frequent, `default`
    sees the 0.53 remainder would take another 0.47 and the fresh GPU's 0.68 a 0.65."""
    shapes = [(PodRequest(1, MILLI, 0, 4000, 8 * GI), 0.5), (PodRequest(1, 470, 0, 4000, 8 * GI), 0.2),
              (PodRequest(1, 650, 0, 4000, 8 * GI), 0.15), (PodRequest(1, 320, 0, 4000, 8 * GI), 0.15)]
    chosen = {}
    for policy in ("default", "fgd"):
        state = ClusterState([NodeSpec("n0", 4, cpu=64, memory=256 * GI)])
        state.take(0, (0,), 470, 4000, 8 * GI)
        chosen[policy] = make_policy(policy, shapes=shapes).choose(state, PodRequest(1, 320, 0, 4000, 8 * GI))
    assert chosen == {"default": (0, (1,), 320), "fgd": (0, (0,), 320)}


def test_expected_waste_weight_fades_as_cpu_gets_scarce():
    """The expected-waste weight is full while CPU is plentiful and 0 once the workload's CPU per GPU
    reaches the cluster's (the stranded-capacity weight then counts fully instead)."""
    nodes = [NodeSpec("n0", 4, cpu=32, memory=256 * GI)]
    def weights(cpu_per_gpu, nodes=nodes):
        pol = make_policy("default", shapes=[(PodRequest(1, MILLI, 0, cpu_per_gpu, GI), 1.0)])
        return pol._weights(ClusterState(nodes))
    full = make_policy("default").waste_weight
    assert weights(2000) == (pytest.approx(0.1), full)
    assert weights(7600) == (pytest.approx(0.5), pytest.approx(full / 2))
    assert weights(8000) == (1.0, 0.0)
    assert weights(8000, [NodeSpec("u0", 4)]) == (0.0, full)  # no CPU tracked: no CPU scarcity


def test_expected_waste_weight_fades_as_shares_dominate_gpu_demand():
    """The expected-waste weight is full while GPU shares ask for at most ``share_fade[0]`` of the
    GPU demand (milli), 0 from ``share_fade[1]`` on, linear between; a memory-sized share counts
    as a share (of a whole GPU's milli, as the demand counts it)."""
    nodes = ClusterState([NodeSpec("n0", 4, cpu=64, memory=256 * GI)])
    whole, half = PodRequest(1, MILLI, 0, 2000, GI), PodRequest(1, 500, 0, 2000, GI)

    def waste(shapes):
        return make_policy("default", shapes=shapes)._weights(nodes)[1]
    full = make_policy("default").waste_weight
    assert make_policy("default").share_fade == (0.32, 0.42)
    assert waste([(whole, 1.0)]) == full
    assert waste([(whole, 1.0), (half, 0.5)]) == full  # 250 of 1250 milli: a fifth
    assert waste([(whole, 63.0), (half, 74.0)]) == pytest.approx(full / 2)  # 0.37 of the demand
    assert waste([(whole, 1.0), (half, 2.0)]) == 0.0  # half of it
    assert waste([(whole, 1.0), (PodRequest(1, 0, 8 * GI, 2000, GI), 1.0)]) == 0.0


def test_share_heavy_workload_places_shares_as_without_expected_waste():
    """Where shares ask for most of the GPU demand, the expected waste is off: the 0.32 share goes
    beside the 0.47 one, as FGD's one-pod look-ahead puts it (compare the test above)."""
    shapes = [(PodRequest(1, MILLI, 0, 4000, 8 * GI), 0.1), (PodRequest(1, 470, 0, 4000, 8 * GI), 0.4),
              (PodRequest(1, 650, 0, 4000, 8 * GI), 0.25), (PodRequest(1, 320, 0, 4000, 8 * GI), 0.25)]
    state = ClusterState([NodeSpec("n0", 4, cpu=64, memory=256 * GI)])
    state.take(0, (0,), 470, 4000, 8 * GI)
    pol = make_policy("default", shapes=shapes)
    assert pol.choose(state, PodRequest(1, 320, 0, 4000, 8 * GI)) == (0, (0,), 320)
    assert pol.model.waste_weight == 0.0
