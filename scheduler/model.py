"""The scheduler's narrow interface: what adapters hand in (a Snapshot) and get back (a CycleResult).

Everything here is plain data. The hub, the Kubernetes backend and the simulator all build a
`Snapshot` each cycle, call `Scheduler.schedule(snapshot)` and carry out the `CycleResult`:

* ``Bind``: start the workload's pods on the given nodes/GPUs (phase becomes RUNNING).
* ``Evict``: ask the workload to checkpoint, give it ``preemption_grace`` seconds, stop it and
  requeue it (phase RELEASING until its resources are free, then PENDING again).
* ``pending``: why each waiting workload waits: a ``reasons.Pending`` (a typed code with its
  numbers; ``str()`` of it is the sentence a person reads).
* ``reservations``: capacity held for workloads whose reclaim, preemption or consolidation is in
  motion. The adapter hands them back in the next ``Snapshot`` unchanged; until the holder binds
  (or its plan is dropped for a stated reason) nobody else may take that capacity.

Units: ``gpu`` in GPUs (fractions allowed), ``cpu`` in cores, ``memory`` and ``gpu_memory`` in
bytes. Time is seconds on whatever clock the adapter uses (``Snapshot.now``); the scheduler never
reads a clock itself.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Mapping

from .reasons import Code, Pending

RESOURCES = ("gpu", "cpu", "memory")

KINDS = ("interactive", "train", "hpo-trial", "inference")
DEFAULT_PRIORITY = {"interactive": 100, "inference": 80, "train": 50, "hpo-trial": 50}
DEFAULT_PREEMPTIBLE = {"interactive": False, "inference": False, "train": True, "hpo-trial": True}

# GPU shares are tracked in milli-GPU integers so that fractions add up exactly.
MILLI = 1000

# The node pool of a node that names none, and the pool a queue's top-level quota is for.
DEFAULT_POOL = "default"


@dataclass(frozen=True)
class PoolQuota:
    """A queue's quota in one node pool (``QueueSpec.pools``). ``over_quota_weight`` None: the
    queue's top-level weight."""

    deserved: dict[str, float] = field(default_factory=dict)
    limit: dict[str, float] = field(default_factory=dict)
    over_quota_weight: float | None = None


@dataclass(frozen=True)
class QueueSpec:
    """One queue of the tree. A queue with children is a department; only leaves hold workloads.

    ``deserved`` and ``limit`` map a resource name (gpu, cpu, memory) to an amount. A resource
    missing from ``limit`` is unlimited; missing from ``deserved`` is 0.
    """

    name: str
    parent: str | None = None
    deserved: dict[str, float] = field(default_factory=dict)
    limit: dict[str, float] = field(default_factory=dict)
    over_quota_weight: float = 1.0
    priority: int = 0
    # quotas per node pool; ``deserved``/``limit``/``over_quota_weight`` above are the quota in
    # pool ``default``, and a pool not listed here gives 0 deserved, no limit, the same weight
    pools: dict[str, PoolQuota] = field(default_factory=dict)

    def in_pool(self, pool: str) -> "QueueSpec":
        """This queue as pool ``pool`` sees it: that pool's quota in place of the top-level one."""
        quota = self.pools.get(pool)
        if quota is None:
            if pool == DEFAULT_POOL:
                return self if not self.pools else QueueSpec(self.name, self.parent, self.deserved, self.limit,
                                                             self.over_quota_weight, self.priority)
            return QueueSpec(self.name, self.parent, {}, {}, self.over_quota_weight, self.priority)
        weight = self.over_quota_weight if quota.over_quota_weight is None else quota.over_quota_weight
        return QueueSpec(self.name, self.parent, dict(quota.deserved), dict(quota.limit), weight, self.priority)


@dataclass(frozen=True)
class NodeSpec:
    """A node and its GPUs. ``cpu``/``memory`` of None means the resource is not tracked."""

    name: str
    gpus: int
    gpu_memory: int = 0  # bytes per GPU; 0 = unknown
    gpu_model: str = ""
    cpu: float | None = None
    memory: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    schedulable: bool = True
    pool: str = DEFAULT_POOL  # the node pool it belongs to (each pool divided by its own quotas)


class Phase(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    RELEASING = "releasing"  # evicted: checkpointing within its grace period, still holds resources


@dataclass(frozen=True)
class PodPlacement:
    """Where one pod of a workload runs: ``gpus`` are indices on ``node``; ``fraction`` is the
    share of each of those GPUs (1.0 for whole GPUs)."""

    pod: int
    node: str
    gpus: tuple[int, ...] = ()
    fraction: float = 1.0

    @functools.cached_property
    def milli(self) -> int:  # cached: hot in every capacity update
        return int(round(self.fraction * MILLI))


@dataclass(slots=True)  # slots: compact, and faster attribute access in the hot loops
class Workload:
    """A unit of scheduling: a notebook server, a job, an HPO trial; ``pods`` > 1 is a gang.

    Resource requests are per pod. Exactly one of ``gpus`` (whole GPUs, or a fraction below 1)
    and ``gpu_memory`` (a fraction of one GPU sized by memory on the chosen GPU) is used; both 0
    means a CPU-only workload.
    """

    id: str
    queue: str
    user: str = ""
    kind: str = "train"
    gpus: float = 0.0
    gpu_memory: int = 0
    cpu: float = 0.0
    memory: int = 0
    pods: int = 1
    priority: int | None = None
    preemptible: bool | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    # node pools it may run in, in order of preference; empty: any pool, preferring those where
    # its queue has the most deserved quota free
    pools: tuple[str, ...] = ()
    submit_time: float = 0.0
    # What the scheduler needs to know to pick victims that lose the least work.
    checkpoint_on_signal: bool = False
    last_checkpoint_at: float | None = None  # adapter's clock; None = never checkpointed
    # Current state, maintained by the adapter.
    phase: Phase = Phase.PENDING
    placements: tuple[PodPlacement, ...] = ()
    started_at: float | None = None  # start of the current run (for min_runtime)

    def __post_init__(self) -> None:
        if self.priority is None:
            self.priority = DEFAULT_PRIORITY.get(self.kind, 50)
        if self.preemptible is None:
            self.preemptible = DEFAULT_PREEMPTIBLE.get(self.kind, True)

    @property
    def is_fraction(self) -> bool:
        return self.gpu_memory > 0 or 0 < self.gpus < 1

    def lost_work(self, now: float) -> float:
        """Seconds of run time lost if evicted now: zero if it saves on signal, else the time
        since its last checkpoint (or since it started)."""
        if self.checkpoint_on_signal or self.started_at is None:
            return 0.0
        since = self.started_at
        if self.last_checkpoint_at is not None and self.last_checkpoint_at > since:
            since = self.last_checkpoint_at
        return max(0.0, now - since)


@dataclass(frozen=True)
class Reservation:
    """Capacity held for ``workload`` until it binds: where its pods will run once the workloads
    preempted for it have released (``placements``), why (``code``: reclaiming, preempting,
    consolidating or waiting-for-release, with ``detail`` for its pending reason) and since when."""

    workload: str
    placements: tuple[PodPlacement, ...]
    code: Code
    since: float
    detail: dict = field(default_factory=dict, compare=False)
    # set when the holder bound: the reservation then holds nothing and only marks the workload
    # as settling (consolidation does not move it again for two grace periods)
    bound_at: float | None = None


@dataclass
class Snapshot:
    """The state of the world at ``now``: every node, every queue and every workload that has
    not ended (pending, running or releasing), and the reservations the last cycle returned."""

    now: float
    nodes: list[NodeSpec]
    queues: list[QueueSpec]
    workloads: list[Workload]
    reservations: list[Reservation] = field(default_factory=list)
    # past usage for fairness over time: pool -> queue -> GPU usage over the window, normalised
    # to the pool's capacity over the same window (scheduler/usage.py computes it); empty: none
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    # what changed since the previous snapshot given to the same Scheduler: the ids of the
    # workloads added, removed or changed in any field (every other workload is the same object,
    # unchanged). The Scheduler then keeps what it works out of the workloads (waiting.py,
    # held.py) and updates it for these alone. None: not known (everything is worked out afresh)
    changes: frozenset[str] | None = None
    # the workloads by id (the very objects of ``workloads``), when the adapter keeps such a map
    # from cycle to cycle: the core reads it, during the cycle only, instead of indexing every
    # workload of the snapshot again (at 80,000 workloads that pass alone was about 4% of a
    # cycle). None: the core indexes them itself
    by_id: Mapping[str, Workload] | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the core. Adapters expose them as traitlets or scenario ``config`` fields."""

    min_runtime: float = 0.0  # a started preemptible workload is protected this long
    preemption_grace: float = 30.0  # informs reasons only; the adapter enforces it
    placement: str = "default"  # placement policy name (see placement.POLICIES)
    actions: tuple[str, ...] = ("allocate", "consolidate", "reclaim", "preempt")
    # a reservation not taken up this long after it was made is dropped and its holder re-planned
    # (None: twice the grace period plus 60 s, time enough for every victim to release)
    reservation_timeout: float | None = None
    topology_key: str = "rack"  # node label that groups nodes for gang placement
    seed: int = 0  # for policies that break ties at random
    # GPU memory the driver keeps for itself: memory-sized fractions are sized against what is
    # left, max(fraction x memory, minimum bytes) less per GPU (adapters default to 3 %, at least
    # 256 MiB; 0 keeps the whole memory, as scenarios without the setting do)
    gpu_memory_reserve: float = 0.0
    gpu_memory_reserve_min: int = 0
    # fairness over time: how strongly past usage (Snapshot.usage) moves the division of the
    # capacity beyond deserved quotas (KAI-Scheduler's k; 0: past usage has no effect)
    fairness_k: float = 0.0


@dataclass(frozen=True)
class Bind:
    workload: str
    placements: tuple[PodPlacement, ...]
    reason: str  # e.g. "within deserved quota of vision" / "borrowing idle GPUs (over quota)"
    over_quota: bool = False


@dataclass(frozen=True)
class Evict:
    workload: str
    cause: str  # a reasons.Cause: "reclaim" | "priority" | "consolidation"
    reason: str  # human: "preempted: reclaimed by queue nlp (below its deserved 4 GPUs)"
    by: str | None = None  # the workload this makes room for


@dataclass
class CycleResult:
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: dict[str, Pending] = field(default_factory=dict)  # workload id -> why it waits
    positions: dict[str, int] = field(default_factory=dict)  # workload id -> 1-based place in its queue
    fair_share: dict[str, dict[str, float]] = field(default_factory=dict)  # queue -> resource -> amount
    allocated: dict[str, dict[str, float]] = field(default_factory=dict)  # queue -> resource -> amount
    actions_ms: dict[str, float] = field(default_factory=dict)  # filled by adapters that time actions
    reservations: list[Reservation] = field(default_factory=list)  # hand back in the next Snapshot
    dropped: dict[str, str] = field(default_factory=dict)  # workload id -> why its reservation was dropped
    # per node pool (only when there are several, or one not named ``default``): pool -> queue ->
    # resource -> amount; ``fair_share`` and ``allocated`` above are their sums over the pools
    pool_fair_share: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    pool_allocated: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # fairness over time (``SchedulerConfig.fairness_k`` and usage given): the GPU share each queue
    # would have without its past usage (queue -> {"gpu": amount}, summed over the pools; per pool
    # in ``pool_fair_share_plain``); empty when past usage moves no share
    fair_share_plain: dict[str, dict[str, float]] = field(default_factory=dict)
    pool_fair_share_plain: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
