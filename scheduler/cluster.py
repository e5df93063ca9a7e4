"""Free capacity of the cluster as numpy arrays: what placement policies score and actions mutate.

One ``ClusterState`` is built per scheduling cycle from the snapshot (and per trace-fill run in
the simulator), so the live scheduler and the placement benchmark run the very same placement
code. Units: GPU shares in milli-GPU (1000 = one whole GPU), CPU in milli-cores, memory in bytes.
Untracked CPU/memory (a node that declares none) is modelled as an effectively infinite amount.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .model import MILLI, NodeSpec, PodPlacement, Workload

UNTRACKED = np.int64(2**60)


@dataclass(frozen=True)
class PodRequest:
    """What one pod asks for. ``num_gpus`` whole GPUs (``milli`` = 1000), or one GPU share
    (``num_gpus`` = 1, ``milli`` < 1000), or a share sized by memory (``gpu_memory`` bytes > 0,
    converted to milli per node from that node's GPU memory). ``num_gpus`` = 0: CPU only."""

    num_gpus: int = 0
    milli: int = 0
    gpu_memory: int = 0
    cpu_milli: int = 0
    memory: int = 0

    @property
    def shape(self) -> tuple:
        return (self.num_gpus, self.milli, self.gpu_memory, self.cpu_milli, self.memory)

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpus * self.milli

    @staticmethod
    def for_workload(w: Workload) -> "PodRequest":
        cpu = int(round(w.cpu * MILLI))
        if w.gpu_memory > 0:
            return PodRequest(1, 0, w.gpu_memory, cpu, w.memory)
        if w.gpus <= 0:
            return PodRequest(0, 0, 0, cpu, w.memory)
        if w.gpus < 1:
            return PodRequest(1, int(round(w.gpus * MILLI)), 0, cpu, w.memory)
        return PodRequest(int(w.gpus), MILLI, 0, cpu, w.memory)


class ClusterState:
    """Mutable free capacity. ``gpu_free[n, g]`` is the free milli of GPU g on node n; GPUs a node
    does not have are masked out by ``gpu_exists`` (their free value is 0)."""

    def __init__(self, nodes: Sequence[NodeSpec], reserve: float = 0.0, reserve_min: int = 0):
        self.nodes = list(nodes)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        n = len(self.nodes)
        g = max((nd.gpus for nd in self.nodes), default=0) or 1
        self.num_gpus = np.array([nd.gpus for nd in self.nodes], dtype=np.int64)
        self.gpu_exists = np.arange(g)[None, :] < self.num_gpus[:, None] if n else np.zeros((0, g), bool)
        self.gpu_free = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        # usable memory per GPU: what the driver reserves (``reserve`` of it, at least ``reserve_min``
        # bytes) is left out, so memory-sized shares are sized against what a job can really get
        total = np.array([nd.gpu_memory for nd in self.nodes], dtype=np.int64)
        kept = np.maximum(np.ceil(total * reserve).astype(np.int64), reserve_min) if (reserve or reserve_min) else 0
        self.gpu_mem = np.where(total > 0, np.maximum(total - kept, 0), 0).astype(np.int64)
        self.cpu_total = np.array([UNTRACKED if nd.cpu is None else int(round(nd.cpu * MILLI)) for nd in self.nodes],
                                  dtype=np.int64)
        self.mem_total = np.array([UNTRACKED if nd.memory is None else nd.memory for nd in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.models = sorted({nd.gpu_model for nd in self.nodes})
        self.model_id = np.array([self.models.index(nd.gpu_model) for nd in self.nodes], dtype=np.int64)
        self.schedulable = np.array([nd.schedulable for nd in self.nodes], dtype=bool)
        # Rows touched by take/give, in order: caches of per-node scores (fragmentation) follow
        # the log instead of comparing the whole cluster on every placement. Whatever changes the
        # free capacity other than through take/give extends the log too (or drops the caches
        # before anyone reads them: ``forget``).
        self.log: list[int] = []
        self._summary: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see gpu_summary
        self._summary_pos = 0

    # -- bookkeeping -----------------------------------------------------------------------------
    def milli_on(self, node: int, req: PodRequest) -> int:
        """The per-GPU share ``req`` needs on ``node`` (memory-sized shares depend on the GPU)."""
        if req.gpu_memory > 0:
            mem = int(self.gpu_mem[node])
            if mem <= 0:
                return MILLI + 1  # unknown (or all reserved) GPU memory: a memory-sized share cannot be placed
            return max(1, -(-req.gpu_memory * MILLI // mem))
        return req.milli

    def take(self, node: int, gpus: Sequence[int], milli: int, cpu_milli: int, memory: int) -> None:
        self.log.append(node)
        for g in gpus:
            self.gpu_free[node, g] -= milli
        self.cpu_free[node] -= cpu_milli
        self.mem_free[node] -= memory

    def give(self, node: int, gpus: Sequence[int], milli: int, cpu_milli: int, memory: int) -> None:
        self.log.append(node)
        for g in gpus:
            self.gpu_free[node, g] += milli
        self.cpu_free[node] += cpu_milli
        self.mem_free[node] += memory

    def take_placement(self, p: PodPlacement, w: Workload) -> None:
        i = self.index.get(p.node)
        if i is not None:
            self.take(i, p.gpus, p.milli, int(round(w.cpu * MILLI)), w.memory)

    def give_placement(self, p: PodPlacement, w: Workload) -> None:
        i = self.index.get(p.node)
        if i is not None:
            self.give(i, p.gpus, p.milli, int(round(w.cpu * MILLI)), w.memory)

    def fits_placements(self, placements: Sequence[PodPlacement], w: Workload) -> bool:
        """Would all of ``placements`` (one workload's pods: they may share a node or a GPU, and
        their needs add up) fit now? A node or GPU that does not exist does not fit."""
        return fits_placements(self, placements, w)

    def gpu_summary(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node: the most free milli on one GPU, how many GPUs are wholly free (what a
        one-GPU and a whole-GPUs request need to know of a node), and the free milli of all its
        GPUs (what a plan needs). Kept across calls and brought in step through the change log:
        only rows touched since are read again. Read only."""
        s = self._summary
        if s is None:
            g = self.gpu_free
            s = self._summary = (g.max(axis=1), (g >= MILLI).sum(axis=1), g.sum(axis=1))
            self._summary_pos = len(self.log)
        elif len(self.log) > self._summary_pos:
            rows = list(set(self.log[self._summary_pos:]))
            if len(rows) <= 4 and self.gpu_free.shape[1]:  # (a bind or two: row by row, as lists)
                for r in rows:
                    row = self.gpu_free[r].tolist()
                    s[0][r] = max(row)
                    s[1][r] = sum(x >= MILLI for x in row)
                    s[2][r] = sum(row)
            else:
                g = self.gpu_free[rows]
                s[0][rows] = g.max(axis=1)
                s[1][rows] = (g >= MILLI).sum(axis=1)
                s[2][rows] = g.sum(axis=1)
            self._summary_pos = len(self.log)
        return s

    def free_milli(self) -> np.ndarray:
        """Per node, the free GPU milli of all its GPUs (``gpu_free.sum(axis=1)``): a copy of
        ``gpu_summary``'s third part, as it is now (the summary follows later changes in place)."""
        return self.gpu_summary()[2].copy()

    def forget(self) -> None:
        """Drop what is kept of the free capacity (after a change that bypassed the log)."""
        self._summary = None

    def free_gpu_milli(self) -> int:
        return int(self.gpu_free[self.schedulable].sum())

    def copy(self) -> "ClusterState":
        c = object.__new__(ClusterState)
        c.__dict__.update(self.__dict__)
        c.gpu_free = self.gpu_free.copy()
        c.cpu_free = self.cpu_free.copy()
        c.mem_free = self.mem_free.copy()
        c.log = []  # a new state: its readers start with a full comparison
        c._summary = None
        return c

    def node_mask(self, selector: dict[str, str]) -> np.ndarray | None:
        """Nodes matching a selector on node fields (gpu_model, name) or labels; None = all."""
        if not selector:
            return None
        mask = self.schedulable.copy()
        for key, want in selector.items():
            vals = np.array([(nd.gpu_model if key == "gpu_model" else nd.name if key == "name"
                              else nd.labels.get(key)) == want for nd in self.nodes], dtype=bool)
            mask &= vals
        return mask


def fits_placements(view: "ClusterState | FreeRows", placements: Sequence[PodPlacement], w: Workload) -> bool:
    """``ClusterState.fits_placements`` on either view of the free capacity."""
    cpu = int(round(w.cpu * MILLI))
    num_gpus = view.num_gpus
    gpu: dict[tuple[int, int], int] = {}
    pods: dict[int, int] = {}
    for p in placements:
        n = view.index.get(p.node)
        if n is None or any(g >= num_gpus[n] for g in p.gpus):
            return False
        pods[n] = pods.get(n, 0) + 1
        for g in p.gpus:
            gpu[n, g] = gpu.get((n, g), 0) + p.milli
    cpu_free, mem_free, gpu_free = view.cpu_free, view.mem_free, view.gpu_free
    if any(cpu_free[n] < cpu * k or mem_free[n] < w.memory * k for n, k in pods.items()):
        return False
    return all(gpu_free[n][g] >= m for (n, g), m in gpu.items())


class FreeRows:
    """The free capacity of a ``ClusterState`` as Python lists, for long runs of one-pod reads
    (the holders a cycle probes): a list item costs a fraction of what a numpy scalar does. The
    same fields as the state (``gpu_free[n][g]``, ``cpu_free[n]``, ``mem_free[n]``, ``index``,
    ``num_gpus``, ``schedulable``). ``sync()`` reads in the rows the state's log says changed
    since; a reader may change the lists for a probe if it puts them back."""

    def __init__(self, state: ClusterState):
        self.state = state
        self.index = state.index
        self.num_gpus = state.num_gpus.tolist()
        self.schedulable = state.schedulable.tolist()
        self.gpu_free = state.gpu_free.tolist()
        self.cpu_free = state.cpu_free.tolist()
        self.mem_free = state.mem_free.tolist()
        self._seen = len(state.log)

    def sync(self) -> None:
        log, st = self.state.log, self.state
        if len(log) > self._seen:
            for n in set(log[self._seen:]):
                self.gpu_free[n] = st.gpu_free[n].tolist()
                self.cpu_free[n] = int(st.cpu_free[n])
                self.mem_free[n] = int(st.mem_free[n])
            self._seen = len(log)

    def fits_on(self, n: int, req: PodRequest, milli: int) -> bool:
        """Does one pod of ``req`` (``milli`` per GPU on this node) fit on node ``n``?"""
        if self.cpu_free[n] < req.cpu_milli or self.mem_free[n] < req.memory:
            return False
        if req.num_gpus == 0:
            return True
        return milli <= MILLI and sum(f >= milli for f in self.gpu_free[n]) >= req.num_gpus
