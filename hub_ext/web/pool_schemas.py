"""Request and answer models of node pools, and the answers of usage reports (schemas.py
re-exports them all: this module keeps schemas.py within the module size the layers allow).

The request mixin :class:`PoolChoice` gives ``POST jobs`` and workspace requests their ``pools``;
:class:`PoolsOut` gives the job and workspace answers theirs; :class:`QueuePools` gives a queue
its quota, share and allocation per pool and its past usage (fairness over time);
:class:`PoolList` is ``GET pools``.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ... import contract as C

MAX_POOLS = 64  # pools one request may name


class Answer(BaseModel):
    """An answer: an open model (more fields may come); the document states what clients may rely on."""

    model_config = ConfigDict(extra="allow")


PoolName = Annotated[str, Field(strict=True, min_length=1, max_length=C.MAX_NAME)]


class PoolChoice(BaseModel):
    pools: Optional[Annotated[list[PoolName], Field(max_length=MAX_POOLS)]] = Field(
        None, description="node pools it may run in, most preferred first (each one a pool some node is in; "
                          "default: c.GPUPool.pool_preference of its kind, else any pool)")


class PoolsOut(BaseModel):
    pools: Optional[list[str]] = Field(None, description="the node pools it may run in, most preferred first "
                                                         "(empty or null: any pool)")


def _plain(where: str) -> str:
    return (f"fairness over time: its fair share {where} without past usage, beside fair_share (the share "
            "adjusted for past usage); null: fairness over time is off, or no queue has past usage yet")


class QueuePool(Answer):
    """A queue in one node pool: its quota there, its fair share and allocation, its past usage."""

    deserved: dict[str, float]
    limit: dict[str, float]
    over_quota_weight: float
    fair_share: dict[str, float]
    fair_share_plain: Optional[dict[str, float]] = Field(None, description=_plain("in the pool"))
    allocated: dict[str, float]
    usage: Optional[float] = Field(None, description="fairness over time: its GPU usage over the window as a "
                                                     "share of the pool's capacity (null: fairness is off)")
    may_use: bool = Field(description="whether it may hold GPUs there (false: a limit of 0)")
    free: float = Field(description="the pool's GPUs not held")
    queued: int = Field(description="workloads waiting that may run in the pool")


class QueuePools(BaseModel):
    pools: dict[str, QueuePool] = Field({}, description="per node pool (every pool a node is in)")
    usage: Optional[float] = Field(None, description="fairness over time: its GPU usage over the window as a "
                                                     "share of the capacity, over every pool (null: off)")
    fair_share_plain: Optional[dict[str, float]] = Field(None, description=_plain("over every pool"))


class Pool(Answer):
    name: str
    nodes: int
    gpus: float = Field(description="GPUs of its nodes in service")
    allocated: float = Field(description="GPUs held")
    free: float = Field(description="GPUs not held (fractions count)")
    running: int = Field(description="workloads holding GPUs in it")
    queued: int = Field(description="workloads waiting that may run in it")
    gpu_models: list[str]


class PoolList(Answer):
    pools: list[Pool]
    fairness: Optional[dict] = Field(None, description="c.GPUPool.fairness (null: off)")


class UsageRow(Answer):
    """GPU-hours of one group; the group's name is under the grouping's key (``"user": "alice"``,
    ``"day": "2026-11-02"``; ``"total"`` in the total)."""

    allocated_gpu_hours: float = Field(ge=0)
    used_gpu_hours: Optional[float] = Field(description="null: no NVML reading covered the allocation (unknown)")
    measured_gpu_hours: float = Field(ge=0, description="the allocated GPU-hours that had readings")
    utilization: Optional[float] = Field(description="percent: used / measured; null when unknown")
    workloads: int = Field(ge=0)


class Usage(Answer):
    since: str
    until: str
    by: Literal[C.USAGE_GROUPS]  # type: ignore[valid-type]
    user: Optional[str] = Field(description="whose usage (null: everyone's, for admins)")
    rows: list[UsageRow]
    total: UsageRow


class Reading(Answer):
    t: str = Field(description="the start of the period the reading covers")
    seconds: float
    utilization: Optional[float]
    memory_used: Optional[int]
    state: Optional[Literal[C.GPU_STATES]] = Field(None, description="busy, idle, or held: 0 % holding memory")  # type: ignore[valid-type]  # noqa: E501


class GpuSeries(Answer):
    node: str
    gpu: int
    points: list[Reading]


class UsageHistory(Answer):
    since: str
    until: str
    workload: Optional[str]
    series: list[GpuSeries]
