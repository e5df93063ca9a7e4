"""GPU readings on Kubernetes: NVIDIA's DCGM exporter, read through Prometheus.

NVML covers only the service's own machine; on a cluster each GPU node runs the DCGM exporter
(the GPU Operator installs it) and Prometheus scrapes it. ``c.GPUPool.prometheus_url`` names that
Prometheus; :func:`readings` asks it (its HTTP API, ``/api/v1/query``) for the latest
``DCGM_FI_DEV_GPU_UTIL`` (percent), ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB) of
every GPU and returns them in NVML's shape, per node and GPU index, for the utilisation history,
the idle rules and the used GPU-hours.

Each series is mapped to a (node, GPU index) by, in order:

1. its ``UUID`` label, among the GPU UUIDs the service knows per node (the nodes' annotations);
2. the exporter's pod labels (``namespace``, ``pod``: the pod using the GPU, with the exporter's
   Kubernetes mapping on, its default): the node that pod of a gpupool workload runs on, and the
   ``gpu`` label as the index;
3. its ``Hostname`` label, when it is a node's name (an exporter on the host network).

A series none of these place is left out (a GPU gpupool does not schedule). Standard library only
(``urllib``); nothing here raises: Prometheus unreachable or answering nonsense is logged and
read as "no readings" (unknown, never 0 %).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

log = logging.getLogger("gpupool.dcgm")

UTIL, FB_USED, FB_FREE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
QUERY = f'{{__name__=~"{UTIL}|{FB_USED}|{FB_FREE}"}}'
MiB = 2**20


def query(url: str, promql: str, timeout: float = 5.0) -> list[dict]:
    """The instant vector ``promql`` evaluates to now: ``[{"metric": {labels}, "value": [t, "v"]}]``."""
    full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(full, timeout=timeout) as r:
        body = json.loads(r.read().decode())
    if body.get("status") != "success" or (body.get("data") or {}).get("resultType") != "vector":
        raise ValueError(f"Prometheus answered {str(body)[:200]}")
    return list(body["data"]["result"])


def place(labels: Mapping[str, str], uuids: Mapping[str, Sequence[str]],
          pods: Mapping[tuple[str, str], str]) -> tuple[str, int] | None:
    """(node, GPU index) of one series from its labels (see the module's rules), or None."""
    uuid = labels.get("UUID") or labels.get("uuid")
    if uuid:
        for node, known in uuids.items():
            if uuid in known:
                return node, list(known).index(uuid)
    try:
        index = int(labels.get("gpu", ""))
    except ValueError:
        return None
    node = pods.get((labels.get("namespace", ""), labels.get("pod", ""))) if labels.get("pod") else None
    if node is None and labels.get("Hostname") in uuids:
        node = labels["Hostname"]
    return (node, index) if node else None


def readings(url: str, uuids: Mapping[str, Sequence[str]], pods: Mapping[tuple[str, str], str] | None = None,
             timeout: float = 5.0) -> dict[str, dict[int, dict]]:
    """``{node: {index: {"utilization": %, "memory_used": bytes, "memory_total": bytes}}}`` from
    the DCGM exporter's latest samples in Prometheus at ``url`` (``uuids``: node -> GPU UUIDs in
    index order; ``pods``: (namespace, pod) -> node of the pods gpupool runs). {} when Prometheus
    cannot be read."""
    try:
        series = query(url, QUERY, timeout)
    except (OSError, ValueError, urllib.error.URLError) as e:
        log.warning("no GPU readings from Prometheus at %s: %s", url, e)
        return {}
    out: dict[str, dict[int, dict]] = {}
    free: dict[tuple[str, int], float] = {}
    for s in series:
        labels = s.get("metric") or {}
        where = place(labels, uuids, pods or {})
        try:
            value = float(s["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if where is None or value != value:  # unplaced, or NaN
            continue
        r = out.setdefault(where[0], {}).setdefault(where[1], {"utilization": None, "memory_used": None,
                                                                "memory_total": None})
        name = labels.get("__name__")
        if name == UTIL:  # a GPU listed once per pod using it: the same device, the highest reading
            r["utilization"] = max(value, r["utilization"] or 0.0)
        elif name == FB_USED:
            r["memory_used"] = max(int(value * MiB), r["memory_used"] or 0)
        elif name == FB_FREE:
            free[where] = value * MiB
    for (node, index), f in free.items():
        r = out[node][index]
        if r["memory_used"] is not None:
            r["memory_total"] = int(r["memory_used"] + f)
    return out


def pod_nodes(handles: Sequence[tuple[Any, Sequence[Mapping]]]) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> node of runs on Kubernetes, from (handle, allocation) pairs: each
    worker's handle (``namespace``, ``pod``) and the node of its placement."""
    out: dict[tuple[str, str], str] = {}
    for handle, allocation in handles:
        if not isinstance(handle, Mapping):
            continue
        workers = [handle, *(handle.get("workers") or [])]
        for rank, w in enumerate(workers):
            node = w.get("node") or (allocation[rank].get("node") if rank < len(allocation or []) else None)
            if w.get("pod") and node:
                out[(str(w.get("namespace") or ""), str(w["pod"]))] = str(node)
    return out
