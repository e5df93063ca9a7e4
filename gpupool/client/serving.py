"""Model endpoints from the client: ``gpupool.serve("serve.py", gpus=0.5)`` starts a server as an
endpoint (a job of kind ``inference``; docs/endpoints.md), ``gpupool.endpoints()`` lists yours.

The server listens on ``$PORT``; the hub reaches it at ``job.url``
(``https://hub.example.org/services/gpupool/endpoints/j-000042/``) for its owner and the users and
groups it is shared with, each calling with their JupyterHub token (``Authorization: token ...``)
or their browser's sign-in.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from ..contract import ACTIVE, INFERENCE, EndpointState
from .api import Client, GPUPoolError, get_client
from .jobs import Job, build_body, post_job


def endpoint_url(job: Mapping[str, Any], client: Client | None = None) -> str | None:
    """The full URL of a job's endpoint (its ``endpoint`` path on the client's hub); None for a
    job that is not an endpoint."""
    path = job.get("endpoint")
    if not path:
        return None
    parts = urlsplit(get_client(client).url)
    return f"{parts.scheme}://{parts.netloc}{path}"


def serve(program, *, gpus: float | None = None, gpu_memory: str | int | None = None, replicas: int | None = None,
          share_users: Sequence[str] | None = None, share_groups: Sequence[str] | None = None, args=None,
          queue: str | None = None, name: str | None = None, cpu: float | None = None,
          memory: str | int | None = None, preemptible: bool | None = None, priority: int | None = None,
          pools: Sequence[str] | str | None = None, wait: bool = False, timeout: float = 300.0,
          client: Client | None = None) -> Job:
    """Serve ``program`` (a Python script such as ``"serve.py"``, with ``args=[...]``, or a command
    list) as an endpoint and return its :class:`Job`; ``job.url`` is where the hub reaches it.

    The program must listen for HTTP on ``$PORT`` (all interfaces or 127.0.0.1). ``replicas=N``
    runs N copies, each with ``gpus``, behind the one URL. ``share_users`` / ``share_groups`` name
    who else may call it (its owner always may). An endpoint is non-preemptible by default, so it
    runs within its queue's deserved quota. ``wait=True`` returns once it is ``ready`` (a replica
    answered the readiness probe) and raises :class:`TimeoutError` after ``timeout`` seconds."""
    if program is None or (not isinstance(program, (list, tuple)) and not str(program).endswith(".py")):
        raise GPUPoolError("serve: give a Python script (.py) or a command list that listens on $PORT",
                           field="script")
    body = build_body(list(program) if isinstance(program, (list, tuple)) else program, gpus=gpus,
                      gpu_memory=gpu_memory, queue=queue, kind=INFERENCE, priority=priority, preemptible=preemptible,
                      name=name, cpu=cpu, memory=memory, args=args, pools=pools)
    if replicas is not None:
        body["replicas"] = replicas
    if share_users or share_groups:
        body["share"] = {"users": list(share_users or []), "groups": list(share_groups or [])}
    job = post_job(body, None, client)
    return wait_ready(job, timeout) if wait else job


def wait_ready(job: Job, timeout: float = 300.0, poll: float = 1.0) -> Job:
    """Wait until an endpoint is ``ready``; raises TimeoutError, or GPUPoolError when it ended."""
    deadline = time.monotonic() + timeout
    while True:
        data = job.refresh().data
        if data.get("endpoint_state") == EndpointState.READY.value and data.get("status") == "running":
            return job
        if data.get("status") not in ACTIVE:
            raise GPUPoolError(f"endpoint {job.id} {data.get('status')}: {data.get('reason')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"endpoint {job.id} not ready after {timeout:g} s: {data.get('reason')}")
        time.sleep(poll)


def endpoints(*, all: bool = False, user: str | None = None, client: Client | None = None) -> list[Job]:
    """Your endpoints (admins: ``user=`` someone's), running or queued; ``all=True`` also the ended ones."""
    rows = get_client(client).jobs(kind=INFERENCE, user=user)
    return [Job(d, client=client) for d in rows if all or d.get("status") in ACTIVE]
