"""What the backend is told to run: a job's :class:`~gpupool.backends.base.JobSpec` and the
environment of a run (jobs and workspaces).

The environment is the job protocol's (:mod:`gpupool.protocol`): ``protocol.gpu_env`` for a
placement (CUDA visibility, the share and its memory cap; a process on the node, so no
``container``) and ``protocol.job_env`` for the job (its id, attempt, job directory, checkpoints,
stop file, resume point and how it reaches the service); the job directory is a
``protocol.JobDir``, and a stored allocation is read with ``contract.decode_allocation``.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from ...backends.base import JobSpec
from ...contract import INFERENCE, decode_allocation, encode_allocation
from ...protocol import Env, JobDir, gpu_env, job_env, memory_limit
from ...scheduler.model import PodPlacement
from ...scheduler.units import parse_bytes
from ..domain.workdirs import user_workdir


def program_command(row: Any) -> list[str] | None:
    """A script or command job's argv (a leading ``python`` is the job's interpreter); None for a
    notebook job."""
    if row.command:
        return [str(a) for a in row.command]
    if row.script:
        return ["python", row.script, *[str(a) for a in (row.args or [])]]
    return None


class JobSpecs:
    """Builds runs for one service. ``node(name)`` gives a node's spec (the live inventory's);
    ``gpu_uuids`` maps a node to the UUID of each GPU index (NVML, Kubernetes)."""

    def __init__(self, pool: Any, gpu_uuids: dict[str, list[str]], node: Callable[[str], Any], api_url: str = ""):
        self.pool = pool
        self.gpu_uuids = gpu_uuids
        self.node = node
        self.api_url = api_url
        # run ids must be unique on the machine (another hub's j-000001 is not ours): job root digest
        self.instance = hashlib.sha256(os.path.realpath(pool.job_root).encode()).hexdigest()[:10]

    def job_dir(self, row: Any) -> JobDir:
        return JobDir.of(self.pool.job_root, row.public_id)

    def workdir(self, user: str) -> str:
        return user_workdir(self.pool.work_dir, user)

    def gpu_env(self, allocation: list[dict] | None, gpu_memory: int = 0) -> dict[str, str]:
        """CUDA visibility and memory caps for a stored allocation (jobs and workspaces): those of
        its first placement that has GPUs (none: the CPU-only environment)."""
        placed = [p for p in decode_allocation(allocation) if p.gpus]
        return self.placement_env(placed[0] if placed else None, gpu_memory)

    def placement_env(self, placement: PodPlacement | None, gpu_memory: int = 0) -> dict[str, str]:
        """``protocol.gpu_env`` of one placement on its node: the GPUs' UUIDs when known, and a
        fraction's memory cap (``gpu_memory`` asked for, else its share of what the driver leaves
        of the node's GPU)."""
        if placement is None:
            return gpu_env(None)
        node = self.node(placement.node)
        total = (node.gpu_memory or 0) if node else 0
        memory = memory_limit(placement.fraction, total, gpu_memory or 0, *self.reserve)
        return gpu_env(placement, uuids=self.gpu_uuids.get(placement.node), memory=memory, total=total)

    @property
    def reserve(self) -> tuple[float, int]:
        """What the driver keeps of each GPU (``c.GPUPool.gpu_memory_reserve`` / ``_min``)."""
        return (float(getattr(self.pool, "gpu_memory_reserve", 0.0) or 0.0),
                parse_bytes(getattr(self.pool, "gpu_memory_reserve_min", 0) or 0))

    def job_spec(self, row: Any, token: str = "") -> JobSpec:
        """The run of a job's current attempt (``token``: its job token, when it starts)."""
        jid = row.public_id
        files = self.job_dir(row)
        env = self.gpu_env(row.allocation, row.gpu_memory)
        env.update(job_env(files, jid, row.attempt, api_url=self.api_url, token=token))
        run_as = None
        if self.pool.run_as_user and os.geteuid() == 0:
            run_as = row.user
        pods = int(row.pods or 1)
        placements = sorted(decode_allocation(row.allocation), key=lambda p: p.pod)
        return JobSpec(job_id=jid, run_id=f"{jid}.{row.attempt}.{self.instance}", attempt=row.attempt, user=row.user,
                       notebook=files.notebook, output=files.output, log=files.log, parameters=row.parameters or {},
                       workdir=self.workdir(row.user), job_dir=files.path, checkpoint_dir=files.checkpoints,
                       stop_file=files.stop_file, env=env, placements=encode_allocation(placements),
                       kernel_name=self.pool.kernel_name, python=self.pool.job_python, run_as=run_as,
                       queue=row.queue or "", kind=row.kind or "", cpu=float(row.cpu or 0), memory=int(row.memory or 0),
                       command=program_command(row), pods=pods,
                       worker_env=[self.placement_env(p, row.gpu_memory) for p in placements] if pods > 1 else [],
                       gpu_caps=[self.gpu_cap(p, row.gpu_memory) for p in placements],
                       endpoint=row.kind == INFERENCE, max_restarts=int(getattr(self.pool, "endpoint_restarts", 0)))

    def gpu_cap(self, placement: PodPlacement, gpu_memory: int = 0) -> dict[str, int]:
        """A fractional placement's cap for the driver (tier 2): at most its fraction of what the
        driver leaves of the GPU (hard), what it asked for guaranteed (soft); {} for whole GPUs,
        no GPU, or a GPU of unknown size."""
        node = self.node(placement.node)
        total = (node.gpu_memory or 0) if node else 0
        hard = memory_limit(placement.fraction, total, 0, *self.reserve) if placement.gpus else 0
        if not hard:
            return {}
        soft = memory_limit(placement.fraction, total, gpu_memory or 0, *self.reserve)
        return {"gpu": int(placement.gpus[0]), "hard": hard, "soft": min(soft, hard)}

    @staticmethod
    def resumes_from(spec: JobSpec) -> str | None:
        """The checkpoint a run resumes from (None: from the beginning)."""
        return spec.env.get(Env.RESUME_FROM)
