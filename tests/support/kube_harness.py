"""The Kubernetes job backend's tests (tests/kube/): the stand-ins for the parts of the service's
settings the backend reads, a job's spec, a pod's environment, an async poll, a two-node gang's
placement and the test API's live Services (tests/support/kube_fixture.py serves that API)."""
from __future__ import annotations

import asyncio
import os
import time

from kube_fixture import SERVICES

from gpupool.backends.base import JobSpec

K8S_VERSION = "1.32.0"


class Pool:  # the parts of c.GPUPool the backend reads
    preemption_grace = 3.0
    kill_after = 1.0


class Settings:  # the parts of the service's Settings the backend reads and fills
    def __init__(self) -> None:
        self.pool = Pool()
        self.nodes: list = []
        self.gpu_uuids: dict = {}


def job_spec(root, job_id="j-000001", attempt=0, placements=None, user="alice", env=None) -> JobSpec:
    jdir = os.path.join(str(root), job_id)
    return JobSpec(job_id=job_id, run_id=f"{job_id}.{attempt}", attempt=attempt, user=user,
                   notebook=os.path.join(jdir, "input.ipynb"), output=os.path.join(jdir, "output.ipynb"),
                   log=os.path.join(jdir, "log.txt"), parameters={"lr": 0.01}, workdir="/home/jovyan",
                   job_dir=jdir, checkpoint_dir=os.path.join(jdir, "checkpoints"), stop_file=os.path.join(jdir, "STOP"),
                   env=env or {"GPUPOOL_API_URL": "http://127.0.0.1:10101/services/gpupool/", "CUDA_VISIBLE_DEVICES": "3",
                               "GPUPOOL_API_TOKEN": "gpj-secret-token"},
                   placements=placements if placements is not None else [{"pod": 0, "node": "n1", "gpus": [0, 1], "fraction": 1.0}])


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


async def wait_for(pred, timeout=8.0):
    end = time.monotonic() + timeout
    while True:
        value = await pred()
        if value:
            return value
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.05)


GANG = [{"pod": 0, "node": "n1", "gpus": [1], "fraction": 1.0}, {"pod": 1, "node": "n2", "gpus": [0], "fraction": 1.0}]


def live_services(cluster) -> list[dict]:
    """The Services of the test API that are not deleted (as stored: the raw objects)."""
    async def go():
        async with cluster.api._lock:
            return [o.raw for (res, _, _), o in cluster.api._objects.items() if res == SERVICES and not o.deleted]
    return cluster.call(go)
