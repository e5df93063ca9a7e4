"""A task of the service that runs every ``interval`` seconds until the service stops."""
from __future__ import annotations

import asyncio
import logging
from typing import Any


class Periodic:
    """Subclasses define :meth:`tick`; an exception in one tick is logged and the next one runs.
    ``interval <= 0``: never started (``off_message`` is logged instead, if given)."""

    interval: float = 0.0
    what = "a periodic task"  # for the log: "checking workspaces against JupyterHub failed"
    off_message = ""
    log = logging.getLogger("gpupool")

    async def tick(self) -> Any:
        raise NotImplementedError

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.tick()
            except Exception:  # a bad tick must not end the task
                self.log.exception("%s failed", self.what)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=self.interval)
            except asyncio.TimeoutError:
                pass

    def start(self) -> None:
        self._stopping = asyncio.Event()
        self._task: asyncio.Task | None = None
        if self.interval > 0:
            self._task = asyncio.create_task(self._run(), name=f"gpupool {self.what}")
        elif self.off_message:
            self.log.info(self.off_message)

    async def stop(self) -> None:
        if not hasattr(self, "_stopping"):
            return
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
