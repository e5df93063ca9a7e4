"""Trace fill mode: how well the scheduler's own placement code packs the Alibaba GPU trace.

Implements "Trace fill mode" of the scenario format (spec/scenario.md), the protocol of Weng et al.,
"Beware of Fragmentation" (USENIX ATC 2023):

1. the cluster is the nodes of NODES.csv (1000 milli per GPU; free CPU, memory, per-GPU milli);
2. pods are (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec) rows of PODS.csv;
3. the arrival sequence for a seed: shuffle the trace's pods; while the total GPU request is below
   ``fill`` x capacity append pods drawn uniformly with replacement, stopping at the first draw
   that would pass it; if the trace already exceeds it, drop random pods until it does not;
4. each pod is placed by the placement policy (the same code as the live scheduler) or counted as
   failed and dropped;
5. after every pod: arrived % (GPU milli requested so far, failed included) and allocated %.

``run_trace_fill(nodes_csv, pods_csv, fill, seed, policy)`` returns the JSON report of the spec.
"""
from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.scheduler.cluster import ClusterState, PodRequest
from gpupool.scheduler.model import MILLI, NodeSpec
from gpupool.scheduler.placement import POLICIES, make_policy, typical_shapes

MIB = 2**20


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True)
class TracePod:
    name: str
    req: PodRequest
    models: tuple[str, ...] | None  # allowed GPU models (gpu_spec); None = any

    @property
    def gpu_milli(self) -> int:
        return self.req.gpu_milli_total


def _int(row: dict, col: str, path: Path, line: int, minimum: int = 0) -> int:
    raw = row.get(col)
    if raw is None:
        raise TraceError(f"{path}: line {line}: missing column {col!r}")
    raw = raw.strip()
    try:
        value = int(float(raw)) if raw else 0
    except ValueError:
        raise TraceError(f"{path}: line {line}: {col}: not a number: {raw!r}") from None
    if value < minimum:
        raise TraceError(f"{path}: line {line}: {col}: must be >= {minimum} (got {value})")
    return value


def _open_csv(path: Path, required: tuple[str, ...]):
    path = Path(path)
    try:
        f = open(path, newline="")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    reader = csv.DictReader(f)
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        f.close()
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (has: {', '.join(reader.fieldnames or [])})")
    return f, reader


def read_nodes(path) -> list[NodeSpec]:
    """Nodes from an openb_node_list CSV (sn, cpu_milli, memory_mib, gpu, model)."""
    path = Path(path)
    f, reader = _open_csv(path, ("sn", "cpu_milli", "memory_mib", "gpu"))
    nodes = []
    with f:
        for line, row in enumerate(reader, start=2):
            name = (row.get("sn") or "").strip()
            if not name:
                raise TraceError(f"{path}: line {line}: sn: empty node name")
            gpus = _int(row, "gpu", path, line)
            model = (row.get("model") or "").strip()
            if model.lower() == "nan":
                model = ""
            nodes.append(NodeSpec(name=name, gpus=gpus, gpu_model=model,
                                  cpu=_int(row, "cpu_milli", path, line) / MILLI,
                                  memory=_int(row, "memory_mib", path, line) * MIB))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_pods(path) -> list[TracePod]:
    """Pods from an openb_pod_list CSV; times, qos and phase are ignored."""
    path = Path(path)
    f, reader = _open_csv(path, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    pods = []
    with f:
        for line, row in enumerate(reader, start=2):
            ngpu = _int(row, "num_gpu", path, line)
            milli = _int(row, "gpu_milli", path, line)
            if ngpu > 0 and not 0 < milli <= MILLI:
                raise TraceError(f"{path}: line {line}: gpu_milli: must be 1..1000 for a GPU pod (got {milli})")
            if ngpu > 1 and milli != MILLI:
                raise TraceError(f"{path}: line {line}: gpu_milli: a pod with num_gpu > 1 takes whole GPUs (got {milli})")
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(m.strip() for m in spec.split("|") if m.strip() and m.strip().lower() != "nan") or None
            req = PodRequest(ngpu, milli if ngpu else 0, 0, _int(row, "cpu_milli", path, line),
                             _int(row, "memory_mib", path, line) * MIB)
            pods.append(TracePod((row.get("name") or f"pod-{line}").strip(), req, models if ngpu else None))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def arrival_sequence(pods: list[TracePod], capacity_milli: int, fill: float, rng: np.random.Generator) -> list[int]:
    """Indices into ``pods``: step 3 of the protocol."""
    target = fill * capacity_milli
    milli = np.array([p.gpu_milli for p in pods], dtype=np.int64)
    seq = [int(i) for i in rng.permutation(len(pods))]
    total = int(milli.sum())
    if total > target:
        while total > target and seq:
            j = int(rng.integers(len(seq)))
            total -= int(milli[seq.pop(j)])
    else:
        while total < target:
            i = int(rng.integers(len(pods)))
            if total + milli[i] > target:
                break
            seq.append(i)
            total += int(milli[i])
    return seq


def curve_points(arrived_pct: np.ndarray, alloc_pct: np.ndarray) -> dict[int, float]:
    """One point per whole arrived percent: mean allocated % over the pods whose arrived % rounds
    to it (round half to even, as the paper's analysis does)."""
    keys = np.rint(arrived_pct).astype(np.int64)
    out = {}
    if not keys.size:
        return out
    uniq, inv = np.unique(keys, return_inverse=True)
    sums = np.bincount(inv, weights=alloc_pct)
    cnts = np.bincount(inv)
    for k, s, c in zip(uniq, sums, cnts):
        out[int(k)] = float(s / c)
    return out


def _at(points: dict[int, float], pct: int) -> float | None:
    for k in (pct, pct - 1, pct + 1):
        if k in points:
            return round(points[k], 3)
    return None


def model_mask(state: ClusterState, models: tuple[str, ...] | None) -> np.ndarray | None:
    if not models:
        return None
    ids = [i for i, m in enumerate(state.models) if m in models]
    return np.isin(state.model_id, ids)


def run_trace_fill(nodes_csv, pods_csv, fill: float = 1.3, seed: int = 42, policy: str = "default") -> dict:
    """Run trace fill mode once; returns the spec's JSON report (``trace`` = pods file stem)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r} (choose from {', '.join(POLICIES)})")
    if not (isinstance(fill, (int, float)) and fill > 0 and np.isfinite(fill)):
        raise ValueError(f"fill must be a positive number (got {fill!r})")
    t0 = time.perf_counter()
    nodes = read_nodes(nodes_csv)
    pods = read_pods(pods_csv)
    state = ClusterState(nodes)
    capacity = int(state.num_gpus.sum()) * MILLI
    if capacity <= 0:
        raise TraceError(f"{nodes_csv}: the cluster has no GPUs")
    rng = np.random.default_rng(seed)
    seq = arrival_sequence(pods, capacity, fill, rng)
    shapes = typical_shapes((p.req, p.models) for p in pods)
    pol = make_policy(policy, shapes=shapes, seed=seed)
    masks: dict = {}
    arrived_pct = np.empty(len(seq))
    alloc_pct = np.empty(len(seq))
    arrived = placed = 0
    placed_pods = failed_pods = 0
    for t, i in enumerate(seq):
        pod = pods[i]
        req = pod.req
        arrived += pod.gpu_milli
        if pod.models not in masks:
            masks[pod.models] = model_mask(state, pod.models)
        choice = pol.choose(state, req, masks[pod.models])
        if choice is None:
            failed_pods += 1
        else:
            n, gpus, milli = choice
            state.take(n, gpus, milli, req.cpu_milli, req.memory)
            placed += milli * len(gpus)
            placed_pods += 1
        arrived_pct[t] = 100.0 * arrived / capacity
        alloc_pct[t] = 100.0 * placed / capacity
    points = curve_points(arrived_pct, alloc_pct)
    seconds = time.perf_counter() - t0
    return {
        "trace": Path(pods_csv).stem, "seed": seed, "policy": policy, "fill": fill,
        "gpu_capacity_milli": capacity,
        "curve": [{"arrived_pct": k, "alloc_pct": round(v, 3)} for k, v in sorted(points.items())],
        "metrics": {"alloc_pct_at_100": _at(points, 100), "alloc_pct_at_130": _at(points, 130),
                    "placed_pods": placed_pods, "failed_pods": failed_pods,
                    "arrived_pods": len(seq), "typical_shapes": len(shapes),
                    "seconds": round(seconds, 3)},
    }


def format_trace_report(report: dict) -> str:
    """A short human summary of a trace fill report."""
    m = report["metrics"]

    def pct(v):
        return "n/a" if v is None else f"{v:.2f}%"

    lines = [
        f"trace {report['trace']}  policy {report['policy']}  seed {report['seed']}  fill {report['fill']}",
        f"  cluster: {report['gpu_capacity_milli'] / MILLI:g} GPUs",
        f"  pods: {m['arrived_pods']} arrived, {m['placed_pods']} placed, {m['failed_pods']} failed",
        f"  GPUs allocated at 100% arrived: {pct(m['alloc_pct_at_100'])}",
        f"  GPUs allocated at 130% arrived: {pct(m['alloc_pct_at_130'])}",
        f"  {m['seconds']:.2f} s",
    ]
    return "\n".join(lines)
