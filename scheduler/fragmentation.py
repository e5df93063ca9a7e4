"""Expected GPU fragmentation of nodes, measured against a workload's typical pod shapes.

This is the measure behind Fragmentation Gradient Descent (FGD; Weng et al., "Beware of
Fragmentation", USENIX ATC 2023). For one node and one typical shape *s* (GPUs per pod, milli per
GPU, CPU, memory, allowed GPU models), the node's free GPU milli that *s* cannot use is:

* all of it, if *s* cannot run on the node at all (wrong GPU model, too few GPUs with enough free
  milli, not enough free CPU -- or, with ``use_memory``, memory), or if *s* needs no GPU;
* otherwise the free milli sitting on GPUs that have less free than *s* needs per GPU;
* with ``measure="hybrid"`` (used by the ``default`` policy), plus ``beta`` x the GPU capacity that
  CPU or memory strands: if the GPUs have room for 8 pods of *s* but the CPU for 3, the other 5
  pods' GPU milli counts too.

The node's fragmentation is the weighted sum over shapes (weights = how often each shape arrives).
With ``waste_weight`` > 0 it also counts, ``waste_weight`` times, each GPU's *expected waste*: the
free milli the workload is expected never to fill, looking past the next pod (see ``waste_table``).
A placement policy places a pod where this sum grows least. Everything is vectorised over nodes
with numpy and kept incrementally: ``sync(state)`` re-derives only the nodes whose free capacity
changed since the last call, so a policy can score thousands of pods per second. A node's row is
a function of its free capacity and of what the node is (its shapes' per-GPU demand and access,
its waste table: ``node_class``); a few rows at a time are looked up among the rows already
worked out for a node of its class in the same state (a filling cluster passes through a few
hundred distinct states, thousands of times), and the rest worked out as before.

Pure: numpy only, no I/O, no clock.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .cluster import ClusterState, PodRequest
from .model import MILLI

_NEVER = MILLI + 1  # a per-GPU demand no GPU can meet
_UNBOUNDED = np.iinfo(np.int64).max // 4  # pods a node has room for when a shape asks no CPU/memory
FEW_ROWS = 64  # at most this many rows re-derived at once are looked up one by one (see ``_refresh``)
KEPT_ROWS = 20_000  # rows a model keeps for lookups before it starts afresh (a few MB; a filling
# cluster of 4,000 nodes passes through a few hundred)
KEPT_CHOICES = 4_096  # per request, the nodes' best GPU and decrease a policy keeps the same way
WASTE_RELIABLE = 0.02  # a GPU size class at least this frequent (share of pods) is counted on to arrive


def waste_table(classes: Sequence[tuple[int, float]], reliable: float = WASTE_RELIABLE) -> np.ndarray:
    """Expected waste ``W[r]`` of a GPU with ``r`` (0..1000) milli free, for pods of the given
    ``(milli per GPU, frequency)`` classes (whole GPUs: 1000).

    ``W[r] = min(r, min over classes c with milli_c <= r of (1 - a_c) * r + a_c * W[r - milli_c])``
    where ``a_c = min(1, frequency_c / reliable)`` is how surely class c arrives to fill it. So a
    remainder a frequent share fits costs what that share would leave (530 free, 0.47-GPU shares
    common: 60), one only rare shares fit costs most of itself (0.19 after a 0.81 share), a fully
    free GPU nothing while whole-GPU pods are common. FGD's own measure looks one pod ahead and
    prefers 0.53 -> 0.21 (a 0.32 share on a GPU beside a 0.47) to 1.0 -> 0.68; this table sees that
    the 0.53 would have taken another 0.47 and the 0.68 a 0.65."""
    W = np.arange(MILLI + 1, dtype=np.float64)
    cls = [(int(m), min(1.0, float(f) / reliable)) for m, f in classes if 0 < m <= MILLI and f > 0]
    if not cls:
        return W
    step = min(m for m, _ in cls)  # W[r] needs W[r - m] only, m >= step: fill in blocks of step
    for start in range(step, MILLI + 1, step):
        r = np.arange(start, min(start + step, MILLI + 1))
        best = r.astype(np.float64)
        for m, a in cls:
            fits = r >= m
            rr = r[fits]
            best[fits] = np.minimum(best[fits], (1 - a) * rr + a * W[rr - m])
        W[r] = best
    return W


def normalise_shapes(shapes: Sequence) -> list[tuple[PodRequest, float, tuple[str, ...] | None]]:
    """Accept ``(PodRequest, weight)`` or ``(PodRequest, weight, models)`` entries (``models``: the
    GPU models the shape may run on; None or empty = any). Drops non-positive weights and
    normalises the weights to sum to 1."""
    out = []
    for entry in shapes:
        if len(entry) == 2:
            req, w = entry
            models = None
        elif len(entry) == 3:
            req, w, models = entry
            models = tuple(models) if models else None
        else:
            raise ValueError("each shape must be (PodRequest, weight) or (PodRequest, weight, models)")
        if not isinstance(req, PodRequest):
            raise TypeError(f"shape {entry!r}: first item must be a PodRequest")
        w = float(w)
        if w > 0 and np.isfinite(w):
            out.append((req, w, models))
    total = sum(w for _, w, _ in out)
    return [(r, w / total, m) for r, w, m in out] if total > 0 else []


def per_gpu_milli(state: ClusterState, req: PodRequest) -> np.ndarray:
    """The per-GPU milli ``req`` needs on every node (memory-sized shares differ per node); a value
    above 1000 means it cannot fit there. CPU-only requests need 0."""
    n = len(state.nodes)
    if req.num_gpus <= 0:
        return np.zeros(n, dtype=np.int64)
    if req.gpu_memory > 0:
        mem = state.gpu_mem
        with np.errstate(divide="ignore"):
            m = np.where(mem > 0, -(-req.gpu_memory * MILLI // np.maximum(mem, 1)), _NEVER)
        return np.maximum(m, 1).astype(np.int64)
    milli = req.milli if req.milli > 0 else MILLI
    return np.full(n, milli, dtype=np.int64)


def look_up(rows: np.ndarray, kept: dict, bound: int, key_of: Callable[[int], tuple],
            restore: Callable[[int, tuple], None], derive: Callable[[np.ndarray], None],
            keep: Callable[[int], tuple]) -> None:
    """Fill in ``rows``: those whose key (``key_of``) is in ``kept`` from there (``restore``), the
    others worked out together (``derive``) and then kept (``keep``: what is kept of a row);
    ``kept`` starts afresh once it holds more than ``bound``."""
    if len(kept) > bound:
        kept.clear()
    missed, keys = [], []
    for n in rows.tolist():
        key = key_of(n)
        hit = kept.get(key)
        if hit is None:
            missed.append(n)
            keys.append(key)
        else:
            restore(n, hit)
    if missed:
        derive(np.array(missed, dtype=np.int64))
        for n, key in zip(missed, keys):
            kept[key] = keep(n)


class FragModel:
    """Per-node fragmentation tables for one set of shapes, kept in step with a ClusterState.

    After ``sync(state)``: ``F[n]`` is node n's weighted fragmentation (milli-GPU), ``cnt[n, s]`` the
    number of its GPUs that can host one GPU of shape s, ``small[n, s]`` the free milli on the other
    GPUs, ``tot[n]`` its free milli, and ``version[n]`` changes whenever node n's row changed.
    """

    def __init__(self, shapes: Sequence, use_memory: bool = False, measure: str = "fgd", beta: float = 1.0,
                 waste_weight: float = 0.0):
        self.shapes = normalise_shapes(shapes)
        self.use_memory = use_memory
        self.measure = measure
        self.beta = beta  # weight of GPU capacity stranded by CPU/memory (measure="hybrid")
        self.waste_weight = waste_weight  # weight of each GPU's expected waste (see waste_table)
        S = len(self.shapes)
        self.w = np.array([w for _, w, _ in self.shapes], dtype=np.float64)
        self.k = np.array([r.num_gpus for r, _, _ in self.shapes], dtype=np.int64)
        self.c = np.array([r.cpu_milli for r, _, _ in self.shapes], dtype=np.int64)
        self.mem = np.array([r.memory for r, _, _ in self.shapes], dtype=np.int64)
        self.cpu_only = self.k <= 0
        # constants of the hybrid measure (few numpy calls per evaluation: most are on a few rows)
        self._k1 = np.maximum(self.k, 1)
        self._multi = bool((self.k > 1).any())
        self._cdiv, self._mdiv = np.maximum(self.c, 1), np.maximum(self.mem, 1)
        self._cfree = self.c <= 0 if (self.c <= 0).any() else None  # shapes asking no CPU
        self._mfree = self.mem <= 0 if (self.mem <= 0).any() else None  # ... no memory
        self.S = S
        self._tick = 0
        self._nodes_ref = None
        self._sig = None

    # -- binding to a cluster -------------------------------------------------------------------
    def _signature(self, state: ClusterState):
        return (tuple(nd.name for nd in state.nodes), tuple(state.models), state.gpu_free.shape,
                state.num_gpus.tobytes(), state.gpu_mem.tobytes())

    def _bind(self, state: ClusterState) -> None:
        N = len(state.nodes)
        self._hyb = self.measure == "hybrid" and self.beta > 0  # fixed until the next bind
        self._nodes_ref = state.nodes
        self._sig = self._signature(state)
        # per-node per-shape milli demand and GPU-model access
        self.m = np.empty((N, self.S), dtype=np.int64)
        for s, (req, _, _) in enumerate(self.shapes):
            self.m[:, s] = per_gpu_milli(state, req)
        self.km = self.m * self._k1  # milli per pod of each shape on each node
        acc_models = np.ones((len(state.models), self.S), dtype=bool)
        for s, (_, _, models) in enumerate(self.shapes):
            if models:
                acc_models[:, s] = [mdl in models for mdl in state.models]
        self.access = acc_models[state.model_id] if N else np.zeros((0, self.S), bool)
        self._gpu_access = self.access & ~self.cpu_only
        self._bw = self.beta * self.w
        self._bind_waste(state.gpu_mem)
        # what a node is, for the rows' values: its shapes' per-GPU demand and access, its waste
        # table (nodes of one class in the same free state have the same row)
        parts = [self.m, self.access.astype(np.int64)]
        if self._waste:
            parts.append(self._wid.reshape(-1, 1))
        if N:
            # (each row's bytes as one value: a label per distinct row, an order of no meaning;
            # ``np.unique(..., axis=0)`` gives the same classes ten times slower)
            rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
            flat = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
            self.node_class = np.unique(flat, return_inverse=True)[1].reshape(-1).tolist()
        else:
            self.node_class = []
        self._rows: dict[tuple, tuple] = {}  # (class, free GPU row, CPU, memory) -> its row's values
        self.gpu = state.gpu_free.copy()
        self.cpu = state.cpu_free.copy()
        self.memf = state.mem_free.copy()
        self.tot = np.zeros(N, dtype=np.int64)
        self.cnt = np.zeros((N, self.S), dtype=np.int64)
        self.small = np.zeros((N, self.S), dtype=np.int64)
        self.slots = np.zeros((N, self.S), dtype=np.int64)
        self.F = np.zeros(N, dtype=np.float64)
        self.wsum = np.zeros(N, dtype=np.float64)
        self.version = np.zeros(N, dtype=np.int64)
        self._refresh(np.arange(N))
        self._tick += 1
        self.version[:] = self._tick

    def _bind_waste(self, gpu_mem: np.ndarray) -> None:
        """Expected-waste tables (``waste_table``): one, or with memory-sized shares one per GPU
        memory size (their per-GPU milli differs by it); ``_wid[n]`` names node n's table. The
        tables count every GPU shape whatever GPU models it may use: per-model tables (a model's
        remainders filled only by the shapes allowed on it) make a model that pinned shapes avoid
        look more wasteful and draw unconstrained pods onto the contested model (gpuspec25: 4.8
        points lower). A node whose free CPU (or memory) is below what every GPU shape asks wastes
        all its free GPU milli."""
        self._waste = self.waste_weight > 0 and bool((~self.cpu_only).any()) and len(self.m) > 0
        if not self._waste:
            return
        g = ~self.cpu_only
        N = len(self.m)
        if any(r.gpu_memory > 0 for r, _, _ in self.shapes):  # per-GPU milli follows GPU memory
            _, first, self._wid = np.unique(gpu_mem, return_index=True, return_inverse=True)
            rows = self.m[first][:, g]
        else:
            self._wid = np.zeros(N, dtype=np.int64)
            rows = self.m[:1, g]
        self._wid = self._wid.reshape(-1)
        wg = self.w[g]
        tables = []
        for row in rows:
            cls: dict = {}
            for m, w in zip(row, wg):
                if m <= MILLI:
                    cls[int(m)] = cls.get(int(m), 0.0) + float(w)
            tables.append(waste_table(sorted(cls.items())))
        self._wt = np.array(tables)
        self._wc = int(self.c[g].min())
        self._wm = int(self.mem[g].min())

    def _waste_of(self, wsum, tot, cpu, mem):
        """``waste_weight`` x the expected waste of some nodes (their GPUs' table values summed in
        ``wsum``), or x all their free milli ``tot`` where CPU/memory is too short for any GPU pod."""
        blocked = cpu < self._wc
        if self.use_memory:
            blocked |= mem < self._wm
        return self.waste_weight * (np.where(blocked, tot, wsum) if blocked.any() else wsum)

    def sync(self, state: ClusterState) -> None:
        """Bring the tables in step with ``state`` (cheap when little changed): the state's
        change log names the touched rows; a state not seen before is compared in full."""
        if state.nodes is not self._nodes_ref:
            if self._sig is None or self._signature(state) != self._sig:
                self._bind(state)
                self._log_ref, self._log_pos = state.log, len(state.log)
                return
            self._nodes_ref = state.nodes
        if getattr(self, "_log_ref", None) is state.log:
            touched = state.log[self._log_pos:]
            self._log_pos = len(state.log)
            if not touched:
                return
            # (a bind or a hold touches a node or two: a set of a few is cheaper than np.unique)
            cand = (np.array(sorted(set(touched)), dtype=np.int64) if len(touched) <= 32
                    else np.unique(np.asarray(touched, dtype=np.int64)))
            changed = (self.gpu[cand] != state.gpu_free[cand]).any(axis=1)
            changed |= self.cpu[cand] != state.cpu_free[cand]
            changed |= self.memf[cand] != state.mem_free[cand]
            rows = cand[changed]
        else:
            changed = (self.gpu != state.gpu_free).any(axis=1)
            changed |= self.cpu != state.cpu_free
            changed |= self.memf != state.mem_free
            rows = np.flatnonzero(changed)
            self._log_ref, self._log_pos = state.log, len(state.log)
        if rows.size:
            self.gpu[rows] = state.gpu_free[rows]
            self.cpu[rows] = state.cpu_free[rows]
            self.memf[rows] = state.mem_free[rows]
            self._refresh(rows)
            self._tick += 1
            self.version[rows] = self._tick

    def row_key(self, n: int) -> tuple:
        """What node ``n``'s row is a function of: its class and its free GPUs, CPU and memory."""
        return self.node_class[n], self.gpu[n].tobytes(), int(self.cpu[n]), int(self.memf[n])

    def _refresh(self, rows: np.ndarray) -> None:
        if len(rows) > FEW_ROWS:
            self._derive(rows)
        else:
            look_up(rows, self._rows, KEPT_ROWS, self.row_key, self._restore, self._derive, self._kept)

    def _kept(self, n: int) -> tuple:
        return self.tot[n], self.cnt[n].copy(), self.small[n].copy(), self.slots[n].copy(), self.F[n], self.wsum[n]

    def _restore(self, n: int, kept: tuple) -> None:
        self.tot[n], self.cnt[n], self.small[n], self.slots[n], self.F[n], self.wsum[n] = kept

    def _derive(self, rows: np.ndarray) -> None:
        tot, cnt, small, slots, F, wsum = self.rows_frag(rows, self.gpu[rows], self.cpu[rows], self.memf[rows])
        self.tot[rows] = tot
        self.cnt[rows] = cnt
        self.small[rows] = small
        self.slots[rows] = slots
        self.F[rows] = F
        if self._waste:
            self.wsum[rows] = wsum

    # -- evaluation ------------------------------------------------------------------------------
    def rows_frag(self, rows, free, cpu, mem):
        """Fragmentation of hypothetical node rows: ``free`` (r x G) GPU milli, ``cpu``/``mem``
        free on nodes ``rows`` (their model and GPU kind decide the per-shape demand/access).
        Returns (tot, cnt, small, slots, F, wsum); ``wsum`` (the GPUs' expected waste summed) is
        None without the expected-waste term."""
        m = self.m[rows]  # r x S
        ge = free[:, None, :] >= m[:, :, None]  # r x S x G (missing GPUs have free 0 < m)
        tot = free.sum(axis=1)
        cnt = ge.sum(axis=2)
        small = tot[:, None] - (free[:, None, :] * ge).sum(axis=2)
        slots = (free[:, None, :] // np.maximum(m, 1)[:, :, None]).sum(axis=2) if self._hyb else cnt
        F = self._combine(rows, tot, cnt, small, cpu, mem, slots)
        wsum = None
        if self._waste:
            wsum = self._wt[self._wid[rows][:, None], free].sum(axis=1)
            F = F + self._waste_of(wsum, tot, cpu, mem)
        return tot, cnt, small, slots, F, wsum

    def _room(self, cpu, mem):
        """Pods of each shape that free ``cpu`` / ``mem`` (per row) leave room for; shapes that
        ask for neither are unbounded (``_UNBOUNDED``)."""
        q = cpu[:, None] // self._cdiv
        if self._cfree is not None:
            q[:, self._cfree] = _UNBOUNDED
        if self.use_memory:
            qm = mem[:, None] // self._mdiv
            if self._mfree is not None:
                qm[:, self._mfree] = _UNBOUNDED
            np.minimum(q, qm, out=q)
        return q

    def _combine(self, rows, tot, cnt, small, cpu, mem, slots=None, room=None):
        if self._hyb:
            # FGD's GPU fragments, plus GPU capacity that CPU or memory leaves stranded
            qg = slots // self._k1 if self._multi else slots
            q = np.minimum(qg, self._room(cpu, mem) if room is None else room)
            ok = self._gpu_access[rows] & (q >= 1)
            stranded = (qg - q) * self.km[rows] * ok  # GPU milli the shape's pods cannot use
            return np.where(ok, small, tot[:, None]) @ self.w + stranded @ self._bw
        ok = self.access[rows] & (cnt >= self.k) & (cpu[:, None] >= self.c)
        if self.use_memory:
            ok &= mem[:, None] >= self.mem
        frag = np.where(ok & ~self.cpu_only, small, tot[:, None])
        return frag @ self.w

    def after_share(self, rows, gpus, milli, cpu_milli, memory, nodes=None, of=None):
        """Fragmentation of nodes ``rows`` after one share of ``milli[i]`` on GPU ``gpus[i]``.
        With several GPUs per node, pass ``nodes`` (distinct) and ``of`` (``rows == nodes[of]``):
        the CPU/memory part is then worked out once per node."""
        f = self.gpu[rows, gpus][:, None]
        f2 = f - milli[:, None]
        m = self.m[rows]
        cnt = self.cnt[rows] - (f >= m) + (f2 >= m)
        small = self.small[rows] - np.where(f < m, f, 0) + np.where(f2 < m, f2, 0)
        tot = self.tot[rows] - milli
        slots = None
        if self._hyb:
            mm = np.maximum(m, 1)
            slots = self.slots[rows] - f // mm + f2 // mm
            if nodes is not None:
                room = self._room(self.cpu[nodes] - cpu_milli, self.memf[nodes] - memory)[of]
                out = self._combine(rows, tot, cnt, small, None, None, slots, room)
                return self._share_waste(out, rows, f, f2, tot, cpu_milli, memory)
        out = self._combine(rows, tot, cnt, small, self.cpu[rows] - cpu_milli, self.memf[rows] - memory, slots)
        return self._share_waste(out, rows, f, f2, tot, cpu_milli, memory)

    def _share_waste(self, out, rows, f, f2, tot, cpu_milli, memory):
        if not self._waste:
            return out
        wid = self._wid[rows]
        wsum = self.wsum[rows] - self._wt[wid, f[:, 0]] + self._wt[wid, f2[:, 0]]
        return out + self._waste_of(wsum, tot, self.cpu[rows] - cpu_milli, self.memf[rows] - memory)

    def after_whole(self, rows, k, cpu_milli, memory):
        """Fragmentation of nodes ``rows`` after taking ``k`` fully free GPUs (k may be 0: CPU only)."""
        m = self.m[rows]
        cnt = self.cnt[rows] - k * ((m >= 1) & (m <= MILLI))  # full GPUs stop counting
        small = self.small[rows] - k * MILLI * (m > MILLI)  # free 1000 -> 0 is 'small' for m >= 1
        tot = self.tot[rows] - k * MILLI
        slots = None
        if self._hyb:
            slots = self.slots[rows] - k * (MILLI // np.maximum(m, 1))
        out = self._combine(rows, tot, cnt, small, self.cpu[rows] - cpu_milli, self.memf[rows] - memory, slots)
        if self._waste:
            wid = self._wid[rows]
            wsum = self.wsum[rows] - k * (self._wt[wid, MILLI] - self._wt[wid, 0])
            out = out + self._waste_of(wsum, tot, self.cpu[rows] - cpu_milli, self.memf[rows] - memory)
        return out

    def after_rows(self, rows, free, cpu_milli, memory):
        """Fragmentation of nodes ``rows`` with explicit new GPU rows ``free`` (general case)."""
        return self.rows_frag(rows, free, self.cpu[rows] - cpu_milli, self.memf[rows] - memory)[4]
