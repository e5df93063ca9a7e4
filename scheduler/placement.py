"""Placement policies: which node and which GPUs a pod goes to.

API (stable; the live scheduler and the trace-fill benchmark both call it):

    policy = make_policy("default", shapes=[(PodRequest, weight), ...], seed=0)
    choice = policy.choose(state, req, mask=None)   # -> (node_index, gpu_indices, milli) | None

``mask`` (bool per node) restricts the candidate nodes (node selectors, GPU models, topology).
``milli`` is the per-GPU share actually taken on the chosen node (memory-sized requests convert
per node). ``choose`` never mutates ``state``; the caller applies the choice with
``state.take(node, gpus, milli, req.cpu_milli, req.memory)``.

``shapes`` describes the workload's typical pods: ``(PodRequest, weight)`` or
``(PodRequest, weight, models)`` where ``models`` lists the GPU models the shape may use (None =
any); weights are relative arrival frequencies. ``typical_shapes()`` derives them from a list of
requests the way the FGD paper does. Policies:

* ``default``: what the live scheduler uses. FGD with CPU/memory-aware fragmentation (GPU capacity
  stranded by CPU counts a little, fully when the workload is CPU-hungry), each GPU's expected waste
  (what the frequent shapes that fit its remainder would leave), GPU models oversubscribed by
  model-constrained shapes kept for those, the paper's coarse scores, ties to nodes already in use
  and then a fixed node order (consolidation); the exact fragmentation decrease picks the GPU
  within a node. Without shapes: a normalised best fit.
* ``fgd``: Fragmentation Gradient Descent as the paper's simulator scores it (the 95% most
  frequent shapes, integer scores ``int(100*sigmoid(delta/1000))``, ties to a seeded random node
  order as its simulator does), the reference to beat.
* ``bestfit``: the paper's BestFit baseline: ``1 - 0.5*cpu_free_after/128 cores
  - 0.5*gpu_free_after/8 GPUs`` truncated to an integer 0..100, ties to a seeded random node
  order, tightest GPU.
* ``random``: the paper's Random-fit baseline: a uniformly random feasible node (and GPU).
* ``firstfit``: the first feasible node in order (simple, deterministic).

All policies are pure (numpy only) and deterministic for a given seed and call sequence.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from .cluster import UNTRACKED as _UNTRACKED
from .cluster import ClusterState, PodRequest
from .fragmentation import FEW_ROWS, KEPT_CHOICES, FragModel, look_up, normalise_shapes, per_gpu_milli
from .model import MILLI

Choice = tuple[int, tuple[int, ...], int]

# The paper's normalisers for BestFit (its simulator's MaxSpecCpu / MaxSpecGpu).
MAX_SPEC_CPU = 128000.0
MAX_SPEC_GPU = 8000.0


# -- shared helpers ------------------------------------------------------------------------------
def feasible(state: ClusterState, req: PodRequest, mask: np.ndarray | None = None):
    """(ok, milli): nodes where ``req`` fits now, and the per-GPU milli it needs on each node."""
    ok = state.schedulable & (state.cpu_free >= req.cpu_milli) & (state.mem_free >= req.memory)
    if mask is not None:
        ok &= np.asarray(mask, dtype=bool)
    milli = per_gpu_milli(state, req)
    if req.num_gpus > 0:
        if req.gpu_memory > 0 or not state.gpu_free.shape[1]:  # the milli differs per node
            ok &= milli <= MILLI
            if req.num_gpus == 1 and state.gpu_free.shape[1]:
                ok &= state.gpu_summary()[0] >= milli
            else:
                ok &= (state.gpu_free >= milli[:, None]).sum(axis=1) >= req.num_gpus
        else:  # one milli everywhere (at most a whole GPU)
            m = int(milli[0]) if len(milli) else MILLI
            if req.num_gpus == 1:
                ok &= state.gpu_summary()[0] >= m
            elif m >= MILLI:
                ok &= state.gpu_summary()[1] >= req.num_gpus
            else:
                ok &= (state.gpu_free >= m).sum(axis=1) >= req.num_gpus
    return ok, milli


def _whole_gpus(free_row: np.ndarray, k: int) -> tuple[int, ...]:
    """The first k fully free GPUs of a node (the paper's AllocateExclusiveGpuId)."""
    return tuple(int(g) for g in np.flatnonzero(free_row >= MILLI)[:k])


def _tightest_gpus(free_row: np.ndarray, milli: int, k: int) -> tuple[int, ...]:
    """k GPUs with the least free milli that still fits (lowest index first on ties)."""
    fit = np.flatnonzero(free_row >= milli)
    order = fit[np.argsort(free_row[fit], kind="stable")]
    return tuple(sorted(int(g) for g in order[:k]))


def _gpus_for(state: ClusterState, n: int, req: PodRequest, milli: int) -> tuple[int, ...]:
    if req.num_gpus <= 0:
        return ()
    row = state.gpu_free[n]
    if milli >= MILLI:
        return _whole_gpus(row, req.num_gpus)
    return _tightest_gpus(row, milli, req.num_gpus)


def top_shapes(shapes: Sequence, threshold: float = 0.95) -> list:
    """The most frequent shapes covering ``threshold`` of the weight, renormalised (the FGD paper's
    popularity cut: most frequent first, equal weights larger resource first)."""
    norm = normalise_shapes(shapes)
    order = sorted(norm, key=lambda e: (e[1], e[0].cpu_milli, e[0].milli, e[0].num_gpus, e[0].gpu_memory,
                                        "|".join(e[2] or ())), reverse=True)
    chosen, cum = [], 0.0
    for e in order:
        if cum >= threshold - 1e-12:
            break
        chosen.append(e)
        cum += e[1]
    return [(r, w / cum, m) for r, w, m in chosen]


def typical_shapes(requests: Iterable, threshold: float = 1.0) -> list[tuple[PodRequest, float, tuple[str, ...] | None]]:
    """The workload's pod shapes with their frequencies, as the FGD paper's simulator derives them
    (GetTypicalPods, CPU-only pods included): count pods per (CPU, GPUs, milli per GPU, allowed
    models), most frequent first, keep shapes until they cover ``threshold`` of all pods (the
    paper's ``fgd`` cuts at 95%, see ``top_shapes``), weights renormalised to 1. ``requests`` yields ``PodRequest`` or
    ``(PodRequest, models)``; a shape's memory is the median of its pods' memory."""
    counts: Counter = Counter()
    mems: dict = {}
    for item in requests:
        req, models = (item if isinstance(item, tuple) else (item, None))
        models = tuple(sorted(models)) if models else None
        key = (req.cpu_milli, req.milli if req.num_gpus else 0, req.num_gpus, req.gpu_memory, models or ())
        counts[key] += 1
        mems.setdefault(key, []).append(req.memory)
    total = sum(counts.values())
    if not total:
        return []
    # most frequent first; equal counts: larger resource first (the paper's reverse sort order)
    order = sorted(counts, key=lambda k: (counts[k], k[0], k[1], k[2], k[3], "|".join(k[4])), reverse=True)
    chosen, cum = [], 0
    for key in order:
        if cum >= threshold * total - 1e-9:
            break
        chosen.append(key)
        cum += counts[key]
    out = []
    for key in chosen:
        cpu, milli, ngpu, gmem, models = key
        mem = int(np.median(mems[key]))
        out.append((PodRequest(ngpu, milli, gmem, cpu, mem), counts[key] / cum, models or None))
    return out


# -- simple policies -------------------------------------------------------------------------------
class FirstFit:
    """The first feasible node in index order; tightest GPU for a share."""

    name = "firstfit"

    def __init__(self, shapes=(), seed: int = 0):
        pass

    def choose(self, state: ClusterState, req: PodRequest, mask: np.ndarray | None = None) -> Choice | None:
        ok, milli = feasible(state, req, mask)
        idx = np.flatnonzero(ok)
        if not idx.size:
            return None
        n = int(idx[0])
        return n, _gpus_for(state, n, req, int(milli[n])), int(milli[n]) if req.num_gpus else 0


class RandomFit:
    """The paper's Random-fit: a uniformly random feasible node; for a share a uniformly random
    GPU with room; whole GPUs: the first fully free ones."""

    name = "random"

    def __init__(self, shapes=(), seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def choose(self, state, req, mask=None):
        ok, milli = feasible(state, req, mask)
        idx = np.flatnonzero(ok)
        if not idx.size:
            return None
        n = int(idx[self.rng.integers(idx.size)]) if idx.size > 1 else int(idx[0])
        if req.num_gpus <= 0:
            return n, (), 0
        m = int(milli[n])
        if req.num_gpus == 1 and m < MILLI:
            fit = np.flatnonzero(state.gpu_free[n] >= m)
            return n, (int(fit[self.rng.integers(fit.size)]) if fit.size > 1 else int(fit[0]),), m
        return n, _gpus_for(state, n, req, m), m


class _TieOrder:
    """A random but fixed priority per node, drawn once per seed: the paper's simulator prefixes
    node names with a random permutation and its scheduler breaks equal scores towards the
    smallest name. (A fixed order packs ties onto the same nodes; a fresh coin per pod spreads
    them and loses several points of allocation.)"""

    def __init__(self, seed: int):
        self.seed = seed
        self._names = None
        self.rank = None

    def get(self, state: ClusterState) -> np.ndarray:
        if self._names is not state.nodes:
            names = [nd.name for nd in state.nodes]
            if self.rank is None or len(self.rank) != len(names) or self._key != names:
                order = sorted(range(len(names)), key=names.__getitem__)
                perm = np.random.default_rng(self.seed).permutation(len(names))
                self.rank = np.empty(len(names), dtype=np.int64)
                self.rank[order] = perm
                self._key = names
            self._names = state.nodes
        return self.rank


def _pick_max(values: np.ndarray, idx: np.ndarray, rank: np.ndarray) -> int:
    """The node (from ``idx``) with the maximum value; equal maxima go to the lowest rank."""
    if idx.size == 1:  # Kubernetes skips scoring when only one node is feasible
        return int(idx[0])
    best = idx[values == values.max()]
    return int(best[np.argmin(rank[best])]) if best.size > 1 else int(best[0])


class BestFit:
    """The paper's BestFit: score = int(100 * (1 - 0.5*cpu_after/128000 - 0.5*gpu_after/8000)),
    highest wins, equal scores to the node of lowest random rank (see _TieOrder); a share goes to
    the tightest GPU. Free CPU above 128 cores (or untracked) counts as 128 cores, free GPU above
    8 GPUs as 8."""

    name = "bestfit"

    def __init__(self, shapes=(), seed: int = 0):
        self.ties = _TieOrder(seed)

    def choose(self, state, req, mask=None):
        ok, milli = feasible(state, req, mask)
        idx = np.flatnonzero(ok)
        if not idx.size:
            return None
        cpu_after = np.minimum(state.cpu_free[idx] - req.cpu_milli, MAX_SPEC_CPU).astype(np.float64)
        gpu_after = np.minimum(state.gpu_free[idx].sum(axis=1) - req.num_gpus * milli[idx], MAX_SPEC_GPU)
        score = cpu_after / MAX_SPEC_CPU * 0.5
        score = score + gpu_after.astype(np.float64) / MAX_SPEC_GPU * 0.5
        iscore = np.trunc((1.0 - score) * 100.0)
        n = _pick_max(iscore, idx, self.ties.get(state))
        m = int(milli[n]) if req.num_gpus else 0
        return n, _gpus_for(state, n, req, m), m


# -- fragmentation-gradient policies -----------------------------------------------------------------
class _FragPolicy:
    """Shared machinery: per request shape, cache each node's best placement value and GPU, and
    recompute only nodes whose capacity changed since (``FragModel.version``)."""

    use_memory = False
    # may ``_compute`` look a node's GPU and decrease up by its row? (``share_value`` must be
    # worked out element by element alike wherever the element falls: no ``exp``)
    rows_kept = False

    def __init__(self, shapes=(), seed: int = 0):
        self.ties = _TieOrder(seed)
        self.model = FragModel(shapes, use_memory=self.use_memory) if normalise_shapes(shapes) else None
        self.fallback = None if self.model is not None else self._fallback(seed)
        self._cache: dict = {}
        self._model_id = None

    def _fallback(self, seed):
        return BestFit(seed=seed)

    # subclass hooks ------------------------------------------------------------------------------
    def share_value(self, delta: np.ndarray, free: np.ndarray, milli: np.ndarray) -> np.ndarray:
        """Value of a GPU choice within a node (higher is better) from the fragmentation decrease
        ``delta``, the GPU's free milli and the request's milli."""
        raise NotImplementedError

    def node_value(self, delta: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------
    def _entry(self, req: PodRequest):
        key = req.shape
        e = self._cache.get(key)
        N = len(self.model.version)
        if e is None or e[0] is not self.model.version or len(e[1]) != N:
            # (version, snap, value, gpu, delta, and the values worked out by row: see _compute)
            e = [self.model.version, np.full(N, -1, np.int64), np.zeros(N), np.zeros(N, np.int64), np.zeros(N), {}]
            self._cache[key] = e
        return e

    def _compute(self, rows, req, milli, e) -> None:
        """Fill entry e (snap, value, gpu, delta) for ``rows`` where the request fits. A node's
        GPU and fragmentation decrease are a function of its row (``FragModel.row_key``) and of
        the request's milli on it: with ``rows_kept``, a few rows are looked up among those
        already worked out for the request (e[5]). The node values are then worked out for the
        rows together, as before: numpy's ``exp`` may round an element differently by where it
        falls in the array, and a value rounded the other way can tip a truncation."""
        if (not self.rows_kept or len(rows) > FEW_ROWS
                or (req.gpu_memory and req.num_gpus > 1)):  # (which way a batch of several
            self._derive(rows, req, milli, e)  # memory-sized GPUs is worked out follows its first row)
            return
        fm, gpu, delta = self.model, e[3], e[4]

        def restore(n: int, kept: tuple) -> None:
            gpu[n], delta[n] = kept
        look_up(rows, e[5], KEPT_CHOICES, lambda n: (fm.row_key(n), int(milli[n])), restore,
                lambda at: self._derive(at, req, milli, e), lambda n: (gpu[n], delta[n]))
        e[2][rows] = self.node_value(delta[rows])
        e[1][rows] = fm.version[rows]

    def _derive(self, rows, req, milli, e) -> None:
        fm = self.model
        if req.num_gpus == 1:  # one GPU (share or whole): evaluate each GPU with room
            free = fm.gpu[rows]
            mr = milli[rows]
            fits = free >= mr[:, None]
            # identical free values on one node score identically: evaluate the first of each
            G = free.shape[1]
            dup = ((free[:, :, None] == free[:, None, :]) & np.tri(G, G, -1, dtype=bool)[None]).any(axis=2)
            ri, gi = np.nonzero(fits & ~dup)
            cand_rows = rows[ri]
            after = fm.after_share(cand_rows, gi, mr[ri], req.cpu_milli, req.memory, rows, ri)
            delta = fm.F[cand_rows] - after
            val = np.full(free.shape, -np.inf)
            val[ri, gi] = self.share_value(delta, free[ri, gi], mr[ri])
            # copy values to duplicate GPUs is unnecessary: argmax picks the first occurrence
            best = val.argmax(axis=1)
            dmat = np.full(free.shape, -np.inf)
            dmat[ri, gi] = delta
            e[3][rows] = best
            e[4][rows] = dmat[np.arange(len(rows)), best]
        elif req.num_gpus <= 0 or milli[rows[0]] >= MILLI:  # CPU only, or whole GPUs
            k = max(req.num_gpus, 0)
            after = fm.after_whole(rows, k, req.cpu_milli, req.memory)
            e[4][rows] = fm.F[rows] - after
            e[3][rows] = -1
        else:  # several fractional GPUs (not produced by the scheduler today): tightest k GPUs
            free = fm.gpu[rows].copy()
            for i, n in enumerate(rows):
                for g in _tightest_gpus(free[i], int(milli[n]), req.num_gpus):
                    free[i, g] -= milli[n]
            after = fm.after_rows(rows, free, req.cpu_milli, req.memory)
            e[4][rows] = fm.F[rows] - after
            e[3][rows] = -1
        e[2][rows] = self.node_value(e[4][rows])
        e[1][rows] = fm.version[rows]

    def choose(self, state, req, mask=None):
        if self.model is None:
            return self.fallback.choose(state, req, mask)
        ok, milli = feasible(state, req, mask)
        idx = np.flatnonzero(ok)
        if not idx.size:
            return None
        fm = self.model
        fm.sync(state)
        e = self._entry(req)
        stale = idx[e[1][idx] != fm.version[idx]]
        if stale.size:
            self._compute(stale, req, milli, e)
        n = self._select(state, req, idx, milli, e)
        m = int(milli[n]) if req.num_gpus else 0
        if req.num_gpus == 1:
            return n, (int(e[3][n]),), m
        return n, _gpus_for(state, n, req, m), m

    def _select(self, state, req, idx, milli, e) -> int:
        raise NotImplementedError


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class FGD(_FragPolicy):
    """Fragmentation Gradient Descent as the paper's simulator scores it: for every node (and, for
    a share, every GPU with room) ``int(100 * sigmoid((frag_before - frag_after) / 1000))``; the
    GPU is the first one with the best score, the node the best score, ties to the lowest random
    rank (see _TieOrder)."""

    name = "fgd"

    def __init__(self, shapes=(), seed: int = 0):
        super().__init__(top_shapes(shapes, 0.95) if shapes else (), seed)

    def share_value(self, delta, free, milli):
        return np.trunc(_sigmoid(delta / 1000.0) * 100.0)

    def node_value(self, delta):
        return np.trunc(_sigmoid(delta / 1000.0) * 100.0)

    def _select(self, state, req, idx, milli, e):
        return _pick_max(e[2][idx], idx, self.ties.get(state))


class DefaultPlacement(_FragPolicy):
    """The live scheduler's policy: FGD with memory-aware fragmentation plus each GPU's expected
    waste (``waste_weight``, see ``fragmentation.waste_table``), scored in the paper's coarse
    buckets; GPU pods steer clear of GPU models that model-constrained shapes oversubscribe; ties
    to nodes already in use and then a fixed node order; within a node the exact fragmentation
    decrease picks the GPU (then the tightest). See docs/placement.md."""

    name = "default"
    use_memory = True
    rows_kept = True  # (``share_value`` is a difference)
    threshold = 0.95  # the most frequent shapes covering this share of pods
    route = True  # keep GPU models that model-constrained pods need for those pods
    pressure_slack = 3  # score points a GPU pod gives up to avoid a contested GPU model ...
    pressure_limit = 1.0  # ... when a candidate's model is oversubscribed this much

    cpu_tight = (0.9, 1.0)  # CPU demand/supply ratio where stranded GPU capacity rises from the floor / fully counts
    cpu_floor = 0.1  # weight of stranded GPU capacity while CPU is plentiful cluster-wide
    # weight of each GPU's expected waste (FragModel.waste_weight) while CPU is plentiful and shares
    # are a small part of the GPU demand. Default trace, seeds 42-44: 8 / 12 / 20 gave 95.89 / 96.05
    # / 96.03; seeds 42-51: 12 / 14 / 16 gave 96.02 / 95.95 / 96.00 (docs/placement.md)
    waste_weight = 12.0
    # part of the GPU demand (milli) asked in GPU shares where the expected-waste weight starts to
    # fade / is 0 (the default trace's shapes: 0.31, gpushare40: 0.43). On share-heavy workloads the
    # term moved gpushare40 / gpushare80 by -0.35 to +0.17 points, either way as the weight changed
    share_fade = (0.32, 0.42)

    def __init__(self, shapes=(), seed: int = 0):
        super().__init__(top_shapes(shapes, self.threshold) if shapes else (), seed)
        self._pressure_ref = None
        self._pressure_top = 0.0  # the highest pressure of any node (see _pressure)
        self._beta_nodes = None  # the nodes the stranded-capacity weight was worked out for
        if self.model is not None:
            self.model.measure = "hybrid"
            self.model.beta = 0.0

    def _weights(self, state) -> tuple[float, float]:
        """(stranded-capacity weight, expected-waste weight) for these nodes; see ``_cpu_beta``.
        The expected waste looks at GPU remainders alone, so it fades out as CPU gets as scarce as
        GPUs (``waste_weight`` x (1 - the ramp of ``cpu_tight``)): there the stranded capacity
        counts fully and decides (cpu250: 0.4 points lower with the full weight, unchanged with it faded).
        It also fades as GPU shares ask for more of the GPU demand (``share_fade``, see
        ``_share_fraction``): 0 on share-heavy workloads, where it helped on some and hurt on others."""
        beta, tight = self._cpu_beta(state)
        lo, hi = self.share_fade
        fade = float(np.clip((hi - self._share_fraction()) / (hi - lo), 0.0, 1.0))
        return beta, self.waste_weight * (1.0 - tight) * fade

    def _gpu_demand(self) -> float:
        """The shapes' GPU milli per pod, weighted by frequency (a memory-sized share as a whole GPU)."""
        return sum(w * max(r.num_gpus, 0) * (r.milli or MILLI) for r, w, _ in self.model.shapes)

    def _share_fraction(self) -> float:
        """The share of the shapes' GPU demand (milli) asked in GPU shares (less than one GPU,
        or sized by GPU memory); 0 without GPU shapes."""
        g = self._gpu_demand()
        s = sum(w * (r.milli or MILLI) for r, w, _ in self.model.shapes
                if r.num_gpus == 1 and (0 < r.milli < MILLI or r.gpu_memory > 0))
        return s / g if g > 0 else 0.0

    def _cpu_beta(self, state) -> tuple[float, float]:
        """How much GPU capacity stranded by CPU/memory counts as fragment: a floor while the
        workload's CPU per GPU is well below the cluster's, rising to 1 when CPU is as scarce as
        GPUs; 0 when no node tracks CPU. Returned with how tight CPU is (the same ramp, 0 to 1,
        without the floor).

        The floor (``cpu_floor``, 0.1): even where CPU is plentiful overall, a node whose CPU runs
        out strands its GPUs' remainders (CPU-hungry shares on CPU-poor nodes); a tenth of that
        steers such shares to CPU-rich nodes without outweighing the GPU fragments. It shrinks
        as a GPU model gets contested by model-constrained shapes (times 1 - the highest
        pressure, see ``_pressure``): steering by CPU would draw unconstrained pods onto a
        CPU-rich model that pinned pods need."""
        tracked = state.cpu_total < _UNTRACKED
        gcap = float(state.num_gpus[tracked].sum()) * MILLI
        ccap = float(state.cpu_total[tracked].sum())
        g = self._gpu_demand()
        c = sum(w * r.cpu_milli for r, w, _ in self.model.shapes)
        if gcap <= 0 or ccap <= 0 or g <= 0:
            return 0.0, 0.0
        lo, hi = self.cpu_tight
        ramp = ((c / g) / (ccap / gcap) - lo) / (hi - lo)
        floor = self.cpu_floor * max(0.0, 1.0 - float(self._model_pressure(state).max(initial=0.0)))
        beta = float(np.clip(ramp, floor, 1.0))
        return beta, float(np.clip(ramp, 0.0, 1.0))

    def choose(self, state, req, mask=None):
        if self.model is not None and state.nodes is not self._beta_nodes:
            # the weight depends on the nodes and the shapes alone: once per node list (a choose
            # that finds no node never binds the tables to the nodes)
            self._beta_nodes = state.nodes
            beta, waste = self._weights(state)
            if beta != self.model.beta or waste != self.model.waste_weight:
                self.model.beta, self.model.waste_weight = beta, waste
                self.model._sig = None  # re-derive every node's tables with the new weights
        return super().choose(state, req, mask)

    def _fallback(self, seed):
        return NormalisedBestFit()

    def _pressure(self, state) -> np.ndarray:
        """Per node: how oversubscribed its GPU model is by model-constrained shapes -- their share
        of all GPU demand that must land on this model (spread over the models each allows, by
        capacity), divided by the model's share of GPU capacity. 0: no constrained shape may use
        it; above 1: constrained pods alone would fill it."""
        if self._pressure_ref is self.model.m:  # tables rebuilt whenever the node set changes
            return self._pressure_val
        rho = self._model_pressure(state)
        self._pressure_ref, self._pressure_val = self.model.m, rho[state.model_id] if len(state.nodes) else np.zeros(0)
        self._pressure_top = float(self._pressure_val.max(initial=0.0))
        return self._pressure_val

    def _model_pressure(self, state) -> np.ndarray:
        """The pressure (see ``_pressure``) of each GPU model in ``state.models``."""
        cap = np.array([state.num_gpus[state.model_id == i].sum() * MILLI for i in range(len(state.models))],
                       dtype=np.float64)
        demand = self._gpu_demand()
        d = np.zeros(len(state.models))
        for req, w, models in self.model.shapes:
            if not models or req.num_gpus <= 0:
                continue
            allowed = np.array([m in models for m in state.models])
            c = cap[allowed].sum()
            if c > 0:
                d[allowed] += w * req.num_gpus * (req.milli or MILLI) / demand * cap[allowed] / c
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(cap > 0, d / (cap / max(cap.sum(), 1.0)), 0.0) if demand > 0 else np.zeros(len(cap))

    def share_value(self, delta, free, milli):
        return delta - 1e-9 * free  # exact decrease; among equals the tightest GPU

    def node_value(self, delta):
        return np.trunc(_sigmoid(delta / 1000.0) * 100.0)

    def _select(self, state, req, idx, milli, e):
        val = e[2][idx]
        route = self.route and req.num_gpus > 0
        slack = 0
        if route:
            rho = self._pressure(state)
            # a contested model is among the candidates (none is where no node's model is)
            if self._pressure_top >= self.pressure_limit and rho[idx].max() >= self.pressure_limit:
                slack = self.pressure_slack
        cand = idx[val >= val.max() - slack]
        if route and cand.size > 1:
            pr = rho[cand]
            cand = cand[pr <= pr.min() + 1e-12]
            v2 = e[2][cand]
            cand = cand[v2 == v2.max()]
        if cand.size == 1:
            return int(cand[0])
        # consolidate: nodes already in use first, then a fixed (seeded) node order
        unused = (state.gpu_summary()[2][cand] == state.num_gpus[cand] * MILLI) & \
                 (state.cpu_free[cand] == state.cpu_total[cand]) & (state.mem_free[cand] == state.mem_total[cand])
        key = unused.astype(np.int64) * (1 << 40) + self.ties.get(state)[cand]
        return int(cand[np.argmin(key)])


def _packing_score(state: ClusterState, req: PodRequest, cand: np.ndarray, milli: np.ndarray) -> np.ndarray:
    """Higher = leaves less free capacity behind, relative to each node's own size (so untracked
    or huge CPU/memory never dominates): GPU first, then CPU and memory."""
    ncap = np.maximum(state.num_gpus[cand], 1) * MILLI
    gpu_after = (state.gpu_free[cand].sum(axis=1) - req.num_gpus * milli[cand]) / ncap
    cpu_t, mem_t = state.cpu_total[cand], state.mem_total[cand]
    cpu_after = np.where(cpu_t < _UNTRACKED, (state.cpu_free[cand] - req.cpu_milli) / np.maximum(cpu_t, 1), 0.0)
    mem_after = np.where(mem_t < _UNTRACKED, (state.mem_free[cand] - req.memory) / np.maximum(mem_t, 1), 0.0)
    return -(gpu_after + 0.5 * cpu_after + 0.25 * mem_after)




class NormalisedBestFit:
    """Best fit without workload knowledge: the node (and GPU) left with the least free capacity,
    each resource relative to that node's size; ties to the lowest index (deterministic)."""

    name = "bestfit-normalised"

    def choose(self, state, req, mask=None):
        ok, milli = feasible(state, req, mask)
        idx = np.flatnonzero(ok)
        if not idx.size:
            return None
        n = int(idx[np.argmax(_packing_score(state, req, idx, milli))])
        m = int(milli[n]) if req.num_gpus else 0
        return n, _gpus_for(state, n, req, m), m


POLICIES = ("default", "fgd", "bestfit", "random", "firstfit")

_CLASSES = {"default": DefaultPlacement, "fgd": FGD, "bestfit": BestFit, "random": RandomFit,
            "firstfit": FirstFit}


def make_policy(name: str = "default", shapes: Sequence = (), seed: int = 0):
    if name not in POLICIES:
        raise ValueError(f"unknown placement policy {name!r} (choose from {', '.join(POLICIES)})")
    return _CLASSES[name](shapes=shapes, seed=seed)
