"""The facts that cross the API boundary, defined once (docs/api.md, ``GET api/v1/openapi.json``).

Every adapter imports them from here: the service (hub_ext), the Python client and CLI, the
spawner and the widgets. The scheduler core keeps its own model (``scheduler/model.py``); what it
defines (the workload kinds, byte quantities) is re-exported here, never re-declared.

* statuses of jobs and workspaces, and the groups adapters test against;
* kinds (the core's ``KINDS``) and reason codes (the core's ``Code``: why a workload waits);
* the public ids of jobs and workspaces (``j-000042``) and their limits;
* the error payload every non-2xx JSON answer carries;
* allocations as the API sends them, and how a person reads one;
* quantities in words: bytes (``8Gi``) and GPUs (``0.5 GPU``, ``2 GPUs``, ``0 GPUs (CPU only)``);
* the groupings of usage reports (``GET usage?by=``);
* the allocation codec: a stored allocation <-> the scheduler's placements;
* the job protocol (environment, job directory, stop and checkpoint files, GPU environment): in
  :mod:`gpupool.protocol` (standard library only, so a job imports it cheaply), re-exported here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from . import protocol
from .protocol import Env, JobDir, gpu_env, job_env, read_stop, write_stop  # noqa: F401 (re-exported)
from .scheduler.model import KINDS, PodPlacement
from .scheduler.reasons import IN_MOTION, Cause, Code
from .scheduler.units import format_amount, format_bytes, parse_bytes

# -- statuses --------------------------------------------------------------------------------
QUEUED, STARTING, RUNNING, PREEMPTING = "queued", "starting", "running", "preempting"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
ACTIVE = (QUEUED, STARTING, RUNNING, PREEMPTING)  # not finished; a workload in the scheduler's hands
HOLDING = (STARTING, RUNNING, PREEMPTING)  # admitted: its GPUs are granted
ENDED = (SUCCEEDED, FAILED, CANCELLED)  # a job's final statuses
STATUSES = ACTIVE + ENDED  # every status a job may have
STOPPED = "stopped"  # the answer of DELETE workspaces/...: the workspace is gone, its GPUs free
WORKSPACE_STATUSES = ACTIVE + (STOPPED,)

# -- kinds (the core's) ----------------------------------------------------------------------
INTERACTIVE, TRAIN, HPO_TRIAL, INFERENCE = KINDS
JOB_KINDS = tuple(k for k in KINDS if k != INTERACTIVE)  # workspaces are the interactive kind
DEFAULT_JOB_KIND = TRAIN

# -- reason codes (the core's): the API's ``reason_code`` next to ``reason`` ----------------------
REASON_CODES = tuple(c.value for c in Code)


def reason_code(pending: object) -> str | None:
    """The ``reason_code`` of a waiting workload's reason (a core ``Pending``); None for a sentence."""
    code = getattr(pending, "code", None)
    return code.value if isinstance(code, Code) else None


# -- usage reports (``GET usage?by=``, ``gpupool report --by``) ------------------------------
USAGE_PERIODS = ("day", "week", "month")  # calendar periods, in UTC
USAGE_GROUPS = ("user", "queue", "department", "model", "node", "kind", "pool", *USAGE_PERIODS)
DEFAULT_USAGE_GROUP = "user"

# -- ids -------------------------------------------------------------------------------------
JOB, WORKSPACE = "job", "workspace"
_PREFIX = {JOB: "j", WORKSPACE: "w"}
ID_DIGITS = 18  # a database INTEGER holds 18 decimal digits for sure (SQLite: 64-bit)
JOB_ID_PATTERN = rf"^j-[0-9]{{1,{ID_DIGITS}}}$"
_ID_RE = re.compile(rf"^([jw])-([0-9]{{1,{ID_DIGITS}}})$")


def public_id(type_: str, num: int) -> str:
    """``("job", 42)`` -> ``"j-000042"``."""
    return f"{_PREFIX[type_]}-{num:06d}"


def parse_public_id(text: str) -> tuple[str, int] | None:
    """``"j-000042"`` -> ``("job", 42)``; None when it is not an id (or a number no row can have)."""
    m = _ID_RE.match(text) if isinstance(text, str) else None
    if m is None:
        return None
    return (JOB if m.group(1) == "j" else WORKSPACE), int(m.group(2))


# -- limits users need (the request models state them; docs/api.md lists them) ---------------
MAX_NAME = 255  # names, queue names, sweep ids, users, servers, metric names
MAX_PATH = 4096  # notebook paths
MAX_GPUS = 1024  # GPUs one request may ask for
MAX_ARGS = 1000  # items of a script's args or a command
MAX_PODS = 4096  # workers of one job (c.GPUPool.max_pods sets the pool's own, lower limit)
MAX_CPU = 1_000_000  # cores
MAX_BYTES = 2**50  # memory / gpu_memory (1 PiB)
PRIORITY_RANGE = (-1_000_000_000, 1_000_000_000)
INT64 = (-(2**63), 2**63 - 1)  # metric steps, offsets: what the database stores
MAX_LIST = 10_000  # GET jobs?limit=


# -- the error payload -----------------------------------------------------------------------
def error_payload(status: int, message: str, field: str | None = None) -> dict:
    """The body of every error answer: ``{"status": 400, "message": "gpus: ...", "field": "gpus"}``."""
    body: dict[str, Any] = {"status": status, "message": message}
    if field:
        body["field"] = field
    return body


def read_error(body: Any) -> tuple[str | None, str | None]:
    """(message, field) of an error answer's JSON body (None, None when it is not one)."""
    if not isinstance(body, Mapping):
        return None, None
    message = body.get("message") or body.get("reason") or body.get("error")
    field = body.get("field")
    return (str(message) if message else None), (str(field) if field else None)


# -- allocations -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """One pod's share of one node: GPU indices there and the fraction of each (1.0 = whole)."""

    node: str
    gpus: tuple[int, ...] = ()
    fraction: float = 1.0

    def to_api(self) -> dict:
        return {"node": self.node, "gpus": list(self.gpus), "fraction": self.fraction}

    def describe(self) -> str:
        """``box GPU 0,1``, ``box GPU 1 (0.5)`` or ``box (no GPU)``."""
        if not self.gpus:
            return f"{self.node} (no GPU)"
        text = f"{self.node} GPU {','.join(str(g) for g in self.gpus)}"
        return text if self.fraction == 1 else f"{text} ({self.fraction:g})"


def encode_allocation(placements: Iterable[PodPlacement]) -> list[dict]:
    """The scheduler's placements as stored (the database's ``allocation`` and reservations, the
    pods' placement annotation): ``[{"pod": 0, "node": "n1", "gpus": [0, 1], "fraction": 1.0}]``."""
    return [{"pod": int(p.pod), "node": p.node, "gpus": [int(g) for g in p.gpus], "fraction": float(p.fraction)}
            for p in placements]


def decode_allocation(data: Iterable[Mapping] | None) -> tuple[PodPlacement, ...]:
    """The inverse of :func:`encode_allocation`: a stored allocation -> the scheduler's placements
    (a missing ``pod`` is the entry's index, a missing or null ``fraction`` 1.0). Raises KeyError,
    TypeError or ValueError on an entry without a node or with a bad number."""
    out = []
    for i, p in enumerate(data or ()):
        fraction = p.get("fraction")
        pod = p.get("pod")
        out.append(PodPlacement(pod=i if pod is None else int(pod), node=str(p["node"]),
                                gpus=tuple(int(g) for g in p.get("gpus") or ()),
                                fraction=1.0 if fraction is None else float(fraction)))
    return tuple(out)


def allocation_from_api(data: Iterable[Mapping] | None) -> list[Placement]:
    """The API's (or the database's) ``allocation`` list -> placements."""
    return [Placement(node=p.node, gpus=p.gpus, fraction=p.fraction) for p in decode_allocation(data)]


def allocation_to_api(data: Iterable[Mapping] | Iterable[Placement] | None) -> list[dict]:
    """Placements (or stored allocation dicts) -> the API's ``allocation`` list."""
    return [(p if isinstance(p, Placement) else allocation_from_api([p])[0]).to_api() for p in (data or [])]


def describe_allocation(data: Iterable[Mapping] | None) -> str:
    """``box GPU 0,1; box2 GPU 0 (0.5)`` ("" when it holds nothing)."""
    return "; ".join(p.describe() for p in allocation_from_api(data))


# -- quantities ------------------------------------------------------------------------------
def format_gpus(amount: float | None) -> str:
    """``0.5 GPU``, ``1 GPU``, ``2 GPUs``, ``0 GPUs (CPU only)``."""
    amount = float(amount or 0)
    return format_amount("gpu", amount) if amount > 0 else "0 GPUs (CPU only)"


def format_request(gpus: float | None = None, gpu_memory: int | str | None = None, pods: int | None = 1) -> str:
    """What a workload asks for: ``0.5 GPU``, ``2 GPUs``, ``8Gi of one GPU``, ``0 GPUs (CPU only)``,
    ``2 workers x 4 GPUs``."""
    each = f"{format_bytes(parse_bytes(gpu_memory))} of one GPU" if gpu_memory else format_gpus(gpus)
    pods = int(pods or 1)
    return f"{pods} workers x {each}" if pods > 1 else each


def format_policy_value(name: str, value: Any) -> str:
    """A value of a workload policy (``GET policies/effective``) as people read it: ``2 GPUs``,
    ``16Gi``, ``8 h``, ``yes``, ``train, interactive``."""
    if name in ("run_time", "idle_time"):
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if value >= size and value % size == 0:
                return f"{value / size:g} {unit}"
        return f"{value:g} s"
    if name in ("gpu_memory", "memory"):
        return format_bytes(value)
    if name in ("gpus", "gpus_per_pod"):
        return format_gpus(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(sorted(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = [
    "QUEUED", "STARTING", "RUNNING", "PREEMPTING", "SUCCEEDED", "FAILED", "CANCELLED", "ACTIVE", "HOLDING",
    "ENDED", "STATUSES", "STOPPED", "WORKSPACE_STATUSES", "KINDS", "INTERACTIVE", "TRAIN", "HPO_TRIAL",
    "INFERENCE", "JOB_KINDS", "Code", "IN_MOTION", "REASON_CODES", "reason_code", "DEFAULT_JOB_KIND", "JOB",
    "WORKSPACE", "JOB_ID_PATTERN", "public_id", "parse_public_id", "MAX_NAME", "MAX_PATH", "MAX_GPUS", "MAX_ARGS",
    "MAX_PODS", "MAX_CPU", "MAX_BYTES", "PRIORITY_RANGE", "INT64",
    "MAX_LIST", "USAGE_PERIODS", "USAGE_GROUPS", "DEFAULT_USAGE_GROUP", "error_payload", "read_error", "Placement",
    "encode_allocation", "decode_allocation", "allocation_from_api", "allocation_to_api", "describe_allocation",
    "format_bytes", "parse_bytes", "format_gpus", "format_request", "format_policy_value", "Env", "JobDir", "StopCause",
]


# -- why a workload holding GPUs is asked to stop (its row's ``stop_cause``) ----------------------
class StopCause(str, Enum):
    """Why a workload that holds GPUs was asked to checkpoint and stop; the value is what the
    service stores. ``preempt``: the scheduler (or an idle or run-time rule) takes its GPUs and it
    is requeued; ``cancel``: its owner or an admin cancelled it; ``memory``: it used more GPU
    memory than its share (``memory_enforcement = 'stop'``) and fails; ``drain``: its node is
    drained (it checkpoints and is requeued, a workspace is suspended); ``node-failure``: its node
    failed (stopped at once, requeued from its last checkpoint). The last two are the core's
    ``Cause`` values of the same name."""

    PREEMPT = "preempt"
    CANCEL = "cancel"
    MEMORY = "memory"
    DRAIN = Cause.DRAIN.value
    NODE_FAILURE = Cause.NODE_FAILURE.value

    def __str__(self) -> str:
        return self.value


# -- nodes taken out of service and back (``POST nodes/{name}/drain|fail|return``, GET nodes) ----
NODE_ACTIONS = ("drain", "fail", "return")
# a node's ``state``: in service; drained with workloads still leaving it, or empty; failed
NODE_UP, NODE_DRAINING, NODE_DRAINED, NODE_FAILED = "up", "draining", "drained", "failed"
NODE_STATES = (NODE_UP, NODE_DRAINING, NODE_DRAINED, NODE_FAILED)

__all__ += ["NODE_ACTIONS", "NODE_UP", "NODE_DRAINING", "NODE_DRAINED", "NODE_FAILED", "NODE_STATES"]


STOP_CAUSES = tuple(c.value for c in StopCause)
__all__ += ["STOP_CAUSES"]


# -- how one attempt of a workload ended (an entry of its ``history``) ---------------------------
# succeeded, failed, cancelled: the run's end was the workload's; preempted: stopped for another
# workload (or an idle or run-time rule) and requeued; requeued: a worker of a gang was lost and the
# gang starts again; lost: its run was gone when the service restarted; retried: its run died before
# its code ran (an infrastructure failure, c.GPUPool.startup_retries) and it starts again;
# suspended: a workspace suspended by an idle rule. An attempt still running has none (null).
PREEMPTED, REQUEUED, LOST, RETRIED, SUSPENDED = "preempted", "requeued", "lost", "retried", "suspended"
ATTEMPT_OUTCOMES = (SUCCEEDED, FAILED, CANCELLED, PREEMPTED, REQUEUED, LOST, RETRIED, SUSPENDED)


def history_marker(status: str | None, attempts: int | None) -> str:
    """A short mark of a job's past attempts for a list: ``resumed x2`` (running again after two
    ends), ``requeued x1`` (waiting again after one); "" for a job on its first attempt."""
    n = int(attempts or 0)
    if status == QUEUED and n >= 1:
        return f"requeued x{n}"
    return f"resumed x{n - 1}" if n >= 2 else ""


__all__ += ["PREEMPTED", "REQUEUED", "LOST", "RETRIED", "SUSPENDED", "ATTEMPT_OUTCOMES", "history_marker"]


# -- what holds a fractional workload to its GPU memory share (its ``enforcement``) --------------
# driver: its own cgroup, capped by the NVIDIA driver (an allocation past the cap fails in the job);
# watch: NVML's per-process readings, checked every cycle against the share (c.GPUPool.memory_enforcement);
# framework: only its frameworks are told the cap (PyTorch, TensorFlow, JAX; the other tiers are
# missing there, e.g. on Kubernetes without a GPU-sharing scheduler that enforces it). Whole GPUs: null.
ENFORCE_DRIVER, ENFORCE_WATCH, ENFORCE_FRAMEWORK = "driver", "watch", "framework"
ENFORCEMENT_TIERS = (ENFORCE_DRIVER, ENFORCE_WATCH, ENFORCE_FRAMEWORK)
ENFORCEMENT_WORDS = {
    ENFORCE_DRIVER: "driver: its own cgroup; the NVIDIA driver refuses GPU memory past its share",
    ENFORCE_WATCH: "watch: NVML readings checked against its share; its frameworks are told the cap",
    ENFORCE_FRAMEWORK: "framework: PyTorch, TensorFlow and JAX are told the cap; nothing outside the job enforces it",
}
__all__ += ["ENFORCE_DRIVER", "ENFORCE_WATCH", "ENFORCE_FRAMEWORK", "ENFORCEMENT_TIERS", "ENFORCEMENT_WORDS"]


# -- the state of a GPU over a window of the utilisation history ----------------------------------
# busy: it computed; idle: 0 % and (almost) no memory; held: 0 % while holding memory all along
# (an open notebook keeping a tensor on the GPU): its own state in the history, the dashboard and
# the idle rules. HELD_MEMORY is more than a CUDA context alone takes (a few hundred MiB).
GPU_BUSY, GPU_IDLE, GPU_HELD = "busy", "idle", "held"
GPU_STATES = (GPU_BUSY, GPU_IDLE, GPU_HELD)
HELD_MEMORY = 2**30


def gpu_state(utilization: float | None, memory_used: float | None) -> str | None:
    """The state of one reading (None: no utilisation reading, unknown)."""
    if utilization is None:
        return None
    if utilization > 0:
        return GPU_BUSY
    return GPU_HELD if (memory_used or 0) >= HELD_MEMORY else GPU_IDLE


__all__ += ["GPU_BUSY", "GPU_IDLE", "GPU_HELD", "GPU_STATES", "HELD_MEMORY", "gpu_state"]


# -- model endpoints (``kind: inference``; docs/endpoints.md) ------------------------------------
class EndpointState(str, Enum):
    """Whether an endpoint serves (its job's ``endpoint_state``). ``starting``: no replica has
    answered the service's readiness probe since it (re)started; ``ready``: at least one replica
    answers (``ready_replicas`` says how many), and the endpoint's URL reaches it."""

    STARTING = "starting"
    READY = "ready"

    def __str__(self) -> str:
        return self.value


ENDPOINT_STATES = tuple(s.value for s in EndpointState)
ENDPOINT_ROUTE = "endpoints"  # under the service's prefix: /services/gpupool/endpoints/<job id>/
MAX_SHARES = 256  # users or groups one endpoint may be shared with


def endpoint_path(service_prefix: str, job_id: str) -> str:
    """The stable URL path of a job's endpoint through the hub: ``/services/gpupool/endpoints/j-000042/``."""
    return f"{service_prefix.rstrip('/')}/{ENDPOINT_ROUTE}/{job_id}/"


def endpoint_shown_state(status: str | None, endpoint_state: str | None) -> str:
    """What a list of endpoints says of one (the CLI, the widgets, the dashboard): ``ready`` or
    ``starting`` while its job runs, else the job's status (``queued``, ``failed``, ...)."""
    if status == RUNNING:
        return endpoint_state or EndpointState.STARTING.value
    return str(status or "?")


def endpoint_replicas(ready: int | None, pods: int | None) -> str:
    """``1/2``: the replicas that answer the readiness probe, of those asked for."""
    return f"{int(ready or 0)}/{int(pods or 1)}"


__all__ += ["EndpointState", "ENDPOINT_STATES", "ENDPOINT_ROUTE", "MAX_SHARES", "endpoint_path",
            "endpoint_shown_state", "endpoint_replicas"]
