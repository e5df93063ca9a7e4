"""Typed requests and answers of the REST API (pydantic v2), from which the OpenAPI 3.1 document
is built (openapi.py, ``GET api/v1/openapi.json``).

Request models check shapes, types and the limits users need (stated once, in
:mod:`gpupool.contract`); what depends on the pool (queues, node sizes, the scheduler's rules for
fractions) is checked by the service after them. To add a field to a request, add it to its model:
the service, the error messages and the OpenAPI document follow. Every validation error becomes
one 400 whose message starts with the field's name (``"gpus: must be a number"``) and whose
payload names it (``"field": "gpus"``): validation.py."""
from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, Optional

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema,
                      field_validator)

from ... import contract as C
from ...scheduler.units import parse_cpu
from ..domain.usage import ReportError, parse_time
from .endpoint_schemas import EndpointChoice, EndpointOut, Share  # noqa: F401
from .pool_schemas import (Answer, GpuSeries, PoolChoice, PoolList, PoolsOut, QueuePools, Reading,  # noqa: F401
                           Usage, UsageHistory, UsageRow)

# ---------------------------------------------------------------------------- field types

def _whole(value: Any) -> Any:
    """JSON has one number type: 3.0 is the integer 3 (as JSON Schema says); "3" and true are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Name = Annotated[str, Field(strict=True, max_length=C.MAX_NAME)]
Priority = Annotated[int, BeforeValidator(_whole), Field(strict=True, ge=C.PRIORITY_RANGE[0], le=C.PRIORITY_RANGE[1])]
# the lower end and the fraction rule are domain/gpus.py's (shared with the spawn page)
Gpus = Annotated[float, Field(strict=True, le=C.MAX_GPUS, allow_inf_nan=False, json_schema_extra={"minimum": 0},
                              description="whole GPUs, a fraction of one below 1, or 0 for no GPU")]
Flag = Annotated[bool, Field(strict=True)]


def _quantity(value: Any) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite quantity such as 24Gi")
    try:
        n = C.parse_bytes(value)
    except OverflowError:
        raise ValueError(f"must be at most {C.format_bytes(C.MAX_BYTES)}") from None
    if n > C.MAX_BYTES:
        raise ValueError(f"must be at most {C.format_bytes(C.MAX_BYTES)}")
    return n


def _cpu(value: Any) -> float:
    cores = parse_cpu(value)
    if not math.isfinite(cores) or cores > C.MAX_CPU:
        raise ValueError(f"must be a number of cores up to {C.MAX_CPU}")
    return cores


_NUMBER = r"[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?"
_QUANTITY_SCHEMA = {"oneOf": [{"type": "integer", "minimum": 0, "maximum": C.MAX_BYTES},
                              {"type": "string", "maxLength": 32, "examples": ["8Gi", "512Mi"],
                               "pattern": rf"^\s*{_NUMBER}\s*(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?\s*$"}],
                    "description": "bytes, or a quantity such as 8Gi"}
Quantity = Annotated[int, PlainValidator(_quantity), WithJsonSchema(_QUANTITY_SCHEMA)]
Cores = Annotated[float, PlainValidator(_cpu),
                  WithJsonSchema({"oneOf": [{"type": "number", "minimum": 0, "maximum": C.MAX_CPU},
                                            {"type": "string", "maxLength": 32, "examples": ["8", "500m"],
                                             "pattern": rf"^\s*{_NUMBER}m?\s*$"}],
                                  "description": "cores, or a quantity such as 500m"})]


Notebook = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["cells", "nbformat"], "description": "an nbformat 4 notebook",
    "properties": {"nbformat": {"const": 4}, "nbformat_minor": {"type": "integer"}, "metadata": {"type": "object"},
                   "cells": {"type": "array", "items": {"type": "object"}}}})]


def _time(value: Any, info: ValidationInfo) -> float:
    if not isinstance(value, str):
        raise ValueError("must be a date such as 2026-11-01 or 2026-11-01T08:00Z")
    try:
        return parse_time(value, info.field_name or "time")
    except ReportError as e:
        raise ValueError(e.reason) from None


Time = Annotated[float, PlainValidator(_time), WithJsonSchema({
    "anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}],
    "examples": ["2026-11-01", "2026-11-01T08:00:00Z"],
    "description": "a date (midnight UTC) or an ISO 8601 time, 1970-01-01 to 9999-12-01"})]


class Request(BaseModel):
    """A JSON body: unknown fields are refused (a typo must not be ignored silently)."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)


class Query(BaseModel):
    """Query arguments (strings, converted): unknown ones are ignored, as web APIs do."""

    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------- requests

class Resources(Request, PoolChoice):  # + pools
    gpus: Optional[Gpus] = None
    gpu_memory: Optional[Quantity] = Field(None, description="instead of gpus: a share of one GPU by memory")
    cpu: Optional[Cores] = None
    memory: Optional[Quantity] = None
    queue: Optional[Name] = Field(None, description="a leaf queue you may use (default: your first)")
    priority: Optional[Priority] = Field(None, description="within the queue (default: by kind)")
    preemptible: Optional[Flag] = None


_ARGV = {"type": "array", "maxItems": C.MAX_ARGS, "items": {"type": ["string", "number"]}}


class JobRequest(Resources, EndpointChoice):  # + replicas, share
    """``POST jobs``: exactly one of ``notebook`` / ``notebook_content``."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["notebook"]},
                                                           {"required": ["notebook_content"]}]})

    notebook: Optional[Annotated[str, Field(strict=True, min_length=1, max_length=C.MAX_PATH)]] = Field(
        None, description="path relative to your working directory")
    notebook_content: Optional[Notebook] = Field(None, description="an nbformat 4 notebook")
    parameters: Optional[dict[str, Any]] = Field(None, description="papermill parameters")
    kind: Optional[Literal[C.JOB_KINDS]] = Field(None, description="default: train")  # type: ignore[valid-type]
    checkpoint_on_signal: Optional[Flag] = None
    name: Optional[Name] = Field(None, description="display name (default: the notebook's stem)")
    sweep: Optional[Name] = Field(None, description="the sweep this trial belongs to")
    # what a script or command job runs: checked by domain/programs.py (its messages name the item)
    script: Optional[Annotated[Any, WithJsonSchema({"type": "string", "maxLength": C.MAX_PATH})]] = Field(
        None, description="instead of a notebook: a .py path relative to your working directory")
    args: Optional[Annotated[Any, WithJsonSchema(_ARGV)]] = Field(
        None, description="a script's arguments (strings; numbers are converted)")
    command: Optional[Annotated[Any, WithJsonSchema({**_ARGV, "minItems": 1})]] = Field(
        None, description="instead of a notebook: an argv list run in your working directory")
    pods: Optional[Annotated[int, BeforeValidator(_whole), Field(strict=True, ge=1, le=C.MAX_PODS)]] = Field(
        None, description="workers started together (each with the job's gpus, cpu, memory)")

    @field_validator("parameters", "notebook_content")
    @classmethod
    def _plain_json(cls, v: Any) -> Any:
        if v is not None:
            try:
                json.dumps(v, allow_nan=False)
            except ValueError:
                raise ValueError("must hold JSON values only (no NaN or Infinity)") from None
        return v


class WorkspaceRequest(Resources):
    """``POST workspaces/{user}[/{server}]`` (the spawner's)."""

    server: Optional[Name] = Field(None, description="server name ('' = the default server)")
    name: Optional[Name] = None
    image: Optional[Annotated[str, Field(strict=True, min_length=1, max_length=C.MAX_PATH)]] = Field(
        None, description="the image the server runs (Kubernetes: the spawner's), checked against the queue's policy")


class NodeActionRequest(Request):
    """``POST nodes/{name}/drain|fail|return`` (the body is optional)."""

    reason: Optional[Annotated[str, Field(strict=True, max_length=1000)]] = Field(
        None, description="why, in words (shown in GET nodes and in the reasons of the workloads it stops)")


class MetricRequest(Request):
    """``POST jobs/{id}/metrics``."""

    name: Annotated[str, Field(strict=True, min_length=1, max_length=C.MAX_NAME, pattern=r"\S")]
    value: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    step: Optional[Annotated[int, BeforeValidator(_whole), Field(strict=True, ge=C.INT64[0], le=C.INT64[1])]] = None


_STATUS_LIST = f"^[ ,]*(({'|'.join(C.STATUSES)})[ ,]*)*$"  # e.g. queued,running


class JobListQuery(Query):
    """``GET jobs?...``: filters; ``status`` takes a comma-separated list."""

    user: Optional[Name] = Field(None, description="admins: whose jobs (others: only their own)")
    status: Optional[Annotated[str, Field(max_length=200, pattern=_STATUS_LIST, description="comma-separated")]] = None
    sweep: Optional[Name] = None
    queue: Optional[Name] = None
    kind: Optional[Name] = None
    name: Optional[Name] = None
    limit: Optional[Annotated[int, Field(ge=1, le=C.MAX_LIST, description="the newest N")]] = None

    @field_validator("status", mode="before")
    @classmethod
    def _statuses(cls, v: str | None) -> str | None:
        if v is None:
            return v
        bad = [x.strip() for x in v.split(",") if x.strip() and x.strip() not in C.STATUSES]
        if bad:
            raise ValueError(f"unknown status {bad[0]!r} (use {', '.join(C.STATUSES)})")
        return v

    def statuses(self) -> list[str]:
        return [x.strip() for x in (self.status or "").split(",") if x.strip()]


class RankQuery(Query):
    rank: Annotated[int, Field(ge=0, le=C.INT64[1], description="a worker of a distributed job (default 0)")] = 0


class LogQuery(RankQuery):
    offset: Annotated[int, Field(ge=0, le=C.INT64[1], description="byte offset (X-Log-Offset of the last answer)")] = 0


class QueuesQuery(Query):
    user: Optional[Name] = Field(None, description="whose access ``may_submit`` reports (default: the caller's; another "
                                                   "user's needs the admin scope: the spawner asks for its user)")


class StrictQuery(Query):
    """Query arguments of a report: an unknown one is a 400 (a misspelt filter changes the numbers)."""

    model_config = ConfigDict(extra="forbid")


class UsageQuery(StrictQuery):
    """``GET usage?...``."""

    since: Optional[Time] = Field(None, description="default: the start of until's month (UTC)")
    until: Optional[Time] = Field(None, description="default: now")
    by: Literal[C.USAGE_GROUPS] = Field(C.DEFAULT_USAGE_GROUP,  # type: ignore[valid-type]
                                        description="the grouping: one row per group")
    user: Optional[Name] = Field(None, description="only this user's usage (others than admins: only their own)")
    queue: Optional[Name] = Field(None, description="only this leaf queue's usage")
    format: Literal["json", "csv"] = Field("json", description="csv: a text/csv download")


class UsageHistoryQuery(StrictQuery):
    """``GET usage/history?...``."""

    since: Optional[Time] = Field(None, description="default: a day before until")
    until: Optional[Time] = Field(None, description="default: now")
    node: Optional[Name] = Field(None, description="only this node's GPUs")
    gpu: Optional[Annotated[int, Field(ge=0, le=C.INT64[1], description="only this GPU index (on every node "
                                                                        "unless node is given)")]] = None
    workload: Optional[Name] = Field(None, description="only the GPUs a workload (j-000042, w-000007) held, while "
                                                       "it held them (its owner or an admin)")


class SuspensionsQuery(Query):
    """``GET suspensions?...``."""

    user: Optional[Name] = Field(None, description="admins: whose suspensions (others: only their own)")
    all: Annotated[bool, Field(description="also the resumed ones")] = False


# ---------------------------------------------------------------------------- answers
# Open models (more fields may come): the document states what clients may rely on. The handlers
# serialise through them (views.py).

class Error(Answer):
    status: int = Field(ge=400, le=599)
    message: str
    field: Optional[str] = None


class PlacementOut(Answer):
    node: str
    gpus: list[int]
    fraction: float


class RankPlacement(Answer):
    rank: int
    node: str
    gpus: list[int]
    fraction: float


class ResumePoint(Answer):
    checkpoint: str
    step: Optional[int] = None


class Attempt(Answer):
    """One run of a job: when and where (each rank), how it ended and why, what it resumed from."""

    attempt: int
    started_at: str
    ended_at: Optional[str] = None
    placement: list[RankPlacement]
    outcome: Optional[Literal[C.ATTEMPT_OUTCOMES]] = Field(  # type: ignore[valid-type]
        None, description="how it ended; null while it runs")
    stop_cause: Optional[Literal[C.STOP_CAUSES]] = Field(  # type: ignore[valid-type]
        None, description="why it was asked to stop, when it was")
    reason: Optional[str] = None
    exit_code: Optional[int] = None
    resumed_from: Optional[ResumePoint] = None


Enforcement = Annotated[Optional[Literal[C.ENFORCEMENT_TIERS]], Field(  # type: ignore[valid-type]
    description="what holds a fractional GPU to its memory share (docs/admin.md); null for whole GPUs")]
ReasonCode = Annotated[Literal[C.REASON_CODES], Field(  # type: ignore[valid-type]
    description="why it waits, for programs (reason is the sentence for people); null when not waiting in a queue")]


class Job(Answer, PoolsOut, EndpointOut):  # + pools, endpoint
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
    history: list[Attempt] = Field([], description="its attempts, oldest first")
    enforcement: Enforcement = None


class JobList(Answer):
    jobs: list[Job]


class Workspace(Answer, PoolsOut):  # + pools
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
    enforcement: Enforcement = None


class WorkspaceList(Answer):
    workspaces: list[Workspace]


class Queue(Answer, QueuePools):  # + pools, usage
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
    pool: str = Field("default", description="the node pool it belongs to")
    schedulable: bool
    labels: dict[str, str]
    gpus: list[GpuOut]
    readings: Optional[Literal["nvml", "dcgm", "simulated"]] = Field(
        None, description="where its GPUs' utilisation and memory readings come from; simulated: made up "
                          "from activity (c.GPUPool.simulated_gpu_readings, the demo), not measured; null: none")
    unschedulable_reason: Optional[str] = None
    state: Literal[C.NODE_STATES] = Field(description="up; draining (drained, workloads still leaving it), drained; failed")  # type: ignore[valid-type]  # noqa: E501
    state_reason: Optional[str] = Field(None, description="why it is out: who took it out and their words, or what the backend found (e.g. 'NotReady in Kubernetes')")  # noqa: E501
    state_source: Optional[str] = Field(None, description="'admin', or the backend that found it out")


class NodeList(Answer):
    nodes: list[Node]


class NodeAction(Node):
    """The node after ``POST nodes/{name}/drain|fail|return``."""
    workloads: list[str] = Field(description="the jobs and workspaces this action stopped or asked to stop now")


class MetricOut(Answer):
    job: str
    name: str
    step: Optional[int]
    value: float
    t: str


class Health(Answer):
    ok: bool
    cycles: int


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
