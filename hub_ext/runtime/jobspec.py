"""What the backend is told to run: a job's :class:`~gpupool.backends.base.JobSpec` and the
environment of a run (jobs and workspaces): CUDA visibility, memory caps and the job protocol's
``GPUPOOL_*`` names.

This module is the service's one seam to the job protocol's environment: nothing else in hub_ext
spells out a ``GPUPOOL_*`` name or decodes a stored allocation for a run.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from ...backends.base import JobSpec
from ..domain.workdirs import user_workdir
from . import jobfiles


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

    def job_dir(self, row: Any) -> str:
        return jobfiles.job_dir(self.pool.job_root, row.public_id)

    def workdir(self, user: str) -> str:
        return user_workdir(self.pool.work_dir, user)

    def gpu_env(self, allocation: list[dict] | None, gpu_memory: int = 0) -> dict[str, str]:
        """CUDA visibility and memory caps for an allocation (jobs and workspaces)."""
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        placed = [p for p in (allocation or []) if p.get("gpus")]
        if not placed:
            env.update(CUDA_VISIBLE_DEVICES="", NVIDIA_VISIBLE_DEVICES="void", GPUPOOL_GPUS="",
                       GPUPOOL_GPU_FRACTION="0")
            return env
        p = placed[0]
        uuids = self.gpu_uuids.get(p["node"]) or []
        ids = [uuids[i] if i < len(uuids) else str(i) for i in p["gpus"]]
        fraction = float(p.get("fraction", 1.0))
        env.update(CUDA_VISIBLE_DEVICES=",".join(ids), NVIDIA_VISIBLE_DEVICES=",".join(ids),
                   GPUPOOL_GPUS=",".join(str(i) for i in p["gpus"]), GPUPOOL_NODE=p["node"],
                   GPUPOOL_GPU_FRACTION=f"{fraction:g}")
        if fraction < 1.0:
            node = self.node(p["node"])
            limit = gpu_memory or (int(node.gpu_memory * fraction) if node and node.gpu_memory else 0)
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.3f}"
            env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
            if limit:
                env["GPUPOOL_GPU_MEMORY_LIMIT"] = str(limit)
        return env

    def job_spec(self, row: Any, token: str = "") -> JobSpec:
        """The run of a job's current attempt (``token``: its job token, when it starts)."""
        jid = row.public_id
        jdir = self.job_dir(row)
        ckpt = jobfiles.checkpoints(jdir)
        env = self.gpu_env(row.allocation, row.gpu_memory)
        env.update(GPUPOOL_JOB_ID=jid, GPUPOOL_ATTEMPT=str(row.attempt), GPUPOOL_CHECKPOINT_DIR=ckpt,
                   GPUPOOL_STOP_FILE=jobfiles.stop_file(jdir), GPUPOOL_JOB_DIR=jdir, GPUPOOL_API_URL=self.api_url)
        if token:
            env["GPUPOOL_API_TOKEN"] = token
        latest = jobfiles.latest_checkpoint(jdir)
        if latest:
            env["GPUPOOL_RESUME_FROM"] = latest
        run_as = None
        if self.pool.run_as_user and os.geteuid() == 0:
            run_as = row.user
        pods = int(row.pods or 1)
        placements = sorted(row.allocation or [], key=lambda p: int(p.get("pod", 0)))
        return JobSpec(job_id=jid, run_id=f"{jid}.{row.attempt}.{self.instance}", attempt=row.attempt, user=row.user,
                       notebook=jobfiles.notebook(jdir), output=os.path.join(jdir, jobfiles.OUTPUT),
                       log=os.path.join(jdir, jobfiles.LOG), parameters=row.parameters or {},
                       workdir=self.workdir(row.user), job_dir=jdir, checkpoint_dir=ckpt,
                       stop_file=env["GPUPOOL_STOP_FILE"], env=env, placements=placements,
                       kernel_name=self.pool.kernel_name, python=self.pool.job_python, run_as=run_as,
                       queue=row.queue or "", kind=row.kind or "", cpu=float(row.cpu or 0), memory=int(row.memory or 0),
                       command=program_command(row), pods=pods,
                       worker_env=[self.gpu_env([p], row.gpu_memory) for p in placements] if pods > 1 else [])

    @staticmethod
    def resumes_from(spec: JobSpec) -> str | None:
        """The checkpoint a run resumes from (None: from the beginning)."""
        return spec.env.get("GPUPOOL_RESUME_FROM")
