"""Load and validate a scenario file (../shared/spec/scenario.md): YAML or JSON.

Every error is a :class:`~gpupool.scheduler.spec.SpecError` whose message names the field, e.g.
``workloads[3].gpus: must be > 0``. Queue, node and workload entries are parsed by
``gpupool.scheduler.spec`` (the same parser the hub uses for its configuration), so a scenario
accepts exactly what the live service accepts.

Scenario-only extensions (compatible additions to the public format):

* top level ``name`` and ``description`` (free text);
* ``config.placement`` (placement policy name) and ``config.topology_key`` (node label grouping
  nodes for gang placement, default ``rack``);
* workload ``count: N`` expands one entry into ``NAME-0 .. NAME-(N-1)``, and ``submit_every: S``
  staggers their submissions (``submit_at + k * S``).

``cluster.events`` (the spec's "Nodes that fail, drain and return") is parsed here into
:class:`NodeEvent` objects; the engine carries them out.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.scheduler.model import NodeSpec, QueueSpec, Workload
from gpupool.scheduler.placement import POLICIES
from gpupool.scheduler.units import parse_bytes
from gpupool.scheduler.usage import WINDOW_TYPES, FairnessConfig
from gpupool.scheduler.spec import SpecError, parse_nodes, parse_queues, parse_workload

TOP_LEVEL = ("name", "description", "config", "cluster", "queues", "workloads")
CONFIG_FIELDS = ("cycle", "preemption_grace", "min_runtime", "until", "placement", "topology_key",
                 "gpu_memory_reserve", "fairness")
FAIRNESS_FIELDS = ("window", "window_type", "half_life", "k")
CLUSTER_FIELDS = ("nodes", "events")
NODE_ACTIONS = ("fail", "drain", "return")
EVENT_FIELDS = ("t", "node", "action")
WORKLOAD_EXTRA = ("count", "submit_every")


@dataclass(frozen=True)
class SimConfig:
    cycle: float = 1.0
    preemption_grace: float = 30.0
    min_runtime: float = 0.0
    until: float | None = None
    placement: str = "default"
    topology_key: str = "rack"
    gpu_memory_reserve: float = 0.0  # fraction of each GPU's memory the driver keeps
    gpu_memory_reserve_min: int = 0  # ... at least this many bytes
    fairness: FairnessConfig | None = None  # fairness over time (absent: none)


@dataclass
class WorkloadEntry:
    """One workload of the scenario: the model object (its template state) plus the replay-only
    fields."""

    workload: Workload
    duration: float
    checkpoint_every: float | None
    path: str  # where it came from in the file, e.g. "workloads[3]" (for messages)


@dataclass(frozen=True)
class NodeEvent:
    """A node of the inventory fails, is drained or returns at ``t`` (``cluster.events[i]``)."""

    t: float
    node: str
    action: str  # one of NODE_ACTIONS
    path: str  # "cluster.events[2]" (for messages)


@dataclass
class Scenario:
    name: str
    config: SimConfig
    nodes: list[NodeSpec]
    queues: list[QueueSpec]
    workloads: list[WorkloadEntry]
    description: str = ""
    source: str = ""
    leaves: list[str] = field(default_factory=list)
    events: list[NodeEvent] = field(default_factory=list)  # in time order (file order at equal times)


def _number(value: Any, path: str, *, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, "must be a number")
    if strict and not value > minimum:
        raise SpecError(path, f"must be > {minimum:g}")
    if not strict and not value >= minimum:
        raise SpecError(path, f"must be >= {minimum:g}")
    return float(value)


def _known_keys(value: Any, fields: tuple[str, ...], path: str, not_a_mapping: str) -> None:
    if not isinstance(value, dict):
        raise SpecError(path, not_a_mapping)
    for key in value:
        if key not in fields:
            raise SpecError(f"{path}.{key}", f"unknown field (allowed: {', '.join(fields)})")


def parse_config(value: Any, path: str = "config") -> SimConfig:
    if value is None:
        return SimConfig()
    _known_keys(value, CONFIG_FIELDS, path, "must be a mapping")
    kw: dict[str, Any] = {}
    if value.get("cycle") is not None:
        kw["cycle"] = _number(value["cycle"], f"{path}.cycle", minimum=0, strict=True)
    for key in ("preemption_grace", "min_runtime"):
        if value.get(key) is not None:
            kw[key] = _number(value[key], f"{path}.{key}", minimum=0, strict=False)
    if value.get("until") is not None:
        kw["until"] = _number(value["until"], f"{path}.until", minimum=0, strict=False)
    if value.get("placement") is not None:
        if value["placement"] not in POLICIES:
            raise SpecError(f"{path}.placement", f"unknown placement policy (choose from {', '.join(POLICIES)})")
        kw["placement"] = value["placement"]
    if value.get("topology_key") is not None:
        if not isinstance(value["topology_key"], str) or not value["topology_key"]:
            raise SpecError(f"{path}.topology_key", "must be a non-empty string (a node label key)")
        kw["topology_key"] = value["topology_key"]
    if value.get("gpu_memory_reserve") is not None:  # {fraction: 0.03, min: 256Mi}
        r, rp = value["gpu_memory_reserve"], f"{path}.gpu_memory_reserve"
        if not isinstance(r, dict) or set(r) - {"fraction", "min"}:
            raise SpecError(rp, "must be a mapping with fraction (0 to 1) and/or min (bytes, e.g. 256Mi)")
        if r.get("fraction") is not None:
            kw["gpu_memory_reserve"] = _number(r["fraction"], f"{rp}.fraction", minimum=0, strict=False)
            if kw["gpu_memory_reserve"] >= 1:
                raise SpecError(f"{rp}.fraction", "must be below 1")
        if r.get("min") is not None:
            try:
                kw["gpu_memory_reserve_min"] = parse_bytes(r["min"])
            except (TypeError, ValueError) as e:
                raise SpecError(f"{rp}.min", str(e)) from None
    if value.get("fairness") is not None:
        kw["fairness"] = parse_fairness(value["fairness"], f"{path}.fairness")
    return SimConfig(**kw)


def parse_fairness(value: Any, path: str = "config.fairness") -> FairnessConfig:
    """``config.fairness``: {window, window_type, half_life, k} (the spec's fairness over time)."""
    _known_keys(value, FAIRNESS_FIELDS, path, "must be a mapping with window, window_type, half_life and k")
    kw: dict[str, Any] = {}
    if value.get("window") is not None:
        kw["window"] = _number(value["window"], f"{path}.window", minimum=0, strict=True)
    if value.get("window_type") is not None:
        if value["window_type"] not in WINDOW_TYPES:
            raise SpecError(f"{path}.window_type", f"must be one of {', '.join(WINDOW_TYPES)}")
        kw["window_type"] = value["window_type"]
    if value.get("half_life") is not None:
        kw["half_life"] = _number(value["half_life"], f"{path}.half_life", minimum=0, strict=True)
    if value.get("k") is not None:
        kw["k"] = _number(value["k"], f"{path}.k", minimum=0, strict=False)
    return FairnessConfig(**kw)


def parse_events(value: Any, node_names: list[str], path: str = "cluster.events") -> list[NodeEvent]:
    """``cluster.events``: a list of ``{t, node, action}``; returned sorted by time (stable)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(path, "must be a list of {t, node, action}")
    known = set(node_names)
    out = []
    for i, entry in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(entry, dict):
            raise SpecError(p, "must be a mapping with t, node and action")
        for key in entry:
            if key not in EVENT_FIELDS:
                raise SpecError(f"{p}.{key}", f"unknown field (allowed: {', '.join(EVENT_FIELDS)})")
        for key in EVENT_FIELDS:
            if entry.get(key) is None:
                raise SpecError(f"{p}.{key}", "is required")
        t = _number(entry["t"], f"{p}.t", minimum=0, strict=False)
        node = entry["node"]
        if not isinstance(node, str):
            raise SpecError(f"{p}.node", "must be a node name (a string)")
        if node not in known:
            raise SpecError(f"{p}.node", f"no node {node!r}")
        action = entry["action"]
        if action not in NODE_ACTIONS:
            raise SpecError(f"{p}.action", f"must be one of {', '.join(NODE_ACTIONS)} (got {action!r})")
        out.append(NodeEvent(t, node, action, p))
    return sorted(out, key=lambda e: e.t)


def _expand_workload(entry: Any, path: str) -> list[dict]:
    """``count``/``submit_every`` expansion of one raw workload entry (validated here)."""
    if not isinstance(entry, dict):
        raise SpecError(path, "must be a mapping")
    if "count" not in entry:
        if "submit_every" in entry:
            raise SpecError(f"{path}.submit_every", "only makes sense with count")
        return [entry]
    count = entry["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SpecError(f"{path}.count", "must be an integer >= 1")
    every = 0.0
    if entry.get("submit_every") is not None:
        every = _number(entry["submit_every"], f"{path}.submit_every", minimum=0, strict=False)
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"{path}.name", "is required and must be a non-empty string")
    base = entry.get("submit_at", 0)
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise SpecError(f"{path}.submit_at", "must be a number")
    out = []
    for k in range(count):
        e = {key: v for key, v in entry.items() if key not in WORKLOAD_EXTRA}
        e["name"] = f"{name}-{k}"
        if every:
            e["submit_at"] = base + k * every
        out.append(e)
    return out


def parse_scenario(data: Any, name: str = "scenario", source: str = "") -> Scenario:
    """Validate a scenario already read into Python objects (dicts/lists)."""
    if not isinstance(data, dict):
        raise SpecError("(top level)", "a scenario must be a mapping with cluster, queues and workloads")
    for key in data:
        if key not in TOP_LEVEL:
            raise SpecError(str(key), f"unknown top-level field (allowed: {', '.join(TOP_LEVEL)})")
    for key in ("cluster", "queues", "workloads"):
        if key not in data:
            raise SpecError(key, "is required")
    sname = data.get("name", name)
    if not isinstance(sname, str) or not sname:
        raise SpecError("name", "must be a non-empty string")
    desc = data.get("description", "") or ""
    if not isinstance(desc, str):
        raise SpecError("description", "must be a string")
    config = parse_config(data.get("config"))

    cluster = data["cluster"]
    if not isinstance(cluster, dict):
        raise SpecError("cluster", "must be a mapping with nodes")
    for key in cluster:
        if key not in CLUSTER_FIELDS:
            raise SpecError(f"cluster.{key}", f"unknown field (allowed: {', '.join(CLUSTER_FIELDS)})")
    if "nodes" not in cluster:
        raise SpecError("cluster.nodes", "is required")
    nodes = parse_nodes(cluster["nodes"], "cluster.nodes")
    if not nodes:
        raise SpecError("cluster.nodes", "must list at least one node")
    events = parse_events(cluster.get("events"), [n.name for n in nodes])

    queues = parse_queues(data["queues"], "queues")
    if not queues:
        raise SpecError("queues", "must list at least one queue")
    qmap = {q.name: q for q in queues}
    parents = {q.parent for q in queues if q.parent}
    leaves = [q.name for q in queues if q.name not in parents]

    raw = data["workloads"]
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise SpecError("workloads", "must be a list")
    entries: list[WorkloadEntry] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(raw):
        path = f"workloads[{i}]"
        for e in _expand_workload(item, path):
            w = parse_workload(e, path, qmap, extra_fields=WORKLOAD_EXTRA)
            if w.id in seen:
                raise SpecError(f"{path}.name", f"duplicate workload name {w.id!r} (also {seen[w.id]})")
            seen[w.id] = path
            ce = e.get("checkpoint_every")
            # no duration: it runs until the replay ends (the spec's examples that omit it)
            dur = e.get("duration")
            entries.append(WorkloadEntry(workload=w, duration=math.inf if dur is None else float(dur),
                                         checkpoint_every=float(ce) if ce is not None else None, path=path))
    return Scenario(name=sname, config=config, nodes=nodes, queues=queues, workloads=entries,
                    description=desc, source=source, leaves=leaves, events=events)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            mark = key_node.start_mark
            raise SpecError(str(key), f"given twice (line {mark.line + 1})")
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_scenario_data(path: str | Path) -> Any:
    """Read a YAML or JSON file into Python objects. Raises SpecError (naming the file) on a
    missing file or a syntax error."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(p), "no such file") from None
    except IsADirectoryError:
        raise SpecError(str(p), "is a directory, not a scenario file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(p), f"cannot read: {e}") from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(str(p), f"not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise SpecError(str(p), f"not valid YAML{where}: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise SpecError(str(p), f"not valid YAML: {e}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    p = Path(path)
    return parse_scenario(read_scenario_data(p), name=p.stem, source=str(p))


def fresh_workloads(scenario: Scenario) -> list[WorkloadEntry]:
    """Independent copies of the scenario's workloads (a replay mutates their state)."""
    return [WorkloadEntry(copy.deepcopy(e.workload), e.duration, e.checkpoint_every, e.path)
            for e in scenario.workloads]
