"""A job backend for benchmarks (``c.GPUPool.backend = "idle_backend.IdleRunsBackend"``, with this
directory on PYTHONPATH): it runs nothing. A started or adopted run is alive until it is
terminated, then it has exited (143, as after SIGTERM), so the service treats thousands of
"running" jobs as it treats real ones (polled every cycle, asked to checkpoint, terminated after
the grace period, requeued) without a process each."""
from __future__ import annotations

from typing import Any

from gpupool.backends.base import EXITED, RUNNING, JobBackend, JobSpec, RunState


class IdleRunsBackend(JobBackend):
    def __init__(self, settings: Any = None, log: Any = None):
        super().__init__(settings, log)
        self.ended: set[str] = set()

    async def start(self, spec: JobSpec) -> dict:
        return {"run_id": spec.run_id}

    async def poll(self, handle: dict) -> RunState:
        if handle["run_id"] in self.ended:
            return RunState(EXITED, 143, "terminated by SIGTERM")
        return RunState(RUNNING)

    async def request_checkpoint(self, handle: dict, spec: JobSpec, reason: str = "") -> None:
        pass

    async def terminate(self, handle: dict, force: bool = False) -> None:
        self.ended.add(handle["run_id"])

    async def adopt(self, spec: JobSpec, handle: dict | None) -> tuple[dict | None, RunState]:
        return handle or {"run_id": spec.run_id}, RunState(RUNNING)
