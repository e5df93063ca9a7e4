"""Parse scenario-format entries (queues, nodes, workloads) into the model, validating every field.

Used by the simulator (scenario files) and by the hub (``c.GPUPool.queues`` / ``c.GPUPool.nodes``),
so both accept exactly the same entries and refuse bad ones with the same message, which names the
field: ``SpecError("workloads[3].gpus", "must be > 0")`` prints ``workloads[3].gpus: must be > 0``.
Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Iterable

from .model import DEFAULT_POOL, KINDS, RESOURCES, NodeSpec, PoolQuota, QueueSpec, Workload
from .units import parse_bytes, parse_cpu


class SpecError(ValueError):
    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _mapping(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(path, "must be a mapping")
    return value


def _list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise SpecError(path, "must be a list")
    return value


def _check_keys(entry: dict, allowed: Iterable[str], path: str) -> None:
    allowed = set(allowed)
    for key in entry:
        if key not in allowed:
            raise SpecError(f"{path}.{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _name(entry: dict, path: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"{path}.name", "is required and must be a non-empty string")
    return name


def _number(value: Any, path: str, *, minimum: float | None = None, strict: bool = False,
            integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, "must be an integer" if integer else "must be a number")
    if integer and int(value) != value:
        raise SpecError(path, "must be an integer")
    if minimum is not None:
        if strict and not value > minimum:
            raise SpecError(path, f"must be > {minimum:g}")
        if not strict and not value >= minimum:
            raise SpecError(path, f"must be >= {minimum:g}")
    return value


def _resources(value: Any, path: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for res, amount in _mapping(value, path).items():
        p = f"{path}.{res}"
        if res not in RESOURCES:
            raise SpecError(p, f"unknown resource (use {', '.join(RESOURCES)})")
        try:
            if res == "gpu":
                out[res] = float(_number(amount, p, minimum=0))
            elif res == "cpu":
                out[res] = parse_cpu(amount)
            else:
                out[res] = float(parse_bytes(amount))
        except ValueError as e:
            if isinstance(e, SpecError):
                raise
            raise SpecError(p, str(e)) from None
    return out


QUEUE_FIELDS = ("name", "parent", "deserved", "limit", "over_quota_weight", "priority", "pools")
POOL_QUOTA_FIELDS = ("deserved", "limit", "over_quota_weight")


def _pool_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(path, "must be a non-empty pool name")
    return value


def _pool_quotas(value: Any, path: str) -> dict[str, PoolQuota]:
    out = {}
    for pool, entry in _mapping(value, path).items():
        p = f"{path}.{pool}"
        _pool_name(pool, p)
        entry = _mapping(entry if entry is not None else {}, p)
        _check_keys(entry, POOL_QUOTA_FIELDS, p)
        weight = entry.get("over_quota_weight")
        if weight is not None:
            weight = float(_number(weight, f"{p}.over_quota_weight", minimum=0))
        quota = PoolQuota(deserved=_resources(entry.get("deserved", {}) or {}, f"{p}.deserved"),
                          limit=_resources(entry.get("limit", {}) or {}, f"{p}.limit"), over_quota_weight=weight)
        for res, lim in quota.limit.items():
            if lim < quota.deserved.get(res, 0):
                raise SpecError(f"{p}.limit.{res}", f"limit {lim:g} is below deserved {quota.deserved[res]:g}")
        out[pool] = quota
    return out


def parse_queue(entry: Any, path: str, extra_fields: Iterable[str] = ()) -> QueueSpec:
    entry = _mapping(entry, path)
    _check_keys(entry, (*QUEUE_FIELDS, *extra_fields), path)
    parent = entry.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise SpecError(f"{path}.parent", "must be a queue name")
    return QueueSpec(
        name=_name(entry, path),
        parent=parent,
        deserved=_resources(entry.get("deserved", {}) or {}, f"{path}.deserved"),
        limit=_resources(entry.get("limit", {}) or {}, f"{path}.limit"),
        over_quota_weight=float(_number(entry.get("over_quota_weight", 1), f"{path}.over_quota_weight", minimum=0)),
        priority=int(_number(entry.get("priority", 0), f"{path}.priority", integer=True)),
        pools=_pool_quotas(entry.get("pools", {}) or {}, f"{path}.pools"),
    )


def parse_queues(entries: Any, path: str = "queues", extra_fields: Iterable[str] = ()) -> list[QueueSpec]:
    """Parse and check a queue tree: unique names, known parents, no cycles, limits >= deserved."""
    queues = [parse_queue(e, f"{path}[{i}]", extra_fields) for i, e in enumerate(_list(entries, path))]
    index: dict[str, int] = {}
    for i, q in enumerate(queues):
        if q.name in index:
            raise SpecError(f"{path}[{i}].name", f"duplicate queue name {q.name!r}")
        index[q.name] = i
    for i, q in enumerate(queues):
        if q.parent is not None and q.parent not in index:
            raise SpecError(f"{path}[{i}].parent", f"unknown queue {q.parent!r}")
        for res, lim in q.limit.items():
            if lim < q.deserved.get(res, 0):
                raise SpecError(f"{path}[{i}].limit.{res}", f"limit {lim:g} is below deserved {q.deserved[res]:g}")
    for i, q in enumerate(queues):  # cycles
        seen, cur = {q.name}, q.parent
        while cur is not None:
            if cur in seen:
                raise SpecError(f"{path}[{i}].parent", f"queue {q.name!r} is its own ancestor")
            seen.add(cur)
            cur = queues[index[cur]].parent
    # children may deserve more than their parent (as Run:ai allows): their guarantees shrink in
    # proportion within the parent's (scheduler/fairshare.py); over_committed() says where
    return queues


def over_committed(queues: list[QueueSpec], capacity: float | None = None, resource: str = "gpu",
                   pool: str | None = None) -> list[str]:
    """Where deserved quotas add up to more than there is: departments whose children deserve more
    than the department (and the top level, against ``capacity`` when given). Not an error: the
    guarantees shrink in proportion (docs/scheduling.md, over-committed quotas). ``pool``: the
    quotas of that node pool (None: every pool any queue names, ``capacity`` then for ``default``)."""
    if pool is None:
        pools = sorted({p for q in queues for p in q.pools} - {DEFAULT_POOL})
        return [*over_committed(queues, capacity, resource, DEFAULT_POOL),
                *(f"in node pool {p}: {m}" for p in pools for m in over_committed(queues, None, resource, p))]
    queues = [q.in_pool(pool) for q in queues]
    out = []
    by_parent: dict[str | None, list[QueueSpec]] = {}
    for q in queues:
        by_parent.setdefault(q.parent, []).append(q)
    spec = {q.name: q for q in queues}
    for parent, children in by_parent.items():
        total = sum(c.deserved.get(resource, 0) for c in children)
        if parent is None:
            if capacity is not None and total > capacity + 1e-9:
                out.append(f"the top-level queues deserve {total:g} {resource} but there are {capacity:g}")
        elif parent in spec and total > spec[parent].deserved.get(resource, 0) + 1e-9:
            out.append(f"the children of {parent!r} deserve {total:g} {resource} in all, more than its "
                       f"{spec[parent].deserved.get(resource, 0):g}")
    return out


NODE_FIELDS = ("name", "count", "gpus", "gpu_memory", "gpu_model", "cpu", "memory", "labels", "pool")


def parse_nodes(entries: Any, path: str = "cluster.nodes") -> list[NodeSpec]:
    """Parse node entries; ``count: N`` expands to nodes NAME-0 .. NAME-(N-1)."""
    nodes: list[NodeSpec] = []
    for i, entry in enumerate(_list(entries, path)):
        p = f"{path}[{i}]"
        entry = _mapping(entry, p)
        _check_keys(entry, NODE_FIELDS, p)
        name = _name(entry, p)
        count = int(_number(entry.get("count", 1), f"{p}.count", minimum=1, integer=True))
        gpus = int(_number(entry.get("gpus", 0), f"{p}.gpus", minimum=0, integer=True))
        try:
            gpu_memory = parse_bytes(entry.get("gpu_memory", 0))
        except ValueError as e:
            raise SpecError(f"{p}.gpu_memory", str(e)) from None
        cpu = memory = None
        if "cpu" in entry:
            try:
                cpu = parse_cpu(entry["cpu"])
            except ValueError as e:
                raise SpecError(f"{p}.cpu", str(e)) from None
        if "memory" in entry:
            try:
                memory = parse_bytes(entry["memory"])
            except ValueError as e:
                raise SpecError(f"{p}.memory", str(e)) from None
        labels = entry.get("labels", {}) or {}
        _mapping(labels, f"{p}.labels")
        labels = {str(k): str(v) for k, v in labels.items()}
        model = entry.get("gpu_model", "")
        if not isinstance(model, str):
            raise SpecError(f"{p}.gpu_model", "must be a string")
        pool = _pool_name(entry.get("pool", DEFAULT_POOL), f"{p}.pool")
        names = [name] if "count" not in entry else [f"{name}-{k}" for k in range(count)]
        for n in names:
            nodes.append(NodeSpec(name=n, gpus=gpus, gpu_memory=gpu_memory, gpu_model=model,
                                  cpu=cpu, memory=memory, labels=labels, pool=pool))
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise SpecError(path, f"duplicate node name {n.name!r}")
        seen.add(n.name)
    return nodes


WORKLOAD_FIELDS = ("name", "queue", "user", "kind", "submit_at", "duration", "gpus", "gpu_memory", "cpu",
                   "memory", "pods", "priority", "preemptible", "checkpoint_every", "checkpoint_on_signal",
                   "node_selector", "pools")


def parse_workload(entry: Any, path: str, queues: dict[str, QueueSpec] | None = None,
                   extra_fields: Iterable[str] = (), id_field: str = "name") -> Workload:
    """Parse one workload entry. ``queues``, when given, must contain its (leaf) queue.
    Scenario-only fields (submit_at, duration, checkpoint_every) are validated here; the caller
    reads them from the entry."""
    entry = _mapping(entry, path)
    _check_keys(entry, (*WORKLOAD_FIELDS, *extra_fields), path)
    wid = _name(entry, path) if id_field == "name" else str(entry.get(id_field, ""))
    queue = entry.get("queue")
    if not isinstance(queue, str) or not queue:
        raise SpecError(f"{path}.queue", "is required")
    if queues is not None:
        if queue not in queues:
            raise SpecError(f"{path}.queue", f"unknown queue {queue!r}")
        if any(q.parent == queue for q in queues.values()):
            raise SpecError(f"{path}.queue", f"{queue!r} is a department (it has child queues); submit to a leaf queue")
    kind = entry.get("kind", "train")
    if kind not in KINDS:
        raise SpecError(f"{path}.kind", f"must be one of {', '.join(KINDS)}")
    if "gpus" in entry and "gpu_memory" in entry:
        raise SpecError(f"{path}.gpu_memory", "give either gpus or gpu_memory, not both")
    gpus = 0.0
    if "gpus" in entry:
        gpus = float(_number(entry["gpus"], f"{path}.gpus", minimum=0, strict=True))
        if gpus > 1 and gpus != int(gpus):
            raise SpecError(f"{path}.gpus", "above 1 must be a whole number of GPUs")
    gpu_memory = 0
    if "gpu_memory" in entry:
        try:
            gpu_memory = parse_bytes(entry["gpu_memory"])
        except ValueError as e:
            raise SpecError(f"{path}.gpu_memory", str(e)) from None
        if gpu_memory <= 0:
            raise SpecError(f"{path}.gpu_memory", "must be > 0")
    try:
        cpu = parse_cpu(entry.get("cpu", 0))
    except ValueError as e:
        raise SpecError(f"{path}.cpu", str(e)) from None
    try:
        memory = parse_bytes(entry.get("memory", 0))
    except ValueError as e:
        raise SpecError(f"{path}.memory", str(e)) from None
    pods = int(_number(entry.get("pods", 1), f"{path}.pods", minimum=1, integer=True))
    priority = entry.get("priority")
    if priority is not None:
        priority = int(_number(priority, f"{path}.priority", integer=True))
    preemptible = entry.get("preemptible")
    if preemptible is not None and not isinstance(preemptible, bool):
        raise SpecError(f"{path}.preemptible", "must be true or false")
    cos = entry.get("checkpoint_on_signal", False)
    if not isinstance(cos, bool):
        raise SpecError(f"{path}.checkpoint_on_signal", "must be true or false")
    for key, minimum, strict in (("submit_at", 0, False), ("duration", 0, True), ("checkpoint_every", 0, True)):
        if key in entry and entry[key] is not None:
            _number(entry[key], f"{path}.{key}", minimum=minimum, strict=strict)
    selector = entry.get("node_selector", {}) or {}
    _mapping(selector, f"{path}.node_selector")
    user = entry.get("user", "")
    if not isinstance(user, str):
        raise SpecError(f"{path}.user", "must be a string")
    pools = entry.get("pools") or []
    if isinstance(pools, str):
        pools = [pools]
    pools = [_pool_name(x, f"{path}.pools[{i}]") for i, x in enumerate(_list(pools, f"{path}.pools"))]
    if len(set(pools)) != len(pools):
        raise SpecError(f"{path}.pools", "lists a pool twice")
    return Workload(
        id=wid, queue=queue, user=user, kind=kind, gpus=gpus, gpu_memory=gpu_memory, cpu=cpu,
        memory=memory, pods=pods, priority=priority, preemptible=preemptible,
        node_selector={str(k): str(v) for k, v in selector.items()}, pools=tuple(pools),
        submit_time=float(entry.get("submit_at", 0) or 0), checkpoint_on_signal=cos,
    )
