"""GPU memory enforcement of fractional jobs (``c.GPUPool.memory_enforcement``): NVML's
per-process readings of each GPU, summed over a job's processes, against the job's share."""
from __future__ import annotations

from typing import Any

from ...contract import ENFORCE_DRIVER, ENFORCE_FRAMEWORK, ENFORCE_WATCH, StopCause, decode_allocation, format_bytes
from ..domain import lifecycle
from ..store import tables as D


def fractional(allocation: list[dict] | None) -> bool:
    return any(p.gpus and p.fraction < 1 for p in decode_allocation(allocation))


def tier(allocation: list[dict] | None, handle: Any, watched: bool) -> str | None:
    """Which tier holds a workload to its GPU memory share (its row's ``enforcement``): the
    driver when the backend capped every worker's cgroup (tier 2), else the NVML watch of this
    machine when it covers the run (``watched``: a job of the local backend, NVML working here),
    else the frameworks' own caps alone (tier 1, always given); None for whole GPUs."""
    if not fractional(allocation):
        return None
    workers = [handle, *handle.get("workers", [])] if isinstance(handle, dict) else []
    if workers and all(w.get("enforcement") == ENFORCE_DRIVER for w in workers):
        return ENFORCE_DRIVER
    return ENFORCE_WATCH if watched else ENFORCE_FRAMEWORK


class MemoryEnforcer:
    """``nvml``: a reader with ``process_memory(index) -> {pid: bytes}``; ``backend.pids(handle)``
    gives a run's processes; ``node(name)`` a node's spec; ``stop(row, cause, reason, now)`` asks a
    job to stop (the loop's ``request_stop``)."""

    def __init__(self, nvml: Any, backend: Any, node: Any, pool: Any, stop: Any):
        self.nvml = nvml
        self.backend = backend
        self.node = node
        self.pool = pool  # c.GPUPool: memory_enforcement is report | stop
        self.stop = stop

    async def check(self, s: Any, rows: list[Any], now: float) -> dict[int, str]:
        """Act on the jobs over their share; returns job id -> the warning (the loop's state)."""
        by_gpu: dict[int, dict[int, list]] = {}  # GPU index -> job id -> [row, its first placement, its workers there]
        for row in rows:
            if row.type != D.JOB or not row.allocation or row.handle is None or row.stop_requested_at:
                continue
            placements = decode_allocation(row.allocation)
            for p in placements:  # every worker's share (a gang's workers may share a GPU)
                if p.gpus and p.fraction < 1:
                    by_gpu.setdefault(p.gpus[0], {}).setdefault(row.id, [row, placements[0], 0])[2] += 1
        warnings: dict[int, str] = {}
        for index, jobs in by_gpu.items():
            used_by_pid = self.nvml.process_memory(index)
            if not used_by_pid:
                continue
            for row, first, workers in jobs.values():
                pids = self.backend.pids(row.handle)
                used = sum(b for pid, b in used_by_pid.items() if pid in pids)
                node = self.node(first.node)
                share = workers * (row.gpu_memory or (node.gpu_memory * first.fraction if node else 0))
                if share and used > share * 1.02:
                    msg = (f"using {format_bytes(used)} of GPU {index}'s memory, more than its share of "
                           f"{format_bytes(share)}")
                    warnings[row.id] = msg
                    if self.pool.memory_enforcement == "stop":
                        reason = f"failed: stopped for {msg} (memory_enforcement = 'stop')"
                        await self.stop(row, StopCause.MEMORY, reason, now, session=s)
                    else:
                        lifecycle.memory_warning(row, msg)
        return warnings
