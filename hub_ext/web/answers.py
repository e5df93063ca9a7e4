"""Answers of the REST API (pydantic v2): open models (more fields may come), which state what
clients may rely on. The handlers serialise through them (views.py), and the OpenAPI document
(openapi.py) is built from them."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ... import contract as C


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class Error(Answer):
    status: int = Field(ge=400, le=599)
    message: str
    field: Optional[str] = None


class PlacementOut(Answer):
    node: str
    gpus: list[int]
    fraction: float


ReasonCode = Annotated[Literal[C.REASON_CODES], Field(  # type: ignore[valid-type]
    description="why it waits, for programs (reason is the sentence for people); null when not waiting in a queue")]


class Job(Answer):
    id: str = Field(pattern=C.JOB_ID_PATTERN)
    name: str
    user: str
    queue: str
    kind: Literal[C.JOB_KINDS]  # type: ignore[valid-type]
    status: Literal[C.STATUSES]  # type: ignore[valid-type]
    reason: str
    reason_code: Optional[ReasonCode] = None
    position: Optional[int]
    gpus: float
    gpu_memory: Optional[int]
    cpu: float
    memory: int
    priority: int
    preemptible: bool
    checkpoint_on_signal: bool
    notebook: Optional[str]
    parameters: dict[str, Any]
    sweep: Optional[str]
    submitted_at: str
    started_at: Optional[str]
    finished_at: Optional[str]
    preemptions: int
    restarts: int
    attempts: int
    allocation: list[PlacementOut]
    exit_code: Optional[int]
    metrics: dict[str, list[dict[str, Any]]]
    checkpoint: Optional[dict[str, Any]]
    script: Optional[str] = None
    args: Optional[list[str]] = None
    command: Optional[list[str]] = None
    pods: int = 1
    workers: list[dict[str, Any]] = []


class JobList(Answer):
    jobs: list[Job]


class Workspace(Answer):
    id: str
    user: str
    server: str
    status: Literal[C.WORKSPACE_STATUSES]  # type: ignore[valid-type]
    reason_code: Optional[ReasonCode] = None
    queue: str
    gpus: float
    gpu_memory: Optional[int]
    cpu: float
    memory: int
    preemptible: bool
    priority: int
    reason: str
    position: Optional[int]
    allocation: list[PlacementOut]
    submitted_at: str
    started_at: Optional[str]
    env: Optional[dict[str, str]] = None


class WorkspaceList(Answer):
    workspaces: list[Workspace]


class Queue(Answer):
    name: str
    parent: Optional[str]
    deserved: dict[str, float]
    limit: dict[str, float]
    over_quota_weight: float
    priority: int
    fair_share: dict[str, float]
    allocated: dict[str, float]
    running: int
    pending: int
    users: list[str]
    groups: list[str]
    may_submit: bool


class QueueList(Answer):
    queues: list[Queue]


class GpuOut(Answer):
    index: int
    uuid: Optional[str]
    allocated: float
    utilization: Optional[float]
    memory_used: Optional[int]
    memory_total: Optional[int]
    allocations: list[dict[str, Any]]


class Node(Answer):
    name: str
    gpu_model: str
    gpu_memory: int
    schedulable: bool
    labels: dict[str, str]
    gpus: list[GpuOut]
    unschedulable_reason: Optional[str] = None


class NodeList(Answer):
    nodes: list[Node]


class MetricOut(Answer):
    job: str
    name: str
    step: Optional[int]
    value: float
    t: str


class Health(Answer):
    ok: bool
    cycles: int


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


class GpuSeries(Answer):
    node: str
    gpu: int
    points: list[Reading]


class UsageHistory(Answer):
    since: str
    until: str
    workload: Optional[str]
    series: list[GpuSeries]


class Suspension(Answer):
    id: int
    user: str
    server: str
    workload: str
    options: dict[str, Any] = Field(description="what the server asked for: resuming starts it with these")
    reason: str
    suspended_at: str
    resumed_at: Optional[str]
    resumed_by: Optional[str]


class SuspensionList(Answer):
    suspensions: list[Suspension]
