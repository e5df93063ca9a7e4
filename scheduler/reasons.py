"""Why a workload waits or was preempted: typed codes with their numbers, and the one function
that turns them into the sentence people read.

The core returns a ``Pending`` (a code, the queue, the position and the numbers behind the code)
for every waiting workload; adapters read ``code`` (the API's ``reason_code``, the spawner, the
tests) and show ``str(pending)`` to people. Nothing outside this module composes or parses these
sentences.
"""
from __future__ import annotations

import enum
from typing import Any, NamedTuple

from .units import format_amount


class Code(str, enum.Enum):
    """Why a pending workload is not running (the API's ``reason_code``)."""

    LIMIT = "limit"  # a queue on its path is at its limit
    NON_PREEMPTIBLE = "non-preemptible-over-deserved"  # would take a non-preemptible workload over deserved
    FAIR_SHARE = "fair-share"  # its queue is at its fair share: it waits for idle capacity
    CAPACITY = "capacity"  # not enough free capacity in the cluster
    FRAGMENTED = "fragmented"  # enough free in total, but not on one node in the shape requested
    NO_MATCHING_NODE = "no-matching-node"  # node_selector matches no node
    RESERVED = "reserved-for-reclaim"  # the capacity it could use is held for another workload's reclaim
    MIN_RUNTIME = "min-runtime"  # the workloads that could make room are protected by min_runtime
    RECLAIM_REFUSED = "reclaim-refused"  # taking the borrowed capacity would be unfair to its holder
    RECLAIMING = "reclaiming"  # reclaiming from other queues; starts when the victims have checkpointed
    PREEMPTING = "preempting"  # preempting lower-priority workloads of its own queue
    CONSOLIDATING = "consolidating"  # moving workloads to open a node for it
    RELEASING = "waiting-for-release"  # fits once preempted workloads have released their GPUs
    NO_QUEUE = "no-queue"  # its queue does not exist (removed from the configuration)
    BEHIND = "behind-higher-priority"  # a higher-priority workload of its queue waits to preempt first
    # fairness over time: at its fair share, which past usage lowered (the same wait as FAIR_SHARE)
    FAIR_SHARE_USAGE = "fair-share-lowered-by-usage"
    NO_POOL = "no-pool"  # none of the node pools it may use has a node
    NO_POOL_QUOTA = "no-pool-quota"  # in every pool it may use, its queue may hold nothing of this kind


class Cause(str, enum.Enum):
    """Why a running workload is being preempted (``Evict.cause``)."""

    RECLAIM = "reclaim"
    PRIORITY = "priority"
    CONSOLIDATION = "consolidation"
    # set by adapters, never by the core: the node under the workload failed / is being drained
    NODE_FAILURE = "node-failure"
    DRAIN = "drain"


# Codes under which the workload has a plan in motion (victims are releasing for it).
IN_MOTION = frozenset({Code.RECLAIMING, Code.PREEMPTING, Code.CONSOLIDATING, Code.RELEASING})


class Pending(NamedTuple):
    """Why one workload waits: ``code`` plus the numbers behind it (``detail``). A named tuple:
    one is made per waiting workload per cycle, so it must be cheap."""

    code: Code
    queue: str
    position: int = 1
    detail: dict[str, Any] = {}  # never mutated

    def __str__(self) -> str:
        return describe(self)


def _gpus(n: float) -> str:
    return format_amount("gpu", round(n, 2))


def _what(d: dict) -> str:
    """'2 GPUs (4 pods started together)' or '0.5 GPU'."""
    pods = d.get("pods", 1)
    return _gpus(d.get("need", 0.0)) + (f" ({pods} pods started together)" if pods > 1 else "")


def _capacity(d: dict) -> str:
    if d.get("need", 0.0) <= 0:
        return "waiting for CPU or memory on a node"
    off = d.get("unschedulable_nodes", 0)
    aside = f" ({off} node{'s' if off != 1 else ''} with GPUs not schedulable)" if off else ""
    return f"waiting for {_what(d)}: {d.get('free', 0.0):g} free in the cluster{aside}"


def _refusal(q: str, d: dict) -> str:
    """Why a reclaim was refused, from the numbers the reclaim budget kept."""
    h = d["holder"]
    if "rule" not in d:
        return f"the GPUs that would make room belong to {h}, which may not give them up"
    held, fair = _gpus(d["held"]), _gpus(d["fair"])
    mine = f"{q} holds {_gpus(d['queue_held'])} of its fair share of {_gpus(d['queue_fair'])}"
    if d["rule"] == "guarantee":
        return (f"the GPUs that would make room belong to {h}, which holds {held} of its guaranteed "
                f"{_gpus(d['guarantee'])} (fair share {fair}): taking them would break its guarantee")
    if d["rule"] == "priority":
        return (f"the GPUs that would make room belong to a workload of queue {d.get('queue', h)} ({h} holds "
                f"{held}, fair share {fair}) while lower-priority workloads of that queue still run: a reclaim "
                f"takes a queue's lowest priorities first")
    if d["rule"] == "inside":
        return (f"the GPUs that would make room belong to {h} ({held}, fair share {fair}), but within it to "
                f"{d['below']}, which holds {_gpus(d['below_held'])} of its own fair share of "
                f"{_gpus(d['below_fair'])}: a reclaim leaves no queue further from its share ({mine})")
    if d["rule"] == "whole":
        return (f"the GPUs that would make room belong to {h} ({held}, fair share {fair}) as whole workloads "
                f"of {_gpus(d['taken'])}; taking them would leave the two queues further from their fair "
                f"shares than now ({mine})")
    if d["rule"] == "back":
        return (f"the GPUs that would make room belong to {h} ({held}, guaranteed {_gpus(d['guarantee'])}) as "
                f"whole workloads of {_gpus(d['taken'])}; taking them would take {h} below its guarantee while "
                f"{q}'s side ends above its own, and {h} would take them back ({mine})")
    return (f"the GPUs that would make room belong to {h}, which holds {held} of its fair share of {fair}; "
            f"{mine}: relative to their fair shares, {h} is no better off than {q}")


def _sentence(p: Pending) -> str:
    d, q = p.detail, p.queue
    c = p.code
    if c is Code.LIMIT:
        held = (f", {_gpus(d['reserved'])} held for its workloads that wait for released capacity"
                if d.get("reserved") else "")
        return (f"waiting: queue {d['at']} at its limit {format_amount(d['resource'], d['limit'])} "
                f"({format_amount(d['resource'], d['used'])} in use{held})")
    if c is Code.NON_PREEMPTIBLE:
        res = d["resource"]
        return (f"waiting: {d['kind']} workloads run only within the deserved quota: {q} deserves "
                f"{format_amount(res, d['deserved'])} and {format_amount(res, d['held'])} of it is held by "
                f"non-preemptible workloads")
    if c is Code.CAPACITY:
        return _capacity(d)
    if c is Code.FAIR_SHARE:
        shrunk = " (the deserved quotas add up to more than the cluster has)" if d.get("overcommitted") else ""
        return (f"{_capacity(d)}; {q} holds {_gpus(d['held'])} and this would take it above its fair share "
                f"of {_gpus(d['fair'])}{shrunk}, so it waits for idle GPUs instead of reclaiming")
    if c is Code.FAIR_SHARE_USAGE:
        return (f"{_capacity(d)}; {q} holds {_gpus(d['held'])} and this would take it above its fair share "
                f"of {_gpus(d['fair'])}, lowered from {_gpus(d['plain'])} by its past usage "
                f"({100 * d['usage']:.0f}% of the capacity over the fairness window), so it waits for idle GPUs")
    if c is Code.NO_POOL:
        return f"no node in node pool {', '.join(d['pools'])}"
    if c is Code.NO_POOL_QUOTA:
        return (f"{q} may not run {d['kind']} workloads of this size in node pool {', '.join(d['pools'])}: "
                f"it has no deserved quota there for non-preemptible work, or a limit of 0")
    if c is Code.FRAGMENTED:
        if d.get("own_gpus"):
            return (f"waiting for {_what(d)}: {d.get('free', 0.0):g} GPUs are free, but not {d['own_gpus']} "
                    f"distinct GPUs with room for one pod each (the pods of a gang never share a GPU)")
        return (f"waiting for {_what(d)}: {d.get('free', 0.0):g} GPUs are free but not on one node "
                f"in the shape requested")
    if c is Code.NO_MATCHING_NODE:
        return f"no node matches node_selector {d['selector']}"
    if c is Code.RESERVED:
        return (f"{_capacity(d)}; {_gpus(d['reserved'])} of the free capacity is held for "
                f"{d['holder']}, which is reclaiming its guaranteed share")
    if c is Code.MIN_RUNTIME:
        return (f"{_capacity(d)}; the workloads that could make room started less than "
                f"{d['min_runtime']:g}s ago (min_runtime)")
    if c is Code.RECLAIM_REFUSED:
        return f"{_capacity(d)}; not reclaiming: {_refusal(q, d)}"
    if c is Code.RECLAIMING:
        return (f"reclaiming {_gpus(d['need'])} from other queues; starts when the preempted workloads "
                f"have checkpointed")
    if c is Code.PREEMPTING:
        return "preempting lower-priority workloads; starts when they have checkpointed"
    if c is Code.CONSOLIDATING:
        return f"consolidating: moving {d['moved']} workload(s) to make room for it on {d['node']}"
    if c is Code.RELEASING:
        return (f"waiting for preempted workloads to release {_gpus(d['need'])} (grace period up to "
                f"{d['grace']:g}s)")
    if c is Code.NO_QUEUE:
        return f"queue {q!r} does not exist"
    if c is Code.BEHIND:
        return (f"waiting behind a higher-priority workload of {q} (priority {d['priority']}) that may "
                f"preempt lower-priority ones; it goes first")
    raise ValueError(f"unknown reason code {c!r}")


def describe(p: Pending) -> str:
    """The one sentence a person reads for ``p``."""
    if p.code is Code.NO_QUEUE:
        return f"waiting: {_sentence(p)}"
    pool = p.detail.get("pool")
    where = f" (node pool {pool})" if pool and p.code not in (Code.NO_POOL, Code.NO_POOL_QUOTA) else ""
    return f"queued in {p.queue}: position {p.position}, {_sentence(p)}{where}"
