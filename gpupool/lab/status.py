"""The status-bar line of a JupyterLab workspace, from plain data (no I/O: testable from dicts).

The workspace's share comes from the environment the spawner gave its server (``gpu_env`` in
gpupool/protocol.py: ``GPUPOOL_NODE``, ``GPUPOOL_GPUS``, ``GPUPOOL_GPU_FRACTION``); the GPU model
and utilisation from the service's ``GET nodes`` (utilisation is null where NVML, or DCGM on a
cluster, has no reading); the user's jobs from ``GET jobs``.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from .. import contract as C
from ..protocol import Env

SEP = " · "
_VENDOR = re.compile(r"^(nvidia|tesla|geforce|quadro|rtx)\s+", re.I)


def workspace_share(env: Mapping[str, str]) -> dict:
    """The GPUs this server was given: ``{"node", "gpus": [indices], "fraction", "amount"}``
    (``amount`` is GPUs in all: 0.5 for half a GPU, 2 for two whole ones; 0 without a GPU)."""
    gpus = [g.strip() for g in (env.get(Env.GPUS) or "").split(",") if g.strip()]
    try:
        fraction = float(env.get(Env.GPU_FRACTION) or (1 if gpus else 0))
    except ValueError:
        fraction = 1.0 if gpus else 0.0
    if not gpus or fraction <= 0:
        return {"node": env.get(Env.NODE) or None, "gpus": [], "fraction": 0.0, "amount": 0.0}
    fraction = min(1.0, fraction)
    return {"node": env.get(Env.NODE) or None, "gpus": gpus, "fraction": fraction, "amount": fraction * len(gpus)}


def short_model(model: str | None) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``."""
    words = _VENDOR.sub("", (model or "").strip()).split()
    return words[0].split("-")[0] if words else ""


def _my_gpus(share: Mapping, nodes: Sequence[Mapping]) -> tuple[str | None, list[Mapping]]:
    node = next((n for n in nodes if n.get("name") == share["node"]), None)
    if node is None:
        return None, []
    wanted = set(share["gpus"])
    return node.get("gpu_model"), [g for g in node.get("gpus") or [] if str(g.get("index")) in wanted]


def status(env: Mapping[str, str], jobs: Sequence[Mapping] = (), nodes: Sequence[Mapping] = (),
           user: str | None = None, error: str | None = None) -> dict:
    """Everything the status bar shows: ``label`` (e.g. ``GPU 0.5 H100 · 43% · 2 queued``) and its
    parts; ``title`` is the tooltip. ``error`` (the service could not be read) keeps the share, which
    comes from the environment, and says why the rest is missing."""
    share = workspace_share(env)
    model, gpus = _my_gpus(share, nodes) if share["gpus"] else (None, [])
    readings = [float(g["utilization"]) for g in gpus if g.get("utilization") is not None]
    utilization = sum(readings) / len(readings) if readings and len(readings) == len(share["gpus"]) else None
    mine = [j for j in jobs if user is None or j.get("user") == user]
    queued = sum(1 for j in mine if j.get("status") == C.QUEUED)
    running = sum(1 for j in mine if j.get("status") in C.HOLDING)
    if share["gpus"]:
        parts = [" ".join(x for x in ("GPU", f'{share["amount"]:g}', short_model(model)) if x)]
        if utilization is not None:
            parts.append(f"{utilization:.0f}%")
    else:
        parts = ["CPU only"]
    if running:
        parts.append(f"{running} running")
    if queued:
        parts.append(f"{queued} queued")
    if error:
        parts.append("pool unreachable")
    where = f' on {share["node"]} (GPU {",".join(share["gpus"])})' if share["gpus"] else ""
    title = (f'This workspace holds {share["amount"]:g} GPU{"" if share["amount"] == 1 else "s"}'
             f'{" (" + model + ")" if model else ""}{where}' if share["gpus"] else "This workspace has no GPU")
    title += f"; your jobs: {running} running, {queued} queued. Click for the queues."
    if error:
        title += f" The gpupool service could not be read: {error}"
    return {"label": SEP.join(parts), "title": title, "gpus": share["amount"], "fraction": share["fraction"],
            "node": share["node"], "gpu_indices": share["gpus"], "model": model, "utilization": utilization,
            "queued": queued, "running": running, "cpu_only": not share["gpus"], "error": error}
